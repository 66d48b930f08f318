-- The console's job page lists the retries and cancels of a job, which
-- operators record (no job's run does, so `job_id` stays empty).
create index events_job_action_idx on shepherd.events ((body->>'job'))
    where event_type in ('job_retried', 'job_cancelled');

-- The console's charts count creation outcomes by time.
create index events_type_time_idx on shepherd.events (event_type, recorded_at);
