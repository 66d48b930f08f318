-- Which database the log is in: the cluster's system identifier, the WAL
-- timeline being written and the database's oid, as the last worker to
-- check found them. A restore from a dump (a new database or cluster), a
-- point-in-time recovery or a failover to a standby (a new timeline) brings
-- back a row that no longer matches the database it is in: the log went
-- back in time while the provider did not. The next check records
-- `database_moved` and the row is brought up to date; creations requested
-- before the move look before they send again (issue 46).
create table if not exists shepherd.database_identity (
    one          boolean primary key default true check (one),
    identity     text not null check (length(identity) <= 200),
    recorded_at  timestamptz not null default now()
);

-- The identity of the database this session is in, as the row keeps it:
-- `system/timeline/oid`. The timeline is that of the WAL being written
-- (its segment's name begins with it), which a promotion changes at once.
create or replace function shepherd.database_identity_now() returns text
language sql stable
set search_path = pg_catalog, shepherd, pg_temp
as $$
    select (select system_identifier::text from pg_control_system())
        || '/' || ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int
        || '/' || (select oid from pg_database where datname = current_database())
$$;
revoke execute on function shepherd.database_identity_now() from public;

-- A cluster upgraded without running deploy/roles.sql again must still
-- create: a creation's first statement and every pass read this identity.
do $$
begin
    if exists (select from pg_catalog.pg_roles where rolname = 'shepherd_worker') then
        grant execute on function shepherd.database_identity_now() to shepherd_worker;
        grant select, insert, update, delete on shepherd.database_identity to shepherd_worker;
    end if;
    if exists (select from pg_catalog.pg_roles where rolname = 'shepherd_reader') then
        grant select on shepherd.database_identity to shepherd_reader;
    end if;
end;
$$;
