//! `shepherd demo`: a whole shepherd cluster in one process, against the
//! fake Metal API (or, with `--provider latitude`, the fake Latitude.sh
//! API), in under a minute.
//!
//! It starts the fake with a realistic project (two metros, two plans, some
//! reservations not provisionable, a few creations that fail for good,
//! transient faults and accepted-then-failed creates), migrates a database
//! of its own, runs three workers and a scheduler with quick but visible
//! rates, prints progress every second, and ends with a summary drawn from
//! the views.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use shepherd::config::{JobRetry, ProvisionerConfig, Rate};
use shepherd::jobs::JobContext;
use shepherd::metal::{ClientConfig, ClientMetrics, MetalClient, Operation, RetrySettings};
use shepherd::secret::ApiToken;
use shepherd_fakes::metal::{FakeConfig, FakeMetal, FaultKind, FaultRule, Faults};
use sqlx::PgPool;

use crate::services::runtime::{self, RuntimeOptions, Stop};
use crate::settings::ProviderKind;

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// The demo's own database; it is dropped and recreated at start
    #[arg(
        long,
        env = "SHEPHERD_DEMO_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/shepherd_demo"
    )]
    pub database_url: String,

    /// Hardware reservations in the fake project
    #[arg(long, default_value_t = 40)]
    pub reservations: usize,

    /// Machines to provision at most
    #[arg(long, default_value_t = 30)]
    pub max_machines: u64,

    /// Worker processes to simulate
    #[arg(long, default_value_t = 3)]
    pub workers: usize,

    /// Give up waiting after this long
    #[arg(long, default_value = "50s", value_parser = shepherd::config::parse_duration)]
    pub timeout: Duration,

    /// Print progress lines
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub progress: bool,

    /// The provider to fake: Metal's reservations, or Latitude.sh's pools
    /// (four pools, one in a site without stock)
    #[arg(long, value_enum, default_value_t = ProviderKind::Metal)]
    pub provider: ProviderKind,
}

/// The fake the demo runs against.
enum Fake {
    Metal(FakeMetal),
    Latitude(shepherd_fakes::latitude::FakeLatitude),
}

impl Fake {
    fn total_calls(&self) -> u64 {
        match self {
            Fake::Metal(f) => f.total_calls(),
            Fake::Latitude(f) => f.total_calls(),
        }
    }

    fn errors(&self) -> u64 {
        match self {
            Fake::Metal(f) => f.request_log().iter().filter(|r| r.status >= 400).count() as u64,
            Fake::Latitude(f) => f.request_log().iter().filter(|r| r.status >= 400).count() as u64,
        }
    }
}

/// Latitude's demo: its faults, and budgets ten times the real ones (20
/// writes a minute would keep a 30-machine demo waiting for a minute and a
/// half; the budgets' own behaviour is tested in tests/latitude_client.rs).
fn latitude_fake(token: &str) -> shepherd_fakes::latitude::FakeConfig {
    use shepherd_fakes::latitude::{Call, FakeConfig, FaultKind, FaultRule, Faults};
    FakeConfig {
        token: token.into(),
        deploy_delay: Duration::from_secs(2),
        reads_per_window: 600,
        writes_per_window: 200,
        faults: Faults {
            latency_ms: 20,
            latency_jitter_ms: 40,
            rules: vec![
                FaultRule::on(Call::CreateServer, FaultKind::OtherPartyCreates).times(1),
                FaultRule::on(
                    Call::CreateServer,
                    FaultKind::AcceptThenFail { status: 500 },
                )
                .with_probability(0.08),
                FaultRule::new(FaultKind::Status { status: 503 }).with_probability(0.04),
                FaultRule::new(FaultKind::RateLimited {
                    retry_after_secs: 1,
                })
                .with_probability(0.01),
            ],
        },
        ..FakeConfig::default()
    }
}

/// The demo's pools: 28 places where the plans are in stock, and 2 in a
/// site with none (they wait).
fn latitude_pools() -> Vec<shepherd::latitude::Pool> {
    [
        "name=web,plan=c2-small-x86,site=DAL,count=12,os=ubuntu_24_04_x64_lts",
        "name=batch,plan=c2-small-x86,site=ASH,count=10,os=ubuntu_24_04_x64_lts",
        "name=db,plan=c3-medium-x86,site=SAO,count=6,os=ubuntu_24_04_x64_lts",
        "name=cold,plan=c2-small-x86,site=CHI,count=2,os=ubuntu_24_04_x64_lts",
    ]
    .iter()
    .map(|p| p.parse().expect("the demo's pools read"))
    .collect()
}

/// What the demo ended with, as read from the views.
#[derive(Debug, Clone)]
pub struct DemoSummary {
    pub elapsed: Duration,
    pub machines: i64,
    pub max_machines: u64,
    pub in_flight: i64,
    /// Unit and cause.
    pub penalised: Vec<(uuid::Uuid, String)>,
    /// What the provider's units are called: reservations, or places.
    pub units: &'static str,
    pub api_calls: u64,
    pub api_errors: u64,
    pub failed_attempts: i64,
    pub interrupted: bool,
}

struct Counts {
    managed: i64,
    in_flight: i64,
    penalised: i64,
    pending_jobs: i64,
    /// The last pass saw nothing in flight, had room, and found nothing to
    /// do, and no deletion has happened or is pending since.
    last_pass_idle: bool,
}

async fn counts(pool: &PgPool) -> Result<Counts, sqlx::Error> {
    let (managed, in_flight, penalised, pending_jobs): (i64, i64, i64, i64) = sqlx::query_as(
        "select (select count(*) from shepherd.managed_machines),
                (select count(*) from shepherd.in_flight),
                (select count(*) from shepherd.sinbin where now() <= until),
                (select count(*) from apalis.jobs where status in ('Pending', 'Queued', 'Running'))",
    )
    .fetch_one(pool)
    .await?;
    // Idle after the last deletion: a failed server deleted after the last
    // pass leaves a place that pass could not see free yet.
    let last_pass_idle: Option<bool> = sqlx::query_scalar(
        "select (body->>'enqueued')::bigint = 0 and (body->>'in_flight')::bigint = 0
                and not (body->>'at_limit')::bool
                and not exists (select 1 from shepherd.pending_deletions)
                and position > coalesce((select max(position) from shepherd.events
                                         where event_type in ('deletion_requested', 'machine_deleted',
                                                              'machine_lost', 'machine_released')), 0)
         from shepherd.events
         where event_type = 'reconcile_finished' order by position desc limit 1",
    )
    .fetch_optional(pool)
    .await?;
    Ok(Counts {
        managed,
        in_flight,
        penalised,
        pending_jobs,
        last_pass_idle: last_pass_idle.unwrap_or(false),
    })
}

fn demo_faults() -> Faults {
    Faults::default()
        .with_latency(20, 60)
        // Three creations refused for good: their reservations go to the sinbin.
        .with_rule(
            FaultRule::on(Operation::CreateDevice, FaultKind::Status { status: 422 })
                .times(3)
                .with_probability(0.3),
        )
        // Creates that happen but whose answer is lost: recovered by the witness.
        .with_rule(
            FaultRule::on(
                Operation::CreateDevice,
                FaultKind::AcceptThenFail { status: 500 },
            )
            .with_probability(0.08),
        )
        // Transient trouble anywhere.
        .with_rule(FaultRule::new(FaultKind::Status { status: 503 }).with_probability(0.04))
        .with_rule(
            FaultRule::new(FaultKind::RateLimited {
                retry_after_secs: 1,
            })
            .with_probability(0.01),
        )
}

async fn start_metal(args: &DemoArgs, token: &str) -> anyhow::Result<FakeMetal> {
    FakeMetal::start(
        FakeConfig {
            token: token.to_string(),
            reservations: args.reservations,
            not_provisionable_every: 8,
            spare_every: 10,
            provisioning_delay: Duration::from_millis(500),
            active_delay: Duration::from_secs(2),
            wipe_delay: Duration::from_secs(30),
            faults: demo_faults(),
            ..FakeConfig::default()
        },
        "127.0.0.1:0".parse().expect("a literal address"),
    )
    .await
    .context("cannot start the fake Metal API")
}

fn demo_database(e: shepherd::db::DbError) -> anyhow::Error {
    use shepherd::db::DbError;
    match e {
        DbError::Unreachable { target, reason } => anyhow::anyhow!(
            "cannot reach Postgres at {target}: {reason}. Start one (e.g. `docker compose up -d \
             postgres`, or install the postgresql package), or point the demo at one with \
             --database-url (SHEPHERD_DEMO_DATABASE_URL; the demo does not read DATABASE_URL)"
        ),
        DbError::Refused { target, reason } => anyhow::anyhow!(
            "the Postgres server at {target} refused the demo's connection: {reason}. Check the \
             user and password in --database-url (SHEPHERD_DEMO_DATABASE_URL; the demo does not \
             read DATABASE_URL)"
        ),
        other => other.into(),
    }
}

pub async fn run(args: DemoArgs, stop: Stop) -> anyhow::Result<DemoSummary> {
    let started = Instant::now();
    // The demo has a database of its own: its failures name its own flag,
    // not the DATABASE_URL every other command reads.
    shepherd::db::recreate_database(&args.database_url)
        .await
        .map_err(demo_database)?;
    let pool = shepherd::db::connect(&args.database_url, 32).await?;
    shepherd::db::migrate(&pool).await?;

    // A fresh token per run; SHEPHERD_DEMO_TOKEN sets a recognisable one (the
    // secrecy test greps every output for it).
    let token = std::env::var("SHEPHERD_DEMO_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
        .unwrap_or_else(|| format!("demo-{}", uuid::Uuid::new_v4()));
    let fake = match args.provider {
        ProviderKind::Metal => Fake::Metal(start_metal(&args, &token).await?),
        ProviderKind::Latitude => Fake::Latitude(
            shepherd_fakes::latitude::FakeLatitude::start(
                latitude_fake(&token),
                "127.0.0.1:0".parse().expect("a literal address"),
            )
            .await
            .context("cannot start the fake Latitude API")?,
        ),
    };

    let max_machines = match &fake {
        Fake::Metal(_) => args.max_machines,
        Fake::Latitude(_) => args.max_machines.min(30),
    };
    let quick = JobRetry {
        max_attempts: 4,
        initial_backoff: Duration::from_secs(1),
        factor: 2.0,
        max_backoff: Duration::from_secs(4),
        timeout: Duration::from_secs(20),
    };
    let config = Arc::new(ProvisionerConfig {
        max_machines,
        chunk_size: 8,
        reconcile_rate: Rate {
            interval: Duration::from_secs(2),
            burst: 1,
        },
        device_creation_rate: Rate {
            interval: Duration::from_millis(200),
            burst: 1,
        },
        create_retry: quick,
        // The fakes show a server the moment it is made: an unknown
        // creation need not wait the real service's five minutes.
        settle_window: Duration::from_secs(2),
        assimilate_retry: quick,
        api_rate: Rate::UNLIMITED,
        ..ProvisionerConfig::default()
    });
    config.validate()?;
    // The demo's database is new: its settings become the cluster's.
    shepherd::cluster::establish(
        &pool,
        &shepherd::cluster::ClusterSettings::proposed_by(&config),
        &[],
        "demo",
    )
    .await?;
    if matches!(fake, Fake::Latitude(_)) {
        // Its pools become the cluster's, which every job reads.
        shepherd::pools::establish(&pool, &latitude_pools(), "demo").await?;
    }
    let retry = RetrySettings {
        initial_interval: Duration::from_millis(100),
        max_interval: Duration::from_secs(1),
        max_elapsed: Duration::from_secs(5),
        ..RetrySettings::default()
    };

    // The workers stop on the demo's end or on the operator's Ctrl-C.
    let (stop_workers, workers_stop) = Stop::new();
    let mut tasks = Vec::new();
    for n in 0..args.workers.max(1) {
        let public_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHNoZXBoZXJkLWRlbW8ta2V5 demo";
        let ctx = Arc::new(match &fake {
            Fake::Metal(fake) => {
                let mut client_config =
                    ClientConfig::new(fake.base_url(), fake.project_id(), ApiToken::new(&token));
                client_config.api_rate = Rate::UNLIMITED;
                client_config.parallelism = 4;
                client_config.attempt_timeout = Duration::from_secs(5);
                client_config.retry = retry.clone();
                let metal = MetalClient::new(client_config, ClientMetrics::default())?;
                JobContext::new(pool.clone(), metal, config.clone(), public_key.into())
            }
            Fake::Latitude(fake) => {
                let mut client_config = shepherd::latitude::LatitudeConfig::new(
                    fake.base_url(),
                    fake.project(),
                    ApiToken::new(&token),
                );
                client_config.attempt_timeout = Duration::from_secs(5);
                client_config.retry = retry.clone();
                // Every worker shares the key's budgets through Postgres,
                // as real workers do.
                let client = shepherd::latitude::LatitudeClient::for_cluster(
                    client_config,
                    pool.clone(),
                    shepherd::latitude::Budgets {
                        reads: 600,
                        writes: 200,
                        per: Duration::from_secs(60),
                    },
                )?;
                let provider = shepherd::latitude::provider::LatitudeProvider::new(
                    client,
                    latitude_pools(),
                    config.device_prefix.clone(),
                )
                .map_err(anyhow::Error::msg)?;
                JobContext::with_provider(
                    pool.clone(),
                    Arc::new(provider),
                    config.clone(),
                    public_key.into(),
                )
            }
        });
        ctx.ensure_ssh_key()
            .await
            .context("the demo cannot ensure its SSH key")?;
        let opts = RuntimeOptions {
            process_name: format!("demo-{n}"),
            reconcile_concurrency: 1,
            create_concurrency: 4,
            assimilate_concurrency: 4,
            delete_concurrency: 2,
            heartbeat: Duration::from_secs(2),
            missed_heartbeats: 5,
            poll_interval: Duration::from_millis(250),
            drain_timeout: Duration::from_secs(5),
            job_metrics: Default::default(),
            listen: true,
            outage: Default::default(),
        };
        tasks.push(tokio::spawn(runtime::run(
            pool.clone(),
            ctx,
            opts,
            workers_stop.clone(),
        )));
    }
    tasks.push(tokio::spawn(crate::services::scheduler::run(
        pool.clone(),
        config.reconcile_rate,
        Duration::from_secs(7 * 86400),
        workers_stop.clone(),
        crate::services::outage::Outage::default(),
    )));

    let mut interrupted = false;
    loop {
        tokio::select! {
            _ = stop.clone().wait() => { interrupted = true; break; }
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let c = counts(&pool).await?;
        if args.progress {
            println!(
                "[{:>4.1}s] managed {:>3}/{} | in flight {:>2} | penalised {:>2} | jobs waiting {:>2} | API calls {:>4}",
                started.elapsed().as_secs_f64(),
                c.managed,
                max_machines,
                c.in_flight,
                c.penalised,
                c.pending_jobs,
                fake.total_calls()
            );
        }
        let nothing_left = c.in_flight == 0 && c.last_pass_idle;
        if (c.managed as u64 >= max_machines && c.in_flight == 0) || nothing_left {
            break;
        }
        if started.elapsed() > args.timeout {
            println!(
                "the demo did not settle within {:?}; stopping",
                args.timeout
            );
            break;
        }
    }
    let _ = stop_workers.send(true);
    let drained =
        tokio::time::timeout(Duration::from_secs(10), futures::future::join_all(tasks)).await;
    if drained.is_err() {
        tracing::warn!("workers did not drain within 10 s");
    }
    finish(&pool, &fake, max_machines, started, interrupted).await
}

async fn finish(
    pool: &PgPool,
    fake: &Fake,
    max_machines: u64,
    started: Instant,
    interrupted: bool,
) -> anyhow::Result<DemoSummary> {
    let c = counts(pool).await?;
    let penalised: Vec<(uuid::Uuid, String)> = sqlx::query_as(
        "select reservation_id, cause from shepherd.sinbin where now() <= until order by reservation_id",
    )
    .fetch_all(pool)
    .await?;
    let failed_attempts: i64 = sqlx::query_scalar(
        "select count(*) from shepherd.events where event_type = 'creation_attempt_failed'",
    )
    .fetch_one(pool)
    .await?;
    Ok(DemoSummary {
        units: match fake {
            Fake::Metal(_) => "reservations",
            Fake::Latitude(_) => "places",
        },
        elapsed: started.elapsed(),
        machines: c.managed,
        max_machines,
        in_flight: c.in_flight,
        penalised,
        api_calls: fake.total_calls(),
        api_errors: fake.errors(),
        failed_attempts,
        interrupted,
    })
}

pub fn print_summary(s: &DemoSummary, database_url: &str) {
    println!();
    println!(
        "== shepherd demo: {:.1?}{}",
        s.elapsed,
        if s.interrupted { " (interrupted)" } else { "" }
    );
    println!(
        "machines managed:   {} of max {}",
        s.machines, s.max_machines
    );
    println!("still in flight:    {}", s.in_flight);
    println!(
        "API calls:          {} ({} answered with an error and were retried or handled)",
        s.api_calls, s.api_errors
    );
    println!(
        "creation attempts that failed and were retried: {}",
        s.failed_attempts
    );
    println!("penalised {} ({}):", s.units, s.penalised.len());
    for (r, cause) in &s.penalised {
        println!("  {r}  {cause}");
    }
    let db = shepherd::db::describe_url(database_url);
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| {
            let cwd = std::env::current_dir().ok()?;
            Some(p.strip_prefix(&cwd).map(|r| r.to_path_buf()).unwrap_or(p))
        })
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "shepherd".into());
    println!();
    println!("Look further (the demo's database is {db}):");
    println!("  export DATABASE_URL={database_url}");
    println!("  {exe} status");
    println!("  {exe} machines");
    println!("  {exe} sinbin");
    println!("  {exe} events --last 30");
    println!("  {exe} views rebuild");
    println!("  psql $DATABASE_URL -c 'select * from shepherd.queue_depth'");
    println!("  psql $DATABASE_URL -c 'select * from shepherd.sinbin_now'");
}
