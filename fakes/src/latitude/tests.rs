//! The fake's own behaviour, over HTTP: what Latitude's document and the
//! official SDK require of it.

use std::time::Duration;

use serde_json::{Value, json};

use super::*;

async fn start(config: FakeConfig) -> (FakeLatitude, reqwest::Client) {
    let fake = FakeLatitude::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    (fake, reqwest::Client::new())
}

const KEY: &str = "fake-latitude-token";

async fn call(
    http: &reqwest::Client,
    fake: &FakeLatitude,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, String, Value) {
    let mut request = http
        .request(method, format!("{}{path}", fake.base_url()))
        .header("Authorization", KEY);
    if let Some(b) = body {
        request = request.json(&b);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let text = response.text().await.unwrap();
    let value = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap()
    };
    (status, content_type, value)
}

fn server(hostname: &str, plan: &str, site: &str) -> Value {
    json!({"data": {"type": "servers", "attributes": {
        "project": "proj_fake0000000001", "plan": plan, "site": site,
        "operating_system": "ubuntu_24_04_x64_lts", "hostname": hostname}}})
}

#[tokio::test]
async fn the_key_is_taken_bare_or_as_bearer_and_answers_are_json_api() {
    let (fake, http) = start(FakeConfig::default()).await;
    let url = format!("{}/servers", fake.base_url());
    let none = http.get(&url).send().await.unwrap();
    assert_eq!(none.status().as_u16(), 401);
    let wrong = http
        .get(&url)
        .header("Authorization", "nope")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    let bearer = http
        .get(&url)
        .header("Authorization", format!("Bearer {KEY}"))
        .send()
        .await
        .unwrap();
    assert_eq!(bearer.status().as_u16(), 200);
    let (status, content_type, body) =
        call(&http, &fake, reqwest::Method::GET, "/servers", None).await;
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("application/vnd.api+json"),
        "{content_type}"
    );
    assert_eq!(body, json!({"data": [], "meta": {}}));
}

#[tokio::test]
async fn a_create_takes_stock_and_is_found_by_its_hostname() {
    let (fake, http) = start(FakeConfig {
        deploy_delay: Duration::from_millis(200),
        ..FakeConfig::default()
    })
    .await;
    let before = fake.stock("c2-small-x86", "DAL").unwrap();
    let (status, _, created) = call(
        &http,
        &fake,
        reqwest::Method::POST,
        "/servers",
        Some(server("shepherd-a1", "c2-small-x86", "dal")),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["data"]["type"], "servers");
    assert_eq!(created["data"]["attributes"]["status"], "deploying");
    // The create's answer is the subset the real API sends: no site, no tags.
    assert!(created["data"]["attributes"].get("site").is_none());
    assert_eq!(fake.stock("c2-small-x86", "DAL"), Some(before - 1));
    let id = created["data"]["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("sv_") && id.len() == 16, "{id}");

    let (_, _, found) = call(
        &http,
        &fake,
        reqwest::Method::GET,
        "/servers?filter[project]=shepherd&filter[hostname]=shepherd-a1",
        None,
    )
    .await;
    assert_eq!(found["data"].as_array().unwrap().len(), 1);
    assert_eq!(found["data"][0]["id"], id.as_str());
    assert_eq!(found["data"][0]["attributes"]["site"], "DAL");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let (status, _, got) = call(
        &http,
        &fake,
        reqwest::Method::GET,
        &format!("/servers/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(got["data"]["attributes"]["status"], "on");

    let (status, _, body) = call(
        &http,
        &fake,
        reqwest::Method::DELETE,
        &format!("/servers/{id}"),
        None,
    )
    .await;
    assert_eq!((status, body), (204, Value::Null));
    assert_eq!(fake.stock("c2-small-x86", "DAL"), Some(before));
    let (status, _, body) = call(
        &http,
        &fake,
        reqwest::Method::GET,
        &format!("/servers/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(body["errors"][0]["code"], "not_found");
}

#[tokio::test]
async fn no_stock_is_a_422_with_its_code_and_takes_nothing() {
    let (fake, http) = start(FakeConfig::default()).await;
    let (status, _, body) = call(
        &http,
        &fake,
        reqwest::Method::POST,
        "/servers",
        Some(server("shepherd-b1", "c2-small-x86", "CHI")),
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(body["errors"][0]["code"], "SERVERS_OUT_OF_STOCK");
    assert!(fake.servers().is_empty());
    let (status, _, body) = call(
        &http,
        &fake,
        reqwest::Method::POST,
        "/servers",
        Some(json!({"data": {"type": "servers", "attributes": {"plan": "c2-small-x86"}}})),
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(body["errors"][0]["code"], "VALIDATION_ERROR");
    assert_eq!(
        body["errors"][0]["source"]["pointer"],
        "/data/attributes/project"
    );
    // Stock as a reader of /plans sees it.
    let (_, _, plans) = call(
        &http,
        &fake,
        reqwest::Method::GET,
        "/plans?filter[slug]=c2-small-x86",
        None,
    )
    .await;
    let locations = &plans["data"][0]["attributes"]["regions"][0]["locations"];
    assert_eq!(locations["available"], json!(["ASH", "CHI", "DAL"]));
    assert_eq!(locations["in_stock"], json!(["ASH", "DAL"]));
    assert_eq!(locations["in_stock_count"]["DAL"], 50);
}

#[tokio::test]
async fn pages_end_short_and_the_total_comes_only_when_asked() {
    let (fake, http) = start(FakeConfig {
        writes_per_window: 100,
        ..FakeConfig::default()
    })
    .await;
    for n in 0..5 {
        let (status, _, _) = call(
            &http,
            &fake,
            reqwest::Method::POST,
            "/servers",
            Some(server(&format!("h{n}"), "c2-small-x86", "DAL")),
        )
        .await;
        assert_eq!(status, 201);
    }
    let mut hostnames = vec![];
    for number in 1..=3 {
        let (_, _, page) = call(
            &http,
            &fake,
            reqwest::Method::GET,
            &format!("/servers?page[size]=2&page[number]={number}"),
            None,
        )
        .await;
        assert_eq!(page["meta"], json!({}));
        for s in page["data"].as_array().unwrap() {
            hostnames.push(s["attributes"]["hostname"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(hostnames, ["h0", "h1", "h2", "h3", "h4"]);
    let (_, _, page) = call(
        &http,
        &fake,
        reqwest::Method::GET,
        "/servers?page[size]=2&stats[total]=count",
        None,
    )
    .await;
    assert_eq!(page["meta"]["stats"]["total"]["count"], 5);
    let (status, _, _) = call(
        &http,
        &fake,
        reqwest::Method::GET,
        "/servers?page[size]=0",
        None,
    )
    .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn hostname_filters_take_the_sdks_operators() {
    let (fake, http) = start(FakeConfig {
        writes_per_window: 100,
        ..FakeConfig::default()
    })
    .await;
    for h in [
        "shepherd-web-0-a",
        "shepherd-web-1-b",
        "other-web-0",
        "xshepherd-c",
    ] {
        let (status, _, _) = call(
            &http,
            &fake,
            reqwest::Method::POST,
            "/servers",
            Some(server(h, "c2-small-x86", "DAL")),
        )
        .await;
        assert_eq!(status, 201);
    }
    let names = |page: &Value| -> Vec<String> {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["attributes"]["hostname"].as_str().unwrap().to_string())
            .collect()
    };
    for (query, expected) in [
        (
            "filter[hostname][prefix]=shepherd-",
            vec!["shepherd-web-0-a", "shepherd-web-1-b"],
        ),
        ("filter[hostname][eql]=other-web-0", vec!["other-web-0"]),
        ("filter[hostname][suffix]=-b", vec!["shepherd-web-1-b"]),
        (
            "filter[hostname][match]=shepherd",
            vec!["shepherd-web-0-a", "shepherd-web-1-b", "xshepherd-c"],
        ),
        ("filter[hostname]=shepherd-web", vec![]),
    ] {
        let (status, _, page) = call(
            &http,
            &fake,
            reqwest::Method::GET,
            &format!("/servers?{query}&stats[total]=count"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{query}");
        assert_eq!(names(&page), expected, "{query}");
        assert_eq!(
            page["meta"]["stats"]["total"]["count"],
            expected.len(),
            "{query}"
        );
    }
}

#[tokio::test]
async fn reads_and_writes_have_budgets_of_their_own() {
    let (fake, http) = start(FakeConfig {
        reads_per_window: 3,
        writes_per_window: 1,
        rate_window: Duration::from_secs(2),
        ..FakeConfig::default()
    })
    .await;
    let post = || {
        call(
            &http,
            &fake,
            reqwest::Method::POST,
            "/tags",
            Some(
                json!({"data": {"type": "tags", "attributes": {"name": "t", "color": "#141515"}}}),
            ),
        )
    };
    assert_eq!(post().await.0, 201);
    let (status, _, body) = post().await;
    assert_eq!(status, 429);
    assert_eq!(body["errors"][0]["code"], "RATE_LIMIT_EXCEEDED");
    let wait = body["errors"][0]["meta"]["retry_after"].as_u64().unwrap();
    assert!((1..=2).contains(&wait), "retry_after {wait}");
    // Reads are counted apart: three go through, the fourth does not.
    for _ in 0..3 {
        assert_eq!(
            call(&http, &fake, reqwest::Method::GET, "/tags", None)
                .await
                .0,
            200
        );
    }
    assert_eq!(
        call(&http, &fake, reqwest::Method::GET, "/tags", None)
            .await
            .0,
        429
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (status, _, body) = post().await;
    assert_eq!(
        status, 422,
        "the window passed; the name is now taken: {body}"
    );
    assert_eq!(body["errors"][0]["code"], "NAME_ALREADY_TAKEN");
}

#[tokio::test]
async fn create_faults_do_what_they_say() {
    let (fake, http) = start(FakeConfig {
        writes_per_window: 100,
        ..FakeConfig::default()
    })
    .await;
    let create = |hostname: &'static str| {
        call(
            &http,
            &fake,
            reqwest::Method::POST,
            "/servers",
            Some(server(hostname, "c3-medium-x86", "SAO")),
        )
    };
    fake.set_faults(
        Faults::none().with_rule(
            FaultRule::on(
                Call::CreateServer,
                FaultKind::AcceptThenFail { status: 502 },
            )
            .times(1),
        ),
    );
    assert_eq!(create("accepted").await.0, 502);
    assert!(fake.servers().iter().any(|s| s.hostname == "accepted"));
    fake.set_faults(
        Faults::none()
            .with_rule(FaultRule::on(Call::CreateServer, FaultKind::OtherPartyCreates).times(1)),
    );
    assert_eq!(create("ours").await.0, 201);
    assert_eq!(
        fake.servers().iter().filter(|s| s.created_by_other).count(),
        1
    );
    assert_eq!(fake.stock("c3-medium-x86", "SAO"), Some(7));
    fake.set_faults(
        Faults::none()
            .with_rule(FaultRule::on(Call::CreateServer, FaultKind::StockRunsOut).times(1)),
    );
    let (status, _, body) = create("too-late").await;
    assert_eq!(
        (status, body["errors"][0]["code"].as_str()),
        (422, Some("SERVERS_OUT_OF_STOCK"))
    );
    fake.set_stock("c3-medium-x86", "SAO", 1);
    fake.set_faults(
        Faults::none()
            .with_rule(FaultRule::on(Call::CreateServer, FaultKind::FailDeployment).times(1)),
    );
    assert_eq!(create("doomed").await.0, 201);
    let doomed = fake
        .servers()
        .into_iter()
        .find(|s| s.hostname == "doomed")
        .unwrap();
    assert_eq!(doomed.status, "failed_deployment");
    fake.set_faults(
        Faults::none().with_rule(FaultRule::new(FaultKind::RateLimited {
            retry_after_secs: 7,
        })),
    );
    let (status, _, body) = call(&http, &fake, reqwest::Method::GET, "/plans", None).await;
    assert_eq!(status, 429);
    assert_eq!(body["errors"][0]["meta"]["retry_after"], 7);
}

#[tokio::test]
async fn keys_and_tags_answer_with_their_exact_codes() {
    let (fake, http) = start(FakeConfig::default()).await;
    let (status, _, key) = call(
        &http,
        &fake,
        reqwest::Method::POST,
        "/ssh_keys",
        Some(json!({"data": {"type": "ssh_keys", "attributes": {"name": "shepherd", "public_key": "ssh-ed25519 AAAA k"}}})),
    )
    .await;
    assert_eq!(status, 201);
    assert_eq!(key["data"]["type"], "ssh_keys");
    let key_id = key["data"]["id"].as_str().unwrap().to_string();
    let (_, _, listed) = call(
        &http,
        &fake,
        reqwest::Method::GET,
        "/ssh_keys?filter[project]=proj_fake0000000001",
        None,
    )
    .await;
    assert_eq!(listed["data"][0]["id"], key_id.as_str());

    let (status, _, tag) = call(
        &http,
        &fake,
        reqwest::Method::POST,
        "/tags",
        Some(json!({"data": {"type": "tags", "attributes": {"name": "shepherd", "color": "#ffffff"}}})),
    )
    .await;
    assert_eq!(status, 201);
    let tag_id = tag["data"]["id"].as_str().unwrap().to_string();
    let mut create = server("tagged", "c2-small-x86", "ASH");
    create["data"]["attributes"]["ssh_keys"] = json!([key_id]);
    let (status, _, created) = call(
        &http,
        &fake,
        reqwest::Method::POST,
        "/servers",
        Some(create),
    )
    .await;
    assert_eq!(status, 201);
    let id = created["data"]["id"].as_str().unwrap();
    let (status, _, updated) = call(
        &http,
        &fake,
        reqwest::Method::PATCH,
        &format!("/servers/{id}"),
        Some(json!({"data": {"id": id, "type": "servers", "attributes": {"tags": [tag_id]}}})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(updated["data"]["attributes"]["tags"][0]["name"], "shepherd");
    let mut unknown_key = server("nokey", "c2-small-x86", "ASH");
    unknown_key["data"]["attributes"]["ssh_keys"] = json!(["ssh_nope"]);
    let (status, _, body) = call(
        &http,
        &fake,
        reqwest::Method::POST,
        "/servers",
        Some(unknown_key),
    )
    .await;
    assert_eq!(status, 422);
    assert!(
        body["errors"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("SSH Keys were not found")
    );

    let (status, _, body) = call(
        &http,
        &fake,
        reqwest::Method::DELETE,
        &format!("/ssh_keys/{key_id}"),
        None,
    )
    .await;
    assert_eq!((status, body), (200, json!({"meta": {}})));
}
