//! The API answering garbage. A hostile server (not the fake: it answers
//! whatever the test scripts, per path and page) stands in for a broken
//! provider or a confused proxy. Every answer must end in a typed error or a
//! correct value: never a panic, never a hang, never a short listing taken
//! for the whole.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::Response;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shepherd::metal::{ClientConfig, ClientMetrics, MetalClient, MetalError};
use shepherd::secret::ApiToken;
use uuid::Uuid;

const PROJECT: Uuid = Uuid::from_u128(0x1111_2222_3333_4444_5555_6666_7777_8888);

#[derive(Clone)]
enum Answer {
    Full {
        status: u16,
        body: Vec<u8>,
    },
    /// Chunked, without a length, `chunks` times `chunk` bytes.
    Stream {
        chunk: usize,
        chunks: usize,
    },
    /// Sends the start of a body, then one byte a second, forever.
    Drip,
    /// Any status with the headers given.
    Headed {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Vec<u8>,
    },
}

fn json(status: u16, body: &str) -> Answer {
    Answer::Full {
        status,
        body: body.as_bytes().to_vec(),
    }
}

/// Answers by "path?page=N" (or the bare path); anything unscripted is 404.
#[derive(Clone, Default)]
struct Script(Arc<Mutex<HashMap<String, Answer>>>);

impl Script {
    fn set(&self, key: &str, answer: Answer) {
        self.0.lock().unwrap().insert(key.to_owned(), answer);
    }
}

async fn answer(State(script): State<Script>, request: Request) -> Response {
    let path = request
        .uri()
        .path()
        .trim_start_matches("/metal/v1")
        .to_owned();
    let page = request
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("page="))
        .map(str::to_owned);
    let found = {
        let s = script.0.lock().unwrap();
        page.and_then(|p| s.get(&format!("{path}?page={p}")).cloned())
            .or_else(|| s.get(&path).cloned())
    };
    let builder = Response::builder().header(header::CONTENT_TYPE, "application/json");
    match found {
        None => builder
            .status(StatusCode::NOT_FOUND)
            .body(Body::from(r#"{"errors":["Not found"]}"#))
            .unwrap(),
        Some(Answer::Full { status, body }) => {
            builder.status(status).body(Body::from(body)).unwrap()
        }
        Some(Answer::Headed {
            status,
            headers,
            body,
        }) => {
            let mut builder = builder.status(status);
            for (name, value) in headers {
                builder = builder.header(name, value);
            }
            builder.body(Body::from(body)).unwrap()
        }
        Some(Answer::Stream { chunk, chunks }) => {
            let stream = futures::stream::iter(
                (0..chunks).map(move |_| Ok::<_, std::io::Error>(vec![b' '; chunk])),
            );
            builder.status(200).body(Body::from_stream(stream)).unwrap()
        }
        Some(Answer::Drip) => {
            let stream = futures::stream::unfold(0u64, |n| async move {
                if n > 0 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Some((Ok::<_, std::io::Error>(b"{\"devices\": [".to_vec()), n + 1))
            });
            builder.status(200).body(Body::from_stream(stream)).unwrap()
        }
    }
}

async fn hostile() -> (Script, MetalClient) {
    let script = Script::default();
    let app = Router::new().fallback(answer).with_state(script.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let mut config = ClientConfig::new(
        format!("http://{addr}/metal/v1"),
        PROJECT,
        ApiToken::new(common::TOKEN),
    );
    config.api_rate = shepherd::config::Rate::UNLIMITED;
    config.attempt_timeout = Duration::from_secs(2);
    config.retry = common::fast_retry();
    config.retry.max_elapsed = Duration::from_secs(3);
    config.per_page = 2;
    let client = MetalClient::new(config, ClientMetrics::default()).unwrap();
    (script, client)
}

fn devices_path() -> String {
    format!("/projects/{PROJECT}/devices")
}

fn device_json(id: Uuid) -> String {
    format!(r#"{{"id":"{id}","hostname":"shepherd-x","state":"active","tags":[]}}"#)
}

/// A call that must end, and within a bound no sane retry policy exceeds.
async fn ends<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f)
        .await
        .expect("the call hung")
}

fn assert_undecodable<T: std::fmt::Debug>(r: Result<T, MetalError>, needle: &str) {
    match r {
        Err(MetalError::Undecodable {
            detail, excerpt, ..
        }) => assert!(
            detail.contains(needle) || excerpt.contains(needle),
            "detail {detail:?}, excerpt {excerpt:?}, expected {needle:?}"
        ),
        other => panic!("expected Undecodable mentioning {needle:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn garbage_bodies_are_undecodable_errors() {
    let (script, client) = hostile().await;
    let id = Uuid::new_v4();
    let path = format!("/devices/{id}");
    let cases: Vec<(&str, String, &str)> = vec![
        ("not JSON", "<html>bad gateway</html>".into(), "bad gateway"),
        ("truncated", device_json(id)[..20].to_string(), "EOF"),
        (
            "wrong type",
            format!(r#"{{"id":"{id}","hostname":42,"tags":[]}}"#),
            "invalid type",
        ),
        (
            "missing id",
            r#"{"hostname":"h","tags":[]}"#.into(),
            "missing field",
        ),
        (
            "an error body with 200",
            r#"{"errors":["something broke"]}"#.into(),
            "missing field",
        ),
        ("empty", String::new(), "EOF"),
        ("null", "null".into(), "invalid type"),
    ];
    for (what, body, needle) in cases {
        script.set(&path, json(200, &body));
        let r = ends(client.get_device(id)).await;
        assert!(
            matches!(r, Err(MetalError::Undecodable { .. })),
            "{what}: {r:?}"
        );
        assert_undecodable(r, needle);
    }
    // An error body with 200 on a listing is not an empty listing.
    script.set(&devices_path(), json(200, r#"{"errors":["nope"]}"#));
    assert_undecodable(ends(client.list_devices()).await, "missing field `devices`");
}

#[tokio::test]
async fn huge_bodies_are_refused_with_or_without_a_length() {
    let (script, client) = hostile().await;
    let id = Uuid::new_v4();
    let path = format!("/devices/{id}");
    let max = shepherd::metal::client::MAX_BODY_BYTES;
    script.set(
        &path,
        Answer::Full {
            status: 200,
            body: vec![b' '; max + 1],
        },
    );
    assert_undecodable(ends(client.get_device(id)).await, "larger than");
    script.set(
        &path,
        Answer::Stream {
            chunk: 1 << 20,
            chunks: max / (1 << 20) + 2,
        },
    );
    assert_undecodable(ends(client.get_device(id)).await, "larger than");
}

#[tokio::test]
async fn a_body_that_never_ends_times_out_as_transient() {
    let (script, client) = hostile().await;
    let id = Uuid::new_v4();
    script.set(&format!("/devices/{id}"), Answer::Drip);
    let r = ends(client.get_device(id)).await;
    assert!(matches!(r, Err(MetalError::Transient { .. })), "{r:?}");
}

fn page(ids: &[Uuid], page: u64, last: u64, total: u64) -> String {
    let items: Vec<String> = ids.iter().map(|id| device_json(*id)).collect();
    format!(
        r#"{{"devices":[{}],"meta":{{"current_page":{page},"last_page":{last},"total":{total}}}}}"#,
        items.join(",")
    )
}

#[tokio::test]
async fn listings_that_contradict_their_meta_are_errors_not_short_lists() {
    let (script, client) = hostile().await;
    let ids: Vec<Uuid> = (0..6).map(|_| Uuid::new_v4()).collect();
    let path = devices_path();
    // A meta that claims five pages when three exist.
    script.set(
        &format!("{path}?page=1"),
        json(200, &page(&ids[0..2], 1, 5, 10)),
    );
    script.set(
        &format!("{path}?page=2"),
        json(200, &page(&ids[2..4], 2, 5, 10)),
    );
    script.set(
        &format!("{path}?page=3"),
        json(200, &page(&ids[4..6], 3, 5, 10)),
    );
    script.set(&format!("{path}?page=4"), json(200, &page(&[], 4, 5, 10)));
    let r = ends(client.list_devices()).await;
    assert!(
        matches!(&r, Err(MetalError::Transient { reason, .. }) if reason.contains("inconsistent pagination")),
        "{r:?}"
    );
    // An empty page in the middle of an honest-looking listing.
    script.set(
        &format!("{path}?page=1"),
        json(200, &page(&ids[0..2], 1, 3, 6)),
    );
    script.set(&format!("{path}?page=2"), json(200, &page(&[], 2, 3, 6)));
    script.set(
        &format!("{path}?page=3"),
        json(200, &page(&ids[4..6], 3, 3, 6)),
    );
    let r = ends(client.list_devices()).await;
    assert!(matches!(r, Err(MetalError::Transient { .. })), "{r:?}");
    // The same pages, all present: the whole listing.
    script.set(
        &format!("{path}?page=2"),
        json(200, &page(&ids[2..4], 2, 3, 6)),
    );
    let listed = ends(client.list_devices()).await.unwrap();
    assert_eq!(listed.iter().map(|d| d.id).collect::<Vec<_>>(), ids);
    // A page that is garbage in the middle fails the listing.
    script.set(&format!("{path}?page=2"), json(200, "{\"devices\": [tru"));
    assert!(matches!(
        ends(client.list_devices()).await,
        Err(MetalError::Undecodable { .. })
    ));
}

/// Bounded fuzzing of the answer decoding: valid answers mutated at random
/// (truncated, bytes replaced, values swapped for other JSON types, deep
/// nesting) for every kind of answer shepherd reads. Each must decode or
/// give a typed error, without a panic and without a hang. The seed and the
/// count come from SHEPHERD_FUZZ_SEED and SHEPHERD_FUZZ_CASES (default 600,
/// a few seconds) so a longer run is one variable away.
#[tokio::test]
async fn fuzzed_answers_decode_or_fail_typed() {
    let seed: u64 = std::env::var("SHEPHERD_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed);
    let cases: usize = std::env::var("SHEPHERD_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let mut rng = StdRng::seed_from_u64(seed);
    let (script, client) = hostile().await;
    let id = Uuid::new_v4();
    let reservation = Uuid::new_v4();
    let device_path = format!("/devices/{id}");
    let reservation_path = format!("/hardware-reservations/{reservation}");
    let valid_device = format!(
        r#"{{"id":"{id}","hostname":"shepherd-a","state":"active","tags":["x"],"hardware_reservation":{{"href":"/hardware-reservations/{reservation}"}},"plan":{{"slug":"c3.small.x86"}},"created_at":"2026-01-01T00:00:00Z","metro":{{"code":"da"}}}}"#
    );
    let valid_reservation = format!(
        r#"{{"id":"{reservation}","short_id":"r1","provisionable":true,"spare":false,"need_of_service":false,"device":{{"href":"/devices/{id}"}},"plan":{{"slug":"c3.small.x86"}},"facility":{{"code":"da11","metro":{{"code":"da"}}}},"project":{{"href":"/projects/{PROJECT}"}}}}"#
    );
    let valid_page = format!(
        r#"{{"devices":[{valid_device}],"meta":{{"current_page":1,"last_page":1,"total":1}}}}"#
    );
    // The unmutated answers decode: the fuzzing starts from real shapes.
    script.set(&device_path, json(200, &valid_device));
    ends(client.get_device(id)).await.unwrap();
    script.set(&reservation_path, json(200, &valid_reservation));
    ends(client.get_reservation(reservation, &[]))
        .await
        .unwrap();
    script.set(&devices_path(), json(200, &valid_page));
    assert_eq!(ends(client.list_devices()).await.unwrap().len(), 1);

    let mut outcomes: HashMap<&str, usize> = HashMap::new();
    for i in 0..cases {
        let (path, valid) = match i % 3 {
            0 => (&device_path, &valid_device),
            1 => (&reservation_path, &valid_reservation),
            _ => (&devices_path(), &valid_page),
        };
        let body = mutate(valid.as_bytes(), &mut rng);
        let status = if rng.random_bool(0.9) { 200 } else { 201 };
        script.set(
            path,
            Answer::Full {
                status,
                body: body.clone(),
            },
        );
        let result = match i % 3 {
            0 => ends(client.get_device(id)).await.map(|_| ()),
            1 => ends(client.get_reservation(reservation, &[]))
                .await
                .map(|_| ()),
            _ => ends(client.list_devices()).await.map(|_| ()),
        };
        let kind = match result {
            Ok(()) => "decoded",
            Err(MetalError::Undecodable { .. }) => "undecodable",
            Err(MetalError::Transient { .. }) => "transient",
            Err(other) => panic!(
                "case {i}: unexpected error {other:?} for {}",
                String::from_utf8_lossy(&body)
            ),
        };
        *outcomes.entry(kind).or_default() += 1;
    }
    eprintln!("{cases} fuzzed answers (seed {seed:#x}): {outcomes:?}");
    // The mutations reach both sides: some answers still decode, most don't.
    assert!(
        outcomes.get("undecodable").copied().unwrap_or(0) > cases / 3,
        "{outcomes:?}"
    );
    assert!(
        outcomes.get("decoded").copied().unwrap_or(0) > 0,
        "{outcomes:?}"
    );
}

fn mutate(valid: &[u8], rng: &mut StdRng) -> Vec<u8> {
    let mut b = valid.to_vec();
    match rng.random_range(0..6) {
        0 => b.truncate(rng.random_range(0..b.len())),
        1 => {
            for _ in 0..rng.random_range(1..4) {
                let at = rng.random_range(0..b.len());
                b[at] = rng.random();
            }
        }
        2 => {
            // A string value becomes another JSON type.
            let text = String::from_utf8_lossy(&b).into_owned();
            let quotes: Vec<usize> = text.match_indices(":\"").map(|(i, _)| i + 1).collect();
            if let Some(&start) = quotes.get(rng.random_range(0..quotes.len().max(1)))
                && let Some(len) = text[start + 1..].find('"')
            {
                let replacement =
                    ["null", "17", "true", "[]", "{}", "-1e999"][rng.random_range(0..6)];
                let mut t = text[..start].to_string();
                t.push_str(replacement);
                t.push_str(&text[start + len + 2..]);
                b = t.into_bytes();
            }
        }
        3 => {
            // Deep nesting where a value was: must not overflow the stack.
            let depth = rng.random_range(100..5000);
            let mut t = String::from("{\"id\":");
            t.push_str(&"[".repeat(depth));
            t.push_str(&"]".repeat(depth));
            t.push('}');
            b = t.into_bytes();
        }
        4 => {
            // Unknown fields everywhere are fine; duplicated keys are not.
            let text =
                String::from_utf8_lossy(&b).replacen('{', "{\"zz_unknown\":{\"a\":[1,2]},", 3);
            b = text.into_bytes();
        }
        _ => {
            let at = rng.random_range(0..b.len());
            b.insert(at, b',');
        }
    }
    b
}

// ----- answers that must not panic, freeze or steal: both providers -----

use shepherd::latitude::{LatitudeClient, LatitudeConfig, LatitudeError};
use shepherd::provider::discipline::MAX_PROVIDER_WAIT;
use std::sync::atomic::{AtomicU32, Ordering};

/// A scripted server for the Latitude client, and its address.
async fn hostile_latitude() -> (Script, String) {
    let script = Script::default();
    let app = Router::new().fallback(answer).with_state(script.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (script, format!("http://{addr}"))
}

/// A Latitude client of `base`, with a short retry budget. Each test of a
/// 429 uses a client of its own: the hold a 429 records paces every later
/// call of that client.
fn latitude(base: &str) -> LatitudeClient {
    let mut config = LatitudeConfig::new(base, "proj_1", ApiToken::new(common::TOKEN));
    config.attempt_timeout = Duration::from_secs(2);
    config.retry = common::fast_retry();
    config.retry.max_elapsed = Duration::from_secs(3);
    LatitudeClient::new(config).unwrap()
}

/// A listener elsewhere that counts what reaches it (a redirect's target).
async fn bystander() -> (String, Arc<AtomicU32>) {
    let hits = Arc::new(AtomicU32::new(0));
    let counted = hits.clone();
    let app = Router::new().fallback(move || {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            "{}"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), hits)
}

#[tokio::test]
async fn a_huge_retry_after_neither_panics_nor_freezes() {
    let (script, base) = hostile_latitude().await;
    // In the body, as Latitude sends it, and in a header.
    script.set(
        "/servers/sv_body",
        json(
            429,
            r#"{"errors":[{"code":"RATE_LIMIT_EXCEEDED","status":"429","meta":{"retry_after":1e300}}]}"#,
        ),
    );
    script.set(
        "/servers/sv_header",
        Answer::Headed {
            status: 429,
            headers: vec![("retry-after", "1e300".into())],
            body: b"{}".to_vec(),
        },
    );
    for id in ["sv_body", "sv_header"] {
        let r = ends(latitude(&base).get_server(id)).await;
        match r {
            Err(LatitudeError::RateLimited {
                retry_after: Some(wait),
                ..
            }) => assert_eq!(wait, shepherd::latitude::client::MAX_WAIT, "{id}"),
            other => panic!("{id}: expected a bounded rate limit, got {other:?}"),
        }
    }
    // Not a number of seconds: no wait asked at all.
    script.set(
        "/servers/sv_nan",
        Answer::Headed {
            status: 429,
            headers: vec![("retry-after", "-5".into())],
            body: b"{}".to_vec(),
        },
    );
    let r = ends(latitude(&base).get_server("sv_nan")).await;
    assert!(
        matches!(
            r,
            Err(LatitudeError::RateLimited {
                retry_after: None,
                ..
            })
        ),
        "{r:?}"
    );
    // Metal's header, as large as a u64 holds.
    let (script, client) = hostile().await;
    let id = Uuid::new_v4();
    script.set(
        &format!("/devices/{id}"),
        Answer::Headed {
            status: 429,
            headers: vec![("retry-after", u64::MAX.to_string())],
            body: b"{}".to_vec(),
        },
    );
    let r = ends(client.get_device(id)).await;
    match r {
        Err(MetalError::RateLimited {
            retry_after: Some(wait),
            ..
        }) => assert_eq!(wait, MAX_PROVIDER_WAIT),
        other => panic!("expected a bounded rate limit, got {other:?}"),
    }
}

#[tokio::test]
async fn a_latitude_body_past_the_cap_is_refused_even_without_a_length() {
    let (script, base) = hostile_latitude().await;
    script.set(
        "/servers/sv_big",
        // 100 GiB, without a length: buffered whole, it would never end.
        Answer::Stream {
            chunk: 1 << 20,
            chunks: 100_000,
        },
    );
    let r = ends(latitude(&base).get_server("sv_big")).await;
    match r {
        Err(LatitudeError::Undecodable { detail, .. }) => {
            assert!(detail.contains("larger than"), "{detail}")
        }
        other => panic!("expected a refused answer, got {other:?}"),
    }
}

#[tokio::test]
async fn provider_error_text_is_cut_and_cleaned_before_it_is_kept() {
    use shepherd::provider::ProviderError;
    let (script, base) = hostile_latitude().await;
    let detail = format!("bad\u{0}thing\u{1b}[31m{}", "x".repeat(100_000));
    script.set(
        "/servers/sv_1",
        json(
            422,
            &serde_json::json!({"errors": [{"code": "VALIDATION_ERROR", "status": "422", "detail": detail}]})
                .to_string(),
        ),
    );
    let e = ends(latitude(&base).get_server("sv_1")).await.unwrap_err();
    let kept = ProviderError::from(e);
    assert!(!kept.message.contains('\u{0}') && !kept.message.contains('\u{1b}'));
    assert!(
        kept.message.chars().count() <= 2_001,
        "{}",
        kept.message.len()
    );
    assert!(
        kept.message.contains("bad\u{FFFD}thing"),
        "{}",
        &kept.message[..80]
    );
}

#[tokio::test]
async fn an_id_that_would_change_the_path_is_never_sent() {
    let (_script, base) = hostile_latitude().await;
    let client = latitude(&base);
    for id in [
        "../projects",
        "sv_1?filter=x",
        "sv_1/actions",
        "",
        "sv 1",
        &"a".repeat(65),
    ] {
        let r = ends(client.get_server(id)).await;
        assert!(
            matches!(r, Err(LatitudeError::BadId { .. })),
            "{id:?}: {r:?}"
        );
        let r = ends(client.delete_server(id)).await;
        assert!(
            matches!(r, Err(LatitudeError::BadId { .. })),
            "{id:?}: {r:?}"
        );
    }
}

#[tokio::test]
async fn a_redirect_to_another_host_takes_no_credential_there() {
    let (elsewhere, hits) = bystander().await;
    let (script, base) = hostile_latitude().await;
    script.set(
        "/servers/sv_1",
        Answer::Headed {
            status: 302,
            headers: vec![("location", format!("{elsewhere}/steal"))],
            body: vec![],
        },
    );
    let r = ends(latitude(&base).get_server("sv_1")).await;
    assert!(r.is_err(), "{r:?}");
    let (script, client) = hostile().await;
    let id = Uuid::new_v4();
    script.set(
        &format!("/devices/{id}"),
        Answer::Headed {
            status: 307,
            headers: vec![("location", format!("{elsewhere}/steal"))],
            body: vec![],
        },
    );
    let r = ends(client.get_device(id)).await;
    assert!(r.is_err(), "{r:?}");
    assert_eq!(hits.load(Ordering::SeqCst), 0, "a redirect was followed");
}

#[test]
fn plain_http_to_another_machine_is_refused() {
    for base in [
        "http://api.latitude.example",
        "http://10.1.2.3:8080",
        "ftp://127.0.0.1",
    ] {
        let r = LatitudeClient::new(LatitudeConfig::new(
            base,
            "proj_1",
            ApiToken::new(common::TOKEN),
        ));
        assert!(r.is_err(), "{base}");
        let r = MetalClient::new(
            ClientConfig::new(base, PROJECT, ApiToken::new(common::TOKEN)),
            ClientMetrics::default(),
        );
        assert!(r.is_err(), "{base}");
    }
    for base in [
        "https://api.latitude.sh",
        "http://127.0.0.1:3000",
        "http://localhost:1",
        "http://[::1]:2",
    ] {
        assert!(
            LatitudeClient::new(LatitudeConfig::new(base, "p", ApiToken::new(common::TOKEN)))
                .is_ok(),
            "{base}"
        );
    }
}
