//! `shepherd worker` and `shepherd scheduler`: the long-running processes.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use shepherd::cluster::ClusterSettings;
use shepherd::config::parse_duration;
use shepherd::jobs::JobContext;
use shepherd::metal::ClientMetrics;

use crate::commands::database::DatabaseArgs;
use crate::services::runtime::{self, RuntimeOptions, Stop};
use crate::settings::{LatitudeArgs, MetalArgs, ProviderKind, ProvisionerArgs};

/// How long a stopping worker waits for its database connections to come
/// back before it exits without them.
const POOL_CLOSE: Duration = Duration::from_secs(5);

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// Which provider the jobs provision: every worker of a cluster must
    /// name the same one
    #[arg(long, env = "SHEPHERD_PROVIDER", value_enum, default_value_t = ProviderKind::Metal)]
    pub provider: ProviderKind,
    #[command(flatten)]
    pub metal: MetalArgs,
    #[command(flatten)]
    pub latitude: LatitudeArgs,
    #[command(flatten)]
    pub provisioner: ProvisionerArgs,

    /// Also run the scheduler in this process
    #[arg(long, env = "SHEPHERD_SCHEDULER")]
    pub scheduler: bool,

    /// Reconcile jobs run at once by this process
    #[arg(long, env = "SHEPHERD_RECONCILE_CONCURRENCY", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub reconcile_concurrency: u32,

    /// CreateDevice jobs run at once by this process
    #[arg(long, env = "SHEPHERD_CREATE_CONCURRENCY", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub create_concurrency: u32,

    /// Assimilate jobs run at once by this process
    #[arg(long, env = "SHEPHERD_ASSIMILATE_CONCURRENCY", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub assimilate_concurrency: u32,

    /// DeleteMachine jobs run at once by this process
    #[arg(long, env = "SHEPHERD_DELETE_CONCURRENCY", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub delete_concurrency: u32,

    /// How often a worker tells the queue it is alive
    #[arg(long, env = "SHEPHERD_HEARTBEAT", default_value = "5s", value_parser = parse_duration)]
    pub heartbeat: Duration,

    /// Missed heartbeats before a worker's jobs are handed to others
    #[arg(long, env = "SHEPHERD_MISSED_HEARTBEATS", default_value_t = 12)]
    pub missed_heartbeats: u32,

    /// Fallback poll for delayed jobs
    #[arg(long, env = "SHEPHERD_POLL_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub poll_interval: Duration,

    /// Time running jobs get to finish after SIGTERM
    #[arg(long, env = "SHEPHERD_DRAIN_TIMEOUT", default_value = "20s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// How long finished jobs stay in the queue table (events keep history)
    #[arg(long, env = "SHEPHERD_JOB_RETENTION", default_value = "7d", value_parser = parse_duration)]
    pub job_retention: Duration,

    /// Where this worker serves its status page, /metrics, /healthz and
    /// /readyz. Localhost by default: exposing it is a decision to make.
    #[arg(
        long,
        env = "SHEPHERD_METRICS_LISTEN",
        default_value = "127.0.0.1:9090"
    )]
    pub metrics_listen: std::net::SocketAddr,

    #[command(flatten)]
    pub console: ConsoleArgs,

    /// Do not apply migrations at start (run `shepherd migrate` with a
    /// privileged role instead, and the workers with a least-privilege one)
    #[arg(long, env = "SHEPHERD_SKIP_MIGRATIONS")]
    pub skip_migrations: bool,

    /// Database connections this process's queue and jobs may hold at
    /// once (each job holds one only while it talks to the database; the
    /// listener has 1 more, the pages --console-connections)
    #[arg(long, env = "SHEPHERD_DB_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..))]
    pub db_connections: Option<u32>,

    /// How often this worker looks for work in flight that no job will end
    #[arg(long, env = "SHEPHERD_SWEEP_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub sweep_interval: Duration,

    /// Hold no LISTEN connection: the queues find new jobs by polling every
    /// --poll-interval only (for PgBouncer in transaction mode, which
    /// cannot hold a LISTEN)
    #[arg(long, env = "SHEPHERD_NO_LISTEN")]
    pub no_listen: bool,
}

/// The pool the queue and the jobs share, by default. A job holds a
/// connection only while it talks to the database (leases, not locks held
/// in a session, guard its unit across provider calls), and the queue's
/// fetches, acknowledgements and heartbeats are a statement each, so the
/// pool need not grow with the concurrency: whoever finds both busy waits
/// a statement's time. Two, with the listener, is 3 a worker: twenty
/// workers and a scheduler fit a stock Postgres with room to spare
/// (BENCHMARKS.md, scenario 12).
pub const DEFAULT_DB_CONNECTIONS: u32 = 2;

impl WorkerArgs {
    /// The pool's size: the flag, or the default.
    pub fn db_connections(&self) -> u32 {
        self.db_connections.unwrap_or(DEFAULT_DB_CONNECTIONS)
    }

    /// The most connections this worker opens: its pool, its listener's
    /// and the pages'.
    pub fn connections_at_most(&self) -> u32 {
        let listen = if self.no_listen {
            0
        } else {
            shepherd::db::LISTEN_CONNECTIONS
        };
        self.db_connections() + listen + self.console.console_connections
    }

    /// The settings this worker proposes to the cluster: its provisioner
    /// flags, and the rescue window and API budgets its other flags give.
    fn proposal(&self) -> anyhow::Result<shepherd::config::ProvisionerConfig> {
        let mut config = self.provisioner.config_with(&self.metal)?;
        config.rescue = shepherd::config::Rescue {
            heartbeat: self.heartbeat,
            missed_heartbeats: self.missed_heartbeats,
            api_timeout: match self.provider {
                ProviderKind::Metal => self.metal.api_timeout,
                ProviderKind::Latitude => self.latitude.latitude_api_timeout,
            },
        };
        config.latitude_reads_per_minute = self.latitude.latitude_reads_per_minute;
        config.latitude_writes_per_minute = self.latitude.latitude_writes_per_minute;
        if self.provider == ProviderKind::Latitude
            && !crate::settings::explicit()
                .iter()
                .any(|k| k == "device_creation_rate")
        {
            // The seed's one creation every 5 s would hold a fill to 12 a
            // minute where the key allows 20: on Latitude the creation
            // rate is the key's write budget unless the operator says.
            config.device_creation_rate =
                crate::settings::latitude_creation_rate(config.latitude_writes_per_minute);
        }
        config.validate()?;
        if self.provider == ProviderKind::Latitude {
            config.rescue.validate_for_creates()?;
        }
        Ok(config)
    }
}

/// Says which settings this process runs with, and which of its flags the
/// cluster overrode.
pub fn report_settings(e: &shepherd::cluster::Established) {
    let s = &e.settings;
    tracing::info!(
        first = e.first,
        max_machines = %s.max_machines,
        chunk_size = s.chunk_size,
        assimilate = s.assimilate,
        device_creation_rate = %s.device_creation_rate,
        "cluster settings{}",
        if e.first { " recorded from this process's flags" } else { " adopted" }
    );
    for d in &e.disagreements {
        tracing::warn!("{d}");
    }
}

pub use shepherd::fleet::process_name;

/// Stops on SIGINT or SIGTERM.
pub fn stop_on_signal() -> Stop {
    let (tx, stop) = Stop::new();
    tokio::spawn(async move {
        crate::services::shutdown::signalled().await;
        tracing::info!("shutdown requested: no new jobs; draining running ones");
        let _ = tx.send(true);
        // A second signal means now.
        crate::services::shutdown::signalled().await;
        tracing::warn!("second signal: exiting at once");
        std::process::exit(130);
    });
    stop
}

pub async fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    // Every setting is checked before anything touches the API or the
    // database; the cluster's recorded values then replace the flags that
    // every worker must share.
    let mut config = args.proposal()?;
    let public_key = args.provisioner.public_key()?;
    match args.provider {
        ProviderKind::Metal => {
            args.metal.client_config()?;
        }
        ProviderKind::Latitude => {
            args.latitude.client_config()?;
            shepherd::latitude::pools::validate(&args.latitude.pools, &config.device_prefix)
                .map_err(anyhow::Error::msg)?;
        }
    }
    shepherd::db::check_url(&args.db.database_url)?;
    let operator = operator_token(args.console.operator_token_file.as_deref())?;

    let pool = args
        .db
        .connect_waiting(args.db_connections(), !args.skip_migrations)
        .await?;
    let established = shepherd::cluster::establish(
        &pool,
        &ClusterSettings::proposed_by(&config),
        crate::settings::explicit(),
        &format!("worker:{}", process_name()),
    )
    .await
    .context("cannot read or record the cluster's settings")?;
    report_settings(&established);
    // The rescue window and the budgets are the cluster's: a worker with
    // its own could hand a creation to a second run while the first is
    // still sending, or spend the key's budget twice.
    let cluster = &established.settings;
    config.settle_window = cluster.settle_window;
    config.rescue = cluster.rescue;
    config.latitude_reads_per_minute = cluster.latitude_reads_per_minute;
    config.latitude_writes_per_minute = cluster.latitude_writes_per_minute;
    if args.provider == ProviderKind::Latitude {
        config
            .rescue
            .validate_for_creates()
            .context("the cluster's rescue settings cannot be used")?;
    }
    let (provider_name, project) = match args.provider {
        ProviderKind::Metal => (
            shepherd::metal::provider::NAME,
            args.metal.project()?.to_string(),
        ),
        ProviderKind::Latitude => (
            shepherd::latitude::provider::NAME,
            args.latitude.client_config()?.project,
        ),
    };
    let (identity, differs) = shepherd::cluster::establish_identity(
        &pool,
        &shepherd::cluster::Identity {
            provider: provider_name.to_string(),
            project,
            device_prefix: config.device_prefix.clone(),
        },
        &format!("worker:{}", process_name()),
    )
    .await
    .context("cannot start this worker for this cluster")?;
    if let Some(d) = differs {
        tracing::warn!("{d}");
    }
    config.device_prefix = identity.device_prefix;
    let config = Arc::new(config);
    // The API client's figures carry the provider it speaks to.
    let client_metrics = ClientMetrics::for_provider(args.provider.name());
    let listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("--metrics-listen: cannot listen on {}", args.metrics_listen))?;
    // The pools are the cluster's: the first worker declares its flags'
    // pools, later ones adopt the cluster's and say which flags differ.
    let pools = match args.provider {
        ProviderKind::Metal => vec![],
        ProviderKind::Latitude => {
            let established = shepherd::pools::establish(
                &pool,
                &args.latitude.pools,
                &format!("worker:{}", process_name()),
            )
            .await
            .context("cannot read or declare the cluster's pools")?;
            for d in &established.differences {
                tracing::warn!("{d}");
            }
            let live = established.pools.iter().filter(|p| !p.removed).count();
            if live == 0 {
                tracing::warn!(
                    "the cluster has no pools: nothing is provisioned until one is declared \
                     (shepherd pools set NAME plan=...,site=...,count=N,os=... --reason \"...\")"
                );
            }
            tracing::info!(
                pools = live,
                first = established.first,
                "pools {}",
                if established.first {
                    "declared from this process's flags"
                } else {
                    "adopted from the cluster"
                }
            );
            established.pools
        }
    };
    let metal = MetalArgs {
        api_timeout: config.rescue.api_timeout,
        ..args.metal.clone()
    };
    let ctx = Arc::new(match args.provider {
        ProviderKind::Metal => JobContext::new(
            pool.clone(),
            metal.client(Some(&pool), client_metrics.clone())?,
            config.clone(),
            public_key,
        ),
        ProviderKind::Latitude => JobContext::with_provider(
            pool.clone(),
            Arc::new(
                args.latitude
                    .provider(&pool, &config, &pools, client_metrics.clone())?,
            ),
            config.clone(),
            public_key,
        ),
    });
    tracing::info!(
        provider = ctx.provider.name(),
        "provisioning through this provider"
    );
    let stop = stop_on_signal();
    // The status page stays up while jobs drain, and stops after them. It
    // is served from the start, so a provider that does not answer at
    // start-up leaves an operator something to look at.
    let (http_stop_tx, http_stop) = Stop::new();
    let job_metrics = runtime::JobMetrics::default();
    let pages =
        crate::commands::database::waiting_for_room(|| args.console.pages_pool(&args.db)).await?;
    let http = tokio::spawn(crate::services::http::serve(
        listener,
        crate::services::http::HttpState {
            pool: pages,
            work_pool: Some(pool.clone()),
            client_metrics,
            job_metrics: job_metrics.clone(),
            operator_token: operator.clone(),
            provider: Some(ctx.provider.clone()),
            edges: args.console.edges(),
            cluster_provider: None,
        },
        http_stop,
    ));
    // The provider's first answer: retried for as long as the client's
    // budget allows, and said at WARN within seconds while it does not come
    // (a wrong base URL, a closed service), not after minutes.
    let key = {
        let ensure = ctx.ensure_ssh_key();
        tokio::pin!(ensure);
        let stopped = stop.clone().wait();
        tokio::pin!(stopped);
        let started = tokio::time::Instant::now();
        let mut nag = tokio::time::interval_at(
            started + std::time::Duration::from_secs(5),
            std::time::Duration::from_secs(30),
        );
        loop {
            tokio::select! {
                r = &mut ensure => {
                    break r.map_err(|e| {
                        let hint = if e.not_found() {
                            " (a 404 at start-up is most often a wrong base URL: Metal's ends in \
                             /metal/v1, Latitude's is https://api.latitude.sh)"
                        } else {
                            ""
                        };
                        anyhow::anyhow!("cannot ensure the managed SSH key at the provider: {e}{hint}")
                    })?;
                }
                () = &mut stopped => {
                    tracing::info!("stopped before the provider answered");
                    let _ = http_stop_tx.send(true);
                    return Ok(());
                }
                _ = nag.tick() => tracing::warn!(
                    provider = ctx.provider.name(),
                    waited_s = started.elapsed().as_secs(),
                    "the provider has not answered the start-up check (the managed SSH key) yet; \
                     still trying. Check its base URL (Metal's ends in /metal/v1), the network \
                     and the API key; the status page is up meanwhile"
                ),
            }
        }
    };
    tracing::info!(key = %key, label = %config.ssh_key_label, "SSH key ensured");
    // The cluster's windows are timed by the database's clock; the queue's
    // heartbeats by this process's. Said at start, and in `status`.
    let offset = match shepherd::fleet::clock_offset_ms(&pool).await {
        Ok(ms) => Some(ms),
        Err(e) => {
            tracing::warn!(error = %e, "cannot compare this process's clock with the database's");
            None
        }
    };
    if let Some(ms) = offset.filter(|ms| ms.abs() > shepherd::fleet::CLOCK_OFF_MS) {
        tracing::error!(
            offset_ms = ms,
            "this process's clock is {:.1} s {} the database's: windows and deadlines are timed by \
             the database, but the queue's heartbeats carry this clock, so this worker looks dead \
             early (or live late) to the others. Fix its time synchronisation (NTP)",
            ms.unsigned_abs() as f64 / 1000.0,
            if ms > 0 { "ahead of" } else { "behind" },
        );
    }
    // A log restored or failed over is said at once, before any job runs.
    if let Err(e) = shepherd::jobs::moved::check(&pool).await {
        tracing::warn!(error = %e, "cannot check whether the database was restored or failed over; each pass checks again");
    }
    // What the console lists beside its queues: host, pid, release, start.
    if let Err(e) =
        shepherd::fleet::record_process(&pool, &process_name(), env!("CARGO_PKG_VERSION"), offset)
            .await
    {
        tracing::warn!(
            error = %e,
            "cannot record this process in shepherd.processes (re-run deploy/roles.sql after \
             migrating); the console lists it without its release and start"
        );
    }
    let opts = RuntimeOptions {
        process_name: process_name(),
        reconcile_concurrency: args.reconcile_concurrency as usize,
        create_concurrency: args.create_concurrency as usize,
        assimilate_concurrency: args.assimilate_concurrency as usize,
        delete_concurrency: args.delete_concurrency as usize,
        heartbeat: config.rescue.heartbeat,
        missed_heartbeats: config.rescue.missed_heartbeats,
        poll_interval: args.poll_interval,
        drain_timeout: args.drain_timeout,
        job_metrics,
        listen: !args.no_listen,
        outage: crate::services::outage::Outage::default(),
    };
    tracing::info!(process = %opts.process_name, scheduler = args.scheduler, "worker starting");
    let sweeper = tokio::spawn(crate::services::sweeper::run(
        pool.clone(),
        args.sweep_interval,
        stop.clone(),
        opts.outage.clone(),
    ));
    let scheduler = args.scheduler.then(|| {
        tokio::spawn(crate::services::scheduler::run(
            pool.clone(),
            config.reconcile_rate,
            args.job_retention,
            stop.clone(),
            opts.outage.clone(),
        ))
    });
    runtime::run(pool.clone(), ctx, opts, stop).await;
    if let Some(s) = scheduler {
        let _ = s.await;
    }
    let _ = sweeper.await;
    let _ = http_stop_tx.send(true);
    if let Ok(Err(e)) = http.await {
        tracing::warn!(error = %e, "the status page server failed");
    }
    // `close` waits for every connection to come back: one held by a
    // dropped job's statement that the server never answers would keep a
    // stopping process alive for good.
    if tokio::time::timeout(POOL_CLOSE, pool.close())
        .await
        .is_err()
    {
        tracing::warn!(
            waited_s = POOL_CLOSE.as_secs(),
            "database connections were still in use at exit; leaving them to the server"
        );
    } else {
        tracing::info!("worker exited cleanly");
    }
    Ok(())
}

/// The console: its credential, the names it answers, the proxies in front
/// of it and its own small share of the database.
#[derive(Debug, Clone, Args)]
pub struct ConsoleArgs {
    /// File holding the operator credential that turns on the pages'
    /// actions (pause, resume, enqueue a pass, clear a penalty, ...);
    /// without it the pages are read-only
    #[arg(long, env = "SHEPHERD_OPERATOR_TOKEN_FILE")]
    pub operator_token_file: Option<std::path::PathBuf>,
    /// A name the pages answer to (as in the browser's address bar, with
    /// or without a port), besides IP addresses and localhost; repeat or
    /// separate with commas
    #[arg(
        long = "console-host",
        env = "SHEPHERD_CONSOLE_HOSTS",
        value_delimiter = ','
    )]
    pub hosts: Vec<String>,
    /// The address of a proxy in front of the pages whose X-Forwarded-For
    /// says who is asking (for throttling wrong credentials per source);
    /// repeat or separate with commas
    #[arg(
        long = "console-trusted-proxy",
        env = "SHEPHERD_CONSOLE_TRUSTED_PROXIES",
        value_delimiter = ','
    )]
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// The Postgres URL the pages connect with (default: --database-url).
    /// Where workers connect as the least-privilege shepherd_worker role,
    /// which may not act, give the console shepherd_operator's URL
    /// (docs/security.md)
    #[arg(long, env = "SHEPHERD_CONSOLE_DATABASE_URL", hide_env_values = true)]
    pub console_database_url: Option<String>,
    /// Database connections the pages may hold, apart from the jobs'
    #[arg(long, env = "SHEPHERD_CONSOLE_CONNECTIONS", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=20))]
    pub console_connections: u32,
    /// The longest a page's query may run before it is cancelled; 0 sends
    /// none (behind PgBouncer, which refuses it: set one on the pages'
    /// role instead)
    #[arg(long, env = "SHEPHERD_CONSOLE_STATEMENT_TIMEOUT", default_value = "5s",
          value_parser = parse_duration)]
    pub console_statement_timeout: Duration,
}

impl ConsoleArgs {
    /// The pages' own pool, so that a heavy page waits on its own
    /// connections rather than the jobs' and heartbeats'.
    pub(crate) async fn pages_pool(&self, db: &DatabaseArgs) -> anyhow::Result<sqlx::PgPool> {
        Ok(shepherd::db::connect_pages(
            self.console_database_url
                .as_deref()
                .unwrap_or(&db.database_url),
            self.console_connections,
            self.console_statement_timeout,
        )
        .await?)
    }

    pub(crate) fn edges(&self) -> crate::services::http::Edges {
        crate::services::http::Edges {
            hosts: self.hosts.clone(),
            trusted_proxies: self.trusted_proxies.clone(),
        }
    }
}

/// The operator credential from its file, if one is configured. An empty
/// or unreadable file is an error, not a silently read-only console.
pub(crate) fn operator_token(
    path: Option<&std::path::Path>,
) -> anyhow::Result<Option<shepherd::secret::ApiToken>> {
    let Some(path) = path else { return Ok(None) };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--operator-token-file: cannot read {}", path.display()))?;
    let token = shepherd::secret::ApiToken::new(text.trim());
    if token.is_empty() {
        anyhow::bail!("--operator-token-file: {} is empty", path.display());
    }
    if let Some(why) = crate::services::http::too_weak(token.expose()) {
        anyhow::bail!("--operator-token-file: {}: {why}", path.display());
    }
    if !token
        .expose()
        .chars()
        .all(|c| c.is_ascii_graphic() && c != ';' && c != ',')
    {
        anyhow::bail!(
            "--operator-token-file: the credential must be printable ASCII without spaces, ';' or ','"
        );
    }
    Ok(Some(token))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Worker {
        #[command(flatten)]
        args: WorkerArgs,
    }

    /// The figure the docs give for a default worker, where they state the
    /// formula: each doc's sentence with "<N> with the defaults" in the
    /// `--db-connections` row.
    fn documented(doc: &str) -> u32 {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/");
        let text = std::fs::read_to_string(format!("{path}{doc}")).unwrap();
        let row = text
            .lines()
            .find(|l| l.starts_with("| `--db-connections") && l.contains("with the defaults"))
            .unwrap_or_else(|| panic!("{doc} has no --db-connections row with the defaults"));
        let before = &row[..row.find(" with the defaults").unwrap()];
        let digits: String = before
            .chars()
            .rev()
            .take_while(char::is_ascii_digit)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("{doc}: no figure before 'with the defaults': {row}"))
    }

    /// The most connections the docs give for a default worker is what a
    /// default worker opens at most, on either provider.
    #[test]
    fn the_docs_state_the_connections_a_default_worker_needs() {
        for provider in ["metal", "latitude"] {
            let parsed = Worker::try_parse_from([
                "shepherd",
                "--database-url",
                "postgres://localhost/x",
                "--provider",
                provider,
            ])
            .unwrap();
            let most = parsed.args.connections_at_most();
            for doc in ["operations.md", "configuration.md"] {
                assert_eq!(documented(doc), most, "{doc}, {provider}");
            }
            assert_eq!(parsed.args.db_connections(), DEFAULT_DB_CONNECTIONS);
        }
    }
}
