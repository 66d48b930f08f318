-- Leases: who may act on a unit (a place, a reservation) or run the pass,
-- held in a row rather than in a session. An advisory lock lives in its
-- connection, so it held a connection for as long as the work it guarded,
-- provider calls included, and could not pass through PgBouncer in
-- transaction mode. A lease holds nothing between statements: its holder
-- renews it while it works, and anyone may take it once it has expired
-- (the holder crashed, or lost the database for longer than its term).
--
-- `lease` is the holder's own random id: every check a holder makes
-- before acting (the fence of a provider write) and the release compare
-- it, so a holder whose lease expired and was taken by another finds out
-- at its next check instead of acting beside the new holder. It is random,
-- not from a sequence, so that no crash of the server can hand the same
-- id out twice.
create table shepherd.leases (
    key        text primary key check (length(key) <= 200),
    lease      uuid not null,
    -- host:pid of the process, for an operator reading the table.
    holder     text not null check (length(holder) <= 300),
    taken_at   timestamptz not null default now(),
    expires_at timestamptz not null
);

comment on table shepherd.leases is
    'who acts on a unit or runs the pass now; expired rows are free to take';
