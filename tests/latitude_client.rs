//! The Latitude.sh client against the fake Latitude API over real HTTP:
//! every call, a create that is never sent twice for one hostname, stock,
//! pages without totals, and the key's budgets.

use std::time::Duration;

use shepherd::latitude::{
    CreateServer, LatitudeClient, LatitudeConfig, LatitudeError, Servers, Stock,
};
use shepherd::metal::{ErrorClass, RetrySettings};
use shepherd::secret::ApiToken;
use shepherd_fakes::latitude::{Call, FakeConfig, FakeLatitude, FaultKind, FaultRule, Faults};

const KEY: &str = "latitude-test-key";

async fn fake(config: FakeConfig) -> FakeLatitude {
    FakeLatitude::start(
        FakeConfig {
            token: KEY.into(),
            ..config
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap()
}

fn client(fake: &FakeLatitude, page_size: u32) -> LatitudeClient {
    let mut config = LatitudeConfig::new(fake.base_url(), fake.project(), ApiToken::new(KEY));
    config.page_size = page_size;
    config.attempt_timeout = Duration::from_secs(2);
    config.retry = RetrySettings {
        initial_interval: Duration::from_millis(20),
        max_interval: Duration::from_millis(200),
        max_elapsed: Duration::from_secs(10),
        ..RetrySettings::default()
    };
    LatitudeClient::new(config).unwrap()
}

fn roomy() -> FakeConfig {
    FakeConfig {
        reads_per_window: 10_000,
        writes_per_window: 10_000,
        ..FakeConfig::default()
    }
}

fn request(hostname: &str, site: &str) -> CreateServer {
    CreateServer {
        plan: "c2-small-x86".into(),
        site: site.into(),
        operating_system: "ubuntu_24_04_x64_lts".into(),
        hostname: hostname.into(),
        ssh_keys: vec![],
    }
}

#[tokio::test]
async fn every_call_works_against_the_fake() {
    let fake = fake(roomy()).await;
    let c = client(&fake, 2);
    let key = c
        .ensure_ssh_key("shepherd", "ssh-ed25519 AAAA k")
        .await
        .unwrap();
    assert_eq!(
        c.ensure_ssh_key("shepherd", "ssh-ed25519 AAAA k ")
            .await
            .unwrap(),
        key
    );
    assert_eq!(
        c.stock("c2-small-x86", "DAL").await.unwrap(),
        Stock::Some(Some(50))
    );
    assert_eq!(c.stock("c2-small-x86", "CHI").await.unwrap(), Stock::Empty);
    assert_eq!(
        c.stock("c2-small-x86", "FRA").await.unwrap(),
        Stock::Unavailable
    );
    assert_eq!(
        c.stock("no-such-plan", "DAL").await.unwrap(),
        Stock::Unavailable
    );

    let mut req = request("shepherd-a", "DAL");
    req.ssh_keys = vec![key];
    let created = c.create_server(&req).await.unwrap();
    assert!(!created.recovered);
    assert_eq!(created.attempts, 1);
    for n in 0..4 {
        c.create_server(&request(&format!("shepherd-b{n}"), "ASH"))
            .await
            .unwrap();
    }
    // Five servers on pages of two: the third page is short and ends it.
    let before = fake.calls(Call::GetServers);
    let all = c.list_servers(Servers::All).await.unwrap();
    assert_eq!(all.len(), 5);
    assert_eq!(fake.calls(Call::GetServers) - before, 3);
    let found = c.find_by_hostname("shepherd-a").await.unwrap().unwrap();
    assert_eq!(found.id, created.server.id);
    assert_eq!(found.site(), Some("DAL"));
    assert_eq!(found.plan_slug(), Some("c2-small-x86"));
    assert!(c.find_by_hostname("shepherd-zz").await.unwrap().is_none());
    let got = c.get_server(&created.server.id).await.unwrap();
    assert_eq!(got.condition(), shepherd::provider::Condition::Ready);

    c.delete_server(&created.server.id).await.unwrap();
    assert_eq!(fake.stock("c2-small-x86", "DAL"), Some(50));
    assert!(matches!(
        c.get_server(&created.server.id).await,
        Err(LatitudeError::NotFound { .. })
    ));
}

/// A create whose answer was lost after the server was made ends as
/// unknown at once: no look, which a lagging listing could answer wrongly,
/// and above all no second create. Only the caller settles it, after its
/// settle window.
#[tokio::test]
async fn an_unseen_create_is_unknown_and_never_sent_again() {
    let fake = fake(roomy()).await;
    let c = client(&fake, 100);
    for (n, kind) in [
        FaultKind::AcceptThenFail { status: 502 },
        FaultKind::GatewayTimeout {
            status: 504,
            hidden_ms: 60_000,
        },
    ]
    .into_iter()
    .enumerate()
    {
        fake.set_faults(Faults::none().with_rule(FaultRule::on(Call::CreateServer, kind).times(1)));
        let before = (fake.calls(Call::CreateServer), fake.calls(Call::GetServers));
        let err = c
            .create_server(&request(&format!("shepherd-x{n}"), "DAL"))
            .await
            .unwrap_err();
        assert!(matches!(err, LatitudeError::Ambiguous { .. }), "{err}");
        assert_eq!(err.class(), ErrorClass::Ambiguous);
        assert_eq!(
            fake.calls(Call::CreateServer) - before.0,
            1,
            "the create was sent again"
        );
        assert_eq!(fake.calls(Call::GetServers), before.1, "it looked");
    }
    assert_eq!(fake.servers().len(), 2);
}

/// A connection that never opened sent nothing: that create is sent again.
#[tokio::test]
async fn a_create_that_could_not_connect_is_sent_again_later() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let mut config = LatitudeConfig::new(format!("http://{addr}"), "proj_x", ApiToken::new(KEY));
    config.attempt_timeout = Duration::from_secs(1);
    config.retry = RetrySettings {
        initial_interval: Duration::from_millis(10),
        max_interval: Duration::from_millis(20),
        max_elapsed: Duration::from_millis(100),
        ..RetrySettings::default()
    };
    let c = LatitudeClient::new(config).unwrap();
    let err = c
        .create_server(&request("shepherd-nowhere", "DAL"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, LatitudeError::ConnectFailed { .. }),
        "a refused connection is not an unknown create: {err}"
    );
    assert_eq!(err.class(), ErrorClass::Transient);
}

#[tokio::test]
async fn a_429_on_create_was_not_counted_so_it_is_sent_again() {
    let fake = fake(roomy()).await;
    let c = client(&fake, 100);
    fake.set_faults(
        Faults::none().with_rule(
            FaultRule::on(
                Call::CreateServer,
                FaultKind::RateLimited {
                    retry_after_secs: 1,
                },
            )
            .times(1),
        ),
    );
    let created = c
        .create_server(&request("shepherd-y", "DAL"))
        .await
        .unwrap();
    assert!(!created.recovered);
    assert_eq!(created.attempts, 2);
    assert_eq!(fake.servers().len(), 1);
    // Counted as every provider's calls are: the 429 and the hold it asked
    // for, under the latitude label, for the same alerts as Metal's.
    let mut registry = prometheus_client::registry::Registry::default();
    c.metrics().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let created_with = |status: &str| {
        text.lines().any(|l| {
            l.starts_with("shepherd_provider_request_duration_seconds_count{")
                && l.contains(r#"provider="latitude""#)
                && l.contains(&format!(r#"status="{status}""#))
                && l.ends_with(" 1")
        })
    };
    assert!(created_with("429") && created_with("201"), "{text}");
    assert!(
        text.contains(r#"shepherd_provider_throttled_total{provider="latitude"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"shepherd_provider_calls_in_flight{provider="latitude"} 0"#),
        "{text}"
    );
    assert!(!c.metrics().latency.minutes().is_empty());
}

#[tokio::test]
async fn out_of_stock_ends_the_create_and_another_partys_server_is_not_ours() {
    let fake = fake(roomy()).await;
    let c = client(&fake, 100);
    let err = c
        .create_server(&request("shepherd-c", "CHI"))
        .await
        .unwrap_err();
    assert!(matches!(err, LatitudeError::OutOfStock { .. }), "{err}");
    assert_eq!(err.class(), ErrorClass::Permanent);
    fake.set_faults(
        Faults::none()
            .with_rule(FaultRule::on(Call::CreateServer, FaultKind::StockRunsOut).times(1)),
    );
    let err = c
        .create_server(&request("shepherd-d", "ASH"))
        .await
        .unwrap_err();
    assert!(matches!(err, LatitudeError::OutOfStock { .. }), "{err}");
    fake.set_stock("c2-small-x86", "ASH", 5);
    fake.set_faults(
        Faults::none()
            .with_rule(FaultRule::on(Call::CreateServer, FaultKind::OtherPartyCreates).times(1)),
    );
    let ours = c
        .create_server(&request("shepherd-e", "ASH"))
        .await
        .unwrap();
    assert_eq!(ours.server.hostname(), Some("shepherd-e"));
    assert_eq!(fake.servers().len(), 2);
    assert_eq!(fake.stock("c2-small-x86", "ASH"), Some(3));
}

/// The fake's own budget (2 reads a window) answers 429 with
/// `meta.retry_after`; the client holds every read for that long, also
/// reads that were not refused themselves, and the reads then go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_read_budget_holds_every_read_for_as_long_as_it_asks() {
    let fake = fake(FakeConfig {
        reads_per_window: 2,
        writes_per_window: 100,
        rate_window: Duration::from_secs(1),
        ..FakeConfig::default()
    })
    .await;
    let c = client(&fake, 100);
    // Three reads at once (the third spends the budget), then two more
    // while the hold runs: those never got a 429 themselves, and still wait.
    let reads = (0..5u64).map(|n| {
        let c = c.clone();
        async move {
            if n >= 3 {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            c.stock("c2-small-x86", "DAL").await.unwrap()
        }
    });
    futures::future::join_all(reads).await;
    let log = fake.request_log();
    let throttled: Vec<_> = log.iter().filter(|r| r.status == 429).collect();
    assert!(!throttled.is_empty(), "the budget was never spent");
    let ok = log.iter().filter(|r| r.status == 200).count();
    assert_eq!(ok, 5);
    // After the first 429 asked for a second, no read started within it but
    // the ones already on the wire.
    let first = throttled[0];
    let inside = log
        .iter()
        .filter(|r| {
            r.started > first.finished + Duration::from_millis(100)
                && r.started < first.finished + Duration::from_millis(900)
        })
        .count();
    assert_eq!(inside, 0, "reads sent inside the hold");
}

/// Two processes' clients share the key's write budget through Postgres:
/// together they never start more writes in a window than Latitude
/// allows, so the fake, which counts per key over a sliding window, never
/// answers 429, and every create goes through.
#[sqlx::test(migrations = false)]
async fn two_processes_share_the_keys_budgets_and_are_never_throttled(pool: sqlx::PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let fake = fake(FakeConfig {
        reads_per_window: 1_000,
        writes_per_window: 3,
        rate_window: Duration::from_secs(1),
        ..FakeConfig::default()
    })
    .await;
    let budgets = shepherd::latitude::Budgets {
        reads: 1_000,
        writes: 3,
        per: Duration::from_secs(1),
    };
    let process = |n: u32| {
        let mut config = LatitudeConfig::new(fake.base_url(), fake.project(), ApiToken::new(KEY));
        config.attempt_timeout = Duration::from_secs(5);
        let c = LatitudeClient::for_cluster(config, pool.clone(), budgets).unwrap();
        async move {
            for i in 0..4 {
                c.create_server(&request(&format!("shared-{n}-{i}"), "DAL"))
                    .await
                    .unwrap();
            }
        }
    };
    tokio::join!(process(1), process(2));
    let log = fake.request_log();
    let throttled = log.iter().filter(|r| r.status == 429).count();
    assert_eq!(throttled, 0, "the fake was pushed past its budget");
    let created = log
        .iter()
        .filter(|r| r.method == "POST" && r.status == 201)
        .count();
    assert_eq!(created, 8);
}

/// A fenced create asks its fence right before the POST leaves, after its
/// turn under the write budget: the wait for a turn can be long, and the
/// lock the fence guards can be lost during it (a database restart). Asked
/// before the wait, as it once was, the fence let a create go out after its
/// place's lock was gone, beside a second run that had taken it: two
/// servers with one hostname (found by the Latitude chaos run).
#[tokio::test]
async fn a_fenced_create_asks_its_fence_after_waiting_for_its_turn() {
    use shepherd::config::Rate;
    use shepherd::metal::LocalPacer;
    use std::sync::Arc;
    use std::time::Instant;
    let fake = fake(roomy()).await;
    let mut config = LatitudeConfig::new(fake.base_url(), fake.project(), ApiToken::new(KEY));
    config.attempt_timeout = Duration::from_secs(2);
    // One write a second: the second write waits for its turn.
    let writes = Arc::new(LocalPacer::new(Rate {
        interval: Duration::from_secs(1),
        burst: 1,
    }));
    let reads = Arc::new(LocalPacer::new(Rate::UNLIMITED));
    let c = LatitudeClient::with_pacers(config, reads, writes).unwrap();
    c.create_server(&request("shepherd-first", "DAL"))
        .await
        .unwrap();
    // The lock is lost 300 ms from now, while the create waits its turn.
    let lost_at = Instant::now() + Duration::from_millis(300);
    let err = c
        .create_server_fenced(&request("shepherd-second", "DAL"), || async move {
            if Instant::now() < lost_at {
                Ok(())
            } else {
                Err("the place's lock is lost".to_string())
            }
        })
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("no longer the only sender"),
        "{err}"
    );
    assert_eq!(
        err.class(),
        ErrorClass::Transient,
        "nothing was sent: {err}"
    );
    let names: Vec<String> = fake.servers().into_iter().map(|s| s.hostname).collect();
    assert_eq!(names, vec!["shepherd-first".to_string()]);
}
