-- The console's sessions: a browser that logged in holds a random id in a
-- cookie, never the operator credential; the id is kept here only as its
-- SHA-256, so that reading this table gives nobody a session. Any worker's
-- page accepts a session another worker started, and logging out (or the
-- expiry) ends it for all of them.
create table shepherd.console_sessions (
    id_hash    text primary key,
    who        text not null check (length(who) between 1 and 64),
    created_at timestamptz not null default now(),
    expires_at timestamptz not null,
    ended_at   timestamptz
);

-- Failed log-ins, for throttling across every worker and for the record.
create table shepherd.console_login_failures (
    at   timestamptz not null default now(),
    who  text not null
);
create index console_login_failures_at_idx on shepherd.console_login_failures (at);
