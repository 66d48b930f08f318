//! Every answer the fake Metal server gives, for every endpoint it serves,
//! validates against the official OpenAPI document's schemas. The fake is
//! the contract now that the real service is gone, so it must not drift.

mod common;

use common::openapi::Spec;
use common::*;
use reqwest::Method;
use serde_json::{Value, json};
use shepherd::metal::Operation;
use shepherd_fakes::metal::FaultKind;

struct Probe {
    http: reqwest::Client,
    base: String,
    spec: Spec,
    checked: Vec<Operation>,
}

impl Probe {
    /// Sends a request, checks the status, and validates the body against
    /// the spec's schema for `spec_path` with that status.
    async fn check(
        &mut self,
        op: Operation,
        method: Method,
        path: &str,
        spec_path: &str,
        body: Option<Value>,
        status: u16,
    ) -> Value {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .header("X-Auth-Token", TOKEN);
        if let Some(b) = &body {
            request = request.json(b);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{method} {path}");
        assert!(
            response.headers().contains_key("x-request-id"),
            "{method} {path} has no X-Request-Id"
        );
        let text = response.text().await.unwrap();
        // packngo's PATCH answers as the spec's PUT does.
        let method_name = match method.as_str() {
            "PATCH" => "put".to_string(),
            m => m.to_lowercase(),
        };
        let Some(schema) = self
            .spec
            .response_schema(&method_name, spec_path, &status.to_string())
        else {
            assert!(
                text.is_empty(),
                "{method} {path}: the spec gives no body, got {text}"
            );
            self.checked.push(op);
            return Value::Null;
        };
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"));
        let errors = self.spec.validate(schema, &value);
        assert!(
            errors.is_empty(),
            "{method} {path} ({status}) breaks the spec:\n{}",
            errors.join("\n")
        );
        self.checked.push(op);
        value
    }
}

#[tokio::test]
async fn every_endpoint_answers_as_the_spec_says() {
    let mut config = fake_config(12);
    config.not_provisionable_every = 5;
    config.spare_every = 4;
    let project = config.project_id;
    let fake = start_fake(config).await;
    let mut p = Probe {
        http: reqwest::Client::new(),
        base: fake.base_url(),
        spec: Spec::load(),
        checked: vec![],
    };
    use Operation::*;

    let key = p
        .check(
            CreateProjectSshKey,
            Method::POST,
            &format!("/projects/{project}/ssh-keys"),
            "/projects/{id}/ssh-keys",
            Some(json!({"label": "l", "key": "ssh-ed25519 AAAA"})),
            201,
        )
        .await;
    let key_id = key["id"].as_str().unwrap().to_string();
    p.check(
        CreateSshKey,
        Method::POST,
        "/ssh-keys",
        "/ssh-keys",
        Some(json!({"label": "user", "key": "ssh-ed25519 BBBB"})),
        201,
    )
    .await;
    p.check(
        FindProjectSshKeys,
        Method::GET,
        &format!("/projects/{project}/ssh-keys"),
        "/projects/{id}/ssh-keys",
        None,
        200,
    )
    .await;
    p.check(
        FindSshKeys,
        Method::GET,
        "/ssh-keys",
        "/ssh-keys",
        None,
        200,
    )
    .await;
    p.check(
        FindProjectById,
        Method::GET,
        &format!("/projects/{project}"),
        "/projects/{id}",
        None,
        200,
    )
    .await;
    p.check(
        FindSshKeyById,
        Method::GET,
        &format!("/ssh-keys/{key_id}"),
        "/ssh-keys/{id}",
        None,
        200,
    )
    .await;
    p.check(
        UpdateSshKey,
        Method::PUT,
        &format!("/ssh-keys/{key_id}"),
        "/ssh-keys/{id}",
        Some(json!({"label": "l2"})),
        200,
    )
    .await;

    for query in [
        "",
        "?include=facility,device",
        "?page=2&per_page=5",
        "?page=9&per_page=5",
    ] {
        let list = p
            .check(
                FindProjectHardwareReservations,
                Method::GET,
                &format!("/projects/{project}/hardware-reservations{query}"),
                "/projects/{id}/hardware-reservations",
                None,
                200,
            )
            .await;
        assert!(
            list["meta"]["total"].as_u64() == Some(12),
            "{query}: {}",
            list["meta"]
        );
    }
    let list = p
        .check(
            FindProjectHardwareReservations,
            Method::GET,
            &format!("/projects/{project}/hardware-reservations?include=facility"),
            "/projects/{id}/hardware-reservations",
            None,
            200,
        )
        .await;
    let reservation = list["hardware_reservations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["provisionable"] == json!(true))
        .unwrap()
        .clone();
    let r_id = reservation["id"].as_str().unwrap().to_string();
    let metro = reservation["facility"]["metro"]["code"]
        .as_str()
        .unwrap()
        .to_string();
    let plan = reservation["plan"]["slug"].as_str().unwrap().to_string();
    p.check(
        FindHardwareReservationById,
        Method::GET,
        &format!("/hardware-reservations/{r_id}?include=device,facility"),
        "/hardware-reservations/{id}",
        None,
        200,
    )
    .await;

    // packngo's quirks: tags null, project_id in the body, facility as a list.
    let device = p
        .check(
            CreateDevice,
            Method::POST,
            &format!("/projects/{project}/devices"),
            "/projects/{id}/devices",
            Some(json!({
                "hostname": "shepherd-conformance",
                "plan": plan,
                "operating_system": "ubuntu_20_04",
                "metro": metro,
                "hardware_reservation_id": r_id,
                "project_ssh_keys": [key_id],
                "tags": null,
                "project_id": project,
            })),
            201,
        )
        .await;
    assert_eq!(device["state"], json!("queued"));
    let d_id = device["id"].as_str().unwrap().to_string();
    // packet-python 1.44's own default create sends `"tags": {}`, which the
    // real API took as no tags; a map with entries is refused.
    let second = list["hardware_reservations"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["provisionable"] == json!(true))
        // The last: the first two are the ones moved and used below.
        .rfind(|r| r["id"].as_str() != Some(r_id.as_str()))
        .expect("a second provisionable reservation")
        .clone();
    let body = |tags: Value, hostname: &str| {
        json!({
            "hostname": hostname,
            "plan": second["plan"]["slug"],
            "operating_system": "ubuntu_20_04",
            "metro": second["facility"]["metro"]["code"],
            "hardware_reservation_id": second["id"],
            "tags": tags,
        })
    };
    p.check(
        CreateDevice,
        Method::POST,
        &format!("/projects/{project}/devices"),
        "/projects/{id}/devices",
        Some(body(json!({"a": "b"}), "shepherd-python-bad")),
        422,
    )
    .await;
    let python = p
        .check(
            CreateDevice,
            Method::POST,
            &format!("/projects/{project}/devices"),
            "/projects/{id}/devices",
            Some(body(json!({}), "shepherd-python")),
            201,
        )
        .await;
    assert_eq!(python["tags"], json!([]));
    p.check(
        FindHardwareReservationById,
        Method::GET,
        &format!("/hardware-reservations/{r_id}?include=device"),
        "/hardware-reservations/{id}",
        None,
        200,
    )
    .await;
    p.check(
        FindProjectDevices,
        Method::GET,
        &format!("/projects/{project}/devices?per_page=1"),
        "/projects/{id}/devices",
        None,
        200,
    )
    .await;
    p.check(
        FindDeviceById,
        Method::GET,
        &format!("/devices/{d_id}"),
        "/devices/{id}",
        None,
        200,
    )
    .await;
    p.check(
        UpdateDevice,
        Method::PUT,
        &format!("/devices/{d_id}"),
        "/devices/{id}",
        Some(json!({"description": "d"})),
        200,
    )
    .await;
    // packngo sends PATCH where the spec says PUT.
    p.check(
        UpdateDevice,
        Method::PATCH,
        &format!("/devices/{d_id}"),
        "/devices/{id}",
        Some(json!({"description": "e"})),
        200,
    )
    .await;
    p.check(
        PerformAction,
        Method::POST,
        &format!("/devices/{d_id}/actions"),
        "/devices/{id}/actions",
        Some(json!({"type": "reboot"})),
        202,
    )
    .await;

    // Error answers have the spec's Error shape too.
    p.check(CreateDevice, Method::POST, &format!("/projects/{project}/devices"), "/projects/{id}/devices",
        Some(json!({"hostname": "x", "plan": plan, "operating_system": "ubuntu_20_04", "metro": metro,
                    "hardware_reservation_id": r_id, "project_ssh_keys": [key_id]})),
        422).await;
    p.check(
        FindDeviceById,
        Method::GET,
        "/devices/7c9e6679-7425-40de-944b-e07fc1f90ae7",
        "/devices/{id}",
        None,
        404,
    )
    .await;
    fake.set_faults(next(
        FindProjectDevices,
        1,
        FaultKind::Status { status: 401 },
    ));
    p.check(
        FindProjectDevices,
        Method::GET,
        &format!("/projects/{project}/devices"),
        "/projects/{id}/devices",
        None,
        401,
    )
    .await;

    // force_delete in a DELETE body is accepted.
    let response = p
        .http
        .delete(format!("{}/devices/{d_id}", p.base))
        .header("X-Auth-Token", TOKEN)
        .json(&json!({"force_delete": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 204);
    p.checked.push(DeleteDevice);

    let other = list["hardware_reservations"][1]["id"]
        .as_str()
        .unwrap()
        .to_string();
    p.check(
        MoveHardwareReservation,
        Method::POST,
        &format!("/hardware-reservations/{other}/move"),
        "/hardware-reservations/{id}/move",
        Some(json!({"project_id": "2b0f6b1c-0d3a-4e8a-9a4b-1d2c3e4f5a6b"})),
        201,
    )
    .await;
    p.check(
        DeleteSshKey,
        Method::DELETE,
        &format!("/ssh-keys/{key_id}"),
        "/ssh-keys/{id}",
        None,
        204,
    )
    .await;

    for op in Operation::ALL {
        assert!(
            p.checked.contains(&op),
            "{op} was not checked against the spec"
        );
    }
}

#[tokio::test]
async fn requests_without_the_token_are_refused() {
    let config = fake_config(1);
    let project = config.project_id;
    let fake = start_fake(config).await;
    let spec = Spec::load();
    for token in [None, Some("wrong")] {
        let mut request =
            reqwest::Client::new().get(format!("{}/projects/{project}/devices", fake.base_url()));
        if let Some(t) = token {
            request = request.header("X-Auth-Token", t);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), 401);
        let body: Value = response.json().await.unwrap();
        let schema = spec
            .response_schema("get", "/projects/{id}/devices", "401")
            .unwrap();
        assert!(spec.validate(schema, &body).is_empty());
        assert!(!body.to_string().contains(TOKEN));
    }
}

#[test]
fn the_validator_catches_what_it_should() {
    let spec = Spec::load();
    let device = spec.component("Device");
    let good = serde_json::json!({
        "id": "7c9e6679-7425-40de-944b-e07fc1f90ae7",
        "state": "active",
        "tags": ["a"],
        "created_at": "2026-01-01T00:00:00Z"
    });
    assert_eq!(spec.validate(device, &good), Vec::<String>::new());
    let bad = serde_json::json!({
        "id": "not-a-uuid",
        "state": "teleporting",
        "tags": "a",
        "created_at": "yesterday",
        "locked": "no"
    });
    let errors = spec.validate(device, &bad);
    assert_eq!(errors.len(), 5, "{errors:#?}");
    let meta = spec.component("Meta");
    let errors = spec.validate(meta, &serde_json::json!({"first": {}, "total": "3"}));
    assert_eq!(errors.len(), 2, "{errors:#?}");
}

// ----- the fake Latitude.sh API against Latitude's document -----

#[path = "fake_conforms_to_spec/latitude.rs"]
mod latitude;
