//! A fake Equinix Metal API: the part of it shepherd uses, served over real
//! HTTP so that the real client, with its retries and its parsing, is what
//! gets tested.
//!
//! The fake writes its JSON from its own representation, never from the
//! client's model types, so a client that misreads the API cannot be agreed
//! with by a fake that misreads it the same way. Its answers follow the
//! schemas of the official spec, vendored as `spec/metal/openapi.json` (see
//! `spec/metal/README.md`).
//!
//! # Served
//!
//! Under `/metal/v1`, each call needing `X-Auth-Token`:
//!
//! | operation | method and path |
//! |---|---|
//! | `findProjectHardwareReservations` | `GET /projects/{id}/hardware-reservations` |
//! | `findHardwareReservationById` | `GET /hardware-reservations/{id}` |
//! | `moveHardwareReservation` | `POST /hardware-reservations/{id}/move` |
//! | `createDevice`, `findProjectDevices` | `POST`, `GET /projects/{id}/devices` |
//! | `findDeviceById`, `updateDevice`, `deleteDevice` | `GET`, `PUT`/`PATCH`, `DELETE /devices/{id}` |
//! | `performAction` | `POST /devices/{id}/actions` |
//! | `findProjectSSHKeys`, `createProjectSSHKey` | `GET`, `POST /projects/{id}/ssh-keys` |
//! | `findSSHKeys`, `createSSHKey` | `GET`, `POST /ssh-keys` |
//! | `findSSHKeyById`, `updateSSHKey`, `deleteSSHKey` | `GET`, `PUT`/`PATCH`, `DELETE /ssh-keys/{id}` |
//!
//! # Admin API
//!
//! Under `/_fake`, without a token, for the demo and for tests in other
//! processes:
//!
//! - `GET /_fake/faults`: the current [`Faults`] as JSON.
//! - `PUT /_fake/faults`: replaces them (an empty body clears them); answers
//!   with what was set.
//! - `GET /_fake/calls`: `{"total": N, "operations": {"createDevice": n, ..}}`
//!   with every operation listed.
//! - `GET /_fake/state`: `{"reservations": [..], "devices": [..],
//!   "ssh_keys": [..]}`, the snapshots [`FakeMetal::reservations`] and its
//!   siblings return.
//!
//! # Time
//!
//! A device is `queued` for [`FakeConfig::provisioning_delay`] after its
//! creation, then `provisioning` for [`FakeConfig::active_delay`], then
//! `active`. A reservation whose device goes away stays unprovisionable for
//! [`FakeConfig::wipe_delay`]. All of it is computed when asked, from the
//! wall clock, so nothing runs in the background.

mod catalog;
mod faults;
mod input;
mod reply;
mod routes;
mod state;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use std::{fmt, io};

use axum::http::HeaderMap;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::{JoinError, JoinHandle};
use uuid::Uuid;

pub use faults::{FaultKind, FaultRule, Faults};

use shepherd::metal::Operation;
use state::World;

/// Builds a served path from a literal, so routes and hrefs share one prefix.
macro_rules! metal_path {
    ($path:literal) => {
        concat!("/metal/v1", $path)
    };
}
pub(crate) use metal_path;

/// Where the real API lived under its host, and where the fake serves.
pub const API_PREFIX: &str = metal_path!("");

/// The request log keeps this many of the latest requests, so a demo that
/// runs for days does not grow without bound.
const REQUEST_LOG_LIMIT: usize = 10_000;

/// How the fake starts out.
#[derive(Clone)]
pub struct FakeConfig {
    /// The one project the fake knows; other project ids answer 404.
    pub project_id: Uuid,
    /// The `X-Auth-Token` every Metal request must carry.
    pub token: String,
    /// How many reservations the project starts with.
    pub reservations: usize,
    /// Seeds ids and the order of everything random, so runs repeat.
    pub seed: u64,
    /// Every Nth reservation (1-based; 0 for none) needs service and is not
    /// provisionable.
    pub not_provisionable_every: usize,
    /// Every Nth reservation (1-based; 0 for none) is a spare, still
    /// provisionable.
    pub spare_every: usize,
    /// How long a new device stays `queued`.
    pub provisioning_delay: Duration,
    /// How long it then stays `provisioning` before it is `active`.
    pub active_delay: Duration,
    /// How long a reservation stays unprovisionable after its device goes.
    pub wipe_delay: Duration,
    pub faults: Faults,
}

impl FakeConfig {
    /// The project id [`FakeConfig::default`] uses.
    pub const DEFAULT_PROJECT: Uuid = Uuid::from_u128(0x0d9f_6c3a_5b1e_4c7d_8a2f_3e4b_5c6d_7e8f);
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            project_id: Self::DEFAULT_PROJECT,
            token: "fake-token".to_owned(),
            reservations: 20,
            seed: 1,
            not_provisionable_every: 0,
            spare_every: 0,
            provisioning_delay: Duration::ZERO,
            active_delay: Duration::ZERO,
            wipe_delay: Duration::ZERO,
            faults: Faults::default(),
        }
    }
}

impl fmt::Debug for FakeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeConfig")
            .field("project_id", &self.project_id)
            .field("token", &"<redacted>")
            .field("reservations", &self.reservations)
            .field("seed", &self.seed)
            .field("not_provisionable_every", &self.not_provisionable_every)
            .field("spare_every", &self.spare_every)
            .field("provisioning_delay", &self.provisioning_delay)
            .field("active_delay", &self.active_delay)
            .field("wipe_delay", &self.wipe_delay)
            .field("faults", &self.faults)
            .finish()
    }
}

/// One request the fake answered (unknown paths are not recorded).
#[derive(Debug, Clone)]
pub struct RequestRecord {
    pub op: Operation,
    pub method: String,
    /// The path without the query string.
    pub path: String,
    pub status: u16,
    pub started: Instant,
    pub finished: Instant,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReservationSnapshot {
    pub id: Uuid,
    /// The truth, as a single GET tells it.
    pub provisionable: bool,
    pub device: Option<Uuid>,
    pub plan: String,
    pub metro: String,
    /// The device on it was put there by someone other than the API's
    /// caller ([`FakeMetal::add_foreign_device`] or a stolen reservation).
    pub taken_by_other: bool,
    /// The project it belongs to now; moves change it.
    pub project_id: Uuid,
    pub spare: bool,
    pub need_of_service: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceSnapshot {
    pub id: Uuid,
    pub hostname: String,
    pub reservation: Option<Uuid>,
    pub tags: Vec<String>,
    pub state: String,
    pub created_by_other: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SshKeySnapshot {
    pub id: Uuid,
    pub label: String,
    pub key: String,
}

/// What the handlers and the handle share.
struct Shared {
    token: String,
    world: Mutex<World>,
    faults: Mutex<FaultDice>,
    calls: Mutex<BTreeMap<Operation, u64>>,
    log: Mutex<VecDeque<RequestRecord>>,
}

struct FaultDice {
    faults: Faults,
    rng: StdRng,
}

/// A handler that panicked must not wedge every later request, and none of
/// the guarded data can be left half-updated in a way that matters to a
/// fake.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn new(config: FakeConfig) -> Self {
        let world = World::new(&config);
        Shared {
            world: Mutex::new(world),
            faults: Mutex::new(FaultDice {
                faults: config.faults,
                // Apart from the world's generator, so that faults do not
                // shift the ids a run hands out.
                rng: StdRng::seed_from_u64(config.seed.rotate_left(32) ^ 0xfa17),
            }),
            token: config.token,
            calls: Mutex::new(BTreeMap::new()),
            log: Mutex::new(VecDeque::new()),
        }
    }

    fn world(&self) -> MutexGuard<'_, World> {
        lock(&self.world)
    }

    fn authorized(&self, headers: &HeaderMap) -> bool {
        headers
            .get("x-auth-token")
            .is_some_and(|value| value.as_bytes() == self.token.as_bytes())
    }

    fn count(&self, op: Operation) {
        *lock(&self.calls).entry(op).or_default() += 1;
    }

    fn latency(&self) -> Duration {
        let mut dice = lock(&self.faults);
        let FaultDice { faults, rng } = &mut *dice;
        Duration::from_millis(faults.latency(rng))
    }

    fn pick_fault(&self, op: Operation) -> Option<FaultKind> {
        let mut dice = lock(&self.faults);
        let FaultDice { faults, rng } = &mut *dice;
        faults.pick(op, rng)
    }

    fn record(&self, record: RequestRecord) {
        let mut log = lock(&self.log);
        if log.len() == REQUEST_LOG_LIMIT {
            log.pop_front();
        }
        log.push_back(record);
    }

    fn calls(&self, op: Operation) -> u64 {
        lock(&self.calls).get(&op).copied().unwrap_or(0)
    }

    fn total_calls(&self) -> u64 {
        lock(&self.calls).values().sum()
    }

    fn faults(&self) -> Faults {
        lock(&self.faults).faults.clone()
    }

    fn set_faults(&self, faults: Faults) {
        lock(&self.faults).faults = faults;
    }
}

/// A running fake. Dropping it stops the server as [`FakeMetal::shutdown`]
/// does, without waiting.
pub struct FakeMetal {
    shared: Arc<Shared>,
    addr: SocketAddr,
    project_id: Uuid,
    stop: oneshot::Sender<()>,
    server: JoinHandle<io::Result<()>>,
}

impl fmt::Debug for FakeMetal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeMetal")
            .field("addr", &self.addr)
            .field("project_id", &self.project_id)
            .finish_non_exhaustive()
    }
}

impl FakeMetal {
    /// Binds `listen` (port 0 picks a free port) and serves in a task.
    pub async fn start(config: FakeConfig, listen: SocketAddr) -> io::Result<FakeMetal> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let project_id = config.project_id;
        let shared = Arc::new(Shared::new(config));
        let (stop, server) = crate::spawn_server(listener, routes::router(Arc::clone(&shared)));
        tracing::debug!(%addr, "fake Metal API listening");
        Ok(FakeMetal {
            shared,
            addr,
            project_id,
            stop,
            server,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The API's base URL, e.g. `http://127.0.0.1:PORT/metal/v1`. A wildcard
    /// listen address is replaced by loopback, which is what a client on the
    /// same host can reach.
    pub fn base_url(&self) -> String {
        let mut addr = self.addr;
        match addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => addr.set_ip(Ipv4Addr::LOCALHOST.into()),
            IpAddr::V6(ip) if ip.is_unspecified() => addr.set_ip(Ipv6Addr::LOCALHOST.into()),
            _ => {}
        }
        format!("http://{addr}{API_PREFIX}")
    }

    pub fn project_id(&self) -> Uuid {
        self.project_id
    }

    /// Replaces the faults; requests already past their fault draw are not
    /// affected.
    pub fn set_faults(&self, faults: Faults) {
        self.shared.set_faults(faults);
    }

    /// The current faults, with `remaining` counts as used up so far.
    pub fn faults(&self) -> Faults {
        self.shared.faults()
    }

    /// Requests to `op`, including unauthorised and faulted ones.
    pub fn calls(&self, op: Operation) -> u64 {
        self.shared.calls(op)
    }

    pub fn total_calls(&self) -> u64 {
        self.shared.total_calls()
    }

    /// The latest requests (up to 10 000), oldest first.
    pub fn request_log(&self) -> Vec<RequestRecord> {
        lock(&self.shared.log).iter().cloned().collect()
    }

    /// Every reservation the fake has, moved ones included, in creation
    /// order.
    pub fn reservations(&self) -> Vec<ReservationSnapshot> {
        self.shared.world().reservation_snapshots(Instant::now())
    }

    /// Every device, by hostname and then id.
    /// Creates refused because the reservation held a device of the
    /// client's own: a second create for one reservation, which Metal's
    /// refusal would otherwise hide from a test.
    pub fn duplicate_creates(&self) -> u64 {
        self.shared.world().duplicate_creates
    }

    pub fn devices(&self) -> Vec<DeviceSnapshot> {
        self.shared.world().device_snapshots(Instant::now())
    }

    /// Project and user keys alike, in creation order.
    pub fn ssh_keys(&self) -> Vec<SshKeySnapshot> {
        self.shared.world().key_snapshots()
    }

    /// Someone else (a colleague, an operator) puts a device on the
    /// reservation, whatever its state. A device already on it loses it.
    ///
    /// # Panics
    ///
    /// When the fake has no such reservation: that is a broken test.
    pub fn add_foreign_device(&self, reservation: Uuid, hostname: &str, tags: Vec<String>) -> Uuid {
        let added =
            self.shared
                .world()
                .put_foreign_device(reservation, hostname, tags, Instant::now());
        match added {
            Some(id) => id,
            None => panic!("the fake has no reservation {reservation}"),
        }
    }

    /// Deletes a device out of band; its reservation is wiped as after an
    /// API delete. `false` when there was no such device.
    pub fn delete_device(&self, id: Uuid) -> bool {
        self.shared.world().remove_device(id, Instant::now())
    }

    /// Makes the device's provisioning fail: it stays `failed` on its
    /// reservation until deleted. `false` when there was no such device.
    pub fn fail_device(&self, id: Uuid) -> bool {
        self.shared.world().fail_device(id)
    }

    /// From now on the listing says the reservation is provisionable while
    /// the single GET (and a create) know it is not. Unknown ids are ignored.
    pub fn mark_stale(&self, reservation: Uuid) {
        self.shared.world().mark_stale(reservation);
    }

    /// Stops accepting, lets requests in flight finish, and waits for that.
    pub async fn shutdown(self) {
        let FakeMetal { stop, server, .. } = self;
        let _ = stop.send(());
        if let Err(error) = joined(server.await) {
            tracing::warn!(%error, "fake Metal API stopped with an error");
        }
    }

    /// Serves until `shutdown` resolves, then stops as
    /// [`FakeMetal::shutdown`] does. For a process whose whole job is the
    /// fake, e.g. `shepherd fake-metal`:
    ///
    /// ```no_run
    /// # async fn demo() -> std::io::Result<()> {
    /// use shepherd_fakes::metal::{FakeConfig, FakeMetal};
    /// let fake = FakeMetal::start(FakeConfig::default(), "127.0.0.1:8080".parse().unwrap()).await?;
    /// println!("serving {}", fake.base_url());
    /// fake.run_until(async { tokio::signal::ctrl_c().await.ok(); }).await
    /// # }
    /// ```
    pub async fn run_until<F>(self, shutdown: F) -> io::Result<()>
    where
        F: Future<Output = ()>,
    {
        let FakeMetal {
            stop, mut server, ..
        } = self;
        tokio::select! {
            finished = &mut server => return joined(finished),
            () = shutdown => {}
        }
        let _ = stop.send(());
        joined(server.await)
    }
}

fn joined(result: Result<io::Result<()>, JoinError>) -> io::Result<()> {
    result.unwrap_or_else(|error| Err(io::Error::other(error)))
}
