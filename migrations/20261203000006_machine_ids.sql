-- A machine is named by its provider's id, as text: a Metal device's UUID,
-- a Latitude.sh server's `sv_...`. Event bodies already store ids as JSON
-- strings, so the log needs nothing; the view of devices awaiting
-- assimilation and the functions that take a device change type. The uuid
-- versions stay, for callers that pass a uuid, and call the text ones.

drop view shepherd.in_flight;
alter table shepherd.unassimilated_devices
    alter column device_id type text using device_id::text;
create view shepherd.in_flight as
select 'creation'::text as kind, reservation_id, null::text as device_id, request,
       enqueued_at as since, unresolved_since, last_error
from shepherd.pending_creations
union all
select 'assimilation', reservation_id, device_id, null, created_at, null, null
from shepherd.unassimilated_devices;

create function shepherd.device_history(p_device text)
returns table (event_position bigint, recorded_at timestamptz, event_type text,
               schema_version integer, body jsonb, job_id text)
language sql stable as $$
    select position, recorded_at, event_type, schema_version, body, job_id
    from shepherd.events
    where stream = 'device/' || p_device
       or (event_type = 'device_created' and body->>'device' = p_device)
    order by position
$$;

create or replace function shepherd.device_history(p_device uuid)
returns table (event_position bigint, recorded_at timestamptz, event_type text,
               schema_version integer, body jsonb, job_id text)
language sql stable as $$
    select * from shepherd.device_history(p_device::text)
$$;

create function shepherd.enqueue_assimilate(p_device text) returns text
language plpgsql as $$
begin
    perform shepherd.require(nullif(trim(p_device), '') is not null, 'a device id is required');
    perform shepherd.append_event('device/' || p_device, 'assimilation_requested',
        jsonb_build_object('device', p_device, 'requested_by', 'sql:' || current_user));
    return shepherd.push_job('assimilate', jsonb_build_object('device', p_device, 'manual', true));
end;
$$;

create or replace function shepherd.enqueue_assimilate(p_device uuid) returns text
language sql as $$
    select shepherd.enqueue_assimilate(p_device::text)
$$;
