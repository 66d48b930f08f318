//! What a cluster of real processes shows and keeps to itself: a dead fleet
//! red on the scheduler's console, the least-privilege role running a
//! worker, and the token in no page, metric or command line.

use super::*;

/// Every worker killed (SIGKILL: no goodbye), the console a scheduler
/// serves says so at its top in a real browser, `shepherd status` says so
/// and its `/metrics` counts no live worker, all within the workers'
/// missed heartbeats and two of the scheduler's periods, not minutes.
#[sqlx::test(migrations = false)]
async fn a_dead_fleet_looks_dead_within_two_periods(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 2, Faults::default()).await;
    migrate(&c).await;
    c.spawn_plain_worker(&[]);
    let console = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(c.dir.join("scheduler.log")).unwrap();
    let mut scheduler = c
        .command(&[
            "scheduler",
            "--metrics-listen",
            &console,
            "--reconcile-rate",
            "1s,1",
        ])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    c.wait_for(2, 2, Duration::from_secs(60)).await;
    let browser = browser::Browser::start().await;
    let page = format!("http://{console}/");
    let started = Instant::now();
    loop {
        browser.goto(&page).await;
        if browser.text("body").await.contains("Working:") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the console never said the fleet works: {}",
            browser.text("body").await
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The worker process listed once, with its release and start.
    let listed = browser.text("table.workers").await;
    assert!(
        listed.contains(env!("CARGO_PKG_VERSION")) && listed.contains("create_device"),
        "{listed}"
    );
    // Heartbeat 1 s × 3 missed: a worker silent 3 s is dead; passes every
    // 1 s. Red within that window and two periods, with a second's slack
    // for the page and the poll.
    let bound = Duration::from_secs(3 + 2 + 1);
    signal(&c.workers[0], "KILL");
    let killed = Instant::now();
    loop {
        browser.goto(&page).await;
        let top = browser
            .script("var a = document.querySelector('.alive'); return a ? a.textContent : '';")
            .await;
        if top.as_str().unwrap().contains("NO WORKER RUNNING") {
            break;
        }
        assert!(
            killed.elapsed() < bound,
            "still not red {:?} after every worker was killed: {top}",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let seen = killed.elapsed();
    // It is the first thing on the page, after the title.
    let first = browser
        .script("return document.querySelector('h1').nextElementSibling.className;")
        .await;
    assert!(first.as_str().unwrap().contains("alive"), "{first}");
    let status = c.command(&["status"]).output().unwrap();
    let said = String::from_utf8_lossy(&status.stdout);
    assert!(said.contains("NO WORKER"), "{said}");
    let metrics = reqwest::get(format!("http://{console}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.lines().any(|l| l == "shepherd_workers_alive 0"),
        "{metrics}"
    );
    eprintln!("red {seen:?} after the kill (bound {bound:?})");
    browser.quit().await;
    let _ = scheduler.kill();
    let _ = scheduler.wait();
    c.stop_all();
}

/// deploy/roles.sql's worker role is enough to run a worker (migrated by
/// the owner beforehand), and it cannot rewrite history.
#[sqlx::test(migrations = false)]
async fn the_least_privilege_role_runs_a_worker(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 4, Faults::default()).await;
    migrate(&c).await;
    let roles = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/roles.sql");
    let c2 = c.db_url.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("psql")
            .arg(&c2)
            .args(["-q", "-v", "ON_ERROR_STOP=1", "-f", roles])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let as_worker = c.db_url.replacen("://postgres@", "://shepherd_worker@", 1);
    assert_ne!(
        as_worker, c.db_url,
        "the test database URL names the postgres user"
    );
    c.db_url = as_worker.clone();
    c.spawn_worker(&[
        "--skip-migrations",
        "--max-machines",
        "2",
        "--device-creation-rate",
        "10ms,1",
    ]);
    c.wait_for(2, 2, Duration::from_secs(60)).await;
    let worker = shepherd::db::connect(&as_worker, 1).await.unwrap();
    for forbidden in [
        "delete from shepherd.events",
        "create table shepherd.mine (x int)",
    ] {
        let refused = sqlx::query(forbidden).execute(&worker).await.unwrap_err();
        assert!(
            refused.to_string().contains("permission denied"),
            "{forbidden}: {refused}"
        );
    }
    worker.close().await;
    c.stop_all();
}

/// The token reaches no page, metric or command line of a running worker,
/// nor the error a wrong token causes.
#[sqlx::test(migrations = false)]
async fn the_token_is_in_no_page_metric_or_command_line(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 6, Faults::default()).await;
    migrate(&c).await;
    let addr = c.spawn_worker(&["--max-machines", "3", "--device-creation-rate", "10ms,1"]);
    c.wait_for(3, 3, Duration::from_secs(60)).await;
    let device = c.managed_ids().await.remove(0);
    let reservation = c.fake.reservations()[0].id;
    let mut seen = String::new();
    for path in [
        "/".to_string(),
        "/metrics".into(),
        "/healthz".into(),
        "/readyz".into(),
        format!("/device/{device}"),
        format!("/reservation/{reservation}"),
    ] {
        let response = reqwest::get(format!("http://{addr}{path}")).await.unwrap();
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
        seen.push_str(&response.text().await.unwrap());
    }
    assert!(seen.contains("shepherd_"), "the metrics were read");
    assert!(
        !seen.contains(TOKEN),
        "the token is on a page the worker serves"
    );
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", c.workers[0].id())).unwrap();
    assert!(
        !String::from_utf8_lossy(&cmdline).contains(TOKEN),
        "the token is on the command line"
    );
    // A token the API refuses: the error names the problem, not the token.
    let out = c
        .command(&["plan"])
        .env("METAL_AUTH_TOKEN", "wrong-token-e3b0c442")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("401") || stderr.to_lowercase().contains("unauthori"),
        "{stderr}"
    );
    assert!(!stderr.contains("wrong-token-e3b0c442"), "{stderr}");
    c.stop_all();
    assert!(
        !log_of(&c.dir, 0).contains(TOKEN),
        "the token is in the log"
    );
}
