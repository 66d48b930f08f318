//! Flags and environment variables for the Metal API connection and the
//! provisioner, mapped onto the domain's typed settings. Defaults are the
//! seed's. The API token is read from the environment or a file, never from
//! a flag value that `ps` would show.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use shepherd::config::{
    ASSIMILATE_RETRY_DEFAULT, CREATE_RETRY_DEFAULT, ConfigError, JobRetry, ProvisionerConfig, Rate,
    parse_duration,
};
use shepherd::events::views::PenaltyPolicy;
use shepherd::limiter::{self, Limiter};
use shepherd::metal::client::{BASE_URL_DEFAULT, PER_PAGE_DEFAULT};
use shepherd::metal::discipline::PARALLELISM_DEFAULT;
use shepherd::metal::{ClientConfig, ClientMetrics, LocalPacer, MetalClient, Pacer, RetrySettings};
use shepherd::secret::ApiToken;
use sqlx::PgPool;
use uuid::Uuid;

/// The provisioner's defaults, the one source the flags' defaults come
/// from (durations, which have no display form, are written in the flags
/// and checked against these by a test).
fn defaults() -> ProvisionerConfig {
    ProvisionerConfig::default()
}

#[derive(Debug, Clone, Args)]
pub struct MetalArgs {
    /// Base URL of the Metal API
    #[arg(long, env = "METAL_API_URL", default_value = BASE_URL_DEFAULT)]
    pub metal_api_url: String,

    /// Allow an http:// API URL to another machine (a fake in another
    /// container); the token then crosses the network in the clear
    #[arg(long, env = "METAL_ALLOW_PLAIN_HTTP")]
    pub metal_allow_plain_http: bool,

    /// Project whose reservations shepherd provisions
    #[arg(long = "project", env = "METAL_PROJECT_ID")]
    pub project: Option<Uuid>,

    /// File holding the API token (else METAL_AUTH_TOKEN is read)
    #[arg(long, env = "METAL_AUTH_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,

    /// Metal API calls in flight at once, per process
    #[arg(long, env = "SHEPHERD_API_PARALLELISM", default_value_t = PARALLELISM_DEFAULT as u32, value_parser = clap::value_parser!(u32).range(1..))]
    pub api_parallelism: u32,

    /// Budget of API call starts across the cluster, INTERVAL,BURST: BURST
    /// calls at once, then BURST per INTERVAL (a bare INTERVAL means one
    /// call per INTERVAL); a 429 holds every process for as long as it asks
    #[arg(long, env = "SHEPHERD_API_RATE", default_value_t = shepherd::config::API_RATE_DEFAULT, value_parser = Rate::parse_or_interval)]
    pub api_rate: Rate,

    /// Budget of one API attempt
    #[arg(long, env = "SHEPHERD_API_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub api_timeout: Duration,

    /// Total time one API call may spend retrying transient failures
    #[arg(long, env = "SHEPHERD_API_RETRY_BUDGET", default_value = "15m", value_parser = parse_duration)]
    pub api_retry_budget: Duration,

    /// Page size of listings (1 to 1000)
    #[arg(long, env = "SHEPHERD_API_PER_PAGE", default_value_t = PER_PAGE_DEFAULT, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub per_page: u32,
}

impl MetalArgs {
    pub fn token(&self) -> anyhow::Result<ApiToken> {
        let token = match &self.token_file {
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("METAL_AUTH_TOKEN_FILE: cannot read {}", path.display()))?,
            None => std::env::var("METAL_AUTH_TOKEN").map_err(|_| {
                anyhow::anyhow!(
                    "METAL_AUTH_TOKEN: not set (set it, or point METAL_AUTH_TOKEN_FILE at a file holding the token)"
                )
            })?,
        };
        let token = ApiToken::new(token.trim());
        if token.is_empty() {
            bail!("METAL_AUTH_TOKEN: the token is empty");
        }
        Ok(token)
    }

    pub fn project(&self) -> anyhow::Result<Uuid> {
        self.project
            .context("METAL_PROJECT_ID (--project): not set; shepherd needs the project's id")
    }

    pub fn client_config(&self) -> anyhow::Result<ClientConfig> {
        let mut config = ClientConfig::new(&self.metal_api_url, self.project()?, self.token()?);
        config.allow_plain_http = self.metal_allow_plain_http;
        config.parallelism = self.api_parallelism as usize;
        config.api_rate = self.api_rate;
        config.attempt_timeout = self.api_timeout;
        config.per_page = self.per_page;
        config.retry = RetrySettings {
            max_elapsed: self.api_retry_budget,
            ..RetrySettings::default()
        };
        Ok(config)
    }

    /// A client whose minimum interval holds across every process sharing
    /// `pool` (or only this one, without a database).
    pub fn client(
        &self,
        pool: Option<&PgPool>,
        metrics: ClientMetrics,
    ) -> anyhow::Result<MetalClient> {
        let config = self.client_config()?;
        // With a database the pacer is the cluster's, even at a zero rate:
        // the cluster's api_rate can change while the process runs.
        let pacer: Arc<dyn Pacer> = match pool {
            Some(pool) => Arc::new(Limiter::new(
                pool.clone(),
                limiter::METAL_API,
                config.api_rate,
            )),
            _ => Arc::new(LocalPacer::new(config.api_rate)),
        };
        Ok(MetalClient::with_pacer(config, metrics, pacer)?)
    }
}

#[derive(Debug, Clone, Args)]
pub struct ProvisionerArgs {
    /// Hostname prefix of managed devices
    #[arg(long, env = "SHEPHERD_DEVICE_PREFIX", default_value_t = defaults().device_prefix)]
    pub device_prefix: String,

    /// OS slug for new devices
    #[arg(long, env = "SHEPHERD_OS", default_value_t = defaults().os)]
    pub os: String,

    /// Limit of managed machines plus creations in flight (0: no limit)
    #[arg(
        long,
        env = "SHEPHERD_MAX_MACHINES",
        default_value_t = defaults().max_machines,
        allow_negative_numbers = true
    )]
    pub max_machines: u64,

    /// Reservations one reconcile pass may take
    #[arg(
        long,
        env = "SHEPHERD_CHUNK_SIZE",
        default_value_t = defaults().chunk_size,
        allow_negative_numbers = true
    )]
    pub chunk_size: u64,

    /// Adopt prefixed devices shepherd does not manage instead of refusing to work
    #[arg(long, env = "SHEPHERD_ASSIMILATE")]
    pub assimilate: bool,

    /// Reconcile passes: INTERVAL,BURST
    #[arg(long, env = "SHEPHERD_RECONCILE_RATE", default_value_t = defaults().reconcile_rate)]
    pub reconcile_rate: Rate,

    /// Device creations across the cluster: INTERVAL,BURST (0s,1: no limit;
    /// with --provider latitude the default is the key's write budget, 3s,20)
    #[arg(long, env = "SHEPHERD_DEVICE_CREATION_RATE", default_value_t = defaults().device_creation_rate)]
    pub device_creation_rate: Rate,

    /// Label of the managed SSH key
    #[arg(long, env = "SHEPHERD_SSH_KEY_LABEL", default_value_t = defaults().ssh_key_label)]
    pub ssh_key_label: String,

    /// File with the public SSH key put on every device
    #[arg(long, env = "SHEPHERD_SSH_PUBLIC_KEY_FILE")]
    pub ssh_public_key_file: Option<PathBuf>,

    /// File with the key that signs an HTTP leave hook's requests
    /// (X-Shepherd-Signature: HMAC-SHA256 of TIMESTAMP.BODY)
    #[arg(long, env = "SHEPHERD_LEAVE_HOOK_SECRET_FILE")]
    pub leave_hook_secret_file: Option<PathBuf>,

    /// Penalty of a reservation whose creation failed
    #[arg(long, env = "SHEPHERD_PENALTY", default_value = "1h", value_parser = parse_duration)]
    pub penalty: Duration,

    /// Growth of the penalty per consecutive failure (1: fixed)
    #[arg(long, env = "SHEPHERD_PENALTY_FACTOR", default_value_t = defaults().penalty.factor)]
    pub penalty_factor: f64,

    /// Longest penalty when it grows
    #[arg(long, env = "SHEPHERD_PENALTY_MAX", default_value = "24h", value_parser = parse_duration)]
    pub penalty_max: Duration,

    /// Attempts of one device creation
    #[arg(long, env = "SHEPHERD_CREATE_ATTEMPTS", default_value_t = CREATE_RETRY_DEFAULT.max_attempts)]
    pub create_attempts: u32,

    /// First backoff between creation attempts (doubling, at most 10m)
    #[arg(long, env = "SHEPHERD_CREATE_BACKOFF", default_value = "30s", value_parser = parse_duration)]
    pub create_backoff: Duration,

    /// Budget of one creation attempt, limiter wait included
    #[arg(long, env = "SHEPHERD_CREATE_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub create_timeout: Duration,

    /// How long a creation whose answer was not seen holds its unit before
    /// a look that finds nothing is trusted (the provider's listings can lag
    /// behind its creates; see docs/providers.md)
    #[arg(long, env = "SHEPHERD_SETTLE_WINDOW", default_value = "5m", value_parser = parse_duration)]
    pub settle_window: Duration,

    /// Attempts of one assimilation
    #[arg(long, env = "SHEPHERD_ASSIMILATE_ATTEMPTS", default_value_t = ASSIMILATE_RETRY_DEFAULT.max_attempts)]
    pub assimilate_attempts: u32,

    /// First backoff between assimilation attempts (doubling, at most 5m)
    #[arg(long, env = "SHEPHERD_ASSIMILATE_BACKOFF", default_value = "5s", value_parser = parse_duration)]
    pub assimilate_backoff: Duration,
}

/// The cluster settings the operator gave by flag or environment in this
/// process (not left at their defaults): only those are reported when the
/// cluster's recorded value differs. Filled once by `main` from clap.
static EXPLICIT: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// Notes which cluster settings appear in `matches` (or any subcommand's)
/// by flag or environment variable.
pub fn note_explicit(matches: &clap::ArgMatches) {
    let mut found = Vec::new();
    let mut m = Some(matches);
    while let Some(current) = m {
        for key in shepherd::cluster::KEYS {
            if current.ids().any(|id| id.as_str() == *key)
                && matches!(
                    current.value_source(key),
                    Some(
                        clap::parser::ValueSource::CommandLine
                            | clap::parser::ValueSource::EnvVariable
                    )
                )
            {
                found.push(key.to_string());
            }
        }
        m = current.subcommand().map(|(_, sub)| sub);
    }
    let _ = EXPLICIT.set(found);
}

/// The creation rate a Latitude cluster gets when none is given: as many
/// creations a minute as the key's writes, all at once if need be (the
/// key's own window limiter then spaces them).
pub fn latitude_creation_rate(writes_per_minute: u32) -> shepherd::config::Rate {
    let writes = writes_per_minute.max(1);
    shepherd::config::Rate {
        interval: Duration::from_secs(60) / writes,
        burst: writes,
    }
}

pub fn explicit() -> &'static [String] {
    EXPLICIT.get().map(Vec::as_slice).unwrap_or(&[])
}

impl ProvisionerArgs {
    /// The settings these flags give, with `api_rate` from the API flags:
    /// for a new cluster its first settings, for a running one a proposal
    /// the cluster's recorded values override.
    pub fn config_with(&self, metal: &MetalArgs) -> Result<ProvisionerConfig, ConfigError> {
        let mut config = self.config()?;
        config.api_rate = metal.api_rate;
        Ok(config)
    }

    pub fn config(&self) -> Result<ProvisionerConfig, ConfigError> {
        if !(self.penalty_factor.is_finite() && self.penalty_factor >= 1.0) {
            return Err(ConfigError::new(
                "penalty factor (--penalty-factor)",
                format!("{} must be 1 or more", self.penalty_factor),
            ));
        }
        let leave_hook_secret = match &self.leave_hook_secret_file {
            None => None,
            Some(path) => {
                let what = "leave hook secret (--leave-hook-secret-file)";
                let text = std::fs::read_to_string(path).map_err(|e| {
                    ConfigError::new(what, format!("cannot read {}: {e}", path.display()))
                })?;
                let secret = shepherd::secret::ApiToken::new(text.trim());
                if secret.expose().len() < 16 {
                    return Err(ConfigError::new(
                        what,
                        format!(
                            "{} holds fewer than 16 characters: too short to sign with",
                            path.display()
                        ),
                    ));
                }
                Some(secret)
            }
        };
        let config = ProvisionerConfig {
            device_prefix: self.device_prefix.clone(),
            os: self.os.clone(),
            max_machines: self.max_machines,
            chunk_size: self.chunk_size,
            assimilate: self.assimilate,
            reconcile_rate: self.reconcile_rate,
            device_creation_rate: self.device_creation_rate,
            ssh_key_label: self.ssh_key_label.clone(),
            api_rate: shepherd::config::API_RATE_DEFAULT,
            penalty: PenaltyPolicy {
                initial: self.penalty,
                factor: self.penalty_factor,
                max: self.penalty_max.max(self.penalty),
            },
            create_retry: JobRetry {
                max_attempts: self.create_attempts,
                initial_backoff: self.create_backoff,
                timeout: self.create_timeout,
                ..CREATE_RETRY_DEFAULT
            },
            assimilate_retry: JobRetry {
                max_attempts: self.assimilate_attempts,
                initial_backoff: self.assimilate_backoff,
                ..ASSIMILATE_RETRY_DEFAULT
            },
            settle_window: self.settle_window,
            leave_hook_secret,
            ..ProvisionerConfig::default()
        };
        config.validate()?;
        Ok(config)
    }

    /// The public key to manage, read from its file.
    pub fn public_key(&self) -> anyhow::Result<String> {
        let path = self.ssh_public_key_file.as_ref().context(
            "SHEPHERD_SSH_PUBLIC_KEY_FILE (--ssh-public-key-file): not set; workers put this key on every device",
        )?;
        let key = std::fs::read_to_string(path).with_context(|| {
            format!(
                "SHEPHERD_SSH_PUBLIC_KEY_FILE: cannot read {}",
                path.display()
            )
        })?;
        let key = key.trim().to_string();
        if !key.starts_with("ssh-") && !key.starts_with("ecdsa-") {
            bail!(
                "SHEPHERD_SSH_PUBLIC_KEY_FILE: {} does not hold an OpenSSH public key",
                path.display()
            );
        }
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        provisioner: ProvisionerArgs,
        #[command(flatten)]
        metal: MetalArgs,
    }

    #[test]
    fn the_flags_defaults_are_the_configs() {
        // No flag given, and no SHEPHERD_* variable set by this test's runner.
        let flags = Flags::try_parse_from(["shepherd"]).unwrap();
        assert_eq!(
            flags.provisioner.config_with(&flags.metal).unwrap(),
            ProvisionerConfig::default()
        );
        assert_eq!(flags.metal.api_parallelism as usize, PARALLELISM_DEFAULT);
        assert_eq!(flags.metal.per_page, PER_PAGE_DEFAULT);
        assert_eq!(
            flags.metal.api_timeout,
            shepherd::metal::discipline::ATTEMPT_TIMEOUT_DEFAULT
        );
        assert_eq!(
            flags.metal.api_retry_budget,
            RetrySettings::default().max_elapsed
        );
        assert_eq!(flags.metal.metal_api_url, BASE_URL_DEFAULT);
    }
}

/// Which provider the jobs speak to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProviderKind {
    /// Equinix Metal (closed on 2026-06-30: its fake, `shepherd fake-metal`)
    Metal,
    /// Latitude.sh: pools of a plan in a site (`--pool`)
    Latitude,
}

/// Where and what to provision at Latitude.sh.
#[derive(Debug, Clone, Args)]
pub struct LatitudeArgs {
    /// Base URL of the Latitude.sh API
    #[arg(long, env = "LATITUDE_API_URL", default_value = shepherd::latitude::client::BASE_URL_DEFAULT)]
    pub latitude_api_url: String,

    /// Allow an http:// API URL to another machine (a fake in another
    /// container); the key then crosses the network in the clear
    #[arg(long, env = "LATITUDE_ALLOW_PLAIN_HTTP")]
    pub latitude_allow_plain_http: bool,

    /// Project (id or slug) whose servers shepherd keeps
    #[arg(long, env = "LATITUDE_PROJECT")]
    pub latitude_project: Option<String>,

    /// File holding the API key (else LATITUDE_API_KEY is read)
    #[arg(long, env = "LATITUDE_API_KEY_FILE")]
    pub latitude_key_file: Option<PathBuf>,

    /// A pool: name=NAME,plan=PLAN,site=SITE,count=N,os=OS[,ssh_keys=ID+ID];
    /// repeat the flag for more (or separate them with ';' in the variable)
    #[arg(long = "pool", env = "SHEPHERD_LATITUDE_POOLS", value_delimiter = ';', value_parser = clap::value_parser!(shepherd::latitude::Pool))]
    pub pools: Vec<shepherd::latitude::Pool>,

    /// Reads the key may start per minute, cluster-wide (Latitude: 60)
    #[arg(long, env = "LATITUDE_READS_PER_MINUTE", default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..))]
    pub latitude_reads_per_minute: u32,

    /// Writes the key may start per minute, cluster-wide (Latitude: 20)
    #[arg(long, env = "LATITUDE_WRITES_PER_MINUTE", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub latitude_writes_per_minute: u32,

    /// Budget of one Latitude API attempt; a worker needs it shorter than
    /// its rescue window (see `shepherd worker --help`, --heartbeat)
    #[arg(long, env = "LATITUDE_API_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub latitude_api_timeout: Duration,
}

impl LatitudeArgs {
    pub fn key(&self) -> anyhow::Result<ApiToken> {
        let key = match &self.latitude_key_file {
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("LATITUDE_API_KEY_FILE: cannot read {}", path.display()))?,
            None => std::env::var("LATITUDE_API_KEY").map_err(|_| {
                anyhow::anyhow!(
                    "LATITUDE_API_KEY: not set (set it, or point LATITUDE_API_KEY_FILE at a file holding the key)"
                )
            })?,
        };
        let key = ApiToken::new(key.trim());
        if key.is_empty() {
            bail!("LATITUDE_API_KEY: the key is empty");
        }
        Ok(key)
    }

    pub fn client_config(&self) -> anyhow::Result<shepherd::latitude::LatitudeConfig> {
        let project = self.latitude_project.clone().context(
            "LATITUDE_PROJECT (--latitude-project): not set; shepherd needs the project (a \
             command on a cluster whose worker has started uses the cluster's)",
        )?;
        let mut config =
            shepherd::latitude::LatitudeConfig::new(&self.latitude_api_url, project, self.key()?);
        config.attempt_timeout = self.latitude_api_timeout;
        config.allow_plain_http = self.latitude_allow_plain_http;
        Ok(config)
    }

    /// These arguments for a command on a cluster: its project the one it
    /// records when none is given, and one that differs refused, as a
    /// worker's is, rather than read as the cluster's (every place and
    /// server would then look foreign, or missing).
    pub fn for_cluster(&self, recorded: &Recorded) -> anyhow::Result<LatitudeArgs> {
        let mut args = self.clone();
        match (&self.latitude_project, &recorded.project) {
            (Some(given), Some(cluster)) if given != cluster => bail!(
                "this cluster provisions project {cluster}, and LATITUDE_PROJECT                  (--latitude-project) names {given}: leave it out (the cluster's is used) or                  name {cluster}"
            ),
            (None, Some(cluster)) => args.latitude_project = Some(cluster.clone()),
            _ => {}
        }
        Ok(args)
    }

    /// A client for this process alone (a command).
    pub fn client(&self) -> anyhow::Result<shepherd::latitude::LatitudeClient> {
        Ok(shepherd::latitude::LatitudeClient::new(
            self.client_config()?,
        )?)
    }

    /// The provider the jobs of a worker speak to: the key's budgets shared
    /// with every process of the cluster through `pool`.
    pub fn provider(
        &self,
        pool: &PgPool,
        config: &ProvisionerConfig,
        pools: &[shepherd::provider::pool::Declared],
        metrics: ClientMetrics,
    ) -> anyhow::Result<shepherd::latitude::provider::LatitudeProvider> {
        let mut client_config = self.client_config()?;
        client_config.attempt_timeout = config.rescue.api_timeout;
        client_config.metrics = metrics;
        let client = shepherd::latitude::LatitudeClient::for_cluster(
            client_config,
            pool.clone(),
            shepherd::latitude::Budgets {
                reads: config.latitude_reads_per_minute,
                writes: config.latitude_writes_per_minute,
                per: std::time::Duration::from_secs(60),
            },
        )?;
        let provider = shepherd::latitude::provider::LatitudeProvider::new(
            client,
            vec![],
            config.device_prefix.clone(),
        )
        .map_err(anyhow::Error::msg)?;
        use shepherd::provider::Provider;
        provider.set_pools(pools);
        Ok(provider)
    }
}

impl ProviderKind {
    /// Its name as the cluster records it, and as `--provider` takes it.
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::Metal => shepherd::metal::provider::NAME,
            ProviderKind::Latitude => shepherd::latitude::provider::NAME,
        }
    }

    pub fn from_name(name: &str) -> Option<ProviderKind> {
        match name {
            "metal" | "equinix" => Some(ProviderKind::Metal),
            "latitude" => Some(ProviderKind::Latitude),
            _ => None,
        }
    }
}

/// The provider a one-shot command speaks to: the one `--provider` names,
/// else the one the cluster records, with its flags.
#[derive(Debug, Clone, Args)]
pub struct ProviderArgs {
    /// The provider (default: the one the cluster records, else metal)
    #[arg(long, env = "SHEPHERD_PROVIDER", value_enum)]
    pub provider: Option<ProviderKind>,
    #[command(flatten)]
    pub metal: MetalArgs,
    #[command(flatten)]
    pub latitude: LatitudeArgs,
}

/// What the cluster records of itself, where it does.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    pub provider: Option<String>,
    pub device_prefix: Option<String>,
    pub project: Option<String>,
}

impl Recorded {
    pub async fn read(db: &PgPool) -> anyhow::Result<Recorded> {
        let rows: Vec<(String, serde_json::Value)> = sqlx::query_as(
            "select key, value from shepherd.cluster_settings
             where key in ('provider', 'device_prefix', 'project')",
        )
        .fetch_all(db)
        .await
        .map_err(crate::commands::database::explain)?;
        let get = |key: &str| {
            rows.iter()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| v.as_str().map(str::to_string))
        };
        Ok(Recorded {
            provider: get("provider"),
            device_prefix: get("device_prefix"),
            project: get("project"),
        })
    }

    pub fn prefix(&self) -> String {
        self.device_prefix
            .clone()
            .unwrap_or_else(|| ProvisionerConfig::default().device_prefix)
    }
}

impl ProviderArgs {
    /// The provider: `--provider`, else the cluster's; an error names both
    /// ways when neither says.
    pub fn kind(&self, recorded: &Recorded) -> anyhow::Result<ProviderKind> {
        if let Some(kind) = self.provider {
            if let Some(name) = &recorded.provider
                && ProviderKind::from_name(name) != Some(kind)
            {
                bail!(
                    "this cluster provisions {name}, not {}: leave --provider (SHEPHERD_PROVIDER) out, or name {name}",
                    kind.name()
                );
            }
            return Ok(kind);
        }
        match &recorded.provider {
            Some(name) => ProviderKind::from_name(name).with_context(|| {
                format!("the cluster records provider {name:?}, which this build does not know")
            }),
            // No worker has started yet: Metal, as `--provider` defaults.
            None => Ok(ProviderKind::Metal),
        }
    }

    /// A provider for this command alone (its own share of the budgets),
    /// with the cluster's prefix and pools.
    pub async fn provider(
        &self,
        db: &PgPool,
        os: &str,
    ) -> anyhow::Result<(ProviderKind, Arc<dyn shepherd::provider::Provider>)> {
        let recorded = Recorded::read(db).await?;
        let kind = self.kind(&recorded)?;
        let prefix = recorded.prefix();
        let provider: Arc<dyn shepherd::provider::Provider> = match kind {
            ProviderKind::Metal => Arc::new(shepherd::metal::provider::MetalProvider::new(
                self.metal.client(None, ClientMetrics::default())?,
                prefix,
                os.to_string(),
            )),
            ProviderKind::Latitude => {
                let provider = shepherd::latitude::provider::LatitudeProvider::new(
                    self.latitude.for_cluster(&recorded)?.client()?,
                    vec![],
                    prefix,
                )
                .map_err(anyhow::Error::msg)?;
                let pools = shepherd::pools::declared(db)
                    .await
                    .map_err(crate::commands::database::explain)?;
                use shepherd::provider::Provider;
                provider.set_pools(&pools);
                Arc::new(provider)
            }
        };
        Ok((kind, provider))
    }
}
