//! `shepherd-bench`: the benchmark scenarios of BENCHMARKS.md. Each one
//! builds its own databases, starts the fake Metal API in this process and
//! the worker processes it needs as children, and prints a table. Sides that
//! are compared run in the same invocation, alternating, and figures are
//! medians with their min and max: the machine is shared and noisy.
//! Nothing here fails on a time; a benchmark fails only when the work it
//! timed was not done correctly.

mod events;
mod fleet;
mod latitude;
mod pipeline;
mod rate;
mod reconcile;

use std::fmt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use shepherd::metal::Operation;
use shepherd_fakes::metal::{FakeConfig, FakeMetal};
use sqlx::PgPool;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Every scenario in turn (what BENCHMARKS.md reports)
    All(AllBench),
    /// 1: jobs/s of bare apalis with a no-op job against the full pipeline
    Queue(pipeline::QueueBench),
    /// 2: the full pipeline with 1, 2 and 4 worker processes
    ScaleOut(pipeline::ScaleOutBench),
    /// 3: time to provision against the bound the creation limiter sets
    RateLimit(rate::RateBench),
    /// 4: one reconcile pass at 1k, 5k and 10k reservations
    Reconcile(reconcile::ReconcileBench),
    /// 5: appends per second and view rebuild time against a sequential scan
    Events(events::EventsBench),
    /// 6: API calls per machine, normally and with transient faults
    Economy(pipeline::EconomyBench),
    /// 7: one pass at real latency with the defaults, beside the seed's listing
    Latency(reconcile::LatencyBench),
    /// 8: three workers against a provider answering 429 to a share of calls
    Throttle(pipeline::ThrottleBench),
    /// 9: Latitude.sh pools filled against the key's real budgets
    Latitude(latitude::LatitudeBench),
    /// 10: a pool change (deletions and creations) against the key's budgets
    Converge(latitude::ConvergeBench),
    /// 11: a pool filled with the defaults in an empty and a crowded project, then at rest
    Budget(latitude::BudgetBench),
    /// 12: twenty default workers and a scheduler on one Postgres, a Latitude pool filled and lowered
    Fleet(fleet::FleetBench),
    /// A bare apalis worker with a no-op job (scenario 1's baseline)
    #[command(hide = true)]
    NoopWorker(pipeline::NoopWorker),
    /// One reconcile pass in a fresh process, for its peak memory (scenario 4)
    #[command(hide = true)]
    ReconcileOnce(reconcile::ReconcileOnce),
}

/// The Postgres server the benchmarks create their databases on.
#[derive(Debug, Clone, Args)]
pub struct Server {
    /// Any database URL on the server; each scenario uses databases of its
    /// own named `shepherd_bench_*`, dropped and recreated
    #[arg(
        long = "bench-database-url",
        env = "SHEPHERD_BENCH_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/shepherd_bench",
        hide_env_values = true
    )]
    pub url: String,
}

impl Server {
    /// The URL of the scenario's database `shepherd_bench_<name>`.
    pub fn database(&self, name: &str) -> String {
        let (base, query) = match self.url.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (self.url.as_str(), None),
        };
        let server = match base.rsplit_once('/') {
            Some((server, _)) if server.contains("://") && !server.ends_with('/') => server,
            _ => base.trim_end_matches('/'),
        };
        let mut url = format!("{server}/shepherd_bench_{name}");
        if let Some(q) = query {
            url.push('?');
            url.push_str(q);
        }
        url
    }
}

#[derive(Debug, Args)]
pub struct AllBench {
    #[command(flatten)]
    pub server: Server,
    /// Smaller sizes and one repetition: a check that every scenario runs
    #[arg(long)]
    pub quick: bool,
    /// Where scenario 3 writes its timeline (CSV and SVG)
    #[arg(long, default_value = "docs/bench")]
    pub out: PathBuf,
}

pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::All(args) => all(args).await,
        BenchCommand::Queue(args) => pipeline::queue(args).await.map(drop),
        BenchCommand::ScaleOut(args) => pipeline::scale_out(args).await,
        BenchCommand::RateLimit(args) => rate::run(args).await,
        BenchCommand::Reconcile(args) => reconcile::run(args).await,
        BenchCommand::Events(args) => events::run(args).await,
        BenchCommand::Economy(args) => pipeline::economy(args).await,
        BenchCommand::Latency(args) => reconcile::latency(args).await,
        BenchCommand::Throttle(args) => pipeline::throttle(args).await,
        BenchCommand::Latitude(args) => latitude::run(args).await,
        BenchCommand::Converge(args) => latitude::converge(args).await,
        BenchCommand::Budget(args) => latitude::budget(args).await,
        BenchCommand::Fleet(args) => fleet::run(args).await,
        BenchCommand::NoopWorker(args) => pipeline::noop_worker(args).await,
        BenchCommand::ReconcileOnce(args) => reconcile::once(args).await,
    }
}

async fn all(args: AllBench) -> anyhow::Result<()> {
    let started = Instant::now();
    let server = args.server.clone();
    let q = args.quick;
    machine_info(&server).await;
    // 2,000 jobs a side: the backlog where the queue's own overhead shows
    // (at 20,000 both sides wait on the same table and the ratio flatters).
    let one_worker = pipeline::queue(pipeline::QueueBench {
        server: server.clone(),
        reservations: if q { 500 } else { 1_000 },
        repetitions: if q { 1 } else { 3 },
        worker_args: vec![],
    })
    .await?;
    pipeline::scale_out(pipeline::ScaleOutBench {
        server: server.clone(),
        reservations: if q { 500 } else { 1_000 },
        workers: vec![1, 2, 4],
        repetitions: 1,
        one_worker,
    })
    .await?;
    rate::run(rate::RateBench {
        server: server.clone(),
        reservations: if q { 100 } else { 300 },
        repetitions: if q { 1 } else { 3 },
        out: Some(args.out.clone()),
    })
    .await?;
    reconcile::run(reconcile::ReconcileBench {
        server: server.clone(),
        sizes: vec![1_000, 5_000, 10_000],
        repetitions: if q { 1 } else { 3 },
        per_page: shepherd::metal::client::PER_PAGE_DEFAULT,
    })
    .await?;
    reconcile::latency(reconcile::LatencyBench {
        server: server.clone(),
        // The seed model is 1,500 round trips in a row at 10,000.
        sizes: if q { vec![1_000] } else { vec![1_000, 10_000] },
        repetitions: if q { 1 } else { 3 },
        seed_repetitions: 1,
        latency_ms: 140,
        jitter_ms: 20,
    })
    .await?;
    events::run(events::EventsBench {
        server: server.clone(),
        events: if q { 100_000 } else { 1_000_000 },
        seconds: Duration::from_secs(if q { 3 } else { 10 }),
        repetitions: if q { 1 } else { 3 },
    })
    .await?;
    pipeline::economy(pipeline::EconomyBench {
        server: server.clone(),
        reservations: if q { 100 } else { 300 },
        repetitions: if q { 1 } else { 3 },
    })
    .await?;
    pipeline::throttle(pipeline::ThrottleBench {
        server: server.clone(),
        reservations: if q { 30 } else { 100 },
        probability: 0.2,
        retry_after_secs: 1,
        repetitions: 1,
    })
    .await?;
    latitude::run(latitude::LatitudeBench {
        server: server.clone(),
        machines: if q { 18 } else { 38 },
        workers: 3,
    })
    .await?;
    latitude::converge(latitude::ConvergeBench {
        server: server.clone(),
        from: if q { 6 } else { 20 },
        to: if q { 2 } else { 8 },
        new_pool: if q { 4 } else { 12 },
        workers: 3,
    })
    .await?;
    latitude::budget(latitude::BudgetBench {
        server,
        machines: if q { 20 } else { 40 },
        others: if q { 3_000 } else { 10_000 },
        workers: 3,
        rest: Duration::from_secs(if q { 60 } else { 120 }),
    })
    .await?;
    println!("\nall scenarios in {:.0?}", started.elapsed());
    Ok(())
}

/// What the figures were measured on.
async fn machine_info(server: &Server) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_owned())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or("unknown".to_owned(), |kb| {
            format!("{:.1} GiB", kb as f64 / 1024.0 / 1024.0)
        });
    println!("# machine: {cores} cores, {memory} memory");
    let url = server.database("info");
    let pg = async {
        shepherd::db::ensure_database(&url).await?;
        let pool = shepherd::db::connect(&url, 1).await?;
        let mut lines = vec![];
        for setting in [
            "server_version",
            "shared_buffers",
            "max_connections",
            "synchronous_commit",
            "fsync",
            "work_mem",
        ] {
            let v: String = sqlx::query_scalar("select current_setting($1)")
                .bind(setting)
                .fetch_one(&pool)
                .await?;
            lines.push(format!("{setting}={v}"));
        }
        pool.close().await;
        Ok::<_, anyhow::Error>(lines.join(", "))
    };
    match pg.await {
        Ok(s) => println!("# postgres: {s}"),
        Err(e) => println!("# postgres: unknown ({e:#})"),
    }
}

/// Median, min and max of a set of measurements.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Stats {
        let mut v: Vec<f64> = values.into_iter().collect();
        assert!(!v.is_empty(), "no measurements");
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len().is_multiple_of(2) {
            (v[mid - 1] + v[mid]) / 2.0
        } else {
            v[mid]
        };
        Stats {
            median,
            min: v[0],
            max: v[v.len() - 1],
        }
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = f.precision().unwrap_or(1);
        write!(
            f,
            "{:.p$} (min {:.p$}, max {:.p$})",
            self.median, self.min, self.max
        )
    }
}

/// The token every stage's fake expects. Not a secret: it only opens fakes
/// the benchmark itself started on localhost.
const TOKEN: &str = "bench-token";
const PUBLIC_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHNoZXBoZXJkLWJlbmNoLWtleQ bench";

/// How often a run checks whether it is done: each check counts rows in the
/// queue table, so it costs the database something; 250 ms is under 0.5 %
/// of the shortest timed run.
const POLL: Duration = Duration::from_millis(250);

/// This machine's Postgres runs with autovacuum off. A production server
/// has it on, and a queue table that is never vacuumed slows every fetch as
/// dead rows pile up; the runs stand in for autovacuum by vacuuming the
/// busy tables this often, on both sides of every comparison.
const VACUUM_EVERY: Duration = Duration::from_secs(10);

async fn vacuum(pool: &PgPool) -> anyhow::Result<()> {
    sqlx::raw_sql(
        "vacuum (analyze) apalis.jobs, apalis.workers, shepherd.pending_creations,
           shepherd.unassimilated_devices, shepherd.managed_machines, shepherd.limiters",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// One scenario run's world: a fresh database, a fake Metal API, and the
/// worker processes started against them.
pub struct Stage {
    pub pool: PgPool,
    pub url: String,
    pub fake: FakeMetal,
    dir: PathBuf,
    children: Children,
}

impl Stage {
    pub async fn new(server: &Server, name: &str, fake: FakeConfig) -> anyhow::Result<Stage> {
        let url = server.database(name);
        shepherd::db::recreate_database(&url).await?;
        // Named apart from the processes' own pools (`shepherd*`), so that
        // a scenario counting their connections does not count the bench's.
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect_with(shepherd::db::check_url(&url)?.application_name("bench"))
            .await
            .with_context(|| format!("connecting to {}", shepherd::db::describe_url(&url)))?;
        shepherd::db::migrate(&pool).await?;
        let fake = FakeMetal::start(
            FakeConfig {
                token: TOKEN.into(),
                ..fake
            },
            "127.0.0.1:0".parse().expect("a literal address"),
        )
        .await
        .context("cannot start the fake Metal API")?;
        let dir = std::env::temp_dir().join(format!(
            "shepherd-bench-{}-{name}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("key.pub"), PUBLIC_KEY)?;
        Ok(Stage {
            pool,
            url,
            fake,
            dir,
            children: Children::default(),
        })
    }

    /// Starts `shepherd ARGS` with the stage's database and fake in its
    /// environment; its output goes to a log file in the stage's directory.
    pub fn spawn(&mut self, args: &[&str]) -> anyhow::Result<()> {
        self.spawn_with_env(args, &[])
    }

    /// [`Stage::spawn`] with more environment.
    pub fn spawn_with_env(&mut self, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<()> {
        let n = self.children.len();
        let log = std::fs::File::create(self.dir.join(format!("process-{n}.log")))?;
        let child = self
            .command(args)?
            .envs(env.iter().copied())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("cannot start a worker process")?;
        self.children.push(child);
        Ok(())
    }

    /// `shepherd ARGS` with the stage's database and fake in its environment;
    /// `bench ARGS` runs this benchmark binary's own helper instead.
    pub fn command(&self, args: &[&str]) -> anyhow::Result<Command> {
        let exe = std::env::current_exe()?;
        let (program, args) = match args.split_first() {
            Some((&"bench", rest)) => (exe, rest),
            _ => (exe.with_file_name("shepherd"), args),
        };
        let mut c = Command::new(program);
        c.args(args)
            .env("DATABASE_URL", &self.url)
            .env("METAL_API_URL", self.fake.base_url())
            .env("METAL_PROJECT_ID", self.fake.project_id().to_string())
            .env("METAL_AUTH_TOKEN", TOKEN)
            .env("SHEPHERD_SSH_PUBLIC_KEY_FILE", self.dir.join("key.pub"))
            .env("SHEPHERD_LOG", "warn")
            .env_remove("SHEPHERD_LOG_FORMAT")
            .stdin(Stdio::null());
        Ok(c)
    }

    /// Runs `shepherd ARGS` with `env` to its end; its failure is the
    /// scenario's, with what it said.
    /// The stage's own folder (keys, the processes' logs).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    pub fn run_command(&self, env: &[(&str, &str)], args: &[&str]) -> anyhow::Result<()> {
        let out = self.command(args)?.envs(env.iter().copied()).output()?;
        anyhow::ensure!(
            out.status.success(),
            "shepherd {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// A shepherd worker without the API's minimum interval (the fake has
    /// no rate limit); `extra` sets the rest.
    pub fn spawn_worker(&mut self, extra: &[&str]) -> anyhow::Result<()> {
        let mut args = vec![
            "worker",
            "--metrics-listen",
            "127.0.0.1:0",
            "--skip-migrations",
            "--api-rate",
            "0s",
        ];
        args.extend_from_slice(extra);
        self.spawn(&args)
    }

    /// Polls `count_sql` until it reaches `target`; fails when a child
    /// exits early or `timeout` passes.
    pub async fn wait_for(
        &mut self,
        count_sql: &'static str,
        target: i64,
        timeout: Duration,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let mut vacuumed = Instant::now();
        loop {
            if vacuumed.elapsed() >= VACUUM_EVERY {
                vacuum(&self.pool).await?;
                vacuumed = Instant::now();
            }
            let n: i64 = sqlx::query_scalar(count_sql).fetch_one(&self.pool).await?;
            if n >= target {
                return Ok(started.elapsed());
            }
            for (i, c) in self.children.iter_mut().enumerate() {
                if let Some(status) = c.try_wait()? {
                    anyhow::bail!(
                        "process {i} exited early ({status}); see {}",
                        self.dir.join(format!("process-{i}.log")).display()
                    );
                }
            }
            anyhow::ensure!(
                started.elapsed() < timeout,
                "only {n} of {target} after {timeout:?}; logs in {}",
                self.dir.display()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Pages of device and reservation listings the fake has answered.
    pub fn list_calls(&self) -> u64 {
        self.fake.calls(Operation::FindProjectDevices)
            + self.fake.calls(Operation::FindProjectHardwareReservations)
    }

    pub async fn count(&self, sql: &'static str) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(sql).fetch_one(&self.pool).await?)
    }

    /// Lines of the processes' logs that contain any of `needles`.
    pub fn log_lines_matching(&self, needles: &[&str]) -> anyhow::Result<usize> {
        let mut n = 0;
        for i in 0..self.children.len() {
            let path = self.dir.join(format!("process-{i}.log"));
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            n += text
                .lines()
                .filter(|l| needles.iter().any(|k| l.contains(k)))
                .count();
        }
        Ok(n)
    }

    /// Stops every child (SIGTERM, then SIGKILL after a grace) and the fake.
    pub async fn finish(mut self) -> anyhow::Result<()> {
        for c in self.children.iter() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for c in self.children.iter_mut() {
            while c.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.pool.close().await;
        self.fake.shutdown().await;
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(())
    }
}

/// A scenario that fails (a process exits early, a wait times out) drops
/// its stage without `finish`: its processes are killed rather than left
/// to hold their database connections after the bench has exited.
#[derive(Default)]
struct Children(Vec<Child>);

impl std::ops::Deref for Children {
    type Target = Vec<Child>;
    fn deref(&self) -> &Vec<Child> {
        &self.0
    }
}

impl std::ops::DerefMut for Children {
    fn deref_mut(&mut self) -> &mut Vec<Child> {
        &mut self.0
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// This process's resident set now and at its peak, in bytes (Linux).
pub fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_databases_sit_beside_the_given_one() {
        let s = |url: &str| Server { url: url.into() };
        assert_eq!(
            s("postgres://u@h:5432/x").database("queue"),
            "postgres://u@h:5432/shepherd_bench_queue"
        );
        assert_eq!(
            s("postgres://u@h/x?sslmode=disable").database("a"),
            "postgres://u@h/shepherd_bench_a?sslmode=disable"
        );
        assert_eq!(
            s("postgres://u@h").database("a"),
            "postgres://u@h/shepherd_bench_a"
        );
    }

    #[test]
    fn stats_are_median_min_max() {
        let s = Stats::of([3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Stats::of([1.0, 2.0, 4.0, 10.0]).median, 3.0);
    }
}

/// What Postgres did for a run, from its own counters: transactions
/// committed and rolled back and backends started in the run's database
/// (`pg_stat_database`), and the CPU time of every Postgres process on
/// this machine, reaped backends included (through the postmaster's
/// children's time).
#[derive(Debug, Clone, Copy, Default)]
pub struct DbProfile {
    pub commits: i64,
    pub rollbacks: i64,
    pub sessions: i64,
    pub cpu_ms: f64,
}

impl DbProfile {
    /// Read now, for the database `pool` is connected to.
    pub async fn read(pool: &PgPool) -> anyhow::Result<DbProfile> {
        let (commits, rollbacks, sessions): (i64, i64, i64) = sqlx::query_as(
            "select xact_commit, xact_rollback, sessions from pg_stat_database
             where datname = current_database()",
        )
        .fetch_one(pool)
        .await
        .context("reading pg_stat_database")?;
        Ok(DbProfile {
            commits,
            rollbacks,
            sessions,
            cpu_ms: postgres_cpu_ms(),
        })
    }

    /// What happened between `self` and `later`, per job.
    pub fn per_job(&self, later: &DbProfile, jobs: i64) -> String {
        let n = jobs.max(1) as f64;
        format!(
            "commits {:.2}, rollbacks {:.2}, new backends {:.3}, Postgres CPU {:.2} ms",
            (later.commits - self.commits) as f64 / n,
            (later.rollbacks - self.rollbacks) as f64 / n,
            (later.sessions - self.sessions) as f64 / n,
            (later.cpu_ms - self.cpu_ms) / n
        )
    }
}

/// CPU time, in ms, of the processes named `postgres` (utime, stime and
/// their reaped children's), read from /proc; 0 where there is none.
fn postgres_cpu_ms() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    let mut ticks = 0u64;
    for entry in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if !head.ends_with("(postgres") {
            continue;
        }
        // Fields after the name: state is the 1st, utime the 12th, stime,
        // cutime and cstime the 13th to 15th.
        let fields: Vec<&str> = rest.split_whitespace().collect();
        ticks += fields
            .get(11..15)
            .map(|f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum())
            .unwrap_or(0);
    }
    // USER_HZ is 100 on Linux.
    ticks as f64 * 10.0
}
