//! Real `shepherd worker` processes against one database and the fake
//! Metal server: horizontal scale, a worker killed mid-creation, SIGTERM,
//! and the errors a process meets at start.

use std::process::Command;
use std::time::{Duration, Instant};

use shepherd_fakes::metal::Faults;
use sqlx::PgPool;

/// The tests that measure request timing run alone: not beside each other,
/// and not beside the other tests of this file, whose worker processes
/// would share the two cores with them. A stall of the fake's process
/// stamps requests sent on time together; seen in CI when a timed test ran
/// beside untimed ones. Timed tests hold it for writing, the rest for
/// reading.
static TIMED: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

mod common;
#[path = "cluster/database.rs"]
mod database;
#[path = "cluster/follow_up.rs"]
mod follow_up;
#[path = "cluster/queue.rs"]
mod queue;
#[path = "cluster/roles_and_liveness.rs"]
mod roles_and_liveness;
use common::*;
#[allow(dead_code)]
#[path = "web/browser.rs"]
mod browser;

#[sqlx::test(migrations = false)]
async fn three_workers_provision_exactly_the_limit(pool: PgPool) {
    let _timed = TIMED.write().await;
    let mut c = Cluster::new(pool, 200, Faults::default()).await;
    migrate(&c).await;
    let mut ports = vec![];
    for _ in 0..3 {
        ports.push(c.spawn_worker(&[
            "--max-machines",
            "150",
            "--chunk-size",
            "40",
            "--device-creation-rate",
            "40ms,1",
        ]));
    }
    let started = Instant::now();
    c.wait_for(150, 150, Duration::from_secs(120)).await;
    eprintln!("150 machines by three workers in {:?}", started.elapsed());
    // Each process counts the run times of the jobs it ran.
    let mut created = 0.0;
    for port in &ports {
        let text = reqwest::get(format!("http://{port}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        created += text
            .lines()
            .find(|l| {
                l.starts_with(
                    "shepherd_job_run_time_seconds_count{kind=\"create_device\",outcome=\"ok\"}",
                )
            })
            .and_then(|l| l.rsplit_once(' '))
            .map_or(0.0, |(_, v)| v.parse::<f64>().unwrap());
    }
    assert!(created >= 150.0, "{created} create_device runs counted");
    for w in &c.workers {
        signal(w, "TERM");
    }
    for w in &mut c.workers {
        assert!(w.wait().unwrap().success());
    }
    let managed = c.managed_ids().await;
    assert_eq!(managed.len(), 150);
    assert_eq!(c.fake.devices().len(), 150);
    c.assert_consistent(&managed);
    assert_paced(&c.fake, Duration::from_millis(40));
    // Every process did work.
    for n in 0..3 {
        assert!(
            log_of(&c.dir, n).contains("create_device finished"),
            "worker {n} idle"
        );
    }
}

#[sqlx::test(migrations = false)]
async fn a_worker_killed_mid_creation_loses_nothing(pool: PgPool) {
    let _timed = TIMED.write().await;
    let mut c = Cluster::new(pool, 200, Faults::default().with_latency(20, 20)).await;
    migrate(&c).await;
    let args = [
        "--max-machines",
        "150",
        "--chunk-size",
        "40",
        "--device-creation-rate",
        "40ms,1",
    ];
    for _ in 0..3 {
        c.spawn_worker(&args);
    }
    // Kill one worker once creations are under way.
    let started = Instant::now();
    while c.managed().await < 30 {
        assert!(started.elapsed() < Duration::from_secs(60));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.workers[0].kill().unwrap();
    c.workers[0].wait().unwrap();
    c.wait_for(150, 150, Duration::from_secs(120)).await;
    c.stop_all();
    let managed = c.managed_ids().await;
    assert_eq!(managed.len(), 150);
    c.assert_consistent(&managed);
    assert_paced(&c.fake, Duration::from_millis(40));
    let stuck = c
        .count("select count(*) from apalis.jobs where status in ('Running', 'Queued')")
        .await;
    // The killed worker's claimed jobs were rescued by heartbeat timeout.
    assert_eq!(stuck, 0, "jobs left claimed by a dead worker");
}

#[sqlx::test(migrations = false)]
async fn sigterm_on_a_busy_worker_exits_zero_and_leaves_nothing_running(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 40, Faults::default().with_latency(300, 0)).await;
    migrate(&c).await;
    c.spawn_worker(&[
        "--max-machines",
        "40",
        "--device-creation-rate",
        "100ms,1",
        "--drain-timeout",
        "5s",
    ]);
    let started = Instant::now();
    while c.managed().await < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{}",
            log_of(&c.dir, 0)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Claimed jobs stay `Queued` while they run (the workers do not take
    // apalis's separate lock that marks them `Running`).
    let running: i64 =
        sqlx::query_scalar("select count(*) from apalis.jobs where status = 'Queued'")
            .fetch_one(&c.pool)
            .await
            .unwrap();
    assert!(running > 0, "the worker should be busy");
    signal(&c.workers[0], "TERM");
    let status = c.workers[0].wait().unwrap();
    assert!(status.success(), "exit {status:?}: {}", log_of(&c.dir, 0));
    let stuck = c
        .count("select count(*) from apalis.jobs where status in ('Running', 'Queued')")
        .await;
    assert_eq!(stuck, 0, "{}", log_of(&c.dir, 0));
    assert!(log_of(&c.dir, 0).contains("worker exited cleanly"));
}

#[sqlx::test(migrations = false)]
async fn two_schedulers_enqueue_one_reconcile_per_period(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let c = Cluster::new(pool, 1, Faults::default()).await;
    migrate(&c).await;
    use shepherd_workers::services::scheduler::{Tick, run_once};
    let period = Duration::from_secs(3600);
    let (a, b) = tokio::join!(run_once(&c.pool, period), run_once(&c.pool, period));
    let mut ticks = [a.unwrap().0, b.unwrap().0];
    ticks.sort_by_key(|t| *t == Tick::AlreadyEnqueued);
    assert_eq!(ticks, [Tick::Enqueued, Tick::AlreadyEnqueued]);
    let jobs: i64 =
        sqlx::query_scalar("select count(*) from apalis.jobs where job_type = 'reconcile'")
            .fetch_one(&c.pool)
            .await
            .unwrap();
    assert_eq!(jobs, 1);
}

#[sqlx::test(migrations = false)]
async fn a_worker_without_postgres_says_so_and_exits_non_zero(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let c = Cluster::new(pool, 1, Faults::default()).await;
    let out = c
        .command(&["worker"])
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/nowhere")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot reach Postgres at 127.0.0.1:1/nowhere"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[sqlx::test(migrations = false)]
async fn bad_settings_are_refused_before_any_call(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let c = Cluster::new(pool, 1, Faults::default()).await;
    let cases: &[(&[&str], &str)] = &[
        (&["worker", "--device-prefix", "FIXME-"], "device prefix"),
        (&["worker", "--ssh-key-label", "FIXME"], "SSH key label"),
        (
            &["worker", "--device-creation-rate", "5x,1"],
            "--device-creation-rate",
        ),
        (&["worker", "--chunk-size", "0"], "chunk size"),
        (&["worker", "--max-machines", "-3"], "--max-machines"),
        (
            &["worker", "--ssh-public-key-file", "/nonexistent/key.pub"],
            "SHEPHERD_SSH_PUBLIC_KEY_FILE",
        ),
        (
            &["enqueue", "create-device", "--reservation", "not-a-uuid"],
            "--reservation",
        ),
        (&["worker", "--api-parallelism", "0"], "--api-parallelism"),
        (&["worker", "--per-page=-5"], "--per-page"),
        (&["worker", "--db-connections=-1"], "--db-connections"),
        (&["worker", "--db-connections", "0"], "--db-connections"),
        // A worker that never beats, or is given up at once, cannot hold
        // its jobs.
        (&["worker", "--heartbeat", "0s"], "heartbeat (--heartbeat)"),
        (
            &["worker", "--missed-heartbeats", "0"],
            "missed heartbeats (--missed-heartbeats)",
        ),
        (&["worker", "--create-attempts=-2"], "--create-attempts"),
        (&["worker", "--penalty", "soon"], "--penalty"),
        (&["worker", "--penalty-factor=-1"], "penalty factor"),
        (&["worker", "--reconcile-rate", "1m,0"], "reconcile"),
        (&["worker", "--project", "FIXME"], "--project"),
    ];
    for (args, needle) in cases {
        let out = c.command(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    let out = c
        .command(&["worker"])
        .env_remove("METAL_AUTH_TOKEN")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("METAL_AUTH_TOKEN"));
    let out = c
        .command(&["worker"])
        .env("DATABASE_URL", "mysql://x")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("DATABASE_URL"));
    let out = c
        .command(&["worker"])
        .env("DATABASE_URL", "postgres://u@host:notaport/db")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("DATABASE_URL"));
    let out = c
        .command(&["worker"])
        .env("METAL_AUTH_TOKEN_FILE", c.dir.join("no-such-token"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("METAL_AUTH_TOKEN_FILE"));
    assert_eq!(c.fake.total_calls(), 0, "a bad setting reached the API");
    let tables = c
        .count("select count(*) from information_schema.schemata where schema_name = 'shepherd'")
        .await;
    assert_eq!(tables, 0, "a bad setting reached the database");
}

/// apalis stops heartbeating while fetched jobs wait in its buffer, and a
/// silent worker's jobs are handed to others (APALIS.md trap 2). With one
/// job per fetch a busy worker keeps its heartbeat.
#[sqlx::test(migrations = false)]
async fn a_busy_worker_keeps_heartbeating(pool: PgPool) {
    let _timed = TIMED.write().await;
    let mut c = Cluster::new(pool, 20, Faults::default().with_latency(400, 0)).await;
    migrate(&c).await;
    c.spawn_worker(&[
        "--max-machines",
        "20",
        "--chunk-size",
        "20",
        "--device-creation-rate",
        "0s,1",
        "--create-concurrency",
        "1",
    ]);
    let started = Instant::now();
    let mut samples = 0;
    let mut worst = 0.0f64;
    while started.elapsed() < Duration::from_secs(30) && samples < 40 {
        let busy = c.count("select count(*) from apalis.jobs where job_type = 'create_device' and status = 'Queued'").await;
        let age: Option<f64> = sqlx::query_scalar(
            "select extract(epoch from now() - last_seen)::float8 from apalis.workers
             where worker_type = 'create_device' order by last_seen desc limit 1",
        )
        .fetch_optional(&c.pool)
        .await
        .unwrap();
        if busy > 0
            && let Some(age) = age
        {
            samples += 1;
            worst = worst.max(age);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        samples >= 10,
        "the worker was never seen busy ({samples} samples)"
    );
    // Heartbeat 1 s, rescue after 3 s: the worker must never look dead.
    assert!(
        worst < 2.5,
        "last_seen aged {worst:.1}s while the worker was busy"
    );
    c.stop_all();
}

/// A provider's 429 seen by one worker holds the calls of every worker for
/// as long as its `Retry-After` asks, and the work still completes.
#[sqlx::test(migrations = false)]
async fn a_429_seen_by_one_worker_holds_every_worker(pool: PgPool) {
    use shepherd_fakes::metal::{FaultKind, FaultRule};
    let _timed = TIMED.write().await;
    let faults = Faults::none().with_rule(
        FaultRule::new(FaultKind::RateLimited {
            retry_after_secs: 1,
        })
        .with_probability(0.2),
    );
    let mut c = Cluster::new(pool, 20, faults).await;
    migrate(&c).await;
    for _ in 0..3 {
        c.spawn_worker(&["--max-machines", "20", "--device-creation-rate", "0s,1"]);
    }
    c.wait_for(20, 20, Duration::from_secs(180)).await;
    let log = c.fake.request_log();
    let throttled: Vec<_> = log.iter().filter(|r| r.status == 429).collect();
    assert!(
        throttled.len() >= 3,
        "only {} of {} calls were answered 429",
        throttled.len(),
        log.len()
    );
    // A call already sent, or sent by a process that had not yet read the
    // hold from Postgres, may land just after a 429: a generous grace, far
    // shorter than the hold.
    let grace = Duration::from_millis(250);
    let inside: Vec<_> = log
        .iter()
        .filter(|r| {
            throttled.iter().any(|t| {
                r.started > t.finished + grace && r.started < t.finished + Duration::from_secs(1)
            })
        })
        .map(|r| format!("{} {}", r.op, r.status))
        .collect();
    assert!(
        inside.is_empty(),
        "{} calls inside a hold: {inside:?}",
        inside.len()
    );
    c.stop_all();
}

/// The scheduler serves the same probes and metrics as a worker, and
/// `shepherd healthcheck` (what the containers' healthchecks run) reads its
/// readiness: 0 when ready, 1 with the reason when nothing answers.
#[sqlx::test(migrations = false)]
async fn the_scheduler_serves_probes_and_healthcheck_reads_them(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let c = Cluster::new(pool, 2, Faults::default()).await;
    migrate(&c).await;
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut scheduler = c
        .command(&[
            "scheduler",
            "--reconcile-rate",
            "1h,1",
            "--metrics-listen",
            &listen,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ready = format!("http://{listen}/readyz");
    let started = Instant::now();
    loop {
        let out = c
            .command(&["healthcheck", "--url", &ready])
            .output()
            .unwrap();
        if out.status.success() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the scheduler never became ready: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let metrics = reqwest::get(format!("http://{listen}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("shepherd_jobs{"), "{metrics}");
    // The default URL follows SHEPHERD_METRICS_LISTEN, as in a container.
    let out = c
        .command(&["healthcheck"])
        .env("SHEPHERD_METRICS_LISTEN", format!("0.0.0.0:{port}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    signal(&scheduler, "TERM");
    let status = scheduler.wait().unwrap();
    assert!(status.success(), "the scheduler exited {status:?}");
    let out = c
        .command(&["healthcheck", "--url", &ready, "--timeout", "1s"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(
        message.contains(&ready) && message.contains("no answer"),
        "{message}"
    );
}

/// JSON logs carry a job's outcome as fields (`outcome`, `device`,
/// `recovered` as a boolean), not as Rust debug text in one string.
#[sqlx::test(migrations = false)]
async fn json_logs_carry_outcomes_as_fields(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 3, Faults::default()).await;
    migrate(&c).await;
    c.spawn_worker_with_env(
        &[
            "--scheduler",
            "--max-machines",
            "2",
            "--device-creation-rate",
            "0s,1",
        ],
        &[("SHEPHERD_LOG_FORMAT", "json")],
    );
    c.wait_for(2, 2, Duration::from_secs(60)).await;
    c.stop_all();
    let log = log_of(&c.dir, 0);
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let created: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["fields"]["outcome"] == "created")
        .collect();
    assert_eq!(created.len(), 2, "{log}");
    for l in created {
        let device = l["fields"]["device"].as_str().expect("a device field");
        assert!(uuid::Uuid::parse_str(device).is_ok(), "{l}");
        assert_eq!(l["fields"]["recovered"], false, "{l}");
    }
    assert_eq!(
        lines
            .iter()
            .filter(|l| l["fields"]["outcome"] == "assimilated")
            .count(),
        2,
        "{log}"
    );
}
