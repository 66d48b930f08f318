//! A cluster behind PgBouncer in transaction mode, as docs/operations.md
//! tells an operator to run one: the schema migrated against Postgres
//! itself, then three workers (one with the scheduler) and the operator's
//! commands through the pooler, polling (`--no-listen`), the pages with no
//! startup statement timeout. A Latitude pool is filled and lowered under
//! a provider that drops answers; nothing may fail for the pooler's sake
//! (a prepared statement on the wrong server connection, a lock or a
//! setting left on one), and the promise holds as it does direct.
//! Its own test binary: it starts a pgbouncer of its own.

use std::process::Stdio;
use std::time::{Duration, Instant};

use shepherd_fakes::latitude::{Call, FakeConfig, FaultKind, FaultRule, Faults};
use shepherd_fakes::pgbouncer::{Bouncer, Upstream};
use sqlx::PgPool;

mod common;
use common::*;

const KEY: &str = "latitude-pooler-key-93d1";

/// A pgbouncer in transaction mode in front of the test's Postgres.
fn bouncer(dir: &std::path::Path) -> Bouncer {
    let bin = std::env::var("SHEPHERD_PGBOUNCER").expect(
        "SHEPHERD_PGBOUNCER names a pgbouncer 1.21 or later: scripts/test finds or builds one \
         (scripts/tools.sh, ensure_pgbouncer)",
    );
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for tests");
    let server: sqlx::postgres::PgConnectOptions = url.parse().expect("DATABASE_URL parses");
    let upstream = Upstream {
        host: server.get_host().to_string(),
        port: server.get_port(),
        user: server.get_username().to_string(),
        server_connections: 6,
    };
    Bouncer::start(std::path::Path::new(&bin), dir, free_port(), &upstream)
        .unwrap_or_else(|e| panic!("{e}"))
}

#[sqlx::test(migrations = false)]
async fn a_cluster_behind_pgbouncer_in_transaction_mode_keeps_its_pools(pool: PgPool) {
    let fake = start_latitude(FakeConfig {
        token: KEY.into(),
        reads_per_window: 600,
        writes_per_window: 200,
        deploy_delay: Duration::from_millis(500),
        faults: Faults {
            latency_ms: 0,
            latency_jitter_ms: 50,
            rules: vec![
                // Creates that were made and answered 500: shepherd must look
                // before it creates again, through the pooler as directly.
                FaultRule::on(
                    Call::CreateServer,
                    FaultKind::AcceptThenFail { status: 500 },
                )
                .times(2),
                FaultRule::new(FaultKind::Status { status: 503 }).with_probability(0.1),
            ],
        },
        ..FakeConfig::default()
    });
    let mut c = Cluster::new(pool, 0, shepherd_fakes::metal::Faults::none()).await;
    // Migrations go to Postgres itself, as the docs say.
    migrate(&c).await;
    let bouncer = bouncer(&c.dir);
    let through = bouncer.url(&c.db_url).unwrap();
    let pools_flag = "name=web,plan=c2-small-x86,site=DAL,count=8,os=ubuntu_24_04_x64_lts";
    let base = fake.base_url();
    let env = [
        ("DATABASE_URL", through.as_str()),
        ("SHEPHERD_PROVIDER", "latitude"),
        ("LATITUDE_API_URL", base.as_str()),
        ("LATITUDE_PROJECT", fake.project()),
        ("LATITUDE_API_KEY", KEY),
        ("SHEPHERD_LATITUDE_POOLS", pools_flag),
        ("LATITUDE_READS_PER_MINUTE", "600"),
        ("LATITUDE_WRITES_PER_MINUTE", "200"),
    ];
    let args = [
        "--no-listen",
        "--console-statement-timeout",
        "0",
        "--max-machines",
        "12",
        "--device-creation-rate",
        "10ms,1",
        "--latitude-api-timeout",
        "1500ms",
        // A 503 to a create leaves its outcome unknown until a look after
        // this window; the fake's listings do not lag, so it can be short.
        "--settle-window",
        "3s",
    ];
    let mut pages = vec![];
    for n in 0..3 {
        let mut a = args.to_vec();
        if n == 0 {
            a.push("--scheduler");
        }
        // The third checks the schema at its start, as a worker does by
        // default: up to date, it takes no lock the pooler could strand.
        if n != 2 {
            a.push("--skip-migrations");
        }
        pages.push(c.spawn_worker_with_env(&a, &env));
    }
    let operator = |words: &[&str]| {
        let out = c.command(words).envs(env).output().unwrap();
        assert!(
            out.status.success(),
            "shepherd {words:?} through the pooler: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };

    let watch = |want: usize, what: &str| {
        let (fake, c) = (&fake, &c);
        let what = what.to_string();
        async move {
            let started = Instant::now();
            loop {
                let servers = fake.servers();
                let mut places: Vec<&str> = servers.iter().map(|s| s.hostname.as_str()).collect();
                places.sort();
                let before = places.len();
                places.dedup();
                assert_eq!(before, places.len(), "a place with two servers: {places:?}");
                assert!(
                    servers.len() <= 12,
                    "{} servers, over the limit",
                    servers.len()
                );
                let (m, f) = (c.managed().await, c.in_flight().await);
                let leaving: i64 = c.count("select count(*) from shepherd.leaving").await;
                if servers.len() == want && m == want as i64 && f == 0 && leaving == 0 {
                    return;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(120),
                    "{what}: {} servers, {m} managed, {f} in flight, {leaving} leaving; logs in {}",
                    servers.len(),
                    c.dir.display()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let started = Instant::now();
    watch(8, "filling the pool to 8").await;
    eprintln!("filled in {:?}", started.elapsed());

    // No worker listens: behind a pooler there is no session to listen on.
    let listening = c
        .count(
            "select count(*) from pg_stat_activity
             where datname = current_database() and application_name = 'shepherd-listen'",
        )
        .await;
    assert_eq!(listening, 0, "a worker behind the pooler listens");
    // The pages and /metrics answer through it, with their own pool.
    for port in &pages {
        for path in ["/", "/machines", "/metrics"] {
            let answer = reqwest::get(format!("http://{port}{path}")).await.unwrap();
            assert_eq!(answer.status(), 200, "{path} on {port}");
        }
    }

    // The operator lowers the pool through the pooler; the surplus goes.
    operator(&[
        "settings",
        "set",
        "deletion_budget",
        "100%,1000",
        "--reason",
        "pooler test",
    ]);
    operator(&["pools", "set", "web", "count=5", "--reason", "pooler test"]);
    let started = Instant::now();
    watch(5, "lowering the pool to 5").await;
    eprintln!("lowered in {:?}", started.elapsed());
    // A worker left at the pages' default statement timeout is refused by
    // PgBouncer at its pages' first connection, exits, and says what to
    // change (after the run: it does not get as far as taking a job).
    let mut refused = c
        .command(&["worker", "--no-listen", "--metrics-listen", "127.0.0.1:0"])
        .envs(env)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = refused.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(30) {
            let _ = refused.kill();
            panic!("a worker refused by the pooler did not exit within 30 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut said = String::new();
    std::io::Read::read_to_string(refused.stderr.as_mut().unwrap(), &mut said).unwrap();
    assert!(!status.success(), "{said}");
    assert!(
        said.contains("unsupported startup parameter")
            && said.contains("--console-statement-timeout 0"),
        "{said}"
    );

    c.stop_all();

    // Five places of the pool, one server each (which ones go is the
    // shedding order's choice: docs/pools.md, "Shrinking").
    let mut kept: Vec<String> = fake
        .servers()
        .into_iter()
        .filter_map(|s| {
            let rest = s.hostname.strip_prefix("shepherd-web-")?;
            Some(rest.split_once('-')?.0.to_string())
        })
        .collect();
    kept.sort();
    kept.dedup();
    assert_eq!(kept.len(), 5, "the pool's places: {kept:?}");
    assert_rebuild_equals_live(&c.pool).await;

    // Everything went through the pooler, and nothing failed for its sake.
    let pooled = bouncer.log_text();
    let name: String = sqlx::query_scalar("select current_database()")
        .fetch_one(&c.pool)
        .await
        .unwrap();
    assert!(
        pooled.contains(&format!("login attempt: db={name}")),
        "the workers did not log in through pgbouncer: {pooled}"
    );
    for n in 0..3 {
        let log = log_of(&c.dir, n);
        for bad in [
            "prepared statement",
            "unsupported startup parameter",
            "error returned from database",
            "pool timed out",
            "job failed on infrastructure",
            " ERROR ",
        ] {
            assert!(!log.contains(bad), "worker {n} logged {bad:?}:\n{log}");
        }
    }
}
