-- shepherd's three roles, as docs/security.md's matrix states them:
--   shepherd_worker    what workers do, and nothing an operator does;
--   shepherd_operator  what an operator does (through functions that run as
--                      their owner), and what a worker does;
--   shepherd_reader    reads everything, changes nothing.
-- Run as a superuser (or the database owner with CREATEROLE), connected to
-- shepherd's database, after `shepherd migrate`:
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f deploy/roles.sql
-- Safe to re-run, and to run for several databases at once; re-run it
-- after an upgrade whose migrations add tables or functions. Set passwords
-- separately (\password shepherd_worker).

do $$
declare
    r text;
begin
    foreach r in array array['shepherd_worker', 'shepherd_operator', 'shepherd_reader'] loop
        begin
            execute pg_catalog.format('create role %I login', r);
        exception when duplicate_object or unique_violation then
            null;  -- made already, perhaps by a run for another database
        end;
    end loop;
    execute pg_catalog.format(
        'grant connect on database %I to shepherd_worker, shepherd_operator, shepherd_reader',
        pg_catalog.current_database());
end
$$;

grant usage on schema shepherd, apalis to shepherd_worker, shepherd_operator, shepherd_reader;

-- ---- the worker ----

-- The event log: read and append (an operator's kinds of event are
-- refused by the log's own trigger), never change.
grant select, insert on shepherd.events to shepherd_worker;

-- The views built from the log, the rate limiters and what is not folded
-- from the log: each machine's status as the last pass saw it, the
-- console's sessions and failed log-ins, each job's runs, the worker
-- processes, the leases on units and on the pass. The pools, the settings and the pause controls take a
-- worker's writes only where their triggers allow it (a setting the
-- cluster lacks).
grant select, insert, update, delete on
    shepherd.managed_machines, shepherd.sinbin, shepherd.pending_creations,
    shepherd.unassimilated_devices, shepherd.controls,
    shepherd.limiters, shepherd.cluster_settings, shepherd.pools,
    shepherd.pending_deletions, shepherd.machine_status,
    shepherd.console_sessions, shepherd.console_login_failures, shepherd.job_runs,
    shepherd.processes, shepherd.leases, shepherd.database_identity
    to shepherd_worker;

-- The operator views, read by the status page and `shepherd status`.
grant select on
    shepherd.queue_depth, shepherd.failed_jobs, shepherd.recent_events,
    shepherd.machines, shepherd.sinbin_now, shepherd.in_flight, shepherd.leaving
    to shepherd_worker;

-- The functions a worker runs: the queue, the pace, the first pools of a
-- new cluster, and the read helpers the views call. None of an operator's
-- (and none left from a release that granted it them all).
revoke execute on all functions in schema shepherd from shepherd_worker;
grant execute on function
    shepherd.push_job(text, jsonb, timestamptz, integer, text),
    shepherd.enqueue_reconcile(),
    shepherd.prune_jobs(interval),
    shepherd.take_window_slot(text, integer, double precision),
    shepherd.max_machines(),
    shepherd.append_event(text, text, jsonb),
    shepherd.require(boolean, text),
    shepherd.duration_seconds(text),
    shepherd.pool_occupancy(text),
    shepherd.managed_machine(text),
    shepherd.declare_pool(text, text, text, integer, text, text[], text, text),
    shepherd.view_rows(text[], uuid[]),
    shepherd.append_reading(uuid[], text[], text[], integer[], jsonb[], text[], text[], text[], uuid[]),
    shepherd.assimilation_seen(text, text, text, uuid),
    shepherd.job_args(bytea), shepherd.history(text), shepherd.reservation_history(uuid),
    shepherd.device_history(text), shepherd.device_history(uuid),
    shepherd.database_identity_now()
    to shepherd_worker;

-- apalis's (shepherd.push_job calls apalis.generate_ulid(); workers claim
-- jobs with apalis.get_jobs()) and its tables.
grant execute on all functions in schema apalis to shepherd_worker;
grant select, insert, update, delete on apalis.jobs, apalis.workers to shepherd_worker;

-- ---- the operator ----

-- An operator's CLI runs jobs' judgements (retry, cancel, rebuild the
-- views) that write as a worker writes: the worker's grants, inherited.
do $$
begin
    grant shepherd_worker to shepherd_operator;
exception when unique_violation then
    null;  -- granted by a concurrent run
end
$$;

-- Everything readable, and every function of shepherd's: the operator's
-- run as their owner (SECURITY DEFINER), and operator_door() is what the
-- log's and the tables' triggers ask for.
grant select on all tables in schema shepherd, apalis to shepherd_operator;
grant execute on all functions in schema shepherd to shepherd_operator;

-- ---- the reader ----

-- Readers look at everything and change nothing: the tables and views,
-- and the read-only helpers some views call.
grant select on all tables in schema shepherd, apalis to shepherd_reader;
grant execute on function
    shepherd.job_args(bytea), shepherd.history(text), shepherd.reservation_history(uuid),
    shepherd.device_history(text), shepherd.device_history(uuid), shepherd.pool_occupancy(text)
    to shepherd_reader;
-- But not the console's sessions and failed log-ins: a fingerprint of the
-- operator credential, and who tried what from where, are no reader's.
revoke select on shepherd.console_sessions, shepherd.console_login_failures
    from shepherd_reader;
-- A reader's session cannot sit in a transaction for long (holding back
-- vacuum, and the table locks `views rebuild --replace` takes), nor run one
-- statement for ever. For its new sessions.
alter role shepherd_reader set idle_in_transaction_session_timeout = '1min';
alter role shepherd_reader set statement_timeout = '5min';

-- ---- advisory locks ----

-- Writers serialise on advisory keys (`reservation/<id>`, `device/<id>`,
-- `operator/settings`, a console client's address, ...). Any role that may
-- take one may hold such a key for ever and stall the cluster: a reader's
-- `pg_advisory_lock` on `operator/settings` stopped settings changes,
-- appends and worker start. So the functions are taken from PUBLIC and
-- given to the roles that write, and to the owner, whose migrations take
-- one. Revoking needs a superuser: a run by the database's owner says so
-- and leaves them as they were.
do $$
declare
    f regprocedure;
    owner text := (select pg_catalog.pg_get_userbyid(d.datdba) from pg_catalog.pg_database d
                   where d.datname = pg_catalog.current_database());
begin
    for f in select p.oid::regprocedure from pg_catalog.pg_proc p
             where p.pronamespace = 'pg_catalog'::regnamespace
               and (p.proname like 'pg\_advisory\_%' or p.proname like 'pg\_try\_advisory\_%')
    loop
        execute pg_catalog.format('grant execute on function %s to shepherd_worker, shepherd_operator, %I, %I',
                                  f, owner, current_user);
        execute pg_catalog.format('revoke execute on function %s from public', f);
    end loop;
exception when insufficient_privilege then
    raise notice 'advisory lock functions left open to every role (run deploy/roles.sql as a superuser to close them to the reader): %', sqlerrm;
end
$$;
