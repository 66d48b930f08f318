-- A witness can be the first 8 hex digits of a creation's request (a
-- Latitude.sh hostname has no room for the whole): a pass looks such
-- witnesses up by that prefix (a UUID's first group is those 8 digits).
create index events_creation_request_prefix_idx
    on shepherd.events ((left(body->>'request', 8)))
    where event_type = 'creation_requested';

-- The views find a machine by its provider's id whichever the provider (a
-- cluster runs one; Metal's UUIDs and Latitude's `sv_...` cannot meet).
create index managed_machines_provider_id_idx on shepherd.managed_machines (provider_id);
