-- A leave hook's URL is a setting: recorded in `settings_changed`, kept in
-- `cluster_settings` and shown on pages a reader sees, so a token in its
-- userinfo or its query was published with it (issue 47). change_setting()
-- refuses such a URL from now on (the hook's requests are signed with the
-- secret file instead); its body is taken as it stands and only the URL's
-- pattern and message changed, as 20261206000006 did for the spend cap.
do $$
declare
    f regprocedure := 'shepherd.change_setting(text, text, text, text)'::regprocedure;
    def text := pg_catalog.pg_get_functiondef(f);
    old_check constant text := E'p_value ~ ''^https?://[^[:space:]]+$''';
    old_message constant text := E'format(''leave_hook is none, ack, or an http(s) URL to POST to, not %L'', p_value)';
begin
    -- Applied already (a ledger that forgot it runs it again).
    if pg_catalog.strpos(def, 'without credentials (user:password@)') > 0 then
        return;
    end if;
    if pg_catalog.strpos(def, old_check) = 0 or pg_catalog.strpos(def, old_message) = 0 then
        raise exception 'change_setting() is not as this migration expects; it was not changed';
    end if;
    def := pg_catalog.replace(def, old_check,
        E'p_value ~ ''^https?://[^[:space:]@/?#]+(/[^[:space:]?#]*)?$''');
    def := pg_catalog.replace(def, old_message,
        E'format(''leave_hook is none, ack, or an http(s) URL to POST to without credentials (user:password@) or a query (?token=...), which the event log and the pages would publish; sign its requests with --leave-hook-secret-file instead. Not %L'', '
        || E'case when p_value ~ ''[@?#]'' then pg_catalog.regexp_replace(p_value, ''^(https?://)?.*$'', ''\\1...'') else p_value end)');
    execute def;
end;
$$;
revoke execute on function shepherd.change_setting(text, text, text, text) from public;
