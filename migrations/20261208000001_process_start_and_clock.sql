-- A process's name now carries a random id drawn at its start
-- (`host:pid:start`), so two processes that share a host and a pid (two
-- pid-1 containers on host networking, a host without /etc/hostname, a
-- restart that reuses the pid) are never one name. And each process says
-- how far its clock is off the database's, measured at start: the
-- cluster's windows are timed by the database's clock, but the queue's
-- heartbeats carry the worker's own, so a worker whose clock is off looks
-- dead early or late. `shepherd status` shows the offset.
alter table shepherd.processes
    add column if not exists clock_offset_ms bigint;
comment on column shepherd.processes.name is 'host:pid:start, as the queue workers'' names carry it (kind@host:pid:start#n)';
