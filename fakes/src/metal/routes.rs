//! HTTP: the routes, the gate every Metal call passes (counting, auth,
//! latency, faults), the handlers, and the admin API.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::handler::Handler;
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use chrono::Utc;
use futures::StreamExt;
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::faults::{FaultKind, Faults};
use super::input;
use super::reply::ApiError;
use super::state::{DeviceFilter, Embed, KeyOwner, ReservationFilter, World};
use super::{API_PREFIX, RequestRecord, Shared, metal_path};
use shepherd::metal::Operation;

/// What packngo reads as the hourly budget when it is rate limited.
const RATE_LIMIT: u64 = 4500;
const MAX_PAGE: u64 = 100_000;
const MAX_PER_PAGE: u64 = 1000;
const DEFAULT_PER_PAGE: u64 = 10;

pub(super) fn router(shared: Arc<Shared>) -> Router {
    let gate = |op: Operation| {
        middleware::from_fn_with_state(
            Gate {
                shared: Arc::clone(&shared),
                op,
            },
            gate,
        )
    };
    Router::new()
        .route(
            metal_path!("/projects/{id}"),
            get(get_project.layer(gate(Operation::FindProjectById))),
        )
        .route(
            metal_path!("/projects/{id}/hardware-reservations"),
            get(list_reservations.layer(gate(Operation::FindProjectHardwareReservations))),
        )
        .route(
            metal_path!("/hardware-reservations/{id}"),
            get(get_reservation.layer(gate(Operation::FindHardwareReservationById))),
        )
        .route(
            metal_path!("/hardware-reservations/{id}/move"),
            axum::routing::post(move_reservation.layer(gate(Operation::MoveHardwareReservation))),
        )
        .route(
            metal_path!("/projects/{id}/devices"),
            get(list_devices.layer(gate(Operation::FindProjectDevices)))
                .post(create_device.layer(gate(Operation::CreateDevice))),
        )
        .route(
            metal_path!("/devices/{id}"),
            get(get_device.layer(gate(Operation::FindDeviceById)))
                .put(update_device.layer(gate(Operation::UpdateDevice)))
                .patch(update_device.layer(gate(Operation::UpdateDevice)))
                .delete(delete_device.layer(gate(Operation::DeleteDevice))),
        )
        .route(
            metal_path!("/devices/{id}/actions"),
            axum::routing::post(perform_action.layer(gate(Operation::PerformAction))),
        )
        .route(
            metal_path!("/projects/{id}/ssh-keys"),
            get(list_project_keys.layer(gate(Operation::FindProjectSshKeys)))
                .post(create_project_key.layer(gate(Operation::CreateProjectSshKey))),
        )
        .route(
            metal_path!("/ssh-keys"),
            get(list_user_keys.layer(gate(Operation::FindSshKeys)))
                .post(create_user_key.layer(gate(Operation::CreateSshKey))),
        )
        .route(
            metal_path!("/ssh-keys/{id}"),
            get(get_key.layer(gate(Operation::FindSshKeyById)))
                .put(update_key.layer(gate(Operation::UpdateSshKey)))
                .patch(update_key.layer(gate(Operation::UpdateSshKey)))
                .delete(delete_key.layer(gate(Operation::DeleteSshKey))),
        )
        .route("/_fake/faults", get(admin_faults).put(admin_set_faults))
        .route("/_fake/calls", get(admin_calls))
        .route("/_fake/state", get(admin_state))
        .fallback(unknown_path)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::map_response(with_request_id))
        .with_state(shared)
}

// ----- the gate -----

#[derive(Clone)]
struct Gate {
    shared: Arc<Shared>,
    op: Operation,
}

/// The fault the gate drew for a request that it let through, for the
/// handlers whose work the fault changes.
#[derive(Clone)]
struct ActiveFault(Option<FaultKind>);

async fn gate(State(gate): State<Gate>, mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let Gate { shared, op } = gate;
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    shared.count(op);

    let latency = shared.latency();
    if latency > Duration::ZERO {
        tokio::time::sleep(latency).await;
    }
    let response = if !shared.authorized(request.headers()) {
        ApiError::unauthorized().into_response()
    } else {
        match shared.pick_fault(op) {
            Some(FaultKind::Status { status }) => ApiError::status(status).into_response(),
            Some(FaultKind::RateLimited { retry_after_secs }) => rate_limited(retry_after_secs),
            Some(FaultKind::Garbage { body, status }) => garbage(body, status),
            fault => {
                request.extensions_mut().insert(ActiveFault(fault));
                next.run(request).await
            }
        }
    };

    let status = response.status().as_u16();
    tracing::debug!(%op, %method, %path, status, "fake Metal answered");
    shared.record(RequestRecord {
        op,
        method,
        path,
        status,
        started,
        finished: Instant::now(),
    });
    response
}

fn rate_limited(retry_after_secs: u64) -> Response {
    let reset = Utc::now()
        .timestamp()
        .saturating_add(i64::try_from(retry_after_secs).unwrap_or(i64::MAX));
    let mut response =
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "Rate limit exceeded").into_response();
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
    headers.insert("x-ratelimit-limit", HeaderValue::from(RATE_LIMIT));
    headers.insert("x-ratelimit-remaining", HeaderValue::from(0u64));
    headers.insert("x-ratelimit-reset", HeaderValue::from(reset));
    response
}

fn garbage(body: String, status: u16) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    (status, [(CONTENT_TYPE, "application/json")], body).into_response()
}

/// A 201 whose body breaks off half-way, as when the connection drops
/// after the server committed to the create.
fn dropped_after(value: &Value) -> Response {
    let text = Bytes::from(value.to_string());
    let half = text.slice(..text.len() / 2);
    let chunks = futures::stream::once(async move { Ok::<_, io::Error>(half) }).chain(
        futures::stream::once(async {
            // Lets the head and the first half reach the client first, so it
            // fails while reading the body rather than before the status.
            tokio::time::sleep(Duration::from_millis(20)).await;
            Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "fake Metal API dropped the connection",
            ))
        }),
    );
    (
        StatusCode::CREATED,
        [(CONTENT_TYPE, "application/json")],
        Body::from_stream(chunks),
    )
        .into_response()
}

async fn with_request_id(mut response: Response) -> Response {
    if let Ok(id) = HeaderValue::try_from(Uuid::new_v4().to_string()) {
        response.headers_mut().insert("x-request-id", id);
    }
    response
}

/// An unknown path is a 404, but for one client quirk the real service
/// tolerated: packet-python joins an absolute href (`/metal/v1/...`) onto a
/// base that already ends in `/metal/v1`, and the real server, which served
/// from its root, accepted the doubled prefix. The fake sends such a client
/// to the path it meant.
async fn unknown_path(uri: axum::http::Uri) -> Response {
    const DOUBLED: &str = "/metal/v1//metal/v1/";
    match uri.path().strip_prefix(DOUBLED) {
        Some(rest) => {
            let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
            let to = format!("/metal/v1/{rest}{query}");
            match HeaderValue::try_from(to) {
                Ok(location) => (
                    StatusCode::PERMANENT_REDIRECT,
                    [(axum::http::header::LOCATION, location)],
                )
                    .into_response(),
                Err(_) => ApiError::not_found().into_response(),
            }
        }
        None => ApiError::not_found().into_response(),
    }
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed")
}

// ----- extraction, in the API's error shapes -----

/// An `{id}` path segment. One that is not a UUID cannot name anything, so
/// it is a 404 like any unknown id, as the real API answers.
struct IdPath(Uuid);

impl<S: Send + Sync> FromRequestParts<S> for IdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::not_found())?;
        raw.parse().map(IdPath).map_err(|_| ApiError::not_found())
    }
}

/// The query string, last value winning for a repeated key.
struct Params(HashMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        Query::<HashMap<String, String>>::try_from_uri(&parts.uri)
            .map(|Query(params)| Params(params))
            .map_err(|rejection| ApiError::unprocessable(rejection.body_text()))
    }
}

impl Params {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Whether a comma-joined `include`/`exclude` value names `name`.
    fn lists(&self, key: &str, name: &str) -> bool {
        self.get(key)
            .is_some_and(|value| value.split(',').any(|item| item.trim() == name))
    }

    fn embed(&self) -> Embed {
        let wanted = |name| self.lists("include", name) && !self.lists("exclude", name);
        Embed {
            device: wanted("device"),
            facility: wanted("facility"),
        }
    }
}

/// The raw body. It is parsed by the handler, after the path is checked, so
/// that a bad id wins over a bad body as it does in the real API.
struct RawBody(Bytes);

impl<S: Send + Sync> FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        Bytes::from_request(request, state)
            .await
            .map(RawBody)
            .map_err(|rejection| ApiError::new(rejection.status(), rejection.body_text()))
    }
}

impl RawBody {
    /// An empty body reads as `{}`: every field of every input is optional.
    fn parse<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        let bytes: &[u8] = if self.0.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &self.0
        };
        serde_json::from_slice(bytes)
            .map_err(|error| ApiError::unprocessable(format!("Invalid JSON body: {error}")))
    }
}

/// `page` and `per_page`, checked against the spec's bounds.
struct Page {
    number: u64,
    per_page: u64,
}

impl Page {
    fn from_params(params: &Params) -> Result<Self, ApiError> {
        Ok(Page {
            number: bounded(params, "page", 1, MAX_PAGE)?,
            per_page: bounded(params, "per_page", DEFAULT_PER_PAGE, MAX_PER_PAGE)?,
        })
    }

    fn slice<'a, T>(&self, items: &'a [T]) -> &'a [T] {
        let start = (self.number - 1).saturating_mul(self.per_page);
        let start = usize::try_from(start)
            .unwrap_or(usize::MAX)
            .min(items.len());
        let len = usize::try_from(self.per_page).unwrap_or(usize::MAX);
        &items[start..start.saturating_add(len).min(items.len())]
    }

    /// Pagination links carry `page` and `per_page` only, under the API
    /// prefix like every other href.
    fn meta(&self, path: &str, total: usize) -> Value {
        let total = u64::try_from(total).unwrap_or(u64::MAX);
        let last = total.div_ceil(self.per_page).max(1);
        let link =
            |page: u64| json!({ "href": format!("{path}?page={page}&per_page={}", self.per_page) });
        let mut meta = json!({
            "first": link(1),
            "last": link(last),
            "self": link(self.number),
            "total": total,
            "current_page": self.number,
            "last_page": last,
        });
        // Always present, null at the ends, as the real API answered
        // (packet-python reads `meta["next"]` and fails without the key).
        meta["previous"] = if self.number > 1 {
            link(self.number - 1)
        } else {
            Value::Null
        };
        meta["next"] = if self.number < last {
            link(self.number + 1)
        } else {
            Value::Null
        };
        meta
    }
}

fn bounded(params: &Params, key: &str, default: u64, max: u64) -> Result<u64, ApiError> {
    let Some(raw) = params.get(key) else {
        return Ok(default);
    };
    raw.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| ApiError::unprocessable(format!("{key} must be an integer from 1 to {max}")))
}

fn created(value: Value) -> Response {
    (StatusCode::CREATED, Json(value)).into_response()
}

// ----- reservations -----

async fn list_reservations(
    State(shared): State<Arc<Shared>>,
    IdPath(project): IdPath,
    params: Params,
) -> Result<Json<Value>, ApiError> {
    let page = Page::from_params(&params)?;
    let filter = ReservationFilter {
        provisionable_only: matches!(params.get("provisionable"), Some("only" | "true")),
        state: params.get("state"),
    };
    let now = Instant::now();
    let world = shared.world();
    if !world.project_known(project) {
        return Err(ApiError::not_found());
    }
    let all = world.project_reservations(project, filter, now);
    let embed = params.embed();
    let items: Vec<Value> = page
        .slice(&all)
        .iter()
        .map(|r| world.reservation_json(r, embed, true, now))
        .collect();
    let meta = page.meta(
        &format!("{API_PREFIX}/projects/{project}/hardware-reservations"),
        all.len(),
    );
    Ok(Json(
        json!({ "hardware_reservations": items, "meta": meta }),
    ))
}

async fn get_reservation(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    Extension(ActiveFault(fault)): Extension<ActiveFault>,
    params: Params,
) -> Result<Json<Value>, ApiError> {
    let now = Instant::now();
    let mut world = shared.world();
    if matches!(fault, Some(FaultKind::StealReservation)) {
        world.steal(id, now);
    }
    let reservation = world.reservation(id).ok_or_else(ApiError::not_found)?;
    Ok(Json(world.reservation_json(
        reservation,
        params.embed(),
        false,
        now,
    )))
}

async fn move_reservation(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    params: Params,
    body: RawBody,
) -> Result<Response, ApiError> {
    let now = Instant::now();
    let mut world = shared.world();
    if world.reservation(id).is_none() {
        return Err(ApiError::not_found());
    }
    world.move_reservation(id, body.parse()?)?;
    let reservation = world.reservation(id).ok_or_else(ApiError::not_found)?;
    Ok(created(world.reservation_json(
        reservation,
        params.embed(),
        false,
        now,
    )))
}

// ----- devices -----

async fn list_devices(
    State(shared): State<Arc<Shared>>,
    IdPath(project): IdPath,
    params: Params,
) -> Result<Json<Value>, ApiError> {
    let page = Page::from_params(&params)?;
    let filter = DeviceFilter {
        hostname: params.get("hostname"),
        tag: params.get("tag"),
    };
    let now = Instant::now();
    let world = shared.world();
    if !world.project_known(project) {
        return Err(ApiError::not_found());
    }
    let all = world.project_devices(project, filter);
    let items: Vec<Value> = page
        .slice(&all)
        .iter()
        .map(|id| world.device_json(*id, now))
        .collect();
    let meta = page.meta(
        &format!("{API_PREFIX}/projects/{project}/devices"),
        all.len(),
    );
    Ok(Json(json!({ "devices": items, "meta": meta })))
}

async fn create_device(
    State(shared): State<Arc<Shared>>,
    IdPath(project): IdPath,
    Extension(ActiveFault(fault)): Extension<ActiveFault>,
    body: RawBody,
) -> Result<Response, ApiError> {
    let now = Instant::now();
    let mut device = {
        let mut world = shared.world();
        if !world.project_known(project) {
            return Err(ApiError::not_found());
        }
        let steal = matches!(fault, Some(FaultKind::StealReservation));
        let id = world.create_device(project, body.parse()?, steal, now)?;
        world.device_json(id, now)
    };
    // Creation is asynchronous: the answer to the create is always the
    // start of the lifecycle, however short the configured delays.
    device["state"] = json!("queued");
    Ok(match fault {
        Some(FaultKind::AcceptThenFail { status }) => ApiError::status(status).into_response(),
        Some(FaultKind::AcceptThenDrop) => dropped_after(&device),
        _ => created(device),
    })
}

/// The project, as official clients follow its link (`packet-python`
/// reads it before listing a project's devices).
async fn get_project(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
) -> Result<Json<Value>, ApiError> {
    let world = shared.world();
    if !world.project_known(id) {
        return Err(ApiError::not_found());
    }
    Ok(Json(world.project_json()))
}

async fn get_device(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
) -> Result<Json<Value>, ApiError> {
    let world = shared.world();
    if !world.device_exists(id) {
        return Err(ApiError::not_found());
    }
    Ok(Json(world.device_json(id, Instant::now())))
}

async fn update_device(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    body: RawBody,
) -> Result<Json<Value>, ApiError> {
    let mut world = shared.world();
    if !world.device_exists(id) {
        return Err(ApiError::not_found());
    }
    world.update_device(id, body.parse()?)?;
    Ok(Json(world.device_json(id, Instant::now())))
}

async fn delete_device(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    body: RawBody,
) -> Result<StatusCode, ApiError> {
    let mut world = shared.world();
    if !world.device_exists(id) {
        return Err(ApiError::not_found());
    }
    // `force_delete` may come in the body or the query; either way there is
    // nothing in the fake it would force past, but a broken body is still
    // an error.
    body.parse::<IgnoredAny>()?;
    world.delete_device(id, Instant::now())?;
    Ok(StatusCode::NO_CONTENT)
}

async fn perform_action(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    body: RawBody,
) -> Result<StatusCode, ApiError> {
    let mut world = shared.world();
    if !world.device_exists(id) {
        return Err(ApiError::not_found());
    }
    world.perform_action(id, body.parse::<input::DeviceAction>()?, Instant::now())?;
    Ok(StatusCode::ACCEPTED)
}

// ----- SSH keys -----

async fn list_project_keys(
    State(shared): State<Arc<Shared>>,
    IdPath(project): IdPath,
) -> Result<Json<Value>, ApiError> {
    let world = shared.world();
    let owner = world
        .owner_of_project(project)
        .ok_or_else(ApiError::not_found)?;
    Ok(Json(world.keys_json(owner)))
}

async fn create_project_key(
    State(shared): State<Arc<Shared>>,
    IdPath(project): IdPath,
    body: RawBody,
) -> Result<Response, ApiError> {
    let mut world = shared.world();
    let owner = world
        .owner_of_project(project)
        .ok_or_else(ApiError::not_found)?;
    create_key(&mut world, owner, &body)
}

async fn list_user_keys(State(shared): State<Arc<Shared>>) -> Json<Value> {
    Json(shared.world().keys_json(KeyOwner::User))
}

async fn create_user_key(
    State(shared): State<Arc<Shared>>,
    body: RawBody,
) -> Result<Response, ApiError> {
    create_key(&mut shared.world(), KeyOwner::User, &body)
}

fn create_key(world: &mut World, owner: KeyOwner, body: &RawBody) -> Result<Response, ApiError> {
    let id = world.create_key(owner, body.parse::<input::SshKey>()?)?;
    let key = world.key(id).ok_or_else(ApiError::not_found)?;
    Ok(created(world.key_json(key)))
}

async fn get_key(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
) -> Result<Json<Value>, ApiError> {
    let world = shared.world();
    let key = world.key(id).ok_or_else(ApiError::not_found)?;
    Ok(Json(world.key_json(key)))
}

async fn update_key(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
    body: RawBody,
) -> Result<Json<Value>, ApiError> {
    let mut world = shared.world();
    if world.key(id).is_none() {
        return Err(ApiError::not_found());
    }
    world.update_key(id, body.parse()?)?;
    let key = world.key(id).ok_or_else(ApiError::not_found)?;
    Ok(Json(world.key_json(key)))
}

async fn delete_key(
    State(shared): State<Arc<Shared>>,
    IdPath(id): IdPath,
) -> Result<StatusCode, ApiError> {
    shared.world().delete_key(id)?;
    Ok(StatusCode::NO_CONTENT)
}

// ----- admin -----

async fn admin_faults(State(shared): State<Arc<Shared>>) -> Json<Faults> {
    Json(shared.faults())
}

async fn admin_set_faults(
    State(shared): State<Arc<Shared>>,
    body: RawBody,
) -> Result<Json<Faults>, ApiError> {
    let faults: Faults = body.parse()?;
    shared.set_faults(faults.clone());
    Ok(Json(faults))
}

async fn admin_calls(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let operations: Map<String, Value> = Operation::ALL
        .into_iter()
        .map(|op| (op.id().to_owned(), json!(shared.calls(op))))
        .collect();
    Json(json!({ "total": shared.total_calls(), "operations": operations }))
}

async fn admin_state(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let now = Instant::now();
    let world = shared.world();
    Json(json!({
        "reservations": world.reservation_snapshots(now),
        "devices": world.device_snapshots(now),
        "ssh_keys": world.key_snapshots(),
        "duplicate_creates": world.duplicate_creates,
    }))
}
