-- The API pace becomes a budget (a token bucket, INTERVAL,BURST) that a
-- provider's 429 can hold for the whole cluster (src/limiter.rs).

-- A hold: no slot of this limiter starts before held_until. `holds` counts
-- them, for operators asking how often the provider pushed back.
alter table shepherd.limiters
    add column held_until timestamptz,
    add column holds bigint not null default 0;

-- api_rate takes INTERVAL,BURST (a bare interval still means a burst of 1).
create or replace function shepherd.change_setting(p_key text, p_value text, p_reason text, p_by text default null)
returns void
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
    v_value jsonb;
    -- A duration as parse_duration reads it: 90s, 1m30s, 1h 15m, or a bare number.
    -- Durations and bursts within what the workers can use (parse_duration
    -- refuses more than a year; a burst is a 32-bit count).
    v_year constant float8 := 365 * 86400;
begin
    perform shepherd.require(p_key is not null, 'a setting name is required');
    perform shepherd.require(p_value is not null, 'a value is required');
    perform shepherd.require(nullif(trim(p_reason), '') is not null,
        'a reason is required (it is recorded with the change)');
    case p_key
    when 'max_machines', 'chunk_size' then
        perform shepherd.require(p_value ~ '^[0-9]{1,15}$',
            format('%s must be a whole number of 0 or more, not %L', p_key, p_value));
        perform shepherd.require(p_key <> 'chunk_size' or p_value::bigint > 0,
            'chunk_size must be at least 1');
        v_value := to_jsonb(p_value::bigint);
    when 'assimilate' then
        perform shepherd.require(p_value in ('true', 'false'),
            format('assimilate is true or false, not %L', p_value));
        v_value := to_jsonb(p_value::boolean);
    when 'penalty_factor' then
        perform shepherd.require(p_value ~ '^[0-9]{1,6}(\.[0-9]+)?$' and p_value::float8 >= 1,
            format('penalty_factor must be a number of 1 or more, not %L', p_value));
        v_value := to_jsonb(p_value::float8);
    when 'penalty', 'penalty_max' then
        perform shepherd.require(shepherd.duration_seconds(p_value) <= v_year,
            format('%s is a duration of at most a year such as 500ms, 5s, 1m30s or 1h, not %L', p_key, p_value));
        v_value := to_jsonb(p_value);
    when 'device_creation_rate', 'api_rate' then
        -- api_rate also takes a bare interval (a burst of 1), as it was
        -- written before it became a budget.
        perform shepherd.require(
            shepherd.duration_seconds(split_part(p_value, ',', 1)) <= v_year
            and ((split_part(p_value, ',', 2) ~ '^[1-9][0-9]{0,5}$' and p_value ~ '^[^,]+,[^,]+$')
                 or (p_key = 'api_rate' and p_value !~ ',')),
            format('%s is INTERVAL,BURST such as %s (at most a year, a burst of at most 999999), not %L',
                   p_key, case p_key when 'api_rate' then '2s,20' else '5s,1' end, p_value));
        v_value := to_jsonb(p_value);
    else
        raise exception 'unknown setting %; the settings are max_machines, chunk_size, assimilate, device_creation_rate, api_rate, penalty, penalty_factor, penalty_max', p_key
            using errcode = 'invalid_parameter_value';
    end case;
    perform pg_advisory_xact_lock(hashtextextended('operator/settings', 0));
    perform shepherd.require(exists (select 1 from shepherd.cluster_settings),
        'the cluster has no settings yet: start a worker once (its flags become the first settings)');
    perform shepherd.append_event('operator/settings', 'settings_changed',
        jsonb_build_object('by', v_by, 'reason', p_reason,
                           'settings', jsonb_build_object(p_key, v_value)));
    insert into shepherd.cluster_settings (key, value, updated_at)
    values (p_key, v_value, now())
    on conflict (key) do update set value = excluded.value, updated_at = excluded.updated_at;
end;
$$;

-- A cluster that recorded the old default (a 2 s metronome, from the flags
-- of its first worker, never changed by an operator) moves to the new
-- default budget; one an operator set keeps its value.
do $$
begin
    if (select value from shepherd.cluster_settings where key = 'api_rate') = to_jsonb('2s'::text)
       and not exists (
           select 1 from shepherd.events
           where event_type = 'settings_changed'
             and body -> 'settings' ? 'api_rate'
             and body ->> 'reason' not in (
                 'the cluster''s first settings, from the flags of the first process to start',
                 'settings this release adds, from the flags of the first process to know them'))
    then
        perform shepherd.change_setting('api_rate', '2s,20',
            'the API pace became a budget: the old default 2s (one call every 2 s) is now 2s,20 (bursts of 20, 10 calls/s sustained)',
            'migration 20261203000002');
    end if;
end;
$$;
