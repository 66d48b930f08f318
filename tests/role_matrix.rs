//! The roles of deploy/roles.sql, logged in as each: the worker does what
//! workers do and nothing an operator does, the operator acts through
//! functions that run as their owner and are recorded under the session's
//! role, the reader reads. The matrix here is docs/security.md's.

mod common;
#[path = "role_matrix/documented.rs"]
mod documented;
#[path = "role_matrix/forgeries.rs"]
mod forgeries;

use common::latitude::{World, pool};
use common::lifecycle::*;
use shepherd::jobs::delete_machine::DeleteOutcome;
use shepherd_fakes::latitude::Call;
use sqlx::PgPool;
use std::collections::BTreeSet;

/// The functions a worker may run.
const WORKER_FUNCTIONS: &[&str] = &[
    "shepherd.append_event(text,text,jsonb)",
    "shepherd.declare_pool(text,text,text,integer,text,text[],text,text)",
    "shepherd.device_history(text)",
    "shepherd.device_history(uuid)",
    // The database's identity, which tells a restore or a failover.
    "shepherd.database_identity_now()",
    "shepherd.duration_seconds(text)",
    "shepherd.enqueue_reconcile()",
    "shepherd.history(text)",
    "shepherd.job_args(bytea)",
    "shepherd.managed_machine(text)",
    "shepherd.max_machines()",
    "shepherd.pool_occupancy(text)",
    "shepherd.prune_jobs(interval)",
    "shepherd.push_job(text,jsonb,timestamp with time zone,integer,text)",
    "shepherd.require(boolean,text)",
    "shepherd.reservation_history(uuid)",
    "shepherd.take_window_slot(text,integer,double precision)",
    // An append's read of the views it changes (issue 31).
    "shepherd.view_rows(text[],uuid[])",
    // An append in one call: its locks, its insert, that read (issue 31).
    "shepherd.append_reading(uuid[],text[],text[],integer[],jsonb[],text[],text[],text[],uuid[])",
    // An assimilation's device lock and the read under it (issue 31).
    "shepherd.assimilation_seen(text,text,text,uuid)",
];

/// The functions a reader may run: the read helpers its views call.
const READER_FUNCTIONS: &[&str] = &[
    "shepherd.device_history(text)",
    "shepherd.device_history(uuid)",
    "shepherd.history(text)",
    "shepherd.job_args(bytea)",
    "shepherd.pool_occupancy(text)",
    "shepherd.reservation_history(uuid)",
];

/// What the reader may not read: the console's sessions and failures.
const NOT_READ: &[&str] = &[
    "shepherd.console_login_failures",
    "shepherd.console_sessions",
];

/// What only an operator runs, each called as a worker and a reader would
/// call it: refused before its body runs.
const OPERATOR_CALLS: &[&str] = &[
    "select shepherd.pause_creations('r', 'console:alice')",
    "select shepherd.resume_creations('r')",
    "select shepherd.pause_deletions('r')",
    "select shepherd.resume_deletions('r')",
    "select shepherd.change_setting('ready_deadline', '0s', 'r')",
    "select shepherd.change_setting('max_unhealthy', '100%', 'r')",
    "select shepherd.clear_penalty(gen_random_uuid(), 'r')",
    "select shepherd.clear_all_penalties('r')",
    "select shepherd.set_pool('web', 'c2-small-x86', 'DAL', 0, 'ubuntu', '{}', 'r', null, true)",
    "select shepherd.remove_pool('web', 'r', null, true)",
    "select shepherd.protect_machine('x', 'r', null, false)",
    "select shepherd.acknowledge_leave('x', 'r')",
    "select shepherd.deprovision_machine('x', 'r')",
    "select shepherd.release_machine('x', 'r', 'console:alice', p_provider_says_gone => true)",
    "select shepherd.enqueue_create_device(gen_random_uuid(), null)",
    "select shepherd.enqueue_assimilate(gen_random_uuid())",
    "select shepherd.enqueue_assimilate('x'::text)",
];

/// The tables a worker writes (select, insert, update, delete).
const WORKER_WRITES: &[&str] = &[
    "apalis.jobs",
    "apalis.workers",
    "shepherd.cluster_settings",
    "shepherd.console_login_failures",
    "shepherd.console_sessions",
    "shepherd.controls",
    "shepherd.database_identity",
    "shepherd.job_runs",
    "shepherd.leases",
    "shepherd.limiters",
    "shepherd.machine_status",
    "shepherd.managed_machines",
    "shepherd.pending_creations",
    "shepherd.pending_deletions",
    "shepherd.pools",
    "shepherd.processes",
    "shepherd.sinbin",
    "shepherd.unassimilated_devices",
];

/// The views a worker reads besides.
const WORKER_READS: &[&str] = &[
    "shepherd.failed_jobs",
    "shepherd.in_flight",
    "shepherd.leaving",
    "shepherd.machines",
    "shepherd.queue_depth",
    "shepherd.recent_events",
    "shepherd.sinbin_now",
];

async fn apply_roles(db: &PgPool) {
    let url = common::database_url(db).await;
    let roles = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/roles.sql");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("psql")
            .arg(&url)
            .args(["-q", "-v", "ON_ERROR_STOP=1", "-f", roles])
            .output()
            .expect("psql runs (Debian's postgresql-client)")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "deploy/roles.sql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn login(db: &PgPool, role: &str) -> PgPool {
    let url = common::database_url(db).await;
    let as_role = url.replacen("://postgres@", &format!("://{role}@"), 1);
    assert_ne!(
        as_role, url,
        "the test database URL names the postgres user"
    );
    shepherd::db::connect(&as_role, 2)
        .await
        .unwrap_or_else(|e| panic!("logging in as {role}: {e}"))
}

/// The SQLSTATE a statement fails with, or None when it succeeds.
async fn code_of(pool: &PgPool, sql: &str) -> Option<String> {
    match sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
        .execute(pool)
        .await
    {
        Ok(_) => None,
        Err(sqlx::Error::Database(e)) => Some(e.code().map(|c| c.to_string()).unwrap_or_default()),
        Err(e) => panic!("{sql}: not a database answer: {e}"),
    }
}

const DENIED: &str = "42501";

#[sqlx::test(migrations = false)]
async fn each_role_can_do_exactly_its_part(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    apply_roles(&w.pool).await;
    let device = server_ids(&w)[0].clone();

    // The catalogue: every function and table of shepherd's and apalis's,
    // for every role, exactly as the matrix says.
    let functions: Vec<String> = sqlx::query_scalar(
        "select p.oid::regprocedure::text from pg_proc p
         join pg_namespace n on n.oid = p.pronamespace
         where n.nspname = 'shepherd' and p.prorettype <> 'trigger'::regtype
         order by 1",
    )
    .fetch_all(&w.pool)
    .await
    .unwrap();
    assert!(functions.len() > 30, "{functions:?}");
    for role in ["shepherd_worker", "shepherd_operator", "shepherd_reader"] {
        let allowed: BTreeSet<String> = sqlx::query_scalar(
            "select f from unnest($1::text[]) f
             where has_function_privilege($2, f::regprocedure, 'execute')",
        )
        .bind(&functions)
        .bind(role)
        .fetch_all(&w.pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
        let expected: BTreeSet<String> = match role {
            "shepherd_worker" => WORKER_FUNCTIONS.iter().map(|s| s.to_string()).collect(),
            "shepherd_reader" => READER_FUNCTIONS.iter().map(|s| s.to_string()).collect(),
            _ => functions.iter().cloned().collect(),
        };
        assert_eq!(allowed, expected, "{role}'s functions");
    }
    // Of the functions that run as their owner, the worker may run only
    // these two: any other would pass the log's guard on its behalf.
    let definers: Vec<String> = sqlx::query_scalar(
        "select p.oid::regprocedure::text from pg_proc p
         join pg_namespace n on n.oid = p.pronamespace
         where n.nspname = 'shepherd' and p.prosecdef
           and has_function_privilege('shepherd_worker', p.oid, 'execute')
         order by 1",
    )
    .fetch_all(&w.pool)
    .await
    .unwrap();
    assert_eq!(
        definers,
        [
            "shepherd.declare_pool(text,text,text,integer,text,text[],text,text)",
            "shepherd.enqueue_reconcile()"
        ]
    );
    let tables: Vec<String> = sqlx::query_scalar(
        "select n.nspname || '.' || c.relname from pg_class c
         join pg_namespace n on n.oid = c.relnamespace
         where n.nspname in ('shepherd', 'apalis') and c.relkind in ('r', 'v')
           and c.relname <> '_sqlx_migrations'
         order by 1",
    )
    .fetch_all(&w.pool)
    .await
    .unwrap();
    for role in ["shepherd_worker", "shepherd_operator", "shepherd_reader"] {
        for table in &tables {
            for privilege in ["select", "insert", "update", "delete"] {
                let has: bool = sqlx::query_scalar("select has_table_privilege($1, $2, $3)")
                    .bind(role)
                    .bind(table)
                    .bind(privilege)
                    .fetch_one(&w.pool)
                    .await
                    .unwrap();
                let writes = WORKER_WRITES.contains(&table.as_str());
                let expected = match (role, privilege) {
                    ("shepherd_reader", "select") => !NOT_READ.contains(&table.as_str()),
                    ("shepherd_reader", _) => false,
                    (_, "select") if role == "shepherd_operator" => true,
                    (_, "select") => {
                        writes
                            || WORKER_READS.contains(&table.as_str())
                            || table == "shepherd.events"
                    }
                    (_, "insert") if table == "shepherd.events" => true,
                    _ => writes,
                };
                assert_eq!(has, expected, "{role} {privilege} on {table}");
            }
        }
    }

    // Logged in: the worker and the reader are refused every operator
    // function, whatever name they give.
    let worker = login(&w.pool, "shepherd_worker").await;
    let reader = login(&w.pool, "shepherd_reader").await;
    // No advisory lock for the reader: one held on a writer's key stalled
    // the cluster. The worker takes them as its writes need.
    for sql in [
        "select pg_catalog.pg_advisory_lock(pg_catalog.hashtextextended('operator/settings', 0))",
        "select pg_catalog.pg_try_advisory_lock(1::bigint)",
        "select pg_catalog.pg_advisory_lock_shared(1, 2)",
        "select pg_catalog.pg_advisory_xact_lock(1::bigint)",
    ] {
        assert_eq!(
            code_of(&reader, sql).await.as_deref(),
            Some(DENIED),
            "{sql}"
        );
    }
    assert_eq!(
        code_of(
            &worker,
            "select pg_catalog.pg_try_advisory_xact_lock(1::bigint)"
        )
        .await,
        None
    );
    // Nor a transaction or a statement without end.
    let idle: String = sqlx::query_scalar("show idle_in_transaction_session_timeout")
        .fetch_one(&reader)
        .await
        .expect("the reader's idle timeout");
    assert_eq!(idle, "1min");
    let operator = login(&w.pool, "shepherd_operator").await;
    for call in OPERATOR_CALLS {
        let call = call.replace("'x'", &format!("'{device}'"));
        assert_eq!(
            code_of(&worker, &call).await.as_deref(),
            Some(DENIED),
            "worker: {call}"
        );
        assert_eq!(
            code_of(&reader, &call).await.as_deref(),
            Some(DENIED),
            "reader: {call}"
        );
    }
    // Nor may the worker record an operator's event itself, nor change
    // the pools, the settings or the pauses behind the functions' backs.
    for forged in [
        format!(
            "select shepherd.append_event('device/{device}', 'deletion_requested',
               jsonb_build_object('machine_id', gen_random_uuid(), 'provider_id', '{device}',
                 'reservation', null, 'pool', null, 'request', gen_random_uuid(),
                 'cause', 'operator', 'message', 'm', 'by', 'console:alice'))"
        ),
        format!(
            "select shepherd.append_event('device/{device}', 'machine_unprotected',
               jsonb_build_object('machine_id', gen_random_uuid(), 'provider_id', '{device}',
                 'by', 'console:alice', 'reason', 'r'))"
        ),
        format!(
            "select shepherd.append_event('device/{device}', 'leave_acknowledged',
               jsonb_build_object('machine_id', gen_random_uuid(), 'provider_id', '{device}',
                 'request', gen_random_uuid(), 'by', 'console:alice'))"
        ),
        "select shepherd.append_event('operator/settings', 'settings_changed',
           jsonb_build_object('by', 'w', 'reason', 'r',
             'settings', jsonb_build_object('max_unhealthy', '100%')))"
            .into(),
        "select shepherd.append_event('pool/web', 'pool_removed',
           jsonb_build_object('name', 'web', 'by', 'w', 'reason', 'r', 'confirmed', true))"
            .into(),
        "update shepherd.pools set count = 0".into(),
        "delete from shepherd.pools".into(),
        "update shepherd.cluster_settings set value = '\"100%\"' where key = 'max_unhealthy'"
            .into(),
        "insert into shepherd.controls (name, paused, by, reason, since)
         values ('deletions', false, 'w', 'r', now())"
            .into(),
        "delete from shepherd.events".into(),
        "create table shepherd.mine (x int)".into(),
    ] {
        assert_eq!(
            code_of(&worker, &forged).await.as_deref(),
            Some(DENIED),
            "worker: {forged}"
        );
    }
    // What a worker does goes on: an event of its own, a setting the
    // cluster lacks, a job in the queue.
    for own in [
        "select shepherd.append_event('operator/reconcile', 'reconcile_refused',
           jsonb_build_object('run', gen_random_uuid(), 'reason', 'a test'))",
        "select shepherd.append_event('operator/settings', 'settings_changed',
           jsonb_build_object('by', 'worker:w', 'reason', 'a key this release adds',
             'settings', jsonb_build_object('a_new_key', 1)))",
        "insert into shepherd.cluster_settings (key, value, updated_at)
         values ('a_new_key', '1', now())",
        "select shepherd.enqueue_reconcile()",
        // A pass's own deletion of a machine on no place of the pools.
        "select shepherd.append_event('device/sv_nowhere', 'deletion_requested',
           jsonb_build_object('machine_id', gen_random_uuid(), 'provider_id', 'sv_nowhere',
             'reservation', null, 'pool', null, 'request', gen_random_uuid(),
             'cause', 'unplaced', 'message', 'm', 'by', 'reconcile'))",
    ] {
        assert_eq!(code_of(&worker, own).await, None, "worker: {own}");
    }
    // The reader reads, and writes nothing.
    assert_eq!(
        code_of(&reader, "select count(*) from shepherd.events").await,
        None
    );
    for write in [
        "insert into apalis.jobs (id) values ('x')",
        "update shepherd.managed_machines set protected = false",
        "delete from shepherd.console_sessions",
    ] {
        assert_eq!(
            code_of(&reader, write).await.as_deref(),
            Some(DENIED),
            "reader: {write}"
        );
    }

    // The operator acts; each act names the session's role in the log.
    for act in [
        "select shepherd.pause_creations('maintenance')",
        "select shepherd.resume_creations('done', 'console:alice')",
        "select shepherd.set_pool('db', 'c2-small-x86', 'DAL', 1, 'ubuntu_24_04_x64_lts', '{}', 'a new pool')",
        "select shepherd.change_setting('ready_deadline', '20m', 'slower images')",
    ] {
        assert_eq!(code_of(&operator, act).await, None, "operator: {act}");
    }
    sqlx::query("select shepherd.deprovision_machine($1, 'retire it')")
        .bind(&device)
        .execute(&operator)
        .await
        .unwrap();
    let recorded: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "select event_type, role, body->>'by' from shepherd.events
         where event_type in ('creations_paused', 'creations_resumed', 'pool_declared',
                              'deletion_requested')
           and role = 'shepherd_operator'
         order by position",
    )
    .fetch_all(&w.pool)
    .await
    .unwrap();
    assert_eq!(
        recorded,
        vec![
            (
                "creations_paused".into(),
                Some("shepherd_operator".into()),
                Some("sql:shepherd_operator".into())
            ),
            (
                "creations_resumed".into(),
                Some("shepherd_operator".into()),
                Some("console:alice".into())
            ),
            (
                "pool_declared".into(),
                Some("shepherd_operator".into()),
                Some("sql:shepherd_operator".into())
            ),
            (
                "deletion_requested".into(),
                Some("shepherd_operator".into()),
                Some("sql:shepherd_operator".into())
            ),
        ]
    );
    // A body cannot claim a role: the log writes the session's.
    let claimed: Option<String> = sqlx::query_scalar(
        "select role from shepherd.events where event_type = 'reconcile_refused'",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert_eq!(claimed.as_deref(), Some("shepherd_worker"));
    for p in [worker, reader, operator] {
        p.close().await;
    }
}

/// The first worker of a new cluster, on the worker's role, records the
/// settings and pools its flags give; a later one changes neither, and its
/// different flags are reported, not applied.
#[sqlx::test(migrations = false)]
async fn the_worker_role_starts_a_new_cluster_and_changes_no_existing_one(db: PgPool) {
    common::migrated(&db).await;
    apply_roles(&db).await;
    let worker = login(&db, "shepherd_worker").await;
    let config = shepherd::config::ProvisionerConfig::default();
    let proposed = shepherd::cluster::ClusterSettings::proposed_by(&config);
    let first = shepherd::cluster::establish(&worker, &proposed, &[], "worker:a")
        .await
        .expect("the first worker records the cluster's settings");
    assert!(first.first);
    let pools = shepherd::pools::establish(&worker, &[pool("web", "DAL", 2)], "worker:a")
        .await
        .expect("the first worker declares the cluster's pools");
    assert!(pools.first);
    assert_eq!(pools.pools.len(), 1);

    let mut other = config.clone();
    other.chunk_size += 1;
    let later = shepherd::cluster::establish(
        &worker,
        &shepherd::cluster::ClusterSettings::proposed_by(&other),
        &["chunk_size".to_string()],
        "worker:b",
    )
    .await
    .expect("a later worker adopts the cluster's settings");
    assert!(!later.first);
    assert_eq!(later.disagreements.len(), 1);
    let pools = shepherd::pools::establish(&worker, &[pool("web", "DAL", 0)], "worker:b")
        .await
        .expect("a later worker adopts the cluster's pools");
    assert!(!pools.first);
    assert_eq!(pools.differences.len(), 1, "{:?}", pools.differences);
    let count: i32 = sqlx::query_scalar("select count from shepherd.pools where name = 'web'")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(count, 2);
    // And the one way a worker declares pools declares them only in a
    // cluster that has none: neither a change nor a new pool now.
    for statement in [
        "select shepherd.declare_pool('web', 'c2-small-x86', 'DAL', 0, 'ubuntu_24_04_x64_lts',
                                      '{}', 'shrink it', 'worker:b')",
        "select shepherd.declare_pool('cache', 'c2-small-x86', 'DAL', 900, 'ubuntu_24_04_x64_lts',
                                      '{ssh_theirs}', 'grow it', 'worker:b')",
    ] {
        let refused = sqlx::query(statement).execute(&worker).await.unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("the cluster has pools already"),
            "{refused}"
        );
    }
    worker.close().await;
}

/// A cluster whose roles were made before an append's reads became
/// functions (deploy/roles.sql run by an earlier release, not again since)
/// keeps recording once upgraded: each migration that adds one grants it
/// to the worker itself, and the worker records as itself.
#[sqlx::test(migrations = false)]
async fn an_upgrade_keeps_the_worker_recording_without_a_new_roles_run(db: PgPool) {
    common::migrated(&db).await;
    apply_roles(&db).await;
    // The roles as an earlier release left them: no grant of the functions.
    sqlx::raw_sql(
        "revoke execute on function shepherd.view_rows(text[], uuid[]) from shepherd_worker;
         revoke execute on function shepherd.append_reading(
             uuid[], text[], text[], integer[], jsonb[], text[], text[], text[], uuid[])
             from shepherd_worker;
         revoke execute on function shepherd.assimilation_seen(text, text, text, uuid)
             from shepherd_worker",
    )
    .execute(&db)
    .await
    .unwrap();
    let worker = login(&db, "shepherd_worker").await;
    const CALLS: [&str; 3] = [
        "select * from shepherd.view_rows('{}', '{}')",
        "select * from shepherd.append_reading('{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}')",
        "select * from shepherd.assimilation_seen('device/d', 'metal', 'd', null)",
    ];
    for call in CALLS {
        let refused = code_of(&worker, call).await;
        assert_eq!(
            refused.as_deref(),
            Some("42501"),
            "revoked, as before: {call}"
        );
    }
    sqlx::raw_sql(include_str!(
        "../migrations/20261206000010_cheaper_appends.sql"
    ))
    .execute(&db)
    .await
    .unwrap();
    sqlx::raw_sql(include_str!(
        "../migrations/20261206000012_one_trip_appends.sql"
    ))
    .execute(&db)
    .await
    .unwrap();
    for call in CALLS {
        assert_eq!(
            code_of(&worker, call).await,
            None,
            "the migrations grant the worker its calls: {call}"
        );
    }
    let mut conn = worker.acquire().await.unwrap();
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    shepherd::events::record(
        &mut tx,
        vec![shepherd::events::NewEvent::new(
            shepherd::events::event::CreationRequested {
                reservation: uuid::Uuid::new_v4(),
                request: uuid::Uuid::new_v4(),
                manual: false,
                requested_by: None,
                sinbin_override: None,
                place: None,
            },
        )],
    )
    .await
    .expect("the worker records an event, its views read through the function");
    tx.commit().await.unwrap();
}
