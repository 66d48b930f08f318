//! A pool's whole lifecycle with `shepherd` workers running against the
//! fake Latitude API, steered only by the commands an operator types: two
//! workers started with different `--pool` flags agree on the cluster's
//! pools (the second warns, nothing is penalised); the pool fills; lowered,
//! it sheds its surplus by policy and keeps its protected machines; raised,
//! it fills again; removal is refused unconfirmed; with a leave hook the
//! deletions wait for the operator's `machines ack`; confirmed, the pool
//! drains. Events tell each step, and the views equal the log.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use shepherd_fakes::latitude::{FakeConfig, FakeLatitude};
use sqlx::PgPool;

mod common;
use common::*;

const KEY: &str = "lifecycle-test-key-77c1";
const OS: &str = "ubuntu_24_04_x64_lts";

fn ours(fake: &FakeLatitude) -> Vec<String> {
    let mut ids: Vec<String> = fake
        .servers()
        .into_iter()
        .filter(|s| s.project == fake.project() && s.hostname.starts_with("shepherd-web-"))
        .map(|s| s.id)
        .collect();
    ids.sort();
    ids
}

/// Runs one command to its end; its success, stdout and stderr.
fn run(c: &Cluster, env: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let out = c
        .command(args)
        .envs(env.iter().copied())
        .env("SHEPHERD_LOG", "warn")
        .env("USER", "alice")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(c: &Cluster, env: &[(&str, &str)], args: &[&str]) -> String {
    let (ok, out, err) = run(c, env, args);
    assert!(ok, "shepherd {args:?} failed: {out}{err}");
    out
}

/// Waits until `done` holds of the fake's servers of pool web and nothing
/// is in flight or leaving.
async fn wait_until(
    c: &Cluster,
    fake: &FakeLatitude,
    what: &str,
    done: impl Fn(&[String]) -> bool,
) {
    let started = Instant::now();
    loop {
        let busy: i64 = sqlx::query_scalar(
            "select (select count(*) from shepherd.in_flight)
                  + (select count(*) from shepherd.leaving)",
        )
        .fetch_one(&c.pool)
        .await
        .expect("reading what is in flight");
        if busy == 0 && done(&ours(fake)) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "{what}: not reached; servers {:?}; logs in {}",
            ours(fake),
            c.dir.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn events(c: &Cluster, kind: &str) -> Vec<serde_json::Value> {
    sqlx::query_scalar("select body from shepherd.events where event_type = $1 order by position")
        .bind(kind)
        .fetch_all(&c.pool)
        .await
        .expect("reading events")
}

#[sqlx::test(migrations = false)]
async fn a_pool_is_kept_whole_both_ways_by_workers_steered_from_the_cli(pool: PgPool) {
    let fake = start_latitude(FakeConfig {
        token: KEY.into(),
        reads_per_window: 100_000,
        writes_per_window: 100_000,
        deploy_delay: Duration::from_millis(300),
        ..FakeConfig::default()
    });
    // A server of another project named as ours would be: never touched.
    let foreign = fake.add_foreign_server(
        "proj_other",
        "c2-small-x86",
        "DAL",
        "shepherd-web-0-0badf00d",
    );
    let mut c = Cluster::new(pool, 0, shepherd_fakes::metal::Faults::none()).await;
    migrate(&c).await;
    let base = [
        ("SHEPHERD_PROVIDER", "latitude".to_string()),
        ("LATITUDE_API_URL", fake.base_url()),
        ("LATITUDE_PROJECT", fake.project().to_string()),
        ("LATITUDE_API_KEY", KEY.to_string()),
    ];
    let env: Vec<(&str, &str)> = base.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let worker = |pools: &str| {
        vec![
            "--scheduler".to_string(),
            "--max-machines".into(),
            "10".into(),
            "--pool".into(),
            pools.to_string(),
            "--settle-window".into(),
            "2s".into(),
            "--latitude-api-timeout".into(),
            "1500ms".into(),
            "--sweep-interval".into(),
            "1s".into(),
        ]
    };
    let first = worker(&format!(
        "name=web,plan=c2-small-x86,site=DAL,count=4,os={OS}"
    ));
    let first: Vec<&str> = first.iter().map(String::as_str).collect();
    c.spawn_worker_with_env(&first, &env);
    wait_until(&c, &fake, "web whole", |s| s.len() == 4).await;
    // A second worker with other flags adopts the cluster's pools, and
    // says so; it changes nothing.
    let second = worker(&format!(
        "name=web,plan=c2-small-x86,site=DAL,count=9,os={OS}"
    ));
    let second: Vec<&str> = second.iter().map(String::as_str).collect();
    c.spawn_worker_with_env(&second, &env);
    let started = Instant::now();
    let log = loop {
        let log = log_of(&c.dir, 1);
        if log.contains("pool") && log.contains("differ")
            || started.elapsed() > Duration::from_secs(20)
        {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        log.contains("WARN") && log.contains("pool"),
        "the second worker did not warn about its pools: {log}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        ours(&fake).len(),
        4,
        "the second worker's flags were obeyed"
    );
    assert_eq!(c.count("select count(*) from shepherd.sinbin").await, 0);

    ok(
        &c,
        &env,
        &[
            "settings",
            "set",
            "deletion_budget",
            "100%,10",
            "--reason",
            "the test",
        ],
    );
    // Two are protected; the pool is lowered to 1: the two others go, and
    // one protected machine beyond the count stays, reported.
    let kept: Vec<String> = ours(&fake).into_iter().take(2).collect();
    for id in &kept {
        ok(
            &c,
            &env,
            &["machines", "protect", id, "--reason", "holds a replica"],
        );
    }
    let out = ok(
        &c,
        &env,
        &["pools", "set", "web", "count=1", "--reason", "quiet season"],
    );
    assert!(out.contains("web"), "{out}");
    wait_until(&c, &fake, "web lowered", |s| s.len() == 2).await;
    let left: HashSet<String> = ours(&fake).into_iter().collect();
    assert_eq!(
        left,
        kept.iter().cloned().collect(),
        "a protected machine went"
    );
    let held = events(&c, "deletions_held").await;
    assert!(held.iter().any(|e| e["guard"] == "protected"), "{held:?}");
    // Raised: filled again.
    ok(
        &c,
        &env,
        &["pools", "set", "web", "count=3", "--reason", "busy again"],
    );
    wait_until(&c, &fake, "web raised", |s| s.len() == 3).await;
    // Removal is refused unconfirmed, and changes nothing.
    let (refused, out, err) = run(&c, &env, &["pools", "remove", "web", "--reason", "gone"]);
    assert!(!refused, "{out}");
    assert!(err.contains("confirm-delete"), "{err}");
    // With a leave hook, deletions wait for the operator.
    ok(
        &c,
        &env,
        &[
            "settings",
            "set",
            "leave_hook",
            "ack",
            "--reason",
            "drain first",
        ],
    );
    for id in &kept {
        ok(
            &c,
            &env,
            &["machines", "unprotect", id, "--reason", "copied"],
        );
    }
    ok(
        &c,
        &env,
        &[
            "pools",
            "remove",
            "web",
            "--confirm-delete",
            "--reason",
            "moved away",
        ],
    );
    let started = Instant::now();
    while c.count("select count(*) from shepherd.leaving").await < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the deletions were not requested"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        ours(&fake).len(),
        3,
        "deleted before the leave hook answered"
    );
    let status = ok(&c, &env, &["status"]);
    assert!(status.to_lowercase().contains("leaving"), "{status}");
    for id in ours(&fake) {
        ok(&c, &env, &["machines", "ack", &id]);
    }
    wait_until(&c, &fake, "web drained", |s| s.is_empty()).await;
    c.stop_all();

    // What the log tells, step by step.
    let requested = events(&c, "deletion_requested").await;
    let causes: Vec<&str> = requested
        .iter()
        .map(|e| e["cause"].as_str().unwrap())
        .collect();
    assert_eq!(
        causes,
        vec![
            "surplus",
            "surplus",
            "pool_removed",
            "pool_removed",
            "pool_removed"
        ],
        "{requested:?}"
    );
    assert_eq!(events(&c, "machine_deleted").await.len(), 5);
    assert_eq!(events(&c, "leave_acknowledged").await.len(), 3);
    assert_eq!(events(&c, "pool_removed").await.len(), 1);
    for kind in [
        "pool_declared",
        "pool_changed",
        "machine_protected",
        "machine_unprotected",
    ] {
        assert!(!events(&c, kind).await.is_empty(), "no {kind}");
    }
    assert!(
        fake.servers().iter().any(|s| s.id == foreign),
        "another project's server was deleted"
    );
    assert_eq!(fake.duplicate_hostnames(), 0);
    assert_eq!(c.count("select count(*) from shepherd.sinbin").await, 0);
    let report = shepherd::events::views::rebuild(&c.pool, false)
        .await
        .unwrap();
    assert!(report.differences.is_empty(), "{:?}", report.differences);
}
