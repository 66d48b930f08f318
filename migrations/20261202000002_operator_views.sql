-- Views and functions for operators with psql. docs/sql.md shows them in use.

-- Job arguments as JSON, or null for a row whose bytes are not JSON (a
-- poison row must not make the whole view fail).
create function shepherd.job_args(job bytea) returns jsonb
language plpgsql immutable as $$
begin
    return convert_from(job, 'UTF8')::jsonb;
exception when others then
    return null;
end;
$$;

-- Queue depth and age by job kind and state.
create view shepherd.queue_depth as
select job_type as kind,
       status as state,
       count(*) as jobs,
       min(run_at) as oldest_run_at,
       now() - min(run_at) as oldest_age
from apalis.jobs
group by job_type, status
order by job_type, status;

-- Jobs that failed or were killed, newest first, with their last error.
create view shepherd.failed_jobs as
select id, job_type as kind, status as state, attempts, max_attempts, run_at, done_at,
       last_result, shepherd.job_args(job) as args
from apalis.jobs
where status in ('Failed', 'Killed')
order by coalesce(done_at, run_at) desc;

create view shepherd.recent_events as
select position, recorded_at, stream, event_type, schema_version, body, job_id
from shepherd.events
order by position desc
limit 200;

create view shepherd.machines as
select machine_id, provider, provider_id as device_id, reservation_id, hostname, assimilated_at
from shepherd.managed_machines
order by assimilated_at, machine_id;

-- The sinbin with time left; `penalised` follows the seed: now() <= until.
create view shepherd.sinbin_now as
select reservation_id, until, cause, failures,
       now() <= until as penalised,
       greatest(until - now(), interval '0') as time_left
from shepherd.sinbin
order by until desc;

create view shepherd.in_flight as
select 'creation'::text as kind, reservation_id, null::uuid as device_id, job_id, enqueued_at as since
from shepherd.pending_creations
union all
select 'assimilation', reservation_id, device_id, null, created_at
from shepherd.unassimilated_devices;

-- One stream's events in order: select * from shepherd.history('reservation/<id>').
create function shepherd.history(p_stream text)
returns table (event_position bigint, recorded_at timestamptz, event_type text,
               schema_version integer, body jsonb, job_id text)
language sql stable as $$
    select position, recorded_at, event_type, schema_version, body, job_id
    from shepherd.events where stream = p_stream order by position
$$;

create function shepherd.reservation_history(p_reservation uuid)
returns table (event_position bigint, recorded_at timestamptz, event_type text,
               schema_version integer, body jsonb, job_id text)
language sql stable as $$
    select * from shepherd.history('reservation/' || p_reservation)
$$;

-- A device's own stream, plus the creation event (kept on its reservation's
-- stream) that brought it into being.
create function shepherd.device_history(p_device uuid)
returns table (event_position bigint, recorded_at timestamptz, event_type text,
               schema_version integer, body jsonb, job_id text)
language sql stable as $$
    select position, recorded_at, event_type, schema_version, body, job_id
    from shepherd.events
    where stream = 'device/' || p_device
       or (event_type = 'device_created' and body->>'device' = p_device::text)
    order by position
$$;
