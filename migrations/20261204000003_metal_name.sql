-- Metal is `metal` everywhere, as `--provider` names it; the log keeps
-- `equinix` in older events, which read as `metal` (events/event.rs,
-- upcast), so the live views follow.
update shepherd.managed_machines set provider = 'metal' where provider = 'equinix';
update shepherd.cluster_settings set value = to_jsonb('metal'::text)
where key = 'provider' and value = to_jsonb('equinix'::text);
