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

/// Logs the browser in as `who`.
pub(super) async fn log_in(browser: &Browser, base: &str, who: &str, credential: &str) {
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
pub(super) async fn refusal(browser: &Browser, title: &str, back: &str) -> String {
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
