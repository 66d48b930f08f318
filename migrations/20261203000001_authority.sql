-- One authority for the cluster's settings, an owner and an end for every
-- creation in flight, and SQL functions that refuse nonsense.

-- cluster_settings becomes a view folded from `settings_changed` events
-- (events/views.rs). Rows the workers used to write at start have no events
-- behind them: they go, and the next worker to start records the cluster's
-- settings from its flags.
delete from shepherd.cluster_settings;

-- A pending creation belongs to its request (the witness is derived from
-- it). `job_id` held the request under the wrong name; it keeps its values.
alter table shepherd.pending_creations rename column job_id to request;
-- Set while the outcome of a create is unknown (an answer that could not be
-- read, a timeout after the request was sent): the creation stays in flight
-- until looking at the provider settles it.
alter table shepherd.pending_creations add column unresolved_since timestamptz;
alter table shepherd.pending_creations add column last_error text;

-- Adoption asks whether a witness names a request this cluster recorded.
create index events_creation_request_idx on shepherd.events ((body->>'request'))
    where event_type = 'creation_requested';

-- The in-flight view shows who owns each row and whether it is unresolved.
drop view shepherd.in_flight;
create view shepherd.in_flight as
select 'creation'::text as kind, reservation_id, null::uuid as device_id, request,
       enqueued_at as since, unresolved_since, last_error
from shepherd.pending_creations
union all
select 'assimilation', reservation_id, device_id, null, created_at, null, null
from shepherd.unassimilated_devices;

-- Every argument an operator types is checked here: NULL and nonsense raise
-- an error and queue nothing.
create function shepherd.require(p_ok boolean, p_message text) returns void
language plpgsql immutable as $$
begin
    if p_ok is not true then
        raise exception '%', p_message using errcode = 'invalid_parameter_value';
    end if;
end;
$$;

-- A duration as config::parse_duration reads it (90s, 1m30s, 1h 15m, or a
-- bare number of seconds), in seconds; null when it is not one.
create function shepherd.duration_seconds(p_text text) returns float8
language plpgsql immutable as $$
declare
    v_total float8 := 0;
    v_part text[];
begin
    if p_text ~ '^[0-9]+(\.[0-9]+)?$' then
        return p_text::float8;
    end if;
    if p_text is null or p_text !~ '^([0-9]+(\.[0-9]+)?(ms|s|m|h|d) ?)+$' then
        return null;
    end if;
    for v_part in select regexp_matches(p_text, '([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)', 'g') loop
        v_total := v_total + v_part[1]::float8 * case v_part[2]
            when 'ms' then 0.001 when 's' then 1 when 'm' then 60 when 'h' then 3600 else 86400 end;
    end loop;
    return v_total;
end;
$$;

-- The cluster's limit as recorded (0: no limit; null before any worker ran).
create function shepherd.max_machines() returns bigint
language sql stable as $$
    select (value #>> '{}')::bigint from shepherd.cluster_settings where key = 'max_machines'
$$;

-- Changes one cluster setting, recorded as an event with who and why; every
-- worker reads the new value (the limit at its next admission, rates within
-- a few seconds). Mirrors events/views.rs apply() for `settings_changed`.
create function shepherd.change_setting(p_key text, p_value text, p_reason text, p_by text default null)
returns void
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
    v_value jsonb;
    -- A duration as parse_duration reads it: 90s, 1m30s, 1h 15m, or a bare number.
    -- Durations and bursts within what the workers can use (parse_duration
    -- refuses more than a year; a burst is a 32-bit count).
    v_year constant float8 := 365 * 86400;
begin
    perform shepherd.require(p_key is not null, 'a setting name is required');
    perform shepherd.require(p_value is not null, 'a value is required');
    perform shepherd.require(nullif(trim(p_reason), '') is not null,
        'a reason is required (it is recorded with the change)');
    case p_key
    when 'max_machines', 'chunk_size' then
        perform shepherd.require(p_value ~ '^[0-9]{1,15}$',
            format('%s must be a whole number of 0 or more, not %L', p_key, p_value));
        perform shepherd.require(p_key <> 'chunk_size' or p_value::bigint > 0,
            'chunk_size must be at least 1');
        v_value := to_jsonb(p_value::bigint);
    when 'assimilate' then
        perform shepherd.require(p_value in ('true', 'false'),
            format('assimilate is true or false, not %L', p_value));
        v_value := to_jsonb(p_value::boolean);
    when 'penalty_factor' then
        perform shepherd.require(p_value ~ '^[0-9]{1,6}(\.[0-9]+)?$' and p_value::float8 >= 1,
            format('penalty_factor must be a number of 1 or more, not %L', p_value));
        v_value := to_jsonb(p_value::float8);
    when 'api_rate', 'penalty', 'penalty_max' then
        perform shepherd.require(shepherd.duration_seconds(p_value) <= v_year,
            format('%s is a duration of at most a year such as 500ms, 5s, 1m30s or 1h, not %L', p_key, p_value));
        v_value := to_jsonb(p_value);
    when 'device_creation_rate' then
        perform shepherd.require(
            shepherd.duration_seconds(split_part(p_value, ',', 1)) <= v_year
            and split_part(p_value, ',', 2) ~ '^[1-9][0-9]{0,5}$'
            and p_value ~ '^[^,]+,[^,]+$',
            format('device_creation_rate is INTERVAL,BURST such as 5s,1 (at most a year, a burst of at most 999999), not %L', p_value));
        v_value := to_jsonb(p_value);
    else
        raise exception 'unknown setting %; the settings are max_machines, chunk_size, assimilate, device_creation_rate, api_rate, penalty, penalty_factor, penalty_max', p_key
            using errcode = 'invalid_parameter_value';
    end case;
    perform pg_advisory_xact_lock(hashtextextended('operator/settings', 0));
    perform shepherd.require(exists (select 1 from shepherd.cluster_settings),
        'the cluster has no settings yet: start a worker once (its flags become the first settings)');
    perform shepherd.append_event('operator/settings', 'settings_changed',
        jsonb_build_object('by', v_by, 'reason', p_reason,
                           'settings', jsonb_build_object(p_key, v_value)));
    insert into shepherd.cluster_settings (key, value, updated_at)
    values (p_key, v_value, now())
    on conflict (key) do update set value = excluded.value, updated_at = excluded.updated_at;
end;
$$;

-- Records that a managed machine is no longer managed (its device is gone),
-- so reconcile passes resume. Takes the machine's id or its device's id.
-- Unlike `shepherd machines release`, it cannot ask the provider whether the
-- device is really gone: releasing a live device frees its slot, and the
-- next pass reports the device as a discrepancy (or adopts it again).
-- Mirrors events/views.rs apply() for `machine_released`.
create function shepherd.release_machine(p_id text, p_reason text, p_by text default null)
returns uuid
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
    m shepherd.managed_machines;
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
    perform shepherd.append_event('device/' || m.provider_id, 'machine_released',
        jsonb_build_object('machine_id', m.machine_id, 'provider', m.provider,
                           'provider_id', m.provider_id, 'by', v_by, 'reason', p_reason));
    delete from shepherd.managed_machines where machine_id = m.machine_id;
    return m.machine_id;
end;
$$;

-- Manual creations obey the cluster's limit and the sinbin. The checks here
-- give the caller an answer at once; the job admits again under the
-- capacity lock, which is what holds the limit.
drop function shepherd.enqueue_create_device(uuid);
create function shepherd.enqueue_create_device(p_reservation uuid, p_override_sinbin text default null)
returns text
language plpgsql as $$
declare
    v_limit bigint := shepherd.max_machines();
    v_used bigint;
    v_until timestamptz;
begin
    perform shepherd.require(p_reservation is not null, 'a reservation id is required');
    perform shepherd.require(p_override_sinbin is null or trim(p_override_sinbin) <> '',
        'overriding the sinbin needs a reason');
    perform shepherd.require(v_limit is not null,
        'the cluster has no settings yet: start a worker once (its flags become the cluster''s settings)');
    if exists (select 1 from shepherd.pending_creations where reservation_id = p_reservation) then
        raise exception 'reservation % already has a creation in flight', p_reservation
            using errcode = 'unique_violation';
    end if;
    if exists (select 1 from shepherd.managed_machines where reservation_id = p_reservation) then
        raise exception 'reservation % already has a managed machine', p_reservation
            using errcode = 'unique_violation';
    end if;
    select until into v_until from shepherd.sinbin
    where reservation_id = p_reservation and now() <= until;
    if found and p_override_sinbin is null then
        raise exception 'reservation % is penalised until %; pass a reason as the second argument to override the sinbin',
            p_reservation, v_until using errcode = 'check_violation';
    end if;
    select (select count(*) from shepherd.managed_machines)
         + (select count(*) from shepherd.in_flight) into v_used;
    if v_limit > 0 and v_used >= v_limit then
        raise exception 'managed machines plus creations in flight are at the cluster''s max_machines (%)', v_limit
            using errcode = 'check_violation';
    end if;
    return shepherd.push_job('create_device', jsonb_build_object(
        'reservation', p_reservation,
        'request', gen_random_uuid(),
        'attempt', 1,
        'admitted', false,
        'requested_by', 'sql:' || current_user,
        'sinbin_override', p_override_sinbin));
end;
$$;

create or replace function shepherd.enqueue_assimilate(p_device uuid) returns text
language plpgsql as $$
begin
    perform shepherd.require(p_device is not null, 'a device id is required');
    return shepherd.push_job('assimilate', jsonb_build_object('device', p_device, 'manual', true));
end;
$$;

create or replace function shepherd.prune_jobs(p_older_than interval) returns bigint
language plpgsql as $$
declare
    v_count bigint;
begin
    perform shepherd.require(p_older_than is not null and p_older_than >= interval '0',
        format('the retention must be an interval of zero or more, not %s',
               coalesce(p_older_than::text, 'NULL')));
    with gone as (
        delete from apalis.jobs
        where job_type in ('reconcile', 'create_device', 'assimilate')
          and (status in ('Done', 'Killed') or (status = 'Failed' and attempts >= max_attempts))
          and coalesce(done_at, run_at) < now() - p_older_than
        returning 1
    )
    select count(*) into v_count from gone;
    return v_count;
end;
$$;

-- Pausing and resuming are idempotent: a second pause (or a resume while
-- running) records nothing and returns false.
drop function shepherd.pause_creations(text, text);
create function shepherd.pause_creations(p_reason text, p_by text default null)
returns boolean
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
begin
    perform shepherd.require(nullif(trim(p_reason), '') is not null,
        'a reason is required (it is recorded with the pause)');
    perform pg_advisory_xact_lock(hashtextextended('operator/controls', 0));
    if exists (select 1 from shepherd.controls where name = 'creations' and paused) then
        return false;
    end if;
    perform shepherd.append_event('operator/controls', 'creations_paused',
        jsonb_build_object('by', v_by, 'reason', p_reason));
    insert into shepherd.controls (name, paused, by, reason, since)
    values ('creations', true, v_by, p_reason, now())
    on conflict (name) do update set paused = true, by = excluded.by,
        reason = excluded.reason, since = excluded.since;
    return true;
end;
$$;

drop function shepherd.resume_creations(text, text);
create function shepherd.resume_creations(p_reason text default '', p_by text default null)
returns boolean
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
begin
    perform shepherd.require(p_reason is not null, 'the reason may be empty but not NULL');
    perform pg_advisory_xact_lock(hashtextextended('operator/controls', 0));
    if not exists (select 1 from shepherd.controls where name = 'creations' and paused) then
        return false;
    end if;
    perform shepherd.append_event('operator/controls', 'creations_resumed',
        jsonb_build_object('by', v_by, 'reason', p_reason));
    delete from shepherd.controls where name = 'creations';
    return true;
end;
$$;

create or replace function shepherd.clear_penalty(p_reservation uuid, p_reason text, p_by text default null)
returns boolean
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
begin
    perform shepherd.require(p_reservation is not null, 'a reservation id is required');
    perform shepherd.require(p_reason is not null, 'the reason may be empty but not NULL');
    perform pg_advisory_xact_lock(hashtextextended('reservation/' || p_reservation, 0));
    if not exists (select 1 from shepherd.sinbin where reservation_id = p_reservation) then
        return false;
    end if;
    perform shepherd.append_event('reservation/' || p_reservation, 'penalty_cleared',
        jsonb_build_object('reservation', p_reservation, 'by', v_by, 'reason', p_reason));
    delete from shepherd.sinbin where reservation_id = p_reservation;
    return true;
end;
$$;
