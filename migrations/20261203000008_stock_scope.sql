-- A penalty for want of stock names the stock the place draws on (at
-- Latitude.sh, a plan at a site): while it holds, a pass takes none of the
-- places that draw on it. Null for every other penalty.
alter table shepherd.sinbin add column scope text;

create index sinbin_scope_idx on shepherd.sinbin (scope) where scope is not null;

-- The sinbin with time left, now with the scope a penalty covers.
create or replace view shepherd.sinbin_now as
select reservation_id, until, cause, failures,
       now() <= until as penalised,
       greatest(until - now(), interval '0') as time_left,
       scope
from shepherd.sinbin
order by until desc;
