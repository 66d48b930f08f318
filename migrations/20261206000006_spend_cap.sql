-- The spend cap: an operator's setting (`spend_cap`: an amount per hour in
-- the currency the provider prices in, or `none`) that admission obeys on
-- every path (src/jobs/spend.rs). change_setting() learns the key here: its
-- body is taken as it stands and the new case put before the settings fixed
-- at a cluster's start, as 20261206000002 rewrote these functions.
do $$
declare
    f regprocedure := 'shepherd.change_setting(text, text, text, text)'::regprocedure;
    def text := pg_catalog.pg_get_functiondef(f);
    anchor constant text := E'    when ''provider'', ''project'', ''device_prefix'' then';
    known constant text := 'leave_hook, leave_timeout, leave_deadline, failed_skip_leave';
begin
    if pg_catalog.strpos(def, anchor) = 0 or pg_catalog.strpos(def, known) = 0 then
        raise exception 'change_setting() is not as this migration expects; it was not changed';
    end if;
    def := pg_catalog.replace(def, anchor, E'    when ''spend_cap'' then\n'
        || E'        perform shepherd.require(p_value = ''none'' or (p_value ~ ''^[0-9]{1,9}(\\.[0-9]{1,6})?$'' and p_value::numeric > 0),\n'
        || E'            format(''spend_cap is an amount per hour above 0, in the currency the provider prices in (such as 12.50), or none, not %L'', p_value));\n'
        || E'        perform shepherd.require(p_value = ''none'' or coalesce((select value #>> ''{}'' from shepherd.cluster_settings where key = ''provider''), '''') <> ''metal'',\n'
        || E'            ''this cluster provisions Equinix Metal hardware reservations, paid for already: a spend cap is a Latitude.sh cluster''''s'');\n'
        || E'        v_value := case when p_value = ''none'' then to_jsonb(''none''::text) else to_jsonb(p_value::numeric) end;\n'
        || anchor);
    def := pg_catalog.replace(def, known, known || ', spend_cap');
    execute def;
end;
$$;
revoke execute on function shepherd.change_setting(text, text, text, text) from public;
