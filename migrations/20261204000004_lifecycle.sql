-- Pools are kept whole in both directions: surplus and failed machines are
-- deleted through a job of their own (`delete_machine`), with the same
-- discipline as creation. The request is an event before the call
-- (`deletion_requested`), the machine is marked as leaving (a row here)
-- until it ends (`machine_deleted`, `deletion_failed`, `deletion_cancelled`),
-- and guards hold it back: protection, a pause for deletions alone, a budget
-- per pool and period, and a stop when too many machines look failed.

-- Scale-in protection: a protected machine is never deleted by shepherd.
alter table shepherd.managed_machines add column protected boolean not null default false;

-- Machines leaving: a deletion requested and not yet ended.
create table shepherd.pending_deletions (
    machine_id       uuid primary key,
    provider_id      text not null,
    reservation_id   uuid,
    pool             text,
    -- The deletion's own id: only its own outcome ends it.
    request          text not null,
    -- Why: surplus, failed, not_ready, pool_removed, operator.
    cause            text not null,
    message          text not null,
    requested_by     text not null,
    requested_at     timestamptz not null,
    -- When the leave hook answered, its deadline passed with "proceed", or
    -- none was to be waited for: from then on the delete may be sent.
    cleared_at       timestamptz,
    unresolved_since timestamptz,
    last_error       text
);
create index pending_deletions_provider_idx on shepherd.pending_deletions (provider_id);

alter table shepherd.controls drop constraint controls_name_check;
alter table shepherd.controls add constraint controls_name_check
    check (name in ('creations', 'deletions'));

-- Machines leaving, as operators read them.
create view shepherd.leaving as
select d.machine_id, d.provider_id as device_id, m.hostname, d.pool, d.cause, d.message,
       d.requested_by, d.requested_at, d.cleared_at, d.unresolved_since, d.last_error, d.request
from shepherd.pending_deletions d
left join shepherd.managed_machines m on m.machine_id = d.machine_id
order by d.requested_at;

-- The machines view gains protection.
create or replace view shepherd.machines as
select machine_id, provider, provider_id as device_id, reservation_id, hostname, assimilated_at,
       protected
from shepherd.managed_machines
order by assimilated_at, machine_id;

-- A fourth job kind.
create or replace function shepherd.guard_job_row() returns trigger
language plpgsql as $$
begin
    if new.job_type in ('reconcile', 'create_device', 'assimilate', 'delete_machine') then
        if new.id !~ '^[0-9A-HJKMNP-TV-Z]{26}$' then
            raise exception 'job id % is not a ULID; enqueue with shepherd.enqueue_*()', new.id
                using errcode = 'check_violation';
        end if;
        if shepherd.job_args(new.job) is null or jsonb_typeof(shepherd.job_args(new.job)) <> 'object' then
            raise exception 'job body is not a JSON object; enqueue with shepherd.enqueue_*()'
                using errcode = 'check_violation';
        end if;
    end if;
    return new;
end;
$$;

create or replace function shepherd.push_job(
    p_kind text, p_args jsonb, p_run_at timestamptz default now(),
    p_max_attempts integer default 25, p_idempotency_key text default null)
returns text
language plpgsql as $$
declare
    v_id text;
begin
    if p_kind not in ('reconcile', 'create_device', 'assimilate', 'delete_machine') then
        raise exception 'unknown job kind %', p_kind using errcode = 'invalid_parameter_value';
    end if;
    insert into apalis.jobs (id, job_type, job, status, attempts, max_attempts, run_at, priority, idempotency_key)
    values (apalis.generate_ulid(), p_kind, convert_to(p_args::text, 'UTF8'), 'Pending', 0,
            p_max_attempts, p_run_at, 0, p_idempotency_key)
    on conflict (job_type, idempotency_key) do nothing
    returning id into v_id;
    return v_id;
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
        where job_type in ('reconcile', 'create_device', 'assimilate', 'delete_machine')
          and (status in ('Done', 'Killed') or (status = 'Failed' and attempts >= max_attempts))
          and coalesce(done_at, run_at) < now() - p_older_than
        returning 1
    )
    select count(*) into v_count from gone;
    return v_count;
end;
$$;

-- A managed machine by its id or its device's, locked for a change of its
-- own: raises when there is none.
create function shepherd.managed_machine(p_id text) returns shepherd.managed_machines
language plpgsql as $$
declare
    m shepherd.managed_machines;
begin
    perform shepherd.require(nullif(trim(p_id), '') is not null, 'a machine or device id is required');
    select * into m from shepherd.managed_machines
    where machine_id::text = p_id or provider_id = p_id;
    if not found then
        raise exception 'no managed machine has id or device %', p_id using errcode = 'no_data_found';
    end if;
    perform pg_advisory_xact_lock(hashtextextended('device/' || m.provider_id, 0));
    select * into m from shepherd.managed_machines where machine_id = m.machine_id;
    if not found then
        raise exception 'machine % was released meanwhile', p_id using errcode = 'no_data_found';
    end if;
    return m;
end;
$$;

-- Scale-in protection, on and off. Returns false when nothing changed.
-- Mirrors events/views apply() for `machine_protected` and
-- `machine_unprotected`.
create function shepherd.protect_machine(p_id text, p_reason text, p_by text default null,
                                         p_protected boolean default true)
returns boolean
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
    m shepherd.managed_machines;
begin
    perform shepherd.require(nullif(trim(p_reason), '') is not null,
        'a reason is required (it is recorded with the change)');
    perform shepherd.require(length(p_reason) <= 1000, 'a reason is at most 1000 characters');
    m := shepherd.managed_machine(p_id);
    if m.protected = p_protected then
        return false;
    end if;
    perform shepherd.append_event('device/' || m.provider_id,
        case when p_protected then 'machine_protected' else 'machine_unprotected' end,
        jsonb_build_object('machine_id', m.machine_id, 'provider_id', m.provider_id,
                           'by', v_by, 'reason', p_reason));
    update shepherd.managed_machines set protected = p_protected where machine_id = m.machine_id;
    return true;
end;
$$;

-- Deletions alone stop and start again. Idempotent, as creations' pause.
create function shepherd.pause_deletions(p_reason text, p_by text default null)
returns boolean
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
begin
    perform shepherd.require(nullif(trim(p_reason), '') is not null,
        'a reason is required (it is recorded with the pause)');
    perform shepherd.require(length(p_reason) <= 1000, 'a reason is at most 1000 characters');
    perform pg_advisory_xact_lock(hashtextextended('operator/controls', 0));
    if exists (select 1 from shepherd.controls where name = 'deletions' and paused) then
        return false;
    end if;
    perform shepherd.append_event('operator/controls', 'deletions_paused',
        jsonb_build_object('by', v_by, 'reason', p_reason));
    insert into shepherd.controls (name, paused, by, reason, since)
    values ('deletions', true, v_by, p_reason, now())
    on conflict (name) do update set paused = true, by = excluded.by,
        reason = excluded.reason, since = excluded.since;
    return true;
end;
$$;

create function shepherd.resume_deletions(p_reason text default '', p_by text default null)
returns boolean
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
begin
    perform shepherd.require(p_reason is not null, 'the reason may be empty but not NULL');
    perform shepherd.require(length(p_reason) <= 1000, 'a reason is at most 1000 characters');
    perform pg_advisory_xact_lock(hashtextextended('operator/controls', 0));
    if not exists (select 1 from shepherd.controls where name = 'deletions' and paused) then
        return false;
    end if;
    perform shepherd.append_event('operator/controls', 'deletions_resumed',
        jsonb_build_object('by', v_by, 'reason', p_reason));
    delete from shepherd.controls where name = 'deletions';
    return true;
end;
$$;

-- An operator (or the workload's own tooling, as a lifecycle hook) says a
-- leaving machine may go. False when it is not waiting for one.
create function shepherd.acknowledge_leave(p_id text, p_by text default null)
returns boolean
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
    m shepherd.managed_machines;
    d shepherd.pending_deletions;
begin
    m := shepherd.managed_machine(p_id);
    select * into d from shepherd.pending_deletions where machine_id = m.machine_id;
    if not found or d.cleared_at is not null then
        return false;
    end if;
    perform shepherd.append_event('device/' || m.provider_id, 'leave_acknowledged',
        jsonb_build_object('machine_id', m.machine_id, 'provider_id', m.provider_id,
                           'request', d.request, 'by', v_by));
    update shepherd.pending_deletions set cleared_at = now() where machine_id = m.machine_id;
    return true;
end;
$$;

-- An operator asks for one machine to be deleted (on either provider): the
-- request is recorded and its job queued; the job re-checks everything
-- (still managed, not protected, deletions running) before it sends the
-- delete. Returns the job's id. Mirrors events/views apply() for
-- `deletion_requested`.
create function shepherd.deprovision_machine(p_id text, p_reason text, p_by text default null)
returns text
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
    v_request uuid := gen_random_uuid();
    m shepherd.managed_machines;
begin
    perform shepherd.require(nullif(trim(p_reason), '') is not null,
        'a reason is required (it is recorded with the deletion)');
    perform shepherd.require(length(p_reason) <= 1000, 'a reason is at most 1000 characters');
    m := shepherd.managed_machine(p_id);
    perform shepherd.require(not m.protected,
        format('machine %s is protected: unprotect it first (shepherd machines unprotect)', m.machine_id));
    if exists (select 1 from shepherd.pending_deletions where machine_id = m.machine_id) then
        raise exception 'machine % is leaving already', m.machine_id using errcode = 'unique_violation';
    end if;
    perform shepherd.append_event('device/' || m.provider_id, 'deletion_requested',
        jsonb_build_object('machine_id', m.machine_id, 'provider_id', m.provider_id,
                           'reservation', m.reservation_id, 'pool', null, 'request', v_request,
                           'cause', 'operator', 'message', p_reason, 'by', v_by));
    insert into shepherd.pending_deletions (machine_id, provider_id, reservation_id, pool, request,
        cause, message, requested_by, requested_at)
    values (m.machine_id, m.provider_id, m.reservation_id, null, v_request::text,
            'operator', p_reason, v_by, now());
    return shepherd.push_job('delete_machine', jsonb_build_object(
        'machine_id', m.machine_id, 'device', m.provider_id, 'request', v_request, 'attempt', 1),
        now(), 25, v_request::text || '/1');
end;
$$;

-- The settings of the lifecycle join change_setting().
create or replace function shepherd.change_setting(p_key text, p_value text, p_reason text, p_by text default null)
returns void
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
    v_value jsonb;
    v_year constant float8 := 365 * 86400;
    v_heartbeat float8;
    v_missed float8;
    v_timeout float8;
begin
    perform shepherd.require(p_key is not null, 'a setting name is required');
    perform shepherd.require(p_value is not null, 'a value is required');
    perform shepherd.require(nullif(trim(p_reason), '') is not null,
        'a reason is required (it is recorded with the change)');
    perform shepherd.require(length(p_reason) <= 1000, 'a reason is at most 1000 characters');
    case p_key
    when 'max_machines', 'chunk_size' then
        perform shepherd.require(p_value ~ '^[0-9]{1,15}$',
            format('%s must be a whole number of 0 or more, not %L', p_key, p_value));
        perform shepherd.require(p_key <> 'chunk_size' or p_value::bigint > 0,
            'chunk_size must be at least 1');
        v_value := to_jsonb(p_value::bigint);
    when 'missed_heartbeats', 'latitude_reads_per_minute', 'latitude_writes_per_minute' then
        perform shepherd.require(p_value ~ '^[0-9]{1,9}$' and p_value::bigint >= 1,
            format('%s must be a whole number of 1 or more, not %L', p_key, p_value));
        v_value := to_jsonb(p_value::bigint);
    when 'assimilate', 'failed_skip_leave' then
        perform shepherd.require(p_value in ('true', 'false'),
            format('%s is true or false, not %L', p_key, p_value));
        v_value := to_jsonb(p_value::boolean);
    when 'penalty_factor' then
        perform shepherd.require(p_value ~ '^[0-9]{1,6}(\.[0-9]+)?$' and p_value::float8 >= 1,
            format('penalty_factor must be a number of 1 or more, not %L', p_value));
        v_value := to_jsonb(p_value::float8);
    when 'penalty', 'penalty_max', 'settle_window', 'ready_deadline', 'leave_timeout' then
        perform shepherd.require(shepherd.duration_seconds(p_value) <= v_year,
            format('%s is a duration of at most a year such as 500ms, 5s, 1m30s or 1h, not %L', p_key, p_value));
        v_value := to_jsonb(p_value);
    when 'heartbeat', 'api_timeout', 'deletion_period' then
        perform shepherd.require(shepherd.duration_seconds(p_value) <= v_year
                                 and shepherd.duration_seconds(p_value) > 0,
            format('%s is a duration of more than 0s and at most a year such as 5s or 30s, not %L', p_key, p_value));
        v_value := to_jsonb(p_value);
    when 'deletion_budget' then
        perform shepherd.require(p_value ~ '^[0-9]{1,3}%,[0-9]{1,6}$'
                                 and split_part(p_value, '%', 1)::int <= 100,
            format('deletion_budget is PERCENT%%,COUNT such as 10%%,2 (the larger of the two, per pool and deletion_period), not %L', p_value));
        v_value := to_jsonb(p_value);
    when 'max_unhealthy' then
        perform shepherd.require(p_value ~ '^[0-9]{1,3}%$' and split_part(p_value, '%', 1)::int <= 100,
            format('max_unhealthy is a percentage such as 40%%, not %L', p_value));
        v_value := to_jsonb(p_value);
    when 'leave_hook' then
        perform shepherd.require(p_value in ('none', 'ack') or p_value ~ '^https?://[^[:space:]]+$',
            format('leave_hook is none, ack, or an http(s) URL to POST to, not %L', p_value));
        v_value := to_jsonb(p_value);
    when 'leave_deadline' then
        perform shepherd.require(p_value in ('proceed', 'give_up'),
            format('leave_deadline is proceed or give_up, not %L', p_value));
        v_value := to_jsonb(p_value);
    when 'device_creation_rate', 'api_rate' then
        perform shepherd.require(
            shepherd.duration_seconds(split_part(p_value, ',', 1)) <= v_year
            and ((split_part(p_value, ',', 2) ~ '^[1-9][0-9]{0,5}$' and p_value ~ '^[^,]+,[^,]+$')
                 or (p_key = 'api_rate' and p_value !~ ',')),
            format('%s is INTERVAL,BURST such as %s (at most a year, a burst of at most 999999), not %L',
                   p_key, case p_key when 'api_rate' then '2s,20' else '5s,1' end, p_value));
        v_value := to_jsonb(p_value);
    when 'provider', 'project', 'device_prefix' then
        raise exception '% is fixed when a cluster first starts: a cluster changes it by starting anew', p_key
            using errcode = 'invalid_parameter_value';
    else
        raise exception 'unknown setting %; the settings are max_machines, chunk_size, assimilate, device_creation_rate, api_rate, penalty, penalty_factor, penalty_max, settle_window, heartbeat, missed_heartbeats, api_timeout, latitude_reads_per_minute, latitude_writes_per_minute, deletion_budget, deletion_period, max_unhealthy, ready_deadline, leave_hook, leave_timeout, leave_deadline, failed_skip_leave', p_key
            using errcode = 'invalid_parameter_value';
    end case;
    perform pg_advisory_xact_lock(hashtextextended('operator/settings', 0));
    perform shepherd.require(exists (select 1 from shepherd.cluster_settings),
        'the cluster has no settings yet: start a worker once (its flags become the first settings)');
    if p_key in ('heartbeat', 'missed_heartbeats', 'api_timeout')
       and (select value #>> '{}' from shepherd.cluster_settings where key = 'provider') = 'latitude' then
        select coalesce(shepherd.duration_seconds(case when p_key = 'heartbeat' then p_value
                            else (select value #>> '{}' from shepherd.cluster_settings where key = 'heartbeat') end), 5),
               coalesce(case when p_key = 'missed_heartbeats' then p_value::float8
                            else (select (value #>> '{}')::float8 from shepherd.cluster_settings where key = 'missed_heartbeats') end, 12),
               coalesce(shepherd.duration_seconds(case when p_key = 'api_timeout' then p_value
                            else (select value #>> '{}' from shepherd.cluster_settings where key = 'api_timeout') end), 30)
          into v_heartbeat, v_missed, v_timeout;
        perform shepherd.require(v_timeout + v_heartbeat < v_heartbeat * v_missed,
            format('api_timeout (%ss) plus one heartbeat (%ss) must be shorter than the rescue window, heartbeat × missed_heartbeats (%ss): otherwise a create still on the wire could meet a second run of its creation',
                   v_timeout, v_heartbeat, v_heartbeat * v_missed));
    end if;
    perform shepherd.append_event('operator/settings', 'settings_changed',
        jsonb_build_object('by', v_by, 'reason', p_reason,
                           'settings', jsonb_build_object(p_key, v_value)));
    insert into shepherd.cluster_settings (key, value, updated_at)
    values (p_key, v_value, now())
    on conflict (key) do update set value = excluded.value, updated_at = excluded.updated_at;
end;
$$;
