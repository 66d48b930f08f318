//! The fake over real HTTP, with a plain client: what the API promises and
//! what each fault does.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::*;

pub(super) const TOKEN: &str = "fake-token";
pub(super) const NO_KEYS: &str =
    "must have at least one SSH key or explicitly send no_ssh_keys option";

/// A started fake and one client for it: building a client loads the TLS
/// roots, which costs more than the whole conversation with the fake.
pub(super) struct Api {
    pub(super) fake: FakeMetal,
    pub(super) client: reqwest::Client,
}

impl std::ops::Deref for Api {
    type Target = FakeMetal;

    fn deref(&self) -> &FakeMetal {
        &self.fake
    }
}

pub(super) async fn start(config: FakeConfig) -> Api {
    let fake = FakeMetal::start(config, SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("the fake starts");
    Api {
        fake,
        client: reqwest::Client::new(),
    }
}

pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) headers: reqwest::header::HeaderMap,
    pub(super) text: String,
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

pub(super) async fn send(
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

pub(super) async fn get(fake: &Api, path: &str) -> Answer {
    send(fake, Method::GET, path, Some(TOKEN), None).await
}

pub(super) async fn post(fake: &Api, path: &str, body: Value) -> Answer {
    send(fake, Method::POST, path, Some(TOKEN), Some(body)).await
}

pub(super) fn devices_path(fake: &Api) -> String {
    format!("/projects/{}/devices", fake.project_id())
}

/// A create that succeeds against the reservation as generated.
pub(super) fn create_body(reservation: &ReservationSnapshot, hostname: &str) -> Value {
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

mod calls;
mod faults;
