-- Powers kept apart, as deploy/roles.sql grants them: a worker does what
-- workers do and nothing an operator does; an operator acts through
-- functions that run as their owner; a reader reads.
--
-- Who may operate is whoever may run shepherd.operator_door(): its owner
-- (the role that migrates), superusers, and the roles it is granted to
-- (shepherd_operator). Inside a SECURITY DEFINER function the current
-- user is the owner, so an operator function passes on behalf of anyone
-- allowed to call it.
create function shepherd.operator_door() returns boolean
language sql immutable
set search_path = pg_catalog, shepherd, pg_temp
as $$ select true $$;
revoke execute on function shepherd.operator_door() from public;

-- Every event says which database role wrote it: the session's, which no
-- function and no body can change. The body's `by` stays the name the
-- console or CLI gives (console:alice); this is who connected.
alter table shepherd.events add column role text;

-- What only an operator records. A worker writes none of these itself,
-- with three exceptions that are a worker's own work: the leave hook's
-- consent (by hook:<host>), a penalty a machine of ours ends (by
-- shepherd), and settings the cluster does not have yet (the first
-- worker's flags, or keys a release adds).
create function shepherd.guard_event() returns trigger
language plpgsql
set search_path = pg_catalog, shepherd, pg_temp
as $$
begin
    new.role := session_user;
    if pg_catalog.has_function_privilege(current_user, 'shepherd.operator_door()', 'EXECUTE') then
        return new;
    end if;
    if new.event_type in ('pool_declared', 'pool_changed', 'pool_removed',
                          'creations_paused', 'creations_resumed',
                          'deletions_paused', 'deletions_resumed',
                          'machine_protected', 'machine_unprotected', 'machine_released',
                          'job_retried', 'job_cancelled', 'views_replaced')
       or (new.event_type = 'deletion_requested'
           and new.body->>'cause' is distinct from 'surplus'
           and new.body->>'cause' is distinct from 'failed'
           and new.body->>'cause' is distinct from 'not_ready'
           and new.body->>'cause' is distinct from 'pool_removed')
       or (new.event_type = 'leave_acknowledged'
           and coalesce(new.body->>'by', '') not like 'hook:%')
       or (new.event_type = 'penalty_cleared'
           and new.body->>'by' is distinct from 'shepherd')
       or (new.event_type = 'settings_changed'
           and exists (select 1 from shepherd.cluster_settings s
                       where s.key in (select pg_catalog.jsonb_object_keys(new.body->'settings'))))
    then
        raise exception 'role % may not record %: that is an operator''s action (connect as a role granted shepherd.operator_door(), such as shepherd_operator)',
            session_user, new.event_type
            using errcode = 'insufficient_privilege';
    end if;
    return new;
end;
$$;
create trigger events_operator_kinds before insert on shepherd.events
    for each row execute function shepherd.guard_event();

-- The tables that decide what the fleet should be: a worker reads them and
-- adds settings the cluster lacks, and changes nothing else.
create function shepherd.guard_operator_table() returns trigger
language plpgsql
set search_path = pg_catalog, shepherd, pg_temp
as $$
begin
    if pg_catalog.has_function_privilege(current_user, 'shepherd.operator_door()', 'EXECUTE')
       or (tg_op = 'INSERT' and tg_table_name = 'cluster_settings') then
        return case tg_op when 'DELETE' then old else new end;
    end if;
    raise exception 'role % may not change shepherd.%: that is an operator''s action',
        session_user, tg_table_name
        using errcode = 'insufficient_privilege';
end;
$$;
create trigger pools_operator_only before insert or update or delete on shepherd.pools
    for each row execute function shepherd.guard_operator_table();
create trigger settings_operator_only before insert or update or delete on shepherd.cluster_settings
    for each row execute function shepherd.guard_operator_table();
create trigger controls_operator_only before insert or update or delete on shepherd.controls
    for each row execute function shepherd.guard_operator_table();

-- A worker declares the pools of a cluster that has none, from its flags:
-- only while no pool was ever declared, changed or removed (but by this
-- same transaction, which declares the flags' pools one after another),
-- through set_pool()'s checks. Its locks are taken in set_pool()'s order
-- (the pool's, then the pools'), so a concurrent set_pool() waits rather
-- than deadlocks.
create function shepherd.declare_pool(
    p_name text, p_plan text, p_site text, p_count integer, p_operating_system text,
    p_ssh_keys text[], p_reason text, p_by text)
returns text
language plpgsql security definer
set search_path = pg_catalog, shepherd, pg_temp
as $$
begin
    perform pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(('pool/' || p_name)::text, 0::int8));
    perform pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('operator/pools'::text, 0::int8));
    perform shepherd.require(not exists (
            select 1 from shepherd.events
            where event_type in ('pool_declared', 'pool_changed', 'pool_removed')
              and tx_id <> pg_catalog.pg_current_xact_id()),
        'the cluster has pools already: only an operator declares or changes one (shepherd pools set)');
    perform shepherd.require(not exists (select 1 from shepherd.pools where name = p_name),
        pg_catalog.format('pool %L is declared already: only an operator changes it', p_name));
    return shepherd.set_pool(p_name, p_plan, p_site, p_count, p_operating_system, p_ssh_keys,
                             p_reason, p_by, false);
end;
$$;
revoke execute on function shepherd.declare_pool(text, text, text, integer, text, text[], text, text)
    from public;

-- The operator's functions run as their owner, so the operator role needs
-- no write on the tables, and record, when no name is given, the session's
-- role (inside such a function current_user is the owner).
do $$
declare
    f regprocedure;
    def text;
begin
    for f in
        select p.oid::regprocedure
        from pg_catalog.pg_proc p
        join pg_catalog.pg_namespace n on n.oid = p.pronamespace
        where n.nspname = 'shepherd'
          and p.proname in ('change_setting', 'clear_penalty', 'clear_all_penalties',
                            'pause_creations', 'resume_creations',
                            'pause_deletions', 'resume_deletions',
                            'set_pool', 'remove_pool', 'protect_machine', 'acknowledge_leave',
                            'deprovision_machine', 'release_machine',
                            'enqueue_create_device', 'enqueue_assimilate', 'enqueue_reconcile')
    loop
        def := pg_catalog.pg_get_functiondef(f);
        def := pg_catalog.replace(def, '''sql:'' || current_user', '''sql:'' || session_user');
        execute def;
        execute pg_catalog.format('alter function %s security definer', f);
    end loop;
end;
$$;

-- Nobody runs shepherd's functions unless granted. (The per-schema
-- default-privileges revoke of 20261205000007 cannot take away the global
-- default that PUBLIC may execute a new function: each migration that adds
-- one revokes it, and tests/sql_door.rs fails on one it forgets.)
revoke execute on all functions in schema shepherd from public;

-- A release before this one granted shepherd_worker every function of
-- shepherd's: the operator's, which now run as their owner, are taken back
-- at once rather than at the next run of deploy/roles.sql.
do $$
declare
    f regprocedure;
begin
    if not exists (select from pg_catalog.pg_roles where rolname = 'shepherd_worker') then
        return;
    end if;
    for f in
        select p.oid::regprocedure
        from pg_catalog.pg_proc p
        join pg_catalog.pg_namespace n on n.oid = p.pronamespace
        where n.nspname = 'shepherd' and p.prosecdef
          and p.proname not in ('declare_pool', 'enqueue_reconcile')
    loop
        execute pg_catalog.format('revoke execute on function %s from shepherd_worker', f);
    end loop;
end;
$$;
