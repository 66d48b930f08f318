-- What the last pass that listed a machine of ours saw of it: the
-- provider's own word for its state (Metal `active`, Latitude `on`,
-- `deploying`, `failed_deployment`, ...), shown beside each machine. A
-- cache of the latest sighting for the pages, not a record: what happened
-- is in the event log.
create table shepherd.machine_status (
    provider_id text primary key,
    status      text,
    seen_at     timestamptz not null
);
