-- Every free text an operator or a job's payload carries into the
-- permanent log has a limit, not only the bodies that name who acted: a
-- penalty override's reason (`sinbin_override`) and who asked for a job
-- (`requested_by`) ride in job payloads and land in events without a `by`.
-- Checked at both doors, the queue and the log, so an over-long text is
-- refused when it is enqueued rather than failing the job's record later.
create or replace function shepherd.limit_operator_text() returns trigger
language plpgsql
set search_path = pg_catalog, shepherd, pg_temp
as $$
begin
    if new.body ? 'by' then
        perform shepherd.require(coalesce(length(new.body->>'reason'), 0) <= 1000,
            format('a reason is at most 1000 characters (this one has %s)',
                   length(new.body->>'reason')));
        perform shepherd.require(length(new.body->>'by') <= 200,
            format('who acted is at most 200 characters (this has %s)',
                   length(new.body->>'by')));
    end if;
    perform shepherd.require(coalesce(length(new.body->>'requested_by'), 0) <= 200,
        format('who asked is at most 200 characters (this has %s)',
               length(new.body->>'requested_by')));
    perform shepherd.require(coalesce(length(new.body->>'sinbin_override'), 0) <= 1000,
        format('a reason to override a penalty is at most 1000 characters (this one has %s)',
               length(new.body->>'sinbin_override')));
    return new;
end;
$$;

create or replace function shepherd.guard_job_row() returns trigger
language plpgsql
set search_path = pg_catalog, shepherd, pg_temp
as $$
declare
    v_args jsonb;
begin
    if new.job_type in ('reconcile', 'create_device', 'assimilate', 'delete_machine') then
        if new.id !~ '^[0-9A-HJKMNP-TV-Z]{26}$' then
            raise exception 'job id % is not a ULID; enqueue with shepherd.enqueue_*()', new.id
                using errcode = 'check_violation';
        end if;
        v_args := shepherd.job_args(new.job);
        if v_args is null or jsonb_typeof(v_args) <> 'object' then
            raise exception 'job body is not a JSON object; enqueue with shepherd.enqueue_*()'
                using errcode = 'check_violation';
        end if;
        perform shepherd.require(coalesce(length(v_args->>'requested_by'), 0) <= 200,
            format('who asked is at most 200 characters (this has %s)',
                   length(v_args->>'requested_by')));
        perform shepherd.require(coalesce(length(v_args->>'sinbin_override'), 0) <= 1000,
            format('a reason to override a penalty is at most 1000 characters (this one has %s)',
                   length(v_args->>'sinbin_override')));
    end if;
    return new;
end;
$$;
revoke execute on all functions in schema shepherd from public;
