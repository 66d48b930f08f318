//! The leave hook: a leaving machine's delete waits for its consent
//! (acknowledged from SQL, answered over HTTP) or its timeout.

use super::*;

#[sqlx::test(migrations = false)]
async fn the_leave_hook_is_waited_for_acknowledged_or_timed_out(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 3)]).await;
    w.settle(3).await;
    for (key, value) in [
        ("deletion_budget", "100%,5"),
        ("leave_hook", "ack"),
        ("leave_timeout", "2s"),
        ("leave_deadline", "give_up"),
    ] {
        sqlx::query("select shepherd.change_setting($1, $2, 'the test', 'test')")
            .bind(key)
            .bind(value)
            .execute(&w.pool)
            .await
            .unwrap();
    }
    set_count(&w, "web", 1, false).await.unwrap();
    let pass = w.pass().await;
    assert_eq!(pass.deletions.len(), 2);
    drain_with(&w.pool, &w.ctx).await;
    assert_eq!(
        w.fake.servers().len(),
        3,
        "deleted before the hook answered"
    );
    let leaving = w.count("select count(*) from shepherd.leaving").await;
    assert_eq!(leaving, 2);
    // One is acknowledged (from SQL, as a drain script would): it goes.
    sqlx::query("select shepherd.acknowledge_leave($1, 'drain-script')")
        .bind(&pass.deletions[0])
        .execute(&w.pool)
        .await
        .unwrap();
    w.make_due().await;
    drain_with(&w.pool, &w.ctx).await;
    let left: HashSet<String> = w.fake.servers().into_iter().map(|s| s.id).collect();
    assert!(!left.contains(&pass.deletions[0]));
    assert!(left.contains(&pass.deletions[1]));
    // The other is never acknowledged: at the deadline it is given up, and
    // stays (leave_deadline = give_up).
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    w.make_due().await;
    let ran = drain_with(&w.pool, &w.ctx).await;
    assert!(
        ran.iter()
            .any(|r| matches!(r, Ran::Delete(DeleteOutcome::Failed { .. }))),
        "{ran:?}"
    );
    assert!(w.fake.servers().iter().any(|s| s.id == pass.deletions[1]));
    assert_eq!(w.events("leave_timed_out").await.len(), 1);
    assert_eq!(w.events("leave_acknowledged").await.len(), 1);
    // Given up, the deletion ends as failed, as the docs promise.
    let failed = w.events("deletion_failed").await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["provider_id"], pass.deletions[1].as_str());
    // proceed: the next pass asks again, and at the deadline it goes.
    sql(
        &w,
        "select shepherd.change_setting('leave_deadline', 'proceed', 'the test', 'test')",
    )
    .await;
    let again = w.pass().await;
    assert_eq!(again.deletions.len(), 1, "{again:?}");
    drain_with(&w.pool, &w.ctx).await;
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    w.make_due().await;
    drain_with(&w.pool, &w.ctx).await;
    assert_eq!(w.fake.servers().len(), 1);
    assert_consistent(&w).await;
}

/// A leave hook over HTTP: it answers 503 twice (the machine is still
/// draining), then 200; the delete follows the 200, and the hook was told
/// which machine and why.
#[sqlx::test(migrations = false)]
async fn an_http_leave_hook_lets_a_machine_go_when_it_answers_2xx(db: PgPool) {
    use axum::Json;
    use axum::http::StatusCode;
    use axum::routing::post;
    let calls = Arc::new(AtomicU32::new(0));
    let bodies = Arc::new(std::sync::Mutex::new(Vec::<serde_json::Value>::new()));
    let app = {
        let (calls, bodies) = (calls.clone(), bodies.clone());
        axum::Router::new().route(
            "/leave",
            post(move |Json(body): Json<serde_json::Value>| {
                let (calls, bodies) = (calls.clone(), bodies.clone());
                async move {
                    bodies.lock().unwrap().push(body);
                    if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                        StatusCode::SERVICE_UNAVAILABLE
                    } else {
                        StatusCode::OK
                    }
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/leave", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    sqlx::query("select shepherd.change_setting('leave_hook', $1, 'the test', 'test')")
        .bind(&url)
        .execute(&w.pool)
        .await
        .unwrap();
    set_count(&w, "web", 1, false).await.unwrap();
    let pass = w.pass().await;
    assert_eq!(pass.deletions.len(), 1);
    for _ in 0..3 {
        drain_with(&w.pool, &w.ctx).await;
        w.make_due().await;
    }
    drain_with(&w.pool, &w.ctx).await;
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(w.fake.servers().len(), 1);
    assert!(w.fake.servers().iter().all(|s| s.id != pass.deletions[0]));
    let body = bodies.lock().unwrap()[0].clone();
    assert_eq!(body["device"], pass.deletions[0].as_str());
    assert_eq!(body["cause"], "surplus");
    assert_eq!(body["pool"], "web");
    let acked = w.events("leave_acknowledged").await;
    assert_eq!(acked.len(), 1);
    assert!(
        acked[0]["by"].as_str().unwrap().starts_with("hook:"),
        "{acked:?}"
    );
    assert_consistent(&w).await;
}
