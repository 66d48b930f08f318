//! The fleet changed from the console in a real browser: pool counts, the
//! limit, deletions paused, machines protected and deprovisioned, a given-up
//! creation's remedies, and the tables at a phone's width.

use super::browser::{log_in, refusal};
use super::*;

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
