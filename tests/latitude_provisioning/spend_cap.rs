//! The spend cap on every path that creates: a pass, a manual creation as
//! the CLI admits it, and a job pushed from SQL. With the cap at the price
//! of three servers, a pool of six holds at three and says why; lifted, it
//! fills. Without a price from the provider, nothing is created under a cap.

use super::*;
use shepherd::jobs::queue;
use shepherd_fakes::latitude::Weather;

async fn set_cap(w: &World, value: &str) {
    sqlx::query("select shepherd.change_setting('spend_cap', $1, 'the budget', 'cli:test')")
        .bind(value)
        .execute(&w.pool)
        .await
        .unwrap();
}

/// A manual creation of `place` as `shepherd enqueue create-device` admits
/// it; its refusal, if any.
async fn admit_by_hand(w: &World, place: &str) -> Option<queue::Refusal> {
    let unit = w.ctx.provider.unit_by_label(place).unwrap();
    let units = [queue::UnitFacts {
        unit,
        scope: w.ctx.provider.unit_scope(unit),
        place: Some(place.into()),
        hint: None,
    }];
    let mut tx = w.pool.begin().await.unwrap();
    let (_, refused) = queue::admit(
        &mut tx,
        &[(unit, uuid::Uuid::new_v4())],
        &queue::Admission {
            manual: true,
            push_jobs: true,
            requested_by: Some("cli:test".into()),
            units: &units,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    refused.into_iter().next().map(|(_, why)| why)
}

#[sqlx::test(migrations = false)]
async fn a_spend_cap_holds_every_path_at_what_it_pays_for(db: PgPool) {
    let w = World::new(db, 20, vec![pool("web", "DAL", 6)]).await;
    // The fake's c2-small-x86 costs 0.33 USD an hour: three servers' worth.
    set_cap(&w, "0.99").await;
    let first = w.pass().await;
    assert_eq!(first.enqueued.len(), 3, "{first:?}");
    drain_with(&w.pool, &w.ctx).await;
    assert_eq!(w.fake.servers().len(), 3);
    let again = w.pass().await;
    assert!(again.enqueued.is_empty(), "{again:?}");
    drain_with(&w.pool, &w.ctx).await;

    // By hand, as the CLI admits it: refused, saying why.
    let refused = admit_by_hand(&w, "web/4").await;
    let Some(queue::Refusal::SpendCap(held)) = &refused else {
        panic!("a manual creation passed the cap: {refused:?}");
    };
    let said = held.to_string();
    assert!(
        said.starts_with("held: spend cap")
            && said.contains("0.99 USD/h")
            && said.contains("0.33 USD/h"),
        "{said}"
    );
    // From SQL: the job's own admission refuses it before any call.
    let unit = w.ctx.provider.unit_by_label("web/5").unwrap();
    sqlx::query("select shepherd.enqueue_create_device($1)")
        .bind(unit)
        .execute(&w.pool)
        .await
        .unwrap();
    drain_with(&w.pool, &w.ctx).await;
    let refusals = w.events("creation_refused").await;
    assert!(
        refusals.iter().any(|e| e["reason"]
            .as_str()
            .unwrap_or("")
            .contains("held: spend cap")),
        "{refusals:?}"
    );
    assert_eq!(w.fake.servers().len(), 3, "a path passed the spend cap");

    // What status and the console read: held, and why.
    let o = shepherd::fleet::overview(&w.pool).await.unwrap();
    let cap = o.spend_cap.expect("the cap in the overview");
    assert_eq!(cap.currency.as_deref(), Some("USD"));
    assert!((cap.spent - 0.99).abs() < 1e-9, "{cap:?}");
    assert!(
        cap.held
            .as_deref()
            .unwrap_or("")
            .contains("held: spend cap"),
        "{cap:?}"
    );
    let priced = o.pools.expect("the survey").fleet_cost();
    assert!((priced[0].per_hour - 0.99).abs() < 1e-9, "{priced:?}");

    // Lifted: the pool fills.
    set_cap(&w, "none").await;
    let lifted = w.pass().await;
    assert_eq!(lifted.enqueued.len(), 3, "{lifted:?}");
    drain_with(&w.pool, &w.ctx).await;
    assert_eq!(w.fake.servers().len(), 6);
    let o = shepherd::fleet::overview(&w.pool).await.unwrap();
    assert!(o.spend_cap.is_none());
    w.assert_invariants().await;
}

#[sqlx::test(migrations = false)]
async fn without_a_price_nothing_is_created_under_a_cap(db: PgPool) {
    let w = World::new(db, 20, vec![pool("web", "DAL", 2)]).await;
    w.fake.set_weather(Weather {
        plan_prices: false,
        ..Weather::default()
    });
    set_cap(&w, "100").await;
    let pass = w.pass().await;
    assert!(
        pass.enqueued.is_empty(),
        "created without a price: {pass:?}"
    );
    let o = shepherd::fleet::overview(&w.pool).await.unwrap();
    let held = o.spend_cap.and_then(|c| c.held).unwrap_or_default();
    assert!(held.contains("pool web has no price"), "{held}");
    // Without a cap, no price is needed.
    set_cap(&w, "none").await;
    let pass = w.pass().await;
    assert_eq!(pass.enqueued.len(), 2, "{pass:?}");
}

/// A pass at the limit reads no stock and records no price: the cap goes
/// on counting at the last prices read, and the fleet's cost still shows,
/// rather than everything reading as unpriced (which would hold every
/// creation, and silence the cost and its alert).
#[sqlx::test(migrations = false)]
async fn the_last_known_price_stands_through_passes_that_read_none(db: PgPool) {
    let w = World::new(db, 2, vec![pool("web", "DAL", 4)]).await;
    set_cap(&w, "10").await;
    let first = w.pass().await;
    assert_eq!(first.enqueued.len(), 2, "{first:?}");
    drain_with(&w.pool, &w.ctx).await;
    let at_limit = w.pass().await;
    assert!(at_limit.at_limit, "{at_limit:?}");
    let last = w.last_pools().await;
    assert!(
        last[0].price.is_none(),
        "a pass at the limit read a price: {last:?}"
    );
    let o = shepherd::fleet::overview(&w.pool).await.unwrap();
    let cost = o.pools.expect("the survey").fleet_cost();
    assert!((cost[0].per_hour - 0.66).abs() < 1e-9, "{cost:?}");
    let cap = o.spend_cap.expect("the cap");
    assert!((cap.spent - 0.66).abs() < 1e-9, "{cap:?}");
    // Room again: a creation by hand is judged at the last price.
    sqlx::query("select shepherd.change_setting('max_machines', '10', 'room', 'cli:test')")
        .execute(&w.pool)
        .await
        .unwrap();
    assert_eq!(admit_by_hand(&w, "web/2").await, None);
}
