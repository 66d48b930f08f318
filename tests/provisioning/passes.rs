//! Passes queued behind a newer one coalesce, and each records who asked.

use super::*;

async fn queue_reconcile(w: &World) -> String {
    let mut tx = w.pool.begin().await.unwrap();
    let id = queue::push_reconcile(
        &mut tx,
        &shepherd::jobs::ReconcileArgs {
            requested_by: "test".into(),
        },
        None,
    )
    .await
    .unwrap()
    .unwrap();
    tx.commit().await.unwrap();
    id
}

#[sqlx::test(migrations = false)]
async fn passes_queued_behind_a_newer_one_coalesce(pool: PgPool) {
    let w = World::with(pool, 6, config(5, 5)).await;
    // Five passes queued while no worker ran (an outage, a burst of manual
    // requests).
    let mut jobs = Vec::new();
    for _ in 0..5 {
        let id = queue_reconcile(&w).await;
        jobs.push(id);
    }
    let calls = w.fake.total_calls();
    let first = shepherd::jobs::reconcile::reconcile(&w.ctx, &jobs[0])
        .await
        .unwrap();
    assert!(!first.coalesced && first.run.is_some());
    let listed = w.fake.total_calls() - calls;
    assert!(listed > 0);
    for id in &jobs[1..] {
        let out = shepherd::jobs::reconcile::reconcile(&w.ctx, id)
            .await
            .unwrap();
        assert!(out.coalesced, "{out:?}");
    }
    assert_eq!(
        w.fake.total_calls() - calls,
        listed,
        "a coalesced pass listed"
    );
    assert_eq!(w.events("reconcile_coalesced").await, 4);
    assert_eq!(w.events("reconcile_started").await, 1);
    // A pass queued after the last one started runs.
    let later = queue_reconcile(&w).await;
    let out = shepherd::jobs::reconcile::reconcile(&w.ctx, &later)
        .await
        .unwrap();
    assert!(!out.coalesced, "{out:?}");
}

/// A pass records who asked for it (the job's `requested_by`), so a manual
/// pass can be told from a scheduled one in the log.
#[sqlx::test(migrations = false)]
async fn a_pass_records_who_asked_for_it(pool: PgPool) {
    let w = World::with(pool, 3, config(5, 5)).await;
    shepherd::jobs::reconcile::reconcile_requested(&w.ctx, "manual-pass", Some("cli:alice"))
        .await
        .unwrap();
    let by: Option<String> = sqlx::query_scalar(
        "select body->>'requested_by' from shepherd.events where event_type = 'reconcile_started'",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert_eq!(by.as_deref(), Some("cli:alice"));
}
