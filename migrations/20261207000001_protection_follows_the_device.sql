-- Protection follows the device, not one managed life of it (issue 45): a
-- machine lost or released and adopted again gets a new machine_id, and
-- its protection, recorded on the device's stream, still holds. What a
-- device's protection is now: the view's flag, or the latest
-- machine_protected / machine_unprotected on its stream, whichever machine
-- id recorded it. Protecting or unprotecting compares with that, so an
-- operator can lift a protection carried over from an earlier life.
create or replace function shepherd.protect_machine(p_id text, p_reason text, p_by text default null,
                                                    p_protected boolean default true)
returns boolean
language plpgsql security definer
set search_path = pg_catalog, shepherd, pg_temp
as $$
declare
    v_by text := coalesce(p_by, 'sql:' || session_user);
    m shepherd.managed_machines;
    v_now boolean;
begin
    perform shepherd.require(nullif(trim(p_reason), '') is not null,
        'a reason is required (it is recorded with the change)');
    perform shepherd.require(length(p_reason) <= 1000, 'a reason is at most 1000 characters');
    m := shepherd.managed_machine(p_id);
    v_now := m.protected or coalesce(
        (select e.event_type = 'machine_protected' from shepherd.events e
         where e.stream = 'device/' || m.provider_id
           and e.event_type in ('machine_protected', 'machine_unprotected')
         order by e.position desc limit 1), false);
    if v_now = p_protected then
        return false;
    end if;
    perform shepherd.append_event('device/' || m.provider_id,
        case when p_protected then 'machine_protected' else 'machine_unprotected' end,
        jsonb_build_object('machine_id', m.machine_id, 'provider_id', m.provider_id,
                           'by', v_by, 'reason', p_reason));
    update shepherd.managed_machines set protected = p_protected where machine_id = m.machine_id;
    return true;
end;
$$;
