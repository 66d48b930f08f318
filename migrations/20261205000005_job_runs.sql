-- Every run of a job as the worker saw it. The queue keeps a row's last
-- result only: a job that failed on the database twice and then ran would
-- show none of its failures. A run is written once, when it ends, numbered
-- as the queue counts runs (`attempts` + 1); a run whose worker died
-- leaves no row, and the queue's count tells it. Not a record of what
-- happened (that is the event log): the runs go with their job when it is
-- pruned.
create table shepherd.job_runs (
    job_id     text not null,
    run        integer not null check (run > 0),
    kind       text not null,
    worker     text,
    started_at timestamptz not null,
    ended_at   timestamptz not null,
    -- ok | failed | dropped (the worker shut down before the run ended)
    outcome    text not null check (outcome in ('ok', 'failed', 'dropped')),
    -- The handler's outcome or the error, cut to 2,000 characters.
    result     text check (length(result) <= 2000),
    primary key (job_id, run)
);

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
        returning id
    ), runs as (
        delete from shepherd.job_runs r using gone where r.job_id = gone.id
    )
    select count(*) into v_count from gone;
    -- Runs of jobs removed by other means (by hand, in psql).
    delete from shepherd.job_runs r
    where r.started_at < now() - p_older_than
      and not exists (select 1 from apalis.jobs j where j.id = r.job_id);
    return v_count;
end;
$$;
