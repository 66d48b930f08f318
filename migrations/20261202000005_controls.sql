-- Operator controls: pausing creations and lifting penalties. Each is an
-- event plus its view change in one transaction, as the Rust path does;
-- these SQL functions mirror events/views.rs apply() for these three event
-- types, and the rebuild check (shepherd views rebuild) proves they agree.

-- One row while creations are paused.
create table shepherd.controls (
    name   text primary key check (name = 'creations'),
    paused boolean not null,
    by     text not null,
    reason text not null,
    since  timestamptz not null
);

create function shepherd.append_event(p_stream text, p_type text, p_body jsonb)
returns bigint
language plpgsql as $$
declare
    v_position bigint;
begin
    insert into shepherd.events (event_id, stream, event_type, schema_version, body)
    values (gen_random_uuid(), p_stream, p_type, 1, p_body)
    returning position into v_position;
    return v_position;
end;
$$;

create function shepherd.pause_creations(p_reason text, p_by text default null)
returns void
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
begin
    perform pg_advisory_xact_lock(hashtextextended('operator/controls', 0));
    perform shepherd.append_event('operator/controls', 'creations_paused',
        jsonb_build_object('by', v_by, 'reason', p_reason));
    -- now() is the transaction's start, which is the event's recorded_at.
    insert into shepherd.controls (name, paused, by, reason, since)
    values ('creations', true, v_by, p_reason, now())
    on conflict (name) do update set paused = true, by = excluded.by,
        reason = excluded.reason, since = excluded.since;
end;
$$;

create function shepherd.resume_creations(p_reason text default '', p_by text default null)
returns void
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
begin
    perform pg_advisory_xact_lock(hashtextextended('operator/controls', 0));
    perform shepherd.append_event('operator/controls', 'creations_resumed',
        jsonb_build_object('by', v_by, 'reason', p_reason));
    delete from shepherd.controls where name = 'creations';
end;
$$;

-- Lifts one reservation's penalty; false when it had none.
create function shepherd.clear_penalty(p_reservation uuid, p_reason text, p_by text default null)
returns boolean
language plpgsql as $$
declare
    v_by text := coalesce(p_by, 'sql:' || current_user);
begin
    perform pg_advisory_xact_lock(hashtextextended('reservation/' || p_reservation, 0));
    if not exists (select 1 from shepherd.sinbin where reservation_id = p_reservation) then
        return false;
    end if;
    perform shepherd.append_event('reservation/' || p_reservation, 'penalty_cleared',
        jsonb_build_object('reservation', p_reservation, 'by', v_by, 'reason', p_reason));
    delete from shepherd.sinbin where reservation_id = p_reservation;
    return true;
end;
$$;

-- Lifts every active penalty; returns how many.
create function shepherd.clear_all_penalties(p_reason text, p_by text default null)
returns integer
language plpgsql as $$
declare
    v_count integer := 0;
    v_reservation uuid;
begin
    for v_reservation in
        select reservation_id from shepherd.sinbin where now() <= until order by reservation_id
    loop
        if shepherd.clear_penalty(v_reservation, p_reason, p_by) then
            v_count := v_count + 1;
        end if;
    end loop;
    return v_count;
end;
$$;
