-- Window limiters (src/limiter.rs `WindowLimiter`): at most N call starts
-- in any window, cluster-wide, for providers that count calls per minute
-- (Latitude.sh: 60 reads and 20 writes per key). The row keeps the last
-- N-1 slots handed out, as Unix times.
alter table shepherd.limiters
    alter column next_at set default clock_timestamp(),
    add column starts float8[] not null default '{}';

-- The next slot: no earlier than now, than the last slot (slots never go
-- back), than the end of a hold, or than one window after the slot N-1
-- places back, so that any window holds at most N slots. Taken under the
-- row's lock, so concurrent callers get distinct slots.
create function shepherd.take_window_slot(p_name text, p_calls int, p_window float8)
returns float8
language plpgsql as $$
declare
    v_starts float8[];
    v_held timestamptz;
    v_n int;
    v_slot float8;
begin
    insert into shepherd.limiters (name) values (p_name) on conflict (name) do nothing;
    select starts, held_until into v_starts, v_held
        from shepherd.limiters where name = p_name for update;
    v_n := cardinality(v_starts);
    v_slot := greatest(
        extract(epoch from clock_timestamp())::float8,
        v_starts[v_n],
        case when v_n >= p_calls then v_starts[v_n - p_calls + 1] + p_window end,
        extract(epoch from v_held)::float8);
    update shepherd.limiters
        set starts = v_starts[greatest(v_n - p_calls + 2, 1):v_n] || v_slot
        where name = p_name;
    return v_slot;
end;
$$;
