//! The cluster's pools and the commands around them: `shepherd pools`
//! (set, list, apply, remove, with who and why), `shepherd plan` through
//! the seam against the fake Latitude API, a worker for another provider,
//! and the rescue window a Latitude worker needs.

use std::process::Command;

mod common;

use shepherd::events::event::{PoolsSurveyed, ReservationPenalised};
use shepherd_fakes::latitude::{FakeConfig, FakeLatitude};
use uuid::Uuid;

const KEY: &str = "pools-test-key-3f9a";
const OS: &str = "ubuntu_24_04_x64_lts";

/// `shepherd` against a test database only.
async fn cli(url: &str, args: &[&str]) -> (bool, String, String) {
    let (url, args): (String, Vec<String>) = (
        url.to_string(),
        args.iter().map(|a| a.to_string()).collect(),
    );
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args(&args)
            .env("DATABASE_URL", &url)
            .env("SHEPHERD_LOG", "warn")
            .env("USER", "alice")
            .env_remove("SHEPHERD_LATITUDE_POOLS")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// Pools are the cluster's desired state: declared, changed and removed
/// with who and why, by the CLI, a file applied all or nothing, or SQL;
/// names hostnames could confuse, a count of 0 or a removal unconfirmed,
/// and a new plan for a pool with machines are refused, saying why.
#[sqlx::test(migrations = false)]
async fn pools_are_set_listed_applied_and_removed_with_who_and_why(pool: sqlx::PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let url = common::database_url(&pool).await;
    let (ok, out, err) = cli(
        &url,
        &[
            "pools",
            "set",
            "web",
            &format!("plan=c2-small-x86,site=dal,count=3,os={OS}"),
            "--reason",
            "launch",
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert!(
        out.contains("pool web declared: 3 of c2-small-x86 in DAL"),
        "{out}"
    );
    let (ok, out, err) = cli(
        &url,
        &["pools", "set", "web", "count=5", "--reason", "grow"],
    )
    .await;
    assert!(ok && out.contains("pool web changed"), "{out}{err}");
    let (ok, out, _) = cli(
        &url,
        &["pools", "set", "web", "count=5", "--reason", "again"],
    )
    .await;
    assert!(ok && out.contains("nothing recorded"), "{out}");
    for (args, says) in [
        (
            vec!["pools", "set", "web", "count=0", "--reason", "off"],
            "confirm-delete",
        ),
        (
            vec![
                "pools",
                "set",
                "web-2",
                &format!("plan=p,site=DAL,count=1,os={OS}"),
                "--reason",
                "r",
            ],
            "mistaken",
        ),
        (
            vec![
                "pools",
                "set",
                "Web",
                &format!("plan=p,site=DAL,count=1,os={OS}"),
                "--reason",
                "r",
            ],
            "lowercase",
        ),
        (
            vec!["pools", "set", "db", "count=2", "--reason", "r"],
            "plan= is missing",
        ),
        (
            vec!["pools", "set", "web", "count=2", "--reason", " "],
            "reason is required",
        ),
        (
            vec!["pools", "remove", "web", "--reason", "r"],
            "confirm-delete",
        ),
        (
            vec![
                "pools",
                "remove",
                "nope",
                "--reason",
                "r",
                "--confirm-delete",
            ],
            "no pool nope",
        ),
    ] {
        let (ok, _, err) = cli(&url, &args).await;
        assert!(!ok, "{args:?} was accepted");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // A machine of the pool stands: its plan stays as it is.
    let mut tx = pool.begin().await.unwrap();
    shepherd::events::record(
        &mut tx,
        vec![shepherd::events::NewEvent::new(
            shepherd::events::event::MachineAssimilated {
                machine_id: Uuid::new_v4(),
                provider: "latitude".into(),
                provider_id: "sv_web0".into(),
                reservation: None,
                hostname: Some("shepherd-web-0-0123abcd".into()),
            },
        )],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let (ok, _, err) = cli(
        &url,
        &[
            "pools",
            "set",
            "web",
            "plan=c3-medium-x86",
            "--reason",
            "bigger",
        ],
    )
    .await;
    assert!(!ok);
    assert!(
        err.contains("has 1 machines") && err.contains("declare a new pool"),
        "{err}"
    );
    let (ok, out, err) = cli(&url, &["pools", "list", "--json"]).await;
    assert!(ok, "{err}");
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed[0]["pool"]["count"], 5, "{listed}");
    assert_eq!(listed[0]["pool"]["site"], "DAL", "{listed}");
    assert_eq!(listed[0]["standing"]["machines"], 1, "{listed}");

    // A file: web to 2, db declared. The dry run says what would happen
    // and writes nothing.
    let dir = std::env::temp_dir().join(format!("shepherd-pools-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pools.conf");
    std::fs::write(
        &file,
        format!(
            "# the fleet\nname=web,plan=c2-small-x86,site=DAL,count=2,os={OS}\n\n\
             name=db,plan=c2-small-x86,site=ASH,count=4,os={OS}  # the database tier\n"
        ),
    )
    .unwrap();
    let file = file.to_str().unwrap().to_string();
    let events = || async {
        sqlx::query_scalar::<_, i64>("select count(*) from shepherd.events")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let before = events().await;
    let (ok, out, err) = cli(&url, &["pools", "apply", &file, "--dry-run"]).await;
    assert!(ok, "{err}");
    assert!(
        out.contains("change web: count 5 -> 2; would create 1"),
        "{out}"
    );
    assert!(
        out.contains("declare db: 4 of c2-small-x86 in ASH"),
        "{out}"
    );
    assert!(out.contains("would create 4"), "{out}");
    assert_eq!(events().await, before, "a dry run wrote");
    let (ok, out, err) = cli(
        &url,
        &["pools", "apply", &file, "--reason", "the fleet file"],
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("applied: 2 changes"), "{out}");
    // A file without web removes it, and that needs confirming: refused
    // whole, so db is not changed either.
    std::fs::write(
        dir.join("pools.conf"),
        format!("name=db,plan=c2-small-x86,site=ASH,count=6,os={OS}\n"),
    )
    .unwrap();
    let (ok, _, err) = cli(&url, &["pools", "apply", &file, "--reason", "shrink"]).await;
    assert!(!ok && err.contains("confirm"), "{err}");
    let counts: Vec<(String, i32, bool)> =
        sqlx::query_as("select name, count, removed from shepherd.pools order by name")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        counts,
        vec![("db".into(), 4, false), ("web".into(), 2, false)]
    );
    let (ok, _, err) = cli(
        &url,
        &[
            "pools",
            "apply",
            &file,
            "--reason",
            "web goes",
            "--confirm-delete",
        ],
    )
    .await;
    assert!(ok, "{err}");
    // SQL is the same door, with the same rules.
    let refused = sqlx::query("select shepherd.remove_pool('db', 'from psql')")
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("confirm"), "{refused}");
    let removed: bool =
        sqlx::query_scalar("select shepherd.remove_pool('db', 'from psql', null, true)")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(removed);
    // Every change is in the log with who and why.
    let history: Vec<(String, String, String)> = sqlx::query_as(
        "select event_type, body->>'by', body->>'reason' from shepherd.events
         where stream like 'pool/%' order by position",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let types: Vec<&str> = history.iter().map(|h| h.0.as_str()).collect();
    assert_eq!(
        types,
        [
            "pool_declared",
            "pool_changed",
            "pool_changed",
            "pool_declared",
            "pool_changed",
            "pool_removed",
            "pool_removed"
        ]
    );
    assert_eq!(history[0].1, "cli:alice");
    assert_eq!(history[0].2, "launch");
    assert!(history[6].1.starts_with("sql:"));
    common::assert_rebuild_equals_live(&pool).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `shepherd plan --provider latitude`: the same dry run as for Metal,
/// through the seam, reading the pools' places and the stock and changing
/// nothing.
#[sqlx::test(migrations = false)]
async fn plan_reads_the_pools_through_the_seam(pool: sqlx::PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let url = common::database_url(&pool).await;
    let fake = FakeLatitude::start(
        FakeConfig {
            token: KEY.into(),
            ..FakeConfig::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    // The pools are the cluster's.
    let pools: Vec<shepherd::provider::Pool> = [
        format!("name=web,plan=c2-small-x86,site=DAL,count=3,os={OS}"),
        format!("name=cold,plan=c2-small-x86,site=CHI,count=2,os={OS}"),
    ]
    .iter()
    .map(|p| p.parse().unwrap())
    .collect();
    shepherd::pools::establish(&pool, &pools, "test")
        .await
        .unwrap();
    let plan_command = |json: bool| {
        let (base_url, project) = (fake.base_url(), fake.project().to_string());
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
                .args(["plan", "--provider", "latitude"])
                .args(json.then_some("--json"))
                .env("DATABASE_URL", &url)
                .env("LATITUDE_API_URL", base_url)
                .env("LATITUDE_PROJECT", project)
                .env("LATITUDE_API_KEY", KEY)
                .env("SHEPHERD_LOG", "warn")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        })
    };
    let plan: serde_json::Value = serde_json::from_str(&plan_command(true).await.unwrap()).unwrap();
    // The report names places as an operator does, not by a hostname the
    // dry run cannot know (it carries the creation's request).
    let report = plan_command(false).await.unwrap();
    for place in ["web/0", "web/1", "web/2"] {
        assert!(report.contains(&format!("-> place {place}")), "{report}");
    }
    // And what they would add to the bill, at the fake's price.
    assert!(
        report.contains("cost of pool web: +3 × c2-small-x86 @ DAL at 0.33 USD/h: +0.99 USD/h, +722.70 USD/month"),
        "{report}"
    );
    assert!(
        report.contains("(cold/0)") && report.contains("out of stock in its site"),
        "{report}"
    );
    assert!(report.contains("listed 5 places"), "{report}");
    assert_eq!(plan["labels"].as_object().unwrap().len(), 5, "{plan}");
    assert_eq!(plan["reservations_listed"], 5, "{plan}");
    assert_eq!(plan["would_create"].as_array().unwrap().len(), 3, "{plan}");
    let skipped = plan["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 2, "{plan}");
    assert!(
        skipped.iter().all(|s| s[1] == "not_provisionable"),
        "{plan}"
    );
    assert!(fake.servers().is_empty(), "a dry run created");
    // The pools as the provider has them: DAL holds the plan, CHI has none.
    let pools: Vec<shepherd::provider::PoolReport> =
        serde_json::from_value(plan["pools"].clone()).unwrap();
    let seen: Vec<_> = pools
        .iter()
        .map(|p| {
            (
                p.name.as_str(),
                p.site.as_str(),
                p.count,
                p.taken,
                p.stock.map(|s| s.in_stock),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("cold", "CHI", 2, 0, Some(false)),
            ("web", "DAL", 3, 0, Some(true))
        ]
    );

    // Once a worker has recorded the cluster's provider and project, the
    // dry run needs neither: the cluster's are used; a project that differs
    // is refused as a worker's is, not read as the cluster's.
    shepherd::cluster::establish_identity(
        &pool,
        &shepherd::cluster::Identity {
            provider: "latitude".into(),
            project: fake.project().to_string(),
            device_prefix: "shepherd-".into(),
        },
        "test",
    )
    .await
    .unwrap();
    let plan_in_cluster = |project: Option<&str>| {
        let base_url = fake.base_url();
        let (url, project) = (url.clone(), project.map(str::to_string));
        tokio::task::spawn_blocking(move || {
            let mut command = Command::new(env!("CARGO_BIN_EXE_shepherd"));
            command
                .args(["plan", "--json"])
                .env_remove("LATITUDE_PROJECT")
                .env_remove("SHEPHERD_PROVIDER")
                .env("DATABASE_URL", &url)
                .env("LATITUDE_API_URL", base_url)
                .env("LATITUDE_API_KEY", KEY)
                .env("SHEPHERD_LOG", "warn");
            if let Some(p) = project {
                command.env("LATITUDE_PROJECT", p);
            }
            command.output().unwrap()
        })
    };
    let out = plan_in_cluster(None).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        again["would_create"].as_array().unwrap().len(),
        3,
        "{again}"
    );
    let out = plan_in_cluster(Some("proj_other")).await.unwrap();
    assert!(!out.status.success(), "a plan for another project ran");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("proj_other")
            && said.contains(fake.project())
            && said.contains("leave it out"),
        "{said}"
    );
    assert!(out.stdout.is_empty(), "a refused plan printed a report");

    // `shepherd status` shows the pools as the last pass recorded them, and
    // which one a penalty for want of stock holds back.
    let mut tx = pool.begin().await.unwrap();
    shepherd::events::record(
        &mut tx,
        vec![
            shepherd::events::NewEvent::new(PoolsSurveyed {
                run: Uuid::new_v4(),
                pools,
                listing: None,
            }),
            shepherd::events::NewEvent::new(ReservationPenalised {
                reservation: Uuid::new_v4(),
                until: chrono::Utc::now() + chrono::TimeDelta::minutes(5),
                cause: "out of stock".into(),
                class: None,
                scope: Some("c2-small-x86@DAL".into()),
            }),
        ],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let url = common::database_url(&pool).await;
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args(["status"])
            .env("DATABASE_URL", &url)
            .env("SHEPHERD_LOG", "warn")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = |pool: &str| {
        status
            .lines()
            .find(|l| l.starts_with(pool))
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_else(|| panic!("no row for {pool}:\n{status}"))
    };
    let dal = fake.stock("c2-small-x86", "DAL").unwrap().to_string();
    assert_eq!(
        row("web ")[..8],
        [
            "web",
            "c2-small-x86",
            "DAL",
            "0",
            "3",
            "0",
            dal.as_str(),
            "out"
        ],
        "{status}"
    );
    assert_eq!(
        row("cold ")[..8],
        ["cold", "c2-small-x86", "CHI", "0", "2", "0", "none", "no"],
        "{status}"
    );
    assert!(status.contains("(holds back c2-small-x86@DAL)"), "{status}");
    // `shepherd sinbin` names the scope too, in its table and its JSON.
    let url = common::database_url(&pool).await;
    let sinbin = tokio::task::spawn_blocking(move || {
        [false, true].map(|json| {
            let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
                .arg("sinbin")
                .args(json.then_some("--json"))
                .env("DATABASE_URL", &url)
                .env("SHEPHERD_LOG", "warn")
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        })
    })
    .await
    .unwrap();
    assert!(
        sinbin[0].contains("out of stock (holds back c2-small-x86@DAL)"),
        "{}",
        sinbin[0]
    );
    let rows: serde_json::Value = serde_json::from_str(&sinbin[1]).unwrap();
    assert_eq!(rows[0]["scope"], "c2-small-x86@DAL", "{rows}");
}

/// A cluster provisions one provider: the first worker records it, and a
/// worker started for another refuses to start, saying which.
#[sqlx::test(migrations = false)]
async fn a_worker_for_another_provider_is_refused(pool: sqlx::PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let metal = shepherd::cluster::Identity {
        provider: "metal".into(),
        project: "2b0f6b1c-0d3a-4e8a-9a4b-1d2c3e4f5a6b".into(),
        device_prefix: "shepherd-".into(),
    };
    shepherd::cluster::establish_identity(&pool, &metal, "test")
        .await
        .unwrap();
    // Recorded once: a second Metal worker starts as before.
    shepherd::cluster::establish_identity(&pool, &metal, "test")
        .await
        .unwrap();
    let url = common::database_url(&pool).await;
    let dir = std::env::temp_dir().join(format!("shepherd-provider-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("key.pub"),
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGNsdXN0ZXItdGVzdC1rZXk t\n",
    )
    .unwrap();
    let pool_flag = format!("name=web,plan=c2-small-x86,site=DAL,count=1,os={OS}");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args(["worker", "--provider", "latitude", "--pool", &pool_flag])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .env("DATABASE_URL", &url)
            .env("LATITUDE_PROJECT", "proj_x")
            .env("LATITUDE_API_KEY", KEY)
            .env("SHEPHERD_SSH_PUBLIC_KEY_FILE", dir.join("key.pub"))
            .env("SHEPHERD_LOG", "warn")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("this cluster provisions metal") && stderr.contains("--provider latitude"),
        "{stderr}"
    );
    let providers: Vec<String> = sqlx::query_scalar(
        "select value #>> '{}' from shepherd.cluster_settings where key = 'provider'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(providers, vec!["metal"]);
}

/// A Latitude worker whose API attempt could outlast its rescue window is
/// refused before it touches anything: a create still on the wire when a
/// database restart dropped its place's lock could otherwise meet a second
/// run of its creation. Shortening the attempt lets it past the check.
#[test]
fn a_latitude_worker_whose_create_could_outlast_its_rescue_window_is_refused() {
    let pool_flag = format!("name=web,plan=c2-small-x86,site=DAL,count=1,os={OS}");
    let dir = std::env::temp_dir().join(format!("shepherd-window-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("key.pub");
    std::fs::write(
        &key,
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGNsdXN0ZXItdGVzdC1rZXk t\n",
    )
    .unwrap();
    let run = |timeout: &str| {
        Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args(["worker", "--provider", "latitude", "--pool", &pool_flag])
            .args(["--heartbeat", "1s", "--missed-heartbeats", "3"])
            .args(["--latitude-api-timeout", timeout])
            // Nothing listens here: a worker past the check fails on it.
            .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
            .env("LATITUDE_PROJECT", "proj_x")
            .env("LATITUDE_API_KEY", KEY)
            .env("SHEPHERD_SSH_PUBLIC_KEY_FILE", &key)
            .env("SHEPHERD_LOG", "warn")
            .output()
            .unwrap()
    };
    let out = run("2s");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--latitude-api-timeout): 2s plus one heartbeat (1s)")
            && stderr.contains("rescue window")
            && stderr.contains("= 3s)"),
        "{stderr}"
    );
    let out = run("1500ms");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        !stderr.contains("rescue window") && stderr.contains("127.0.0.1:1"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

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
