//! HTTP: the routes, the gate every call passes (auth, latency, the key's
//! rate limits, faults) and the handlers of servers and plans; SSH keys
//! and tags in `routes/keys.rs`, the admin API in `routes/admin.rs`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::handler::Handler;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::world::{HostnameOperators, NewServer, Refusal};
use super::{Call, FaultKind, Faults, RequestRecord, Shared};

mod admin;
mod keys;
use admin::*;
use keys::*;

/// What every JSON answer is labelled; the official SDK refuses
/// `application/json`.
const JSON_API: &str = "application/vnd.api+json; charset=utf-8";
const DEFAULT_PAGE_SIZE: usize = 20;

pub(super) fn router(shared: Arc<Shared>) -> Router {
    let gate = |call: Call| {
        middleware::from_fn_with_state(
            Gate {
                shared: Arc::clone(&shared),
                call,
            },
            gate,
        )
    };
    Router::new()
        .route(
            "/servers",
            get(list_servers.layer(gate(Call::GetServers)))
                .post(create_server.layer(gate(Call::CreateServer))),
        )
        .route(
            "/servers/{id}",
            get(get_server.layer(gate(Call::GetServer)))
                .patch(update_server.layer(gate(Call::UpdateServer)))
                .delete(destroy_server.layer(gate(Call::DestroyServer))),
        )
        .route("/plans", get(list_plans.layer(gate(Call::GetPlans))))
        .route(
            "/ssh_keys",
            get(list_keys.layer(gate(Call::GetSshKeys)))
                .post(create_key.layer(gate(Call::PostSshKey))),
        )
        .route(
            "/ssh_keys/{id}",
            get(get_key.layer(gate(Call::GetSshKey)))
                .patch(update_key.layer(gate(Call::PutSshKey)))
                .delete(delete_key.layer(gate(Call::DeleteSshKey))),
        )
        .route(
            "/tags",
            get(list_tags.layer(gate(Call::GetTags))).post(create_tag.layer(gate(Call::CreateTag))),
        )
        .route("/_fake/faults", get(admin_faults).put(admin_set_faults))
        .route("/_fake/calls", get(admin_calls))
        .route("/_fake/state", get(admin_state))
        .route("/_fake/stock", axum::routing::put(admin_set_stock))
        .route("/_fake/weather", get(admin_weather).put(admin_set_weather))
        .route("/_fake/servers", axum::routing::post(admin_add_server))
        .route(
            "/_fake/servers/{id}",
            axum::routing::delete(admin_reclaim_server),
        )
        .route(
            "/_fake/servers/{id}/status",
            axum::routing::put(admin_set_server_status),
        )
        .fallback(|| async { error(404, "not_found", "Error", "Specified Record Not Found") })
        .with_state(shared)
}

// ----- answers -----

fn answer(status: u16, body: &Value) -> Response {
    let mut response = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
        body.to_string(),
    )
        .into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(JSON_API));
    response
}

/// `{"errors": [..]}`, the document's `error_object`.
fn error(status: u16, code: &str, title: &str, detail: &str) -> Response {
    error_with(status, code, title, detail, None, json!({}))
}

fn error_with(
    status: u16,
    code: &str,
    title: &str,
    detail: &str,
    pointer: Option<&str>,
    meta: Value,
) -> Response {
    let mut e = json!({
        "code": code, "status": status.to_string(), "title": title, "detail": detail, "meta": meta,
    });
    if let Some(p) = pointer {
        e["source"] = json!({ "pointer": p });
    }
    answer(status, &json!({ "errors": [e] }))
}

/// What a gateway in front of the API answers when the origin is slow: an
/// HTML page, not the API's JSON.
fn gateway_page(status: u16) -> Response {
    let mut response = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::GATEWAY_TIMEOUT),
        format!(
            "<!DOCTYPE html>\n<html><head><title>api.latitude.sh | {status}: Gateway time-out</title></head>\n\
             <body><h1>Gateway time-out</h1><p>The web server reported a gateway time-out error.</p></body></html>\n"
        ),
    )
        .into_response();
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=UTF-8"),
    );
    response
}

fn refused(r: Refusal) -> Response {
    error_with(r.status, r.code, r.title, &r.detail, r.pointer, json!({}))
}

fn not_found() -> Response {
    error(404, "not_found", "Error", "Specified Record Not Found")
}

fn rate_limited(retry_after: u64) -> Response {
    error_with(
        429,
        "RATE_LIMIT_EXCEEDED",
        "Too Many Requests",
        "Rate limit exceeded",
        None,
        json!({ "retry_after": retry_after }),
    )
}

// ----- the gate -----

#[derive(Clone)]
struct Gate {
    shared: Arc<Shared>,
    call: Call,
}

/// The fault drawn for a request the gate let through.
#[derive(Clone)]
struct ActiveFault(Option<FaultKind>);

async fn gate(State(gate): State<Gate>, mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let Gate { shared, call } = gate;
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let latency = shared.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let key = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let response = if !shared.authorized(key) {
        error(
            401,
            "UNAUTHORIZED",
            "Unauthorized",
            "Invalid or missing API key",
        )
    } else if let Err(wait) = shared
        .budget
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take(call.is_read(), Instant::now())
    {
        rate_limited(wait)
    } else {
        match shared.pick_fault(call) {
            Some(FaultKind::Status { status }) => {
                error(status, "INTERNAL_ERROR", "Error", "Something went wrong")
            }
            Some(FaultKind::RateLimited { retry_after_secs }) => rate_limited(retry_after_secs),
            fault => {
                request.extensions_mut().insert(ActiveFault(fault));
                next.run(request).await
            }
        }
    };
    shared.record(RequestRecord {
        call,
        method,
        path,
        status: response.status().as_u16(),
        started,
        finished: Instant::now(),
    });
    response
}

// ----- parameters -----

/// The query, bracketed names as they are (`filter[hostname]`).
type Params = Query<HashMap<String, String>>;

fn page(params: &HashMap<String, String>) -> Result<(usize, usize), Refusal> {
    let number = |key: &str, default: usize| match params.get(key) {
        None => Ok(default),
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| Refusal {
                status: 400,
                code: "VALIDATION_ERROR",
                title: "Validation Error",
                detail: format!("{key} must be a whole number of 1 or more"),
                pointer: None,
            }),
    };
    Ok((
        number("page[number]", 1)?,
        number("page[size]", DEFAULT_PAGE_SIZE)?,
    ))
}

/// One page of `items`, with `meta` as the API sends it: empty unless the
/// total was asked for.
fn paged(items: Vec<Value>, params: &HashMap<String, String>) -> Response {
    let (number, size) = match page(params) {
        Ok(p) => p,
        Err(e) => return refused(e),
    };
    let total = items.len();
    let data: Vec<Value> = items
        .into_iter()
        .skip((number - 1).saturating_mul(size))
        .take(size)
        .collect();
    let meta = if params.get("stats[total]").map(String::as_str) == Some("count") {
        json!({ "stats": { "total": { "count": total } } })
    } else {
        json!({})
    };
    answer(200, &json!({ "data": data, "meta": meta }))
}

/// `{"data": {"type": .., "attributes": {..}}}`, or a 422 naming what is
/// wrong with it.
fn envelope<T: for<'de> Deserialize<'de>>(body: &Bytes, kind: &str) -> Result<T, Refusal> {
    #[derive(Deserialize)]
    struct Data<A> {
        data: Inner<A>,
    }
    #[derive(Deserialize)]
    struct Inner<A> {
        #[serde(rename = "type")]
        kind: String,
        attributes: A,
    }
    let bad = |detail: String| Refusal {
        status: 422,
        code: "VALIDATION_ERROR",
        title: "Validation Error",
        detail,
        pointer: Some("/data"),
    };
    let parsed: Data<T> =
        serde_json::from_slice(body).map_err(|e| bad(format!("Invalid request body: {e}")))?;
    if parsed.data.kind != kind {
        return Err(bad(format!(
            "data.type must be {kind}, not {}",
            parsed.data.kind
        )));
    }
    Ok(parsed.data.attributes)
}

// ----- servers -----

async fn list_servers(State(shared): State<Arc<Shared>>, Query(params): Params) -> Response {
    let now = Instant::now();
    let world = shared.world();
    let project = match params.get("filter[project]") {
        Some(p) if world.is_project(p) => Some(world.project.clone()),
        // Another project of the team: its id as given.
        Some(p) => Some(p.clone()),
        None => None,
    };
    let wanted = |key: &str, value: &str| params.get(key).is_none_or(|w| w == value);
    let mut servers: Vec<_> = world
        .listing(now)
        .into_iter()
        .filter(|s| {
            project.as_ref().is_none_or(|p| *p == s.project)
                && hostname_wanted(&params, &s.hostname, world.weather.hostname_operators)
                && wanted("filter[plan]", &s.plan)
                && wanted("filter[region]", &s.site)
                && wanted("filter[status]", world.status(s, now))
                && params
                    .get("filter[tags]")
                    .is_none_or(|tags| tags.split(',').all(|t| s.tags.iter().any(|have| have == t)))
        })
        .collect();
    // `sort`: fields with `-` for descending; listings are otherwise in
    // creation order.
    if let Some(sort) = params.get("sort") {
        for field in sort.split(',').rev() {
            let (descending, field) = match field.strip_prefix('-') {
                Some(f) => (true, f),
                None => (false, field),
            };
            match field {
                "created_at" => servers.sort_by_key(|s| s.created),
                "hostname" => servers.sort_by(|a, b| a.hostname.cmp(&b.hostname)),
                "location" => servers.sort_by(|a, b| a.site.cmp(&b.site)),
                "operating_system" => servers.sort_by(|a, b| a.os.cmp(&b.os)),
                other => {
                    return error_with(
                        400,
                        "VALIDATION_ERROR",
                        "Validation Error",
                        &format!("sort by {other} is not supported"),
                        None,
                        json!({ "parameter": "sort" }),
                    );
                }
            }
            if descending {
                servers.reverse();
            }
        }
    }
    let items = servers
        .into_iter()
        .map(|s| world.server_json(s, now, true))
        .collect();
    paged(items, &params)
}

/// `filter[hostname]` and its operators as the SDK names them (3.4.6):
/// `[eql]` exact, `[prefix]`, `[suffix]`, and `[match]` anywhere in the
/// name. Every one given must hold.
fn hostname_wanted(
    params: &HashMap<String, String>,
    hostname: &str,
    operators: HostnameOperators,
) -> bool {
    let holds = |key: &str, test: fn(&str, &str) -> bool| {
        let test: fn(&str, &str) -> bool = match operators {
            HostnameOperators::Honoured => test,
            HostnameOperators::Ignored => |_: &str, _: &str| true,
            HostnameOperators::Exact => |h: &str, w: &str| h == w,
        };
        params.get(key).is_none_or(|w| test(hostname, w))
    };
    params.get("filter[hostname]").is_none_or(|w| w == hostname)
        && holds("filter[hostname][eql]", |h, w| h == w)
        && holds("filter[hostname][prefix]", |h, w| h.starts_with(w))
        && holds("filter[hostname][suffix]", |h, w| h.ends_with(w))
        && holds("filter[hostname][match]", |h, w| h.contains(w))
}

async fn get_server(
    State(shared): State<Arc<Shared>>,
    Extension(fault): Extension<ActiveFault>,
    Path(id): Path<String>,
) -> Response {
    let world = shared.world();
    let now = Instant::now();
    let Some(i) = world
        .find(&id)
        .filter(|i| world.readable(&world.servers[*i], now))
    else {
        return not_found();
    };
    let mut data = world.server_json(&world.servers[i], now, true);
    match fault.0 {
        Some(FaultKind::WrongBody { no_project: true }) => {
            if let Some(a) = data.get_mut("attributes").and_then(Value::as_object_mut) {
                a.remove("project");
            }
        }
        Some(FaultKind::WrongBody { no_project: false }) => {
            let other = (0..world.servers.len())
                .rev()
                .find(|j| *j != i && world.readable(&world.servers[*j], now));
            if let Some(j) = other {
                data = world.server_json(&world.servers[j], now, true);
            }
        }
        _ => {}
    }
    answer(200, &json!({ "data": data, "meta": {} }))
}

#[derive(Deserialize)]
struct CreateAttributes {
    project: Option<String>,
    plan: Option<String>,
    site: Option<String>,
    operating_system: Option<String>,
    hostname: Option<String>,
    #[serde(default)]
    ssh_keys: Option<Vec<String>>,
}

/// A write held on its way in (`FaultKind::Held`).
async fn held(fault: &ActiveFault) {
    if let Some(FaultKind::Held { ms }) = fault.0 {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
}

async fn create_server(
    State(shared): State<Arc<Shared>>,
    Extension(fault): Extension<ActiveFault>,
    body: Bytes,
) -> Response {
    held(&fault).await;
    let a: CreateAttributes = match envelope(&body, "servers") {
        Ok(a) => a,
        Err(e) => return refused(e),
    };
    let required = [
        ("project", &a.project),
        ("plan", &a.plan),
        ("site", &a.site),
        ("operating_system", &a.operating_system),
        ("hostname", &a.hostname),
    ];
    for (name, value) in required {
        if value.as_deref().is_none_or(str::is_empty) {
            return error_with(
                422,
                "VALIDATION_ERROR",
                "Validation Error",
                &format!("{name} can't be blank"),
                Some(match name {
                    "project" => "/data/attributes/project",
                    "plan" => "/data/attributes/plan",
                    "site" => "/data/attributes/site",
                    "operating_system" => "/data/attributes/operating_system",
                    _ => "/data/attributes/hostname",
                }),
                json!({}),
            );
        }
    }
    let new = NewServer {
        project: a.project.unwrap_or_default(),
        plan: a.plan.unwrap_or_default(),
        site: a.site.unwrap_or_default().to_uppercase(),
        os: a.operating_system.unwrap_or_default(),
        hostname: a.hostname.unwrap_or_default(),
        ssh_keys: a.ssh_keys.unwrap_or_default(),
    };
    let now = Instant::now();
    let mut world = shared.world();
    match fault.0 {
        Some(FaultKind::OtherPartyCreates) => world.other_party_creates(&new.plan, &new.site, now),
        Some(FaultKind::StockRunsOut) => {
            world.set_stock(&new.plan, &new.site, 0);
        }
        Some(FaultKind::CodelessOutOfStock) => {
            return answer(
                422,
                &json!({ "errors": [{
                    "status": "422",
                    "title": "Unprocessable Entity",
                    "detail": "No stock availability for the selected plan and site",
                }]}),
            );
        }
        _ => {}
    }
    let index = match world.create(new, now) {
        Ok(i) => i,
        Err(r) => return refused(r),
    };
    if fault.0 == Some(FaultKind::FailDeployment) {
        world.servers[index].failed = true;
    }
    if let Some(FaultKind::AcceptThenFail { status }) = fault.0 {
        return error(status, "INTERNAL_ERROR", "Error", "Something went wrong");
    }
    if let Some(FaultKind::GatewayTimeout { status, hidden_ms }) = fault.0 {
        world.servers[index].hidden_until = Some(now + std::time::Duration::from_millis(hidden_ms));
        return gateway_page(status);
    }
    let data = world.server_json(&world.servers[index], now, false);
    answer(201, &json!({ "data": data, "meta": {} }))
}

#[derive(Deserialize)]
struct UpdateAttributes {
    hostname: Option<String>,
    tags: Option<Vec<String>>,
    billing: Option<String>,
}

async fn update_server(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let mut world = shared.world();
    let Some(index) = world.find(&id) else {
        return not_found();
    };
    let a: UpdateAttributes = match envelope(&body, "servers") {
        Ok(a) => a,
        Err(e) => return refused(e),
    };
    if let Some(tags) = &a.tags {
        if let Some(unknown) = tags
            .iter()
            .find(|t| !world.tags.iter().any(|have| &have.id == *t))
        {
            return error_with(
                422,
                "VALIDATION_ERROR",
                "Validation Error",
                &format!("Tag {unknown} not found"),
                Some("/data/attributes/tags"),
                json!({}),
            );
        }
        world.servers[index].tags = tags.clone();
    }
    if let Some(billing) = a.billing {
        // Billing only moves up: hourly, then monthly, then yearly.
        let rank = |b: &str| ["hourly", "monthly", "yearly"].iter().position(|x| *x == b);
        match (rank(&world.servers[index].billing), rank(&billing)) {
            (Some(from), Some(to)) if to >= from => world.servers[index].billing = billing,
            _ => {
                return error_with(
                    422,
                    "VALIDATION_ERROR",
                    "Validation Error",
                    &format!(
                        "billing {billing:?}: hourly, monthly or yearly, and it can only go up"
                    ),
                    Some("/data/attributes/billing"),
                    json!({}),
                );
            }
        }
    }
    if let Some(hostname) = a.hostname {
        world.servers[index].hostname = hostname;
    }
    let data = world.server_json(&world.servers[index], Instant::now(), true);
    answer(200, &json!({ "data": data, "meta": {} }))
}

async fn destroy_server(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    Extension(fault): Extension<ActiveFault>,
) -> Response {
    held(&fault).await;
    let mut world = shared.world();
    match world.find(&id) {
        Some(i) => {
            world.delete(i);
            match fault.0 {
                Some(FaultKind::AcceptThenFail { status }) => {
                    error(status, "INTERNAL_ERROR", "Error", "Something went wrong")
                }
                Some(FaultKind::GatewayTimeout { status, .. }) => gateway_page(status),
                _ => StatusCode::NO_CONTENT.into_response(),
            }
        }
        None => not_found(),
    }
}

// ----- plans -----

async fn list_plans(State(shared): State<Arc<Shared>>, Query(params): Params) -> Response {
    let world = shared.world();
    let in_stock = params.get("filter[in_stock]").map(|v| v == "true");
    let data: Vec<Value> = world
        .plans
        .iter()
        .filter(|p| params.get("filter[slug]").is_none_or(|s| *s == p.slug))
        .filter(|p| {
            params
                .get("filter[location]")
                .is_none_or(|site| p.sites.contains_key(site))
        })
        .filter(|p| in_stock.is_none_or(|want| want == p.sites.values().any(|n| *n > 0)))
        .map(|p| world.plan_json(p))
        .collect();
    answer(200, &json!({ "data": data, "meta": {} }))
}
