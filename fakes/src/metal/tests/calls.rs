//! The calls the fake serves, as a client sees them over HTTP.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

use super::*;

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
        // Present on every page, null at the ends, as the real API answered.
        assert_eq!(!meta["previous"].is_null(), page > 1);
        assert_eq!(!meta["next"].is_null(), page < 3);
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

/// packet-python follows a project link by gluing its absolute href onto
/// a base that ends in `/metal/v1`; the fake sends it (308, the token kept
/// by the client) to the path it meant, as the real service accepted it.
#[tokio::test]
async fn a_doubled_api_prefix_is_sent_to_the_path_it_meant() {
    let fake = start(FakeConfig::default()).await;
    let path = format!("//metal/v1/projects/{}", fake.project_id());
    let answer = send(&fake, Method::GET, &path, Some(TOKEN), None).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    assert_eq!(answer.json()["id"], fake.project_id().to_string());
    assert_eq!(fake.calls(Operation::FindProjectById), 1);
    fake.fake.shutdown().await;
}
