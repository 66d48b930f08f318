//! The fake over real HTTP, with a plain client: what the API promises and
//! what each fault does.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

use super::*;

const TOKEN: &str = "fake-token";
const NO_KEYS: &str = "must have at least one SSH key or explicitly send no_ssh_keys option";

/// A started fake and one client for it: building a client loads the TLS
/// roots, which costs more than the whole conversation with the fake.
struct Api {
    fake: FakeMetal,
    client: reqwest::Client,
}

impl std::ops::Deref for Api {
    type Target = FakeMetal;

    fn deref(&self) -> &FakeMetal {
        &self.fake
    }
}

async fn start(config: FakeConfig) -> Api {
    let fake = FakeMetal::start(config, SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("the fake starts");
    Api {
        fake,
        client: reqwest::Client::new(),
    }
}

struct Answer {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }

    fn error(&self) -> String {
        self.json()["errors"][0]
            .as_str()
            .expect("an error body")
            .to_owned()
    }
}

async fn send(
    fake: &Api,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> Answer {
    let url = format!("{}{path}", fake.base_url());
    let mut request = fake.client.request(method, url);
    if let Some(token) = token {
        request = request.header("X-Auth-Token", token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("an answer");
    Answer {
        status: response.status(),
        headers: response.headers().clone(),
        text: response.text().await.expect("a body"),
    }
}

async fn get(fake: &Api, path: &str) -> Answer {
    send(fake, Method::GET, path, Some(TOKEN), None).await
}

async fn post(fake: &Api, path: &str, body: Value) -> Answer {
    send(fake, Method::POST, path, Some(TOKEN), Some(body)).await
}

fn devices_path(fake: &Api) -> String {
    format!("/projects/{}/devices", fake.project_id())
}

/// A create that succeeds against the reservation as generated.
fn create_body(reservation: &ReservationSnapshot, hostname: &str) -> Value {
    json!({
        "hostname": hostname,
        "plan": reservation.plan,
        "operating_system": "ubuntu_22_04",
        "metro": reservation.metro,
        "hardware_reservation_id": reservation.id,
        "no_ssh_keys": true,
        "tags": ["shepherd"],
    })
}

#[tokio::test]
async fn every_call_needs_the_token_and_every_answer_has_a_request_id() {
    let fake = start(FakeConfig::default()).await;
    let path = format!("/projects/{}/hardware-reservations", fake.project_id());
    for token in [None, Some("wrong")] {
        let answer = send(&fake, Method::GET, &path, token, None).await;
        assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
        assert_eq!(
            answer.json(),
            json!({ "errors": ["Invalid authentication token"] })
        );
        let request_id = answer.headers["x-request-id"].to_str().unwrap();
        assert!(request_id.parse::<Uuid>().is_ok());
    }
    assert_eq!(fake.calls(Operation::FindProjectHardwareReservations), 2);
    let log = fake.request_log();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0].status, 401);
    assert_eq!(log[0].method, "GET");
    assert_eq!(log[0].path, format!("{API_PREFIX}{path}"));
    assert!(log[0].finished >= log[0].started);

    // Unknown paths answer in the API's shape but are no operation.
    let answer = get(&fake, "/no/such/thing").await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert!(answer.headers.contains_key("x-request-id"));
    assert_eq!(fake.total_calls(), 2);
    fake.fake.shutdown().await;
}

#[tokio::test]
async fn reservations_page_with_meta() {
    let fake = start(FakeConfig {
        reservations: 25,
        ..FakeConfig::default()
    })
    .await;
    let base = format!("/projects/{}/hardware-reservations", fake.project_id());
    let href = |page: u64| format!("{API_PREFIX}{base}?page={page}&per_page=10");
    let mut seen = Vec::new();
    for (page, count) in [(1, 10), (2, 10), (3, 5), (4, 0)] {
        let answer = get(&fake, &format!("{base}?page={page}&per_page=10")).await;
        assert_eq!(answer.status, StatusCode::OK);
        let body = answer.json();
        let items = body["hardware_reservations"].as_array().unwrap();
        assert_eq!(items.len(), count, "page {page}");
        seen.extend(items.iter().map(|r| r["id"].as_str().unwrap().to_owned()));
        let meta = &body["meta"];
        assert_eq!(meta["total"], 25);
        assert_eq!(meta["current_page"], page);
        assert_eq!(meta["last_page"], 3);
        assert_eq!(meta["first"]["href"], href(1));
        assert_eq!(meta["last"]["href"], href(3));
        assert_eq!(meta["self"]["href"], href(page));
        assert_eq!(meta.get("previous").is_some(), page > 1);
        assert_eq!(meta.get("next").is_some(), page < 3);
        if page == 2 {
            assert_eq!(meta["next"]["href"], href(3));
            assert_eq!(meta["previous"]["href"], href(1));
        }
    }
    let generated: Vec<String> = fake
        .reservations()
        .iter()
        .map(|r| r.id.to_string())
        .collect();
    assert_eq!(seen, generated);

    let default = get(&fake, &base).await.json();
    assert_eq!(
        default["hardware_reservations"].as_array().unwrap().len(),
        10
    );
    for bad in ["per_page=1001", "per_page=0", "page=0", "page=x"] {
        let answer = get(&fake, &format!("{base}?{bad}")).await;
        assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    }
}

#[tokio::test]
async fn reservation_shape_and_includes() {
    let fake = start(FakeConfig::default()).await;
    let first = fake.reservations()[0].clone();
    let path = format!("/hardware-reservations/{}", first.id);
    let bare = get(&fake, &path).await.json();
    assert!(bare.get("device").is_none());
    assert_eq!(bare["provisionable"], true);
    assert_eq!(bare["plan"]["slug"], first.plan);
    assert_eq!(bare["plan"]["line"], "baremetal");
    assert!(bare["facility"].get("code").is_none());
    assert!(bare["facility"]["href"].is_string());
    assert_eq!(
        bare["project"]["href"],
        format!("{API_PREFIX}/projects/{}", fake.project_id())
    );
    assert_eq!(bare["short_id"], first.id.to_string()[..8]);

    let full = get(&fake, &format!("{path}?include=facility,device"))
        .await
        .json();
    assert_eq!(full["facility"]["metro"]["code"], first.metro);
    let excluded = get(&fake, &format!("{path}?include=facility&exclude=facility"))
        .await
        .json();
    assert!(excluded["facility"].get("code").is_none());

    let unknown = get(&fake, &format!("/hardware-reservations/{}", Uuid::new_v4())).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.error(), "Not found");
    assert_eq!(
        get(&fake, "/hardware-reservations/nope").await.status,
        StatusCode::NOT_FOUND
    );
    let other_project = get(
        &fake,
        &format!("/projects/{}/hardware-reservations", Uuid::new_v4()),
    )
    .await;
    assert_eq!(other_project.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn create_checks_the_request_and_attaches_the_device() {
    let fake = start(FakeConfig::default()).await;
    let reservation = fake.reservations()[0].clone();
    let path = devices_path(&fake);

    let mut no_keys = create_body(&reservation, "web-1");
    no_keys.as_object_mut().unwrap().remove("no_ssh_keys");
    assert_eq!(post(&fake, &path, no_keys.clone()).await.error(), NO_KEYS);

    let mut wrong_plan = create_body(&reservation, "web-1");
    wrong_plan["plan"] = json!(if reservation.plan == "m3.small.x86" {
        "c3.medium.x86"
    } else {
        "m3.small.x86"
    });
    let mut wrong_metro = create_body(&reservation, "web-1");
    wrong_metro["metro"] = json!(if reservation.metro == "da" {
        "am"
    } else {
        "da"
    });
    let mut next_available = create_body(&reservation, "web-1");
    next_available["hardware_reservation_id"] = json!("next-available");
    let mut nowhere = create_body(&reservation, "web-1");
    nowhere.as_object_mut().unwrap().remove("metro");
    let mut long_tag = create_body(&reservation, "web-1");
    long_tag["tags"] = json!(["x".repeat(81)]);
    for bad in [
        wrong_plan,
        wrong_metro,
        next_available,
        nowhere,
        long_tag,
        create_body(&reservation, "web_1"),
        create_body(&reservation, ""),
        json!({ "hostname": "web-1", "metro": "da" }),
    ] {
        let answer = post(&fake, &path, bad.clone()).await;
        assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
        assert!(!answer.error().is_empty());
    }
    let broken = fake
        .client
        .post(format!("{}{path}", fake.base_url()))
        .header("X-Auth-Token", TOKEN)
        .header("Content-Type", "application/json")
        .body("{\"hostname\":")
        .send()
        .await
        .unwrap();
    assert_eq!(broken.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(fake.devices().is_empty());

    // A project key makes the key-less create valid; packngo's null tags
    // and repeated project id, and the deprecated facility list, pass too.
    let key = post(
        &fake,
        &format!("/projects/{}/ssh-keys", fake.project_id()),
        json!({ "label": "ops", "key": "ssh-ed25519 AAAAC3Nz ops" }),
    )
    .await;
    assert_eq!(key.status, StatusCode::CREATED);
    let key = key.json();
    assert_eq!(key["fingerprint"].as_str().unwrap().split(':').count(), 16);
    no_keys["tags"] = Value::Null;
    no_keys["project_id"] = json!(fake.project_id());
    no_keys.as_object_mut().unwrap().remove("metro");
    no_keys["facility"] = json!([
        "zz1",
        if reservation.metro == "da" {
            "da11"
        } else {
            "am6"
        }
    ]);
    let answer = post(&fake, &path, no_keys).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.text);
    let device = answer.json();
    assert_eq!(device["state"], "queued");
    assert_eq!(device["tags"], json!([]));
    assert_eq!(device["ssh_keys"][0]["href"], key["href"]);
    assert_eq!(
        device["hardware_reservation"]["href"],
        format!("{API_PREFIX}/hardware-reservations/{}", reservation.id)
    );

    let seen = get(
        &fake,
        &format!("/hardware-reservations/{}?include=device", reservation.id),
    )
    .await
    .json();
    assert_eq!(seen["device"]["id"], device["id"]);
    assert_eq!(seen["device"]["hostname"], "web-1");
    assert_eq!(seen["provisionable"], false);
    let again = post(&fake, &path, create_body(&reservation, "web-2")).await;
    assert_eq!(again.error(), "Server is not provisionable");

    let listed = get(&fake, &format!("{path}?hostname=web-1")).await.json();
    assert_eq!(listed["devices"][0]["id"], device["id"]);
    assert_eq!(listed["meta"]["total"], 1);
    let snapshot = &fake.reservations()[0];
    assert_eq!(
        snapshot.device.map(|d| d.to_string()),
        device["id"].as_str().map(str::to_owned)
    );
    assert!(!snapshot.taken_by_other);
}

#[tokio::test]
async fn delete_leaves_the_reservation_wiping() {
    let fake = start(FakeConfig {
        wipe_delay: Duration::from_secs(1),
        ..FakeConfig::default()
    })
    .await;
    let reservation = fake.reservations()[1].clone();
    let device = post(
        &fake,
        &devices_path(&fake),
        create_body(&reservation, "db-1"),
    )
    .await
    .json();
    let device_path = format!("/devices/{}", device["id"].as_str().unwrap());
    let deleted = send(
        &fake,
        Method::DELETE,
        &device_path,
        Some(TOKEN),
        Some(json!({ "force_delete": true })),
    )
    .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(get(&fake, &device_path).await.status, StatusCode::NOT_FOUND);

    let path = format!("/hardware-reservations/{}", reservation.id);
    let wiping = get(&fake, &path).await.json();
    assert!(wiping.get("device").is_none());
    assert_eq!(wiping["provisionable"], false);
    let refused = post(
        &fake,
        &devices_path(&fake),
        create_body(&reservation, "db-2"),
    )
    .await;
    assert_eq!(refused.error(), "Server is not provisionable");

    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(get(&fake, &path).await.json()["provisionable"], true);
    let listed = get(&fake, &devices_path(&fake)).await.json();
    assert_eq!(listed["devices"], json!([]));
}

#[tokio::test]
async fn devices_start_queued_and_obey_power_actions() {
    let slow = start(FakeConfig {
        provisioning_delay: Duration::from_secs(600),
        ..FakeConfig::default()
    })
    .await;
    let reservation = slow.reservations()[0].clone();
    let id = post(
        &slow,
        &devices_path(&slow),
        create_body(&reservation, "app-1"),
    )
    .await
    .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        get(&slow, &format!("/devices/{id}")).await.json()["state"],
        "queued"
    );
    let early = post(
        &slow,
        &format!("/devices/{id}/actions"),
        json!({ "type": "power_off" }),
    )
    .await;
    assert_eq!(early.status, StatusCode::UNPROCESSABLE_ENTITY);

    // With no delays a device is active as soon as it exists, though the
    // create still answers `queued`.
    let fake = start(FakeConfig::default()).await;
    let created = post(
        &fake,
        &devices_path(&fake),
        create_body(&reservation, "app-1"),
    )
    .await
    .json();
    assert_eq!(created["state"], "queued");
    let path = format!("/devices/{}", created["id"].as_str().unwrap());
    let actions = format!("{path}/actions");
    assert_eq!(get(&fake, &path).await.json()["state"], "active");
    for (action, state) in [
        ("power_off", "inactive"),
        ("power_on", "active"),
        ("power_off", "inactive"),
        ("reboot", "active"),
    ] {
        let answer = post(&fake, &actions, json!({ "type": action })).await;
        assert_eq!(answer.status, StatusCode::ACCEPTED);
        assert_eq!(answer.text, "");
        assert_eq!(get(&fake, &path).await.json()["state"], state, "{action}");
    }
    let unknown = post(&fake, &actions, json!({ "type": "explode" })).await;
    assert_eq!(unknown.status, StatusCode::UNPROCESSABLE_ENTITY);

    let updated = send(
        &fake,
        Method::PATCH,
        &path,
        Some(TOKEN),
        Some(json!({ "tags": ["a", "b"], "description": "x" })),
    )
    .await
    .json();
    assert_eq!(updated["tags"], json!(["a", "b"]));
    assert_eq!(updated["description"], "x");
    assert_eq!(fake.devices()[0].tags, ["a", "b"]);
    assert_eq!(fake.calls(Operation::UpdateDevice), 1);
    assert!(fake.fail_device(fake.devices()[0].id));
    assert_eq!(get(&fake, &path).await.json()["state"], "failed");
}

#[tokio::test]
async fn accept_then_fail_creates_yet_answers_500() {
    let fake = start(FakeConfig::default()).await;
    fake.set_faults(
        Faults::none().with_rule(
            FaultRule::on(
                Operation::CreateDevice,
                FaultKind::AcceptThenFail { status: 500 },
            )
            .times(1),
        ),
    );
    let reservation = fake.reservations()[0].clone();
    let answer = post(
        &fake,
        &devices_path(&fake),
        create_body(&reservation, "w-1"),
    )
    .await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(answer.json()["errors"].is_array());
    let devices = fake.devices();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].reservation, Some(reservation.id));
    assert_eq!(devices[0].tags, ["shepherd"]);
    assert_eq!(fake.faults().rules[0].remaining, Some(0));

    let next = fake.reservations()[1].clone();
    let answer = post(&fake, &devices_path(&fake), create_body(&next, "w-2")).await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert_eq!(fake.calls(Operation::CreateDevice), 2);
}

#[tokio::test]
async fn accept_then_drop_creates_yet_breaks_the_answer() {
    let fake = start(FakeConfig::default()).await;
    fake.set_faults(Faults::none().with_rule(FaultRule::new(FaultKind::AcceptThenDrop).times(1)));
    let reservation = fake.reservations()[0].clone();
    let outcome = fake
        .client
        .post(format!("{}{}", fake.base_url(), devices_path(&fake)))
        .header("X-Auth-Token", TOKEN)
        .json(&create_body(&reservation, "w-1"))
        .send()
        .await;
    let failed = match outcome {
        Err(_) => true,
        Ok(response) => response.json::<Value>().await.is_err(),
    };
    assert!(failed, "the client must see a broken answer");
    assert_eq!(fake.devices().len(), 1);
    assert_eq!(fake.reservations()[0].device, Some(fake.devices()[0].id));
}

#[tokio::test]
async fn steal_reservation_puts_another_party_first() {
    let fake = start(FakeConfig::default()).await;
    fake.set_faults(Faults::none().with_rule(FaultRule::new(FaultKind::StealReservation).times(2)));
    let [first, second] = [
        fake.reservations()[0].clone(),
        fake.reservations()[1].clone(),
    ];

    let seen = get(
        &fake,
        &format!("/hardware-reservations/{}?include=device", first.id),
    )
    .await
    .json();
    assert_eq!(seen["provisionable"], false);
    assert_eq!(
        seen["device"]["hostname"],
        format!("other-{}", &first.id.to_string()[..8])
    );
    assert_eq!(seen["device"]["tags"], json!(["other-party"]));
    assert!(fake.reservations()[0].taken_by_other);

    let refused = post(&fake, &devices_path(&fake), create_body(&second, "mine")).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(refused.error(), "Server is not provisionable");
    assert!(fake.devices().iter().all(|d| d.created_by_other));
    assert_eq!(fake.devices().len(), 2);
}

#[tokio::test]
async fn status_rate_limit_and_garbage_faults() {
    let fake = start(FakeConfig::default()).await;
    let path = format!("/projects/{}/hardware-reservations", fake.project_id());
    fake.set_faults(
        Faults::none()
            .with_rule(
                FaultRule::new(FaultKind::RateLimited {
                    retry_after_secs: 7,
                })
                .times(1),
            )
            .with_rule(FaultRule::new(FaultKind::Status { status: 503 }).times(1))
            .with_rule(
                FaultRule::new(FaultKind::Garbage {
                    body: "<html>bad gateway</html>".to_owned(),
                    status: 502,
                })
                .times(1),
            ),
    );
    let limited = get(&fake, &path).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(limited.headers["retry-after"], "7");
    assert_eq!(limited.headers["x-ratelimit-remaining"], "0");
    let reset: i64 = limited.headers["x-ratelimit-reset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((reset - chrono::Utc::now().timestamp() - 7).abs() <= 2);

    let unavailable = get(&fake, &path).await;
    assert_eq!(unavailable.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(unavailable.json()["errors"].is_array());

    let garbage = get(&fake, &path).await;
    assert_eq!(garbage.status, StatusCode::BAD_GATEWAY);
    assert_eq!(garbage.text, "<html>bad gateway</html>");

    assert_eq!(get(&fake, &path).await.status, StatusCode::OK);
    let statuses: Vec<u16> = fake.request_log().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [429, 503, 502, 200]);
}

#[tokio::test]
async fn stale_listing_and_moves() {
    let fake = start(FakeConfig::default()).await;
    let [stale, moved] = [
        fake.reservations()[0].clone(),
        fake.reservations()[1].clone(),
    ];
    fake.mark_stale(stale.id);
    let list_path = format!(
        "/projects/{}/hardware-reservations?per_page=100",
        fake.project_id()
    );
    let listed = get(&fake, &list_path).await.json();
    assert_eq!(listed["hardware_reservations"][0]["provisionable"], true);
    let single = get(&fake, &format!("/hardware-reservations/{}", stale.id))
        .await
        .json();
    assert_eq!(single["provisionable"], false);
    let refused = post(&fake, &devices_path(&fake), create_body(&stale, "x")).await;
    assert_eq!(refused.error(), "Server is not provisionable");

    let elsewhere = Uuid::new_v4();
    let answer = post(
        &fake,
        &format!("/hardware-reservations/{}/move", moved.id),
        json!({ "project_id": elsewhere }),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    assert_eq!(
        answer.json()["project"]["href"],
        format!("{API_PREFIX}/projects/{elsewhere}")
    );
    let listed = get(&fake, &list_path).await.json();
    assert_eq!(listed["meta"]["total"], 19);
    assert_eq!(fake.reservations()[1].project_id, elsewhere);
}

#[tokio::test]
async fn ssh_keys_round_trip() {
    let fake = start(FakeConfig::default()).await;
    let project_keys = format!("/projects/{}/ssh-keys", fake.project_id());
    let missing = post(&fake, &project_keys, json!({ "label": "x" })).await;
    assert_eq!(missing.status, StatusCode::UNPROCESSABLE_ENTITY);
    let project_key = post(
        &fake,
        &project_keys,
        json!({ "label": "p", "key": "ssh-rsa AAAA p" }),
    )
    .await
    .json();
    let user_key = post(
        &fake,
        "/ssh-keys",
        json!({ "label": "u", "key": "ssh-rsa AAAA u" }),
    )
    .await
    .json();
    assert_ne!(project_key["fingerprint"], user_key["fingerprint"]);
    assert_eq!(
        get(&fake, &project_keys).await.json()["ssh_keys"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        get(&fake, "/ssh-keys").await.json()["ssh_keys"][0]["id"],
        user_key["id"]
    );

    let path = format!("/ssh-keys/{}", project_key["id"].as_str().unwrap());
    let updated = send(
        &fake,
        Method::PUT,
        &path,
        Some(TOKEN),
        Some(json!({ "label": "renamed" })),
    )
    .await
    .json();
    assert_eq!(updated["label"], "renamed");
    assert_eq!(updated["key"], "ssh-rsa AAAA p");
    let deleted = send(&fake, Method::DELETE, &path, Some(TOKEN), None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert_eq!(get(&fake, &path).await.status, StatusCode::NOT_FOUND);
    assert_eq!(fake.ssh_keys().len(), 1);
}

#[tokio::test]
async fn admin_api_needs_no_token() {
    let fake = start(FakeConfig::default()).await;
    let client = &fake.client;
    let root = format!("http://{}", fake.addr());
    let faults = json!({
        "latency_ms": 1,
        "rules": [{ "op": "createDevice", "remaining": 1, "kind": { "kind": "accept_then_fail" } }]
    });
    let set = client
        .put(format!("{root}/_fake/faults"))
        .json(&faults)
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), StatusCode::OK);
    assert_eq!(
        fake.faults(),
        Faults::none().with_latency(1, 0).with_rule(
            FaultRule::on(
                Operation::CreateDevice,
                FaultKind::AcceptThenFail { status: 500 }
            )
            .times(1)
        )
    );
    let read: Value = client
        .get(format!("{root}/_fake/faults"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(read["rules"][0]["kind"]["kind"], "accept_then_fail");
    let bad = client
        .put(format!("{root}/_fake/faults"))
        .body("[")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY);

    get(&fake, &devices_path(&fake)).await;
    let calls: Value = client
        .get(format!("{root}/_fake/calls"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(calls["total"], 1);
    assert_eq!(calls["operations"]["findProjectDevices"], 1);
    assert_eq!(calls["operations"]["createDevice"], 0);

    let state: Value = client
        .get(format!("{root}/_fake/state"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(state["reservations"].as_array().unwrap().len(), 20);
    assert_eq!(state["devices"], json!([]));
}

#[test]
fn config_debug_hides_the_token() {
    let config = FakeConfig {
        token: "sup3r-s3cret".to_owned(),
        ..FakeConfig::default()
    };
    let shown = format!("{config:?}");
    assert!(!shown.contains("sup3r-s3cret"));
    assert!(shown.contains("<redacted>"));
}
