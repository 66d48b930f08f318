//! `shepherd fake-latitude`: the fake Latitude.sh API as a process, for
//! manual experiments and, later, the demo and docker-compose.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use shepherd::config::parse_duration;
use shepherd_fakes::latitude::{
    Call, FakeConfig, FakeLatitude, FaultKind, FaultRule, Faults, PlanStock,
};

use super::fake_metal::probability;

#[derive(Debug, Args)]
pub struct FakeLatitudeArgs {
    /// Address to listen on (port 0 picks a free one)
    #[arg(long, env = "FAKE_LATITUDE_LISTEN", default_value = "127.0.0.1:8081")]
    listen: SocketAddr,

    /// Project id the fake serves (`proj_...`)
    #[arg(long, env = "LATITUDE_PROJECT", default_value_t = FakeConfig::default().project)]
    project: String,

    /// API key clients must send in Authorization, bare or as Bearer (prefer
    /// the environment variable: a flag's value shows in `ps`)
    #[arg(long, env = "LATITUDE_API_KEY", hide_env_values = true)]
    token: String,

    /// Stock at start, as PLAN@SITE=N pairs separated by commas
    /// (e.g. c2-small-x86@DAL=50,c2-small-x86@ASH=0); plans default to the
    /// United States
    #[arg(long, env = "FAKE_LATITUDE_STOCK", value_delimiter = ',')]
    stock: Vec<String>,

    /// Time a new server stays `deploying` before it is `on`
    #[arg(long, env = "FAKE_LATITUDE_DEPLOY_DELAY", default_value = "5s", value_parser = parse_duration)]
    deploy_delay: Duration,

    /// Reads allowed per key per minute (Latitude: 60)
    #[arg(long, env = "FAKE_LATITUDE_READS_PER_MINUTE", default_value_t = 60)]
    reads_per_minute: u32,

    /// Writes allowed per key per minute (Latitude: 20)
    #[arg(long, env = "FAKE_LATITUDE_WRITES_PER_MINUTE", default_value_t = 20)]
    writes_per_minute: u32,

    /// Latency added to every request
    #[arg(long, env = "FAKE_LATITUDE_LATENCY", default_value = "0ms", value_parser = parse_duration)]
    latency: Duration,

    /// Random extra latency, up to this much
    #[arg(long, env = "FAKE_LATITUDE_LATENCY_JITTER", default_value = "0ms", value_parser = parse_duration)]
    latency_jitter: Duration,

    /// Share of requests answered with --error-status (0 to 1)
    #[arg(long, env = "FAKE_LATITUDE_ERROR_RATE", default_value_t = 0.0, value_parser = probability)]
    error_rate: f64,

    /// Status of injected errors
    #[arg(long, env = "FAKE_LATITUDE_ERROR_STATUS", default_value_t = 503)]
    error_status: u16,

    /// Share of requests answered 429 with meta.retry_after, beside the
    /// real budget
    #[arg(long, env = "FAKE_LATITUDE_RATE_LIMIT_RATE", default_value_t = 0.0, value_parser = probability)]
    rate_limit_rate: f64,

    /// Share of creates that make the server but answer 500
    #[arg(long, env = "FAKE_LATITUDE_ACCEPT_THEN_FAIL_RATE", default_value_t = 0.0, value_parser = probability)]
    accept_then_fail_rate: f64,

    /// Further fault rules as JSON (a list of rules; see the fake's docs)
    #[arg(long, env = "FAKE_LATITUDE_FAULTS_JSON")]
    faults_json: Option<String>,
}

/// `PLAN@SITE=N` pairs into plans with their sites.
fn plans(pairs: &[String]) -> anyhow::Result<Vec<PlanStock>> {
    let mut plans: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
    for pair in pairs.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
        let parsed = pair.split_once('@').and_then(|(plan, rest)| {
            let (site, n) = rest.split_once('=')?;
            Some((plan, site, n.parse::<u32>().ok()?))
        });
        let Some((plan, site, n)) = parsed.filter(|(p, s, _)| !p.is_empty() && !s.is_empty())
        else {
            bail!("--stock {pair:?}: write PLAN@SITE=N, e.g. c2-small-x86@DAL=50");
        };
        plans
            .entry(plan.to_string())
            .or_default()
            .insert(site.to_uppercase(), n);
    }
    Ok(plans
        .into_iter()
        .map(|(slug, sites)| PlanStock {
            slug,
            country: "United States".into(),
            sites,
        })
        .collect())
}

impl FakeLatitudeArgs {
    fn faults(&self) -> anyhow::Result<Faults> {
        let mut faults = Faults::none().with_latency(
            self.latency.as_millis() as u64,
            self.latency_jitter.as_millis() as u64,
        );
        let mut add = |call: Option<Call>, probability: f64, kind: FaultKind| {
            if probability > 0.0 {
                let mut rule = FaultRule::new(kind).with_probability(probability);
                rule.op = call;
                faults.rules.push(rule);
            }
        };
        add(
            Some(Call::CreateServer),
            self.accept_then_fail_rate,
            FaultKind::AcceptThenFail { status: 500 },
        );
        add(
            None,
            self.rate_limit_rate,
            FaultKind::RateLimited {
                retry_after_secs: 1,
            },
        );
        add(
            None,
            self.error_rate,
            FaultKind::Status {
                status: self.error_status,
            },
        );
        if let Some(json) = &self.faults_json {
            let extra: Vec<FaultRule> =
                serde_json::from_str(json).context("--faults-json is not a list of fault rules")?;
            faults.rules.extend(extra);
        }
        Ok(faults)
    }
}

pub async fn run(args: FakeLatitudeArgs) -> anyhow::Result<()> {
    if args.token.trim().is_empty() {
        bail!("LATITUDE_API_KEY (or --token) is empty: the fake needs a key to check");
    }
    let defaults = FakeConfig::default();
    let config = FakeConfig {
        token: args.token.clone(),
        project: args.project.clone(),
        plans: if args.stock.is_empty() {
            defaults.plans.clone()
        } else {
            plans(&args.stock)?
        },
        deploy_delay: args.deploy_delay,
        reads_per_window: args.reads_per_minute,
        writes_per_window: args.writes_per_minute,
        rate_window: Duration::from_secs(60),
        faults: args.faults()?,
        ..defaults
    };
    let fake = FakeLatitude::start(config, args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(
        url = %fake.base_url(),
        project = %args.project,
        "fake Latitude.sh API serving; admin API under /_fake/"
    );
    println!("{}", fake.base_url());
    crate::services::shutdown::signalled().await;
    tracing::info!("stopping the fake Latitude.sh API");
    fake.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stock_pairs_parse_and_bad_ones_are_named() {
        let p = plans(&["c2-small-x86@dal=5".into(), "c2-small-x86@ASH=0".into()]).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].sites.get("DAL"), Some(&5));
        assert_eq!(p[0].sites.get("ASH"), Some(&0));
        for bad in ["c2-small-x86", "c2@DAL", "c2@DAL=x", "@DAL=1", "c2@=1"] {
            let e = plans(&[bad.into()]).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("PLAN@SITE=N"), "{e}");
        }
    }
}
