-- A run that ended well is kept in shepherd.job_runs by the queue's own
-- acknowledgement, in its transaction, instead of by a statement and a
-- commit of the worker's after every run (issue 31: one round trip and one
-- WAL flush a job). The worker still writes the runs that failed or were
-- dropped (workers/src/services/runtime.rs, `record_run`): only it knows
-- which of the two a failure was.
--
-- An acknowledgement is told from every other change of a row by what only
-- it does: a row claimed by a worker (`Queued`, or `Running` once the
-- worker has said it started) goes to `Done` and its run count goes up.
-- An operator's cancel (`Killed`, the count untouched), a dead worker's job
-- handed back (`Pending`) and an edit by hand do not match.
create or replace function shepherd.record_acked_run() returns trigger
language plpgsql
set search_path = pg_catalog, shepherd, pg_temp
as $$
begin
    insert into shepherd.job_runs (job_id, run, kind, worker, started_at, ended_at, outcome, result)
    values (new.id, old.attempts + 1, new.job_type, new.lock_by,
            least(coalesce(new.lock_at, now()), now()), now(), 'ok',
            left(new.last_result ->> 'Ok', 2000))
    on conflict (job_id, run) do nothing;
    return null;
end;
$$;

-- A trigger's function is run by the trigger, never called.
revoke execute on function shepherd.record_acked_run() from public;

drop trigger if exists record_acked_run on apalis.jobs;
create trigger record_acked_run
    after update of status on apalis.jobs
    for each row
    when (new.status = 'Done'
          and old.status in ('Queued', 'Running')
          and new.attempts > old.attempts
          and new.lock_by is not null
          and new.job_type in ('reconcile', 'create_device', 'assimilate', 'delete_machine'))
    execute function shepherd.record_acked_run();
