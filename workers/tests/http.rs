//! The status page, the history pages, the event log, the charts, the
//! metrics and the probes, served over a real socket against a known event
//! log.

mod web;

use reqwest::StatusCode;
use shepherd::events::event::*;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;
use web::*;

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

fn promtool_check_metrics(classic: &str) {
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
    promtool_check_metrics(&classic);
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

/// The charts count what the log and the queue hold: creations, failures
/// and give-ups in the bar of the moment they were recorded, the queue's
/// depth by kind, and this process's API latency by minute.
#[sqlx::test(migrations = false)]
async fn charts_draw_what_the_log_and_the_queue_hold(pool: PgPool) {
    use shepherd::events::event::*;
    seed(&pool).await;
    let r = Uuid::new_v4();
    let mut events: Vec<shepherd::events::Event> = Vec::new();
    for n in 0..3 {
        events.push(
            DeviceCreated {
                reservation: r,
                device: Uuid::new_v4().to_string(),
                hostname: format!("shepherd-chart-{n}"),
                witness: format!("shepherd-witness:c{n}"),
                recovered: false,
                request: None,
            }
            .into(),
        );
    }
    events.push(
        CreationGivenUp {
            reservation: r,
            class: shepherd::metal::ErrorClass::Permanent,
            message: "no".into(),
            request: None,
        }
        .into(),
    );
    append(&pool, events).await;
    for _ in 0..2 {
        sqlx::query("select shepherd.enqueue_create_device($1)")
            .bind(Uuid::new_v4())
            .execute(&pool)
            .await
            .unwrap();
    }
    let server = Server::start(pool.clone()).await;
    let (status, _, page) = server.get("/charts").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    // seed() created one device too: four in all, all in the last bar.
    assert!(page.contains("<title>4 devices created from"), "{page}");
    assert!(page.contains("<title>1 creations given up from"), "{page}");
    assert!(page.contains("<title>2 create_device from"), "{page}");
    assert!(page.contains("<title>150 ms mean from"), "{page}");
    assert!(!page.contains("<title>0 "), "empty bars are not drawn");
    let (status, _, page) = server.get("/charts?window=24h").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("<title>4 devices created from"), "{page}");
    let (status, _, page) = server.get("/charts?window=1y").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(page.contains("1h, 24h, 7d"), "{page}");
    server.stop().await;
}

/// The event log, filtered by stream (one, or a kind) and type, a page of
/// 100 at a time, newest first.
#[sqlx::test(migrations = false)]
async fn the_event_log_filters_by_stream_and_type_and_pages(pool: PgPool) {
    use shepherd::events::event::*;
    let fleet = seed(&pool).await;
    let server = Server::start(pool.clone()).await;

    // The table only: the type filter's choices name every type.
    let table = |page: &str| match (page.find("<table"), page.find("</table>")) {
        (Some(a), Some(b)) => page[a..b].to_string(),
        _ => String::new(),
    };
    let (status, _, page) = server.get("/events?type=reservation_penalised").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let page = table(&page);
    assert!(page.contains(&fleet.penalised.to_string()), "{page}");
    assert!(!page.contains("reconcile_started"), "{page}");

    let (_, _, page) = server.get("/events?stream=reservation/").await;
    let page = table(&page);
    assert!(
        page.contains("creation_requested") && page.contains("device_created"),
        "{page}"
    );
    assert!(!page.contains("reconcile_started"), "{page}");
    let (_, _, page) = server
        .get(&format!("/events?stream=reservation/{}", fleet.penalised))
        .await;
    let page = table(&page);
    assert!(page.contains("reservation_penalised"), "{page}");
    assert!(!page.contains("creation_requested"), "{page}");
    // A prefix's wildcards are taken literally.
    let (_, _, page) = server.get("/events?stream=%25/").await;
    assert!(page.contains("No events match."), "{page}");

    let (status, _, page) = server.get("/events?type=machine_teleported").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(page.contains("not an event type"), "{page}");

    // 120 pauses and resumes: the first page holds 100, newest first, and
    // links the rest.
    let mut many: Vec<shepherd::events::Event> = Vec::new();
    for n in 0..60 {
        many.push(
            CreationsPaused {
                by: "ops".into(),
                reason: format!("p{n:03}"),
            }
            .into(),
        );
        many.push(
            CreationsResumed {
                by: "ops".into(),
                reason: format!("r{n:03}"),
            }
            .into(),
        );
    }
    append(&pool, many).await;
    let (_, _, page) = server.get("/events?stream=operator/controls").await;
    assert!(page.contains("r059") && page.contains("p010"), "{page}");
    assert!(!page.contains("p009"), "the first page holds 100");
    let older = page
        .split("href=\"")
        .filter_map(|s| s.split('"').next())
        .find(|href| href.starts_with("/events?before="))
        .expect("a link to older events")
        .replace("&amp;", "&");
    let (_, _, page) = server.get(&older).await;
    assert!(page.contains("p009") && page.contains("p000"), "{page}");
    assert!(!page.contains("r059"), "{page}");
    assert!(!page.contains("older →"), "{page}");
    server.stop().await;
}

/// A provider with pools: the last listing's pools, their stock and a hold
/// for want of stock are on the status page and in `/metrics`, which
/// promtool still accepts.
#[sqlx::test(migrations = false)]
async fn pools_and_their_stock_show_on_the_page_and_in_metrics(pool: PgPool) {
    use shepherd::provider::{PoolReport, PoolStock};
    shepherd::db::migrate(&pool).await.unwrap();
    let report = |name: &str, site: &str, count, taken, failed, stock| PoolReport {
        name: name.into(),
        plan: "c2-small-x86".into(),
        site: site.into(),
        scope: format!("c2-small-x86@{site}"),
        count,
        taken,
        failed,
        stock,
    };
    let counted = |in_stock, count| {
        Some(PoolStock {
            offered: true,
            in_stock,
            count: Some(count),
        })
    };
    // A Latitude provider names the places (it makes no call to do so).
    let pools: Vec<shepherd::latitude::Pool> = ["DAL", "CHI", "ASH"]
        .iter()
        .zip(["web", "cold", "full"])
        .map(|(site, name)| {
            format!("name={name},plan=c2-small-x86,site={site},count=4,os=ubuntu_24_04_x64_lts")
                .parse()
                .unwrap()
        })
        .collect();
    let client = shepherd::latitude::LatitudeClient::new(shepherd::latitude::LatitudeConfig::new(
        "http://127.0.0.1:1",
        "proj_pages",
        shepherd::secret::ApiToken::new("unused-key"),
    ))
    .unwrap();
    let provider =
        shepherd::latitude::provider::LatitudeProvider::new(client, pools, "shepherd-".into())
            .unwrap();
    let run = Uuid::new_v4();
    let held = provider.unit("web", 3);
    append(
        &pool,
        vec![
            PoolsSurveyed {
                run,
                pools: vec![
                    report("web", "DAL", 4, 3, 1, counted(true, 7)),
                    report("cold", "CHI", 2, 0, 0, counted(false, 0)),
                    // A pass at the limit does not read the stock.
                    report("full", "ASH", 2, 2, 0, None),
                ],
            }
            .into(),
            ReservationPenalised {
                reservation: held,
                until: chrono::Utc::now() + chrono::TimeDelta::minutes(10),
                cause: "create-server: no stock of the plan in the site".into(),
                class: None,
                scope: Some("c2-small-x86@DAL".into()),
            }
            .into(),
        ],
    )
    .await;
    let server = Server::start_full(pool, None, Some(std::sync::Arc::new(provider))).await;

    let (_, _, page) = server.get("/").await;
    // The penalised place is named as an operator knows it, here and on
    // its history page.
    assert!(
        page.contains(&format!("href=\"/reservation/{held}\""))
            && page.contains("<span class=\"label\">web/3</span>"),
        "{page}"
    );
    let (_, _, history) = server.get(&format!("/reservation/{held}")).await;
    assert!(history.contains("(web/3)"), "{history}");
    let table = page
        .split("<table class=\"pools\">")
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .unwrap_or_else(|| panic!("no pools table:\n{page}"));
    assert!(
        table.contains("<td>web</td><td>c2-small-x86</td><td>DAL</td><td class=\"n\">3</td><td class=\"n\">4</td><td class=\"n\"><strong>1</strong></td><td class=\"ok\">7 in stock</td><td>out of stock until"),
        "{table}"
    );
    assert!(
        table.contains("<td>cold</td><td>c2-small-x86</td><td>CHI</td><td class=\"n\">0</td><td class=\"n\">2</td><td class=\"n\">0</td><td><strong>none in stock</strong></td><td class=\"muted\">no</td>"),
        "{table}"
    );
    assert!(
        table.contains("<td>full</td><td>c2-small-x86</td><td>ASH</td><td class=\"n\">2</td><td class=\"n\">2</td><td class=\"n\">0</td><td class=\"muted\">not read"),
        "{table}"
    );
    assert!(
        page.contains("holds back every place drawing on c2-small-x86@DAL"),
        "{page}"
    );

    let (_, _, classic) = server.get("/metrics").await;
    let m = samples(&classic);
    for (series, value) in [
        (
            "shepherd_pool_places{pool=\"web\",plan=\"c2-small-x86\",site=\"DAL\"}",
            4.0,
        ),
        (
            "shepherd_pool_machines{pool=\"web\",plan=\"c2-small-x86\",site=\"DAL\"}",
            3.0,
        ),
        (
            "shepherd_pool_in_stock{pool=\"web\",plan=\"c2-small-x86\",site=\"DAL\"}",
            1.0,
        ),
        (
            "shepherd_pool_stock{pool=\"web\",plan=\"c2-small-x86\",site=\"DAL\"}",
            7.0,
        ),
        (
            "shepherd_pool_held_back{pool=\"web\",plan=\"c2-small-x86\",site=\"DAL\"}",
            1.0,
        ),
        (
            "shepherd_pool_in_stock{pool=\"cold\",plan=\"c2-small-x86\",site=\"CHI\"}",
            0.0,
        ),
        (
            "shepherd_pool_held_back{pool=\"cold\",plan=\"c2-small-x86\",site=\"CHI\"}",
            0.0,
        ),
    ] {
        assert_eq!(m.get(series), Some(&value), "{series} in:\n{classic}");
    }
    server.stop().await;
    promtool_check_metrics(&classic);
}
