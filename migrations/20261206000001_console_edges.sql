-- The console's edges. Every check of the operator credential (a log-in
-- form or a script's bearer credential) that fails is recorded with where
-- it came from, so that a source that keeps guessing is refused on its own
-- while operators elsewhere still log in.
alter table shepherd.console_login_failures
    add column source text not null default 'unknown'
        check (length(source) between 1 and 64),
    add column door text not null default 'log-in'
        check (door in ('log-in', 'bearer'));
create index console_login_failures_source_idx
    on shepherd.console_login_failures (source, at);

-- A session belongs to the credential it logged in with (a fingerprint,
-- never the credential): rotating the credential ends every session made
-- with the old one. Sessions from before this column have none, and end.
alter table shepherd.console_sessions
    add column credential text check (length(credential) = 16);
