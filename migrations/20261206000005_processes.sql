-- Each worker process as it started: its host, its pid, the release it
-- runs and when it started. The queue's own table (apalis.workers) keeps
-- one row per queue worker with its heartbeat; this says what the process
-- is, so that the console and `shepherd status` list processes rather than
-- queues. Written once at start, by the process itself; not a record of
-- what happened (the log is), so a row whose process has been silent a day
-- goes when the next process starts.
create table shepherd.processes (
    -- host:pid, as the queue workers' names carry it (`kind@host:pid#n`).
    name       text primary key check (length(name) <= 300),
    host       text not null check (length(host) <= 255),
    pid        integer not null,
    version    text not null check (length(version) <= 100),
    started_at timestamptz not null default now()
);
