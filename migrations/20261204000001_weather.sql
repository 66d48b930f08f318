-- A living provider's weather: settings every process must agree on (the
-- settle window of unknown creations, the rescue window and the API attempt
-- it must outlast, the Latitude.sh key's budgets) become the cluster's, and
-- change_setting() checks them together.

create or replace function shepherd.change_setting(p_key text, p_value text, p_reason text, p_by text default null)
returns void
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
    v_value jsonb;
    -- Durations and counts within what the workers can use (parse_duration
    -- refuses more than a year; counts are 32-bit).
    v_year constant float8 := 365 * 86400;
    v_heartbeat float8;
    v_missed float8;
    v_timeout float8;
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
    when 'missed_heartbeats', 'latitude_reads_per_minute', 'latitude_writes_per_minute' then
        perform shepherd.require(p_value ~ '^[0-9]{1,9}$' and p_value::bigint >= 1,
            format('%s must be a whole number of 1 or more, not %L', p_key, p_value));
        v_value := to_jsonb(p_value::bigint);
    when 'assimilate' then
        perform shepherd.require(p_value in ('true', 'false'),
            format('assimilate is true or false, not %L', p_value));
        v_value := to_jsonb(p_value::boolean);
    when 'penalty_factor' then
        perform shepherd.require(p_value ~ '^[0-9]{1,6}(\.[0-9]+)?$' and p_value::float8 >= 1,
            format('penalty_factor must be a number of 1 or more, not %L', p_value));
        v_value := to_jsonb(p_value::float8);
    when 'penalty', 'penalty_max', 'settle_window' then
        perform shepherd.require(shepherd.duration_seconds(p_value) <= v_year,
            format('%s is a duration of at most a year such as 500ms, 5s, 1m30s or 1h, not %L', p_key, p_value));
        v_value := to_jsonb(p_value);
    when 'heartbeat', 'api_timeout' then
        perform shepherd.require(shepherd.duration_seconds(p_value) <= v_year
                                 and shepherd.duration_seconds(p_value) > 0,
            format('%s is a duration of more than 0s and at most a year such as 5s or 30s, not %L', p_key, p_value));
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
        raise exception 'unknown setting %; the settings are max_machines, chunk_size, assimilate, device_creation_rate, api_rate, penalty, penalty_factor, penalty_max, settle_window, heartbeat, missed_heartbeats, api_timeout, latitude_reads_per_minute, latitude_writes_per_minute', p_key
            using errcode = 'invalid_parameter_value';
    end case;
    perform pg_advisory_xact_lock(hashtextextended('operator/settings', 0));
    perform shepherd.require(exists (select 1 from shepherd.cluster_settings),
        'the cluster has no settings yet: start a worker once (its flags become the first settings)');
    -- A second run of a creation starts once its worker missed its
    -- heartbeats; one API attempt plus a heartbeat must end before that,
    -- where the provider does not itself refuse a second machine on a unit
    -- (Metal's reservations do).
    if p_key in ('heartbeat', 'missed_heartbeats', 'api_timeout')
       and (select value #>> '{}' from shepherd.cluster_settings where key = 'provider') = 'latitude' then
        select coalesce(shepherd.duration_seconds(case when p_key = 'heartbeat' then p_value
                            else (select value #>> '{}' from shepherd.cluster_settings where key = 'heartbeat') end), 5),
               coalesce(case when p_key = 'missed_heartbeats' then p_value::float8
                            else (select (value #>> '{}')::float8 from shepherd.cluster_settings where key = 'missed_heartbeats') end, 12),
               coalesce(shepherd.duration_seconds(case when p_key = 'api_timeout' then p_value
                            else (select value #>> '{}' from shepherd.cluster_settings where key = 'api_timeout') end), 30)
          into v_heartbeat, v_missed, v_timeout;
        perform shepherd.require(v_timeout + v_heartbeat < v_heartbeat * v_missed,
            format('api_timeout (%ss) plus one heartbeat (%ss) must be shorter than the rescue window, heartbeat × missed_heartbeats (%ss): otherwise a create still on the wire could meet a second run of its creation',
                   v_timeout, v_heartbeat, v_heartbeat * v_missed));
    end if;
    perform shepherd.append_event('operator/settings', 'settings_changed',
        jsonb_build_object('by', v_by, 'reason', p_reason,
                           'settings', jsonb_build_object(p_key, v_value)));
    insert into shepherd.cluster_settings (key, value, updated_at)
    values (p_key, v_value, now())
    on conflict (key) do update set value = excluded.value, updated_at = excluded.updated_at;
end;
$$;
