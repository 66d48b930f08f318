-- Until this release, an event that changed a machine's row after it was
-- first seen ready (an operator protecting it, a second pass seeing it
-- ready) wrote the row back without its readiness: the live path did not
-- load `ready_at`. Such a machine read as never ready, and could be
-- replaced as "not ready" once its creation was older than the deadline.
-- The log kept every `machine_ready`: each machine gets back the time of
-- its first one, which is what a rebuild of the views gives (a later
-- readiness written over the first is put back too).
update shepherd.managed_machines m
   set ready_at = r.first_ready
  from (select (body ->> 'machine_id')::uuid as machine_id,
               body ->> 'provider_id' as provider_id,
               min(recorded_at) as first_ready
          from shepherd.events
         where event_type = 'machine_ready'
         group by 1, 2) r
 where (m.ready_at is null or m.ready_at > r.first_ready)
   and m.machine_id = r.machine_id
   and m.provider_id = r.provider_id;
