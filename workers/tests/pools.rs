//! `shepherd pools plan` against the fake Latitude API over HTTP: a pool
//! counts its own servers by hostname, stock and the room under the limit
//! bound what a pass would create, and mistakes in the pools are named.

use std::process::Command;

mod common;

use shepherd::events::event::{PoolsSurveyed, ReservationPenalised};
use shepherd::latitude::pools::hostname;
use shepherd::latitude::{CreateServer, LatitudeClient, LatitudeConfig};
use shepherd::secret::ApiToken;
use shepherd_fakes::latitude::{FakeConfig, FakeLatitude};
use uuid::Uuid;

const KEY: &str = "pools-test-key-3f9a";
const OS: &str = "ubuntu_24_04_x64_lts";

fn shepherd(fake: &FakeLatitude, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(args)
        .env("LATITUDE_API_URL", fake.base_url())
        .env("LATITUDE_PROJECT", fake.project())
        .env("LATITUDE_API_KEY", KEY)
        .env("SHEPHERD_LOG", "warn")
        .env_remove("SHEPHERD_LATITUDE_POOLS")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_plan_counts_its_servers_and_is_bounded_by_stock_and_room() {
    let fake = FakeLatitude::start(
        FakeConfig {
            token: KEY.into(),
            reads_per_window: 10_000,
            writes_per_window: 10_000,
            ..FakeConfig::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let client = LatitudeClient::new(LatitudeConfig::new(
        fake.base_url(),
        fake.project(),
        ApiToken::new(KEY),
    ))
    .unwrap();
    let create = |hostname: String| CreateServer {
        plan: "c2-small-x86".into(),
        site: "DAL".into(),
        operating_system: OS.into(),
        hostname,
        ssh_keys: vec![],
    };
    // Two of pool web's servers, and one of another party's.
    for name in [
        hostname("shepherd-", "web", 0, Uuid::new_v4()),
        hostname("shepherd-", "web", 1, Uuid::new_v4()),
        "their-web-1".to_string(),
    ] {
        client.create_server(&create(name)).await.unwrap();
    }

    let web = format!("name=web,plan=c2-small-x86,site=DAL,count=5,os={OS}");
    let cold = format!("name=cold,plan=c2-small-x86,site=CHI,count=2,os={OS}");
    let nowhere = format!("name=nowhere,plan=c3-medium-x86,site=DAL,count=1,os={OS}");
    let (ok, out, err) = shepherd(
        &fake,
        &[
            "pools", "plan", "--pool", &web, "--pool", &cold, "--pool", &nowhere, "--room", "2",
            "--json",
        ],
    );
    assert!(ok, "{err}");
    let plans: serde_json::Value = serde_json::from_str(&out).unwrap();
    let web_plan = &plans[0];
    assert_eq!(web_plan["have"], 2, "{out}");
    assert_eq!(web_plan["create"], 2, "{out}");
    assert_eq!(
        web_plan["short"],
        serde_json::json!([1, "at_limit"]),
        "{out}"
    );
    assert_eq!(plans[1]["create"], 0);
    assert_eq!(
        plans[1]["short"],
        serde_json::json!([2, "out_of_stock"]),
        "{out}"
    );
    assert_eq!(
        plans[2]["short"],
        serde_json::json!([1, "not_in_site"]),
        "{out}"
    );

    // The table says the same to a person, and nothing was created.
    let (ok, out, err) = shepherd(&fake, &["pools", "plan", "--pool", &web]);
    assert!(ok, "{err}");
    assert!(out.contains("POOL") && out.contains("web"), "{out}");
    assert!(out.contains("a dry run"), "{out}");
    assert_eq!(client.list_servers(None).await.unwrap().len(), 3);
    assert!(!out.contains(KEY) && !err.contains(KEY));

    // Mistakes are named, with a non-zero exit.
    let (ok, _, err) = shepherd(&fake, &["pools", "plan", "--pool", "name=web,plan=x"]);
    assert!(!ok);
    assert!(err.contains("site= is missing"), "{err}");
    let twin = format!("name=web-2,plan=c2-small-x86,site=DAL,count=1,os={OS}");
    let (ok, _, err) = shepherd(&fake, &["pools", "plan", "--pool", &web, "--pool", &twin]);
    assert!(!ok);
    assert!(err.contains("mistaken"), "{err}");
    let (ok, _, err) = shepherd(&fake, &["pools", "plan"]);
    assert!(!ok);
    assert!(err.contains("no pools"), "{err}");
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
    let web = format!("name=web,plan=c2-small-x86,site=DAL,count=3,os={OS}");
    let cold = format!("name=cold,plan=c2-small-x86,site=CHI,count=2,os={OS}");
    let plan_command = |json: bool| {
        let (base_url, project) = (fake.base_url(), fake.project().to_string());
        let (web, cold, url) = (web.clone(), cold.clone(), url.clone());
        tokio::task::spawn_blocking(move || {
            let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
                .args(["plan", "--provider", "latitude"])
                .args(json.then_some("--json"))
                .args(["--pool", &web, "--pool", &cold])
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
    assert!(
        report.contains("(cold/0)") && report.contains("not provisionable"),
        "{report}"
    );
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
            ("web", "DAL", 3, 0, Some(true)),
            ("cold", "CHI", 2, 0, Some(false))
        ]
    );

    // `shepherd status` shows the pools as the last pass recorded them, and
    // which one a penalty for want of stock holds back.
    let mut tx = pool.begin().await.unwrap();
    shepherd::events::record(
        &mut tx,
        vec![
            shepherd::events::NewEvent::new(PoolsSurveyed {
                run: Uuid::new_v4(),
                pools,
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
