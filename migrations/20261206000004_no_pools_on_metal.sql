-- Pools are a Latitude.sh cluster's; a cluster that provisions Equinix
-- Metal hardware reservations keeps its machines on those and has none. A
-- pool declared there would never be provisioned, and would only mislead:
-- refused at the log, whatever the door (the CLI, the console, SQL).
create function shepherd.refuse_pools_on_metal() returns trigger
language plpgsql
set search_path = pg_catalog, shepherd, pg_temp
as $$
begin
    if new.event_type = 'pool_declared'
       and (select value #>> '{}' from shepherd.cluster_settings where key = 'provider') = 'metal' then
        raise exception 'this cluster provisions Equinix Metal hardware reservations, which have no pools: pools are a Latitude.sh cluster''s (shepherd worker --provider latitude)'
            using errcode = 'invalid_parameter_value';
    end if;
    return new;
end;
$$;
revoke execute on function shepherd.refuse_pools_on_metal() from public;
create trigger events_no_pools_on_metal before insert on shepherd.events
    for each row execute function shepherd.refuse_pools_on_metal();
