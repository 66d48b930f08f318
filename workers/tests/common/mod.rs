//! The harness the process-level tests share: a fake Metal server on its
//! own runtime, a test database, and real `shepherd` processes started
//! against both, with the checks every scenario ends with.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shepherd::metal::Operation;
use shepherd_fakes::metal::{FakeConfig, FakeMetal, Faults};
use sqlx::PgPool;

pub const TOKEN: &str = "cluster-test-token-7f3a";

pub struct Cluster {
    pub pool: PgPool,
    pub fake: FakeMetal,
    pub db_url: String,
    pub dir: PathBuf,
    pub workers: Vec<Child>,
}

pub async fn database_url(pool: &PgPool) -> String {
    let name: String = sqlx::query_scalar("select current_database()")
        .fetch_one(pool)
        .await
        .unwrap();
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for tests");
    let (server, _) = base.rsplit_once('/').unwrap();
    format!("{server}/{name}")
}

/// The fake is the instrument the timed tests read: it stamps each request
/// when its thread gets to it. On two cores shared with Postgres and three
/// workers, a fake thread left waiting for ~100 ms stamps requests sent on
/// their limiter slots together (seen: four within 1 ms, then the usual
/// gaps). Its threads get a higher scheduling priority where the process
/// may grant one (root, as in CI); elsewhere this does nothing. The workers
/// and Postgres keep theirs, so what is measured is unchanged.
fn favour_this_thread() {
    // On Linux, PRIO_PROCESS with 0 names the calling thread; the call reads
    // and writes no memory of ours, and a refusal (not root) is ignored.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, -10);
    }
}

/// Starts the fake on a runtime of its own: the test's runtime has one
/// thread, and a fake served there would stamp requests late whenever the
/// test itself is busy, which would make timing assertions measure the test.
pub fn start_fake(config: FakeConfig) -> FakeMetal {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        favour_this_thread();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .on_thread_start(favour_this_thread)
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
    pub async fn new(pool: PgPool, reservations: usize, faults: Faults) -> Cluster {
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

    pub fn command(&self, args: &[&str]) -> Command {
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

    /// Starts a worker that also runs the scheduler; returns the address of
    /// its status page.
    pub fn spawn_worker(&mut self, extra: &[&str]) -> String {
        let mut args = vec!["--scheduler"];
        args.extend_from_slice(extra);
        self.spawn_plain_worker(&args)
    }

    /// Starts a worker that runs jobs only (no scheduled passes).
    pub fn spawn_plain_worker(&mut self, extra: &[&str]) -> String {
        self.spawn_worker_with_env(extra, &[])
    }

    /// [`Cluster::spawn_plain_worker`] with extra environment variables.
    pub fn spawn_worker_with_env(&mut self, extra: &[&str], env: &[(&str, &str)]) -> String {
        let n = self.workers.len();
        let log = std::fs::File::create(self.dir.join(format!("worker-{n}.log"))).unwrap();
        let port = format!("127.0.0.1:{}", free_port());
        let mut args = vec!["worker", "--metrics-listen", &port];
        // The tests' defaults, each unless `extra` sets it (clap refuses a
        // flag given twice).
        for (flag, value) in [
            ("--heartbeat", "1s"),
            ("--missed-heartbeats", "3"),
            ("--poll-interval", "200ms"),
            ("--api-rate", "0s"),
            ("--reconcile-rate", "1s,1"),
            ("--create-backoff", "1s"),
        ] {
            if !extra.contains(&flag) {
                args.extend([flag, value]);
            }
        }
        args.extend_from_slice(extra);
        let child = self
            .command(&args)
            .envs(env.iter().copied())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.workers.push(child);
        port
    }

    /// One number from the test's database.
    pub async fn count(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap()
    }

    /// A query that fails is the test's failure, never a zero.
    pub async fn managed(&self) -> i64 {
        sqlx::query_scalar("select count(*) from shepherd.managed_machines")
            .fetch_one(&self.pool)
            .await
            .expect("counting managed machines")
    }

    pub async fn in_flight(&self) -> i64 {
        sqlx::query_scalar("select (select count(*) from shepherd.in_flight)")
            .fetch_one(&self.pool)
            .await
            .expect("counting what is in flight")
    }

    /// Waits until `managed` machines are managed and nothing is in flight,
    /// checking the limit at every sample.
    pub async fn wait_for(&self, managed: i64, max: i64, timeout: Duration) {
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

    pub fn assert_consistent(&self, managed: &[String]) {
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
        assert_eq!(
            self.fake.duplicate_creates(),
            0,
            "a create was sent for a reservation that held a device of ours"
        );
        for d in ours {
            assert!(
                managed.contains(&d.id.to_string()),
                "device {} is orphaned",
                d.id
            );
        }
    }

    pub async fn managed_ids(&self) -> Vec<String> {
        sqlx::query_scalar("select provider_id from shepherd.managed_machines")
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }

    pub fn stop_all(&mut self) {
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

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

pub fn log_of(dir: &Path, n: usize) -> String {
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
pub fn assert_paced(fake: &FakeMetal, spacing: Duration) {
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

pub async fn migrate(cluster: &Cluster) {
    let out = cluster.command(&["migrate"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Invariant 5: the views rebuilt from the log equal the live ones.
pub async fn assert_rebuild_equals_live(pool: &sqlx::PgPool) {
    let report = shepherd::events::views::rebuild(pool, false)
        .await
        .expect("the log replays");
    assert_eq!(report.differences, Vec::<String>::new());
}

/// The fake Latitude API on a runtime of its own, as [`start_fake`] does
/// for Metal.
pub fn start_latitude(
    config: shepherd_fakes::latitude::FakeConfig,
) -> shepherd_fakes::latitude::FakeLatitude {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let fake = shepherd_fakes::latitude::FakeLatitude::start(
                config,
                "127.0.0.1:0".parse().unwrap(),
            )
            .await
            .unwrap();
            tx.send(fake).unwrap();
            std::future::pending::<()>().await;
        });
    });
    rx.recv().unwrap()
}

/// The local cluster DATABASE_URL points at, which the chaos runs stop and
/// start (`pg_ctlcluster`, as on Debian and Ubuntu). A machine where that
/// cannot be done fails the run: an outage the run could not cause proves
/// nothing, and must not pass as one survived.
pub fn local_cluster() -> String {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for tests");
    assert!(
        url.contains("@127.0.0.1") || url.contains("@localhost"),
        "the chaos run restarts Postgres, so DATABASE_URL must name a local cluster, not {url}"
    );
    Command::new("pg_ctlcluster")
        .arg("--help")
        .output()
        .expect("the chaos run restarts Postgres with pg_ctlcluster, which this machine lacks");
    let mut versions: Vec<String> = std::fs::read_dir("/etc/postgresql")
        .expect("no /etc/postgresql: the chaos run cannot find the cluster to restart")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    versions.sort_by_key(|v| v.parse::<u32>().unwrap_or(0));
    versions
        .pop()
        .expect("no cluster under /etc/postgresql: the chaos run cannot restart Postgres")
}

pub fn pg_ctl(version: &str, action: &str) {
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
pub struct RestartGuard(pub Option<String>);

impl Drop for RestartGuard {
    fn drop(&mut self) {
        if let Some(v) = self.0.take() {
            let _ = Command::new("pg_ctlcluster")
                .args(["--skip-systemctl-redirect", &v, "main", "start"])
                .status();
        }
    }
}

pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A small seeded picker (xorshift): `pick(n)` is an index below `n`. The
/// chaos runs choose their victims with it, so a run can be replayed from
/// its process id.
pub fn picker(mut seed: u64) -> impl FnMut(usize) -> usize {
    move |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    }
}
