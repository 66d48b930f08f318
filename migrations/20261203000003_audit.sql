-- A manual assimilation requested in SQL is recorded with who asked, as
-- `shepherd enqueue assimilate` records it (event `assimilation_requested`).
create or replace function shepherd.enqueue_assimilate(p_device uuid) returns text
language plpgsql as $$
begin
    perform shepherd.require(p_device is not null, 'a device id is required');
    perform shepherd.append_event('device/' || p_device, 'assimilation_requested',
        jsonb_build_object('device', p_device, 'requested_by', 'sql:' || current_user));
    return shepherd.push_job('assimilate', jsonb_build_object('device', p_device, 'manual', true));
end;
$$;

-- The console's job page lists the events a job recorded.
create index events_job_idx on shepherd.events (job_id) where job_id is not null;
