//! What the fleet costs, as an operator meets it: the spend cap set and
//! named, plans' cost changes, and the ledger against hours counted by hand.

use super::*;

/// The spend cap as an operator meets it: set like any setting (a bad
/// value refused with the grammar), named with the fleet's cost on
/// `status` and `pools list`, and `held: spend cap` where it holds every
/// creation a pool lacks; `none` lifts it.
#[sqlx::test(migrations = false)]
async fn the_spend_cap_is_set_and_named_where_it_holds(pool: sqlx::PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    shepherd::cluster::establish(
        &pool,
        &shepherd::cluster::ClusterSettings::proposed_by(&Default::default()),
        &[],
        "test",
    )
    .await
    .unwrap();
    let url = common::database_url(&pool).await;
    let (ok, _, err) = cli(
        &url,
        &[
            "pools",
            "set",
            "web",
            &format!("plan=c2-small-x86,site=DAL,count=3,os={OS}"),
            "--reason",
            "launch",
        ],
    )
    .await;
    assert!(ok, "{err}");
    // A pass priced the pool: 0.33 USD a server, none standing yet.
    let mut tx = pool.begin().await.unwrap();
    shepherd::events::record(
        &mut tx,
        vec![shepherd::events::NewEvent::new(PoolsSurveyed {
            run: Uuid::new_v4(),
            pools: vec![shepherd::provider::PoolReport {
                name: "web".into(),
                plan: "c2-small-x86".into(),
                site: "DAL".into(),
                scope: "c2-small-x86@DAL".into(),
                count: 3,
                taken: 0,
                failed: 0,
                machines: 0,
                removed: false,
                dormant: 0,
                stock: None,
                price: Some(shepherd::provider::Price {
                    currency: "USD".into(),
                    hour: 0.33,
                    month: None,
                    year: None,
                }),
            }],
            listing: None,
        })],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let (ok, _, err) = cli(
        &url,
        &["settings", "set", "spend_cap", "twelve", "--reason", "x"],
    )
    .await;
    assert!(
        !ok && err.contains("spend_cap is an amount per hour above 0"),
        "{err}"
    );
    let (ok, _, err) = cli(
        &url,
        &[
            "settings",
            "set",
            "spend_cap",
            "0.20",
            "--reason",
            "a tight month",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let (_, listed, _) = cli(&url, &["pools", "list"]).await;
    let row: Vec<&str> = listed
        .lines()
        .find(|l| l.starts_with("web "))
        .unwrap_or_else(|| panic!("{listed}"))
        .split_whitespace()
        .collect();
    // No machine stands yet: it costs nothing, in the currency it is
    // priced in.
    assert_eq!(row[8..10], ["0.00", "USD"], "{listed}");
    for args in [&["status"][..], &["pools", "list"][..]] {
        let (ok, out, err) = cli(&url, args).await;
        assert!(ok, "{args:?}: {err}");
        assert!(
            out.contains("spend cap    0.20 USD/h; the fleet costs 0.00 USD/h"),
            "{args:?}: {out}"
        );
        assert!(
            out.contains("HELD         held: spend cap: the fleet costs 0.00 USD/h, and one more server of pool web at 0.33 USD/h would take it past the cap of 0.20 USD/h"),
            "{args:?}: {out}"
        );
    }
    let (ok, _, err) = cli(
        &url,
        &["settings", "set", "spend_cap", "none", "--reason", "paid"],
    )
    .await;
    assert!(ok, "{err}");
    let (_, out, _) = cli(&url, &["status"]).await;
    assert!(!out.contains("spend cap"), "{out}");

    // A change says what it adds to the bill, as the last pass priced it.
    let (ok, out, err) = cli(
        &url,
        &["pools", "set", "web", "count=5", "--reason", "grow"],
    )
    .await;
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "cost: +5 × c2-small-x86 @ DAL at 0.33 USD/h: +1.65 USD/h, +1204.50 USD/month"
        ),
        "{out}"
    );
    let dir = std::env::temp_dir().join(format!("shepherd-cost-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pools.txt");
    std::fs::write(
        &file,
        format!("name=web,plan=c2-small-x86,site=DAL,count=2,os={OS}\n"),
    )
    .unwrap();
    let (ok, out, err) = cli(
        &url,
        &["pools", "apply", file.to_str().unwrap(), "--dry-run"],
    )
    .await;
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "would create 2: +2 × c2-small-x86 @ DAL at 0.33 USD/h: +0.66 USD/h, +481.80 USD/month"
        ),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `shepherd cost` against a ledger counted by hand: a pool filled with
/// three machines, shrunk by one, one replaced the next day, its price
/// changed at noon of the second day, every event at a known time and on
/// the stream it is recorded on (a creation on its unit's; a survey of a
/// pass that read no stock carries no price and changes none).
#[sqlx::test(migrations = false)]
async fn the_ledger_matches_the_hours_counted_by_hand(pool: sqlx::PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    sqlx::query(
        "select shepherd.set_pool('web', 'c2-small-x86', 'DAL', 3, $1, '{}', 'launch', 'cli:test')",
    )
    .bind(OS)
    .execute(&pool)
    .await
    .unwrap();
    let survey = |hour: f64| {
        serde_json::json!({"run": Uuid::new_v4(), "pools": [{
            "name": "web", "plan": "c2-small-x86", "site": "DAL", "scope": "c2-small-x86@DAL",
            "count": 3, "taken": 3, "failed": 0, "machines": 3, "dormant": 0,
            "price": {"currency": "USD", "hour": hour}}]})
    };
    let created = |device: &str, hostname: &str| {
        serde_json::json!({"reservation": Uuid::new_v4(), "device": device, "hostname": hostname,
                           "witness": "shepherd-witness:x", "recovered": false})
    };
    let deleted = |device: &str| {
        serde_json::json!({"machine_id": Uuid::new_v4(), "provider": "latitude",
                           "provider_id": device, "reservation": null,
                           "request": Uuid::new_v4(), "already_gone": false})
    };
    let events = [
        (
            "reconcile/a",
            "pools_surveyed",
            survey(0.5),
            "2026-11-01 00:00",
        ),
        (
            "reservation/00000000-0000-0000-0000-000000000001",
            "device_created",
            created("sv_1", "shepherd-web-0-aaaa"),
            "2026-11-01 01:00",
        ),
        (
            "reservation/00000000-0000-0000-0000-000000000002",
            "device_created",
            created("sv_2", "shepherd-web-1-bbbb"),
            "2026-11-01 01:00",
        ),
        (
            "reservation/00000000-0000-0000-0000-000000000003",
            "device_created",
            created("sv_3", "shepherd-web-2-cccc"),
            "2026-11-01 02:00",
        ),
        (
            "device/sv_3",
            "machine_deleted",
            deleted("sv_3"),
            "2026-11-01 06:00",
        ),
        // The same price again is no change.
        (
            "reconcile/b",
            "pools_surveyed",
            survey(0.5),
            "2026-11-01 12:00",
        ),
        // A pass at the limit reads no stock and records no price.
        (
            "reconcile/d",
            "pools_surveyed",
            serde_json::json!({"run": Uuid::new_v4(), "pools": [{
                "name": "web", "plan": "c2-small-x86", "site": "DAL", "scope": "c2-small-x86@DAL",
                "count": 3, "taken": 3, "failed": 0, "machines": 3, "dormant": 0}]}),
            "2026-11-02 01:00",
        ),
        (
            "device/sv_2",
            "machine_deleted",
            deleted("sv_2"),
            "2026-11-02 03:00",
        ),
        (
            "reservation/00000000-0000-0000-0000-000000000002",
            "device_created",
            created("sv_4", "shepherd-web-1-dddd"),
            "2026-11-02 03:30",
        ),
        (
            "reconcile/c",
            "pools_surveyed",
            survey(0.6),
            "2026-11-02 12:00",
        ),
    ];
    for (stream, kind, body, at) in events {
        sqlx::query(
            "insert into shepherd.events (event_id, stream, event_type, schema_version, body, recorded_at)
             values (gen_random_uuid(), $1, $2, 1, $3, ($4 || ':00+00')::timestamptz)",
        )
        .bind(stream)
        .bind(kind)
        .bind(body)
        .bind(at)
        .execute(&pool)
        .await
        .unwrap();
    }
    // The view: each machine's span, in its pool.
    let spans: Vec<(String, Option<String>, f64)> = sqlx::query_as(
        "select provider_id, pool, hours::float8 from shepherd.machine_hours
         where ended_at is not null order by provider_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        spans,
        [
            ("sv_2".to_string(), Some("web".to_string()), 26.0),
            ("sv_3".to_string(), Some("web".to_string()), 4.0)
        ]
    );
    // By hand, to 2026-11-03 00:00:
    //   day 1: sv_1 23 h, sv_2 23 h, sv_3 4 h = 50 h at 0.50 = 25.00
    //   day 2: before noon at 0.50: sv_1 12 h, sv_2 3 h, sv_4 8.5 h = 23.5 h = 11.75
    //          after noon at 0.60:  sv_1 12 h, sv_4 12 h = 24 h = 14.40
    //          47.5 h, 26.15
    let url = common::database_url(&pool).await;
    let (ok, out, err) = cli(
        &url,
        &["cost", "--since", "2d", "--until", "2026-11-03T00:00:00Z"],
    )
    .await;
    assert!(ok, "{err}");
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(
        lines.contains(&vec!["2026-11-01", "web", "50.00", "25.00", "USD", "0.00"]),
        "{out}"
    );
    assert!(
        lines.contains(&vec!["2026-11-02", "web", "47.50", "26.15", "USD", "0.00"]),
        "{out}"
    );
    assert!(
        out.contains("total: 97.50 machine-hours, 51.15 USD"),
        "{out}"
    );
    // One pool only, and as JSON.
    let (ok, out, err) = cli(
        &url,
        &[
            "cost",
            "--since",
            "1d",
            "--until",
            "2026-11-03T00:00:00Z",
            "--pool",
            "web",
            "--json",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    let days = json["days"].as_array().unwrap();
    assert_eq!(days.len(), 1, "{json}");
    assert!(
        (days[0]["cost"].as_f64().unwrap() - 26.15).abs() < 1e-9,
        "{json}"
    );
    let (ok, _, err) = cli(&url, &["cost", "--since", "soon"]).await;
    assert!(!ok && err.contains("soon"), "{err}");
}
