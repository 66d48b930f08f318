//! The console's edges: the names it answers, the headers that keep it out
//! of other sites' frames, and the pages' own pool with its time limit.

use super::*;

/// A page asked for under a name nobody gave it (DNS rebinding) is refused
/// with 421; IP addresses, localhost and the names given are served; the
/// probes and /metrics answer any name; every answer forbids framing.
#[sqlx::test(migrations = false)]
async fn pages_answer_only_their_own_names_and_are_never_framed(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let server = Server::start_behind_proxy(pool.clone(), None).await;
    let port = server.base.rsplit_once(':').unwrap().1.to_string();
    let http = no_redirects();
    let get = |path: &'static str, host: String| {
        let http = http.clone();
        let url = format!("{}{path}", server.base);
        async move {
            http.get(url)
                .header("host", host)
                .send()
                .await
                .expect("the console answers")
        }
    };
    for refused in [
        "evil.example.net".to_string(),
        format!("rebound.example.net:{port}"),
    ] {
        for path in ["/", "/jobs", "/login", "/events"] {
            let r = get(path, refused.clone()).await;
            assert_eq!(
                r.status(),
                StatusCode::MISDIRECTED_REQUEST,
                "{path} as {refused}"
            );
            assert_eq!(r.headers()["x-frame-options"], "DENY");
            let page = r.text().await.unwrap();
            assert!(page.contains("--console-host"), "{page}");
            assert!(!page.contains("Recent events"), "{page}");
        }
    }
    for served in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "console.example.com".to_string(),
        format!("CONSOLE.example.com:{port}"),
    ] {
        let r = get("/", served.clone()).await;
        assert_eq!(r.status(), StatusCode::OK, "{served}");
        let csp = r.headers()["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert_eq!(r.headers()["x-frame-options"], "DENY");
        assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    }
    for path in ["/metrics", "/healthz", "/readyz"] {
        let r = get(path, "worker-3.svc:9090".to_string()).await;
        assert_eq!(r.status(), StatusCode::OK, "{path}");
    }
    server.stop().await;
}

/// The pages run on a pool of their own whose statements the server
/// cancels after the pages' time limit: a page stuck behind a lock fails
/// with 503 on its own, and the jobs' pool still answers meanwhile.
#[sqlx::test(migrations = false)]
async fn a_stuck_page_fails_alone_within_its_time_limit(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let url = database_url(&pool).await;
    let pages = shepherd::db::connect_pages(&url, 1, Duration::from_millis(300))
        .await
        .expect("the pages' pool connects");
    let server = Server::start_with(pages.clone(), None).await;
    // Another session holds the event log: every page that reads it waits.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("lock table shepherd.events in access exclusive mode")
        .execute(&mut *holder)
        .await
        .unwrap();
    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        reqwest::get(format!("{}/events", server.base)),
    )
    .await
    .expect("the page answers instead of waiting on the lock")
    .unwrap();
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
    // The pool's connections say what they are, and carry the limit.
    let limit: String = sqlx::query_scalar("show statement_timeout")
        .fetch_one(&pages)
        .await
        .unwrap();
    assert_eq!(limit, "300ms");
    let named: String = sqlx::query_scalar("select current_setting('application_name')")
        .fetch_one(&pages)
        .await
        .unwrap();
    assert_eq!(named, "shepherd-console");
    let jobs: i32 = sqlx::query_scalar("select 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(jobs, 1);
    holder.rollback().await.unwrap();
    assert_eq!(server.get("/events").await.0, StatusCode::OK);
    server.stop().await;
}

/// A credential anyone could guess does not guard a console: the process
/// refuses it at start, says how to make a good one, and does not echo it.
#[sqlx::test(migrations = false)]
async fn a_weak_credential_is_refused_at_start(pool: PgPool) {
    let url = database_url(&pool).await;
    let dir = std::env::temp_dir().join(format!("shepherd-weak-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("operator");
    std::fs::write(&file, "hunter2hunter2\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args([
            "scheduler",
            "--metrics-listen",
            "127.0.0.1:0",
            "--operator-token-file",
        ])
        .arg(&file)
        .env("DATABASE_URL", &url)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("too weak"), "{stderr}");
    assert!(stderr.contains("openssl rand"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

/// A console whose database role may not operate (the workers' own
/// least-privilege role) refuses actions with 403 and the database's
/// reason, records nothing, and still shows its pages; given the
/// operator's role, the same action is done.
#[sqlx::test(migrations = false)]
async fn a_console_on_the_workers_role_may_not_act(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let url = database_url(&pool).await;
    let roles = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/roles.sql");
    let psql_url = url.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("psql")
            .arg(&psql_url)
            .args(["-q", "-v", "ON_ERROR_STOP=1", "-f", roles])
            .output()
            .expect("psql runs")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    const CREDENTIAL: &str = "the-right-operator-credential";
    let http = no_redirects();
    for (role, expected) in [
        ("shepherd_worker", StatusCode::FORBIDDEN),
        ("shepherd_operator", StatusCode::SEE_OTHER),
    ] {
        let as_role = url.replacen("://postgres@", &format!("://{role}@"), 1);
        let pages = shepherd::db::connect_pages(&as_role, 2, Duration::from_secs(5))
            .await
            .unwrap();
        let server = Server::start_with(pages.clone(), Some(CREDENTIAL)).await;
        assert_eq!(server.get("/").await.0, StatusCode::OK, "{role}");
        let r = post_form(
            &http,
            format!("{}/actions/pause", server.base),
            &[
                ("authorization", &format!("Bearer {CREDENTIAL}")),
                ("x-shepherd-operator", "alice"),
            ],
            &[("reason", "maintenance")],
        )
        .await;
        assert_eq!(r.status(), expected, "{role}");
        if expected == StatusCode::FORBIDDEN {
            let page = r.text().await.unwrap();
            assert!(page.contains("--console-database-url"), "{page}");
            assert_eq!(count_events(&pool, "creations_paused").await, 0);
        } else {
            let (by, role_recorded): (String, String) = sqlx::query_as(
                "select body->>'by', role from shepherd.events where event_type = 'creations_paused'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(by, "console:alice");
            assert_eq!(role_recorded, "shepherd_operator");
        }
        server.stop().await;
        pages.close().await;
    }
}
