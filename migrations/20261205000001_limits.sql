-- What an operator writes into the permanent log has a length limit,
-- whatever the door (CLI, console, SQL functions, the library): events
-- cannot be deleted, so a 100,000-character reason would weigh on every
-- page and every query that shows it, for ever. Checked on the table, so
-- no path can miss it; events an operator's action records are the ones
-- that name who acted (`by`).
create function shepherd.limit_operator_text() returns trigger
language plpgsql as $$
begin
    if new.body ? 'by' then
        perform shepherd.require(coalesce(length(new.body->>'reason'), 0) <= 1000,
            format('a reason is at most 1000 characters (this one has %s)',
                   length(new.body->>'reason')));
        perform shepherd.require(length(new.body->>'by') <= 200,
            format('who acted is at most 200 characters (this has %s)',
                   length(new.body->>'by')));
    end if;
    return new;
end;
$$;

create trigger events_operator_text_limited
    before insert on shepherd.events
    for each row execute function shepherd.limit_operator_text();
