-- Machines managed before readiness was recorded (20261205000006) have no
-- `machine_ready`, and would read as never ready: one we created long ago
-- that is reinstalling (deploying again) at the first pass after the
-- upgrade would be replaced as "not ready" on its old creation date. They
-- are taken as ready once, recorded as such (the status says why), so the
-- views still equal the log.
do $$
declare
    m record;
begin
    for m in
        select machine_id, provider_id from shepherd.managed_machines where ready_at is null
    loop
        perform shepherd.append_event('device/' || m.provider_id, 'machine_ready',
            pg_catalog.jsonb_build_object('machine_id', m.machine_id, 'provider_id', m.provider_id,
                'status', 'managed before readiness was recorded'));
        -- now() is the transaction's start, which is the event's recorded_at.
        update shepherd.managed_machines set ready_at = now() where machine_id = m.machine_id;
    end loop;
end;
$$;

-- The leave's deadline counts from when the machine was first asked to
-- leave (`leave_asked`), not from the request: a deletion that waited out
-- a pause for deletions still gives its hook the whole timeout.
alter table shepherd.pending_deletions add column asked_at timestamptz;
