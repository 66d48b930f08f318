-- Job queue glue: shepherd's jobs live in apalis.jobs (queues `reconcile`,
-- `create_device`, `assimilate`); these functions are the only way SQL should
-- put jobs there.

-- Cluster-wide rate limiters (src/limiter.rs): the next free slot per limiter.
create table shepherd.limiters (
    name    text primary key,
    next_at timestamptz not null
);

-- Settings every process agrees on, written by workers at start from their
-- configuration, read by SQL functions that need them.
create table shepherd.cluster_settings (
    key        text primary key,
    value      jsonb not null,
    updated_at timestamptz not null default now()
);

-- A job row that a worker cannot decode stops that worker (and the next one
-- that claims it). Refuse such rows at the door for shepherd's queues: the id
-- must be a ULID and the body JSON.
create function shepherd.guard_job_row() returns trigger
language plpgsql as $$
begin
    if new.job_type in ('reconcile', 'create_device', 'assimilate') then
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

create trigger guard_shepherd_jobs
    before insert or update of job, id on apalis.jobs
    for each row execute function shepherd.guard_job_row();

-- Pushes one job. An idempotency key already used in the queue makes this a
-- no-op returning null (apalis keeps keys unique forever, whatever the
-- status, so keys must be scoped: per tick, per request).
create function shepherd.push_job(
    p_kind text, p_args jsonb, p_run_at timestamptz default now(),
    p_max_attempts integer default 25, p_idempotency_key text default null)
returns text
language plpgsql as $$
declare
    v_id text;
begin
    if p_kind not in ('reconcile', 'create_device', 'assimilate') then
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

-- Manual jobs for operators. Ids are typed, so a malformed one is refused by
-- the cast; whether the provider knows it is checked by the job, which
-- records a refusal as an event.
create function shepherd.enqueue_reconcile() returns text
language sql as $$
    select shepherd.push_job('reconcile', jsonb_build_object('requested_by', 'sql:' || current_user))
$$;

create function shepherd.enqueue_create_device(p_reservation uuid) returns text
language sql as $$
    select shepherd.push_job('create_device', jsonb_build_object(
        'reservation', p_reservation,
        'request', gen_random_uuid(),
        'attempt', 1,
        'admitted', false))
$$;

create function shepherd.enqueue_assimilate(p_device uuid) returns text
language sql as $$
    select shepherd.push_job('assimilate', jsonb_build_object('device', p_device, 'manual', true))
$$;
