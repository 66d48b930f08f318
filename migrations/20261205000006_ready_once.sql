-- Deletion judged on positive evidence: a machine that was ready once is
-- never replaced as "not ready", whatever status it shows later (powered
-- off, in rescue, reinstalling, a word the provider never documented).
-- When a pass first sees a managed machine ready it records
-- `machine_ready`, and the view keeps the moment. Machines managed before
-- this change have none until a pass sees them ready; until then they are
-- judged as never ready, which only a deployment word past the deadline,
-- counted from our own creation event, can act on.
alter table shepherd.managed_machines add column ready_at timestamptz;

-- A release from SQL ends the machine's pending deletion too, as the fold
-- of machine_released does (a row left behind would hold a leave that
-- nothing can end).
create or replace function shepherd.release_machine(
    p_id text,
    p_reason text,
    p_by text default null,
    p_provider_says_gone boolean default false)
returns uuid
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
    m shepherd.managed_machines;
    v_last shepherd.events;
begin
    perform shepherd.require(p_id is not null, 'a machine or device id is required');
    perform shepherd.require(nullif(trim(p_reason), '') is not null,
        'a reason is required (it is recorded with the release)');
    select * into m from shepherd.managed_machines
    where machine_id::text = p_id or provider_id = p_id;
    if not found then
        raise exception 'no managed machine has id or device %', p_id
            using errcode = 'no_data_found';
    end if;
    perform pg_advisory_xact_lock(hashtextextended('device/' || m.provider_id, 0));
    -- Read again under the lock: a concurrent release may have won.
    if not exists (select 1 from shepherd.managed_machines where machine_id = m.machine_id) then
        raise exception 'machine % was released meanwhile', m.machine_id
            using errcode = 'no_data_found';
    end if;
    if p_provider_says_gone is not true then
        select * into v_last from shepherd.events
        where event_type in ('discrepancy_found', 'reconcile_finished')
        order by position desc limit 1;
        if v_last.event_type is distinct from 'discrepancy_found'
           or not coalesce(v_last.body->'missing_devices' ? m.provider_id, false) then
            raise exception 'the latest pass did not find % missing at the provider: only a machine the provider no longer has is released (shepherd machines release and the console ask the provider first; to delete the machine: shepherd machines deprovision %)',
                m.provider_id, m.provider_id
                using errcode = 'invalid_parameter_value';
        end if;
    end if;
    perform shepherd.append_event('device/' || m.provider_id, 'machine_released',
        jsonb_build_object('machine_id', m.machine_id, 'provider', m.provider,
                           'provider_id', m.provider_id, 'by', v_by, 'reason', p_reason));
    delete from shepherd.managed_machines where machine_id = m.machine_id;
    delete from shepherd.pending_deletions where provider_id = m.provider_id;
    return m.machine_id;
end;
$$;

-- A pass reads when our own creation of each machine never seen ready was
-- recorded: the ready deadline counts from there.
create index events_device_created_idx on shepherd.events ((body->>'device'))
    where event_type = 'device_created';

-- A witness proves a machine ours only if its request made no other
-- machine: the pass looks up each request's recorded creation.
create index events_device_created_request_idx on shepherd.events ((body->>'request'))
    where event_type = 'device_created';
create index events_creation_unresolved_request_idx on shepherd.events ((body->>'request'))
    where event_type = 'creation_unresolved';
