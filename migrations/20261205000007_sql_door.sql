-- The SQL door, hardened as a well-kept extension is. Every function of
-- shepherd's runs with a search_path of its own: pg_catalog first, then
-- shepherd, then pg_temp last, so that nothing a role created in a schema
-- on the caller's path (public.hashtextextended(text, integer) would win
-- over the built-in for an integer argument) runs in its place. A function
-- added or replaced later must say the same (`set search_path = pg_catalog,
-- shepherd, pg_temp`); a test fails on one that does not.
do $$
declare
    f regprocedure;
begin
    for f in
        select p.oid::regprocedure
        from pg_catalog.pg_proc p
        join pg_catalog.pg_namespace n on n.oid = p.pronamespace
        where n.nspname = 'shepherd'
    loop
        execute pg_catalog.format(
            'alter routine %s set search_path = pg_catalog, shepherd, pg_temp', f);
    end loop;
end;
$$;

-- Nobody runs shepherd's functions by default: deploy/roles.sql grants
-- them to the roles that need them.
revoke execute on all functions in schema shepherd from public;
alter default privileges in schema shepherd revoke execute on functions from public;
