//! The leave hook is a promise kept on every path: a rerun or a swept
//! deletion still asks it; only 200 or 204 lets a machine go, 202 drains,
//! a redirect (a log-in proxy) is no consent; requests are signed and the
//! hook named by its host; a cancelled deletion tells it; a pause asks
//! nothing and costs it no drain time; waiting uses up no tries. Against
//! the fake Latitude over HTTP, a hook on loopback and a real Postgres.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use common::latitude::{World, pool};
use common::lifecycle::*;
use common::world::Ran;
use shepherd::jobs::DeleteMachineArgs;
use shepherd::jobs::delete_machine::{DeleteOutcome, delete_machine};
use shepherd_fakes::latitude::Call;
use sqlx::PgPool;

async fn hook(
    answer: impl Fn(u32) -> (StatusCode, Option<&'static str>) + Send + Sync + 'static,
) -> (String, Arc<Mutex<Vec<serde_json::Value>>>) {
    use axum::body::Bytes;
    use axum::http::HeaderMap;
    use axum::response::IntoResponse;
    use axum::routing::{get, post};
    let bodies = Arc::new(Mutex::new(Vec::<serde_json::Value>::new()));
    let answer = Arc::new(answer);
    let app = {
        let bodies = bodies.clone();
        axum::Router::new()
            .route(
                "/leave",
                post(move |headers: HeaderMap, raw: Bytes| {
                    let (bodies, answer) = (bodies.clone(), answer.clone());
                    async move {
                        let mut body: serde_json::Value =
                            serde_json::from_slice(&raw).expect("the hook's body is JSON");
                        let header = |name: &str| {
                            headers
                                .get(name)
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_string)
                        };
                        body["_signature"] = header("x-shepherd-signature").into();
                        body["_timestamp"] = header("x-shepherd-timestamp").into();
                        body["_raw"] = String::from_utf8_lossy(&raw).into_owned().into();
                        let n = {
                            let mut b = bodies.lock().unwrap();
                            b.push(body);
                            b.len() as u32 - 1
                        };
                        let (status, location) = answer(n);
                        let mut response = status.into_response();
                        if let Some(to) = location {
                            response
                                .headers_mut()
                                .insert("location", to.parse().unwrap());
                        }
                        response
                    }
                }),
            )
            .route(
                "/login",
                get(|| async { "sign in" }).post(|| async { "sign in" }),
            )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    // No token in the URL: a setting's value is published (the hook's
    // requests are signed instead, checked below).
    let url = format!("http://{}/leave", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, bodies)
}

/// Runs the jobs, makes the waiting ones due, `rounds` times.

#[sqlx::test(migrations = false)]
async fn a_rerun_or_swept_deletion_still_asks_the_hook(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    setting(&w, "leave_hook", "ack").await;
    set_count(&w, "web", 1).await;
    let pass = w.pass().await;
    let device = pass.deletions[0].clone();
    let (machine_id, request): (uuid::Uuid, String) = sqlx::query_as(
        "select machine_id, request from shepherd.pending_deletions where provider_id = $1",
    )
    .bind(&device)
    .fetch_one(&w.pool)
    .await
    .unwrap();
    // A run as the sweep resumes one, or a row that ran before: the
    // delete may have been sent, so it looks first; the hook was never
    // answered, so it is asked and waited for all the same.
    let args = DeleteMachineArgs {
        attempt: 4,
        unknown: true,
        ..DeleteMachineArgs::first(machine_id, device.clone(), request.parse().unwrap())
    };
    let outcome = delete_machine(&w.ctx, &args, "test-rerun").await.unwrap();
    assert!(
        matches!(outcome, DeleteOutcome::Waiting { .. }),
        "{outcome:?}"
    );
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    assert_eq!(w.fake.servers().len(), 2);
}

#[sqlx::test(migrations = false)]
async fn a_hook_that_redirects_is_no_consent_and_a_draining_one_is_waited_for(db: PgPool) {
    // A hook behind a log-in proxy: 302 to a page that answers 200.
    let (url, bodies) = hook(|_| (StatusCode::FOUND, Some("/login"))).await;
    const SECRET: &str = "the-hook-secret-0123456789";
    let w = World::with_config(db, 10, vec![pool("web", "DAL", 2)], Duration::ZERO, |c| {
        c.leave_hook_secret = Some(shepherd::secret::ApiToken::new(SECRET))
    })
    .await;
    w.settle(3).await;
    setting(&w, "leave_hook", &url).await;
    setting(&w, "leave_timeout", "2s").await;
    setting(&w, "leave_deadline", "give_up").await;
    set_count(&w, "web", 1).await;
    let pass = w.pass().await;
    assert_eq!(pass.deletions.len(), 1);
    drain_rounds(&w, 2).await;
    assert!(bodies.lock().unwrap().len() >= 2);
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    assert!(w.events("leave_acknowledged").await.is_empty());
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    w.make_due().await;
    let ran = drain_rounds(&w, 1).await;
    assert!(
        ran.iter()
            .any(|r| matches!(r, Ran::Delete(DeleteOutcome::Failed { .. }))),
        "{ran:?}"
    );
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    assert_eq!(w.fake.servers().len(), 2);
    // The machine stays: the hook is told so.
    let told = bodies.lock().unwrap().last().cloned().unwrap();
    assert_eq!(told["event"], "cancelled", "{told:?}");

    // 202 (still draining) twice, then 204: only then does it go, and the
    // event names the hook's host, never its whole address.
    let (url, bodies) = hook(|n| {
        if n < 2 {
            (StatusCode::ACCEPTED, None)
        } else {
            (StatusCode::NO_CONTENT, None)
        }
    })
    .await;
    setting(&w, "leave_hook", &url).await;
    setting(&w, "leave_timeout", "10m").await;
    let pass = w.pass().await;
    assert_eq!(pass.deletions.len(), 1, "{pass:?}");
    drain_rounds(&w, 4).await;
    assert_eq!(bodies.lock().unwrap().len(), 3);
    assert_eq!(w.fake.calls(Call::DestroyServer), 1);
    assert_eq!(w.fake.servers().len(), 1);
    let acked = w.events("leave_acknowledged").await;
    let by = acked[0]["by"].as_str().unwrap();
    assert!(by.starts_with("hook:127.0.0.1:"), "{by}");
    assert!(!by.contains("/leave"), "{by}");
    // Every request is signed: HMAC-SHA256 of TIMESTAMP.BODY under the
    // cluster's secret, which a hook checks; another key's does not match.
    for b in bodies.lock().unwrap().iter() {
        let timestamp: i64 = b["_timestamp"].as_str().unwrap().parse().unwrap();
        let raw = b["_raw"].as_str().unwrap();
        let expected = shepherd::jobs::delete_machine::hook_signature(
            SECRET.as_bytes(),
            timestamp,
            raw.as_bytes(),
        );
        assert_eq!(b["_signature"], format!("sha256={expected}"));
        let forged = shepherd::jobs::delete_machine::hook_signature(
            b"another-key-entirely",
            timestamp,
            raw.as_bytes(),
        );
        assert_ne!(b["_signature"], format!("sha256={forged}"));
        assert!((chrono::Utc::now().timestamp() - timestamp).abs() < 120);
    }
}

#[sqlx::test(migrations = false)]
async fn a_cancelled_deletion_tells_the_hook_and_a_paused_one_does_not_ask(db: PgPool) {
    let (url, bodies) = hook(|_| (StatusCode::ACCEPTED, None)).await;
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    setting(&w, "leave_hook", &url).await;
    set_count(&w, "web", 1).await;
    let pass = w.pass().await;
    assert_eq!(pass.deletions.len(), 1);
    drain_rounds(&w, 0).await;
    assert_eq!(bodies.lock().unwrap().len(), 1);
    // Deletions paused: the hook is not asked again while they are.
    pause_deletions(&w, true).await;
    drain_rounds(&w, 2).await;
    assert_eq!(bodies.lock().unwrap().len(), 1);
    pause_deletions(&w, false).await;
    // The pool is raised again; the next look finds no surplus and
    // cancels, and the hook hears that the machine stays.
    set_count(&w, "web", 2).await;
    setting(&w, "leave_timeout", "1s").await;
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    w.make_due().await;
    let ran = drain_rounds(&w, 1).await;
    assert!(
        ran.iter()
            .any(|r| matches!(r, Ran::Delete(DeleteOutcome::Cancelled { .. }))),
        "{ran:?}"
    );
    let told = bodies.lock().unwrap().clone();
    assert_eq!(told.last().unwrap()["event"], "cancelled", "{told:?}");
    assert_eq!(told.last().unwrap()["device"], pass.deletions[0].as_str());
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
}

#[sqlx::test(migrations = false)]
async fn waiting_for_the_hook_uses_up_no_tries(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    setting(&w, "leave_hook", "ack").await;
    set_count(&w, "web", 1).await;
    let pass = w.pass().await;
    assert_eq!(pass.deletions.len(), 1);
    // Five looks at a hook that has not answered: more than the three
    // tries a delete has.
    drain_rounds(&w, 4).await;
    let (attempt, waits): (i64, i64) = sqlx::query_as(
        "select (shepherd.job_args(job)->>'attempt')::bigint,
                coalesce((shepherd.job_args(job)->>'waits')::bigint, 0)
         from apalis.jobs where job_type = 'delete_machine' and status = 'Pending'",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert_eq!((attempt, waits), (6, 5));
    acknowledge(&w, &pass.deletions[0]).await;
    w.make_due().await;
    drain_rounds(&w, 0).await;
    assert_eq!(w.fake.calls(Call::DestroyServer), 1);
    assert_eq!(w.fake.servers().len(), 1);
}

#[sqlx::test(migrations = false)]
async fn a_pause_longer_than_the_leave_timeout_costs_the_hook_no_drain_time(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    setting(&w, "leave_hook", "ack").await;
    setting(&w, "leave_timeout", "2s").await;
    setting(&w, "leave_deadline", "proceed").await;
    set_count(&w, "web", 1).await;
    let pass = w.pass().await;
    assert_eq!(pass.deletions.len(), 1);
    // Paused before the machine was ever asked to leave, for longer than
    // the timeout.
    pause_deletions(&w, true).await;
    drain_rounds(&w, 1).await;
    assert!(w.events("leave_asked").await.is_empty());
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    pause_deletions(&w, false).await;
    w.make_due().await;
    // Asked now: the whole timeout is still the hook's.
    let ran = drain_rounds(&w, 0).await;
    assert!(
        ran.iter()
            .all(|r| matches!(r, Ran::Delete(DeleteOutcome::Waiting { .. }))),
        "{ran:?}"
    );
    assert_eq!(w.events("leave_asked").await.len(), 1);
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    assert!(w.events("leave_timed_out").await.is_empty());
    // Then it runs out, and "proceed" lets the machine go.
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    w.make_due().await;
    drain_rounds(&w, 1).await;
    assert_eq!(w.events("leave_timed_out").await.len(), 1);
    assert_eq!(w.fake.calls(Call::DestroyServer), 1);
    common::assert_rebuild_equals_live(&w.pool).await;
}

/// A hook's URL is a setting, which the event log and the pages show: one
/// carrying credentials or a query (a token) is refused by the operator's
/// function and by the flag alike, and says so without echoing it.
#[sqlx::test(migrations = false)]
async fn a_hook_url_carrying_a_token_is_refused_and_not_recorded(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 1)]).await;
    for url in [
        "https://hook.example/leave?token=s3cret-t0ken",
        "https://ops:s3cret-t0ken@hook.example/leave",
        "https://hook.example/leave#s3cret-t0ken",
    ] {
        let refused =
            sqlx::query("select shepherd.change_setting('leave_hook', $1, 'test', 'test')")
                .bind(url)
                .execute(&w.pool)
                .await
                .expect_err(url);
        let message = refused.to_string();
        assert!(message.contains("--leave-hook-secret-file"), "{message}");
        assert!(
            !message.contains("s3cret-t0ken"),
            "the refusal echoes the secret: {message}"
        );
        let parsed = url.parse::<shepherd::config::LeaveHook>();
        assert!(parsed.is_err(), "{url}");
        assert!(!parsed.unwrap_err().contains("s3cret-t0ken"));
    }
    let leaked: i64 = sqlx::query_scalar(
        "select count(*) from shepherd.events where body::text like '%s3cret-t0ken%'",
    )
    .fetch_one(&w.pool)
    .await
    .expect("the log read");
    assert_eq!(leaked, 0);
    // A plain URL, a port and a path, is a hook.
    setting(&w, "leave_hook", "https://hook.example:8443/drain/leave").await;
    assert!(
        "https://hook.example:8443/drain/leave"
            .parse::<shepherd::config::LeaveHook>()
            .is_ok()
    );
}
