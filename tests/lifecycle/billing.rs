//! Deletions that respect billing: a pool lowered below what its prepaid
//! machines hold keeps a monthly server to the end of its term, says so,
//! and deletes an hourly one instead; an operator's deprovision is the
//! confirmation that lets a prepaid one go sooner.

use super::*;

/// Moves a server's billing up at the fake, as `PATCH /servers/{id}` does.
async fn bill(w: &World, id: &str, billing: &str) {
    let answer = reqwest::Client::new()
        .patch(format!("{}/servers/{id}", w.fake.base_url()))
        .bearer_auth(common::latitude::KEY)
        .json(&serde_json::json!({"data": {"id": id, "type": "servers",
                                            "attributes": {"billing": billing}}}))
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_success(), "{}", answer.status());
}

#[sqlx::test(migrations = false)]
async fn a_prepaid_machine_is_kept_to_the_end_of_its_term(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 3)]).await;
    w.settle(3).await;
    let servers = w.fake.servers();
    assert_eq!(servers.len(), 3);
    let on = |place: u32| {
        servers
            .iter()
            .find(|s| place_of(&s.hostname) == place)
            .unwrap()
            .id
            .clone()
    };
    let (hourly, monthly, yearly) = (on(0), on(1), on(2));
    bill(&w, &monthly, "monthly").await;
    bill(&w, &yearly, "yearly").await;
    // Two beyond a count of 1: the hourly one goes; the monthly and the
    // yearly stay to the end of their terms, and the pass says why.
    set_count(&w, "web", 1, false).await.unwrap();
    round(&w).await;
    let mut left: Vec<String> = w.fake.servers().into_iter().map(|s| s.id).collect();
    left.sort();
    let mut kept = vec![monthly.clone(), yearly.clone()];
    kept.sort();
    assert_eq!(left, kept, "the hourly {hourly} should have gone");
    let held = w.events("deletions_held").await;
    let prepaid = held
        .iter()
        .find(|e| e["guard"] == "prepaid")
        .unwrap_or_else(|| panic!("{held:?}"));
    assert_eq!(prepaid["held"], 1, "{prepaid}");
    let said = prepaid["message"].as_str().unwrap();
    assert!(
        said.contains("paid for to the end of monthly or yearly terms")
            && said.contains("deprovision"),
        "{said}"
    );
    // The yearly one is held (the monthly one is the one the count keeps),
    // valued at the fake's 1980 USD a year: nearly the whole year remains.
    let worth: f64 = said
        .split("worth about ")
        .nth(1)
        .and_then(|w| w.split(' ').next())
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert!((1975.0..=1980.0).contains(&worth), "{said}");
    // The next pass keeps it still.
    round(&w).await;
    assert!(w.fake.servers().iter().any(|s| s.id == monthly));
    // The operator's deprovision is the confirmation: it goes.
    sqlx::query("select shepherd.deprovision_machine($1, 'paid, but not needed', 'test')")
        .bind(&monthly)
        .execute(&w.pool)
        .await
        .unwrap();
    drain_with(&w.pool, &w.ctx).await;
    round(&w).await;
    assert!(!w.fake.servers().iter().any(|s| s.id == monthly));
    assert!(w.fake.servers().iter().any(|s| s.id == yearly));
    assert_consistent(&w).await;
}
