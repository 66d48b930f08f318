//! `shepherd scheduler`, which enqueues the passes (and serves the
//! console), and `shepherd healthcheck`, a container's probe.

use crate::commands::database::DatabaseArgs;
use crate::services::runtime::Stop;
use anyhow::Context;
use clap::Args;
use shepherd::config::parse_duration;
use shepherd::metal::ClientMetrics;
use std::time::Duration;

use super::worker::{ConsoleArgs, operator_token, stop_on_signal};

#[derive(Debug, Args)]
pub struct SchedulerArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// Reconcile passes: INTERVAL,BURST
    #[arg(long, env = "SHEPHERD_RECONCILE_RATE", default_value = "1m,1")]
    pub reconcile_rate: shepherd::config::Rate,
    /// How long finished jobs stay in the queue table (events keep history)
    #[arg(long, env = "SHEPHERD_JOB_RETENTION", default_value = "7d", value_parser = parse_duration)]
    pub job_retention: Duration,
    /// Where the scheduler serves the status page, /metrics, /healthz and
    /// /readyz (the same as a worker's), for probes and scrapes
    #[arg(
        long,
        env = "SHEPHERD_METRICS_LISTEN",
        default_value = "127.0.0.1:9091"
    )]
    pub metrics_listen: std::net::SocketAddr,
    #[command(flatten)]
    pub console: ConsoleArgs,
    /// Do not apply migrations at start (run `shepherd migrate` with the
    /// owner's role instead, and the scheduler with a least-privilege one)
    #[arg(long, env = "SHEPHERD_SKIP_MIGRATIONS")]
    pub skip_migrations: bool,
}

pub async fn scheduler(args: SchedulerArgs) -> anyhow::Result<()> {
    let operator = operator_token(args.console.operator_token_file.as_deref())?;
    let pool = args.db.connect_waiting(3, !args.skip_migrations).await?;
    let listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("--metrics-listen: cannot listen on {}", args.metrics_listen))?;
    let stop = stop_on_signal();
    let (http_stop_tx, http_stop) = Stop::new();
    let pages =
        crate::commands::database::waiting_for_room(|| args.console.pages_pool(&args.db)).await?;
    let http = tokio::spawn(crate::services::http::serve(
        listener,
        crate::services::http::HttpState {
            pool: pages,
            work_pool: Some(pool.clone()),
            // The scheduler makes no API calls and runs no jobs: its client
            // and job figures stay at 0.
            client_metrics: ClientMetrics::default(),
            job_metrics: Default::default(),
            operator_token: operator.clone(),
            provider: None,
            edges: args.console.edges(),
            // Read once: a cluster's provider is fixed when it starts.
            cluster_provider: crate::settings::Recorded::read(&pool)
                .await
                .ok()
                .and_then(|r| r.provider),
        },
        http_stop,
    ));
    crate::services::scheduler::run(
        pool,
        args.reconcile_rate,
        args.job_retention,
        stop,
        crate::services::outage::Outage::default(),
    )
    .await;
    let _ = http_stop_tx.send(true);
    match http.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "the status page stopped with an error"),
        Err(e) => tracing::warn!(error = %e, "the status page's task failed"),
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct HealthcheckArgs {
    /// The readiness probe to ask; by default /readyz on this process's
    /// own --metrics-listen port (SHEPHERD_METRICS_LISTEN), on loopback
    #[arg(long)]
    pub url: Option<String>,
    /// How long to wait for the answer
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// For container healthchecks: exits 0 when the local worker's or
/// scheduler's /readyz answers 200 (its database answers), 1 otherwise,
/// saying why. The runtime image has no curl; this needs nothing else.
pub async fn healthcheck(args: HealthcheckArgs) -> anyhow::Result<()> {
    let url = match args.url {
        Some(u) => u,
        None => {
            let listen = std::env::var("SHEPHERD_METRICS_LISTEN")
                .unwrap_or_else(|_| "127.0.0.1:9090".into());
            let addr: std::net::SocketAddr = listen.parse().with_context(|| {
                format!("SHEPHERD_METRICS_LISTEN {listen:?} is not an address such as 0.0.0.0:9090")
            })?;
            // A wildcard listen address is reached on loopback.
            let host = if addr.ip().is_unspecified() {
                "127.0.0.1".to_string()
            } else {
                addr.ip().to_string()
            };
            format!("http://{host}:{}/readyz", addr.port())
        }
    };
    let client = reqwest::Client::builder()
        .timeout(args.timeout)
        .build()
        .context("cannot build an HTTP client")?;
    let response = client
        .get(&url)
        .send()
        .await
        .with_context(|| format!("{url}: no answer"))?;
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    if !status.is_success() {
        anyhow::bail!("{url}: {status}: {}", body.trim());
    }
    Ok(())
}
