//! The console in a real browser (Chromium through chromedriver): an
//! operator's click-through, the page updating in place, and every action
//! and refusal as an operator meets it.

use super::*;

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
    // First of all, whether anything works: no worker runs here.
    let alive = browser.text("div.alive").await;
    assert!(alive.contains("NO WORKER RUNNING"), "{alive}");
    let alarm = browser.text("div.alarm.discrepancy").await;
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
        .type_text("form.machine input[name=reason]", "decommissioned")
        .await;
    browser
        .click_to_leave("form.machine button[formaction='/actions/release']")
        .await;
    assert!(browser.url().await.ends_with("/machines?done=release"));
    assert!(
        browser
            .text("p.done")
            .await
            .contains("The machine is released; a pass is queued to look again.")
    );
    let count = browser.text("p.count").await;
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
    let release_form = format!("form.machine:has(input[value='{machine}'])");

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
        .click_to_leave(&format!(
            "{release_form} button[formaction='/actions/release']"
        ))
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
        .click_to_leave(&format!(
            "{release_form} button[formaction='/actions/release']"
        ))
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
    browser
        .click_to_leave("form#edited button[formaction='/actions/release']")
        .await;
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
        .click_to_leave(&format!(
            "{release_form} button[formaction='/actions/release']"
        ))
        .await;
    assert!(browser.url().await.ends_with("/machines?done=release"));
    let by: String = recorded_by(&pool, "machine_released").await;
    assert_eq!(by, "console:carol");
    browser.quit().await;
    server.stop().await;
}

/// The fleet changed from the console, in a browser, each change judged by
/// the same SQL as the CLI's and recorded with who and why: a pool lowered
/// to 0 is refused without the confirmation and then lowered, the machine
/// limit set, deletions paused, a machine protected (and its deprovision
/// refused while it is), then unprotected and deprovisioned. Then the Jobs
/// and Machines tables at a phone's width: each row a block, each value
/// with its label, nothing wider than the screen.
#[sqlx::test(migrations = false)]
async fn an_operator_changes_the_fleet_from_the_console(pool: PgPool) {
    let fleet = seed(&pool).await;
    sqlx::query(
        "select shepherd.set_pool('web', 'c2-small-x86', 'DAL', 3, 'ubuntu_24_04_x64_lts', '{}',
                                  'first pool', 'cli:test')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let server =
        Server::start_with(pool.clone(), Some("fleet-browser-credential-0123456789")).await;
    let base = server.base.clone();
    let browser = Browser::start().await;
    log_in(
        &browser,
        &base,
        "erin",
        "fleet-browser-credential-0123456789",
    )
    .await;

    // The pool to 0 without the confirmation: refused in the CLI's words.
    let form = "form[action='/actions/pool-count']:has(input[value='web'])";
    browser.goto(&format!("{base}/")).await;
    browser
        .script(&format!(
            "document.querySelector(\"{form} input[name=count]\").value = '0'; return null;"
        ))
        .await;
    browser
        .type_text(&format!("{form} input[name=reason]"), "moving away")
        .await;
    browser.click_to_leave(&format!("{form} button")).await;
    let said = refusal(&browser, "bad request", "/").await;
    assert!(said.contains("confirm it"), "{said}");
    let count: i32 = sqlx::query_scalar("select count from shepherd.pools where name = 'web'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 3, "a refused change changed the pool");

    // Lowered to 1: no confirmation needed, as in the CLI.
    browser.goto(&format!("{base}/")).await;
    browser
        .script(&format!(
            "document.querySelector(\"{form} input[name=count]\").value = '1'; return null;"
        ))
        .await;
    browser
        .type_text(&format!("{form} input[name=reason]"), "quiet week")
        .await;
    browser.click_to_leave(&format!("{form} button")).await;
    assert!(
        browser
            .text("p.done")
            .await
            .contains("The pool's count is changed"),
        "no banner"
    );
    let (count, by): (i32, String) =
        sqlx::query_as("select count, updated_by from shepherd.pools where name = 'web'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((count, by.as_str()), (1, "console:erin"));
    // And to 0, confirmed.
    browser
        .script(&format!(
            "document.querySelector(\"{form} input[name=count]\").value = '0'; return null;"
        ))
        .await;
    browser
        .type_text(&format!("{form} input[name=reason]"), "closing web")
        .await;
    browser.click(&format!("{form} input[name=confirm]")).await;
    browser.click_to_leave(&format!("{form} button")).await;
    let confirmed: bool = sqlx::query_scalar(
        "select (body->>'confirmed')::boolean from shepherd.events
         where event_type = 'pool_changed' order by position desc limit 1",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(confirmed, "the confirmation was not recorded");

    // The machine limit.
    browser.goto(&format!("{base}/")).await;
    browser
        .script(
            "document.querySelector(\"form[action='/actions/limit'] input[name=value]\").value = '25'; return null;",
        )
        .await;
    browser
        .type_text(
            "form[action='/actions/limit'] input[name=reason]",
            "more room",
        )
        .await;
    browser
        .click_to_leave("form[action='/actions/limit'] button")
        .await;
    assert!(browser.text("p.done").await.contains("machine limit"));
    let limit: serde_json::Value = sqlx::query_scalar(
        "select value from shepherd.cluster_settings where key = 'max_machines'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(limit, serde_json::json!(25));

    // Deletions paused, and the page offers to resume them.
    browser
        .type_text(
            "form[action='/actions/pause-deletions'] input[name=reason]",
            "audit",
        )
        .await;
    browser
        .click_to_leave("form[action='/actions/pause-deletions'] button")
        .await;
    assert!(
        browser
            .text("p.done")
            .await
            .contains("Deletions are paused")
    );
    browser
        .find("form[action='/actions/resume-deletions'] button")
        .await;
    assert_eq!(count_events(&pool, "deletions_paused").await, 1);

    // The managed machine protected; its deprovision then refused.
    let row = format!(
        "form.machine:has(input[value='{}'])",
        fleet_machine(&pool).await
    );
    browser.goto(&format!("{base}/machines")).await;
    browser
        .type_text(&format!("{row} input[name=reason]"), "holds the primary")
        .await;
    browser
        .click_to_leave(&format!("{row} button[formaction='/actions/protect']"))
        .await;
    assert!(
        browser
            .text("p.done")
            .await
            .contains("The machine is protected")
    );
    assert!(browser.text("table").await.contains("protected"));
    browser
        .type_text(&format!("{row} input[name=reason]"), "retire it")
        .await;
    browser
        .click_to_leave(&format!("{row} button[formaction='/actions/deprovision']"))
        .await;
    let said = refusal(&browser, "bad request", "/machines").await;
    assert!(said.contains("is protected: unprotect it first"), "{said}");
    assert_eq!(count_events(&pool, "deletion_requested").await, 0);

    // Unprotected, then deprovisioned: the deletion job is queued.
    browser.goto(&format!("{base}/machines")).await;
    browser
        .type_text(&format!("{row} input[name=reason]"), "primary moved")
        .await;
    browser
        .click_to_leave(&format!("{row} button[formaction='/actions/unprotect']"))
        .await;
    browser
        .type_text(&format!("{row} input[name=reason]"), "retire it")
        .await;
    browser
        .click_to_leave(&format!("{row} button[formaction='/actions/deprovision']"))
        .await;
    assert!(
        browser
            .text("p.done")
            .await
            .contains("The machine is leaving")
    );
    assert!(browser.text("table").await.contains("leaving"));
    assert_eq!(
        recorded_by(&pool, "deletion_requested").await,
        "console:erin"
    );
    let jobs: i64 = sqlx::query_scalar(
        "select count(*) from apalis.jobs where job_type = 'delete_machine' and status = 'Pending'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(jobs, 1);
    // Asked twice: the second says it is leaving already.
    browser
        .type_text(&format!("{row} input[name=reason]"), "again")
        .await;
    browser
        .click_to_leave(&format!("{row} button[formaction='/actions/deprovision']"))
        .await;
    let said = refusal(&browser, "refused", "/machines").await;
    assert!(said.contains("is leaving already"), "{said}");
    for (event_type, expected) in [
        ("machine_protected", 1),
        ("machine_unprotected", 1),
        ("deletion_requested", 1),
        ("pool_changed", 2),
    ] {
        assert_eq!(
            count_events(&pool, event_type).await,
            expected,
            "{event_type}"
        );
    }

    // A creation given up on a penalised unit: not retried as a job, its
    // page offers the real remedies, and the penalty clears from there.
    let given_up = ended_job(
        &pool,
        "create_device",
        &serde_json::json!({
            "reservation": fleet.penalised,
            "request": uuid::Uuid::new_v4(),
            "attempt": 3,
        }),
        "Done",
        r#"{"Ok": "GivenUp { class: Permanent, cause: \"422: no capacity\" }"}"#,
    )
    .await;
    browser.goto(&format!("{base}/jobs/{given_up}")).await;
    let remedies = browser.text("body").await;
    assert!(
        remedies.contains("Remedies") && remedies.contains("not run again as a job"),
        "{remedies}"
    );
    let clear = format!(
        "form[action='/actions/clear-penalty']:has(input[value='{}'])",
        fleet.penalised
    );
    browser
        .type_text(&format!("{clear} input[name=reason]"), "stock is back")
        .await;
    browser.click_to_leave(&format!("{clear} button")).await;
    assert!(
        browser
            .text("p.done")
            .await
            .contains("The penalty is cleared.")
    );
    browser
        .find("form[action='/actions/reconcile'] button")
        .await;
    // Cleared, the page offers the pass alone.
    browser.goto(&format!("{base}/jobs/{given_up}")).await;
    assert!(browser.text("body").await.contains("Enqueue a pass"));
    let offered = browser
        .script(
            "return document.querySelectorAll(\"form[action='/actions/clear-penalty']\").length;",
        )
        .await;
    assert_eq!(offered, serde_json::json!(0));

    // A phone's width: rows stacked, each value labelled, nothing wider
    // than the screen.
    browser.phone(true).await;
    for (page, name) in [("/machines", "machines-phone"), ("/jobs", "jobs-phone")] {
        browser.goto(&format!("{base}{page}")).await;
        browser.find("table.stack td").await;
        let fits = browser
            .script(
                "var w = window.innerWidth;
                 var cells = Array.from(document.querySelectorAll('table.stack td'))
                   .filter(function (c) { return c.getClientRects().length > 0; });
                 return {
                   width: w,
                   page: document.documentElement.scrollWidth,
                   narrowest: Math.min.apply(null, cells.map(function (c) { return c.getBoundingClientRect().width; })),
                   label: getComputedStyle(cells[1], '::before').content,
                   header: document.querySelector('table.stack thead').getBoundingClientRect().height
                 };",
            )
            .await;
        let width = fits["width"].as_f64().unwrap();
        assert!(width <= 420.0, "not a phone's width: {fits}");
        assert!(
            fits["page"].as_f64().unwrap() <= width,
            "wider than the screen: {fits}"
        );
        assert!(
            fits["narrowest"].as_f64().unwrap() >= width * 0.8,
            "a cell narrower than the screen's row: {fits}"
        );
        assert!(
            fits["label"].as_str().unwrap().contains(": "),
            "a value without its label: {fits}"
        );
        assert!(
            fits["header"].as_f64().unwrap() <= 1.0,
            "the header row still shows: {fits}"
        );
        browser.screenshot(name).await;
    }
    browser.phone(false).await;
    browser.quit().await;
    server.stop().await;
}

/// The seeded fleet's managed machine, by its id.
async fn fleet_machine(pool: &PgPool) -> uuid::Uuid {
    sqlx::query_scalar("select machine_id from shepherd.managed_machines limit 1")
        .fetch_one(pool)
        .await
        .unwrap()
}
