//! The console's pages for operators: jobs, machines, the actions behind
//! the operator credential, and a walk through them in a real browser.

mod web;

use reqwest::StatusCode;
use sqlx::PgPool;
use std::time::Duration;
use web::browser::Browser;
use web::*;

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

/// Machines beyond what the status page shows are on `/machines`, paged and
/// searchable (a search's wildcards taken literally, every value escaped).
#[sqlx::test(migrations = false)]
async fn machines_are_paged_and_searchable(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let mut events = vec![];
    for n in 0..130 {
        events.push(shepherd::events::NewEvent::new(
            shepherd::events::event::MachineAssimilated {
                machine_id: uuid::Uuid::new_v4(),
                provider: "metal".into(),
                provider_id: uuid::Uuid::new_v4().to_string(),
                reservation: Some(uuid::Uuid::new_v4()),
                hostname: Some(format!("shepherd-{n:03}")),
            },
        ));
    }
    let mut tx = pool.begin().await.unwrap();
    shepherd::events::record(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();
    // The last one assimilated, in a later transaction.
    let mut tx = pool.begin().await.unwrap();
    shepherd::events::record(
        &mut tx,
        vec![shepherd::events::NewEvent::new(
            shepherd::events::event::MachineAssimilated {
                machine_id: uuid::Uuid::new_v4(),
                provider: "metal".into(),
                provider_id: uuid::Uuid::new_v4().to_string(),
                reservation: None,
                hostname: Some("odd_<name>%".into()),
            },
        )],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let server = Server::start(pool.clone()).await;
    let (_, _, front) = server.get("/").await;
    assert!(front.contains("<h2>Managed machines (131)"), "{front}");
    let listed =
        &front[front.find("<h2>Managed machines").unwrap()..front.find("Recent events").unwrap()];
    assert_eq!(
        listed.matches("<tr><td class=\"id\">").count(),
        50,
        "{listed}"
    );
    // The newest first: the odd one was assimilated last.
    let first_row = &listed[listed.find("<tbody>").unwrap()..];
    let first_row = &first_row[..first_row.find("</tr>").unwrap()];
    assert!(first_row.contains("odd_&lt;name&gt;%"), "{first_row}");
    let (status, _, first) = server.get("/machines").await;
    assert_eq!(status, StatusCode::OK);
    assert!(first.contains("131 machine(s); page 1 of 2."), "{first}");
    assert!(first.contains("href=\"/machines?page=2\""));
    let (_, _, second) = server.get("/machines?page=2").await;
    assert!(second.contains("page 2 of 2."));
    let (_, _, found) = server.get("/machines?q=shepherd-12").await;
    // shepherd-120 to shepherd-129 (shepherd-012 does not match).
    assert!(found.contains("10 machine(s) matching"), "{found}");
    // `_` and `%` are not wildcards in a search; markup is escaped.
    let (_, _, odd) = server.get("/machines?q=%25").await;
    assert!(odd.contains("1 machine(s) matching"), "{odd}");
    assert!(
        odd.contains("odd_&lt;name&gt;%") && !odd.contains("<name>"),
        "{odd}"
    );
    let (status, _, _) = server.get("/machines?page=0").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    server.stop().await;
}

/// A person's walk through the console in headless Chromium: the status
/// page shows the discrepancy, a click on the queue's state opens the
/// filtered job list, the filter form narrows it, a job's page shows its
/// arguments as text (not as markup), and a reservation's history follows
/// from the status page.
#[sqlx::test(migrations = false)]
async fn an_operator_clicks_through_the_console_in_a_browser(pool: PgPool) {
    let fleet = seed(&pool).await;
    let marked: String = sqlx::query_scalar(
        "select shepherd.push_job('assimilate',
            jsonb_build_object('device', gen_random_uuid(), 'manual', true, 'note', '<i>not markup</i>'))",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    // The page speaks for a Metal provider whose fake holds no device of the
    // managed machine: its release (below) is allowed.
    let (_fake, provider) = metal_provider().await;
    let server = Server::start_full(pool.clone(), Some("browser-credential"), Some(provider)).await;
    let browser = Browser::start().await;

    browser.goto(&format!("{}/", server.base)).await;
    let alarm = browser.text("div.alarm").await;
    assert!(alarm.contains("DISCREPANCY"), "{alarm}");
    assert!(alarm.contains(&fleet.unknown_device.to_string()), "{alarm}");
    let fleet_box = browser.text("table.facts").await;
    assert!(fleet_box.contains("Managed machines 1"), "{fleet_box}");
    browser.screenshot("status-page").await;
    // The same page for a system that asks for a dark theme.
    let light = browser.style("body", "background-color").await;
    browser.dark(true).await;
    let dark = browser.style("body", "background-color").await;
    assert_ne!(light, dark, "the page ignores prefers-color-scheme");
    assert_eq!(dark, "rgba(18, 18, 18, 1)", "{dark}");
    browser.screenshot("status-page-dark").await;
    browser.dark(false).await;

    // The charts, one click away.
    browser.click_to_leave("a[href='/charts']").await;
    let legend = browser.text("div.plot p.legend").await;
    assert!(legend.contains("devices created"), "{legend}");
    assert!(browser.text("svg.creations").await.contains("now"));
    browser.screenshot("charts").await;

    // The event log, narrowed to one type.
    browser.goto(&format!("{}/", server.base)).await;
    browser.click_to_leave("a[href='/events']").await;
    browser
        .click("select[name=type] option[value=reservation_penalised]")
        .await;
    browser.click_to_leave("form button").await;
    let log = browser.text("table.events").await;
    assert!(
        log.contains(&fleet.penalised.to_string()) && !log.contains("reconcile_started"),
        "{log}"
    );
    browser.screenshot("events").await;
    browser.goto(&format!("{}/", server.base)).await;

    // The queue's state links the filtered list.
    browser
        .click_to_leave("a[href='/jobs?kind=assimilate&state=Pending']")
        .await;
    assert!(
        browser
            .url()
            .await
            .ends_with("/jobs?kind=assimilate&state=Pending")
    );
    let list = browser.text("table").await;
    assert!(list.contains(&marked), "{list}");
    assert!(!list.contains("reconcile"), "{list}");
    browser.screenshot("jobs").await;

    // The filter form, in the console's words: any kind, waiting only.
    browser.click("select[name=kind] option[value='']").await;
    browser
        .click("select[name=state] option[value=waiting]")
        .await;
    browser.click_to_leave("form button").await;
    let url = browser.url().await;
    assert!(
        url.contains("state=waiting") && url.contains("kind="),
        "{url}"
    );
    let list = browser.text("table").await;
    assert!(
        list.contains("reconcile") && list.contains(&marked),
        "{list}"
    );

    // A job's page: its arguments read as text.
    browser
        .click_to_leave(&format!("a[href='/jobs/{marked}']"))
        .await;
    let arguments = browser.text("pre.body").await;
    assert!(arguments.contains("<i>not markup</i>"), "{arguments}");
    browser.screenshot("job").await;

    // A creation tried three times: each attempt a job, each with its
    // outcome, on every attempt's page.
    let creation = serde_json::json!({
        "reservation": uuid::Uuid::new_v4(),
        "request": uuid::Uuid::new_v4(),
    });
    let mut attempts = vec![];
    for (n, status, result) in [
        (
            1,
            "Done",
            r#"{"Ok": "Retrying { next_attempt: 2, after: 30s }"}"#,
        ),
        (
            2,
            "Done",
            r#"{"Ok": "Unresolved { next_attempt: 3, after: 60s }"}"#,
        ),
        (
            3,
            "Done",
            r#"{"Ok": "Created { device: \"d1\", recovered: true }"}"#,
        ),
    ] {
        let mut args = creation.clone();
        args["attempt"] = serde_json::json!(n);
        attempts.push(ended_job(&pool, "create_device", &args, status, result).await);
    }
    browser
        .goto(&format!("{}/jobs/{}", server.base, attempts[2]))
        .await;
    let table = browser.text("table.attempts").await;
    assert!(
        table.contains("to be tried again by a new job")
            && table.contains("outcome unknown: looking again later")
            && table.contains("created (found after an unseen answer)"),
        "{table}"
    );
    browser.screenshot("job-attempts").await;

    // Back to the front page, then a penalised reservation's history.
    browser.goto(&format!("{}/", server.base)).await;
    browser
        .click_to_leave(&format!("a[href='/reservation/{}']", fleet.penalised))
        .await;
    let heading = browser.text("h1").await;
    assert!(heading.contains(&fleet.penalised.to_string()), "{heading}");

    // An action: log in, pause creations, read the notice.
    browser.goto(&format!("{}/login", server.base)).await;
    browser.type_text("input[name=who]", "alice").await;
    browser
        .type_text("input[name=token]", "browser-credential")
        .await;
    browser.click_to_leave("form button").await;
    assert!(browser.url().await.ends_with('/'));
    // The page reloads itself while nobody is typing, and holds still
    // while a reason is half-typed: a reload would throw it away.
    let as_of = browser.text("p.as-of").await;
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    let reloaded = browser.text("p.as-of").await;
    assert_ne!(reloaded, as_of, "the idle page did not reload");
    browser
        .type_text(
            "form[action='/actions/pause'] input[name=reason]",
            "maintenance",
        )
        .await;
    tokio::time::sleep(Duration::from_millis(6_500)).await;
    assert_eq!(
        browser.text("p.as-of").await,
        reloaded,
        "the page reloaded under a half-typed form"
    );
    browser
        .click_to_leave("form[action='/actions/pause'] button")
        .await;
    // What was done, said as done; the pause's own notice below it.
    assert!(
        browser
            .text("p.done")
            .await
            .contains("Creations are paused.")
    );
    let notice = browser.text("div.warn").await;
    assert!(
        notice.contains("Creations are paused")
            && notice.contains("console:alice")
            && notice.contains("maintenance"),
        "{notice}"
    );
    browser.screenshot("paused").await;

    // A job: cancel it while it waits, then run it again.
    browser
        .goto(&format!("{}/jobs/{marked}", server.base))
        .await;
    browser
        .type_text(
            "form[action='/actions/cancel-job'] input[name=reason]",
            "asked by mistake",
        )
        .await;
    browser
        .click_to_leave("form[action='/actions/cancel-job'] button")
        .await;
    assert!(
        browser
            .url()
            .await
            .ends_with(&format!("/jobs/{marked}?done=cancel-job"))
    );
    assert!(
        browser
            .text("p.done")
            .await
            .contains("The job is cancelled.")
    );
    let facts = browser.text("table.facts").await;
    assert!(facts.contains("State cancelled"), "{facts}");
    let recorded = browser.text("table.events").await;
    assert!(
        recorded.contains("job_cancelled") && recorded.contains("console:alice"),
        "{recorded}"
    );
    browser
        .type_text(
            "form[action='/actions/retry-job'] input[name=reason]",
            "it was right after all",
        )
        .await;
    browser
        .click_to_leave("form[action='/actions/retry-job'] button")
        .await;
    let facts = browser.text("table.facts").await;
    assert!(facts.contains("State waiting"), "{facts}");
    assert!(browser.text("table.events").await.contains("job_retried"));
    browser.screenshot("job-actions").await;

    // A machine whose device is gone: release it from the machines page.
    browser.goto(&format!("{}/machines", server.base)).await;
    let head = browser.text("table thead").await;
    assert!(
        head.contains("Device") && head.contains("Reservation"),
        "{head}"
    );
    browser.screenshot("machines").await;
    browser
        .type_text(
            "form[action='/actions/release'] input[name=reason]",
            "decommissioned",
        )
        .await;
    browser
        .click_to_leave("form[action='/actions/release'] button")
        .await;
    assert!(browser.url().await.ends_with("/machines?done=release"));
    assert!(
        browser
            .text("p.done")
            .await
            .contains("The machine is released; a pass is queued to look again.")
    );
    let count = browser.text("p.muted").await;
    assert!(count.starts_with("0 machine(s)"), "{count}");

    // Logged out: the session ends, the forms go, and the page says how to
    // log in again.
    browser.goto(&format!("{}/", server.base)).await;
    assert!(browser.text("body").await.contains("Logged in as alice"));
    browser
        .click_to_leave("form[action='/logout'] button")
        .await;
    let page = browser.text("body").await;
    assert!(page.contains("Log in to act"), "{page}");
    let forms = browser
        .script("return document.querySelectorAll(\"form[action^='/actions/']\").length;")
        .await;
    assert_eq!(forms, serde_json::json!(0), "forms without a session");
    let ended: i64 = sqlx::query_scalar(
        "select count(*) from shepherd.console_sessions where who = 'alice' and ended_at is not null",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(ended, 1);
    browser.quit().await;
    server.stop().await;
}

/// Actions are off without a credential; with one, each needs it (a cookie
/// from the log-in, or a Bearer header), refuses another site's request,
/// goes through the SQL functions' own checks, and is recorded with who.
#[sqlx::test(migrations = false)]
async fn actions_need_the_credential_and_record_who(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let read_only = Server::start(pool.clone()).await;
    let r = post_form(
        &http,
        format!("{}/actions/pause", read_only.base),
        &[],
        &[("reason", "x")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let (_, _, page) = read_only.get("/").await;
    assert!(
        !page.contains("Actions"),
        "read-only pages offer no actions"
    );
    read_only.stop().await;

    let server = Server::start_with(pool.clone(), Some("s3cret-operator")).await;
    let events = |kind: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "select count(*) from shepherd.events where event_type = $1",
            )
            .bind(kind)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    // No credential, a wrong one: refused, nothing recorded.
    let r = post_form(
        &http,
        format!("{}/actions/pause", server.base),
        &[],
        &[("reason", "x")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = post_form(
        &http,
        format!("{}/login", server.base),
        &[],
        &[("who", "alice"), ("token", "guess")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(events("creations_paused").await, 0);
    // Logged in: the cookies act, and say who.
    let r = post_form(
        &http,
        format!("{}/login", server.base),
        &[],
        &[("who", "alice"), ("token", "s3cret-operator")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let cookies: Vec<String> = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string())
        .collect();
    assert!(
        r.headers()
            .get_all("set-cookie")
            .iter()
            .any(|v| v.to_str().unwrap().contains("HttpOnly; SameSite=Strict"))
    );
    let cookie = cookies.join("; ");
    // A reason over the limit is refused with why, and records nothing.
    let long = "x".repeat(1001);
    let r = post_form(
        &http,
        format!("{}/actions/pause", server.base),
        &[("cookie", &cookie)],
        &[("reason", long.as_str())],
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let said = r.text().await.unwrap();
    assert!(said.contains("at most 1000 characters"), "{said}");
    assert_eq!(events("creations_paused").await, 0);
    // Clearing a penalty that is not there says so.
    let r = post_form(
        &http,
        format!("{}/actions/clear-penalty", server.base),
        &[("cookie", &cookie)],
        &[
            ("reservation", &uuid::Uuid::new_v4().to_string()),
            ("reason", "tidy"),
        ],
    )
    .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let said = r.text().await.unwrap();
    assert!(said.contains("no penalty in force"), "{said}");
    assert_eq!(events("penalty_cleared").await, 0);
    let r = post_form(
        &http,
        format!("{}/actions/pause", server.base),
        &[("cookie", &cookie)],
        &[("reason", "maintenance window")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        r.headers().get("location").and_then(|v| v.to_str().ok()),
        Some("/?done=pause")
    );
    // Paused already: a refusal that says so, not a silent success.
    let r = post_form(
        &http,
        format!("{}/actions/pause", server.base),
        &[("cookie", &cookie)],
        &[("reason", "again")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert!(r.text().await.unwrap().contains("already paused"));
    let by: String = sqlx::query_scalar(
        "select body->>'by' from shepherd.events where event_type = 'creations_paused'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(by, "console:alice");
    // Another site's form, even with the cookies: refused.
    let r = post_form(
        &http,
        format!("{}/actions/resume", server.base),
        &[("cookie", &cookie), ("origin", "http://evil.example")],
        &[("reason", "x")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // A script: Bearer and its name.
    let r = post_form(
        &http,
        format!("{}/actions/resume", server.base),
        &[
            ("authorization", "Bearer s3cret-operator"),
            ("x-shepherd-operator", "deploy-bot"),
        ],
        &[("reason", "window over")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let by: String = sqlx::query_scalar(
        "select body->>'by' from shepherd.events where event_type = 'creations_resumed'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(by, "console:deploy-bot");
    // The SQL functions' checks hold: a pause needs a reason.
    let r = post_form(
        &http,
        format!("{}/actions/pause", server.base),
        &[("cookie", &cookie)],
        &[("reason", "")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("reason"));
    // A pass asked for from the page says who asked.
    let r = http
        .post(format!("{}/actions/reconcile", server.base))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let asked: String = sqlx::query_scalar(
        "select convert_from(job, 'UTF8')::jsonb->>'requested_by' from apalis.jobs where job_type = 'reconcile'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(asked, "console:alice");
    // A job action is judged by the server: a waiting pass is not retried
    // (409, and why), an unknown job is 404, and the reason is required.
    let pass: String =
        sqlx::query_scalar("select id from apalis.jobs where job_type = 'reconcile'")
            .fetch_one(&pool)
            .await
            .unwrap();
    for (action, job, reason, status, says) in [
        (
            "retry-job",
            pass.as_str(),
            "now",
            StatusCode::CONFLICT,
            "only a failed or killed job",
        ),
        (
            "cancel-job",
            "01JA0000000000000000000000",
            "x",
            StatusCode::NOT_FOUND,
            "no shepherd job",
        ),
        (
            "cancel-job",
            pass.as_str(),
            "",
            StatusCode::BAD_REQUEST,
            "say why",
        ),
    ] {
        let r = post_form(
            &http,
            format!("{}/actions/{action}", server.base),
            &[("cookie", &cookie)],
            &[("job", job), ("reason", reason)],
        )
        .await;
        assert_eq!(r.status(), status, "{action} {job}");
        let text = r.text().await.unwrap();
        assert!(text.contains(says), "{action}: {text}");
    }
    assert_eq!(
        events("job_retried").await + events("job_cancelled").await,
        0
    );
    let r = http
        .post(format!("{}/actions/teleport", server.base))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    server.stop().await;
}

const METAL_TOKEN: &str = "console-metal-token";

/// A fake Metal and the provider that speaks to it, as a worker's page has.
async fn metal_provider() -> (
    shepherd_fakes::metal::FakeMetal,
    std::sync::Arc<dyn shepherd::provider::Provider>,
) {
    let fake = shepherd_fakes::metal::FakeMetal::start(
        shepherd_fakes::metal::FakeConfig {
            token: METAL_TOKEN.into(),
            reservations: 2,
            ..Default::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let client = shepherd::metal::MetalClient::new(
        shepherd::metal::ClientConfig::new(
            fake.base_url(),
            fake.project_id(),
            shepherd::secret::ApiToken::new(METAL_TOKEN),
        ),
        shepherd::metal::ClientMetrics::default(),
    )
    .unwrap();
    let provider = shepherd::metal::provider::MetalProvider::new(
        client,
        "shepherd-".into(),
        "ubuntu_20_04".into(),
    );
    (fake, std::sync::Arc::new(provider))
}

/// A device made at the fake Metal through the client and recorded as a
/// managed machine: one the provider still has.
async fn live_machine(
    pool: &PgPool,
    fake: &shepherd_fakes::metal::FakeMetal,
) -> (shepherd::metal::MetalClient, uuid::Uuid) {
    let client = shepherd::metal::MetalClient::new(
        shepherd::metal::ClientConfig::new(
            fake.base_url(),
            fake.project_id(),
            shepherd::secret::ApiToken::new(METAL_TOKEN),
        ),
        shepherd::metal::ClientMetrics::default(),
    )
    .unwrap();
    let reservation = fake.reservations()[0].id;
    let key = client
        .ensure_ssh_key("console", "ssh-ed25519 AAAA console")
        .await
        .unwrap();
    let made = client
        .create_device(&shepherd::metal::CreateDevice {
            reservation,
            hostname: "shepherd-console".into(),
            operating_system: "ubuntu_20_04".into(),
            ssh_keys: vec![key],
            witness: shepherd::metal::Witness::new("console"),
            first: None,
        })
        .await
        .unwrap();
    append(
        pool,
        vec![assimilated(made.device.id, reservation, "shepherd-console")],
    )
    .await;
    (client, made.device.id)
}

/// Release from the console is judged as `shepherd machines release` is:
/// a machine the provider still has is refused (409, and why), since the
/// next pass would adopt it again under a new id; once it is gone at the
/// provider, the release is recorded with who.
#[sqlx::test(migrations = false)]
async fn a_release_from_the_console_asks_the_provider(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let (fake, provider) = metal_provider().await;
    let (client, made) = live_machine(&pool, &fake).await;
    let device = made.to_string();
    let server = Server::start_full(pool.clone(), Some("s3cret-operator"), Some(provider)).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let release = |machine: String| {
        let (http, url) = (http.clone(), format!("{}/actions/release", server.base));
        async move {
            post_form(
                &http,
                url,
                &[
                    ("authorization", "Bearer s3cret-operator"),
                    ("x-shepherd-operator", "bot"),
                ],
                &[("machine", &machine), ("reason", "gone?")],
            )
            .await
        }
    };
    let r = release(device.clone()).await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let said = r.text().await.unwrap();
    assert!(said.contains("still exists at the provider"), "{said}");
    let r = release("no-such-machine".into()).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let released: i64 = sqlx::query_scalar(
        "select count(*) from shepherd.events where event_type = 'machine_released'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(released, 0);
    client.delete_device(made).await.unwrap();
    let r = release(device.clone()).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let by: String = sqlx::query_scalar(
        "select body->>'by' from shepherd.events where event_type = 'machine_released'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(by, "console:bot");
    // A pass is queued to look again, so the discrepancy clears now; the
    // refusals queued none.
    let passes: Vec<String> = sqlx::query_scalar(
        "select convert_from(job, 'UTF8')::jsonb->>'requested_by' from apalis.jobs
         where job_type = 'reconcile'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(passes, vec!["console:bot (after a release)".to_string()]);
    server.stop().await;
}

/// Logging in starts a session that any worker's page accepts: the cookie
/// holds a random id, never the credential; the page says who is logged in
/// and shows the forms only to them; logging out on one worker ends the
/// session on every worker, and so does its expiry.
#[sqlx::test(migrations = false)]
async fn a_session_is_the_clusters_and_ends_everywhere(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    const CREDENTIAL: &str = "s3cret-operator-credential";
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let a = Server::start_with(pool.clone(), Some(CREDENTIAL)).await;
    let b = Server::start_with(pool.clone(), Some(CREDENTIAL)).await;
    // Anonymous: an invitation to log in, and no form.
    let (_, _, page) = a.get("/").await;
    assert!(page.contains("Log in to act"), "{page}");
    assert!(
        !page.contains("/actions/pause"),
        "a form for nobody: {page}"
    );

    let r = post_form(
        &http,
        format!("{}/login", a.base),
        &[("x-forwarded-proto", "https")],
        &[("who", "alice"), ("token", CREDENTIAL)],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let set: Vec<String> = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let session = set
        .iter()
        .find(|c| c.starts_with("shepherd_session="))
        .unwrap_or_else(|| panic!("no session cookie: {set:?}"));
    for flag in ["HttpOnly", "SameSite=Strict", "Secure", "Max-Age="] {
        assert!(session.contains(flag), "{flag} missing: {session}");
    }
    assert!(
        set.iter().all(|c| !c.contains(CREDENTIAL)),
        "the credential is in a cookie: {set:?}"
    );
    let cookie = session.split(';').next().unwrap().to_string();
    let stored: i64 = sqlx::query_scalar(
        "select count(*) from shepherd.console_sessions where id_hash = $1 or who <> 'alice'",
    )
    .bind(cookie.trim_start_matches("shepherd_session="))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(stored, 0, "the session id is stored as it is, not hashed");

    // The other worker knows the session: it says who, shows the forms,
    // and records the action under that name.
    let page = http
        .get(format!("{}/", b.base))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Logged in as"), "{page}");
    assert!(page.contains("alice"), "{page}");
    assert!(page.contains("/actions/pause"), "{page}");
    let r = post_form(
        &http,
        format!("{}/actions/pause", b.base),
        &[("cookie", &cookie)],
        &[("reason", "maintenance")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let by: String = sqlx::query_scalar(
        "select body->>'by' from shepherd.events where event_type = 'creations_paused'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(by, "console:alice");

    // Logged out on the first worker: the second refuses the cookie.
    let r = post_form(
        &http,
        format!("{}/logout", a.base),
        &[("cookie", &cookie)],
        &[],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(r.headers().get_all("set-cookie").iter().any(|v| {
        v.to_str()
            .unwrap()
            .starts_with("shepherd_session=; Path=/; Max-Age=0")
    }));
    let r = post_form(
        &http,
        format!("{}/actions/resume", b.base),
        &[("cookie", &cookie)],
        &[("reason", "done")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.text().await.unwrap().contains("ended or expired"));

    // A fresh session, expired: refused by every worker too.
    let r = post_form(
        &http,
        format!("{}/login", b.base),
        &[],
        &[("who", "bob"), ("token", CREDENTIAL)],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let set: Vec<String> = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let bob = set
        .iter()
        .find(|c| c.starts_with("shepherd_session="))
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert!(
        !set.iter().any(|c| c.contains("Secure")),
        "Secure over plain HTTP: {set:?}"
    );
    sqlx::query(
        "update shepherd.console_sessions set expires_at = now() - interval '1 second'
         where who = 'bob'",
    )
    .execute(&pool)
    .await
    .unwrap();
    for server in [&a, &b] {
        let r = post_form(
            &http,
            format!("{}/actions/resume", server.base),
            &[("cookie", &bob)],
            &[("reason", "done")],
        )
        .await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
    let resumed: i64 = sqlx::query_scalar(
        "select count(*) from shepherd.events where event_type = 'creations_resumed'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(resumed, 0, "an ended session acted");
    a.stop().await;
    b.stop().await;
}

/// A burst of wrong log-ins is throttled across the cluster and recorded:
/// after ten in a minute every log-in is 429, even with the right
/// credential, whichever worker it reaches.
#[sqlx::test(migrations = false)]
async fn a_burst_of_wrong_log_ins_is_throttled_and_recorded(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let a = Server::start_with(pool.clone(), Some("right")).await;
    let b = Server::start_with(pool.clone(), Some("right")).await;
    let mut statuses = vec![];
    for i in 0..40 {
        let server = if i % 2 == 0 { &a } else { &b };
        let r = post_form(
            &http,
            format!("{}/login", server.base),
            &[],
            &[("who", "mallory"), ("token", &format!("guess-{i}"))],
        )
        .await;
        statuses.push(r.status().as_u16());
    }
    assert_eq!(&statuses[..10], &[401; 10], "{statuses:?}");
    assert!(statuses[10..].iter().all(|s| *s == 429), "{statuses:?}");
    let r = post_form(
        &http,
        format!("{}/login", a.base),
        &[],
        &[("who", "alice"), ("token", "right")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.headers().get("retry-after").and_then(|v| v.to_str().ok()),
        Some("60")
    );
    let recorded: i64 = sqlx::query_scalar(
        "select count(*) from shepherd.console_login_failures where who = 'mallory'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(recorded, 10);
    let sessions: i64 = sqlx::query_scalar("select count(*) from shepherd.console_sessions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(sessions, 0);
    a.stop().await;
    b.stop().await;
}

/// Every page has the navigation; an address nothing serves and a method
/// a page does not take answer with a page that says so, not an empty
/// body; inputs carry labels.
#[sqlx::test(migrations = false)]
async fn every_answer_is_a_page_with_a_way_back(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let server = Server::start_with(pool.clone(), Some("credential")).await;
    for path in ["/", "/jobs", "/machines", "/events", "/charts", "/login"] {
        let (status, _, page) = server.get(path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(
            page.contains(r#"<nav class="top">"#) && page.contains(r#"href="/machines""#),
            "{path} has no navigation"
        );
        assert!(page.contains("prefers-color-scheme: dark"), "{path}");
    }
    let (status, _, page) = server.get("/no/such/page").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        page.contains("nothing is served at /no/such/page"),
        "{page}"
    );
    assert!(page.contains(r#"<nav class="top">"#), "{page}");
    let r = reqwest::Client::new()
        .delete(format!("{}/jobs", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    let page = r.text().await.unwrap();
    assert!(page.contains("/jobs does not take DELETE"), "{page}");
    let (_, _, page) = server.get("/machines").await;
    assert!(page.contains(r#"aria-label="Search machines""#), "{page}");
    // An address longer than any page takes: a page that says so.
    let (status, _, page) = server.get(&format!("/jobs?q={}", "x".repeat(9_000))).await;
    assert_eq!(status, StatusCode::URI_TOO_LONG);
    assert!(
        page.contains("the pages take at most 8192") && page.contains(r#"<nav class="top">"#),
        "{page}"
    );
    // A database gone away: a page too, and it says which part failed.
    pool.close().await;
    let (status, _, page) = server.get("/jobs").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        page.contains("the database is unavailable") && page.contains(r#"<nav class="top">"#),
        "{page}"
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
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
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
    let retried: i64 =
        sqlx::query_scalar("select count(*) from shepherd.events where event_type = 'job_retried'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(retried, 0);
    server.stop().await;
}

/// The overview updates itself in place: what happens appears without a
/// reload (the page object survives, so the scroll position does), and
/// not while text is selected, so an id being copied stays selected.
#[sqlx::test(migrations = false)]
async fn the_overview_updates_in_place_and_spares_a_selection(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let server = Server::start(pool.clone()).await;
    let browser = Browser::start().await;
    browser.goto(&format!("{}/", server.base)).await;
    // A mark on the window itself: a reload would lose it.
    browser
        .script("window.shepherdMark = 42; return null;")
        .await;
    let pause = |reason: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query("select shepherd.pause_creations($1, 'sql:test')")
                .bind(reason)
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    pause("first-pause-marker").await;
    let started = std::time::Instant::now();
    loop {
        let page = browser.text("body").await;
        if page.contains("first-pause-marker") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the page did not update itself: {page}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        browser.script("return window.shepherdMark;").await,
        serde_json::json!(42),
        "the page was reloaded, not updated in place"
    );
    // Text selected: the page holds still while it is.
    browser
        .script(
            "var r = document.createRange(); r.selectNodeContents(document.querySelector('h1'));
             var s = window.getSelection(); s.removeAllRanges(); s.addRange(r); return null;",
        )
        .await;
    sqlx::query("select shepherd.resume_creations('second-marker', 'sql:test')")
        .execute(&pool)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(7)).await;
    let held = browser.text("table.facts").await;
    assert!(
        held.contains("Creations paused"),
        "the page changed under a selection: {held}"
    );
    assert_eq!(
        browser
            .script("return window.getSelection().toString();")
            .await,
        serde_json::json!("shepherd")
    );
    // Selection let go: the page catches up.
    browser
        .script("window.getSelection().removeAllRanges(); return null;")
        .await;
    let started = std::time::Instant::now();
    loop {
        let facts = browser.text("table.facts").await;
        if facts.contains("Creations running") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the page did not catch up: {facts}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    browser.quit().await;
    server.stop().await;
}

/// Counts the log's events of one type; a query that fails fails the test.
async fn count_events(pool: &PgPool, event_type: &str) -> i64 {
    sqlx::query_scalar("select count(*) from shepherd.events where event_type = $1")
        .bind(event_type)
        .fetch_one(pool)
        .await
        .expect("counting events")
}

/// Logs the browser in as `who`.
async fn log_in(browser: &Browser, base: &str, who: &str, credential: &str) {
    browser.goto(&format!("{base}/login")).await;
    browser.type_text("input[name=who]", who).await;
    browser.type_text("input[name=token]", credential).await;
    browser.click_to_leave("form button").await;
    assert!(
        browser
            .text("body")
            .await
            .contains(&format!("Logged in as {who}")),
        "the log-in did not take"
    );
}

/// What a refused action's page says, after checking it is one: a title,
/// the reason in words, and a link back to the form's page.
async fn refusal(browser: &Browser, title: &str, back: &str) -> String {
    let shown = browser.script("return document.title;").await;
    assert_eq!(shown, serde_json::json!(title), "not a {title} page");
    let href = browser
        .script(
            "var a = document.querySelector('a.back'); return a ? a.getAttribute('href') : null;",
        )
        .await;
    assert_eq!(href, serde_json::json!(back), "the way back");
    browser.text("p.said").await
}

/// Every action and every refusal an operator can meet in the console,
/// walked in a browser as it happens to one: a form sent after the session
/// ended elsewhere, a release of a machine the provider still has, a form
/// naming a machine that is not managed, a reason over the limit, and forms
/// left open while another operator acted first (a pause, a penalty
/// cleared, a job that ran). Each answers a page that says why, with the
/// way back, and records nothing; then each action succeeds once it fits
/// (resume, a pass, a penalty cleared, ticked jobs cancelled with one
/// refused among them, the release) and says what it did.
#[sqlx::test(migrations = false)]
async fn every_action_and_refusal_in_a_browser(pool: PgPool) {
    const CREDENTIAL: &str = "refusals-credential";
    let fleet = seed(&pool).await;
    let (fake, provider) = metal_provider().await;
    let (client, live) = live_machine(&pool, &fake).await;
    let server = Server::start_full(pool.clone(), Some(CREDENTIAL), Some(provider)).await;
    let base = server.base.clone();
    let browser = Browser::start().await;
    let machine: uuid::Uuid = sqlx::query_scalar(
        "select machine_id from shepherd.managed_machines where provider_id = $1",
    )
    .bind(live.to_string())
    .fetch_one(&pool)
    .await
    .unwrap();
    let release_form = format!("form[action='/actions/release']:has(input[value='{machine}'])");

    // Without a session there are no forms at all.
    browser.goto(&format!("{base}/machines")).await;
    let forms = browser
        .script("return document.querySelectorAll(\"form[action^='/actions/']\").length;")
        .await;
    assert_eq!(forms, serde_json::json!(0), "forms without a session");

    // A form filled in while the session was ended on another worker.
    log_in(&browser, &base, "carol", CREDENTIAL).await;
    browser.goto(&format!("{base}/machines")).await;
    browser
        .type_text(
            &format!("{release_form} input[name=reason]"),
            "stale session",
        )
        .await;
    let ended =
        sqlx::query("update shepherd.console_sessions set ended_at = now() where who = 'carol'")
            .execute(&pool)
            .await
            .unwrap();
    assert_eq!(ended.rows_affected(), 1);
    browser
        .click_to_leave(&format!("{release_form} button"))
        .await;
    let said = refusal(&browser, "not logged in", "/machines").await;
    assert!(said.contains("your session has ended or expired"), "{said}");

    // A release of a machine whose device the provider still has.
    log_in(&browser, &base, "carol", CREDENTIAL).await;
    browser.goto(&format!("{base}/machines")).await;
    browser
        .type_text(&format!("{release_form} input[name=reason]"), "looks gone")
        .await;
    browser
        .click_to_leave(&format!("{release_form} button"))
        .await;
    let said = refusal(&browser, "refused", "/machines").await;
    assert!(
        said.contains(&format!("machine {live} still exists at the provider"))
            && said.contains("shepherd machines deprovision"),
        "{said}"
    );
    browser.screenshot("refused").await;
    browser.click_to_leave("a.back").await;
    assert!(browser.url().await.ends_with("/machines"));

    // A form that names a machine nobody manages (a page from before a
    // release, or an edited form).
    // (A hidden field's value is its attribute: the form is found by id.)
    browser
        .script(&format!(
            "var f = document.querySelector(\"{release_form}\"); f.id = 'edited';
             f.querySelector('input[name=machine]').value = 'no-such-machine';"
        ))
        .await;
    browser
        .type_text("form#edited input[name=reason]", "tidy up")
        .await;
    browser.click_to_leave("form#edited button").await;
    let said = refusal(&browser, "not found", "/machines").await;
    assert!(
        said.contains("no managed machine has id or device no-such-machine"),
        "{said}"
    );

    // A reason over the limit, which the field's maxlength would stop: the
    // server's own check answers, not the browser's.
    browser.goto(&format!("{base}/")).await;
    browser
        .script(
            "var f = document.querySelector(\"form[action='/actions/pause'] input[name=reason]\");
             f.removeAttribute('maxlength'); f.value = 'x'.repeat(1001);",
        )
        .await;
    browser
        .click_to_leave("form[action='/actions/pause'] button")
        .await;
    let said = refusal(&browser, "bad request", "/").await;
    assert!(
        said.contains("a reason is at most 1000 characters (this one has 1001)"),
        "{said}"
    );

    // A pause already done by another operator while this form was open.
    browser.goto(&format!("{base}/")).await;
    browser
        .type_text("form[action='/actions/pause'] input[name=reason]", "deploy")
        .await;
    sqlx::query("select shepherd.pause_creations('first', 'cli:dave')")
        .execute(&pool)
        .await
        .unwrap();
    browser
        .click_to_leave("form[action='/actions/pause'] button")
        .await;
    let said = refusal(&browser, "refused", "/").await;
    assert!(
        said.contains("creations are already paused; nothing was recorded"),
        "{said}"
    );

    // A penalty cleared by someone else first.
    let clear = format!(
        "form[action='/actions/clear-penalty']:has(input[value='{}'])",
        fleet.penalised
    );
    browser.goto(&format!("{base}/")).await;
    browser
        .type_text(&format!("{clear} input[name=reason]"), "capacity is back")
        .await;
    sqlx::query("select shepherd.clear_penalty($1, 'fixed', 'cli:dave')")
        .bind(fleet.penalised)
        .execute(&pool)
        .await
        .unwrap();
    browser.click_to_leave(&format!("{clear} button")).await;
    let said = refusal(&browser, "not found", "/").await;
    assert!(
        said.contains("has no penalty in force; nothing was cleared"),
        "{said}"
    );

    // A job cancelled from its page after a worker had run it.
    let job: String = sqlx::query_scalar(
        "select shepherd.push_job('assimilate', jsonb_build_object('device', gen_random_uuid(), 'manual', true))",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    browser.goto(&format!("{base}/jobs/{job}")).await;
    browser
        .type_text(
            "form[action='/actions/cancel-job'] input[name=reason]",
            "not needed",
        )
        .await;
    sqlx::query(
        "update apalis.jobs set status = 'Done', attempts = 1, done_at = now() where id = $1",
    )
    .bind(&job)
    .execute(&pool)
    .await
    .unwrap();
    browser
        .click_to_leave("form[action='/actions/cancel-job'] button")
        .await;
    let said = refusal(&browser, "refused", &format!("/jobs/{job}")).await;
    assert!(
        said.contains("only a job waiting for a worker is cancelled"),
        "{said}"
    );

    // None of that was recorded; what the other operator did was.
    for (event_type, expected) in [
        ("machine_released", 0),
        ("creations_paused", 1),
        ("penalty_cleared", 1),
        ("job_cancelled", 0),
    ] {
        assert_eq!(
            count_events(&pool, event_type).await,
            expected,
            "{event_type}"
        );
    }

    // The same actions, now that they fit: each says what it did.
    browser.goto(&format!("{base}/")).await;
    browser
        .type_text(
            "form[action='/actions/resume'] input[name=reason]",
            "deploy is over",
        )
        .await;
    browser
        .click_to_leave("form[action='/actions/resume'] button")
        .await;
    assert!(
        browser
            .text("p.done")
            .await
            .contains("Creations are running again.")
    );
    browser
        .click_to_leave("form[action='/actions/reconcile'] button")
        .await;
    assert!(
        browser
            .text("p.done")
            .await
            .contains("A reconcile pass is queued.")
    );
    let penalised = uuid::Uuid::new_v4();
    append(
        &pool,
        vec![
            shepherd::events::event::ReservationPenalised {
                reservation: penalised,
                until: chrono::Utc::now() + chrono::TimeDelta::hours(1),
                cause: CAUSE.into(),
                class: None,
                scope: None,
            }
            .into(),
        ],
    )
    .await;
    browser.goto(&format!("{base}/")).await;
    let clear = format!("form[action='/actions/clear-penalty']:has(input[value='{penalised}'])");
    browser
        .type_text(&format!("{clear} input[name=reason]"), "capacity is back")
        .await;
    browser.click_to_leave(&format!("{clear} button")).await;
    assert!(
        browser
            .text("p.done")
            .await
            .contains("The penalty is cleared.")
    );
    // Ticked together: two waiting jobs and the one that ran; each judged
    // alone.
    let mut waiting = vec![];
    for _ in 0..2 {
        waiting.push(
            sqlx::query_scalar::<_, String>(
                "select shepherd.push_job('assimilate', jsonb_build_object('device', gen_random_uuid(), 'manual', true))",
            )
            .fetch_one(&pool)
            .await
            .unwrap(),
        );
    }
    browser.goto(&format!("{base}/jobs?kind=assimilate")).await;
    for j in waiting.iter().chain([&job]) {
        browser
            .click(&format!("input[name=jobs][value='{j}']"))
            .await;
    }
    browser
        .type_text("input[name=reason][form=bulk]", "asked twice")
        .await;
    browser
        .click_to_leave("button[formaction='/actions/cancel-jobs']")
        .await;
    let said = browser.text("body").await;
    assert!(
        said.contains("2 of 3 cancelled, by console:carol: asked twice"),
        "{said}"
    );
    let refused = browser.text("ul.refused").await;
    assert!(
        refused.contains(&job) && refused.contains("only a job waiting"),
        "{refused}"
    );
    for (event_type, expected) in [
        ("creations_resumed", 1),
        ("penalty_cleared", 2),
        ("job_cancelled", 2),
    ] {
        assert_eq!(
            count_events(&pool, event_type).await,
            expected,
            "{event_type}"
        );
    }
    let passes: Vec<String> = sqlx::query_scalar(
        "select convert_from(job, 'UTF8')::jsonb->>'requested_by' from apalis.jobs
         where job_type = 'reconcile' and status = 'Pending'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(passes.contains(&"console:carol".to_string()), "{passes:?}");

    // Once the provider has let the machine go, the same release is done.
    client.delete_device(live).await.unwrap();
    browser.goto(&format!("{base}/machines")).await;
    browser
        .type_text(
            &format!("{release_form} input[name=reason]"),
            "gone at the provider",
        )
        .await;
    browser
        .click_to_leave(&format!("{release_form} button"))
        .await;
    assert!(browser.url().await.ends_with("/machines?done=release"));
    let by: String = sqlx::query_scalar(
        "select body->>'by' from shepherd.events where event_type = 'machine_released'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(by, "console:carol");
    browser.quit().await;
    server.stop().await;
}

/// A job's page lists every run of it, as its workers recorded them: the
/// queue keeps the last result only, so two failures on the database
/// before a success would otherwise leave no trace. A run without an end
/// is the one running now, or one whose worker died.
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
    sqlx::query(
        "insert into shepherd.job_runs (job_id, run, kind, worker, started_at, ended_at, outcome, result)
         values ($1, 1, 'reconcile', 'w-a', now() - interval '3 min', null, null, null),
                ($1, 2, 'reconcile', 'w-b', now() - interval '2 min', now() - interval '2 min' + interval '1.5 s',
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
            "no end recorded: its worker stopped mid-run",
            "w-b",
            "1.5 s",
            "error: error returned from database: connection refused",
            "0.3 s",
            "pass finished: managed 3",
        ],
    );
    assert!(said.windows(2).all(|w| w[0] < w[1]), "{table}");
    server.stop().await;
}
