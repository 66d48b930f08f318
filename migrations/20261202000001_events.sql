-- The event log: shepherd's only source of truth. Append-only, enforced here
-- and not only in the code.
create schema if not exists shepherd;

create table shepherd.events (
    -- Global order of insertion. Not the order of commit: followers read by
    -- (tx_id, position) below the snapshot's xmin instead (see events/store.rs).
    position      bigint generated always as identity primary key,
    -- Chosen by the writer, so an append retried after an ambiguous failure
    -- is stored once.
    event_id      uuid not null unique,
    stream        text not null check (stream ~ '^[a-z_]+/.+$'),
    event_type    text not null,
    schema_version integer not null check (schema_version > 0),
    body          jsonb not null,
    job_id        text,
    recorded_at   timestamptz not null default now(),
    tx_id         xid8 not null default pg_current_xact_id()
);

create index events_stream_idx on shepherd.events (stream, position);
create index events_feed_idx on shepherd.events (tx_id, position);
create index events_type_idx on shepherd.events (event_type, position);

create function shepherd.refuse_event_change() returns trigger
language plpgsql as $$
begin
    raise exception 'shepherd.events is append-only: % refused', tg_op
        using errcode = 'insufficient_privilege';
end;
$$;

create trigger events_append_only
    before update or delete on shepherd.events
    for each row execute function shepherd.refuse_event_change();

create trigger events_no_truncate
    before truncate on shepherd.events
    for each statement execute function shepherd.refuse_event_change();

-- The views, kept in the same transaction as the events that change them and
-- rebuildable from the log alone (events/views.rs holds the one apply()).

-- Machines shepherd manages: the seed's BMDB "provided" rows.
create table shepherd.managed_machines (
    machine_id     uuid primary key,
    provider       text not null,
    provider_id    text not null,
    reservation_id uuid,
    hostname       text,
    assimilated_at timestamptz not null,
    unique (provider, provider_id)
);

-- Penalised reservations. A row whose deadline passed is kept: its failure
-- count feeds the growing penalty. Penalised means now() <= until.
create table shepherd.sinbin (
    reservation_id uuid primary key,
    until          timestamptz not null,
    cause          text not null,
    failures       integer not null check (failures >= 0)
);

-- Reservations with a creation enqueued and not yet finished.
create table shepherd.pending_creations (
    reservation_id uuid primary key,
    job_id         text,
    enqueued_at    timestamptz not null
);

-- Devices created but not yet assimilated.
create table shepherd.unassimilated_devices (
    device_id      uuid primary key,
    reservation_id uuid,
    hostname       text,
    created_at     timestamptz not null
);
