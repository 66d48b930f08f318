//! Real `shepherd worker` processes against one database and the fake
//! Metal server: horizontal scale, a worker killed mid-creation, SIGTERM,
//! and the errors a process meets at start.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shepherd::metal::Operation;
use shepherd::metal::fake::{FakeConfig, FakeMetal, Faults};
use sqlx::PgPool;

const TOKEN: &str = "cluster-test-token-7f3a";

/// The tests that measure request timing run alone: not beside each other,
/// and not beside the other tests of this file, whose worker processes
/// would share the two cores with them. A stall of the fake's process
/// stamps requests sent on time together; seen in CI when a timed test ran
/// beside untimed ones. Timed tests hold it for writing, the rest for
/// reading.
static TIMED: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

struct Cluster {
    pool: PgPool,
    fake: FakeMetal,
    db_url: String,
    dir: PathBuf,
    workers: Vec<Child>,
}

async fn database_url(pool: &PgPool) -> String {
    let name: String = sqlx::query_scalar("select current_database()")
        .fetch_one(pool)
        .await
        .unwrap();
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for tests");
    let (server, _) = base.rsplit_once('/').unwrap();
    format!("{server}/{name}")
}

/// Starts the fake on a runtime of its own: the test's runtime has one
/// thread, and a fake served there would stamp requests late whenever the
/// test itself is busy, which would make timing assertions measure the test.
fn start_fake(config: FakeConfig) -> FakeMetal {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let fake = FakeMetal::start(config, "127.0.0.1:0".parse().unwrap())
                .await
                .unwrap();
            tx.send(fake).unwrap();
            std::future::pending::<()>().await;
        });
    });
    rx.recv().unwrap()
}

impl Cluster {
    async fn new(pool: PgPool, reservations: usize, faults: Faults) -> Cluster {
        let fake = start_fake(FakeConfig {
            token: TOKEN.into(),
            reservations,
            faults,
            ..FakeConfig::default()
        });
        let db_url = database_url(&pool).await;
        let dir = std::env::temp_dir().join(format!("shepherd-cluster-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("key.pub"),
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGNsdXN0ZXItdGVzdC1rZXk cluster\n",
        )
        .unwrap();
        Cluster {
            pool,
            fake,
            db_url,
            dir,
            workers: vec![],
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_shepherd"));
        c.args(args)
            .env("DATABASE_URL", &self.db_url)
            .env("METAL_API_URL", self.fake.base_url())
            .env("METAL_PROJECT_ID", self.fake.project_id().to_string())
            .env("METAL_AUTH_TOKEN", TOKEN)
            .env("SHEPHERD_SSH_PUBLIC_KEY_FILE", self.dir.join("key.pub"))
            .env("SHEPHERD_LOG", "info")
            .env_remove("SHEPHERD_LOG_FORMAT")
            .stdin(Stdio::null());
        c
    }

    fn spawn_worker(&mut self, extra: &[&str]) {
        let n = self.workers.len();
        let log = std::fs::File::create(self.dir.join(format!("worker-{n}.log"))).unwrap();
        let port = format!("127.0.0.1:{}", free_port());
        let mut args = vec![
            "worker",
            "--metrics-listen",
            &port,
            "--scheduler",
            "--heartbeat",
            "1s",
            "--missed-heartbeats",
            "3",
            "--poll-interval",
            "200ms",
            "--api-rate",
            "0s",
            "--reconcile-rate",
            "1s,1",
            "--create-backoff",
            "1s",
        ];
        args.extend_from_slice(extra);
        let child = self
            .command(&args)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.workers.push(child);
    }

    /// One number from the test's database.
    async fn count(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap()
    }

    async fn managed(&self) -> i64 {
        sqlx::query_scalar("select count(*) from shepherd.managed_machines")
            .fetch_one(&self.pool)
            .await
            .unwrap_or(0)
    }

    async fn in_flight(&self) -> i64 {
        sqlx::query_scalar(
            "select (select count(*) from shepherd.pending_creations)
                  + (select count(*) from shepherd.unassimilated_devices)",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap_or(0)
    }

    /// Waits until `managed` machines are managed and nothing is in flight,
    /// checking the limit at every sample.
    async fn wait_for(&self, managed: i64, max: i64, timeout: Duration) {
        let started = Instant::now();
        loop {
            let (m, f) = (self.managed().await, self.in_flight().await);
            assert!(m + f <= max, "managed {m} + in flight {f} > {max}");
            if m == managed && f == 0 {
                return;
            }
            assert!(
                started.elapsed() < timeout,
                "after {timeout:?}: {m} managed, {f} in flight; logs in {}",
                self.dir.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn assert_consistent(&self, managed: &[String]) {
        let devices = self.fake.devices();
        let ours: Vec<_> = devices
            .iter()
            .filter(|d| d.hostname.starts_with("shepherd-"))
            .collect();
        let mut reservations: Vec<_> = ours.iter().filter_map(|d| d.reservation).collect();
        let n = reservations.len();
        reservations.sort();
        reservations.dedup();
        assert_eq!(reservations.len(), n, "a reservation got two devices");
        for d in ours {
            assert!(
                managed.contains(&d.id.to_string()),
                "device {} is orphaned",
                d.id
            );
        }
    }

    async fn managed_ids(&self) -> Vec<String> {
        sqlx::query_scalar("select provider_id from shepherd.managed_machines")
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }

    fn stop_all(&mut self) {
        for w in &mut self.workers {
            if w.try_wait().unwrap().is_none() {
                signal(w, "TERM");
            }
        }
        for w in &mut self.workers {
            let _ = w.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for w in &mut self.workers {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn log_of(dir: &Path, n: usize) -> String {
    std::fs::read_to_string(dir.join(format!("worker-{n}.log"))).unwrap_or_default()
}

/// Creations never reach the provider faster than the limiter's spacing,
/// across all processes. The limiter spaces its slots exactly (see
/// tests/limiter.rs, no slack). Between a slot and the fake's stamp lies
/// this machine: two cores shared by Postgres, three workers, the fake and
/// the test. Stalls of ~80 ms were seen after which requests sent on their
/// slots arrive together (gaps 2, 0, 0 ms, then 76 ms), so a window of ten
/// may lose up to three spacings to jitter. Over the whole run stalls
/// cannot add requests, and the bound holds within one spacing.
fn assert_paced(fake: &FakeMetal, spacing: Duration) {
    let mut starts: Vec<_> = fake
        .request_log()
        .into_iter()
        .filter(|r| r.op == Operation::CreateDevice)
        .map(|r| r.started)
        .collect();
    starts.sort();
    for (i, w) in starts.windows(10).enumerate() {
        let span = w[9].duration_since(w[0]);
        let at = w[0].duration_since(starts[0]).as_millis();
        let gaps: Vec<_> = w
            .windows(2)
            .map(|p| p[1].duration_since(p[0]).as_millis())
            .collect();
        assert!(
            span + spacing * 3 >= spacing * 9,
            "ten creations within {span:?} (window {i}, {at} ms in), gaps (ms) {gaps:?}"
        );
    }
    let all = starts[starts.len() - 1].duration_since(starts[0]);
    let bound = spacing * (starts.len() as u32 - 1);
    assert!(
        all + spacing >= bound,
        "{} creations in {all:?}, bound {bound:?}",
        starts.len()
    );
}

async fn migrate(cluster: &Cluster) {
    let out = cluster.command(&["migrate"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

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
    use shepherd_workers::scheduler::{Tick, run_once};
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
    let pruned = shepherd_workers::scheduler::prune(&c.pool, Duration::from_secs(24 * 3600))
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
