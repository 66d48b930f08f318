-- Pools are the cluster's desired state: declared, changed and removed by
-- audited events (`pool_declared`, `pool_changed`, `pool_removed`), folded
-- into this view (events/views, apply()), read by every worker, command and
-- page. The functions below are the SQL door; `shepherd pools set|remove|
-- apply` call them, so the rules live in one place.

create table shepherd.pools (
    name             text primary key,
    plan             text not null,
    site             text not null,
    count            integer not null check (count >= 0),
    operating_system text not null,
    ssh_keys         text[] not null default '{}',
    -- The most places the pool ever had: their units stay known while
    -- machines on them may stand (a pool shrunk or removed drains).
    places_ever      integer not null check (places_ever >= 0),
    removed          boolean not null default false,
    updated_at       timestamptz not null,
    updated_by       text not null,
    reason           text not null
);

-- A pending creation names its place where the provider has places
-- (`web/3`), so a pool's creations in flight can be found by name.
alter table shepherd.pending_creations add column place text;

drop view shepherd.in_flight;
create view shepherd.in_flight as
select 'creation'::text as kind, reservation_id, null::text as device_id, request,
       enqueued_at as since, unresolved_since, last_error, place
from shepherd.pending_creations
union all
select 'assimilation', reservation_id, device_id, null, created_at, null, null, null
from shepherd.unassimilated_devices;

-- What stands on a pool now: its managed machines and machines made and
-- not yet assimilated (by their hostnames, `<prefix><pool>-<n>-<witness>`),
-- and its creations in flight (by their places).
create function shepherd.pool_occupancy(p_name text)
returns table (machines bigint, creations bigint)
language sql stable as $$
    with pattern as (
        select '^' || regexp_replace(coalesce((select value #>> '{}' from shepherd.cluster_settings
                                               where key = 'device_prefix'), 'shepherd-'),
                                     '([.^$*+?()\[\]{}|\\-])', '\\\1', 'g')
               || regexp_replace(p_name, '([.^$*+?()\[\]{}|\\-])', '\\\1', 'g')
               || '-[0-9]+-[0-9a-f]{8}$' as re)
    select (select count(*) from shepherd.managed_machines, pattern where hostname ~ pattern.re)
         + (select count(*) from shepherd.unassimilated_devices, pattern where hostname ~ pattern.re),
           (select count(*) from shepherd.pending_creations where place like p_name || '/%')
$$;

-- Declares a pool or changes one. Returns 'declared', 'changed' or
-- 'unchanged' (nothing recorded). A count of 0 deletes every machine of the
-- pool and needs p_confirm; a pool with machines or creations keeps its
-- plan, site and OS (declare a new pool and remove this one: the old one
-- drains as the new one fills), so no pool is ever half one thing and half
-- another. Mirrors events/views apply() for `pool_declared` and
-- `pool_changed`.
create function shepherd.set_pool(
    p_name text, p_plan text, p_site text, p_count integer, p_operating_system text,
    p_ssh_keys text[], p_reason text, p_by text default null, p_confirm boolean default false)
returns text
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
    v_site text := upper(trim(p_site));
    v_prefix text := coalesce((select value #>> '{}' from shepherd.cluster_settings
                               where key = 'device_prefix'), 'shepherd-');
    v_keys text[] := coalesce(p_ssh_keys, '{}');
    v_old shepherd.pools;
    v_other text;
    v_used record;
    v_type text;
    v_body jsonb;
begin
    perform shepherd.require(p_name is not null and p_name ~ '^[a-z0-9]([a-z0-9-]*[a-z0-9])?$',
        format('pool name %L: lowercase letters, digits and inner ''-'' only (it is part of every hostname)', p_name));
    perform shepherd.require(length(p_name) <= 20, format('pool name %L is longer than 20 characters', p_name));
    perform shepherd.require(nullif(trim(p_plan), '') is not null, 'a plan is required (e.g. c2-small-x86)');
    perform shepherd.require(nullif(v_site, '') is not null, 'a site is required (e.g. DAL)');
    perform shepherd.require(nullif(trim(p_operating_system), '') is not null, 'an OS is required (e.g. ubuntu_24_04_x64_lts)');
    perform shepherd.require(p_count is not null and p_count between 0 and 1000,
        format('count must be a whole number from 0 to 1000, not %s', coalesce(p_count::text, 'NULL')));
    perform shepherd.require(nullif(trim(p_reason), '') is not null,
        'a reason is required (it is recorded with the change)');
    perform shepherd.require(length(p_reason) <= 1000, 'a reason is at most 1000 characters');
    perform shepherd.require(length(v_prefix) + length(p_name) + 1 + length(greatest(p_count - 1, 1)::text) + 1 + 8 <= 32,
        format('pool %L: its hostnames would be longer than Latitude''s 32 characters; shorten the pool''s name or the prefix %L',
               p_name, v_prefix));
    perform pg_advisory_xact_lock(hashtextextended('pool/' || p_name, 0));
    perform pg_advisory_xact_lock(hashtextextended('operator/pools', 0));
    -- One pool's hostnames must not read as another's (`web` and `web-2`).
    select name into v_other from shepherd.pools
    where name <> p_name and (name like p_name || '-%' or p_name like name || '-%');
    perform shepherd.require(v_other is null,
        format('pools %L and %L: one name followed by ''-'' begins the other, so their hostnames could be mistaken; rename one',
               p_name, v_other));
    select * into v_old from shepherd.pools where name = p_name;
    if found and not v_old.removed
       and v_old.plan = trim(p_plan) and v_old.site = v_site and v_old.count = p_count
       and v_old.operating_system = trim(p_operating_system) and v_old.ssh_keys = v_keys then
        return 'unchanged';
    end if;
    perform shepherd.require(p_count > 0 or p_confirm,
        format('pool %L to 0: every machine of the pool is deleted; confirm it (--confirm-delete, p_confirm => true)', p_name));
    if found and (v_old.plan <> trim(p_plan) or v_old.site <> v_site
                  or v_old.operating_system <> trim(p_operating_system)) then
        select * into v_used from shepherd.pool_occupancy(p_name);
        perform shepherd.require(v_used.machines + v_used.creations = 0,
            format('pool %L has %s machines and %s creations in flight of %s in %s (%s): its plan, site and OS stay as they are while it has any; declare a new pool with the new ones and remove this one, which drains as the new one fills',
                   p_name, v_used.machines, v_used.creations, v_old.plan, v_old.site, v_old.operating_system));
    end if;
    v_type := case when found and not v_old.removed then 'pool_changed' else 'pool_declared' end;
    v_body := jsonb_build_object('name', p_name, 'plan', trim(p_plan), 'site', v_site, 'count', p_count,
        'operating_system', trim(p_operating_system), 'ssh_keys', to_jsonb(v_keys),
        'by', v_by, 'reason', p_reason);
    if v_type = 'pool_changed' then
        v_body := v_body || jsonb_build_object('confirmed', coalesce(p_confirm, false));
    end if;
    perform shepherd.append_event('pool/' || p_name, v_type, v_body);
    insert into shepherd.pools (name, plan, site, count, operating_system, ssh_keys, places_ever,
                                removed, updated_at, updated_by, reason)
    values (p_name, trim(p_plan), v_site, p_count, trim(p_operating_system), v_keys, p_count,
            false, now(), v_by, p_reason)
    on conflict (name) do update set plan = excluded.plan, site = excluded.site,
        count = excluded.count, operating_system = excluded.operating_system,
        ssh_keys = excluded.ssh_keys,
        places_ever = greatest(shepherd.pools.places_ever, excluded.places_ever),
        removed = false, updated_at = excluded.updated_at, updated_by = excluded.updated_by,
        reason = excluded.reason;
    return case v_type when 'pool_changed' then 'changed' else 'declared' end;
end;
$$;

-- Removes a pool: its machines are deleted as it drains, which needs
-- p_confirm. Returns false if there was no such pool (or it was removed
-- already). Mirrors events/views apply() for `pool_removed`.
create function shepherd.remove_pool(p_name text, p_reason text, p_by text default null,
                                     p_confirm boolean default false)
returns boolean
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
begin
    perform shepherd.require(p_name is not null, 'a pool name is required');
    perform shepherd.require(nullif(trim(p_reason), '') is not null,
        'a reason is required (it is recorded with the removal)');
    perform shepherd.require(length(p_reason) <= 1000, 'a reason is at most 1000 characters');
    perform pg_advisory_xact_lock(hashtextextended('pool/' || p_name, 0));
    if not exists (select 1 from shepherd.pools where name = p_name and not removed) then
        return false;
    end if;
    perform shepherd.require(coalesce(p_confirm, false),
        format('removing pool %L deletes every machine of it; confirm it (--confirm-delete, p_confirm => true)', p_name));
    perform shepherd.append_event('pool/' || p_name, 'pool_removed',
        jsonb_build_object('name', p_name, 'by', v_by, 'reason', p_reason, 'confirmed', true));
    update shepherd.pools set removed = true, count = 0, updated_at = now(),
        updated_by = v_by, reason = p_reason
    where name = p_name;
    return true;
end;
$$;
