//! The overview in a real browser as it updates itself in place.

use super::*;

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
