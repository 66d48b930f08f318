//! The jobs pages: the list filtered by kind and state, a job's page with
//! every run and attempt, and ticked jobs acted on together.

use super::*;

/// The jobs pages: the list filtered by kind and state, a job's arguments,
/// state and the events it recorded (linked from the event tables), every
/// value escaped, and clear refusals of a filter that names nothing.
#[sqlx::test(migrations = false)]
async fn the_jobs_pages_list_filter_and_show_a_job(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let device = uuid::Uuid::new_v4();
    let marked: String = sqlx::query_scalar(
        "select shepherd.push_job('assimilate',
            jsonb_build_object('device', $1::uuid, 'manual', true, 'note', '<b>bold</b>'))",
    )
    .bind(device)
    .fetch_one(&pool)
    .await
    .unwrap();
    let reconcile: String = sqlx::query_scalar("select shepherd.enqueue_reconcile()")
        .fetch_one(&pool)
        .await
        .unwrap();
    sqlx::query("update apalis.jobs set status = 'Killed', attempts = 1, last_result = '\"undecodable\"' where id = $1")
        .bind(&reconcile)
        .execute(&pool)
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    shepherd::events::record(
        &mut tx,
        vec![
            shepherd::events::NewEvent::new(shepherd::events::event::AssimilationRejected {
                device: device.to_string(),
                reason: "not known to the provider".into(),
            })
            .caused_by(&marked),
        ],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let server = Server::start(pool.clone()).await;

    let (status, _, all) = server.get("/jobs").await;
    assert_eq!(status, StatusCode::OK);
    assert!(all.contains(&marked) && all.contains(&reconcile), "{all}");
    let (_, _, killed) = server.get("/jobs?state=Killed").await;
    assert!(
        killed.contains(&reconcile) && !killed.contains(&marked),
        "{killed}"
    );
    let (_, _, assimilations) = server.get("/jobs?kind=assimilate").await;
    assert!(assimilations.contains(&marked) && !assimilations.contains(&reconcile));
    for bad in [
        "/jobs?state=Sleeping",
        "/jobs?kind=teleport",
        "/jobs?page=0",
    ] {
        let (status, _, text) = server.get(bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {text}");
    }

    let (status, _, job) = server.get(&format!("/jobs/{marked}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(job.contains(&device.to_string()), "{job}");
    assert!(
        job.contains("&lt;b&gt;bold&lt;/b&gt;") && !job.contains("<b>bold</b>"),
        "the arguments were not escaped:\n{job}"
    );
    assert!(
        job.contains("assimilation_rejected"),
        "the job's events: {job}"
    );
    let (_, _, killed_job) = server.get(&format!("/jobs/{reconcile}")).await;
    assert!(killed_job.contains("Killed") && killed_job.contains("undecodable"));
    let (status, _, _) = server.get("/jobs/no-such-job").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The status page links the jobs, and its recent events their job.
    let (_, _, front) = server.get("/").await;
    assert!(
        front.contains("href=\"/jobs\""),
        "the status page links the jobs"
    );
    assert!(
        front.contains(&format!("href=\"/jobs/{marked}\"")),
        "the event does not link its job:\n{front}"
    );
    // A job a worker has claimed reads as running, by whom.
    sqlx::query(
        "insert into apalis.workers (id, worker_type, storage_name, layers, last_seen)
         values ('assimilate@host:1#0', 'assimilate', 'test', '', now())",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "update apalis.jobs set status = 'Queued', lock_by = 'assimilate@host:1#0', lock_at = now()
         where id = $1",
    )
    .bind(&marked)
    .execute(&pool)
    .await
    .unwrap();
    let (_, _, page) = server.get(&format!("/jobs/{marked}")).await;
    assert!(
        page.contains("running")
            && page.contains("(queue: Queued)")
            && page.contains("assimilate@host:1#0"),
        "{page}"
    );
    let (_, _, running) = server.get("/jobs?state=running").await;
    assert!(running.contains(&marked), "{running}");
    // A creation that gave up ended Done in the queue, and is a failure.
    let args = serde_json::json!({
        "reservation": uuid::Uuid::new_v4(),
        "request": uuid::Uuid::new_v4(),
    });
    let gave_up: String = sqlx::query_scalar("select shepherd.push_job('create_device', $1)")
        .bind(&args)
        .fetch_one(&pool)
        .await
        .unwrap();
    sqlx::query(
        "update apalis.jobs set status = 'Done', attempts = 1, done_at = now(),
             last_result = '{\"Ok\": \"GivenUp { class: Permanent, cause: \\\"422: no\\\" }\"}'
         where id = $1",
    )
    .bind(&gave_up)
    .execute(&pool)
    .await
    .unwrap();
    // Its second attempt, a job of its own: each attempt's page shows them
    // all, with their outcomes.
    let mut second = args.clone();
    second["attempt"] = serde_json::json!(2);
    second["unknown"] = serde_json::json!(true);
    let retried: String = sqlx::query_scalar("select shepherd.push_job('create_device', $1)")
        .bind(&second)
        .fetch_one(&pool)
        .await
        .unwrap();
    let (_, _, page) = server.get(&format!("/jobs/{retried}")).await;
    assert!(page.contains("Every attempt of this creation"), "{page}");
    assert!(
        page.contains(&format!("href=\"/jobs/{gave_up}\"")),
        "{page}"
    );
    assert!(
        page.contains("given up") && page.contains("(this one)"),
        "{page}"
    );
    assert!(page.contains("2 of this creation"), "{page}");
    let (_, _, failed) = server.get("/jobs?state=failed").await;
    assert!(
        failed.contains(&gave_up) && failed.contains("given up"),
        "{failed}"
    );
    let (_, _, done) = server.get("/jobs?state=done").await;
    assert!(
        !done.contains(&gave_up),
        "a creation that gave up reads as done: {done}"
    );
    let (_, _, cancelled) = server.get("/jobs?state=cancelled").await;
    assert!(
        cancelled.contains(&reconcile) && !cancelled.contains(&marked),
        "{cancelled}"
    );
    // Search: by job id, and by what the arguments hold (a request, a
    // device); a search's wildcards are taken literally.
    let (_, _, by_id) = server.get(&format!("/jobs?q={gave_up}")).await;
    assert!(
        by_id.contains(&gave_up) && !by_id.contains(&marked),
        "{by_id}"
    );
    let request = args["request"].as_str().unwrap().to_string();
    let (_, _, by_request) = server.get(&format!("/jobs?q={request}")).await;
    assert!(
        by_request.contains(&gave_up)
            && by_request.contains(&retried)
            && !by_request.contains(&marked),
        "{by_request}"
    );
    let (_, _, by_device) = server.get(&format!("/jobs?q={device}")).await;
    assert!(
        by_device.contains(&marked) && !by_device.contains(&gave_up),
        "{by_device}"
    );
    let (_, _, wildcard) = server.get("/jobs?q=%25").await;
    assert!(wildcard.contains("No jobs match"), "{wildcard}");
    let (status, _, text) = server.get("/jobs?page=abc").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        text.contains("is not a page") && text.contains("<nav"),
        "{text}"
    );
    server.stop().await;
}

/// Ticked jobs are retried or cancelled together with one reason, each
/// judged on its own: the page says what was done and what was refused,
/// and the log records each with who and why. The ticks are offered to a
/// logged-in operator only.
#[sqlx::test(migrations = false)]
async fn ticked_jobs_are_acted_on_together_each_judged_alone(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let http = no_redirects();
    let push = |device: uuid::Uuid| {
        let pool = pool.clone();
        async move {
            let id: String = sqlx::query_scalar(
                "select shepherd.push_job('assimilate',
                    jsonb_build_object('device', $1::uuid, 'manual', true))",
            )
            .bind(device)
            .fetch_one(&pool)
            .await
            .unwrap();
            id
        }
    };
    let waiting_a = push(uuid::Uuid::new_v4()).await;
    let waiting_b = push(uuid::Uuid::new_v4()).await;
    let finished = push(uuid::Uuid::new_v4()).await;
    sqlx::query(
        "update apalis.jobs set status = 'Done', attempts = 1, done_at = now() where id = $1",
    )
    .bind(&finished)
    .execute(&pool)
    .await
    .unwrap();
    let server = Server::start_with(pool.clone(), Some("credential")).await;
    let (_, _, anonymous) = server.get("/jobs").await;
    assert!(
        !anonymous.contains(r#"name="jobs""#),
        "ticks for nobody: {anonymous}"
    );
    let r = post_form(
        &http,
        format!("{}/login", server.base),
        &[],
        &[("who", "alice"), ("token", "credential")],
    )
    .await;
    let cookie = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string())
        .find(|c| c.starts_with("shepherd_session="))
        .unwrap();
    let page = http
        .get(format!("{}/jobs", server.base))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(r#"name="jobs""#), "{page}");
    let r = post_form(
        &http,
        format!("{}/actions/cancel-jobs", server.base),
        &[("cookie", &cookie)],
        &[
            ("jobs", waiting_a.as_str()),
            ("jobs", waiting_b.as_str()),
            ("jobs", finished.as_str()),
            ("reason", "asked twice"),
        ],
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let said = r.text().await.unwrap();
    assert!(said.contains("2 of 3 cancelled"), "{said}");
    assert!(
        said.contains("Refused") && said.contains(&finished),
        "{said}"
    );
    let cancelled: Vec<String> = sqlx::query_scalar(
        "select body->>'job' from shepherd.events where event_type = 'job_cancelled'
         and body->>'by' = 'console:alice' and body->>'reason' = 'asked twice' order by 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut expected = vec![waiting_a.clone(), waiting_b.clone()];
    expected.sort();
    assert_eq!(cancelled, expected);
    // Nothing ticked, or no reason: refused, nothing recorded.
    for pairs in [vec![("reason", "x")], vec![("jobs", waiting_a.as_str())]] {
        let r = post_form(
            &http,
            format!("{}/actions/retry-jobs", server.base),
            &[("cookie", &cookie)],
            &pairs,
        )
        .await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    }
    let retried: i64 = count_events(&pool, "job_retried").await;
    assert_eq!(retried, 0);
    server.stop().await;
}

/// A job's page lists every run of it, as its workers recorded them: the
/// queue keeps the last result only, so a failure on the database before
/// a success would otherwise leave no trace. A run the queue counted but
/// nobody recorded is one whose worker died mid-run.
#[sqlx::test(migrations = false)]
async fn a_jobs_page_shows_every_run_of_it(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let job = ended_job(
        &pool,
        "reconcile",
        &serde_json::json!({ "requested_by": "test" }),
        "Done",
        r#"{"Ok": "ReconcileOutcome { run: None, managed: 3, enqueued: [] }"}"#,
    )
    .await;
    // Three runs counted: the first failed on the database, the second's
    // worker died, the third ended well.
    sqlx::query("update apalis.jobs set attempts = 3 where id = $1")
        .bind(&job)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "insert into shepherd.job_runs (job_id, run, kind, worker, started_at, ended_at, outcome, result)
         values ($1, 1, 'reconcile', 'w-a', now() - interval '2 min', now() - interval '2 min' + interval '1.5 s',
                 'failed', 'error returned from database: connection refused'),
                ($1, 3, 'reconcile', 'w-b', now() - interval '1 min', now() - interval '1 min' + interval '0.3 s',
                 'ok', 'ReconcileOutcome { run: None, managed: 3, enqueued: [] }')",
    )
    .bind(&job)
    .execute(&pool)
    .await
    .unwrap();
    let server = Server::start(pool.clone()).await;
    let (status, _, page) = server.get(&format!("/jobs/{job}")).await;
    assert_eq!(status, StatusCode::OK);
    let table = &page[page.find(r#"<table class="runs">"#).expect("no runs table")..];
    let table = &table[..table.find("</table>").unwrap()];
    let said = positions(
        table,
        &[
            "w-a",
            "1.5 s",
            "error: error returned from database: connection refused",
            "w-b",
            "0.3 s",
            "pass finished: managed 3",
            "1 run(s) the queue counted left no record: a worker stopped mid-run",
        ],
    );
    assert!(said.windows(2).all(|w| w[0] < w[1]), "{table}");
    server.stop().await;
}
