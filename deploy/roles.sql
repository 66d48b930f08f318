-- shepherd's least-privilege worker role and a read-only role, as
-- docs/security.md explains. Run as a superuser (or the database owner with
-- CREATEROLE), connected to shepherd's database, after `shepherd migrate`:
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f deploy/roles.sql
-- Safe to re-run; re-run it after an upgrade whose migrations add tables or
-- functions. Set passwords separately (\password shepherd_worker).

do $$
begin
    if not exists (select from pg_roles where rolname = 'shepherd_worker') then
        create role shepherd_worker login;
    end if;
    if not exists (select from pg_roles where rolname = 'shepherd_reader') then
        create role shepherd_reader login;
    end if;
    execute format('grant connect on database %I to shepherd_worker, shepherd_reader',
                   current_database());
end
$$;

grant usage on schema shepherd, apalis to shepherd_worker, shepherd_reader;

-- The event log: read and append, never change.
grant select, insert on shepherd.events to shepherd_worker;

-- The views built from the log, the rate limiters, the announced settings
-- and the pause control.
grant select, insert, update, delete on
    shepherd.managed_machines, shepherd.sinbin, shepherd.pending_creations,
    shepherd.unassimilated_devices, shepherd.controls,
    shepherd.limiters, shepherd.cluster_settings, shepherd.pools,
    shepherd.pending_deletions
    to shepherd_worker;

-- What is not folded from the log: each machine's status as the last pass
-- saw it, the console's sessions (kept by hash) and failed log-ins, and
-- each job's runs.
grant select, insert, update, delete on
    shepherd.machine_status, shepherd.console_sessions, shepherd.console_login_failures,
    shepherd.job_runs
    to shepherd_worker;

-- The operator views, read by the status page and `shepherd status`.
grant select on
    shepherd.queue_depth, shepherd.failed_jobs, shepherd.recent_events,
    shepherd.machines, shepherd.sinbin_now, shepherd.in_flight, shepherd.leaving
    to shepherd_worker;

-- shepherd's functions, and apalis's (shepherd.push_job calls
-- apalis.generate_ulid(); workers claim jobs with apalis.get_jobs()).
grant execute on all functions in schema shepherd, apalis to shepherd_worker;

-- The job queue.
grant select, insert, update, delete on apalis.jobs, apalis.workers to shepherd_worker;

-- Readers look at everything and change nothing: the tables and views,
-- and the read-only helpers some views call (EXECUTE on shepherd's
-- functions is nobody's by default).
grant select on all tables in schema shepherd, apalis to shepherd_reader;
grant execute on function
    shepherd.job_args(bytea), shepherd.history(text), shepherd.device_history(text),
    shepherd.device_history(uuid), shepherd.pool_occupancy(text)
    to shepherd_reader;
