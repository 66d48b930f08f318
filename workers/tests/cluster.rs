//! Real `shepherd worker` processes against one database and the fake
//! Metal server: horizontal scale, a worker killed mid-creation, SIGTERM,
//! and the errors a process meets at start.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use shepherd_fakes::metal::{FaultKind, FaultRule, Faults};
use sqlx::PgPool;
use uuid::Uuid;

/// The tests that measure request timing run alone: not beside each other,
/// and not beside the other tests of this file, whose worker processes
/// would share the two cores with them. A stall of the fake's process
/// stamps requests sent on time together; seen in CI when a timed test ran
/// beside untimed ones. Timed tests hold it for writing, the rest for
/// reading.
static TIMED: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

mod common;
use common::*;

#[sqlx::test(migrations = false)]
async fn three_workers_provision_exactly_the_limit(pool: PgPool) {
    let _timed = TIMED.write().await;
    let mut c = Cluster::new(pool, 200, Faults::default()).await;
    migrate(&c).await;
    for _ in 0..3 {
        c.spawn_worker(&[
            "--max-machines",
            "150",
            "--chunk-size",
            "40",
            "--device-creation-rate",
            "40ms,1",
        ]);
    }
    let started = Instant::now();
    c.wait_for(150, 150, Duration::from_secs(120)).await;
    eprintln!("150 machines by three workers in {:?}", started.elapsed());
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
    let running: i64 =
        sqlx::query_scalar("select count(*) from apalis.jobs where status = 'Running'")
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
async fn a_job_body_that_does_not_decode_fails_alone(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 5, Faults::default()).await;
    migrate(&c).await;
    let poison: String =
        sqlx::query_scalar("select shepherd.push_job('assimilate', '{\"nope\": 1}')")
            .fetch_one(&c.pool)
            .await
            .unwrap();
    c.spawn_worker(&["--max-machines", "2"]);
    c.wait_for(2, 2, Duration::from_secs(60)).await;
    let (status, result): (String, String) =
        sqlx::query_as("select status, last_result::text from apalis.jobs where id = $1")
            .bind(&poison)
            .fetch_one(&c.pool)
            .await
            .unwrap();
    assert_eq!(status, "Killed");
    assert!(result.contains("undecodable"), "{result}");
    c.stop_all();
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
        (&["worker", "--db-connections", "4"], "needs at least 14"),
        (
            &[
                "worker",
                "--db-connections",
                "15",
                "--create-concurrency",
                "8",
            ],
            "needs at least 18",
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

#[sqlx::test(migrations = false)]
async fn finished_jobs_are_pruned_after_their_retention(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let c = Cluster::new(pool, 1, Faults::default()).await;
    migrate(&c).await;
    for (status, age_hours) in [
        ("Done", 48),
        ("Killed", 48),
        ("Done", 1),
        ("Pending", 48),
        ("Failed", 48),
    ] {
        let id: String = sqlx::query_scalar("select shepherd.push_job('reconcile', '{}')")
            .fetch_one(&c.pool)
            .await
            .unwrap();
        sqlx::query(
            "update apalis.jobs set status = $2, done_at = now() - make_interval(hours => $3),
                    run_at = now() - make_interval(hours => $3) where id = $1",
        )
        .bind(&id)
        .bind(status)
        .bind(age_hours)
        .execute(&c.pool)
        .await
        .unwrap();
    }
    let pruned = shepherd_workers::services::scheduler::prune(&c.pool, Duration::from_secs(24 * 3600))
        .await
        .unwrap();
    // Old Done and Killed go; a recent Done, a Pending, and a Failed job
    // with attempts left stay.
    assert_eq!(pruned, 2);
    let left = c.count("select count(*) from apalis.jobs").await;
    assert_eq!(left, 3);
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
        let busy = c.count("select count(*) from apalis.jobs where job_type = 'create_device' and status = 'Running'").await;
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

/// The local cluster DATABASE_URL points at, if this machine can stop and
/// start it (`pg_ctlcluster`, as on Debian and Ubuntu).
fn local_cluster() -> Option<String> {
    let url = std::env::var("DATABASE_URL").ok()?;
    if !(url.contains("@127.0.0.1") || url.contains("@localhost")) {
        return None;
    }
    Command::new("pg_ctlcluster").arg("--help").output().ok()?;
    let mut versions: Vec<String> = std::fs::read_dir("/etc/postgresql")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    versions.sort_by_key(|v| v.parse::<u32>().unwrap_or(0));
    versions.pop()
}

fn pg_ctl(version: &str, action: &str) {
    let mut c = Command::new("pg_ctlcluster");
    c.args(["--skip-systemctl-redirect", version, "main", action]);
    if action == "stop" {
        c.args(["-m", "fast"]);
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "pg_ctlcluster {action}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Starts the cluster again if a test dies while it is down, so the rest of
/// the suite does not fail for it.
struct RestartGuard(Option<String>);

impl Drop for RestartGuard {
    fn drop(&mut self) {
        if let Some(v) = self.0.take() {
            let _ = Command::new("pg_ctlcluster")
                .args(["--skip-systemctl-redirect", &v, "main", "start"])
                .status();
        }
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The chaos run: mixed API faults, workers SIGKILLed and replaced every
/// few seconds, Postgres stopped for seconds and started again, manual
/// reconciles beside the scheduled ones. Sizes come from
/// SHEPHERD_CHAOS_RESERVATIONS / SHEPHERD_CHAOS_MAX (scripts/chaos runs it
/// longer). At the end every invariant of DESIGN.md §4 is checked from the
/// fake's state and shepherd's views, and one summary line is printed.
#[sqlx::test(migrations = false)]
async fn chaos_breaks_no_invariant(pool: PgPool) {
    let _timed = TIMED.write().await;
    let reservations = env_or("SHEPHERD_CHAOS_RESERVATIONS", 500) as usize;
    let max = env_or("SHEPHERD_CHAOS_MAX", 400) as i64;
    let kill_every = Duration::from_millis(env_or("SHEPHERD_CHAOS_KILL_EVERY_MS", 3000));
    let faults = Faults::none()
        .with_latency(0, 300)
        .with_rule(FaultRule::new(FaultKind::StealReservation).with_probability(0.01))
        .with_rule(FaultRule::new(FaultKind::AcceptThenFail { status: 500 }).with_probability(0.02))
        // Accepted, and the answer unreadable: the device exists.
        .with_rule(FaultRule::new(FaultKind::AcceptThenFail { status: 201 }).with_probability(0.02))
        .with_rule(FaultRule::new(FaultKind::AcceptThenDrop).with_probability(0.02))
        .with_rule(
            FaultRule::new(FaultKind::RateLimited {
                retry_after_secs: 1,
            })
            .with_probability(0.05),
        )
        .with_rule(FaultRule::new(FaultKind::Status { status: 503 }).with_probability(0.20));
    let mut c = Cluster::new(pool, reservations, faults).await;
    migrate(&c).await;
    let max_arg = max.to_string();
    let worker_args = [
        "--max-machines",
        &max_arg,
        "--chunk-size",
        "60",
        "--device-creation-rate",
        "10ms,1",
        "--create-attempts",
        "8",
        "--api-parallelism",
        "6",
        "--sweep-interval",
        "2s",
    ];
    for _ in 0..3 {
        c.spawn_worker(&worker_args);
    }
    let cluster = local_cluster();
    let mut guard = RestartGuard(None);
    let started = Instant::now();
    let mut seed = u64::from(std::process::id()) ^ 0x9e37_79b9_7f4a_7c15;
    let mut random = move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let (mut kills, mut manual, mut samples, mut highest) = (0u32, 0u32, 0u64, 0i64);
    let (mut manual_creates, mut manual_admitted) = (0u32, 0u32);
    let mut last_kill = Instant::now();
    let mut restarted: Option<Duration> = None;
    let (mut survivor, mut survivor_log_at): (Option<usize>, usize) = (None, 0);
    let mut reconciles = vec![];
    let timeout = Duration::from_secs(env_or("SHEPHERD_CHAOS_TIMEOUT_SECS", 300));
    loop {
        let elapsed = started.elapsed();
        assert!(
            elapsed < timeout,
            "chaos run not settled after {timeout:?}; logs in {}",
            c.dir.display()
        );
        // The limit, sampled in one snapshot (None while Postgres is away).
        let sample: Option<(i64, i64, i64)> = sqlx::query_as(
            "select (select count(*) from shepherd.managed_machines),
                    (select count(*) from shepherd.pending_creations)
                  + (select count(*) from shepherd.unassimilated_devices),
                    (select count(*) from apalis.jobs
                      where job_type in ('create_device', 'assimilate', 'reconcile')
                        and (status in ('Pending', 'Queued', 'Running')
                             or (status = 'Failed' and attempts < max_attempts)))",
        )
        .fetch_one(&c.pool)
        .await
        .ok();
        if let Some((m, f, _)) = sample {
            samples += 1;
            highest = highest.max(m + f);
            assert!(m + f <= max, "managed {m} + in flight {f} > {max}");
        }
        let settled = matches!(sample, Some((m, 0, 0)) if m == max);
        if settled && restarted.is_some() {
            break;
        }
        // Postgres goes away once, for several seconds, mid-run.
        if restarted.is_none() && elapsed > Duration::from_secs(8) {
            match &cluster {
                Some(v) => {
                    // One worker alive through the outage is spared the
                    // kills, to show it carries on by itself.
                    survivor = c
                        .workers
                        .iter_mut()
                        .position(|w| w.try_wait().unwrap().is_none());
                    guard.0 = Some(v.clone());
                    let down = Instant::now();
                    pg_ctl(v, "stop");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    pg_ctl(v, "start");
                    guard.0 = None;
                    restarted = Some(down.elapsed());
                    survivor_log_at = survivor.map_or(0, |i| log_of(&c.dir, i).len());
                }
                None => {
                    eprintln!(
                        "no local cluster to restart (pg_ctlcluster, DATABASE_URL on localhost); the outage is skipped"
                    );
                    restarted = Some(Duration::ZERO);
                }
            }
        }
        // A random worker dies hard every few seconds; a new one replaces it.
        if !settled && last_kill.elapsed() >= kill_every {
            let alive: Vec<usize> = (0..c.workers.len())
                .filter(|&i| Some(i) != survivor && c.workers[i].try_wait().unwrap().is_none())
                .collect();
            let victim = alive[random(alive.len())];
            signal(&c.workers[victim], "KILL");
            let _ = c.workers[victim].wait();
            kills += 1;
            c.spawn_worker(&worker_args);
            last_kill = Instant::now();
        }
        // Operators enqueue reconciles by hand, several at once.
        if manual < 6 && elapsed > Duration::from_secs(3 + 6 * u64::from(manual / 3)) {
            for _ in 0..3 {
                reconciles.push(
                    c.command(&["enqueue", "reconcile"])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .unwrap(),
                );
                manual += 1;
            }
        }
        // Operators create by hand too, from the CLI and from SQL, while
        // workers die: admitted against the cluster's limit or refused.
        if manual_creates < 8 && elapsed > Duration::from_secs(2 + 3 * u64::from(manual_creates)) {
            let free: Vec<Uuid> = c
                .fake
                .reservations()
                .into_iter()
                .filter(|r| r.device.is_none() && r.provisionable)
                .map(|r| r.id)
                .collect();
            if !free.is_empty() {
                let r = free[random(free.len())];
                if manual_creates % 2 == 0 {
                    reconciles.push(
                        c.command(&["enqueue", "create-device", "--reservation", &r.to_string()])
                            .stdout(Stdio::null())
                            .stderr(Stdio::null())
                            .spawn()
                            .unwrap(),
                    );
                } else if sqlx::query("select shepherd.enqueue_create_device($1)")
                    .bind(r)
                    .execute(&c.pool)
                    .await
                    .is_ok()
                {
                    manual_admitted += 1;
                }
                manual_creates += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    for mut r in reconciles {
        let _ = r.wait();
    }
    // The worker that lived through the outage is still running and did
    // jobs after it, unhelped.
    if let Some(i) = survivor {
        assert!(
            c.workers[i].try_wait().unwrap().is_none(),
            "worker {i} did not survive the Postgres restart: {}",
            log_of(&c.dir, i)
        );
        let after = log_of(&c.dir, i)[survivor_log_at..].to_string();
        assert!(
            after.contains("create_device finished") || after.contains("assimilate finished"),
            "worker {i} did no job after the restart: {after}"
        );
    }
    c.stop_all();
    for (i, w) in c.workers.iter_mut().enumerate() {
        let status = w.wait().unwrap();
        assert!(
            status.success() || status.code().is_none(),
            "worker {i} exited {status}: {}",
            log_of(&c.dir, i)
        );
    }
    if restarted.is_some_and(|d| !d.is_zero()) {
        let logs: String = (0..c.workers.len()).map(|i| log_of(&c.dir, i)).collect();
        // An outage shorter than the pool's acquire timeout (10 s) shows as
        // waits and dropped connections in sqlx's warnings, not as failed
        // jobs; a longer one as shepherd's own errors. Either is logged.
        assert!(
            [
                "database unreachable",
                "infrastructure",
                "terminating connection due to administrator command",
                "time to acquire exceeded",
            ]
            .iter()
            .any(|m| logs.contains(m)),
            "no worker logged the outage"
        );
    }

    // The provider's side: one device per reservation, every one of ours managed.
    let managed = c.managed_ids().await;
    c.assert_consistent(&managed);
    let reservations_now = c.fake.reservations();
    let taken = reservations_now.iter().filter(|r| r.taken_by_other).count();
    let ours: Vec<Uuid> = c
        .fake
        .devices()
        .iter()
        .filter(|d| d.hostname.starts_with("shepherd-"))
        .filter_map(|d| d.reservation)
        .collect();
    assert_eq!(managed.len() as i64, max);
    assert_eq!(ours.len() as i64, max);
    // Every reservation is provisioned, penalised with a cause, taken by the
    // other party, or free because the limit was reached.
    let penalised: Vec<(Uuid, String)> =
        sqlx::query_as("select reservation_id, cause from shepherd.sinbin")
            .fetch_all(&c.pool)
            .await
            .unwrap();
    for (r, cause) in &penalised {
        assert!(
            !cause.trim().is_empty(),
            "reservation {r} penalised without a cause"
        );
    }
    // Nothing penalised holds a device of ours, and nothing is left in flight.
    for (r, _) in &penalised {
        let active: bool = sqlx::query_scalar(
            "select exists(select 1 from shepherd.sinbin where reservation_id = $1 and now() <= until)",
        )
        .bind(r)
        .fetch_one(&c.pool)
        .await
        .unwrap();
        assert!(
            !(active && ours.contains(r)),
            "reservation {r} is penalised while it holds our device"
        );
    }
    assert_eq!(c.in_flight().await, 0, "something is left in flight");
    let unresolved = c
        .count("select count(*) from shepherd.events where event_type = 'creation_unresolved'")
        .await;
    let recovered = c
        .count(
            "select count(*) from shepherd.events
             where event_type = 'device_created' and (body->>'recovered')::bool",
        )
        .await;
    let resumed = c
        .count(
            "select count(*) from shepherd.events
             where event_type in ('creation_resumed', 'assimilation_resumed')",
        )
        .await;
    let stolen_from_us = reservations_now
        .iter()
        .filter(|r| r.taken_by_other && ours.contains(&r.id))
        .count();
    assert_eq!(
        stolen_from_us, 0,
        "a reservation is both ours and another party's"
    );
    // Views rebuilt from the log equal the live ones.
    let report = shepherd::events::views::rebuild(&c.pool, false)
        .await
        .unwrap();
    assert!(report.differences.is_empty(), "{:?}", report.differences);
    // No job is stuck: nothing claimed, nothing waiting.
    let stuck = c
        .count(
            "select count(*) from apalis.jobs
             where job_type in ('create_device', 'assimilate')
               and status in ('Queued', 'Running', 'Pending')",
        )
        .await;
    assert_eq!(stuck, 0, "jobs left claimed or waiting");

    let failed_attempts = c
        .count("select count(*) from shepherd.events where event_type = 'creation_attempt_failed'")
        .await;
    let log = c.fake.request_log();
    let (errors, limited) = (
        log.iter().filter(|r| r.status >= 500).count(),
        log.iter().filter(|r| r.status == 429).count(),
    );
    eprintln!(
        "chaos: {} machines of {reservations} reservations (limit {max}, highest managed + in flight {highest} over {samples} samples), {} penalised, {taken} taken by another party, {failed_attempts} failed creation attempts retried, {} API calls ({errors} answered 5xx, {limited} 429), {kills} workers SIGKILLed and replaced, Postgres down {:.1?} once, {manual} manual reconciles, {manual_creates} manual creations ({manual_admitted} from SQL admitted), {recovered} devices found by their witness after an unreadable or lost answer, {unresolved} outcomes left unknown until a later look, {resumed} resumed by the sweep, {:.1?}",
        managed.len(),
        penalised.len(),
        c.fake.total_calls(),
        restarted.unwrap_or_default(),
        elapsed
    );
}

/// The token reaches no page, metric or command line of a running worker,
/// nor the error a wrong token causes.
#[sqlx::test(migrations = false)]
async fn the_token_is_in_no_page_metric_or_command_line(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 6, Faults::default()).await;
    migrate(&c).await;
    let addr = c.spawn_worker(&["--max-machines", "3", "--device-creation-rate", "10ms,1"]);
    c.wait_for(3, 3, Duration::from_secs(60)).await;
    let device = c.managed_ids().await.remove(0);
    let reservation = c.fake.reservations()[0].id;
    let mut seen = String::new();
    for path in [
        "/".to_string(),
        "/metrics".into(),
        "/healthz".into(),
        "/readyz".into(),
        format!("/device/{device}"),
        format!("/reservation/{reservation}"),
    ] {
        let response = reqwest::get(format!("http://{addr}{path}")).await.unwrap();
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
        seen.push_str(&response.text().await.unwrap());
    }
    assert!(seen.contains("shepherd_"), "the metrics were read");
    assert!(
        !seen.contains(TOKEN),
        "the token is on a page the worker serves"
    );
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", c.workers[0].id())).unwrap();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains(TOKEN),
        "the token is on the command line"
    );
    // A token the API refuses: the error names the problem, not the token.
    let out = c
        .command(&["plan"])
        .env("METAL_AUTH_TOKEN", "wrong-token-e3b0c442")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("401") || stderr.to_lowercase().contains("unauthori"),
        "{stderr}"
    );
    assert!(!stderr.contains("wrong-token-e3b0c442"), "{stderr}");
    c.stop_all();
    assert!(
        !log_of(&c.dir, 0).contains(TOKEN),
        "the token is in the log"
    );
}

/// deploy/roles.sql's worker role is enough to run a worker (migrated by
/// the owner beforehand), and it cannot rewrite history.
#[sqlx::test(migrations = false)]
async fn the_least_privilege_role_runs_a_worker(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 4, Faults::default()).await;
    migrate(&c).await;
    let roles = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/roles.sql");
    let c2 = c.db_url.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("psql")
            .arg(&c2)
            .args(["-q", "-v", "ON_ERROR_STOP=1", "-f", roles])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let as_worker = c.db_url.replacen("://postgres@", "://shepherd_worker@", 1);
    assert_ne!(
        as_worker, c.db_url,
        "the test database URL names the postgres user"
    );
    c.db_url = as_worker.clone();
    c.spawn_worker(&[
        "--skip-migrations",
        "--max-machines",
        "2",
        "--device-creation-rate",
        "10ms,1",
    ]);
    c.wait_for(2, 2, Duration::from_secs(60)).await;
    let worker = shepherd::db::connect(&as_worker, 1).await.unwrap();
    for forbidden in [
        "delete from shepherd.events",
        "create table shepherd.mine (x int)",
    ] {
        let refused = sqlx::query(forbidden).execute(&worker).await.unwrap_err();
        assert!(
            refused.to_string().contains("permission denied"),
            "{forbidden}: {refused}"
        );
    }
    worker.close().await;
    c.stop_all();
}
