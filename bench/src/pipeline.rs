//! Scenarios 1, 2 and 6: the full pipeline (CreateDevice, Assimilate, their
//! events and view updates) against bare apalis, across worker processes,
//! and what it costs in API calls.

use std::sync::Arc;
use std::time::{Duration, Instant};

use apalis::prelude::*;
use apalis_postgres::{Config, PostgresStorage};
use clap::Args;
use serde::{Deserialize, Serialize};
use shepherd::config::{ProvisionerConfig, Rate};
use shepherd::jobs::JobContext;
use shepherd::metal::{ClientConfig, ClientMetrics, MetalClient, Operation};
use shepherd::secret::ApiToken;
use shepherd_fakes::metal::{FakeConfig, FaultKind, FaultRule, Faults, RequestRecord};

use super::{DbProfile, PUBLIC_KEY, Server, Stage, Stats, TOKEN};

/// Worker settings both sides of scenario 1 share: shepherd's defaults.
const CREATE_CONCURRENCY: usize = 4;
const ASSIMILATE_CONCURRENCY: usize = 4;
const POLL_INTERVAL: &str = "1s";
const DB_CONNECTIONS: &str = "24";

#[derive(Debug, Args)]
pub struct QueueBench {
    #[command(flatten)]
    pub server: Server,
    /// Reservations on shepherd's side (twice as many jobs on each side)
    #[arg(long, default_value_t = 10_000)]
    pub reservations: usize,
    #[arg(long, default_value_t = 3)]
    pub repetitions: usize,
    /// Extra flags for both sides' workers (tuning: --db-connections N,
    /// --create-concurrency N, --assimilate-concurrency N, --poll-interval D)
    #[arg(long = "worker-arg", allow_hyphen_values = true)]
    pub worker_args: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ScaleOutBench {
    #[command(flatten)]
    pub server: Server,
    #[arg(long, default_value_t = 10_000)]
    pub reservations: usize,
    /// Worker process counts to compare
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub workers: Vec<usize>,
    #[arg(long, default_value_t = 2)]
    pub repetitions: usize,
    /// Machines/s of one worker already measured on the same run (scenario
    /// 1's shepherd side), used instead of measuring it again
    #[arg(skip)]
    pub one_worker: Vec<f64>,
}

#[derive(Debug, Args)]
pub struct EconomyBench {
    #[command(flatten)]
    pub server: Server,
    #[arg(long, default_value_t = 300)]
    pub reservations: usize,
    #[arg(long, default_value_t = 3)]
    pub repetitions: usize,
}

/// The baseline: apalis-postgres with the settings shepherd's workers use
/// (batches of one, pubsub plus a fallback poll, the same pool and
/// concurrency), two queues like CreateDevice and Assimilate, and a handler
/// that does nothing.
#[derive(Debug, Args)]
pub struct NoopWorker {
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    #[arg(long = "create-concurrency", default_value_t = CREATE_CONCURRENCY)]
    concurrency_a: usize,
    #[arg(long = "assimilate-concurrency", default_value_t = ASSIMILATE_CONCURRENCY)]
    concurrency_b: usize,
    #[arg(long, default_value = POLL_INTERVAL, value_parser = shepherd::config::parse_duration)]
    poll_interval: Duration,
    #[arg(long, default_value = DB_CONNECTIONS)]
    db_connections: u32,
}

const NOOP_A: &str = "bench_noop_a";
const NOOP_B: &str = "bench_noop_b";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Noop {}

async fn noop(_: Noop) -> Result<String, BoxDynError> {
    Ok(String::new())
}

pub async fn noop_worker(args: NoopWorker) -> anyhow::Result<()> {
    let pool = shepherd::db::connect(&args.database_url, args.db_connections).await?;
    let stop = shepherd_workers::commands::worker::stop_on_signal();
    let worker = |queue: &'static str, concurrency: usize| {
        let backend = PostgresStorage::<Noop>::new(&pool)
            .with_config(
                Config::default()
                    .queue(queue)
                    .batch_size(1)
                    .heartbeat_interval(Duration::from_secs(5))
                    .missed_heartbeats(12),
            )
            .with_pubsub()
            .poll_with_interval(args.poll_interval);
        let stop = stop.clone();
        WorkerBuilder::new(format!("{queue}@{}", std::process::id()))
            .backend(backend)
            .concurrency(concurrency)
            .build(noop)
            .run_until(async move {
                stop.wait().await;
                Ok::<(), std::io::Error>(())
            })
    };
    let (a, b) = tokio::join!(
        worker(NOOP_A, args.concurrency_a),
        worker(NOOP_B, args.concurrency_b)
    );
    a?;
    b?;
    Ok(())
}

/// What one timed run did.
struct Run {
    seconds: f64,
    jobs: i64,
    machines: i64,
    calls: u64,
    list_calls: u64,
    key_calls: u64,
    creates: u64,
    retried: i64,
    requests: Vec<RequestRecord>,
    /// Postgres's work per job, as `DbProfile::per_job` words it.
    profile: String,
    /// From the first job's claim to the last one's end, as the queue's own
    /// rows stamp them: the run without the process's start (connecting,
    /// the cluster's settings, the provider's SSH key) and without the
    /// bench's polling for the end.
    span: f64,
}

/// [`Run::span`], read from the queue before the stage is dropped.
async fn span(pool: &sqlx::PgPool, kinds: &[&str]) -> anyhow::Result<f64> {
    let span: Option<f64> = sqlx::query_scalar(
        "select extract(epoch from max(done_at) - min(lock_at))::float8
         from apalis.jobs where status in ('Done', 'Killed') and job_type = any($1)",
    )
    .bind(kinds)
    .fetch_one(pool)
    .await?;
    // No stamps (or a run over within one clock tick) is a bench that
    // measured nothing, not an infinite rate.
    span.filter(|s| *s > 0.0)
        .ok_or_else(|| anyhow::anyhow!("the queue holds no claim and end stamps for {kinds:?}"))
}

const DONE_NOOP: &str = "select count(*) from apalis.jobs where status = 'Done'";
const DONE_SHEPHERD: &str = "select count(*) from apalis.jobs
     where job_type in ('create_device', 'assimilate') and status in ('Done', 'Killed')";
const MANAGED: &str = "select count(*) from shepherd.managed_machines";

async fn bare_run(
    server: &Server,
    jobs_per_queue: usize,
    worker_args: &[String],
) -> anyhow::Result<Run> {
    let mut stage = Stage::new(server, "queue_bare", FakeConfig::default()).await?;
    sqlx::query(
        "insert into apalis.jobs (id, job_type, job, status, attempts, max_attempts, run_at, priority)
         select apalis.generate_ulid(), q, convert_to('{}', 'UTF8'), 'Pending', 0, 25, now(), 0
         from generate_series(1, $1) i, unnest(array['bench_noop_a', 'bench_noop_b']) q",
    )
    .bind(jobs_per_queue as i64)
    .execute(&stage.pool)
    .await?;
    sqlx::query("analyze apalis.jobs")
        .execute(&stage.pool)
        .await?;
    let total = 2 * jobs_per_queue as i64;
    // Only the settings the baseline shares with a shepherd worker.
    let mut shared: Vec<String> = vec![];
    let mut extra = worker_args.iter();
    while let Some(flag) = extra.next() {
        if let (
            "--db-connections"
            | "--create-concurrency"
            | "--assimilate-concurrency"
            | "--poll-interval",
            Some(v),
        ) = (flag.as_str(), extra.next())
        {
            shared.push(flag.clone());
            shared.push(v.clone());
        }
    }
    let mut args = vec!["bench", "noop-worker"];
    args.extend(flags(
        &[
            ("--db-connections", DB_CONNECTIONS),
            ("--poll-interval", POLL_INTERVAL),
        ],
        &shared,
    ));
    let watch = shepherd::db::connect(&stage.url, 1).await?;
    let before = DbProfile::read(&watch).await?;
    let started = Instant::now();
    stage.spawn(&args)?;
    stage
        .wait_for(DONE_NOOP, total, Duration::from_secs(1800))
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu_end = DbProfile::read(&watch).await?.cpu_ms;
    let kinds: Vec<String> = sqlx::query_scalar("select distinct job_type from apalis.jobs")
        .fetch_all(&stage.pool)
        .await?;
    let kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
    let span = span(&stage.pool, &kinds).await?;
    stage.finish().await?;
    let profile = before.per_job(
        &DbProfile {
            cpu_ms: cpu_end,
            ..DbProfile::read(&watch).await?
        },
        total,
    );
    Ok(Run {
        seconds,
        jobs: total,
        machines: 0,
        calls: 0,
        list_calls: 0,
        key_calls: 0,
        creates: 0,
        retried: 0,
        requests: vec![],
        profile,
        span,
    })
}

/// Enqueues one CreateDevice per reservation the way a pass does, in this
/// process and before the clock starts, so both sides of scenario 1 begin
/// with a full queue.
async fn enqueue_pass(stage: &Stage, reservations: usize, api_rate: Rate) -> anyhow::Result<()> {
    let mut config = ClientConfig::new(
        stage.fake.base_url(),
        stage.fake.project_id(),
        ApiToken::new(TOKEN),
    );
    config.api_rate = api_rate;
    let metal = MetalClient::new(config, ClientMetrics::default())?;
    let provisioner = Arc::new(ProvisionerConfig {
        max_machines: 0,
        chunk_size: reservations as u64,
        device_creation_rate: Rate {
            interval: Duration::ZERO,
            burst: 1,
        },
        // The cluster's budget, which the workers adopt.
        api_rate,
        ..ProvisionerConfig::default()
    });
    shepherd::cluster::establish(
        &stage.pool,
        &shepherd::cluster::ClusterSettings::proposed_by(&provisioner),
        &[],
        "bench",
    )
    .await?;
    let ctx = JobContext::new(stage.pool.clone(), metal, provisioner, PUBLIC_KEY.into());
    let outcome = shepherd::jobs::reconcile::reconcile(&ctx, "bench").await?;
    anyhow::ensure!(
        outcome.enqueued.len() == reservations,
        "the pass enqueued {} of {reservations} creations ({outcome:?})",
        outcome.enqueued.len()
    );
    Ok(())
}

/// The `defaults` that `extra` does not set, then `extra`: a flag given
/// twice is an error to clap.
fn flags<'a>(defaults: &[(&'a str, &'a str)], extra: &'a [String]) -> Vec<&'a str> {
    let mut out = vec![];
    for (flag, value) in defaults {
        if !extra.iter().any(|e| e == flag) {
            out.push(*flag);
            out.push(*value);
        }
    }
    out.extend(extra.iter().map(String::as_str));
    out
}

fn fake_config(reservations: usize, faults: Faults) -> FakeConfig {
    FakeConfig {
        reservations,
        faults,
        ..FakeConfig::default()
    }
}

/// shepherd's side: a queue holding one CreateDevice per reservation, then
/// `workers` processes until every CreateDevice and its Assimilate is done.
async fn shepherd_run(
    server: &Server,
    name: &str,
    reservations: usize,
    workers: usize,
    faults: Faults,
    worker_args: &[String],
    api_rate: Rate,
) -> anyhow::Result<Run> {
    let mut stage = Stage::new(server, name, fake_config(reservations, faults)).await?;
    enqueue_pass(&stage, reservations, api_rate).await?;
    let total = 2 * reservations as i64;
    let args = flags(
        &[
            ("--max-machines", "0"),
            ("--device-creation-rate", "0s,1"),
            ("--db-connections", DB_CONNECTIONS),
            ("--poll-interval", POLL_INTERVAL),
        ],
        worker_args,
    );
    let watch = shepherd::db::connect(&stage.url, 1).await?;
    let before = DbProfile::read(&watch).await?;
    let started = Instant::now();
    for _ in 0..workers {
        stage.spawn_worker(&args)?;
    }
    stage
        .wait_for(DONE_SHEPHERD, total, Duration::from_secs(1800))
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    let cpu_end = DbProfile::read(&watch).await?.cpu_ms;
    let machines = stage.count(MANAGED).await?;
    anyhow::ensure!(
        machines == reservations as i64,
        "{machines} machines managed for {reservations} reservations"
    );
    let devices = stage.fake.devices().len();
    anyhow::ensure!(
        devices == reservations,
        "the fake holds {devices} devices for {reservations} reservations"
    );
    let retried = stage
        .count("select count(*) from shepherd.events where event_type = 'creation_attempt_failed'")
        .await?;
    let run = Run {
        seconds,
        jobs: total,
        machines,
        calls: stage.fake.total_calls(),
        // The pass's list pages count: every run shares them.
        list_calls: stage.list_calls(),
        key_calls: stage.fake.calls(Operation::FindProjectSshKeys)
            + stage.fake.calls(Operation::CreateProjectSshKey),
        creates: stage.fake.calls(Operation::CreateDevice),
        retried,
        requests: stage.fake.request_log(),
        profile: String::new(),
        span: span(&stage.pool, &["create_device", "assimilate"]).await?,
    };
    stage.finish().await?;
    // Counters are complete once the workers' backends have exited.
    let after = DbProfile::read(&watch).await?;
    Ok(Run {
        profile: before.per_job(
            &DbProfile {
                cpu_ms: cpu_end,
                ..after
            },
            total,
        ),
        ..run
    })
}

/// Scenario 1. Returns shepherd's machines/s per repetition, which is
/// scenario 2's one-worker point.
pub async fn queue(args: QueueBench) -> anyhow::Result<Vec<f64>> {
    let n = args.reservations;
    println!(
        "\n## Scenario 1: queue overhead ({} jobs a side, one worker process, {} repetitions, alternating)",
        2 * n,
        args.repetitions
    );
    if !args.worker_args.is_empty() {
        println!("worker flags: {}", args.worker_args.join(" "));
    }
    let (mut bare, mut full) = (vec![], vec![]);
    let (mut bare_span, mut full_span) = (vec![], vec![]);
    for rep in 0..args.repetitions.max(1) {
        // Alternate which side goes first, so drift favours neither.
        for side in if rep % 2 == 0 { [0, 1] } else { [1, 0] } {
            if side == 0 {
                let r = bare_run(&args.server, n, &args.worker_args).await?;
                println!(
                    "  rep {rep}: bare apalis  {:>7.0} jobs/s ({:.1} s; {:.0} jobs/s from first claim to last end); per job: {}",
                    r.jobs as f64 / r.seconds,
                    r.seconds,
                    r.jobs as f64 / r.span,
                    r.profile
                );
                bare.push(r.jobs as f64 / r.seconds);
                bare_span.push(r.jobs as f64 / r.span);
            } else {
                let r = shepherd_run(
                    &args.server,
                    "queue_shepherd",
                    n,
                    1,
                    Faults::none(),
                    &args.worker_args,
                    Rate::UNLIMITED,
                )
                .await?;
                println!(
                    "  rep {rep}: shepherd     {:>7.0} jobs/s ({:.1} s, {} machines; {:.0} jobs/s from first claim to last end); per job: {}",
                    r.jobs as f64 / r.seconds,
                    r.seconds,
                    r.machines,
                    r.jobs as f64 / r.span,
                    r.profile
                );
                full.push(r.jobs as f64 / r.seconds);
                full_span.push(r.jobs as f64 / r.span);
            }
        }
    }
    let b = Stats::of(bare.iter().copied());
    let s = Stats::of(full.iter().copied());
    let (bs, ss) = (
        Stats::of(bare_span.iter().copied()),
        Stats::of(full_span.iter().copied()),
    );
    println!(
        "| side | jobs/s, process start to last end: median (min, max) | jobs/s, first claim to last end |"
    );
    println!("|---|---|---|");
    println!("| bare apalis-postgres, no-op job | {b:.0} | {bs:.0} |");
    println!("| shepherd, CreateDevice + Assimilate | {s:.0} | {ss:.0} |");
    let ratios = Stats::of(full.iter().zip(&bare).map(|(s, b)| s / b));
    println!(
        "ratio shepherd / bare: {:.2} (per-repetition pairs: {ratios:.2}; goal >= 0.6, issue 31); from first claim to last end: {:.2}",
        s.median / b.median,
        ss.median / bs.median
    );
    Ok(full.iter().map(|jobs| jobs / 2.0).collect())
}

/// Scenario 2.
pub async fn scale_out(args: ScaleOutBench) -> anyhow::Result<()> {
    let n = args.reservations;
    println!(
        "\n## Scenario 2: scale-out ({n} reservations, {} repetitions, alternating)",
        args.repetitions
    );
    let mut rates: Vec<Vec<f64>> = vec![vec![]; args.workers.len()];
    for rep in 0..args.repetitions.max(1) {
        let order: Vec<usize> = if rep % 2 == 0 {
            (0..args.workers.len()).collect()
        } else {
            (0..args.workers.len()).rev().collect()
        };
        for i in order {
            let w = args.workers[i];
            if w == 1 && !args.one_worker.is_empty() {
                continue;
            }
            let r = shepherd_run(
                &args.server,
                "scale_out",
                n,
                w,
                Faults::none(),
                &[],
                Rate::UNLIMITED,
            )
            .await?;
            let rate = r.machines as f64 / r.seconds;
            println!(
                "  rep {rep}: {w} worker(s) {rate:>6.0} machines/s ({:.1} s)",
                r.seconds
            );
            rates[i].push(rate);
        }
    }
    if let Some(i) = args.workers.iter().position(|w| *w == 1)
        && !args.one_worker.is_empty()
    {
        println!(
            "  1 worker: scenario 1's shepherd runs, {:?} machines/s",
            args.one_worker
                .iter()
                .map(|r| r.round())
                .collect::<Vec<_>>()
        );
        rates[i] = args.one_worker.clone();
    }
    println!("| worker processes | machines/s: median (min, max) | speed-up |");
    println!("|---|---|---|");
    let base = Stats::of(rates[0].iter().copied()).median;
    for (i, w) in args.workers.iter().enumerate() {
        let s = Stats::of(rates[i].iter().copied());
        println!("| {w} | {s:.0} | {:.2}x |", s.median / base);
    }
    Ok(())
}

/// Scenario 6.
pub async fn economy(args: EconomyBench) -> anyhow::Result<()> {
    let n = args.reservations;
    println!(
        "\n## Scenario 6: API economy ({n} reservations, 3 worker processes, {} repetitions, alternating)",
        args.repetitions
    );
    let faulty = Faults::none()
        .with_rule(FaultRule::new(FaultKind::Status { status: 503 }).with_probability(0.10));
    let mut rows: [Vec<Run>; 2] = [vec![], vec![]];
    for rep in 0..args.repetitions.max(1) {
        for side in if rep % 2 == 0 { [0, 1] } else { [1, 0] } {
            let faults = if side == 0 {
                Faults::none()
            } else {
                faulty.clone()
            };
            let r =
                shepherd_run(&args.server, "economy", n, 3, faults, &[], Rate::UNLIMITED).await?;
            rows[side].push(r);
        }
    }
    println!(
        "| case | API calls per machine | without list pages and key | list pages | SSH key calls | createDevice calls | failed attempts recorded |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (side, name) in [(0, "no faults"), (1, "10 % transient 503s")] {
        let runs = &rows[side];
        let per = Stats::of(runs.iter().map(|r| r.calls as f64 / r.machines as f64));
        let own = Stats::of(
            runs.iter()
                .map(|r| (r.calls - r.list_calls - r.key_calls) as f64 / r.machines as f64),
        );
        let lists = Stats::of(runs.iter().map(|r| r.list_calls as f64));
        let keys = Stats::of(runs.iter().map(|r| r.key_calls as f64));
        let creates = Stats::of(runs.iter().map(|r| r.creates as f64));
        let retried = Stats::of(runs.iter().map(|r| r.retried as f64));
        println!(
            "| {name} | {per:.2} | {own:.2} | {lists:.0} | {keys:.0} | {creates:.0} | {retried:.0} |"
        );
    }
    println!(
        "(the seed made 3 calls per machine: list keys, create, and the reconcile's share of the lists)"
    );
    Ok(())
}

#[derive(Debug, Args)]
pub struct ThrottleBench {
    #[command(flatten)]
    pub server: Server,
    #[arg(long, default_value_t = 100)]
    pub reservations: usize,
    /// Share of calls the fake answers 429 with `Retry-After`
    #[arg(long, default_value_t = 0.2)]
    pub probability: f64,
    #[arg(long, default_value_t = 1)]
    pub retry_after_secs: u64,
    #[arg(long, default_value_t = 1)]
    pub repetitions: usize,
}

/// A call that reached the fake within this long after a 429 was answered
/// was already on its way (or its process had not heard yet): the client
/// cannot take back a request it sent before the answer arrived.
const IN_FLIGHT_GRACE: Duration = Duration::from_millis(50);

/// Scenario 8: three workers under a provider that answers 429 with
/// `Retry-After` to a share of all calls, at shepherd's default budget.
pub async fn throttle(args: ThrottleBench) -> anyhow::Result<()> {
    let n = args.reservations;
    println!(
        "\n## Scenario 8: a provider that pushes back ({n} reservations, 3 worker processes, {:.0} % of calls answered 429 with Retry-After {} s, default api_rate {})",
        args.probability * 100.0,
        args.retry_after_secs,
        shepherd::config::API_RATE_DEFAULT
    );
    let faults = Faults::none().with_rule(
        FaultRule::new(FaultKind::RateLimited {
            retry_after_secs: args.retry_after_secs,
        })
        .with_probability(args.probability),
    );
    let hold = Duration::from_secs(args.retry_after_secs);
    println!(
        "| rep | wall time, s | calls | 429s | calls inside a hold (after the {} ms grace) | most calls in one second | machines |",
        IN_FLIGHT_GRACE.as_millis()
    );
    println!("|---|---|---|---|---|---|---|");
    for rep in 0..args.repetitions.max(1) {
        let r = shepherd_run(
            &args.server,
            "throttle",
            n,
            3,
            faults.clone(),
            &[],
            shepherd::config::API_RATE_DEFAULT,
        )
        .await?;
        let mut log = r.requests;
        log.sort_by_key(|c| c.started);
        let throttled: Vec<_> = log.iter().filter(|c| c.status == 429).collect();
        let inside = log
            .iter()
            .filter(|c| {
                throttled.iter().any(|t| {
                    c.started > t.finished + IN_FLIGHT_GRACE && c.started < t.finished + hold
                })
            })
            .count();
        let busiest = log
            .iter()
            .enumerate()
            .map(|(i, c)| {
                log[i..]
                    .iter()
                    .take_while(|d| d.started < c.started + Duration::from_secs(1))
                    .count()
            })
            .max()
            .unwrap_or(0);
        println!(
            "| {rep} | {:.1} | {} | {} | **{inside}** | {busiest} | {} |",
            r.seconds,
            log.len(),
            throttled.len(),
            r.machines
        );
    }
    println!(
        "(goal: no call inside a hold; the budget allows at most 30 calls in any second: a bucket of 20 and 10/s)"
    );
    Ok(())
}
