//! The demo, shortened, end to end: it settles, and its summary is what the
//! views say.

use std::time::Duration;

use shepherd_workers::commands::demo::{DemoArgs, run};
use shepherd_workers::services::runtime::Stop;
use shepherd_workers::settings::ProviderKind;
use sqlx::PgPool;

/// The server part of DATABASE_URL, and a demo database's URL on it.
fn demo_database(name: &str) -> (String, String) {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for tests");
    let (server, _) = base.rsplit_once('/').unwrap();
    let name = format!("{name}_{}", std::process::id());
    (server.to_string(), format!("{server}/{name}"))
}

/// Checks the views against the log, then drops the demo's database.
async fn rebuild_and_drop(url: &str, server: &str) {
    let pool = PgPool::connect(url).await.unwrap();
    let report = shepherd::events::views::rebuild(&pool, false)
        .await
        .unwrap();
    assert!(report.differences.is_empty(), "{:?}", report.differences);
    pool.close().await;
    let name = url.rsplit_once('/').unwrap().1;
    let admin = PgPool::connect(&format!("{server}/postgres"))
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "drop database if exists {name} with (force)"
    )))
    .execute(&admin)
    .await
    .unwrap();
}

#[tokio::test]
async fn the_demo_settles_and_its_summary_matches_the_views() {
    let (server, url) = demo_database("shepherd_demo_test");
    let args = DemoArgs {
        database_url: url.clone(),
        reservations: 20,
        max_machines: 12,
        workers: 2,
        timeout: Duration::from_secs(60),
        progress: false,
        provider: ProviderKind::Metal,
    };
    let (_keep, stop) = Stop::new();
    let summary = run(args, stop).await.expect("the demo runs");
    assert!(!summary.interrupted);
    assert_eq!(summary.machines, 12, "{summary:?}");
    assert_eq!(summary.in_flight, 0);
    assert!(summary.api_calls > 12);

    let pool = PgPool::connect(&url).await.unwrap();
    let managed: i64 = sqlx::query_scalar("select count(*) from shepherd.managed_machines")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(managed, summary.machines);
    let penalised: Vec<(uuid::Uuid, String)> = sqlx::query_as(
        "select reservation_id, cause from shepherd.sinbin where now() <= until order by reservation_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(penalised, summary.penalised);
    pool.close().await;
    rebuild_and_drop(&url, &server).await;
}

/// The Latitude demo: its pools fill where the plans are in stock (28
/// places), the pool in a site without stock waits, every server of ours is
/// managed once, and the views equal the log.
#[tokio::test]
async fn the_latitude_demo_fills_its_pools_and_its_summary_matches_the_views() {
    let (server, url) = demo_database("shepherd_demo_latitude_test");
    let args = DemoArgs {
        database_url: url.clone(),
        reservations: 0,
        max_machines: 30,
        workers: 2,
        timeout: Duration::from_secs(60),
        progress: false,
        provider: ProviderKind::Latitude,
    };
    let (_keep, stop) = Stop::new();
    let summary = run(args, stop).await.expect("the demo runs");
    assert!(!summary.interrupted);
    assert_eq!(summary.machines, 28, "{summary:?}");
    assert_eq!(summary.in_flight, 0);

    let pool = PgPool::connect(&url).await.unwrap();
    let (managed, distinct_hostnames, cold): (i64, i64, i64) = sqlx::query_as(
        "select count(*), count(distinct hostname),
                count(*) filter (where hostname like 'shepherd-cold-%')
         from shepherd.managed_machines where provider = 'latitude'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((managed, distinct_hostnames, cold), (28, 28, 0));
    // The status shows the four pools as the passes listed them (the
    // cluster's, by name), the cold one without stock.
    let overview = shepherd::fleet::overview(&pool).await.unwrap();
    let pools: Vec<(String, u32, Option<bool>)> = overview
        .pools
        .expect("a pass recorded the pools")
        .pools
        .into_iter()
        .map(|p| {
            (
                p.report.name,
                p.report.count,
                p.report.stock.map(|s| s.in_stock),
            )
        })
        .collect();
    assert_eq!(
        pools,
        [
            ("batch", 10, true),
            ("cold", 2, false),
            ("db", 6, true),
            ("web", 12, true),
        ]
        .map(|(n, c, s)| (n.to_string(), c, Some(s)))
    );
    pool.close().await;
    rebuild_and_drop(&url, &server).await;
}
