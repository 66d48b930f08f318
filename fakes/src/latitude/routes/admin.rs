//! The admin API (`/_fake/...`): faults, weather, the calls seen, the
//! world's state, and the servers, statuses and stock a test sets.

use super::*;

pub(super) async fn admin_faults(State(shared): State<Arc<Shared>>) -> Json<Faults> {
    Json(
        shared
            .faults
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
            .clone(),
    )
}

pub(super) async fn admin_set_faults(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let faults: Faults = if body.iter().all(u8::is_ascii_whitespace) {
        Faults::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(f) => f,
            Err(e) => return (StatusCode::UNPROCESSABLE_ENTITY, e.to_string()).into_response(),
        }
    };
    shared
        .faults
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .0 = faults.clone();
    Json(faults).into_response()
}

pub(super) async fn admin_calls(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let calls = shared
        .calls
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let operations: serde_json::Map<String, Value> = Call::ALL
        .iter()
        .map(|c| {
            (
                c.id().to_string(),
                json!(calls.get(c).copied().unwrap_or(0)),
            )
        })
        .collect();
    Json(json!({ "total": calls.values().sum::<u64>(), "operations": operations }))
}

pub(super) async fn admin_state(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let world = shared.world();
    Json(json!({
        "servers": world.snapshot(Instant::now()),
        "stock": world.plans,
        "duplicate_hostnames": world.duplicate_hostnames,
    }))
}

pub(super) async fn admin_weather(
    State(shared): State<Arc<Shared>>,
) -> Json<crate::latitude::Weather> {
    Json(shared.world().weather.clone())
}

pub(super) async fn admin_set_weather(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let weather: crate::latitude::Weather = if body.iter().all(u8::is_ascii_whitespace) {
        crate::latitude::Weather::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(w) => w,
            Err(e) => return (StatusCode::UNPROCESSABLE_ENTITY, e.to_string()).into_response(),
        }
    };
    shared.world().weather = weather.clone();
    Json(weather).into_response()
}

#[derive(Deserialize)]
struct ForeignServer {
    project: String,
    plan: String,
    site: String,
    hostname: String,
}

pub(super) async fn admin_add_server(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let f: ForeignServer = match serde_json::from_slice(&body) {
        Ok(f) => f,
        Err(e) => return (StatusCode::UNPROCESSABLE_ENTITY, e.to_string()).into_response(),
    };
    let id = shared
        .world()
        .add_foreign(&f.project, &f.plan, &f.site.to_uppercase(), &f.hostname);
    (StatusCode::CREATED, Json(json!({ "id": id }))).into_response()
}

pub(super) async fn admin_reclaim_server(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Response {
    let mut world = shared.world();
    match world.find(&id) {
        Some(i) => {
            world.delete(i);
            StatusCode::NO_CONTENT.into_response()
        }
        None => (StatusCode::NOT_FOUND, format!("no server {id}")).into_response(),
    }
}

/// `PUT /_fake/servers/{id}/status`: `{"status": "off"}` sets any word
/// (null hands the server back to its deployment's course);
/// `"age_s": N` moves its `created_at` N seconds back.
#[derive(Deserialize)]
struct SetServerStatus {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    age_s: Option<u64>,
}

pub(super) async fn admin_set_server_status(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let set: SetServerStatus = match serde_json::from_slice(&body) {
        Ok(s) => s,
        Err(e) => return (StatusCode::UNPROCESSABLE_ENTITY, e.to_string()).into_response(),
    };
    let mut world = shared.world();
    let Some(i) = world.find(&id) else {
        return (StatusCode::NOT_FOUND, format!("no server {id}")).into_response();
    };
    let server = &mut world.servers[i];
    server.status = set.status;
    if let Some(age) = set.age_s {
        let age = chrono::TimeDelta::try_seconds(age.min(i64::MAX as u64 / 1000) as i64)
            .unwrap_or(chrono::TimeDelta::zero());
        server.created_at = server
            .created_at
            .checked_sub_signed(age)
            .unwrap_or(server.created_at);
    }
    StatusCode::NO_CONTENT.into_response()
}

#[derive(Deserialize)]
struct SetStock {
    plan: String,
    site: String,
    count: u32,
}

pub(super) async fn admin_set_stock(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let s: SetStock = match serde_json::from_slice(&body) {
        Ok(s) => s,
        Err(e) => return (StatusCode::UNPROCESSABLE_ENTITY, e.to_string()).into_response(),
    };
    if shared.world().set_stock(&s.plan, &s.site, s.count) {
        StatusCode::NO_CONTENT.into_response()
    } else {
        (StatusCode::NOT_FOUND, format!("no plan {}", s.plan)).into_response()
    }
}
