-- Two round trips of every job made one each (issue 31: a statement's round
-- trip costs Postgres more than the reads in it). Nothing here changes what
-- is locked, read or refused: the same locks in the same order, the same
-- reads, each in a snapshot taken once the locks are held.
--
-- A statement's snapshot is taken when it starts, before any wait on a
-- lock inside it, so a read that must see what a lock's last holder
-- committed was a statement of its own, sent after the lock's. A volatile
-- function takes a fresh snapshot for each query it runs: the lock and the
-- read after it go in one call.

-- An append (events/store.rs, `record`): the per-key locks in sorted order
-- (so two writers cannot deadlock), the events' insert (a retried event id
-- is stored once, and not returned), then the rows of the five views the
-- events touch, read under the locks.
create or replace function shepherd.append_reading(
    p_ids uuid[], p_streams text[], p_types text[], p_versions integer[],
    p_bodies jsonb[], p_jobs text[], p_locks text[],
    p_devices text[], p_reservations uuid[],
    out positions bigint[], out event_ids uuid[], out recorded_ats timestamptz[],
    out tx_ids bigint[],
    out machines json, out sinbin json, out pending json,
    out unassimilated json, out deletions json)
language plpgsql volatile
set search_path = pg_catalog, shepherd, pg_temp
as $$
declare
    v_key text;
begin
    for v_key in select k from unnest(p_locks) k order by 1 loop
        perform pg_advisory_xact_lock(hashtextextended(v_key, 0));
    end loop;
    with stored as (
        insert into shepherd.events (event_id, stream, event_type, schema_version, body, job_id)
        select * from unnest(p_ids, p_streams, p_types, p_versions, p_bodies, p_jobs)
        on conflict (event_id) do nothing
        returning position, event_id, recorded_at, tx_id)
    select array_agg(s.position), array_agg(s.event_id), array_agg(s.recorded_at),
           array_agg(s.tx_id::text::bigint)
    into positions, event_ids, recorded_ats, tx_ids
    from stored s;
    select v.machines, v.sinbin, v.pending, v.unassimilated, v.deletions
    into machines, sinbin, pending, unassimilated, deletions
    from shepherd.view_rows(p_devices, p_reservations) v;
end;
$$;
revoke execute on function shepherd.append_reading(
    uuid[], text[], text[], integer[], jsonb[], text[], text[], text[], uuid[]) from public;

-- An assimilation of our own create's answer (jobs/assimilate.rs): the
-- device's lock, then what its record depends on, read under it.
create or replace function shepherd.assimilation_seen(
    p_lock text, p_provider text, p_device text, p_unit uuid,
    out existing uuid, out in_flight boolean, out owner text, out penalised boolean)
language plpgsql volatile
set search_path = pg_catalog, shepherd, pg_temp
as $$
begin
    perform pg_advisory_xact_lock(hashtextextended(p_lock, 0));
    select (select machine_id from shepherd.managed_machines
            where provider = p_provider and provider_id = p_device),
           exists(select 1 from shepherd.unassimilated_devices where device_id = p_device),
           (select request from shepherd.pending_creations where reservation_id = p_unit),
           exists(select 1 from shepherd.sinbin where reservation_id = p_unit)
    into existing, in_flight, owner, penalised;
end;
$$;
revoke execute on function shepherd.assimilation_seen(text, text, text, uuid) from public;

-- Every job a worker runs goes through them: granted here as well as in
-- deploy/roles.sql, so a cluster upgraded without re-running that file
-- keeps working.
do $$
begin
    if exists (select from pg_catalog.pg_roles where rolname = 'shepherd_worker') then
        grant execute on function shepherd.append_reading(
            uuid[], text[], text[], integer[], jsonb[], text[], text[], text[], uuid[])
            to shepherd_worker;
        grant execute on function shepherd.assimilation_seen(text, text, text, uuid)
            to shepherd_worker;
    end if;
end;
$$;
