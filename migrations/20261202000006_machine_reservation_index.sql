-- Appends that touch a reservation look its machine up by reservation_id
-- (views.rs, load). Without an index that is a scan of every managed machine
-- per append: measured in scenario 2 of BENCHMARKS.md as throughput falling
-- from ~120 to ~70 jobs/s over a 10,000-machine run.
create index managed_machines_reservation_idx
    on shepherd.managed_machines (reservation_id);
