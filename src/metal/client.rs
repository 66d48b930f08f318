//! The Metal API client: typed calls over the call discipline.
//!
//! Every call is one or more attempts through the [`Gate`] (slot, turn,
//! per-attempt timeout). Reads, updates, deletes and actions converge when
//! repeated, so they retry transient failures directly. Creates do not: a
//! device create re-reads its reservation before every attempt and recognises
//! its own device by a witness tag, so an answer lost in transit is never
//! followed by a blind second POST.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::Operation;
use super::discipline::{
    API_RATE_DEFAULT, ATTEMPT_TIMEOUT_DEFAULT, ClientMetrics, Gate, LocalPacer,
    PARALLELISM_DEFAULT, Pacer, RequestLabels, RetrySettings, retry,
};
use super::error::{self, MetalError};
use super::model::*;
use crate::secret::ApiToken;

/// The real service's base URL (closed on 30 June 2026; kept as the default
/// so a drop-in replacement only needs `METAL_API_URL`).
pub const BASE_URL_DEFAULT: &str = "https://api.equinix.com/metal/v1";
/// The spec allows up to 1000; 100 keeps one page's answer small.
pub const PER_PAGE_DEFAULT: u32 = 100;
/// Bound on one answer's size: a reservation page at 1000 per page is a few
/// MiB; anything far larger is not an answer we can use.
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// Witness tags start with this, so that an orphan can be told apart from
/// a device someone else made with our hostname prefix.
pub const WITNESS_TAG_PREFIX: &str = "shepherd-witness:";
/// A runaway pager stops here even if every page claims there is another.
const MAX_PAGES: u64 = 100_000;

#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub base_url: String,
    pub project_id: Uuid,
    pub token: ApiToken,
    /// Calls in flight at once (the seed's `equinix_parallelism`).
    pub parallelism: usize,
    /// Minimum time between the starts of two calls (the seed's `api_rate`).
    pub api_rate: Duration,
    /// One attempt's budget, from send to the last byte of the answer.
    pub attempt_timeout: Duration,
    pub per_page: u32,
    pub retry: RetrySettings,
}

impl ClientConfig {
    pub fn new(base_url: impl Into<String>, project_id: Uuid, token: ApiToken) -> Self {
        ClientConfig {
            base_url: base_url.into(),
            project_id,
            token,
            parallelism: PARALLELISM_DEFAULT,
            api_rate: API_RATE_DEFAULT,
            attempt_timeout: ATTEMPT_TIMEOUT_DEFAULT,
            per_page: PER_PAGE_DEFAULT,
            retry: RetrySettings::default(),
        }
    }
}

/// A witness: a stable string derived from the work that asks for a device
/// (e.g. the job id), carried as a tag so that a retry, even from another
/// process after a crash, recognises the device it already made.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Witness(String);

impl Witness {
    pub fn new(stable_id: impl std::fmt::Display) -> Self {
        Witness(stable_id.to_string())
    }

    /// Tags are at most 80 characters: the API enforced it, though the spec
    /// does not say so.
    pub fn tag(&self) -> String {
        let mut tag = format!("{WITNESS_TAG_PREFIX}{}", self.0);
        tag.truncate(80);
        tag
    }
}

/// What `create_device` asks for.
#[derive(Debug, Clone)]
pub struct CreateDevice {
    pub reservation: Uuid,
    pub hostname: String,
    pub operating_system: String,
    pub ssh_keys: Vec<Uuid>,
    pub witness: Witness,
}

/// A device that `create_device` made or found.
#[derive(Debug, Clone)]
pub struct CreatedDevice {
    pub device: Device,
    /// The device was found on the reservation after an earlier attempt's
    /// outcome was unknown (or after a crash), not returned by the POST.
    pub recovered: bool,
    pub attempts: u32,
}

#[derive(Clone)]
pub struct MetalClient {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    base_url: String,
    project_id: Uuid,
    per_page: u32,
    attempt_timeout: Duration,
    retry: RetrySettings,
    gate: Gate,
}

/// One HTTP exchange, described once so that every attempt is identical.
struct Call<'a> {
    op: Operation,
    method: Method,
    path: String,
    query: Vec<(&'static str, String)>,
    body: Option<&'a (dyn erased::Body + Sync)>,
}

mod erased {
    /// A JSON body behind a trait object, so `Call` needs no type parameter.
    pub trait Body {
        fn to_json(&self) -> serde_json::Result<Vec<u8>>;
    }
    impl<T: serde::Serialize> Body for T {
        fn to_json(&self) -> serde_json::Result<Vec<u8>> {
            serde_json::to_vec(self)
        }
    }
}

impl std::fmt::Debug for MetalClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetalClient")
            .field("base_url", &self.inner.base_url)
            .field("project_id", &self.inner.project_id)
            .finish_non_exhaustive()
    }
}

impl MetalClient {
    /// A client pacing its calls within this process.
    pub fn new(config: ClientConfig, metrics: ClientMetrics) -> Result<Self, MetalError> {
        let pacer = Arc::new(LocalPacer::new(config.api_rate));
        Self::with_pacer(config, metrics, pacer)
    }

    /// A client whose call starts are spaced by `pacer` (e.g. one shared by
    /// every process of a cluster).
    pub fn with_pacer(
        config: ClientConfig,
        metrics: ClientMetrics,
        pacer: Arc<dyn Pacer>,
    ) -> Result<Self, MetalError> {
        if config.token.is_empty() {
            return Err(MetalError::Refused("the API token is empty".into()));
        }
        let mut token = HeaderValue::from_str(config.token.expose())
            .map_err(|_| MetalError::Refused("the API token is not a valid header value".into()))?;
        // Keeps the value out of reqwest's and hyper's Debug output.
        token.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert("X-Auth-Token", token);
        let http = reqwest::Client::builder()
            .user_agent(concat!("shepherd/", env!("CARGO_PKG_VERSION")))
            .default_headers(headers)
            .build()
            .map_err(|e| MetalError::Refused(format!("cannot build the HTTP client: {e}")))?;
        let base_url = config.base_url.trim_end_matches('/').to_string();
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(MetalError::Refused(format!(
                "the API URL {base_url:?} is not an http(s) URL"
            )));
        }
        Ok(MetalClient {
            inner: Arc::new(Inner {
                http,
                base_url,
                project_id: config.project_id,
                per_page: config.per_page.clamp(1, 1000),
                attempt_timeout: config.attempt_timeout,
                retry: config.retry,
                gate: Gate::new(config.parallelism, pacer, metrics),
            }),
        })
    }

    /// Adopts the cluster's `api_rate`.
    pub fn set_api_rate(&self, interval: Duration) {
        self.inner.gate.set_interval(interval);
    }

    pub fn project_id(&self) -> Uuid {
        self.inner.project_id
    }

    pub fn metrics(&self) -> &ClientMetrics {
        &self.inner.gate.metrics
    }

    // ---- hardware reservations ----

    /// Every reservation of the project, all pages. `include` is joined with
    /// commas into one value, as the API expects.
    pub async fn list_reservations(
        &self,
        include: &[&str],
    ) -> Result<Vec<HardwareReservation>, MetalError> {
        let path = format!("/projects/{}/hardware-reservations", self.inner.project_id);
        let pages = self
            .list_pages::<ReservationPage>(
                Operation::FindProjectHardwareReservations,
                &path,
                include,
            )
            .await?;
        let items = pages.into_iter().map(|p| (p.hardware_reservations, p.meta));
        collect_pages(Operation::FindProjectHardwareReservations, items, |r| r.id)
    }

    pub async fn get_reservation(
        &self,
        id: Uuid,
        include: &[&str],
    ) -> Result<HardwareReservation, MetalError> {
        self.json(self.reservation_call(id, include)).await
    }

    pub async fn move_reservation(
        &self,
        id: Uuid,
        project_id: Uuid,
    ) -> Result<HardwareReservation, MetalError> {
        #[derive(Serialize)]
        struct Move {
            project_id: Uuid,
        }
        let body = Move { project_id };
        self.json(Call {
            op: Operation::MoveHardwareReservation,
            method: Method::POST,
            path: format!("/hardware-reservations/{id}/move"),
            query: vec![],
            body: Some(&body),
        })
        .await
    }

    // ---- devices ----

    pub async fn list_devices(&self) -> Result<Vec<Device>, MetalError> {
        let path = format!("/projects/{}/devices", self.inner.project_id);
        let pages = self
            .list_pages::<DevicePage>(Operation::FindProjectDevices, &path, &[])
            .await?;
        let items = pages.into_iter().map(|p| (p.devices, p.meta));
        collect_pages(Operation::FindProjectDevices, items, |d| d.id)
    }

    pub async fn get_device(&self, id: Uuid) -> Result<Device, MetalError> {
        self.json(Call {
            op: Operation::FindDeviceById,
            method: Method::GET,
            path: format!("/devices/{id}"),
            query: vec![],
            body: None,
        })
        .await
    }

    pub async fn update_device(
        &self,
        id: Uuid,
        update: &DeviceUpdateRequest,
    ) -> Result<Device, MetalError> {
        self.json(Call {
            op: Operation::UpdateDevice,
            method: Method::PUT,
            path: format!("/devices/{id}"),
            query: vec![],
            body: Some(update),
        })
        .await
    }

    /// Deletes a device. A 404 on a later attempt means an earlier attempt
    /// that looked failed did the work, so it counts as success.
    pub async fn delete_device(&self, id: Uuid) -> Result<(), MetalError> {
        let first_try_failed = AtomicBool::new(false);
        retry(&self.inner.retry, "deleteDevice", |_| async {
            let r = self
                .attempt(&Call {
                    op: Operation::DeleteDevice,
                    method: Method::DELETE,
                    path: format!("/devices/{id}"),
                    query: vec![],
                    body: None,
                })
                .await
                .and_then(|(status, body)| no_content(Operation::DeleteDevice, status, &body));
            match r {
                Err(MetalError::NotFound { .. }) if first_try_failed.load(Ordering::Relaxed) => {
                    Ok(())
                }
                Err(e) => {
                    first_try_failed.store(true, Ordering::Relaxed);
                    Err(e)
                }
                ok => ok,
            }
        })
        .await
    }

    pub async fn device_action(&self, id: Uuid, action: DeviceAction) -> Result<(), MetalError> {
        #[derive(Serialize)]
        struct Action {
            #[serde(rename = "type")]
            kind: DeviceAction,
        }
        let body = Action { kind: action };
        let call = Call {
            op: Operation::PerformAction,
            method: Method::POST,
            path: format!("/devices/{id}/actions"),
            query: vec![],
            body: Some(&body),
        };
        retry(&self.inner.retry, "performAction", |_| async {
            let (status, body) = self.attempt(&call).await?;
            no_content(call.op, status, &body)
        })
        .await
    }

    /// Creates a device on a reservation, idempotently.
    ///
    /// Before every attempt the reservation is read with its device: a device
    /// carrying our witness is the result (a previous attempt, or a previous
    /// process, made it); any other device means the reservation was taken
    /// (`RaceLost`). A POST that fails without a clear refusal is never
    /// repeated blindly: the next attempt starts with that read. In the normal
    /// case this is two calls; after an accepted-then-failed POST, three.
    pub async fn create_device(&self, req: &CreateDevice) -> Result<CreatedDevice, MetalError> {
        self.create_device_paced(req, || async { Ok(()) }).await
    }

    /// [`MetalClient::create_device`], awaiting `pace` right before every
    /// POST: a creation rate limit then holds at the moment devices are
    /// requested, not at some earlier point before the reservation's read.
    pub async fn create_device_paced<P, Fut>(
        &self,
        req: &CreateDevice,
        pace: P,
    ) -> Result<CreatedDevice, MetalError>
    where
        P: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), MetalError>>,
    {
        let witness = req.witness.tag();
        // Set when a POST's outcome could not be observed, cleared when a
        // later read of the reservation shows no device of ours: an error
        // that ends the call while it is set means "unknown", not "failed".
        let ambiguous = AtomicBool::new(false);
        let attempts = AtomicU32::new(0);
        let result = retry(&self.inner.retry, "createDevice", |attempt| {
            let witness = &witness;
            let ambiguous = &ambiguous;
            let pace = &pace;
            attempts.store(attempt, Ordering::Relaxed);
            async move {
                let reservation = self
                    .json_once::<HardwareReservation>(
                        self.reservation_call(req.reservation, &["device", "facility"]),
                    )
                    .await?;
                if let Some(found) = self
                    .device_on(&reservation, witness, req.reservation)
                    .await?
                {
                    return Ok(CreatedDevice {
                        device: found,
                        recovered: true,
                        attempts: attempt,
                    });
                }
                ambiguous.store(false, Ordering::Relaxed);
                if !reservation.provisionable {
                    return Err(MetalError::NotProvisionable {
                        reservation: req.reservation,
                    });
                }
                let body = self.create_body(req, &reservation, witness)?;
                let call = Call {
                    op: Operation::CreateDevice,
                    method: Method::POST,
                    path: format!("/projects/{}/devices", self.inner.project_id),
                    query: vec![],
                    body: Some(&body),
                };
                let posted = match self.attempt_paced(&call, Some(pace)).await {
                    Ok((status, body)) => decode::<Device>(call.op, status, &body),
                    Err(e) => Err(e),
                };
                match posted {
                    Ok(device) => Ok(CreatedDevice {
                        device,
                        recovered: false,
                        attempts: attempt,
                    }),
                    Err(e @ MetalError::Invalid { status: 422, .. }) => {
                        // A 422 is what a create on a reservation taken
                        // since our read looks like; tell that apart.
                        let now = self
                            .json_once::<HardwareReservation>(
                                self.reservation_call(req.reservation, &["device"]),
                            )
                            .await;
                        match now {
                            Ok(r) => match self.device_on(&r, witness, req.reservation).await? {
                                Some(device) => Ok(CreatedDevice {
                                    device,
                                    recovered: true,
                                    attempts: attempt,
                                }),
                                None => Err(e),
                            },
                            // The refusal may have been for a device of ours
                            // made meanwhile: unknown until the next read.
                            Err(reread) => {
                                ambiguous.store(true, Ordering::Relaxed);
                                Err(MetalError::Transient {
                                    op: call.op,
                                    reason: format!(
                                        "refused ({e}), and the reservation could not be read again: {reread}"
                                    ),
                                })
                            }
                        }
                    }
                    // A create the server accepted but whose answer cannot
                    // be read made a device we cannot see yet: look again.
                    Err(MetalError::Undecodable {
                        status: 200..=299,
                        detail,
                        ..
                    }) => {
                        ambiguous.store(true, Ordering::Relaxed);
                        Err(MetalError::Transient {
                            op: call.op,
                            reason: format!("the create was accepted but its answer is unreadable: {detail}"),
                        })
                    }
                    Err(e) => {
                        if matches!(
                            e,
                            MetalError::Transient { .. } | MetalError::Undecodable { .. }
                        ) {
                            ambiguous.store(true, Ordering::Relaxed);
                        }
                        Err(e)
                    }
                }
            }
        })
        .await;
        match result {
            // A foreign device on the reservation settles it: ours cannot be there.
            Err(e)
                if ambiguous.load(Ordering::Relaxed)
                    && !matches!(e, MetalError::RaceLost { .. }) =>
            {
                Err(MetalError::Ambiguous {
                    op: Operation::CreateDevice,
                    attempts: attempts.load(Ordering::Relaxed),
                    reason: e.to_string(),
                })
            }
            other => other,
        }
    }

    /// Looks for the device a creation with `witness` made on `reservation`:
    /// `Some` if it is there, `None` if the reservation has no device, and
    /// `RaceLost` if another party's device is on it. How an unknown outcome
    /// is settled: by looking, never by guessing.
    pub async fn find_created(
        &self,
        reservation: Uuid,
        witness: &Witness,
    ) -> Result<Option<Device>, MetalError> {
        let tag = witness.tag();
        retry(&self.inner.retry, "findCreatedDevice", |_| async {
            let r = self
                .json_once::<HardwareReservation>(
                    self.reservation_call(reservation, &["device", "facility"]),
                )
                .await?;
            self.device_on(&r, &tag, reservation).await
        })
        .await
    }

    /// The device on a reservation if it is ours; `RaceLost` if it is not.
    async fn device_on(
        &self,
        reservation: &HardwareReservation,
        witness: &str,
        reservation_id: Uuid,
    ) -> Result<Option<Device>, MetalError> {
        let Some(embedded) = &reservation.device else {
            return Ok(None);
        };
        // The reservation was read with include=device; a bare link would
        // need one more read to see the tags.
        let device = match embedded {
            Embedded::Full(d) => d.clone(),
            Embedded::Link(h) => match h.id() {
                Some(id) => self.json_once::<Device>(self.device_call(id)).await?,
                None => {
                    return Err(MetalError::RaceLost {
                        reservation: reservation_id,
                        device: None,
                    });
                }
            },
        };
        if device.has_tag(witness) {
            Ok(Some(device))
        } else {
            Err(MetalError::RaceLost {
                reservation: reservation_id,
                device: Some(device.id),
            })
        }
    }

    fn create_body(
        &self,
        req: &CreateDevice,
        reservation: &HardwareReservation,
        witness: &str,
    ) -> Result<DeviceCreateRequest, MetalError> {
        let plan = reservation
            .plan_slug()
            .ok_or_else(|| MetalError::Undecodable {
                op: Operation::FindHardwareReservationById,
                status: 200,
                detail: format!("reservation {} has no plan slug", reservation.id),
                excerpt: String::new(),
            })?
            .to_string();
        let metro = reservation.metro_code().map(str::to_string);
        let facility = match metro {
            Some(_) => None,
            None => reservation.facility().and_then(|f| f.code.clone()),
        };
        Ok(DeviceCreateRequest {
            hostname: req.hostname.clone(),
            plan,
            operating_system: req.operating_system.clone(),
            metro,
            facility,
            hardware_reservation_id: req.reservation,
            project_ssh_keys: req.ssh_keys.clone(),
            tags: vec![witness.to_string()],
        })
    }

    // ---- SSH keys ----

    /// The project's SSH keys. This listing is not paged.
    pub async fn list_ssh_keys(&self) -> Result<Vec<SshKey>, MetalError> {
        let list: SshKeyList = self.json(self.ssh_key_list_call()).await?;
        Ok(list.ssh_keys)
    }

    pub async fn get_ssh_key(&self, id: Uuid) -> Result<SshKey, MetalError> {
        self.json(Call {
            op: Operation::FindSshKeyById,
            method: Method::GET,
            path: format!("/ssh-keys/{id}"),
            query: vec![],
            body: None,
        })
        .await
    }

    /// Creates a project SSH key. Not idempotent by itself: prefer
    /// [`MetalClient::ensure_ssh_key`].
    pub async fn create_ssh_key(&self, input: &SshKeyInput) -> Result<SshKey, MetalError> {
        self.json_once(self.ssh_key_create_call(input)).await
    }

    pub async fn update_ssh_key(
        &self,
        id: Uuid,
        input: &SshKeyInput,
    ) -> Result<SshKey, MetalError> {
        self.json(Call {
            op: Operation::UpdateSshKey,
            method: Method::PUT,
            path: format!("/ssh-keys/{id}"),
            query: vec![],
            body: Some(input),
        })
        .await
    }

    pub async fn delete_ssh_key(&self, id: Uuid) -> Result<(), MetalError> {
        let call = Call {
            op: Operation::DeleteSshKey,
            method: Method::DELETE,
            path: format!("/ssh-keys/{id}"),
            query: vec![],
            body: None,
        };
        retry(&self.inner.retry, "deleteSSHKey", |_| async {
            let (status, body) = self.attempt(&call).await?;
            no_content(call.op, status, &body)
        })
        .await
    }

    /// Makes sure the project has `public_key` under `label` and returns its
    /// id: creates it, or updates the key when the label holds another one.
    /// Each attempt lists first, so a create whose answer was lost is found
    /// rather than made twice.
    pub async fn ensure_ssh_key(&self, label: &str, public_key: &str) -> Result<Uuid, MetalError> {
        refuse_placeholder("SSH key label", label)?;
        let input = SshKeyInput {
            label: label.to_string(),
            key: public_key.trim().to_string(),
        };
        retry(&self.inner.retry, "ensureSSHKey", |_| async {
            let keys: SshKeyList = self.json_once(self.ssh_key_list_call()).await?;
            match keys.ssh_keys.iter().find(|k| k.label == input.label) {
                Some(k) if k.key.trim() == input.key => Ok(k.id),
                Some(k) => {
                    let updated: SshKey = self
                        .json_once(Call {
                            op: Operation::UpdateSshKey,
                            method: Method::PUT,
                            path: format!("/ssh-keys/{}", k.id),
                            query: vec![],
                            body: Some(&input),
                        })
                        .await?;
                    Ok(updated.id)
                }
                None => {
                    let created: SshKey = self.json_once(self.ssh_key_create_call(&input)).await?;
                    Ok(created.id)
                }
            }
        })
        .await
    }

    // ---- plumbing ----

    fn reservation_call(&self, id: Uuid, include: &[&str]) -> Call<'static> {
        Call {
            op: Operation::FindHardwareReservationById,
            method: Method::GET,
            path: format!("/hardware-reservations/{id}"),
            query: include_query(include),
            body: None,
        }
    }

    fn device_call(&self, id: Uuid) -> Call<'static> {
        Call {
            op: Operation::FindDeviceById,
            method: Method::GET,
            path: format!("/devices/{id}"),
            query: vec![],
            body: None,
        }
    }

    fn ssh_key_list_call(&self) -> Call<'static> {
        Call {
            op: Operation::FindProjectSshKeys,
            method: Method::GET,
            path: format!("/projects/{}/ssh-keys", self.inner.project_id),
            query: vec![],
            body: None,
        }
    }

    fn ssh_key_create_call<'a>(&self, input: &'a SshKeyInput) -> Call<'a> {
        Call {
            op: Operation::CreateProjectSshKey,
            method: Method::POST,
            path: format!("/projects/{}/ssh-keys", self.inner.project_id),
            query: vec![],
            body: Some(input),
        }
    }

    /// Fetches every page of a listing, page by page, each page with its own
    /// retries. It never follows `meta.next`: whether that href carries the
    /// `/metal/v1` prefix was never settled.
    async fn list_pages<P: DeserializeOwned + HasMeta>(
        &self,
        op: Operation,
        path: &str,
        include: &[&str],
    ) -> Result<Vec<P>, MetalError> {
        let mut pages = Vec::new();
        let mut page = 1u64;
        loop {
            let mut query = include_query(include);
            query.push(("page", page.to_string()));
            query.push(("per_page", self.inner.per_page.to_string()));
            let p: P = self
                .json(Call {
                    op,
                    method: Method::GET,
                    path: path.to_string(),
                    query,
                    body: None,
                })
                .await?;
            let last_page = p.meta().and_then(|m| m.last_page);
            let empty = p.is_empty();
            pages.push(p);
            match last_page {
                Some(last) if page < last && !empty => {}
                _ => break,
            }
            page += 1;
            if page > MAX_PAGES {
                return Err(MetalError::Undecodable {
                    op,
                    status: 200,
                    detail: format!("more than {MAX_PAGES} pages"),
                    excerpt: String::new(),
                });
            }
        }
        Ok(pages)
    }

    /// One call with retries, decoded as JSON.
    async fn json<T: DeserializeOwned>(&self, call: Call<'_>) -> Result<T, MetalError> {
        retry(&self.inner.retry, call.op.id(), |_| {
            self.json_once(call.clone_ref())
        })
        .await
    }

    /// One attempt, decoded as JSON.
    async fn json_once<T: DeserializeOwned>(&self, call: Call<'_>) -> Result<T, MetalError> {
        let (status, body) = self.attempt(&call).await?;
        decode(call.op, status, &body)
    }

    /// One attempt through the gate, with its own timeout. Returns the status
    /// and body of a success; any other answer becomes an error.
    async fn attempt(&self, call: &Call<'_>) -> Result<(u16, Vec<u8>), MetalError> {
        self.attempt_paced::<fn() -> std::future::Ready<Result<(), MetalError>>, _>(call, None)
            .await
    }

    /// One attempt; `pace`, when given, is awaited after the attempt has its
    /// slot in the gate, right before the request is sent, so nothing of our
    /// own stands between a rate limiter's slot and the wire.
    async fn attempt_paced<P, Fut>(
        &self,
        call: &Call<'_>,
        pace: Option<&P>,
    ) -> Result<(u16, Vec<u8>), MetalError>
    where
        P: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), MetalError>>,
    {
        let admission = self.inner.gate.admit(call.op).await?;
        if let Some(pace) = pace {
            pace().await?;
        }
        let started = tokio::time::Instant::now();
        let url = format!("{}{}", self.inner.base_url, call.path);
        let mut request = self.inner.http.request(call.method.clone(), &url);
        if !call.query.is_empty() {
            request = request.query(&call.query);
        }
        if let Some(body) = call.body {
            let bytes = body.to_json().map_err(|e| {
                MetalError::Refused(format!("{}: cannot encode the request: {e}", call.op))
            })?;
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(bytes);
        }
        let exchange = async {
            let response = request.send().await?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = read_capped(response).await?;
            Ok::<_, reqwest::Error>((status, headers, body))
        };
        let outcome = tokio::time::timeout(self.inner.attempt_timeout, exchange).await;
        let status_label = match &outcome {
            Ok(Ok((s, _, _))) => s.as_u16().to_string(),
            Ok(Err(_)) => "error".to_string(),
            Err(_) => "timeout".to_string(),
        };
        self.inner
            .gate
            .metrics
            .request_duration
            .get_or_create(&RequestLabels {
                endpoint: call.op.id(),
                status: status_label,
            })
            .observe(started.elapsed().as_secs_f64());
        drop(admission);
        let (status, headers, body) = match outcome {
            Err(_) => {
                return Err(MetalError::Transient {
                    op: call.op,
                    reason: format!("no complete answer within {:?}", self.inner.attempt_timeout),
                });
            }
            Ok(Err(e)) => {
                return Err(MetalError::Transient {
                    op: call.op,
                    reason: describe_transport_error(&e),
                });
            }
            Ok(Ok(v)) => v,
        };
        let body = match body {
            Body::Complete(b) => b,
            Body::TooLarge => {
                return Err(MetalError::Undecodable {
                    op: call.op,
                    status: status.as_u16(),
                    detail: format!("answer larger than {MAX_BODY_BYTES} bytes"),
                    excerpt: String::new(),
                });
            }
        };
        if status.is_success() {
            return Ok((status.as_u16(), body));
        }
        let messages = serde_json::from_slice::<ErrorBody>(&body)
            .map(ErrorBody::messages)
            .unwrap_or_else(|_| {
                if body.is_empty() {
                    vec![]
                } else {
                    vec![error::excerpt(&body)]
                }
            });
        let retry_after = if status == StatusCode::TOO_MANY_REQUESTS {
            retry_after(&headers)
        } else {
            None
        };
        Err(error::from_status(
            call.op,
            status.as_u16(),
            messages,
            retry_after,
        ))
    }
}

impl Call<'_> {
    fn clone_ref(&self) -> Call<'_> {
        Call {
            op: self.op,
            method: self.method.clone(),
            path: self.path.clone(),
            query: self.query.clone(),
            body: self.body,
        }
    }
}

/// Page types that carry pagination metadata.
trait HasMeta {
    fn meta(&self) -> Option<&Meta>;
    fn is_empty(&self) -> bool;
}

impl HasMeta for ReservationPage {
    fn meta(&self) -> Option<&Meta> {
        self.meta.as_ref()
    }
    fn is_empty(&self) -> bool {
        self.hardware_reservations.is_empty()
    }
}

impl HasMeta for DevicePage {
    fn meta(&self) -> Option<&Meta> {
        self.meta.as_ref()
    }
    fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }
}

/// Joins pages, dropping an item seen on an earlier page (the list can shift
/// while it is paged), and refuses a listing whose pages contradict its own
/// `meta`: a short listing would make present machines look missing.
fn collect_pages<T>(
    op: Operation,
    pages: impl Iterator<Item = (Vec<T>, Option<Meta>)>,
    id: impl Fn(&T) -> Uuid,
) -> Result<Vec<T>, MetalError> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut claimed_total = None;
    let mut pages_read = 0u64;
    let mut last_page = None;
    for (items, meta) in pages {
        pages_read += 1;
        if let Some(m) = &meta {
            claimed_total = m.total.or(claimed_total);
            last_page = m.last_page.or(last_page);
        }
        for item in items {
            if seen.insert(id(&item)) {
                out.push(item);
            }
        }
    }
    if let (Some(last), Some(total)) = (last_page, claimed_total)
        && pages_read < last
        && (out.len() as u64) < total
    {
        return Err(MetalError::Transient {
            op,
            reason: format!(
                "inconsistent pagination: page {} of {last} was empty, {} of {total} items read",
                pages_read,
                out.len()
            ),
        });
    }
    Ok(out)
}

fn include_query(include: &[&str]) -> Vec<(&'static str, String)> {
    if include.is_empty() {
        vec![]
    } else {
        vec![("include", include.join(","))]
    }
}

fn decode<T: DeserializeOwned>(op: Operation, status: u16, body: &[u8]) -> Result<T, MetalError> {
    serde_json::from_slice(body).map_err(|e| MetalError::Undecodable {
        op,
        status,
        detail: e.to_string(),
        excerpt: error::excerpt(body),
    })
}

/// Success answers with no useful body (204, 202). Anything in the body is
/// ignored; the status already said it worked.
fn no_content(_op: Operation, _status: u16, _body: &[u8]) -> Result<(), MetalError> {
    Ok(())
}

/// The device prefix or key label must not still be the placeholder the
/// seed's example configuration carried.
pub fn refuse_placeholder(what: &str, value: &str) -> Result<(), MetalError> {
    if value.contains("FIXME") {
        return Err(MetalError::Refused(format!(
            "the {what} {value:?} still contains FIXME; set a real value"
        )));
    }
    if value.trim().is_empty() {
        return Err(MetalError::Refused(format!("the {what} is empty")));
    }
    Ok(())
}

enum Body {
    Complete(Vec<u8>),
    TooLarge,
}

async fn read_capped(mut response: reqwest::Response) -> Result<Body, reqwest::Error> {
    if response
        .content_length()
        .is_some_and(|n| n > MAX_BODY_BYTES as u64)
    {
        return Ok(Body::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Ok(Body::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Body::Complete(body))
}

/// `Retry-After` in seconds, else `X-RateLimit-Reset` (a Unix time, or a
/// number of seconds when it is too small to be one).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let number =
        |name: &str| -> Option<u64> { headers.get(name)?.to_str().ok()?.trim().parse().ok() };
    if let Some(secs) = number("retry-after") {
        return Some(Duration::from_secs(secs));
    }
    let reset = number("x-ratelimit-reset")?;
    const A_UNIX_TIME: u64 = 1_000_000_000;
    if reset < A_UNIX_TIME {
        return Some(Duration::from_secs(reset));
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(reset.saturating_sub(now)))
}

/// A transport error without its URL's query or any header: the kind and
/// the innermost cause are what an operator needs.
fn describe_transport_error(e: &reqwest::Error) -> String {
    let kind = if e.is_connect() {
        "connection failed"
    } else if e.is_timeout() {
        "timed out"
    } else if e.is_body() || e.is_decode() {
        "connection broke while reading the answer"
    } else if e.is_request() {
        "request failed"
    } else {
        "transport error"
    };
    let mut source: &dyn std::error::Error = e;
    while let Some(inner) = source.source() {
        source = inner;
    }
    format!("{kind}: {source}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn witness_tag_fits_the_tag_limit() {
        let w = Witness::new("x".repeat(200));
        assert_eq!(w.tag().len(), 80);
        assert!(w.tag().starts_with(WITNESS_TAG_PREFIX));
    }

    #[test]
    fn placeholder_values_are_refused() {
        assert!(refuse_placeholder("device prefix", "FIXME-").is_err());
        assert!(refuse_placeholder("device prefix", "").is_err());
        assert!(refuse_placeholder("device prefix", "shepherd-").is_ok());
    }

    #[test]
    fn retry_after_prefers_the_header_then_the_reset() {
        let mut h = HeaderMap::new();
        h.insert("x-ratelimit-reset", HeaderValue::from_static("7"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert("retry-after", HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
    }
}
