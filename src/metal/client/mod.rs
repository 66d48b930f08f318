//! The Metal API client: typed calls over the call discipline.
//!
//! Every call is one or more attempts through the [`Gate`] (slot, turn,
//! per-attempt timeout). Reads, updates, deletes and actions converge when
//! repeated, so they retry transient failures directly. Creates do not: a
//! device create re-reads its reservation before every attempt and recognises
//! its own device by a witness tag, so an answer lost in transit is never
//! followed by a blind second POST.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use reqwest::Method;
use reqwest::header::{HeaderMap, HeaderValue};
use serde::Serialize;
use uuid::Uuid;

use super::Operation;
use super::discipline::{
    API_RATE_DEFAULT, ATTEMPT_TIMEOUT_DEFAULT, ClientMetrics, Gate, LocalPacer,
    PARALLELISM_DEFAULT, Pacer, RetrySettings, retry,
};
use super::error::{self, MetalError};
use super::model::*;
use crate::config::Rate;
use crate::provider::discipline::Fence;
use crate::secret::ApiToken;

/// The real service's base URL (closed on 30 June 2026; kept as the default
/// so a drop-in replacement only needs `METAL_API_URL`).
pub const BASE_URL_DEFAULT: &str = "https://api.equinix.com/metal/v1";
/// The largest page the spec allows: a listing of 10,000 reservations is ten
/// pages, fetched at once after the first.
pub const PER_PAGE_DEFAULT: u32 = 1000;
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
    /// The budget of call starts (the seed's `api_rate`, as a bucket).
    pub api_rate: Rate,
    /// One attempt's budget, from send to the last byte of the answer.
    pub attempt_timeout: Duration,
    pub per_page: u32,
    pub retry: RetrySettings,
    /// `http://` to another machine is allowed (a fake elsewhere).
    pub allow_plain_http: bool,
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
            allow_plain_http: false,
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
    /// What a listing said of the reservation, for a create that nothing
    /// can have preceded (a creation's first attempt): its first POST is
    /// sent without reading the reservation again. `None`: every attempt
    /// reads first.
    pub first: Option<CreateHint>,
}

/// A reservation's plan and place, as a create needs them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CreateHint {
    pub plan: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metro: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facility: Option<String>,
}

impl CreateHint {
    /// The hint a listed reservation gives, if it names its plan and
    /// where it is.
    pub fn of(r: &HardwareReservation) -> Option<CreateHint> {
        let hint = CreateHint {
            plan: r.plan_slug()?.to_string(),
            metro: r.metro_code().map(str::to_string),
            facility: r.facility().and_then(|f| f.code.clone()),
        };
        (hint.metro.is_some() || hint.facility.is_some()).then_some(hint)
    }
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

mod create;
mod paging;
mod transport;

use paging::*;
use transport::*;

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
        // A redirect is never followed: X-Auth-Token, a header of Metal's
        // own, would go wherever it points, another host included.
        let http = reqwest::Client::builder()
            .user_agent(concat!("shepherd/", env!("CARGO_PKG_VERSION")))
            .default_headers(headers)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| MetalError::Refused(format!("cannot build the HTTP client: {e}")))?;
        let base_url = config.base_url.trim_end_matches('/').to_string();
        crate::provider::discipline::credential_url_allowed(&base_url, config.allow_plain_http)
            .map_err(MetalError::Refused)?;
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
    pub fn set_api_rate(&self, rate: Rate) {
        self.inner.gate.set_rate(rate);
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
        self.list_all(
            Operation::FindProjectHardwareReservations,
            &path,
            include,
            |p: ReservationPage| (p.hardware_reservations, p.meta),
            |r| r.id,
        )
        .await
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
        self.list_all(
            Operation::FindProjectDevices,
            &path,
            &[],
            |p: DevicePage| (p.devices, p.meta),
            |d| d.id,
        )
        .await
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

    /// Deletes a device, asking `fence` right before each attempt leaves.
    /// `Ok(false)` when Metal accepted the delete, `Ok(true)` when it
    /// answered 404 (on any attempt): one absence, which the caller
    /// confirms before it believes the device gone. A retry budget spent on
    /// answers that were not seen ends as `Ambiguous`: the device may be
    /// gone or not.
    pub async fn delete_device_fenced(
        &self,
        id: Uuid,
        fence: &dyn Fence,
    ) -> Result<bool, MetalError> {
        let unseen = AtomicBool::new(false);
        let result = retry(&self.inner.retry, "deleteDevice", |_| async {
            let call = Call {
                op: Operation::DeleteDevice,
                method: Method::DELETE,
                path: format!("/devices/{id}"),
                query: vec![],
                body: None,
            };
            let r = self
                .attempt_paced(&call, None, Some(fence))
                .await
                .and_then(|(status, body)| no_content(Operation::DeleteDevice, status, &body));
            match r {
                Ok(()) => Ok(false),
                // One absence, first attempt or not: the caller confirms
                // it before it believes the device gone.
                Err(MetalError::NotFound { .. }) => Ok(true),
                Err(e) => {
                    if matches!(
                        e,
                        MetalError::Transient { .. } | MetalError::Undecodable { .. }
                    ) {
                        unseen.store(true, Ordering::Relaxed);
                    }
                    Err(e)
                }
            }
        })
        .await;
        match result {
            Err(e) if unseen.load(Ordering::Relaxed) && e.is_retryable() => {
                Err(MetalError::Ambiguous {
                    op: Operation::DeleteDevice,
                    attempts: 0,
                    reason: e.to_string(),
                })
            }
            other => other,
        }
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
    /// Before every attempt (but a first one with a listing's hint,
    /// `CreateDevice::first`) the reservation is read with its device: a
    /// device carrying our witness is the result (a previous attempt, or a
    /// previous process, made it); any other device means the reservation
    /// was taken (`RaceLost`). A POST that fails without a clear refusal is
    /// never repeated blindly: the next attempt starts with that read. In
    /// the normal case this is two calls, one with a hint; after an
    /// accepted-then-failed POST, three.
    pub async fn create_device(&self, req: &CreateDevice) -> Result<CreatedDevice, MetalError> {
        self.create_device_paced(
            req,
            &LocalPacer::new(Rate::UNLIMITED),
            &crate::provider::discipline::Open,
        )
        .await
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
