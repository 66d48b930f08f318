//! The faults the fake injects, and its admin API.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

use super::*;

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
