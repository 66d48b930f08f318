-- A pass deletes a managed machine that stands on no place of the
-- cluster's pools (issue 45: billed, in no pool, never shed before), with
-- the cause `unplaced`: a pass's cause, recorded by the worker's role as
-- `surplus` is, and checked again before its DELETE as every cause is
-- (the machine still on no place, the cluster with pools at all). The
-- rest of the guard is as migration 20261206000010 left it.
create or replace function shepherd.guard_event() returns trigger
language plpgsql
set search_path = pg_catalog, shepherd, pg_temp
as $$
declare
    v_operators boolean;
begin
    new.role := session_user;
    v_operators := new.event_type in ('pool_declared', 'pool_changed', 'pool_removed',
                          'creations_paused', 'creations_resumed',
                          'deletions_paused', 'deletions_resumed',
                          'machine_protected', 'machine_unprotected', 'machine_released',
                          'job_retried', 'job_cancelled', 'views_replaced')
       or (new.event_type = 'deletion_requested'
           and new.body->>'cause' is distinct from 'surplus'
           and new.body->>'cause' is distinct from 'failed'
           and new.body->>'cause' is distinct from 'not_ready'
           and new.body->>'cause' is distinct from 'pool_removed'
           and new.body->>'cause' is distinct from 'unplaced')
       or (new.event_type = 'leave_acknowledged'
           and coalesce(new.body->>'by', '') not like 'hook:%')
       or (new.event_type = 'penalty_cleared'
           and new.body->>'by' is distinct from 'shepherd');
    if not v_operators and new.event_type = 'settings_changed' then
        v_operators := exists (select 1 from shepherd.cluster_settings s
                               where s.key in (select pg_catalog.jsonb_object_keys(new.body->'settings')));
    end if;
    if v_operators
       and not pg_catalog.has_function_privilege(current_user, 'shepherd.operator_door()', 'EXECUTE') then
        raise exception 'role % may not record %: that is an operator''s action (connect as a role granted shepherd.operator_door(), such as shepherd_operator)',
            session_user, new.event_type
            using errcode = 'insufficient_privilege';
    end if;
    return new;
end;
$$;
