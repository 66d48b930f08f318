-- Each machine's time as ours, from the log: from when shepherd first
-- recorded it (its creation seen, or its adoption) to when it recorded it
-- gone (deleted, lost or released), or still running. The pool is the one
-- whose hostnames it carries. What `shepherd cost` folds into machine-hours
-- and cost per pool and day (docs/cost.md, docs/sql.md). One span per
-- device: a machine released and adopted again later counts from its first
-- start to its first end.
create view shepherd.machine_hours as
with began as (
    -- A creation is recorded on its unit's stream; the machine's own
    -- stream is its device's.
    select case when event_type = 'device_created' then 'device/' || (body->>'device')
                else stream end as stream,
           min(recorded_at) as started_at,
           min(body->>'hostname') as hostname
    from shepherd.events
    where event_type in ('device_created', 'adoption_requested', 'machine_assimilated')
    group by 1
), ended as (
    select stream, min(recorded_at) as ended_at
    from shepherd.events
    where event_type in ('machine_deleted', 'machine_lost', 'machine_released')
    group by stream
), prefix as (
    select coalesce((select value #>> '{}' from shepherd.cluster_settings
                     where key = 'device_prefix'), 'shepherd-') as prefix
)
select pg_catalog.substr(b.stream, 8) as provider_id,
       b.hostname,
       (select p.name from shepherd.pools p, prefix
        where b.hostname like prefix.prefix || p.name || '-%'
        order by pg_catalog.length(p.name) desc limit 1) as pool,
       b.started_at,
       e.ended_at,
       extract(epoch from coalesce(e.ended_at, pg_catalog.now()) - b.started_at) / 3600.0 as hours
from began b
left join ended e on e.stream = b.stream and e.ended_at >= b.started_at
where b.stream like 'device/%';
