//! A fake Latitude.sh API: the part of it a provisioner uses, served over
//! real HTTP, faithful to Latitude's OpenAPI document (vendored as
//! `spec/latitude/openapi.json`) and to what the official SDK accepts.
//!
//! What makes it Latitude and not Metal:
//!
//! - JSON:API envelopes (`{"data": {"id", "type", "attributes"}}`), answers
//!   labelled `application/vnd.api+json`, errors as `{"errors": [..]}`;
//! - `Authorization: <key>`, bare or with `Bearer `;
//! - no reservations: capacity is stock per plan and site (`GET /plans`),
//!   taken by a create and given back by a delete; a create beyond it is
//!   `422 SERVERS_OUT_OF_STOCK`;
//! - no tags and no idempotency key on create: the hostname is the only
//!   mark a create carries, and `filter[hostname]` finds it (with the
//!   SDK's operators `[eql]`, `[prefix]`, `[suffix]` and `[match]`);
//! - pages by `page[number]`/`page[size]` with no total unless
//!   `stats[total]=count` is asked for;
//! - rate limits per key: reads and writes counted apart over a sliding
//!   window (60 and 20 per minute by default), a call over either answered
//!   429 with `errors[0].meta.retry_after`, and no `Retry-After` header (none
//!   was ever recorded from the real API).
//!
//! # Served
//!
//! | operation | method and path |
//! |---|---|
//! | `get-servers`, `create-server` | `GET`, `POST /servers` |
//! | `get-server`, `update-server`, `destroy-server` | `GET`, `PATCH`, `DELETE /servers/{id}` |
//! | `get-plans` | `GET /plans` |
//! | `get-ssh-keys`, `post-ssh-key` | `GET`, `POST /ssh_keys` |
//! | `get-ssh-key`, `put-ssh-key`, `delete-ssh-key` | `GET`, `PATCH`, `DELETE /ssh_keys/{id}` |
//! | `get-tags`, `create-tag` | `GET`, `POST /tags` |
//!
//! # Admin API
//!
//! Under `/_fake`, without a key: `GET`/`PUT /_fake/faults`, `GET`/`PUT
//! /_fake/weather` (listings that lag, plan answers without counts), `GET
//! /_fake/calls`, `GET /_fake/state` (servers as they are, stock, creates
//! that repeated a hostname), `PUT /_fake/stock` (`{"plan", "site",
//! "count"}`: stock that runs out, or comes back), `POST /_fake/servers`
//! (`{"project", "plan", "site", "hostname"}`: another project's server)
//! and `DELETE /_fake/servers/{id}` (the provider takes a server away).
//!
//! # Time
//!
//! A server is `deploying` for [`FakeConfig::deploy_delay`] after its
//! creation, then `on` (or `failed_deployment`, if a fault said so).
//! Computed when asked, from the wall clock.

mod routes;
#[cfg(test)]
mod tests;
mod world;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use std::{fmt, io};

use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::faults::AppliesTo;
use world::World;
pub use world::{HostnameOperators, Weather};

/// The calls the fake serves, by the document's `operationId`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Call {
    GetServers,
    CreateServer,
    GetServer,
    UpdateServer,
    DestroyServer,
    GetPlans,
    GetSshKeys,
    PostSshKey,
    GetSshKey,
    PutSshKey,
    DeleteSshKey,
    GetTags,
    CreateTag,
}

impl Call {
    pub const ALL: [Call; 13] = [
        Call::GetServers,
        Call::CreateServer,
        Call::GetServer,
        Call::UpdateServer,
        Call::DestroyServer,
        Call::GetPlans,
        Call::GetSshKeys,
        Call::PostSshKey,
        Call::GetSshKey,
        Call::PutSshKey,
        Call::DeleteSshKey,
        Call::GetTags,
        Call::CreateTag,
    ];

    /// The document's operationId.
    pub fn id(self) -> &'static str {
        match self {
            Call::GetServers => "get-servers",
            Call::CreateServer => "create-server",
            Call::GetServer => "get-server",
            Call::UpdateServer => "update-server",
            Call::DestroyServer => "destroy-server",
            Call::GetPlans => "get-plans",
            Call::GetSshKeys => "get-ssh-keys",
            Call::PostSshKey => "post-ssh-key",
            Call::GetSshKey => "get-ssh-key",
            Call::PutSshKey => "put-ssh-key",
            Call::DeleteSshKey => "delete-ssh-key",
            Call::GetTags => "get-tags",
            Call::CreateTag => "create-tag",
        }
    }

    /// Latitude counts reads and writes against separate limits.
    pub fn is_read(self) -> bool {
        matches!(
            self,
            Call::GetServers
                | Call::GetServer
                | Call::GetPlans
                | Call::GetSshKeys
                | Call::GetSshKey
                | Call::GetTags
        )
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// What a fired rule does to a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultKind {
    /// Answer with this status and an error body, without doing the work.
    Status {
        #[serde(default = "internal_error")]
        status: u16,
    },
    /// Answer 429 `RATE_LIMIT_EXCEEDED` with `meta.retry_after`, whatever
    /// the real budget says.
    RateLimited {
        #[serde(default = "one_second")]
        retry_after_secs: u64,
    },
    /// `create-server` and `destroy-server`: do the work, then answer with
    /// this status.
    AcceptThenFail {
        #[serde(default = "internal_error")]
        status: u16,
    },
    /// `create-server` only: the server is created and its deployment
    /// fails (`failed_deployment`).
    FailDeployment,
    /// `create-server` only: just before the request is handled, another
    /// party creates a server of the same plan in the same site (taking a
    /// unit of stock), under a hostname of its own.
    OtherPartyCreates,
    /// `create-server` only: just before the request is handled, the
    /// requested plan's stock in the requested site runs out.
    StockRunsOut,
    /// `create-server` and `destroy-server`: the origin does the work, and
    /// the gateway in front of it answers `status` (504 by default) with an
    /// HTML page, as Cloudflare does when an origin is slow; a new server
    /// stays out of every read (listings and its own GET) for `hidden_ms`.
    GatewayTimeout {
        #[serde(default = "gateway_timeout")]
        status: u16,
        #[serde(default)]
        hidden_ms: u64,
    },
    /// `create-server` only: refused for want of stock with a 422 that
    /// carries no code, only words (as some answers were seen).
    CodelessOutOfStock,
    /// `create-server` and `destroy-server`: the request reaches the origin
    /// `ms` late, and is then done and answered as usual. From the cluster's
    /// side this is a worker that stalled between its last check and the
    /// bytes leaving (a frozen VM, a stopped process, a slow connect).
    Held { ms: u64 },
    /// `get-server` only: answered 200 with the body of another server of
    /// the project (the newest other one), as a cache keyed wrongly would;
    /// with `no_project`, the body of the server asked for, without its
    /// `project`.
    WrongBody {
        #[serde(default)]
        no_project: bool,
    },
}

impl Default for FaultKind {
    fn default() -> Self {
        FaultKind::Status {
            status: internal_error(),
        }
    }
}

impl AppliesTo<Call> for FaultKind {
    fn applies_to(&self, call: Call) -> bool {
        match self {
            FaultKind::Status { .. } | FaultKind::RateLimited { .. } => true,
            FaultKind::AcceptThenFail { .. }
            | FaultKind::GatewayTimeout { .. }
            | FaultKind::Held { .. } => {
                matches!(call, Call::CreateServer | Call::DestroyServer)
            }
            FaultKind::FailDeployment
            | FaultKind::OtherPartyCreates
            | FaultKind::StockRunsOut
            | FaultKind::CodelessOutOfStock => call == Call::CreateServer,
            FaultKind::WrongBody { .. } => call == Call::GetServer,
        }
    }
}

fn internal_error() -> u16 {
    500
}

fn one_second() -> u64 {
    1
}

fn gateway_timeout() -> u16 {
    504
}

/// Everything the fake does wrong on purpose.
pub type Faults = crate::faults::Faults<Call, FaultKind>;
/// One way to fail, for one call or all of them.
pub type FaultRule = crate::faults::FaultRule<Call, FaultKind>;

/// A plan's stock: units left per site, and the sites where it exists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanStock {
    /// e.g. `c2-small-x86`.
    pub slug: String,
    /// The country its sites are in (Latitude groups stock by country).
    pub country: String,
    /// Site slug → units in stock; a site at 0 is available, out of stock.
    pub sites: BTreeMap<String, u32>,
}

/// How the fake starts out.
#[derive(Debug, Clone)]
pub struct FakeConfig {
    /// The API key every call must carry.
    pub token: String,
    /// The project's id (`proj_…`); its slug is [`FakeConfig::project_slug`].
    pub project: String,
    pub project_slug: String,
    pub plans: Vec<PlanStock>,
    pub seed: u64,
    pub deploy_delay: Duration,
    /// Reads and writes allowed per key within one `rate_window`.
    pub reads_per_window: u32,
    pub writes_per_window: u32,
    pub rate_window: Duration,
    pub faults: Faults,
    pub weather: Weather,
}

impl Default for FakeConfig {
    fn default() -> Self {
        let sites = |list: &[(&str, u32)]| {
            list.iter()
                .map(|(site, n)| (site.to_string(), *n))
                .collect::<BTreeMap<_, _>>()
        };
        FakeConfig {
            token: "fake-latitude-token".into(),
            project: "proj_fake0000000001".into(),
            project_slug: "shepherd".into(),
            plans: vec![
                PlanStock {
                    slug: "c2-small-x86".into(),
                    country: "United States".into(),
                    sites: sites(&[("DAL", 50), ("ASH", 20), ("CHI", 0)]),
                },
                PlanStock {
                    slug: "c3-medium-x86".into(),
                    country: "Brazil".into(),
                    sites: sites(&[("SAO", 10)]),
                },
            ],
            seed: 1,
            deploy_delay: Duration::ZERO,
            reads_per_window: 60,
            writes_per_window: 20,
            rate_window: Duration::from_secs(60),
            faults: Faults::default(),
            weather: Weather::default(),
        }
    }
}

/// One request as the fake saw it.
#[derive(Debug, Clone)]
pub struct RequestRecord {
    pub call: Call,
    pub method: String,
    pub path: String,
    pub status: u16,
    pub started: Instant,
    pub finished: Instant,
}

/// A server as tests read it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerSnapshot {
    pub id: String,
    pub project: String,
    pub hostname: String,
    pub plan: String,
    pub site: String,
    pub status: String,
    pub tags: Vec<String>,
    pub created_by_other: bool,
    /// Its deployment failed.
    pub failed: bool,
}

const REQUEST_LOG_LIMIT: usize = 10_000;

struct Shared {
    token: String,
    world: Mutex<World>,
    faults: Mutex<(Faults, StdRng)>,
    calls: Mutex<BTreeMap<Call, u64>>,
    log: Mutex<VecDeque<RequestRecord>>,
    budget: Mutex<Budget>,
}

/// The key's rate limits: when the calls of the last window were made.
struct Budget {
    window: Duration,
    reads: (u32, VecDeque<Instant>),
    writes: (u32, VecDeque<Instant>),
}

impl Budget {
    /// Counts a call, or says how many whole seconds until one fits.
    fn take(&mut self, read: bool, now: Instant) -> Result<(), u64> {
        let window = self.window;
        let (limit, calls) = if read {
            &mut self.reads
        } else {
            &mut self.writes
        };
        while calls
            .front()
            .is_some_and(|t| now.duration_since(*t) >= window)
        {
            calls.pop_front();
        }
        if calls.len() < *limit as usize {
            calls.push_back(now);
            return Ok(());
        }
        let oldest = calls.front().copied().unwrap_or(now);
        let left = window.saturating_sub(now.duration_since(oldest));
        Err(left.as_secs_f64().ceil().max(1.0) as u64)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn world(&self) -> MutexGuard<'_, World> {
        lock(&self.world)
    }

    fn authorized(&self, value: Option<&str>) -> bool {
        let Some(value) = value else { return false };
        let key = value.strip_prefix("Bearer ").unwrap_or(value);
        key == self.token
    }

    fn pick_fault(&self, call: Call) -> Option<FaultKind> {
        let mut dice = lock(&self.faults);
        let (faults, rng) = &mut *dice;
        faults.pick(call, rng)
    }

    fn latency(&self) -> Duration {
        let mut dice = lock(&self.faults);
        let (faults, rng) = &mut *dice;
        Duration::from_millis(faults.latency(rng))
    }

    fn record(&self, record: RequestRecord) {
        *lock(&self.calls).entry(record.call).or_default() += 1;
        let mut log = lock(&self.log);
        if log.len() == REQUEST_LOG_LIMIT {
            log.pop_front();
        }
        log.push_back(record);
    }
}

/// A running fake; dropping it stops the server.
pub struct FakeLatitude {
    shared: Arc<Shared>,
    addr: SocketAddr,
    project: String,
    stop: oneshot::Sender<()>,
    server: JoinHandle<io::Result<()>>,
}

impl fmt::Debug for FakeLatitude {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeLatitude")
            .field("addr", &self.addr)
            .field("project", &self.project)
            .finish_non_exhaustive()
    }
}

impl FakeLatitude {
    /// Binds `listen` (port 0 picks a free port) and serves in a task.
    pub async fn start(config: FakeConfig, listen: SocketAddr) -> io::Result<FakeLatitude> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let project = config.project.clone();
        let shared = Arc::new(Shared {
            token: config.token.clone(),
            faults: Mutex::new((
                config.faults.clone(),
                StdRng::seed_from_u64(config.seed.rotate_left(32) ^ 0x1a7),
            )),
            calls: Mutex::new(BTreeMap::new()),
            log: Mutex::new(VecDeque::new()),
            budget: Mutex::new(Budget {
                window: config.rate_window,
                reads: (config.reads_per_window, VecDeque::new()),
                writes: (config.writes_per_window, VecDeque::new()),
            }),
            world: Mutex::new(World::new(&config)),
        });
        let (stop, server) = crate::spawn_server(listener, routes::router(Arc::clone(&shared)));
        Ok(FakeLatitude {
            shared,
            addr,
            project,
            stop,
            server,
        })
    }

    /// Stops accepting, lets requests in progress finish, and waits.
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        if let Err(e) = self.server.await {
            tracing::warn!(error = %e, "the fake Latitude API's server task failed");
        }
    }

    /// e.g. `http://127.0.0.1:PORT`; Latitude's API has no path prefix.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn project(&self) -> &str {
        &self.project
    }

    pub fn set_faults(&self, faults: Faults) {
        lock(&self.shared.faults).0 = faults;
    }

    /// Sets a plan's stock in a site (the site becomes available if new).
    pub fn set_stock(&self, plan: &str, site: &str, count: u32) -> bool {
        self.shared.world().set_stock(plan, site, count)
    }

    pub fn stock(&self, plan: &str, site: &str) -> Option<u32> {
        self.shared.world().stock(plan, site)
    }

    /// Every live server of the team, as it is (not as the lagging
    /// listings show it).
    pub fn servers(&self) -> Vec<ServerSnapshot> {
        self.shared.world().snapshot(Instant::now())
    }

    pub fn set_weather(&self, weather: Weather) {
        self.shared.world().weather = weather;
    }

    pub fn weather(&self) -> Weather {
        self.shared.world().weather.clone()
    }

    /// The provider takes a server away (deleted in its console, reclaimed
    /// after a failed order): it is gone from every read at once, and the
    /// listings follow as they lag. False if there is no such server.
    pub fn reclaim(&self, id: &str) -> bool {
        let mut world = self.shared.world();
        match world.find(id) {
            Some(i) => {
                world.delete(i);
                true
            }
            None => false,
        }
    }

    /// A server's deployment fails (`failed_deployment` from now on), as
    /// a reinstall or a bad disk can make one. False if there is no such
    /// server.
    pub fn fail_server(&self, id: &str) -> bool {
        let mut world = self.shared.world();
        match world.find(id) {
            Some(i) => {
                world.servers[i].failed = true;
                true
            }
            None => false,
        }
    }

    /// Sets a server's status to any word (`off`, `rescue_mode`,
    /// `unknown`, `disk_erasing`, a word the document never listed), as
    /// its owner or the provider can; `None` hands it back to its
    /// deployment's course. False if there is no such server.
    pub fn set_status(&self, id: &str, status: Option<&str>) -> bool {
        let mut world = self.shared.world();
        match world.find(id) {
            Some(i) => {
                world.servers[i].status = status.map(str::to_string);
                true
            }
            None => false,
        }
    }

    /// Moves a server's `created_at` back by `age`, as a server made long
    /// ago shows it. False if there is no such server.
    pub fn age_server(&self, id: &str, age: Duration) -> bool {
        let mut world = self.shared.world();
        match world.find(id) {
            Some(i) => {
                let age = chrono::TimeDelta::from_std(age).unwrap_or(chrono::TimeDelta::MAX);
                let s = &mut world.servers[i];
                s.created_at = s.created_at.checked_sub_signed(age).unwrap_or(s.created_at);
                true
            }
            None => false,
        }
    }

    /// Keeps a server out of listings (not out of its own GET) for `for_`,
    /// as a stale cached page would. False if there is no such server.
    pub fn omit_from_listings(&self, id: &str, for_: Duration) -> bool {
        let mut world = self.shared.world();
        match world.find(id) {
            Some(i) => {
                world.servers[i].listed_from = Instant::now() + for_;
                true
            }
            None => false,
        }
    }

    /// A server of another project of the same team; returns its id.
    pub fn add_foreign_server(
        &self,
        project: &str,
        plan: &str,
        site: &str,
        hostname: &str,
    ) -> String {
        self.shared
            .world()
            .add_foreign(project, plan, site, hostname)
    }

    /// Creates that named a hostname a live server already had. Latitude
    /// accepts them; each is a second server for one name.
    pub fn duplicate_hostnames(&self) -> u64 {
        self.shared.world().duplicate_hostnames
    }

    pub fn calls(&self, call: Call) -> u64 {
        lock(&self.shared.calls).get(&call).copied().unwrap_or(0)
    }

    pub fn total_calls(&self) -> u64 {
        lock(&self.shared.calls).values().sum()
    }

    pub fn request_log(&self) -> Vec<RequestRecord> {
        lock(&self.shared.log).iter().cloned().collect()
    }
}
