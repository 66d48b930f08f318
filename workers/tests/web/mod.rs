//! What the page tests share: a server on a real socket over a test
//! database, a known fleet to show, and readers of what it answers.
#![allow(dead_code)]

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use reqwest::StatusCode;
use shepherd::events::event::*;
use shepherd::events::{NewEvent, record};
use shepherd::jobs::{ReconcileArgs, queue};
use shepherd::metal::ClientMetrics;
use shepherd_workers::services::http::{HttpState, serve};
use shepherd_workers::services::runtime::Stop;
use sqlx::PgPool;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use uuid::Uuid;

pub mod browser;

pub struct Server {
    pub base: String,
    pub stop: watch::Sender<bool>,
    pub task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    pub async fn start(pool: PgPool) -> Server {
        Server::start_with(pool, None).await
    }

    /// With the pages' actions on, behind `credential`.
    pub async fn start_with(pool: PgPool, credential: Option<&str>) -> Server {
        Server::start_full(pool, credential, None).await
    }

    /// Speaking for `provider` (the names it gives units).
    pub async fn start_full(
        pool: PgPool,
        credential: Option<&str>,
        provider: Option<std::sync::Arc<dyn shepherd::provider::Provider>>,
    ) -> Server {
        Server::start_edged(pool, credential, provider, Default::default()).await
    }

    /// Behind a proxy on loopback that says who asks (`X-Forwarded-For`),
    /// answering `console.example.com` too.
    pub async fn start_behind_proxy(pool: PgPool, credential: Option<&str>) -> Server {
        let edges = shepherd_workers::services::http::Edges {
            hosts: vec!["console.example.com".into()],
            trusted_proxies: vec!["127.0.0.1".parse().unwrap()],
        };
        Server::start_edged(pool, credential, None, edges).await
    }

    /// As a scheduler serves it: no provider of its own, the cluster's
    /// recorded one named.
    pub async fn start_for_cluster(pool: PgPool, cluster_provider: &str) -> Server {
        Server::start_served(
            pool,
            None,
            None,
            Default::default(),
            Some(cluster_provider.into()),
        )
        .await
    }

    pub async fn start_edged(
        pool: PgPool,
        credential: Option<&str>,
        provider: Option<std::sync::Arc<dyn shepherd::provider::Provider>>,
        edges: shepherd_workers::services::http::Edges,
    ) -> Server {
        Server::start_served(pool, credential, provider, edges, None).await
    }

    async fn start_served(
        pool: PgPool,
        credential: Option<&str>,
        provider: Option<std::sync::Arc<dyn shepherd::provider::Provider>>,
        edges: shepherd_workers::services::http::Edges,
        cluster_provider: Option<String>,
    ) -> Server {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, handle) = Stop::new();
        // One job run, as the runtime records it, to see it served.
        let job_metrics = shepherd_workers::services::runtime::JobMetrics::default();
        job_metrics
            .run_time
            .get_or_create(&shepherd_workers::services::runtime::JobRunLabels {
                kind: "assimilate",
                outcome: "ok",
            })
            .observe(0.25);
        // And one API call of 150 ms, as the client records it.
        let client_metrics = ClientMetrics::default();
        client_metrics
            .latency
            .record(std::time::SystemTime::now(), 0.150);
        let state = HttpState {
            work_pool: Some(pool.clone()),
            pool,
            client_metrics,
            job_metrics,
            operator_token: credential.map(shepherd::secret::ApiToken::new),
            provider,
            edges,
            cluster_provider,
        };
        let task = tokio::spawn(serve(listener, state, handle));
        Server { base, stop, task }
    }

    pub async fn get(&self, path: &str) -> (StatusCode, String, String) {
        self.get_accepting(path, None).await
    }

    pub async fn get_accepting(
        &self,
        path: &str,
        accept: Option<&str>,
    ) -> (StatusCode, String, String) {
        let mut request = reqwest::Client::new().get(format!("{}{path}", self.base));
        if let Some(a) = accept {
            request = request.header(reqwest::header::ACCEPT, a);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        (status, content_type, response.text().await.unwrap())
    }

    pub async fn stop(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the server stops when asked")
            .unwrap()
            .unwrap();
    }
}

pub async fn append(pool: &PgPool, events: Vec<Event>) {
    let mut tx = pool.begin().await.unwrap();
    record(&mut tx, events.into_iter().map(NewEvent::new).collect())
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

pub fn assimilated(device: Uuid, reservation: Uuid, hostname: &str) -> Event {
    MachineAssimilated {
        machine_id: Uuid::new_v4(),
        provider: "metal".into(),
        provider_id: device.to_string(),
        reservation: Some(reservation),
        hostname: Some(hostname.into()),
    }
    .into()
}

/// The ids of the fleet `seed` builds.
pub struct Fleet {
    pub managed: Uuid,
    pub device: Uuid,
    pub penalised: Uuid,
    pub unknown_device: Uuid,
}

pub const CAUSE: &str = "createDevice: no capacity <da11> & retry later (422)";

/// One managed machine, one pending creation, one penalised reservation, a
/// reconcile refused over an unknown device, a queued job, limit 10.
pub async fn seed(pool: &PgPool) -> Fleet {
    shepherd::db::migrate(pool).await.unwrap();
    let fleet = Fleet {
        managed: Uuid::new_v4(),
        device: Uuid::new_v4(),
        penalised: Uuid::new_v4(),
        unknown_device: Uuid::new_v4(),
    };
    let pending = Uuid::new_v4();
    let run = Uuid::new_v4();
    append(
        pool,
        vec![
            CreationRequested {
                reservation: fleet.managed,
                request: Uuid::new_v4(),
                manual: false,
                requested_by: None,
                sinbin_override: None,
                place: None,
            }
            .into(),
            DeviceCreated {
                reservation: fleet.managed,
                device: fleet.device.to_string(),
                hostname: "shepherd-alpha".into(),
                witness: "shepherd-witness:w1".into(),
                recovered: false,
                request: None,
            }
            .into(),
            assimilated(fleet.device, fleet.managed, "shepherd-alpha"),
            CreationRequested {
                reservation: pending,
                request: Uuid::new_v4(),
                manual: true,
                requested_by: None,
                sinbin_override: None,
                place: None,
            }
            .into(),
            ReservationPenalised {
                reservation: fleet.penalised,
                until: Utc::now() + chrono::TimeDelta::hours(1),
                cause: CAUSE.into(),
                class: None,
                scope: None,
            }
            .into(),
            ReconcileStarted {
                run,
                max_machines: 10,
                chunk_size: 5,
                requested_by: None,
            }
            .into(),
            ReservationsListed {
                run,
                counts: ReservationCounts {
                    total: 9,
                    available: 5,
                    in_use: 1,
                    not_provisionable: 1,
                    penalised: 1,
                    in_flight: 1,
                },
            }
            .into(),
            DiscrepancyFound {
                run,
                unknown_devices: vec![fleet.unknown_device.to_string()],
                missing_devices: vec![],
            }
            .into(),
            ReconcileRefused {
                run,
                reason: "provider and shepherd disagree".into(),
            }
            .into(),
        ],
    )
    .await;
    let mut tx = pool.begin().await.unwrap();
    queue::push_reconcile(
        &mut tx,
        &ReconcileArgs {
            requested_by: "test".into(),
        },
        None,
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    shepherd::cluster::establish(
        pool,
        &shepherd::cluster::ClusterSettings {
            max_machines: shepherd::cluster::MachineLimit(10),
            ..shepherd::cluster::ClusterSettings::proposed_by(&Default::default())
        },
        &[],
        "test",
    )
    .await
    .unwrap();
    fleet
}

/// The samples of a scrape, either format (the OpenMetrics answer's
/// `# EOF` is checked where that format is asked for).
pub fn samples(text: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("not a sample: {line}"));
        let name = series.split('{').next().unwrap();
        assert!(
            (name.starts_with("shepherd_") || name.starts_with("process_"))
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "bad metric name in {line}"
        );
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line}"));
        assert!(
            out.insert(series.to_string(), value).is_none(),
            "{series} twice"
        );
    }
    out
}

/// Positions of `needles` in `haystack`, asserting each is present.
pub fn positions(haystack: &str, needles: &[&str]) -> Vec<usize> {
    needles
        .iter()
        .map(|n| {
            haystack
                .find(n)
                .unwrap_or_else(|| panic!("{n} missing from:\n{haystack}"))
        })
        .collect()
}

/// An `application/x-www-form-urlencoded` body, as a browser's form sends.
pub fn form_body(pairs: &[(&str, &str)]) -> String {
    let encode = |s: &str| -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    (b as char).to_string()
                }
                b' ' => "+".to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// POSTs a form as a browser would, with extra headers.
pub async fn post_form(
    http: &reqwest::Client,
    url: String,
    headers: &[(&str, &str)],
    pairs: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = http
        .post(url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form_body(pairs));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

/// A job pushed through `shepherd.push_job` and left as a worker would
/// leave it after one run: in `status`, with `result` as its last result.
pub async fn ended_job(
    pool: &PgPool,
    kind: &str,
    args: &serde_json::Value,
    status: &str,
    result: &str,
) -> String {
    let id: String = sqlx::query_scalar("select shepherd.push_job($1, $2)")
        .bind(kind)
        .bind(args)
        .fetch_one(pool)
        .await
        .unwrap();
    sqlx::query(
        "update apalis.jobs set status = $2, attempts = 1, done_at = now(),
             last_result = $3::jsonb where id = $1",
    )
    .bind(&id)
    .bind(status)
    .bind(result)
    .execute(pool)
    .await
    .unwrap();
    id
}

/// Counts the log's events of one type; a query that fails fails the test.
pub async fn count_events(pool: &PgPool, event_type: &str) -> i64 {
    sqlx::query_scalar("select count(*) from shepherd.events where event_type = $1")
        .bind(event_type)
        .fetch_one(pool)
        .await
        .expect("counting events")
}

/// Who recorded the one event of `event_type` (its `by`); a query that
/// fails, or no such event, fails the test.
pub async fn recorded_by(pool: &PgPool, event_type: &str) -> String {
    sqlx::query_scalar("select body->>'by' from shepherd.events where event_type = $1")
        .bind(event_type)
        .fetch_one(pool)
        .await
        .expect("reading who recorded the event")
}

/// A client that shows each answer as it is, redirects included.
pub fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("an HTTP client")
}

/// The URL of the test's own database, for the binary to run against.
pub async fn database_url(pool: &PgPool) -> String {
    let name: String = sqlx::query_scalar("select current_database()")
        .fetch_one(pool)
        .await
        .expect("reading the test database's name");
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for tests");
    let (server, _) = base
        .rsplit_once('/')
        .expect("DATABASE_URL names a database");
    format!("{server}/{name}")
}
