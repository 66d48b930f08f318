-- What an append costs Postgres (issue 31). Nothing here changes what is
-- refused or recorded: the same checks, messages and error codes, done in
-- an order and a form that costs less when they pass, which is nearly
-- always.

-- The view rows an append's events touch, one JSON array a view, read in
-- the statement's snapshot (stable: the caller has taken its keys' locks).
-- A function for the two settings it needs, which a statement cannot carry:
-- its key arrays (usually one key, often none) make each custom plan look
-- far cheaper than the generic one, so Postgres planned this five-view
-- read afresh at every append (0.5 ms of planning a call, ten times what
-- it takes to run). Planned once a session instead, and never as a scan of
-- a whole view: an append touches a handful of keys however large the
-- fleet, and each of them is indexed.
create or replace function shepherd.view_rows(
    p_devices text[], p_reservations uuid[],
    out machines json, out sinbin json, out pending json,
    out unassimilated json, out deletions json)
language plpgsql stable
set search_path = pg_catalog, shepherd, pg_temp
set plan_cache_mode = force_generic_plan
set enable_seqscan = off
as $$
begin
    -- A machine is found by its device or through its reservation: two
    -- branches, not an OR, so each uses its own index.
    select
        (select coalesce(json_agg(m), '[]') from (
            select * from shepherd.managed_machines where provider_id = any(p_devices)
            union
            select * from shepherd.managed_machines where reservation_id = any(p_reservations)) m),
        (select coalesce(json_agg(s), '[]') from (
            select * from shepherd.sinbin where reservation_id = any(p_reservations)) s),
        (select coalesce(json_agg(p), '[]') from (
            select * from shepherd.pending_creations where reservation_id = any(p_reservations)) p),
        (select coalesce(json_agg(u), '[]') from (
            select * from shepherd.unassimilated_devices where device_id = any(p_devices)) u),
        (select coalesce(json_agg(d), '[]') from (
            select * from shepherd.pending_deletions where provider_id = any(p_devices)) d)
    into machines, sinbin, pending, unassimilated, deletions;
end;
$$;
revoke execute on function shepherd.view_rows(text[], uuid[]) from public;
-- Every append a worker makes reads through it: granted here as well as in
-- deploy/roles.sql, so a cluster upgraded without re-running that file
-- keeps recording.
do $$
begin
    if exists (select from pg_catalog.pg_roles where rolname = 'shepherd_worker') then
        grant execute on function shepherd.view_rows(text[], uuid[]) to shepherd_worker;
    end if;
end;
$$;

-- The text limits, checked as plain conditions: a message is formatted
-- only for the row it refuses, not for every row (four calls to require()
-- and to format() an event, before).
create or replace function shepherd.limit_operator_text() returns trigger
language plpgsql
set search_path = pg_catalog, shepherd, pg_temp
as $$
begin
    if new.body ? 'by' then
        if coalesce(length(new.body->>'reason'), 0) > 1000 then
            perform shepherd.require(false,
                format('a reason is at most 1000 characters (this one has %s)',
                       length(new.body->>'reason')));
        end if;
        -- A `by` that is JSON null is refused too: not "at most 200".
        if (length(new.body->>'by') <= 200) is not true then
            perform shepherd.require(false,
                format('who acted is at most 200 characters (this has %s)',
                       length(new.body->>'by')));
        end if;
    end if;
    if coalesce(length(new.body->>'requested_by'), 0) > 200 then
        perform shepherd.require(false,
            format('who asked is at most 200 characters (this has %s)',
                   length(new.body->>'requested_by')));
    end if;
    if coalesce(length(new.body->>'sinbin_override'), 0) > 1000 then
        perform shepherd.require(false,
            format('a reason to override a penalty is at most 1000 characters (this one has %s)',
                   length(new.body->>'sinbin_override')));
    end if;
    return new;
end;
$$;

create or replace function shepherd.guard_job_row() returns trigger
language plpgsql
set search_path = pg_catalog, shepherd, pg_temp
as $$
declare
    v_args jsonb;
begin
    if new.job_type in ('reconcile', 'create_device', 'assimilate', 'delete_machine') then
        if new.id !~ '^[0-9A-HJKMNP-TV-Z]{26}$' then
            raise exception 'job id % is not a ULID; enqueue with shepherd.enqueue_*()', new.id
                using errcode = 'check_violation';
        end if;
        v_args := shepherd.job_args(new.job);
        if v_args is null or jsonb_typeof(v_args) <> 'object' then
            raise exception 'job body is not a JSON object; enqueue with shepherd.enqueue_*()'
                using errcode = 'check_violation';
        end if;
        if coalesce(length(v_args->>'requested_by'), 0) > 200 then
            perform shepherd.require(false,
                format('who asked is at most 200 characters (this has %s)',
                       length(v_args->>'requested_by')));
        end if;
        if coalesce(length(v_args->>'sinbin_override'), 0) > 1000 then
            perform shepherd.require(false,
                format('a reason to override a penalty is at most 1000 characters (this one has %s)',
                       length(v_args->>'sinbin_override')));
        end if;
    end if;
    return new;
end;
$$;

-- The settings are read only for a pool's declaration: as one condition
-- with the type test, the read was planned again for every event.
create or replace function shepherd.refuse_pools_on_metal() returns trigger
language plpgsql
set search_path = pg_catalog, shepherd, pg_temp
as $$
begin
    if new.event_type = 'pool_declared' then
        if (select value #>> '{}' from shepherd.cluster_settings where key = 'provider') = 'metal' then
            raise exception 'this cluster provisions Equinix Metal hardware reservations, which have no pools: pools are a Latitude.sh cluster''s (shepherd worker --provider latitude)'
                using errcode = 'invalid_parameter_value';
        end if;
    end if;
    return new;
end;
$$;

-- Which kinds only an operator records, decided by the event first (plain
-- conditions for all but a settings change); the role's privilege is
-- looked up only for an event of those kinds. The same events are refused
-- to the same roles as before.
create or replace function shepherd.guard_event() returns trigger
language plpgsql
set search_path = pg_catalog, shepherd, pg_temp
as $$
declare
    v_operators boolean;
begin
    new.role := session_user;
    v_operators := new.event_type in ('pool_declared', 'pool_changed', 'pool_removed',
                          'creations_paused', 'creations_resumed',
                          'deletions_paused', 'deletions_resumed',
                          'machine_protected', 'machine_unprotected', 'machine_released',
                          'job_retried', 'job_cancelled', 'views_replaced')
       or (new.event_type = 'deletion_requested'
           and new.body->>'cause' is distinct from 'surplus'
           and new.body->>'cause' is distinct from 'failed'
           and new.body->>'cause' is distinct from 'not_ready'
           and new.body->>'cause' is distinct from 'pool_removed')
       or (new.event_type = 'leave_acknowledged'
           and coalesce(new.body->>'by', '') not like 'hook:%')
       or (new.event_type = 'penalty_cleared'
           and new.body->>'by' is distinct from 'shepherd');
    if not v_operators and new.event_type = 'settings_changed' then
        v_operators := exists (select 1 from shepherd.cluster_settings s
                               where s.key in (select pg_catalog.jsonb_object_keys(new.body->'settings')));
    end if;
    if v_operators
       and not pg_catalog.has_function_privilege(current_user, 'shepherd.operator_door()', 'EXECUTE') then
        raise exception 'role % may not record %: that is an operator''s action (connect as a role granted shepherd.operator_door(), such as shepherd_operator)',
            session_user, new.event_type
            using errcode = 'insufficient_privilege';
    end if;
    return new;
end;
$$;
