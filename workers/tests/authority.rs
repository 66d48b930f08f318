//! The promises that must hold on the paths an operator walks, through real
//! `shepherd` processes: one limit for the whole cluster whatever the flags
//! of each process, manual creations that obey it and the sinbin, a manual
//! creation whose worker is SIGKILLed mid-POST, releasing a machine whose
//! device is gone, and SQL functions that refuse nonsense.

use std::time::{Duration, Instant};

use shepherd::metal::Operation;
use shepherd_fakes::metal::Faults;
use sqlx::PgPool;
use uuid::Uuid;

mod common;
use common::*;

fn free_reservation(c: &Cluster) -> Uuid {
    c.fake
        .reservations()
        .into_iter()
        .find(|r| r.device.is_none() && r.provisionable)
        .expect("a free reservation")
        .id
}

/// What `shepherd.enqueue_create_device(r)` refused with.
async fn sql_refusal(c: &Cluster, r: Uuid) -> String {
    sqlx::query("select shepherd.enqueue_create_device($1)")
        .bind(r)
        .execute(&c.pool)
        .await
        .expect_err("the SQL function admitted it")
        .to_string()
}

fn run(c: &Cluster, args: &[&str]) -> (bool, String, String) {
    let out = c.command(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn wait_until(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < timeout, "after {timeout:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[sqlx::test(migrations = false)]
async fn one_limit_for_the_cluster_whatever_the_flags_and_manual_paths(pool: PgPool) {
    let mut c = Cluster::new(pool, 14, Faults::default()).await;
    migrate(&c).await;
    c.spawn_worker(&["--max-machines", "5", "--device-creation-rate", "0s,1"]);
    c.wait_for(5, 5, Duration::from_secs(60)).await;

    // A second worker started with another limit adopts the cluster's and
    // says so; it never admits against its own.
    c.spawn_worker(&["--max-machines", "30", "--device-creation-rate", "0s,1"]);
    wait_until(
        "the second worker warns",
        Duration::from_secs(30),
        async || log_of(&c.dir, 1).contains("differs from the cluster's 5"),
    )
    .await;
    assert!(
        log_of(&c.dir, 1).contains("shepherd settings set max_machines 30"),
        "{}",
        log_of(&c.dir, 1)
    );

    // Manual creations from the CLI (no flag) and from SQL are refused at
    // the cluster's limit.
    let r = free_reservation(&c);
    let (ok, _, err) = run(
        &c,
        &["enqueue", "create-device", "--reservation", &r.to_string()],
    );
    assert!(!ok, "a manual creation passed the limit");
    assert!(err.contains("max_machines (5)"), "{err}");
    let sql = sql_refusal(&c, r).await;
    assert!(sql.contains("max_machines (5)"), "{sql}");
    // plan without flags reports the cluster's limit.
    let (ok, out, err) = run(&c, &["plan"]);
    assert!(ok, "{err}");
    assert!(out.contains("limit 5"), "{out}");
    // Two more passes finished at the limit (both workers run a scheduler),
    // and still five: a pass that never ran would prove nothing.
    const AT_LIMIT: &str = "select count(*) from shepherd.events
                            where event_type = 'reconcile_finished' and (body->>'at_limit')::bool";
    let before = c.count(AT_LIMIT).await;
    wait_until(
        "two more passes finish at the limit",
        Duration::from_secs(30),
        async || c.count(AT_LIMIT).await >= before + 2,
    )
    .await;
    assert_eq!(c.managed().await, 5);
    assert_eq!(c.fake.devices().len(), 5);

    // The operator raises it once, for everyone, with a reason.
    let (ok, out, err) = run(
        &c,
        &[
            "settings",
            "set",
            "max_machines",
            "7",
            "--reason",
            "two more for the lab",
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains("max_machines is now 7"), "{out}");
    c.wait_for(7, 7, Duration::from_secs(60)).await;
    let (by, reason): (String, String) = sqlx::query_as(
        "select body->>'by', body->>'reason' from shepherd.events
         where event_type = 'settings_changed' order by position desc limit 1",
    )
    .fetch_one(&c.pool)
    .await
    .unwrap();
    assert!(by.starts_with("cli:"), "{by}");
    assert_eq!(reason, "two more for the lab");
    // Nonsense is refused with the reason, and changes nothing.
    let (ok, _, err) = run(
        &c,
        &["settings", "set", "max_machines", "-1", "--reason", "x"],
    );
    assert!(!ok);
    assert!(err.contains("max_machines must be a whole number"), "{err}");
    let (ok, _, err) = run(
        &c,
        &["settings", "set", "max_machine", "9", "--reason", "x"],
    );
    assert!(!ok);
    assert!(err.contains("unknown setting"), "{err}");
    // Durations as people write them.
    let (ok, _, err) = run(
        &c,
        &[
            "settings",
            "set",
            "penalty",
            "1h30m",
            "--reason",
            "longer cool-off",
        ],
    );
    assert!(ok, "{err}");
    // Logs written to a file carry no colour codes.
    assert!(
        !log_of(&c.dir, 0).contains('\u{1b}'),
        "ANSI codes in a log file"
    );
    let (ok, out, _) = run(&c, &["settings", "show"]);
    assert!(ok);
    assert!(out.contains("max_machines") && out.contains(" 7 "), "{out}");

    // The sinbin holds for manual creations unless overridden with a reason.
    sqlx::query("select shepherd.change_setting('max_machines', '8', 'one more')")
        .execute(&c.pool)
        .await
        .unwrap();
    c.stop_all();
    let r = free_reservation(&c);
    {
        use shepherd::events::event::ReservationPenalised;
        let mut tx = c.pool.begin().await.unwrap();
        shepherd::events::record(
            &mut tx,
            vec![shepherd::events::NewEvent::new(ReservationPenalised {
                reservation: r,
                until: chrono::Utc::now() + chrono::TimeDelta::hours(1),
                cause: "createDevice: rejected as invalid (422)".into(),
                class: None,
                scope: None,
            })],
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
    }
    let (ok, _, err) = run(
        &c,
        &["enqueue", "create-device", "--reservation", &r.to_string()],
    );
    assert!(!ok);
    assert!(err.contains("penalised"), "{err}");
    let sql = sql_refusal(&c, r).await;
    assert!(sql.contains("penalised"), "{sql}");
    let (ok, out, err) = run(
        &c,
        &[
            "enqueue",
            "create-device",
            "--reservation",
            &r.to_string(),
            "--override-sinbin",
            "the disk was replaced",
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains("enqueued create_device"), "{out}");
    let overridden: Option<String> = sqlx::query_scalar(
        "select body->>'sinbin_override' from shepherd.events
         where event_type = 'creation_requested' and body->>'reservation' = $1",
    )
    .bind(r.to_string())
    .fetch_one(&c.pool)
    .await
    .unwrap();
    assert_eq!(overridden.as_deref(), Some("the disk was replaced"));
    common::assert_rebuild_equals_live(&c.pool).await;
}

#[sqlx::test(migrations = false)]
async fn a_manual_creation_killed_mid_post_is_resumed_not_stranded(pool: PgPool) {
    let mut c = Cluster::new(pool, 3, Faults::default()).await;
    migrate(&c).await;
    c.spawn_plain_worker(&["--max-machines", "5", "--device-creation-rate", "0s,1"]);
    wait_until("the worker is ready", Duration::from_secs(30), async || {
        log_of(&c.dir, 0).contains("worker starting")
    })
    .await;
    // Every answer is slow, so the POST is on the wire long enough to die.
    c.fake.set_faults(Faults::default().with_latency(1500, 0));
    let r = free_reservation(&c);
    sqlx::query("select shepherd.enqueue_create_device($1)")
        .bind(r)
        .execute(&c.pool)
        .await
        .unwrap();
    wait_until(
        "the POST is under way",
        Duration::from_secs(30),
        async || c.fake.calls(Operation::CreateDevice) >= 1,
    )
    .await;
    signal(&c.workers[0], "KILL");
    let _ = c.workers[0].wait();
    assert_eq!(
        c.count("select count(*) from shepherd.pending_creations")
            .await,
        1
    );
    c.fake.set_faults(Faults::default());
    c.spawn_plain_worker(&["--max-machines", "5", "--sweep-interval", "2s"]);
    c.wait_for(1, 5, Duration::from_secs(60)).await;
    let ids = c.managed_ids().await;
    c.assert_consistent(&ids);
    let on_r = c
        .fake
        .devices()
        .into_iter()
        .filter(|d| d.reservation == Some(r))
        .count();
    assert_eq!(on_r, 1);
    assert_eq!(
        c.count("select count(*) from shepherd.events where event_type = 'creation_refused'")
            .await,
        0,
        "the re-run refused its own creation"
    );
}

#[sqlx::test(migrations = false)]
async fn a_machine_whose_device_is_gone_is_released_and_passes_resume(pool: PgPool) {
    let mut c = Cluster::new(pool, 6, Faults::default()).await;
    migrate(&c).await;
    // A machine recorded within the settle window is not missing yet (the
    // listings may lag): a short window, so the pass looks at once.
    c.spawn_worker(&[
        "--max-machines",
        "3",
        "--device-creation-rate",
        "0s,1",
        "--settle-window",
        "2s",
    ]);
    c.wait_for(3, 3, Duration::from_secs(60)).await;
    let ids = c.managed_ids().await;
    let gone: Uuid = ids[0].parse().unwrap();
    let kept: Uuid = ids[1].parse().unwrap();
    assert!(c.fake.delete_device(gone));
    wait_until(
        "a pass reports the machine missing",
        Duration::from_secs(30),
        async || {
            sqlx::query_scalar::<_, i64>(
                "select count(*) from shepherd.events where event_type = 'reconcile_refused'
               and body->>'reason' like '%shepherd machines release%'",
            )
            .fetch_one(&c.pool)
            .await
            .unwrap()
                > 0
        },
    )
    .await;
    // From SQL, which cannot ask the provider, a machine is released only
    // when the latest pass found it missing: not one it still lists.
    let refused = sqlx::query("select shepherd.release_machine($1, 'oops')")
        .bind(kept.to_string())
        .execute(&c.pool)
        .await
        .expect_err("SQL released a machine the provider still has");
    assert!(
        refused.to_string().contains("did not find") && refused.to_string().contains("missing"),
        "{refused}"
    );
    // A machine whose device still exists is not released.
    let (ok, _, err) = run(
        &c,
        &["machines", "release", &kept.to_string(), "--reason", "oops"],
    );
    assert!(!ok);
    assert!(err.contains("still exists"), "{err}");
    let (ok, _, err) = run(
        &c,
        &["machines", "release", &gone.to_string(), "--reason", ""],
    );
    assert!(!ok);
    assert!(err.contains("reason"), "{err}");
    let (ok, out, err) = run(
        &c,
        &[
            "machines",
            "release",
            &gone.to_string(),
            "--reason",
            "deleted by hand in the portal",
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains("no longer managed"), "{out}");
    // Passes resume and fill the slot again.
    c.wait_for(3, 3, Duration::from_secs(60)).await;
    assert!(!c.managed_ids().await.contains(&gone.to_string()));
    let released: String = sqlx::query_scalar(
        "select body->>'reason' from shepherd.events where event_type = 'machine_released'",
    )
    .fetch_one(&c.pool)
    .await
    .unwrap();
    assert_eq!(released, "deleted by hand in the portal");
    common::assert_rebuild_equals_live(&c.pool).await;
}

#[sqlx::test(migrations = false)]
async fn sql_functions_refuse_null_and_nonsense_and_queue_nothing(pool: PgPool) {
    let c = Cluster::new(pool, 2, Faults::default()).await;
    migrate(&c).await;
    let jobs = || async {
        sqlx::query_scalar::<_, i64>("select count(*) from apalis.jobs")
            .fetch_one(&c.pool)
            .await
            .unwrap()
    };
    let before = jobs().await;
    let cases: &[(&'static str, &str)] = &[
        (
            "select shepherd.enqueue_create_device(NULL)",
            "reservation id is required",
        ),
        (
            "select shepherd.enqueue_assimilate(NULL)",
            "device id is required",
        ),
        ("select shepherd.prune_jobs('-1 day')", "zero or more"),
        ("select shepherd.prune_jobs(NULL)", "zero or more"),
        (
            "select shepherd.pause_creations(NULL)",
            "a reason is required",
        ),
        (
            "select shepherd.pause_creations('  ')",
            "a reason is required",
        ),
        ("select shepherd.resume_creations(NULL)", "not NULL"),
        (
            "select shepherd.clear_penalty(NULL, 'x')",
            "reservation id is required",
        ),
        (
            "select shepherd.release_machine(NULL, 'x')",
            "id is required",
        ),
        (
            "select shepherd.release_machine('nope', 'gone')",
            "no managed machine",
        ),
        (
            "select shepherd.change_setting('chunk_size', '0', 'x')",
            "at least 1",
        ),
        (
            "select shepherd.change_setting('device_creation_rate', '5s,4294967296', 'x')",
            "burst of at most",
        ),
        (
            "select shepherd.change_setting('penalty', '99999999999999999999s', 'x')",
            "at most a year",
        ),
        (
            "select shepherd.enqueue_create_device(gen_random_uuid())",
            "no settings yet",
        ),
        (
            "select shepherd.change_setting('max_machines', '5', NULL)",
            "a reason is required",
        ),
        // No worker has recorded settings yet.
        (
            "select shepherd.change_setting('max_machines', '5', 'x')",
            "no settings yet",
        ),
    ];
    for (sql, needle) in cases {
        let err = sqlx::query(*sql)
            .execute(&c.pool)
            .await
            .expect_err(sql)
            .to_string();
        assert!(err.contains(needle), "{sql}: {err}");
    }
    assert_eq!(jobs().await, before, "a refused call queued a job");
    assert_eq!(
        c.count("select count(*) from shepherd.events").await,
        0,
        "a refused call wrote an event"
    );
}

/// The SQL door's judgement on its own: a release is taken when the latest
/// pass that compared the provider with the managed machines found the
/// machine missing, and refused when no pass did or a later one finished
/// without finding it so (the device was back, or never gone).
#[sqlx::test(migrations = false)]
async fn a_release_from_sql_follows_the_latest_pass(pool: PgPool) {
    use shepherd::events::event::*;
    shepherd::db::migrate(&pool).await.unwrap();
    let record = async |events: Vec<Event>| {
        let mut tx = pool.begin().await.unwrap();
        shepherd::events::record(
            &mut tx,
            events
                .into_iter()
                .map(shepherd::events::NewEvent::new)
                .collect(),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
    };
    let machine = |device: &str| -> Event {
        MachineAssimilated {
            machine_id: Uuid::new_v4(),
            provider: "metal".into(),
            provider_id: device.into(),
            reservation: Some(Uuid::new_v4()),
            hostname: Some(format!("shepherd-{device}")),
        }
        .into()
    };
    let release = async |device: &str| {
        sqlx::query_scalar::<_, Uuid>("select shepherd.release_machine($1, 'gone in the portal')")
            .bind(device)
            .fetch_one(&pool)
            .await
    };
    let missing = |devices: &[&str]| -> Event {
        DiscrepancyFound {
            run: Uuid::new_v4(),
            unknown_devices: vec![],
            missing_devices: devices.iter().map(|d| d.to_string()).collect(),
        }
        .into()
    };
    let finished = || -> Event {
        ReconcileFinished {
            run: Uuid::new_v4(),
            managed: 2,
            in_flight: 0,
            enqueued: 0,
            at_limit: false,
        }
        .into()
    };
    record(vec![
        machine("d-gone"),
        machine("d-here"),
        machine("d-back"),
    ])
    .await;
    // No pass has looked yet.
    let e = release("d-gone").await.expect_err("released unseen");
    assert!(
        e.to_string()
            .contains("the latest pass did not find d-gone missing"),
        "{e}"
    );
    record(vec![missing(&["d-gone", "d-back"])]).await;
    release("d-gone").await.expect("the pass found it missing");
    let e = release("d-here")
        .await
        .expect_err("released a listed machine");
    assert!(e.to_string().contains("did not find d-here missing"), "{e}");
    // A later pass that finished found nothing missing: d-back is back.
    record(vec![finished()]).await;
    let e = release("d-back")
        .await
        .expect_err("released on stale evidence");
    assert!(e.to_string().contains("did not find d-back missing"), "{e}");
    // Every refusal left the log as it was: one release, by SQL.
    let released: Vec<(String, String)> = sqlx::query_as(
        "select body->>'provider_id', body->>'by' from shepherd.events
         where event_type = 'machine_released'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(released.len(), 1, "{released:?}");
    assert_eq!(released[0].0, "d-gone");
    assert!(released[0].1.starts_with("sql:"), "{released:?}");
}
