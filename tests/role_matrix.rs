//! The roles of deploy/roles.sql, logged in as each: the worker does what
//! workers do and nothing an operator does, the operator acts through
//! functions that run as their owner and are recorded under the session's
//! role, the reader reads. The matrix here is docs/security.md's.

mod common;

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
    "shepherd.job_runs",
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

/// What the worker's role can write (a row in the views, a job in the
/// queue) deletes nothing: an operator's deletion needs the operator's
/// event in the log, and protection is read from the log too.
#[sqlx::test(migrations = false)]
async fn a_deletion_forged_by_the_worker_role_deletes_nothing(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    apply_roles(&w.pool).await;
    let ids = server_ids(&w);
    let worker = login(&w.pool, "shepherd_worker").await;

    // A deletion "by an operator" written straight into the views and the
    // queue, without the log's event (which the worker may not record).
    let forged = &ids[0];
    sqlx::query(
        "with m as (select * from shepherd.managed_machines where provider_id = $1),
              r as (select gen_random_uuid() as request)
         insert into shepherd.pending_deletions (machine_id, provider_id, reservation_id, pool,
             request, cause, message, requested_by, requested_at)
         select m.machine_id, m.provider_id, m.reservation_id, null, r.request::text,
                'operator', 'forged', 'console:alice', now()
         from m, r",
    )
    .bind(forged)
    .execute(&worker)
    .await
    .expect("the worker's role writes the views");
    sqlx::query(
        "select shepherd.push_job('delete_machine', jsonb_build_object(
             'machine_id', d.machine_id, 'device', d.provider_id,
             'request', d.request::uuid, 'attempt', 1), now(), 25, d.request || '/1')
         from shepherd.pending_deletions d where d.provider_id = $1",
    )
    .bind(forged)
    .execute(&worker)
    .await
    .expect("the worker's role queues jobs");

    // A machine an operator protected, unprotected in the view only, then
    // deprovisioned by an operator who read the view.
    let protected = &ids[1];
    let operator = login(&w.pool, "shepherd_operator").await;
    sqlx::query("select shepherd.protect_machine($1, 'the database primary', null, true)")
        .bind(protected)
        .execute(&operator)
        .await
        .unwrap();
    sqlx::query("update shepherd.managed_machines set protected = false where provider_id = $1")
        .bind(protected)
        .execute(&worker)
        .await
        .expect("the worker's role writes the view");
    sqlx::query("select shepherd.deprovision_machine($1, 'the view said it was not protected')")
        .bind(protected)
        .execute(&operator)
        .await
        .unwrap();

    let ran = drain_rounds(&w, 3).await;
    let outcomes: Vec<String> = ran
        .iter()
        .filter_map(|r| match r {
            common::world::Ran::Delete(o) => Some(format!("{o:?}")),
            _ => None,
        })
        .collect();
    assert_eq!(outcomes.len(), 2, "{ran:?}");
    assert!(
        !outcomes.iter().any(|o| o.contains(&format!(
            "{:?}",
            DeleteOutcome::Deleted {
                already_gone: false
            }
        ))),
        "{outcomes:?}"
    );
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    assert_eq!(server_ids(&w), ids);
    let cancelled: Vec<String> = sqlx::query_scalar(
        "select body->>'reason' from shepherd.events where event_type = 'deletion_cancelled'
         order by position",
    )
    .fetch_all(&w.pool)
    .await
    .unwrap();
    assert_eq!(cancelled.len(), 2, "{cancelled:?}");
    assert!(
        cancelled
            .iter()
            .any(|r| r.contains("no operator's request")),
        "{cancelled:?}"
    );
    assert!(
        cancelled.iter().any(|r| r.contains("protected")),
        "{cancelled:?}"
    );
    worker.close().await;
    operator.close().await;
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

/// A pending deletion and its job, written by the worker's role for the
/// machine behind `machine` (its device unless `device` names another),
/// cleared of the leave hook. Returns the request.
async fn forge(
    worker: &PgPool,
    machine: uuid::Uuid,
    device: &str,
    cause: &str,
    pool: Option<&str>,
    request: uuid::Uuid,
) {
    sqlx::query(
        "insert into shepherd.pending_deletions (machine_id, provider_id, reservation_id, pool,
             request, cause, message, requested_by, requested_at, cleared_at)
         select m.machine_id, m.provider_id, m.reservation_id, $2, $3::text, $4, 'forged',
                'shepherd', now(), now()
         from shepherd.managed_machines m where m.machine_id = $1",
    )
    .bind(machine)
    .bind(pool)
    .bind(request)
    .bind(cause)
    .execute(worker)
    .await
    .expect("the worker's role writes the views");
    sqlx::query(
        "select shepherd.push_job('delete_machine', jsonb_build_object(
             'machine_id', $1::uuid, 'device', $2::text, 'request', $3::uuid, 'attempt', 1),
             now(), 25, $3::text || '/forged')",
    )
    .bind(machine)
    .bind(device)
    .bind(request)
    .execute(worker)
    .await
    .expect("the worker's role queues jobs");
}

/// The forgeries a review found, each refused: a deletion row for a made-up
/// machine whose job names a real, protected device; a surplus that names
/// no pool, or a pool the cluster never had; an operator's request that
/// had already ended, replayed.
#[sqlx::test(migrations = false)]
async fn forgeries_naming_another_device_no_pool_or_an_ended_request_delete_nothing(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 3)]).await;
    w.settle(3).await;
    apply_roles(&w.pool).await;
    let ids = server_ids(&w);
    assert_eq!(ids.len(), 3);
    let worker = login(&w.pool, "shepherd_worker").await;
    let operator = login(&w.pool, "shepherd_operator").await;
    let machine_of = |device: String| {
        let pool = w.pool.clone();
        async move {
            sqlx::query_scalar::<_, uuid::Uuid>(
                "select machine_id from shepherd.managed_machines where provider_id = $1",
            )
            .bind(device)
            .fetch_one(&pool)
            .await
            .expect("a managed machine")
        }
    };

    // 1. A made-up machine, its job aimed at a real protected server.
    sqlx::query("select shepherd.protect_machine($1, 'keep it', null, true)")
        .bind(&ids[0])
        .execute(&operator)
        .await
        .unwrap();
    let fake = uuid::Uuid::new_v4();
    sqlx::query(
        "insert into shepherd.managed_machines (machine_id, provider, provider_id, reservation_id,
             hostname, assimilated_at, protected)
         values ($1, 'latitude', 'sv_madeup', null, null, now(), false)",
    )
    .bind(fake)
    .execute(&worker)
    .await
    .expect("the worker's role writes the view");
    forge(
        &worker,
        fake,
        &ids[0],
        "surplus",
        Some("web"),
        uuid::Uuid::new_v4(),
    )
    .await;
    // 2. Surpluses of no pool, and of a pool that never was.
    forge(
        &worker,
        machine_of(ids[1].clone()).await,
        &ids[1],
        "surplus",
        None,
        uuid::Uuid::new_v4(),
    )
    .await;
    let ran = drain_rounds(&w, 2).await;
    sqlx::query("delete from shepherd.pending_deletions")
        .execute(&w.pool)
        .await
        .unwrap();
    forge(
        &worker,
        machine_of(ids[1].clone()).await,
        &ids[1],
        "pool_removed",
        Some("never-was"),
        uuid::Uuid::new_v4(),
    )
    .await;
    // 3. An operator's deprovision of the third, ended (cancelled) before
    // its delete, then replayed with the same request.
    sqlx::query("select shepherd.deprovision_machine($1, 'retire it')")
        .bind(&ids[2])
        .execute(&operator)
        .await
        .unwrap();
    let (request, job): (String, String) = sqlx::query_as(
        "select d.request, j.id from shepherd.pending_deletions d
         join apalis.jobs j on j.job_type = 'delete_machine'
              and convert_from(j.job, 'UTF8')::jsonb->>'request' = d.request
         where d.provider_id = $1",
    )
    .bind(&ids[2])
    .fetch_one(&w.pool)
    .await
    .unwrap();
    shepherd::jobs::manage::cancel(&operator, &job, "cli:test", "changed my mind")
        .await
        .expect("the operator cancels the deletion");
    forge(
        &worker,
        machine_of(ids[2].clone()).await,
        &ids[2],
        "operator",
        None,
        request.parse().unwrap(),
    )
    .await;
    let more = drain_rounds(&w, 3).await;

    assert_eq!(w.fake.calls(Call::DestroyServer), 0, "{ran:?} {more:?}");
    assert_eq!(server_ids(&w), ids);
    let reasons: Vec<String> = sqlx::query_scalar(
        "select body->>'reason' from shepherd.events where event_type = 'deletion_cancelled'
         order by position",
    )
    .fetch_all(&w.pool)
    .await
    .unwrap();
    for says in ["names no pool", "has no pool", "no operator's request"] {
        assert!(
            reasons.iter().any(|r| r.contains(says)),
            "{says}: {reasons:?}"
        );
    }
    // The made-up machine's job found no deletion of its device to run.
    assert!(
        ran.iter()
            .any(|r| format!("{r:?}").contains("no deletion of this request")),
        "{ran:?}"
    );
    worker.close().await;
    operator.close().await;
}

/// The names in backticks of docs/security.md's matrix row that begins
/// with `label`.
fn documented_functions(label: &str) -> BTreeSet<String> {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/security.md")).unwrap();
    let row = doc
        .lines()
        .find(|l| l.starts_with(&format!("| {label} (")))
        .unwrap_or_else(|| panic!("docs/security.md has no matrix row {label:?}"));
    // Only the first cell, the one that names the functions.
    let cell = row[2..].split(" |").next().unwrap();
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

fn short_names(signatures: &[&str]) -> BTreeSet<String> {
    signatures
        .iter()
        .map(|s| {
            s.trim_start_matches("shepherd.")
                .split('(')
                .next()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// The matrix docs/security.md shows is the one this file checks against
/// the database: the same functions for each role, none missing from the
/// docs and none the docs name that the roles do not have.
#[test]
fn the_documented_matrix_is_the_one_checked() {
    let helpers = documented_functions("Read helpers");
    assert_eq!(helpers, short_names(READER_FUNCTIONS), "read helpers");
    let worker: BTreeSet<String> = documented_functions("Worker functions")
        .union(&helpers)
        .cloned()
        .collect();
    assert_eq!(worker, short_names(WORKER_FUNCTIONS), "worker functions");
    // The operator's, with `pause_*` standing for each pause.
    let documented = documented_functions("Operator functions");
    let called: BTreeSet<String> = OPERATOR_CALLS
        .iter()
        .map(|c| {
            c.trim_start_matches("select shepherd.")
                .split('(')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    let covers = |doc: &str, name: &str| match doc.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => doc == name,
    };
    for name in &called {
        assert!(
            documented.iter().any(|d| covers(d, name)),
            "docs/security.md's operator row lacks {name}"
        );
    }
    for doc in &documented {
        assert!(
            called.iter().any(|n| covers(doc, n)),
            "docs/security.md names operator function {doc}, which no role check calls"
        );
    }
}
