//! Absence is not evidence (invariant 15): one 404, an answer about
//! another server or none's, a name beyond a pool's places, a witness our
//! log does not know, a count read before a wait — none of these deletes,
//! records a deletion, adopts or stops more than it concerns. Each test
//! makes the provider say the one thing, and fails if shepherd acts on it.

use super::*;
use shepherd_fakes::latitude::{FaultKind, FaultRule, Faults};

fn deletes(ran: &[Ran]) -> Vec<DeleteOutcome> {
    ran.iter()
        .filter_map(|r| match r {
            Ran::Delete(o) => Some(o.clone()),
            _ => None,
        })
        .collect()
}

async fn managed(w: &World, device: &str) -> bool {
    sqlx::query_scalar(
        "select exists(select 1 from shepherd.managed_machines where provider_id = $1)",
    )
    .bind(device)
    .fetch_one(&w.pool)
    .await
    .expect("managed_machines read")
}

/// Runs what is due: one deletion, which waits (for its hook, for a
/// confirmation, for a hold), and nothing else.
async fn one_wait(w: &World) {
    let ran = drain_rounds(w, 0).await;
    assert!(
        matches!(deletes(&ran)[..], [DeleteOutcome::Waiting { .. }]),
        "{ran:?}"
    );
}

/// The managed machine's id of `device`; fails if it is not managed.
async fn machine_id_of(w: &World, device: &str) -> uuid::Uuid {
    sqlx::query_scalar("select machine_id from shepherd.managed_machines where provider_id = $1")
        .bind(device)
        .fetch_one(&w.pool)
        .await
        .unwrap_or_else(|e| panic!("the machine id of {device}: {e}"))
}

/// An operator's deprovision, from SQL.
async fn deprovision(w: &World, device: &str) {
    sqlx::query("select shepherd.deprovision_machine($1, 'bad disk', 'test')")
        .bind(device)
        .execute(&w.pool)
        .await
        .expect("deprovision");
}

/// A failed machine whose replacement was requested and waits for its
/// leave hook (`ack`); the server it stands for.
async fn a_failed_machine_waiting_on_its_hook(w: &World) -> String {
    w.settle(3).await;
    let id = server_ids(w)[0].clone();
    setting(w, "max_unhealthy", "100%").await;
    setting(w, "leave_hook", "ack").await;
    setting(w, "failed_skip_leave", "false").await;
    assert!(w.fake.fail_server(&id));
    let pass = w.pass().await;
    assert_eq!(pass.deletions, vec![id.clone()], "{pass:?}");
    one_wait(w).await;
    id
}

#[sqlx::test(migrations = false)]
async fn one_404_at_the_last_look_deletes_nothing(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 3)]).await;
    let id = a_failed_machine_waiting_on_its_hook(&w).await;
    // It recovers while the hook waits, and the one look before the
    // DELETE is answered 404 (a CDN's, a lagging replica's).
    assert!(w.fake.set_status(&id, Some("on")));
    w.fake.set_faults(
        Faults::none()
            .with_rule(FaultRule::on(Call::GetServer, FaultKind::Status { status: 404 }).times(1)),
    );
    acknowledge(&w, &id).await;
    w.make_due().await;
    one_wait(&w).await;
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    assert!(managed(&w, &id).await);
    assert_eq!(w.events("machine_not_found").await.len(), 1);
    // Asked again a gap later, it reads as running: the replacement is
    // cancelled, and the server was never deleted.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    w.make_due().await;
    let ran = drain_rounds(&w, 0).await;
    let reason = cancelled_reason(&ran);
    assert!(reason.contains("no longer reads as failed"), "{reason}");
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    assert!(server_ids(&w).contains(&id));
    assert!(w.events("machine_deleted").await.is_empty());
    common::assert_rebuild_equals_live(&w.pool).await;
}

#[sqlx::test(migrations = false)]
async fn a_delete_answered_404_is_believed_only_when_confirmed(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    let id = server_ids(&w)[0].clone();
    deprovision(&w, &id).await;
    // The first DELETE is answered 404, and the server is still there.
    w.fake.set_faults(
        Faults::none().with_rule(
            FaultRule::on(Call::DestroyServer, FaultKind::Status { status: 404 }).times(1),
        ),
    );
    one_wait(&w).await;
    assert!(w.events("machine_deleted").await.is_empty());
    assert!(managed(&w, &id).await);
    assert!(server_ids(&w).contains(&id));
    // A gap later the look finds it: the DELETE goes out again, accepted.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    w.make_due().await;
    let ran = drain_rounds(&w, 0).await;
    assert!(
        matches!(
            deletes(&ran)[..],
            [DeleteOutcome::Deleted {
                already_gone: false
            }]
        ),
        "{ran:?}"
    );
    assert_eq!(w.fake.calls(Call::DestroyServer), 2);
    assert!(!server_ids(&w).contains(&id));
}

#[sqlx::test(migrations = false)]
async fn a_gone_server_is_recorded_gone_after_two_looks_and_a_listing(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    let id = server_ids(&w)[0].clone();
    deprovision(&w, &id).await;
    // Gone at the provider before the deletion runs (taken away by hand).
    assert!(w.fake.reclaim(&id));
    one_wait(&w).await;
    assert!(managed(&w, &id).await);
    // Too soon: a second 404 within the gap confirms nothing.
    w.make_due().await;
    one_wait(&w).await;
    assert!(managed(&w, &id).await);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    w.make_due().await;
    let ran = drain_rounds(&w, 0).await;
    assert!(
        matches!(
            deletes(&ran)[..],
            [DeleteOutcome::Deleted { already_gone: true }]
        ),
        "{ran:?}"
    );
    assert!(!managed(&w, &id).await);
    // No DELETE was ever sent for it: the looks settled it.
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    assert_eq!(w.events("machine_not_found").await.len(), 1);
}

/// The last look before a failed machine's DELETE is answered with a body
/// that proves nothing of it: the run decides nothing (neither a DELETE
/// nor a cancel), and the next, answered about this very server, goes on.
async fn an_unproven_answer_decides_nothing(db: PgPool, no_project: bool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 3)]).await;
    let id = a_failed_machine_waiting_on_its_hook(&w).await;
    acknowledge(&w, &id).await;
    w.fake.set_faults(
        Faults::none().with_rule(
            FaultRule::on(Call::GetServer, FaultKind::WrongBody { no_project }).times(1),
        ),
    );
    w.make_due().await;
    let ran = drain_rounds(&w, 0).await;
    let outcomes = deletes(&ran);
    assert!(
        matches!(outcomes[0], DeleteOutcome::Retrying { .. }),
        "{ran:?}"
    );
    // The run after it, answered about this very server in our project,
    // deleted it: one DELETE in all, and never a cancel.
    assert!(
        matches!(
            outcomes[1..],
            [DeleteOutcome::Deleted {
                already_gone: false
            }]
        ),
        "{ran:?}"
    );
    assert!(w.events("deletion_cancelled").await.is_empty());
    assert_eq!(w.fake.calls(Call::DestroyServer), 1);
    assert!(!server_ids(&w).contains(&id));
}

#[sqlx::test(migrations = false)]
async fn an_answer_about_another_server_proves_nothing(db: PgPool) {
    an_unproven_answer_decides_nothing(db, false).await;
}

#[sqlx::test(migrations = false)]
async fn an_answer_that_names_no_project_proves_nothing(db: PgPool) {
    an_unproven_answer_decides_nothing(db, true).await;
}

#[sqlx::test(migrations = false)]
async fn the_fence_counts_the_pool_again_at_the_write(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 3)]).await;
    w.settle(3).await;
    set_count(&w, "web", 2).await;
    let pass = w.pass().await;
    assert_eq!(pass.deletions.len(), 1, "{pass:?}");
    let surplus = pass.deletions[0].clone();
    // The surplus's DELETE is held by the key's write budget (a 429 that
    // asks for 2 s)...
    w.fake.set_faults(
        Faults::none().with_rule(
            FaultRule::on(
                Call::DestroyServer,
                FaultKind::RateLimited {
                    retry_after_secs: 2,
                },
            )
            .times(1),
        ),
    );
    let pool = w.pool.clone();
    let ctx = w.ctx.clone();
    let running = tokio::spawn(async move { common::world::drain_with(&pool, &ctx).await });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while w.fake.calls(Call::DestroyServer) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the surplus's DELETE never went out"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ... and meanwhile an operator deprovisions another machine of it.
    let other = server_ids(&w)
        .into_iter()
        .find(|id| *id != surplus)
        .expect("another server");
    deprovision(&w, &other).await;
    running.await.expect("the drain");
    // The surplus's DELETE never left after its 429: the pool would have
    // fallen to 1.
    let sent: Vec<u16> = w
        .fake
        .request_log()
        .iter()
        .filter(|r| r.call == Call::DestroyServer && r.path.ends_with(surplus.as_str()))
        .map(|r| r.status)
        .collect();
    assert_eq!(sent, vec![429]);
    assert!(server_ids(&w).contains(&surplus));
    // Every deletion run to its end: the operator's goes, the surplus is
    // cancelled, and the pool stands at its count.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        w.make_due().await;
        drain_rounds(&w, 0).await;
    }
    assert!(!server_ids(&w).contains(&other));
    assert!(server_ids(&w).contains(&surplus));
    assert_eq!(server_ids(&w).len(), 2);
    assert!(
        w.events("deletion_cancelled")
            .await
            .iter()
            .any(|e| e["provider_id"] == surplus.as_str()),
        "the surplus's deletion was not cancelled"
    );
}

#[sqlx::test(migrations = false)]
async fn a_name_beyond_a_pools_places_is_a_stranger_that_stops_nothing(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2), pool("api", "DAL", 2)]).await;
    w.settle(3).await;
    let project = w.fake.project().to_string();
    // Named for place 7 of a pool of 2 that never had more.
    let stray =
        w.fake
            .add_foreign_server(&project, "c2-small-x86", "DAL", "shepherd-web-7-abcdef12");
    let pass = w.pass().await;
    assert!(pass.refused.is_none(), "{pass:?}");
    assert!(pass.unknown_devices.is_empty(), "{pass:?}");
    // Lowering another pool still sheds.
    set_count(&w, "api", 1).await;
    let pass = w.pass().await;
    assert!(pass.refused.is_none(), "{pass:?}");
    assert_eq!(pass.deletions.len(), 1, "{pass:?}");
    drain_rounds(&w, 1).await;
    assert!(server_ids(&w).contains(&stray));
    assert!(!managed(&w, &stray).await);
}

#[sqlx::test(migrations = false)]
async fn assimilate_mode_adopts_no_stranger_and_no_unknown_witness(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    setting(&w, "assimilate", "true").await;
    let project = w.fake.project().to_string();
    // Another deployment's (a longer prefix), and one on a place of ours
    // with a witness no request of ours names.
    let staging = w.fake.add_foreign_server(
        &project,
        "c2-small-x86",
        "DAL",
        "shepherd-staging-web-0-abcdef12",
    );
    set_count(&w, "web", 3).await;
    let copied =
        w.fake
            .add_foreign_server(&project, "c2-small-x86", "DAL", "shepherd-web-2-deadbeef");
    let pass = w.pass().await;
    assert!(pass.adopted.is_empty(), "{pass:?}");
    assert_eq!(pass.unknown_devices, vec![copied.clone()], "{pass:?}");
    drain_rounds(&w, 1).await;
    assert!(!managed(&w, &staging).await);
    assert!(!managed(&w, &copied).await);
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
}

#[sqlx::test(migrations = false)]
async fn a_plan_wide_failure_replaces_no_pool_of_one(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 1), pool("api", "DAL", 1)]).await;
    w.settle(3).await;
    // Every server of the plan at the site reads failed at once.
    for id in server_ids(&w) {
        assert!(w.fake.fail_server(&id));
    }
    let pass = w.pass().await;
    assert!(pass.deletions.is_empty(), "{pass:?}");
    drain_rounds(&w, 1).await;
    assert!(w.events("deletion_requested").await.is_empty());
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    let held = w.events("deletions_held").await;
    assert!(
        held.iter().any(|e| e.to_string().contains("rounded down")),
        "{held:?}"
    );
}

#[sqlx::test(migrations = false)]
async fn protection_and_ready_once_follow_the_device_into_its_next_life(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    let ids = server_ids(&w);
    let kept = ids[1].clone();
    sqlx::query("select shepherd.protect_machine($1, 'holds the primary', 'test')")
        .bind(&kept)
        .execute(&w.pool)
        .await
        .expect("protect");
    // Released by an operator (the provider said it was gone; it came
    // back), then adopted again by its witness under a new machine id.
    let first_life = machine_id_of(&w, &kept).await;
    sqlx::query(
        "select shepherd.release_machine($1, 'gone, we thought', 'test', p_provider_says_gone => true)",
    )
    .bind(&kept)
    .execute(&w.pool)
    .await
    .expect("release");
    let pass = w.pass().await;
    assert_eq!(pass.adopted, vec![kept.clone()], "{pass:?}");
    drain_rounds(&w, 1).await;
    let second_life = machine_id_of(&w, &kept).await;
    assert_ne!(first_life, second_life);
    // Shown as it decides: the status overview counts it protected.
    let mut conn = w.pool.acquire().await.expect("a connection");
    let shown = shepherd::fleet::protected_devices(&mut conn)
        .await
        .expect("protected devices");
    drop(conn);
    assert!(shown.contains(&kept), "{shown:?}");
    // Lowered to 1: the protected device stays, whatever its new id, and
    // the other goes, although among equals what was adopted goes first.
    set_count(&w, "web", 1).await;
    let pass = w.pass().await;
    assert_eq!(pass.deletions, vec![ids[0].clone()], "{pass:?}");
    drain_rounds(&w, 1).await;
    assert_eq!(server_ids(&w), vec![kept.clone()]);
    // Ready in its first life: reinstalling now, it is not "never ready".
    setting(&w, "ready_deadline", "1s").await;
    setting(&w, "max_unhealthy", "100%").await;
    sqlx::query("select shepherd.protect_machine($1, 'lifted', 'test', false)")
        .bind(&kept)
        .execute(&w.pool)
        .await
        .expect("unprotect");
    assert!(w.fake.set_status(&kept, Some("deploying")));
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let pass = w.pass().await;
    assert!(pass.deletions.is_empty(), "{pass:?}");
    // The operator could lift the carried-over protection: one event.
    assert_eq!(w.events("machine_unprotected").await.len(), 1);
}

#[sqlx::test(migrations = false)]
async fn a_deletion_in_a_pool_held_by_a_discrepancy_waits(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 3)]).await;
    w.settle(3).await;
    setting(&w, "leave_hook", "ack").await;
    set_count(&w, "web", 2).await;
    let pass = w.pass().await;
    assert_eq!(pass.deletions.len(), 1, "{pass:?}");
    let surplus = pass.deletions[0].clone();
    drain_rounds(&w, 0).await;
    // A server nothing proves ours appears on a place of the pool: the
    // next pass holds the pool, and the surplus requested before waits.
    let project = w.fake.project().to_string();
    let stray =
        w.fake
            .add_foreign_server(&project, "c2-small-x86", "DAL", "shepherd-web-1-deadbeef");
    let pass = w.pass().await;
    assert_eq!(pass.unknown_devices, vec![stray.clone()], "{pass:?}");
    acknowledge(&w, &surplus).await;
    w.make_due().await;
    one_wait(&w).await;
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    // Explained (its maker took it away): the next pass holds nothing, and
    // the surplus goes.
    assert!(w.fake.reclaim(&stray));
    let pass = w.pass().await;
    assert!(pass.unknown_devices.is_empty(), "{pass:?}");
    w.make_due().await;
    let ran = drain_rounds(&w, 0).await;
    assert!(
        deletes(&ran)
            .iter()
            .any(|o| matches!(o, DeleteOutcome::Deleted { .. })),
        "{ran:?}"
    );
    assert!(!server_ids(&w).contains(&surplus));
}

#[sqlx::test(migrations = false)]
async fn a_managed_machine_on_no_place_is_reported_and_shed_within_the_guards(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    let project = w.fake.project().to_string();
    // Two servers named beyond any place of web, adopted by an
    // operator's hand: managed, billed, in no pool.
    let mut unplaced = vec![];
    for name in ["shepherd-web-7-abcdef12", "shepherd-web-8-abcdef12"] {
        let id = w
            .fake
            .add_foreign_server(&project, "c2-small-x86", "DAL", name);
        sqlx::query("select shepherd.enqueue_assimilate($1::text)")
            .bind(&id)
            .execute(&w.pool)
            .await
            .expect("enqueue_assimilate");
        unplaced.push(id);
    }
    drain_rounds(&w, 1).await;
    assert!(managed(&w, &unplaced[0]).await && managed(&w, &unplaced[1]).await);
    // One is protected: it stays, and the pass says so.
    sqlx::query("select shepherd.protect_machine($1, 'a hand-made builder', 'test')")
        .bind(&unplaced[1])
        .execute(&w.pool)
        .await
        .expect("protect");
    let pass = w.pass().await;
    assert!(pass.refused.is_none(), "{pass:?}");
    assert_eq!(pass.deletions, vec![unplaced[0].clone()], "{pass:?}");
    let requested = w.events("deletion_requested").await;
    assert_eq!(requested[0]["cause"], "unplaced", "{requested:?}");
    assert!(
        w.events("deletions_held")
            .await
            .iter()
            .any(|e| e["guard"] == "protected" && e["pool"] == "(no place)"),
        "the protected one was not reported"
    );
    drain_rounds(&w, 1).await;
    assert!(!server_ids(&w).contains(&unplaced[0]));
    assert!(server_ids(&w).contains(&unplaced[1]));
    // The pool's own machines were never touched.
    assert_eq!(server_ids(&w).len(), 3);
}
