-- apalis never deletes finished jobs; shepherd's scheduler calls this.
-- Only jobs that can no longer run are removed: Done and Killed ones, and
-- Failed ones with no attempts left. The events keep the history.
create function shepherd.prune_jobs(p_older_than interval) returns bigint
language sql as $$
    with gone as (
        delete from apalis.jobs
        where job_type in ('reconcile', 'create_device', 'assimilate')
          and (status in ('Done', 'Killed') or (status = 'Failed' and attempts >= max_attempts))
          and coalesce(done_at, run_at) < now() - p_older_than
        returning 1
    )
    select count(*) from gone
$$;
