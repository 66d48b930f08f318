//! The cluster's pools and the commands around them: `shepherd pools`
//! (set, list, apply, remove, with who and why), `shepherd plan` through
//! the seam against the fake Latitude API, a worker for another provider,
//! and the rescue window a Latitude worker needs.

use std::process::Command;

mod common;
#[path = "pools/cost.rs"]
mod cost;

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
