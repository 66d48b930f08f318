//! The status page, the history pages, the metrics and the probes, served
//! over a real socket against a known event log.

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
use sqlx::postgres::PgPoolOptions;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use uuid::Uuid;

struct Server {
    base: String,
    stop: watch::Sender<bool>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(pool: PgPool) -> Server {
        Server::start_with(pool, None).await
    }

    /// With the pages' actions on, behind `credential`.
    async fn start_with(pool: PgPool, credential: Option<&str>) -> Server {
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
        let state = HttpState {
            pool,
            client_metrics: ClientMetrics::default(),
            job_metrics,
            operator_token: credential.map(shepherd::secret::ApiToken::new),
        };
        let task = tokio::spawn(serve(listener, state, handle));
        Server { base, stop, task }
    }

    async fn get(&self, path: &str) -> (StatusCode, String, String) {
        self.get_accepting(path, None).await
    }

    async fn get_accepting(
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

    async fn stop(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the server stops when asked")
            .unwrap()
            .unwrap();
    }
}

async fn append(pool: &PgPool, events: Vec<Event>) {
    let mut tx = pool.begin().await.unwrap();
    record(&mut tx, events.into_iter().map(NewEvent::new).collect())
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

fn assimilated(device: Uuid, reservation: Uuid, hostname: &str) -> Event {
    MachineAssimilated {
        machine_id: Uuid::new_v4(),
        provider: "equinix".into(),
        provider_id: device.to_string(),
        reservation: Some(reservation),
        hostname: Some(hostname.into()),
    }
    .into()
}

/// The ids of the fleet `seed` builds.
struct Fleet {
    managed: Uuid,
    device: Uuid,
    penalised: Uuid,
    unknown_device: Uuid,
}

const CAUSE: &str = "createDevice: no capacity <da11> & retry later (422)";

/// One managed machine, one pending creation, one penalised reservation, a
/// reconcile refused over an unknown device, a queued job, limit 10.
async fn seed(pool: &PgPool) -> Fleet {
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
            }
            .into(),
            DeviceCreated {
                reservation: fleet.managed,
                device: fleet.device,
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
            }
            .into(),
            ReservationPenalised {
                reservation: fleet.penalised,
                until: Utc::now() + chrono::TimeDelta::hours(1),
                cause: CAUSE.into(),
                class: None,
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
                unknown_devices: vec![fleet.unknown_device],
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
fn samples(text: &str) -> HashMap<String, f64> {
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
fn positions(haystack: &str, needles: &[&str]) -> Vec<usize> {
    needles
        .iter()
        .map(|n| {
            haystack
                .find(n)
                .unwrap_or_else(|| panic!("{n} missing from:\n{haystack}"))
        })
        .collect()
}

#[sqlx::test(migrations = false)]
async fn the_status_page_shows_the_fleet_and_shouts_about_a_discrepancy(pool: PgPool) {
    let fleet = seed(&pool).await;
    let server = Server::start(pool).await;

    let (status, content_type, page) = server.get("/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(content_type.starts_with("text/html"), "{content_type}");
    assert!(page.contains("<title>shepherd</title>"));
    assert!(page.contains(r#"<meta http-equiv="refresh" content="5">"#));
    assert!(page.contains("shepherd-alpha"), "hostname:\n{page}");
    assert!(page.contains("<th>Machine limit</th><td>10</td>"));
    assert!(page.contains("<th>Managed machines</th><td>1</td>"));
    // The cause is shown, escaped.
    assert!(page.contains("createDevice: no capacity &lt;da11&gt; &amp; retry later (422)"));
    assert!(!page.contains("<da11>"));
    assert!(page.contains("class=\"alarm\""));
    assert!(page.contains("DISCREPANCY"));
    assert!(page.contains(&format!("href=\"/device/{}\"", fleet.unknown_device)));
    assert!(page.contains(&format!("href=\"/reservation/{}\"", fleet.penalised)));
    assert!(page.contains(&format!("href=\"/device/{}\"", fleet.device)));
    assert!(page.contains("provider and shepherd disagree"));
    assert!(page.contains("reservation_penalised"));

    server.stop().await;
}

#[sqlx::test(migrations = false)]
async fn history_pages_list_events_in_order_and_refuse_bad_ids(pool: PgPool) {
    let fleet = seed(&pool).await;
    let server = Server::start(pool).await;

    let (status, _, page) = server.get(&format!("/reservation/{}", fleet.managed)).await;
    assert_eq!(status, StatusCode::OK);
    let at = positions(&page, &["creation_requested", "device_created"]);
    assert!(at[0] < at[1], "out of order:\n{page}");
    // The created device links to its own history.
    assert!(page.contains(&format!("href=\"/device/{}\"", fleet.device)));

    let (status, _, page) = server.get(&format!("/device/{}", fleet.device)).await;
    assert_eq!(status, StatusCode::OK);
    let at = positions(&page, &["device_created", "machine_assimilated"]);
    assert!(at[0] < at[1], "out of order:\n{page}");
    assert!(!page.contains("creation_requested"));

    for kind in ["reservation", "device"] {
        let (status, _, page) = server.get(&format!("/{kind}/not-a-uuid")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{kind}");
        assert!(page.contains(&format!("is not a {kind} id")), "{page}");

        let nobody = Uuid::new_v4();
        let (status, _, page) = server.get(&format!("/{kind}/{nobody}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{kind}");
        assert!(
            page.contains(&format!("No events for {kind} {nobody}")),
            "{page}"
        );
    }

    server.stop().await;
}

#[sqlx::test(migrations = false)]
async fn metrics_read_the_database_at_each_scrape(pool: PgPool) {
    seed(&pool).await;
    let server = Server::start(pool.clone()).await;

    // Without an Accept header: the classic text format, which curl and
    // promtool read; asked for OpenMetrics (as Prometheus asks): that. The
    // samples are the same.
    let (status, content_type, classic) = server.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    assert!(!classic.contains("# EOF"));
    assert!(classic.contains("# TYPE shepherd_creations_total counter"));
    let (status, content_type, text) = server
        .get_accepting(
            "/metrics",
            Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(text.ends_with("# EOF\n"));
    let m = samples(&text);
    let mc = samples(&classic);
    let mut series: Vec<_> = m.keys().collect();
    let mut classic_series: Vec<_> = mc.keys().collect();
    series.sort();
    classic_series.sort();
    assert_eq!(
        series, classic_series,
        "the two formats carry different series"
    );
    for (series, value) in [
        ("shepherd_machines_managed", 1.0),
        ("shepherd_machines_in_flight", 1.0),
        ("shepherd_machines_limit", 10.0),
        ("shepherd_sinbin_reservations", 1.0),
        ("shepherd_creations_paused", 0.0),
        (
            concat!(
                "shepherd_build_info{version=\"",
                env!("CARGO_PKG_VERSION"),
                "\"}"
            ),
            1.0,
        ),
        ("shepherd_reservations{class=\"available\"}", 5.0),
        ("shepherd_creations_total{outcome=\"created\"}", 1.0),
        ("shepherd_creations_total{outcome=\"recovered\"}", 0.0),
        ("shepherd_creations_total{outcome=\"given_up\"}", 0.0),
        ("shepherd_discrepancies_total", 1.0),
        ("shepherd_assimilations_total{outcome=\"assimilated\"}", 1.0),
        ("shepherd_assimilations_total{outcome=\"rejected\"}", 0.0),
        ("shepherd_jobs{kind=\"reconcile\",state=\"Pending\"}", 1.0),
        // Present at zero, so an alert can fire on the first one.
        (
            "shepherd_jobs{kind=\"create_device\",state=\"Killed\"}",
            0.0,
        ),
        ("shepherd_jobs{kind=\"assimilate\",state=\"Failed\"}", 0.0),
        ("shepherd_metal_calls_in_flight", 0.0),
        ("shepherd_metal_calls_waiting", 0.0),
    ] {
        assert_eq!(m.get(series), Some(&value), "{series} in:\n{text}");
    }
    let age = m["shepherd_job_oldest_age_seconds{kind=\"reconcile\",state=\"Pending\"}"];
    assert!((0.0..60.0).contains(&age), "{age}");
    // The listing's figures say how old they are.
    let listed = m["shepherd_reservations_listed_age_seconds"];
    assert!((0.0..60.0).contains(&listed), "{listed}");
    // This process's own figures.
    assert!(m["process_resident_memory_bytes"] > 1_000_000.0);
    assert!(m["process_open_fds"] >= 3.0);
    assert!(m["process_cpu_seconds_total"] > 0.0);
    let started = m["process_start_time_seconds"];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        started > now - 3600.0 && started <= now + 1.0,
        "{started} vs {now}"
    );
    assert!(text.contains("# TYPE shepherd_job_run_time_seconds histogram"));
    assert_eq!(
        m["shepherd_job_run_time_seconds_count{kind=\"assimilate\",outcome=\"ok\"}"],
        1.0
    );
    assert!(text.contains("# TYPE shepherd_creations counter"));
    assert!(
        !text.contains("class=\"total\""),
        "a total beside its parts double-counts under sum()"
    );
    let classes: f64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("shepherd_reservations{"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(
        classes, 9.0,
        "the classes add up to the reservations listed"
    );
    // The only pass was refused.
    assert!(!text.contains("shepherd_last_successful_reconcile_age_seconds"));

    append(
        &pool,
        vec![assimilated(Uuid::new_v4(), Uuid::new_v4(), "shepherd-beta")],
    )
    .await;
    let m = samples(&server.get("/metrics").await.2);
    assert_eq!(m["shepherd_machines_managed"], 2.0);
    assert_eq!(
        m["shepherd_assimilations_total{outcome=\"assimilated\"}"],
        2.0
    );
    let run = Uuid::new_v4();
    append(
        &pool,
        vec![
            ReconcileStarted {
                run,
                max_machines: 10,
                chunk_size: 5,
                requested_by: None,
            }
            .into(),
            ReconcileFinished {
                run,
                managed: 2,
                in_flight: 1,
                enqueued: 0,
                at_limit: false,
            }
            .into(),
        ],
    )
    .await;
    let m = samples(&server.get("/metrics").await.2);
    let age = m["shepherd_last_successful_reconcile_age_seconds"];
    assert!((0.0..60.0).contains(&age), "{age}");
    assert!(!server.get("/").await.2.contains("DISCREPANCY"));

    server.stop().await;
}

#[sqlx::test(migrations = false)]
async fn probes_follow_the_database(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    // A pool of its own, so closing it leaves the test's pool to clean up.
    let own = PgPoolOptions::new()
        .max_connections(2)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let server = Server::start(own.clone()).await;

    assert_eq!(
        server.get("/healthz").await,
        (
            StatusCode::OK,
            "text/plain; charset=utf-8".into(),
            "ok".into()
        )
    );
    let (status, _, body) = server.get("/readyz").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ready"));

    own.close().await;
    let (status, _, body) = server.get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.starts_with("not ready"), "{body}");
    assert!(!body.contains("postgres://"));
    assert_eq!(server.get("/healthz").await.0, StatusCode::OK);
    for path in ["/", "/metrics"] {
        let (status, _, body) = server.get(path).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
        assert!(!body.contains("postgres://"), "{body}");
    }

    server.stop().await;
}

/// The path of promtool (scripts/test fetches it from Debian's prometheus
/// package when the machine has none).
fn promtool() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("SHEPHERD_PROMTOOL") {
        return p.into();
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("promtool"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("promtool not found: run the suite with scripts/test (it fetches promtool), or set SHEPHERD_PROMTOOL")
    })
}

/// Prometheus's own checker accepts what a scrape answers, with help and
/// type on every family (it exits non-zero on a lint problem), and the
/// documented alert rules load and pass their unit tests.
#[sqlx::test(migrations = false)]
async fn promtool_accepts_the_metrics_and_the_alert_rules(pool: PgPool) {
    seed(&pool).await;
    let server = Server::start(pool.clone()).await;
    let (_, _, classic) = server.get("/metrics").await;
    server.stop().await;
    let mut check = std::process::Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        check
            .stdin
            .take()
            .unwrap()
            .write_all(classic.as_bytes())
            .unwrap();
    }
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{classic}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");
    for args in [
        vec!["check", "rules", "alerts.yml"],
        vec!["test", "rules", "alerts.test.yml"],
    ] {
        let out = std::process::Command::new(promtool())
            .args(&args)
            .current_dir(deploy)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The jobs pages: the list filtered by kind and state, a job's arguments,
/// state and the events it recorded (linked from the event tables), every
/// value escaped, and clear refusals of a filter that names nothing.
#[sqlx::test(migrations = false)]
async fn the_jobs_pages_list_filter_and_show_a_job(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let device = uuid::Uuid::new_v4();
    let marked: String = sqlx::query_scalar(
        "select shepherd.push_job('assimilate',
            jsonb_build_object('device', $1::uuid, 'manual', true, 'note', '<b>bold</b>'))",
    )
    .bind(device)
    .fetch_one(&pool)
    .await
    .unwrap();
    let reconcile: String = sqlx::query_scalar("select shepherd.enqueue_reconcile()")
        .fetch_one(&pool)
        .await
        .unwrap();
    sqlx::query("update apalis.jobs set status = 'Killed', attempts = 1, last_result = '\"undecodable\"' where id = $1")
        .bind(&reconcile)
        .execute(&pool)
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    shepherd::events::record(
        &mut tx,
        vec![
            shepherd::events::NewEvent::new(shepherd::events::event::AssimilationRejected {
                device,
                reason: "not known to the provider".into(),
            })
            .caused_by(&marked),
        ],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let server = Server::start(pool.clone()).await;

    let (status, _, all) = server.get("/jobs").await;
    assert_eq!(status, StatusCode::OK);
    assert!(all.contains(&marked) && all.contains(&reconcile), "{all}");
    let (_, _, killed) = server.get("/jobs?state=Killed").await;
    assert!(
        killed.contains(&reconcile) && !killed.contains(&marked),
        "{killed}"
    );
    let (_, _, assimilations) = server.get("/jobs?kind=assimilate").await;
    assert!(assimilations.contains(&marked) && !assimilations.contains(&reconcile));
    for bad in [
        "/jobs?state=Sleeping",
        "/jobs?kind=teleport",
        "/jobs?page=0",
    ] {
        let (status, _, text) = server.get(bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {text}");
    }

    let (status, _, job) = server.get(&format!("/jobs/{marked}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(job.contains(&device.to_string()), "{job}");
    assert!(
        job.contains("&lt;b&gt;bold&lt;/b&gt;") && !job.contains("<b>bold</b>"),
        "the arguments were not escaped:\n{job}"
    );
    assert!(
        job.contains("assimilation_rejected"),
        "the job's events: {job}"
    );
    let (_, _, killed_job) = server.get(&format!("/jobs/{reconcile}")).await;
    assert!(killed_job.contains("Killed") && killed_job.contains("undecodable"));
    let (status, _, _) = server.get("/jobs/no-such-job").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The status page links the jobs, and its recent events their job.
    let (_, _, front) = server.get("/").await;
    assert!(
        front.contains("href=\"/jobs\""),
        "the status page links the jobs"
    );
    assert!(
        front.contains(&format!("href=\"/jobs/{marked}\"")),
        "the event does not link its job:\n{front}"
    );
    server.stop().await;
}

/// The status page raises what needs a person: a fleet over its limit, no
/// successful pass for long, creations whose outcome is unknown; it lists
/// live workers apart from silent and replaced generations, and keeps a
/// pass's routine events out of the recent ones.
#[sqlx::test(migrations = false)]
async fn the_status_page_warns_and_tells_live_workers_from_gone(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let settings =
        shepherd::cluster::ClusterSettings::proposed_by(&shepherd::config::ProvisionerConfig {
            max_machines: 1,
            ..Default::default()
        });
    shepherd::cluster::establish(&pool, &settings, &[], "test")
        .await
        .unwrap();
    let (r1, r2, r3) = (
        uuid::Uuid::new_v4(),
        uuid::Uuid::new_v4(),
        uuid::Uuid::new_v4(),
    );
    let request = uuid::Uuid::new_v4();
    let mut events: Vec<shepherd::events::NewEvent> = vec![];
    for r in [r1, r2] {
        events.push(shepherd::events::NewEvent::new(
            shepherd::events::event::MachineAssimilated {
                machine_id: uuid::Uuid::new_v4(),
                provider: "equinix".into(),
                provider_id: uuid::Uuid::new_v4().to_string(),
                reservation: Some(r),
                hostname: None,
            },
        ));
    }
    events.push(shepherd::events::NewEvent::new(
        shepherd::events::event::CreationRequested {
            reservation: r3,
            request,
            manual: false,
            requested_by: None,
            sinbin_override: None,
        },
    ));
    events.push(shepherd::events::NewEvent::new(
        shepherd::events::event::CreationUnresolved {
            reservation: r3,
            request,
            attempt: 5,
            message: "no answer within 30s".into(),
        },
    ));
    let mut tx = pool.begin().await.unwrap();
    shepherd::events::record(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();
    // A pass that finished an hour ago (written as it would have been).
    sqlx::query(
        "insert into shepherd.events (event_id, stream, event_type, schema_version, body, recorded_at)
         values (gen_random_uuid(), 'reconcile/' || gen_random_uuid(), 'reconcile_finished', 1,
                 '{\"run\": \"00000000-0000-0000-0000-000000000000\", \"managed\": 2, \"in_flight\": 0,
                   \"enqueued\": 0, \"at_limit\": true}', now() - interval '1 hour')",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "insert into apalis.workers (id, worker_type, storage_name, last_seen) values
           ('create_device@h-1#0', 'create_device', 'x', now()),
           ('create_device@h-1#1', 'create_device', 'x', now()),
           ('assimilate@h-2#0', 'assimilate', 'x', now() - interval '5 minutes')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let server = Server::start(pool.clone()).await;
    let (_, _, page) = server.get("/").await;
    server.stop().await;
    assert!(page.contains("OVER THE LIMIT"), "{page}");
    assert!(page.contains("NO SUCCESSFUL PASS"), "{page}");
    assert!(
        page.contains("creation(s) with an unknown outcome"),
        "{page}"
    );
    assert!(page.contains(&format!("/reservation/{r3}")), "{page}");
    let workers = &page[page.find("<h2>Workers</h2>").unwrap()..];
    let live = workers.find("create_device@h-1#1").unwrap();
    let gone_note = workers.find("Silent for over a minute").unwrap();
    let replaced = workers.find("create_device@h-1#0").unwrap();
    let silent = workers.find("assimilate@h-2#0").unwrap();
    assert!(
        live < gone_note && gone_note < replaced && gone_note < silent,
        "{workers}"
    );
    let recent = &page[page.find("Recent events").unwrap()..];
    assert!(!recent.contains("reconcile_finished"), "{recent}");
    assert!(recent.contains("creation_unresolved"), "{recent}");
}

/// Machines beyond what the status page shows are on `/machines`, paged and
/// searchable (a search's wildcards taken literally, every value escaped).
#[sqlx::test(migrations = false)]
async fn machines_are_paged_and_searchable(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let mut events = vec![];
    for n in 0..130 {
        events.push(shepherd::events::NewEvent::new(
            shepherd::events::event::MachineAssimilated {
                machine_id: uuid::Uuid::new_v4(),
                provider: "equinix".into(),
                provider_id: uuid::Uuid::new_v4().to_string(),
                reservation: Some(uuid::Uuid::new_v4()),
                hostname: Some(format!("shepherd-{n:03}")),
            },
        ));
    }
    let mut tx = pool.begin().await.unwrap();
    shepherd::events::record(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();
    // The last one assimilated, in a later transaction.
    let mut tx = pool.begin().await.unwrap();
    shepherd::events::record(
        &mut tx,
        vec![shepherd::events::NewEvent::new(
            shepherd::events::event::MachineAssimilated {
                machine_id: uuid::Uuid::new_v4(),
                provider: "equinix".into(),
                provider_id: uuid::Uuid::new_v4().to_string(),
                reservation: None,
                hostname: Some("odd_<name>%".into()),
            },
        )],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let server = Server::start(pool.clone()).await;
    let (_, _, front) = server.get("/").await;
    assert!(front.contains("<h2>Managed machines (131)"), "{front}");
    let listed =
        &front[front.find("<h2>Managed machines").unwrap()..front.find("Recent events").unwrap()];
    assert_eq!(
        listed.matches("<tr><td class=\"id\">").count(),
        50,
        "{listed}"
    );
    // The newest first: the odd one was assimilated last.
    let first_row = &listed[listed.find("<tbody>").unwrap()..];
    let first_row = &first_row[..first_row.find("</tr>").unwrap()];
    assert!(first_row.contains("odd_&lt;name&gt;%"), "{first_row}");
    let (status, _, first) = server.get("/machines").await;
    assert_eq!(status, StatusCode::OK);
    assert!(first.contains("131 machine(s); page 1 of 2."), "{first}");
    assert!(first.contains("href=\"/machines?page=2\""));
    let (_, _, second) = server.get("/machines?page=2").await;
    assert!(second.contains("page 2 of 2."));
    let (_, _, found) = server.get("/machines?q=shepherd-12").await;
    // shepherd-120 to shepherd-129 (shepherd-012 does not match).
    assert!(found.contains("10 machine(s) matching"), "{found}");
    // `_` and `%` are not wildcards in a search; markup is escaped.
    let (_, _, odd) = server.get("/machines?q=%25").await;
    assert!(odd.contains("1 machine(s) matching"), "{odd}");
    assert!(
        odd.contains("odd_&lt;name&gt;%") && !odd.contains("<name>"),
        "{odd}"
    );
    let (status, _, _) = server.get("/machines?page=0").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    server.stop().await;
}

// ----- in a real browser -----

/// Enough of the WebDriver protocol (W3C, over HTTP and JSON) to drive
/// Debian's chromium through chromedriver: no client crate needed.
struct Browser {
    http: reqwest::Client,
    base: String,
    session: String,
    driver: std::process::Child,
}

/// The key W3C WebDriver names a found element by.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    async fn start() -> Browser {
        let chromedriver = std::env::var("SHEPHERD_CHROMEDRIVER")
            .unwrap_or_else(|_| "/usr/bin/chromedriver".into());
        let chromium =
            std::env::var("SHEPHERD_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        assert!(
            std::path::Path::new(&chromedriver).exists()
                && std::path::Path::new(&chromium).exists(),
            "{chromedriver} or {chromium} missing: run the suite with scripts/test (it installs \
             Debian's chromium and chromium-driver), or set SHEPHERD_CHROMEDRIVER and SHEPHERD_CHROMIUM"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = std::process::Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let started = std::time::Instant::now();
        while http.get(format!("{base}/status")).send().await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let created: serde_json::Value = http
            .post(format!("{base}/session"))
            .json(&serde_json::json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": chromium,
                    "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                             "--disable-dev-shm-usage", "--window-size=1280,1000"]
                }
            }}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_string();
        Browser {
            http,
            base,
            session,
            driver,
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: serde_json::Value,
    ) -> serde_json::Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut request = self.http.request(method, url);
        if !body.is_null() {
            request = request.json(&body);
        }
        let answer: serde_json::Value = request.send().await.unwrap().json().await.unwrap();
        assert!(
            answer["value"].get("error").is_none(),
            "WebDriver {path}: {answer}"
        );
        answer["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.call(
            reqwest::Method::POST,
            "/url",
            serde_json::json!({ "url": url }),
        )
        .await;
    }

    async fn find(&self, css: &str) -> String {
        let found = self
            .call(
                reqwest::Method::POST,
                "/element",
                serde_json::json!({"using": "css selector", "value": css}),
            )
            .await;
        found[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("{css}: {found}"))
            .to_string()
    }

    async fn click(&self, css: &str) {
        let id = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{id}/click"),
            serde_json::json!({}),
        )
        .await;
    }

    /// What a person reads in the element: its rendered text.
    async fn text(&self, css: &str) -> String {
        let id = self.find(css).await;
        self.call(
            reqwest::Method::GET,
            &format!("/element/{id}/text"),
            serde_json::Value::Null,
        )
        .await
        .as_str()
        .unwrap()
        .to_string()
    }

    async fn type_text(&self, css: &str, text: &str) {
        let id = self.find(css).await;
        self.call(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            serde_json::json!({ "text": text }),
        )
        .await;
    }

    async fn url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", serde_json::Value::Null)
            .await
            .as_str()
            .unwrap()
            .to_string()
    }

    async fn screenshot(&self, name: &str) {
        use base64::Engine;
        let png = self
            .call(reqwest::Method::GET, "/screenshot", serde_json::Value::Null)
            .await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "not a PNG");
        // Kept in docs/ when asked for (SHEPHERD_SCREENSHOTS=1), so a run
        // does not rewrite tracked files by accident.
        if std::env::var_os("SHEPHERD_SCREENSHOTS").is_some() {
            let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/screenshots");
            std::fs::create_dir_all(dir).unwrap();
            std::fs::write(format!("{dir}/{name}.png"), bytes).unwrap();
        }
    }

    async fn quit(mut self) {
        let _ = self
            .http
            .delete(format!("{}/session/{}", self.base, self.session))
            .send()
            .await;
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// A person's walk through the console in headless Chromium: the status
/// page shows the discrepancy, a click on the queue's state opens the
/// filtered job list, the filter form narrows it, a job's page shows its
/// arguments as text (not as markup), and a reservation's history follows
/// from the status page.
#[sqlx::test(migrations = false)]
async fn an_operator_clicks_through_the_console_in_a_browser(pool: PgPool) {
    let fleet = seed(&pool).await;
    let marked: String = sqlx::query_scalar(
        "select shepherd.push_job('assimilate',
            jsonb_build_object('device', gen_random_uuid(), 'manual', true, 'note', '<i>not markup</i>'))",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let server = Server::start_with(pool.clone(), Some("browser-credential")).await;
    let browser = Browser::start().await;

    browser.goto(&format!("{}/", server.base)).await;
    let alarm = browser.text("div.alarm").await;
    assert!(alarm.contains("DISCREPANCY"), "{alarm}");
    assert!(alarm.contains(&fleet.unknown_device.to_string()), "{alarm}");
    let fleet_box = browser.text("table.facts").await;
    assert!(fleet_box.contains("Managed machines 1"), "{fleet_box}");
    browser.screenshot("status-page").await;

    // The queue's state links the filtered list.
    browser
        .click("a[href='/jobs?kind=assimilate&state=Pending']")
        .await;
    assert!(
        browser
            .url()
            .await
            .ends_with("/jobs?kind=assimilate&state=Pending")
    );
    let list = browser.text("table").await;
    assert!(list.contains(&marked), "{list}");
    assert!(!list.contains("reconcile"), "{list}");
    browser.screenshot("jobs").await;

    // The filter form: any kind, Pending only.
    browser.click("select[name=kind] option[value='']").await;
    browser
        .click("select[name=state] option[value=Pending]")
        .await;
    browser.click("form button").await;
    let url = browser.url().await;
    assert!(
        url.contains("state=Pending") && url.contains("kind="),
        "{url}"
    );
    let list = browser.text("table").await;
    assert!(
        list.contains("reconcile") && list.contains(&marked),
        "{list}"
    );

    // A job's page: its arguments read as text.
    browser.click(&format!("a[href='/jobs/{marked}']")).await;
    let arguments = browser.text("pre.body").await;
    assert!(arguments.contains("<i>not markup</i>"), "{arguments}");
    browser.screenshot("job").await;

    // Back to the front page, then a penalised reservation's history.
    browser.goto(&format!("{}/", server.base)).await;
    browser
        .click(&format!("a[href='/reservation/{}']", fleet.penalised))
        .await;
    let heading = browser.text("h1").await;
    assert!(heading.contains(&fleet.penalised.to_string()), "{heading}");

    // An action: log in, pause creations, read the notice.
    browser.goto(&format!("{}/login", server.base)).await;
    browser.type_text("input[name=who]", "alice").await;
    browser
        .type_text("input[name=token]", "browser-credential")
        .await;
    browser.click("form button").await;
    assert!(browser.url().await.ends_with('/'));
    browser
        .type_text(
            "form[action='/actions/pause'] input[name=reason]",
            "maintenance",
        )
        .await;
    browser.click("form[action='/actions/pause'] button").await;
    let notice = browser.text("div.warn").await;
    assert!(
        notice.contains("Creations are paused")
            && notice.contains("console:alice")
            && notice.contains("maintenance"),
        "{notice}"
    );
    browser.screenshot("paused").await;
    browser.quit().await;
    server.stop().await;
}

/// Actions are off without a credential; with one, each needs it (a cookie
/// from the log-in, or a Bearer header), refuses another site's request,
/// goes through the SQL functions' own checks, and is recorded with who.
#[sqlx::test(migrations = false)]
async fn actions_need_the_credential_and_record_who(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let read_only = Server::start(pool.clone()).await;
    let r = post_form(
        &http,
        format!("{}/actions/pause", read_only.base),
        &[],
        &[("reason", "x")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let (_, _, page) = read_only.get("/").await;
    assert!(
        !page.contains("Actions"),
        "read-only pages offer no actions"
    );
    read_only.stop().await;

    let server = Server::start_with(pool.clone(), Some("s3cret-operator")).await;
    let events = |kind: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "select count(*) from shepherd.events where event_type = $1",
            )
            .bind(kind)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    // No credential, a wrong one: refused, nothing recorded.
    let r = post_form(
        &http,
        format!("{}/actions/pause", server.base),
        &[],
        &[("reason", "x")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = post_form(
        &http,
        format!("{}/login", server.base),
        &[],
        &[("who", "alice"), ("token", "guess")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(events("creations_paused").await, 0);
    // Logged in: the cookies act, and say who.
    let r = post_form(
        &http,
        format!("{}/login", server.base),
        &[],
        &[("who", "alice"), ("token", "s3cret-operator")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let cookies: Vec<String> = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string())
        .collect();
    assert!(
        r.headers()
            .get_all("set-cookie")
            .iter()
            .any(|v| v.to_str().unwrap().contains("HttpOnly; SameSite=Strict"))
    );
    let cookie = cookies.join("; ");
    let r = post_form(
        &http,
        format!("{}/actions/pause", server.base),
        &[("cookie", &cookie)],
        &[("reason", "maintenance window")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let by: String = sqlx::query_scalar(
        "select body->>'by' from shepherd.events where event_type = 'creations_paused'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(by, "console:alice");
    // Another site's form, even with the cookies: refused.
    let r = post_form(
        &http,
        format!("{}/actions/resume", server.base),
        &[("cookie", &cookie), ("origin", "http://evil.example")],
        &[("reason", "x")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // A script: Bearer and its name.
    let r = post_form(
        &http,
        format!("{}/actions/resume", server.base),
        &[
            ("authorization", "Bearer s3cret-operator"),
            ("x-shepherd-operator", "deploy-bot"),
        ],
        &[("reason", "window over")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let by: String = sqlx::query_scalar(
        "select body->>'by' from shepherd.events where event_type = 'creations_resumed'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(by, "console:deploy-bot");
    // The SQL functions' checks hold: a pause needs a reason.
    let r = post_form(
        &http,
        format!("{}/actions/pause", server.base),
        &[("cookie", &cookie)],
        &[("reason", "")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("reason"));
    // A pass asked for from the page says who asked.
    let r = http
        .post(format!("{}/actions/reconcile", server.base))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let asked: String = sqlx::query_scalar(
        "select convert_from(job, 'UTF8')::jsonb->>'requested_by' from apalis.jobs where job_type = 'reconcile'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(asked, "console:alice");
    let r = http
        .post(format!("{}/actions/teleport", server.base))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    server.stop().await;
}

/// An `application/x-www-form-urlencoded` body, as a browser's form sends.
fn form_body(pairs: &[(&str, &str)]) -> String {
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
async fn post_form(
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
