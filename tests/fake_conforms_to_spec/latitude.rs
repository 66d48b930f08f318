//! The fake Latitude.sh API against Latitude's document.

use super::*;
use shepherd_fakes::latitude::{Call, FakeConfig, FakeLatitude, FaultKind, FaultRule, Faults};

const KEY: &str = "conformance-key";

struct Probe {
    http: reqwest::Client,
    base: String,
    spec: Spec,
    checked: Vec<Call>,
}

impl Probe {
    /// Sends a request; checks the exact status, the media type of a
    /// body, and the body against the document's schema for that
    /// status (errors against its `error_object`).
    async fn check(
        &mut self,
        call: Call,
        method: Method,
        path: &str,
        spec_path: &str,
        body: Option<Value>,
        status: u16,
    ) -> Value {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .header("Authorization", KEY);
        if let Some(b) = &body {
            request = request.json(b);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{method} {path}");
        let media = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string());
        let text = response.text().await.unwrap();
        let method_name = method.as_str().to_lowercase();
        let schema = if status < 300 {
            self.spec
                .response_schema(&method_name, spec_path, &status.to_string())
        } else {
            Some(self.spec.component("error_object"))
        };
        let Some(schema) = schema else {
            if self
                .spec
                .has_body(&method_name, spec_path, &status.to_string())
            {
                // A body of the right type, shape unspecified.
                assert!(
                    media
                        .as_deref()
                        .is_some_and(|m| m.starts_with("application/vnd.api+json")),
                    "{method} {path}: labelled {media:?}"
                );
                serde_json::from_str::<Value>(&text)
                    .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"));
            } else {
                assert!(
                    text.is_empty(),
                    "{method} {path}: no body expected, got {text}"
                );
            }
            self.checked.push(call);
            return Value::Null;
        };
        assert!(
            media
                .as_deref()
                .is_some_and(|m| m.starts_with("application/vnd.api+json")),
            "{method} {path}: labelled {media:?}"
        );
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"));
        let errors = self.spec.validate(schema, &value);
        assert!(
            errors.is_empty(),
            "{method} {path} ({status}) breaks Latitude's document:\n{}",
            errors.join("\n")
        );
        self.checked.push(call);
        value
    }
}

#[tokio::test]
async fn every_latitude_call_answers_as_its_document_says() {
    let config = FakeConfig {
        token: KEY.into(),
        writes_per_window: 1000,
        reads_per_window: 1000,
        ..FakeConfig::default()
    };
    let project = config.project.clone();
    let fake = FakeLatitude::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut p = Probe {
        http: reqwest::Client::new(),
        base: fake.base_url(),
        spec: Spec::latitude(),
        checked: vec![],
    };
    let key = p
        .check(
            Call::PostSshKey,
            Method::POST,
            "/ssh_keys",
            "/ssh_keys",
            Some(json!({"data": {"type": "ssh_keys", "attributes": {"name": "k", "public_key": "ssh-ed25519 AAAA"}}})),
            201,
        )
        .await;
    let key_id = key["data"]["id"].as_str().unwrap().to_string();
    p.check(
        Call::GetSshKeys,
        Method::GET,
        "/ssh_keys",
        "/ssh_keys",
        None,
        200,
    )
    .await;
    let tag = p
        .check(
            Call::CreateTag,
            Method::POST,
            "/tags",
            "/tags",
            Some(json!({"data": {"type": "tags", "attributes": {"name": "shepherd", "color": "#141515"}}})),
            201,
        )
        .await;
    let tag_id = tag["data"]["id"].as_str().unwrap().to_string();
    p.check(Call::GetTags, Method::GET, "/tags", "/tags", None, 200)
        .await;
    p.check(Call::GetPlans, Method::GET, "/plans", "/plans", None, 200)
        .await;
    p.check(
        Call::GetPlans,
        Method::GET,
        "/plans?filter[slug]=c2-small-x86&filter[in_stock]=true",
        "/plans",
        None,
        200,
    )
    .await;
    let create = |hostname: &str, site: &str| {
        json!({"data": {"type": "servers", "attributes": {
            "project": project, "plan": "c2-small-x86", "site": site,
            "operating_system": "ubuntu_24_04_x64_lts", "hostname": hostname,
            "ssh_keys": [key_id], "billing": "hourly"}}})
    };
    let created = p
        .check(
            Call::CreateServer,
            Method::POST,
            "/servers",
            "/servers",
            Some(create("shepherd-1", "DAL")),
            201,
        )
        .await;
    let id = created["data"]["id"].as_str().unwrap().to_string();
    p.check(
        Call::GetServers,
        Method::GET,
        "/servers?filter[project]=shepherd&page[size]=100&stats[total]=count",
        "/servers",
        None,
        200,
    )
    .await;
    p.check(
        Call::GetServer,
        Method::GET,
        &format!("/servers/{id}"),
        "/servers/{server_id}",
        None,
        200,
    )
    .await;
    p.check(
        Call::UpdateServer,
        Method::PATCH,
        &format!("/servers/{id}"),
        "/servers/{server_id}",
        Some(json!({"data": {"id": id, "type": "servers", "attributes": {"tags": [tag_id]}}})),
        200,
    )
    .await;
    // Errors: out of stock, unknown id, over the budget.
    p.check(
        Call::CreateServer,
        Method::POST,
        "/servers",
        "/servers",
        Some(create("shepherd-2", "CHI")),
        422,
    )
    .await;
    p.check(
        Call::GetServer,
        Method::GET,
        "/servers/sv_0000000000000",
        "/servers/{server_id}",
        None,
        404,
    )
    .await;
    fake.set_faults(
        Faults::none().with_rule(
            FaultRule::on(
                Call::GetServers,
                FaultKind::RateLimited {
                    retry_after_secs: 3,
                },
            )
            .times(1),
        ),
    );
    p.check(
        Call::GetServers,
        Method::GET,
        "/servers",
        "/servers",
        None,
        429,
    )
    .await;
    p.check(
        Call::DestroyServer,
        Method::DELETE,
        &format!("/servers/{id}"),
        "/servers/{server_id}",
        None,
        204,
    )
    .await;
    p.check(
        Call::GetSshKey,
        Method::GET,
        &format!("/ssh_keys/{key_id}"),
        "/ssh_keys/{ssh_key_id}",
        None,
        200,
    )
    .await;
    p.check(
        Call::PutSshKey,
        Method::PATCH,
        &format!("/ssh_keys/{key_id}"),
        "/ssh_keys/{ssh_key_id}",
        Some(json!({"data": {"id": key_id, "type": "ssh_keys", "attributes": {"name": "k2"}}})),
        200,
    )
    .await;
    p.check(
        Call::DeleteSshKey,
        Method::DELETE,
        &format!("/ssh_keys/{key_id}"),
        "/ssh_keys/{ssh_key_id}",
        None,
        200,
    )
    .await;
    for call in Call::ALL {
        assert!(p.checked.contains(&call), "{call} was not checked");
    }
}
