//! `shepherd fake-metal`: the fake Metal API as a process, for the demo,
//! docker-compose and manual experiments.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use shepherd::config::parse_duration;
use shepherd::metal::Operation;
use shepherd_fakes::metal::{FakeConfig, FakeMetal, FaultKind, FaultRule, Faults};
use uuid::Uuid;

#[derive(Debug, Args)]
pub struct FakeMetalArgs {
    /// Address to listen on (port 0 picks a free one)
    #[arg(long, env = "FAKE_METAL_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,

    /// Project id the fake serves
    #[arg(long, env = "METAL_PROJECT_ID", default_value_t = FakeConfig::default().project_id)]
    project: Uuid,

    /// Token clients must send in X-Auth-Token (prefer the environment
    /// variable: a flag's value shows in `ps`)
    #[arg(long, env = "METAL_AUTH_TOKEN", hide_env_values = true)]
    token: String,

    /// Hardware reservations to create at start
    #[arg(long, env = "FAKE_METAL_RESERVATIONS", default_value_t = 40)]
    reservations: usize,

    /// Seed for generated ids, plans and metros
    #[arg(long, env = "FAKE_METAL_SEED", default_value_t = 1)]
    seed: u64,

    /// Every Nth reservation is not provisionable (0: none)
    #[arg(long, env = "FAKE_METAL_NOT_PROVISIONABLE_EVERY", default_value_t = 0)]
    not_provisionable_every: usize,

    /// Every Nth reservation is a spare (0: none)
    #[arg(long, env = "FAKE_METAL_SPARE_EVERY", default_value_t = 0)]
    spare_every: usize,

    /// Time a new device stays `queued`
    #[arg(long, env = "FAKE_METAL_PROVISIONING_DELAY", default_value = "1s", value_parser = parse_duration)]
    provisioning_delay: Duration,

    /// Time a device then stays `provisioning` before it is `active`
    #[arg(long, env = "FAKE_METAL_ACTIVE_DELAY", default_value = "5s", value_parser = parse_duration)]
    active_delay: Duration,

    /// Time a reservation stays unprovisionable after its device is deleted
    #[arg(long, env = "FAKE_METAL_WIPE_DELAY", default_value = "30s", value_parser = parse_duration)]
    wipe_delay: Duration,

    /// Latency added to every request
    #[arg(long, env = "FAKE_METAL_LATENCY", default_value = "0ms", value_parser = parse_duration)]
    latency: Duration,

    /// Random extra latency, up to this much
    #[arg(long, env = "FAKE_METAL_LATENCY_JITTER", default_value = "0ms", value_parser = parse_duration)]
    latency_jitter: Duration,

    /// Share of requests answered with --error-status (0 to 1)
    #[arg(long, env = "FAKE_METAL_ERROR_RATE", default_value_t = 0.0, value_parser = probability)]
    error_rate: f64,

    /// Status of injected errors
    #[arg(long, env = "FAKE_METAL_ERROR_STATUS", default_value_t = 503)]
    error_status: u16,

    /// Share of requests answered 429 with Retry-After
    #[arg(long, env = "FAKE_METAL_RATE_LIMIT_RATE", default_value_t = 0.0, value_parser = probability)]
    rate_limit_rate: f64,

    /// Retry-After of injected 429 answers, in seconds
    #[arg(long, env = "FAKE_METAL_RETRY_AFTER", default_value_t = 1)]
    retry_after: u64,

    /// Share of device creates that succeed but answer 500
    #[arg(long, env = "FAKE_METAL_ACCEPT_THEN_FAIL_RATE", default_value_t = 0.0, value_parser = probability)]
    accept_then_fail_rate: f64,

    /// Share of reservation reads before which another party takes the reservation
    #[arg(long, env = "FAKE_METAL_STEAL_RATE", default_value_t = 0.0, value_parser = probability)]
    steal_rate: f64,

    /// Further fault rules as JSON (a list of rules; see the fake's docs)
    #[arg(long, env = "FAKE_METAL_FAULTS_JSON")]
    faults_json: Option<String>,
}

pub(crate) fn probability(s: &str) -> Result<f64, String> {
    let p: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(format!("{s} is not between 0 and 1"))
    }
}

impl FakeMetalArgs {
    fn faults(&self) -> anyhow::Result<Faults> {
        let mut rules = Vec::new();
        let mut rule = |op: Option<Operation>, probability: f64, kind: FaultKind| {
            if probability > 0.0 {
                rules.push(FaultRule {
                    after: 0,
                    op,
                    probability,
                    remaining: None,
                    kind,
                });
            }
        };
        rule(
            Some(Operation::FindHardwareReservationById),
            self.steal_rate,
            FaultKind::StealReservation,
        );
        rule(
            Some(Operation::CreateDevice),
            self.accept_then_fail_rate,
            FaultKind::AcceptThenFail { status: 500 },
        );
        rule(
            None,
            self.rate_limit_rate,
            FaultKind::RateLimited {
                retry_after_secs: self.retry_after,
            },
        );
        rule(
            None,
            self.error_rate,
            FaultKind::Status {
                status: self.error_status,
            },
        );
        if let Some(json) = &self.faults_json {
            let extra: Vec<FaultRule> =
                serde_json::from_str(json).context("--faults-json is not a list of fault rules")?;
            rules.extend(extra);
        }
        Ok(Faults {
            latency_ms: self.latency.as_millis() as u64,
            latency_jitter_ms: self.latency_jitter.as_millis() as u64,
            rules,
        })
    }
}

pub async fn run(args: FakeMetalArgs) -> anyhow::Result<()> {
    if args.token.trim().is_empty() {
        anyhow::bail!("METAL_AUTH_TOKEN (or --token) is empty: the fake needs a token to check");
    }
    let config = FakeConfig {
        project_id: args.project,
        token: args.token.clone(),
        reservations: args.reservations,
        seed: args.seed,
        not_provisionable_every: args.not_provisionable_every,
        spare_every: args.spare_every,
        provisioning_delay: args.provisioning_delay,
        active_delay: args.active_delay,
        wipe_delay: args.wipe_delay,
        faults: args.faults()?,
    };
    let fake = FakeMetal::start(config, args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(
        url = %fake.base_url(),
        project = %args.project,
        reservations = args.reservations,
        "fake Metal API serving; admin API under /_fake/"
    );
    // Printed on stdout as well, so scripts can pick up the port when it was 0.
    println!("{}", fake.base_url());
    crate::services::shutdown::signalled().await;
    tracing::info!("stopping the fake Metal API");
    fake.shutdown().await;
    Ok(())
}
