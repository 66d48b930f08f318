//! `/metrics` served over a real socket against a known event log: the
//! figures read at each scrape, both text formats, promtool's checks and
//! the alert rules' unit tests, and a provider's pools.

mod web;

use reqwest::StatusCode;
use shepherd::events::event::*;
use sqlx::PgPool;
use uuid::Uuid;
use web::*;

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
        ("shepherd_provider_calls_in_flight{provider=\"metal\"}", 0.0),
        ("shepherd_provider_calls_waiting{provider=\"metal\"}", 0.0),
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
    // Its connections, per pool: the scrape itself is reading through the
    // pages' pool, and what is open is at most what may be.
    for pool in ["work", "console"] {
        let most = m[&format!("shepherd_db_connections_max{{pool=\"{pool}\"}}") as &str];
        let in_use =
            m[&format!("shepherd_db_connections{{pool=\"{pool}\",state=\"in_use\"}}") as &str];
        let idle = m[&format!("shepherd_db_connections{{pool=\"{pool}\",state=\"idle\"}}") as &str];
        assert!(most >= 1.0, "{pool}: at most {most}");
        assert!(
            in_use >= 0.0 && idle >= 0.0 && in_use + idle <= most,
            "{pool}: {in_use} + {idle} of {most}"
        );
    }
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
        machines: taken,
        removed: false,
        // As many dormant as failed: the page and the gauge show both.
        dormant: failed,
        price: Some(shepherd::provider::Price {
            currency: "USD".into(),
            hour: 0.5,
            month: None,
            year: None,
        }),
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
    let held = provider.place_unit("web", 3);
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
                listing: None,
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
    // A spend cap, and the pool it would hold: web, declared for 5 at
    // 0.50 USD a server, none of ours standing by our records.
    shepherd::cluster::establish(
        &pool,
        &shepherd::cluster::ClusterSettings::proposed_by(&Default::default()),
        &[],
        "test",
    )
    .await
    .unwrap();
    sqlx::query(
        "select shepherd.set_pool('web', 'c2-small-x86', 'DAL', 5, 'ubuntu_24_04_x64_lts', '{}', 'launch', 'cli:test')",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("select shepherd.change_setting('spend_cap', '0.40', 'tight', 'cli:test')")
        .execute(&pool)
        .await
        .unwrap();
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
    // The pools as the last pass saw them (the declared ones come first).
    let table = page
        .split("(as the last pass saw them")
        .nth(1)
        .and_then(|t| t.split("<table class=\"pools\">").nth(1))
        .and_then(|t| t.split("</table>").next())
        .unwrap_or_else(|| panic!("no pools table:\n{page}"));
    assert!(
        table.contains("<td>web</td><td>c2-small-x86</td><td>DAL</td><td class=\"n\">3 <strong class=\"dormant\">(1 off, in rescue or of unknown status: kept)</strong></td><td class=\"n\">4</td><td class=\"n\"><strong>1</strong></td><td class=\"ok\">7 in stock</td><td>out of stock until"),
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

    // Priced: each pool's machines at 0.50 USD, the failed one's part
    // wasted, and the fleet's sum said once above the table.
    assert!(
        table.contains("<td class=\"n\">1.50 USD <strong>(0.50 USD wasted)</strong><br><span class=\"muted\">0.50 USD a server</span></td>"),
        "{table}"
    );
    assert!(
        page.contains("<strong>Cost: 2.50 USD per hour</strong>, about 1825.00 USD a month at hourly rates (an estimate); <strong>0.50 USD per hour</strong> on surplus and failed machines."),
        "{page}"
    );

    // The cap on the page, holding: one more server would pass it.
    assert!(
        page.contains("<tr><th>Creations</th><td><strong>held: spend cap</strong></td></tr>"),
        "{page}"
    );
    assert!(
        page.contains("<tr><th>Spend cap</th><td>0.40 USD per hour; the fleet costs 0.00 USD"),
        "{page}"
    );
    let (_, _, classic) = server.get("/metrics").await;
    let m = samples(&classic);
    for (series, value) in [
        ("shepherd_spend_cap_per_hour{currency=\"USD\"}", 0.4),
        ("shepherd_spend_cap_held", 1.0),
        (
            "shepherd_pool_cost_per_hour{pool=\"web\",currency=\"USD\"}",
            1.5,
        ),
        (
            "shepherd_pool_wasted_cost_per_hour{pool=\"web\",currency=\"USD\"}",
            0.5,
        ),
        (
            "shepherd_pool_cost_per_hour{pool=\"cold\",currency=\"USD\"}",
            0.0,
        ),
        ("shepherd_fleet_cost_per_hour{currency=\"USD\"}", 2.5),
        ("shepherd_fleet_wasted_cost_per_hour{currency=\"USD\"}", 0.5),
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
            "shepherd_pool_dormant_machines{pool=\"web\",plan=\"c2-small-x86\",site=\"DAL\"}",
            1.0,
        ),
        (
            "shepherd_pool_dormant_machines{pool=\"cold\",plan=\"c2-small-x86\",site=\"CHI\"}",
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

/// Every family `/metrics` serves has its row in docs/operations.md's
/// metrics table, under the name it is served by.
#[sqlx::test(migrations = false)]
async fn every_served_family_is_in_the_operations_table(pool: PgPool) {
    seed(&pool).await;
    let server = Server::start(pool.clone()).await;
    let (status, _, text) = server.get("/metrics").await;
    server.stop().await;
    assert_eq!(status, StatusCode::OK);
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/operations.md"
    ))
    .unwrap();
    // Each name in backticks in a row's first cell (one row may name
    // several families).
    let documented: std::collections::BTreeSet<&str> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split(" |").next())
        .flat_map(|cell| cell.split('`').skip(1).step_by(2))
        .collect();
    let served: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(served.len() >= 20, "{text}");
    let missing: Vec<&&str> = served
        .iter()
        .filter(|name| !documented.contains(**name))
        .collect();
    assert!(
        missing.is_empty(),
        "families served but not in docs/operations.md's table: {missing:?}"
    );
}
