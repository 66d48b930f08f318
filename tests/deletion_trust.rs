//! Deletion judged by what a living provider really reports, one test per
//! way shepherd once deleted what it must not: a machine that ran and is
//! now off, in rescue, erasing, unknown or named by a word never seen is
//! kept; "never ready" counts from our own creation; every deletion is
//! checked again right before its DELETE (a machine ready now, a surplus
//! the provider no longer lists); a creation the pools no longer want is
//! not sent; "ours" means ours for the place. The leave hook's promise is
//! tests/leave_hook.rs. Against the fake Latitude over HTTP and a real
//! Postgres; jobs claimed from the real queue.

#[path = "deletion_trust/absence.rs"]
mod absence;
mod common;
#[path = "deletion_trust/restored.rs"]
mod restored;
#[path = "deletion_trust/stalled.rs"]
mod stalled;

use common::latitude::{World, create_lost_then_hidden, pool};
use common::lifecycle::*;
use common::world::Ran;
use shepherd::jobs::create_device::CreateOutcome;
use shepherd::jobs::delete_machine::DeleteOutcome;
use shepherd::jobs::reconcile::reconcile;
use shepherd_fakes::latitude::Call;
use sqlx::PgPool;
use std::time::Duration;

#[sqlx::test(migrations = false)]
async fn a_machine_that_ran_is_never_deleted_for_its_status(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 6)]).await;
    w.settle(3).await;
    let ids = server_ids(&w);
    assert_eq!(ids.len(), 6);
    // Every one of them was seen running once.
    assert_eq!(w.events("machine_ready").await.len(), 6);
    setting(&w, "ready_deadline", "1s").await;
    setting(&w, "max_unhealthy", "100%").await;
    // Months later: powered off by its owner, in rescue while someone
    // debugs it, erasing and reinstalling, a status the provider cannot
    // tell, and a word no document lists.
    for (id, status) in ids.iter().zip([
        "off",
        "rescue_mode",
        "disk_erasing",
        "deploying",
        "unknown",
        "hibernating_for_the_winter",
    ]) {
        assert!(w.fake.set_status(id, Some(status)));
        assert!(w.fake.age_server(id, Duration::from_secs(90 * 86_400)));
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    for _ in 0..3 {
        let pass = w.pass().await;
        assert!(pass.refused.is_none(), "{pass:?}");
        assert!(pass.deletions.is_empty(), "{pass:?}");
        drain_rounds(&w, 1).await;
    }
    assert!(w.events("deletion_requested").await.is_empty());
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    assert_eq!(server_ids(&w), ids);
    assert_eq!(w.count("select count(*) from shepherd.sinbin").await, 0);
    // Reported: all but the reinstalling one are dormant, counted with
    // their pool for the page, `shepherd status` and the metric.
    assert_eq!(w.last_pools().await[0].dormant, 5);
    // The statuses are seen: the pages show them beside each machine.
    let statuses: Vec<String> =
        sqlx::query_scalar("select status from shepherd.machine_status order by status")
            .fetch_all(&w.pool)
            .await
            .unwrap();
    assert!(
        statuses.contains(&"rescue_mode".to_string()),
        "{statuses:?}"
    );
}

/// A status word carrying a NUL, which Postgres refuses in text and in
/// JSON, stops no pass (it stopped every one): the word is kept cleaned,
/// and the machine judged as by any word never seen.
#[sqlx::test(migrations = false)]
async fn a_status_word_with_a_nul_stops_no_pass(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 1)]).await;
    w.settle(3).await;
    let id = server_ids(&w)[0].clone();
    assert!(w.fake.set_status(&id, Some("on\u{0}line")));
    let pass = reconcile(&w.ctx, "test-reconcile")
        .await
        .expect("a pass over a status with a NUL");
    assert!(pass.refused.is_none(), "{pass:?}");
    assert!(pass.deletions.is_empty(), "{pass:?}");
    let status: Option<String> =
        sqlx::query_scalar("select status from shepherd.machine_status where provider_id = $1")
            .bind(&id)
            .fetch_one(&w.pool)
            .await
            .expect("the machine's status row");
    assert_eq!(status.as_deref(), Some("on\u{FFFD}line"));
}

#[sqlx::test(migrations = false)]
async fn never_ready_counts_from_our_creation_and_is_checked_again_before_the_delete(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 1)]).await;
    // One pass and its jobs: the server is made and assimilated, and no
    // pass has listed it yet.
    w.pass().await;
    drain_rounds(&w, 1).await;
    let ids = server_ids(&w);
    assert_eq!(ids.len(), 1);
    let id = &ids[0];
    // It never leaves deploying; the provider's clock says it was made
    // long ago, ours that we made it a moment ago.
    assert!(w.fake.set_status(id, Some("deploying")));
    assert!(w.fake.age_server(id, Duration::from_secs(86_400)));
    setting(&w, "ready_deadline", "3s").await;
    // A pool of one: max_unhealthy rounds down, so only 100 % lets its one
    // machine be replaced.
    setting(&w, "max_unhealthy", "100%").await;
    let pass = w.pass().await;
    assert!(pass.deletions.is_empty(), "{pass:?}");
    assert!(w.events("machine_ready").await.is_empty());
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    // Past the deadline counted from our creation: it is to be replaced.
    setting(&w, "leave_hook", "ack").await;
    let pass = w.pass().await;
    assert_eq!(pass.deletions, vec![id.clone()], "{pass:?}");
    let requested = w.events("deletion_requested").await;
    assert_eq!(requested[0]["cause"], "not_ready");
    // While its leave hook waits, the server comes up after all.
    let ran = drain_rounds(&w, 0).await;
    assert!(
        matches!(ran[..], [Ran::Delete(DeleteOutcome::Waiting { .. })]),
        "{ran:?}"
    );
    assert!(w.fake.set_status(id, None));
    acknowledge(&w, id).await;
    w.make_due().await;
    let ran = drain_rounds(&w, 0).await;
    let reason = cancelled_reason(&ran);
    assert!(reason.contains("no longer deploying"), "{reason}");
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    assert_eq!(server_ids(&w), ids);
    assert_eq!(w.events("deletion_cancelled").await.len(), 1);
    assert_eq!(w.count("select count(*) from shepherd.sinbin").await, 0);
    // The next pass sees it ready: from then on it was ready once.
    w.pass().await;
    assert_eq!(w.events("machine_ready").await.len(), 1);
    common::assert_rebuild_equals_live(&w.pool).await;
}

#[sqlx::test(migrations = false)]
async fn a_failed_machine_that_recovered_is_kept(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 3)]).await;
    w.settle(3).await;
    let ids = server_ids(&w);
    // Deletions paused: the one the pass requests waits.
    pause_deletions(&w, true).await;
    assert!(w.fake.fail_server(&ids[0]));
    setting(&w, "max_unhealthy", "100%").await;
    let pass = w.pass().await;
    assert!(pass.deletions.is_empty(), "{pass:?}");
    pause_deletions(&w, false).await;
    let pass = w.pass().await;
    assert_eq!(pass.deletions, vec![ids[0].clone()]);
    pause_deletions(&w, true).await;
    let ran = drain_rounds(&w, 0).await;
    assert!(
        matches!(ran[..], [Ran::Delete(DeleteOutcome::Waiting { .. })]),
        "{ran:?}"
    );
    // A reinstall brings it back before deletions resume.
    assert!(w.fake.set_status(&ids[0], Some("on")));
    pause_deletions(&w, false).await;
    w.make_due().await;
    let ran = drain_rounds(&w, 0).await;
    assert!(
        ran.iter()
            .any(|r| matches!(r, Ran::Delete(DeleteOutcome::Cancelled { .. }))),
        "{ran:?}"
    );
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
}

#[sqlx::test(migrations = false)]
async fn a_surplus_is_counted_against_what_the_provider_lists_now(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 3)]).await;
    w.settle(3).await;
    setting(&w, "leave_hook", "ack").await;
    set_count(&w, "web", 2).await;
    let pass = w.pass().await;
    assert_eq!(pass.deletions.len(), 1);
    let leaving = pass.deletions[0].clone();
    drain_rounds(&w, 0).await;
    // Meanwhile the provider takes another server away, and a pass finds
    // it missing: one "not found", which makes it no proof of anything
    // yet, and no longer counted as standing either.
    let other = server_ids(&w)
        .into_iter()
        .find(|id| *id != leaving)
        .unwrap();
    assert!(w.fake.reclaim(&other));
    let pass = w.pass().await;
    assert_eq!(pass.missing_devices, vec![other.clone()], "{pass:?}");
    acknowledge(&w, &leaving).await;
    w.make_due().await;
    let ran = drain_rounds(&w, 0).await;
    let reason = cancelled_reason(&ran);
    assert!(reason.contains("1 other machines of it stand"), "{reason}");
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    assert!(server_ids(&w).contains(&leaving));
}

#[sqlx::test(migrations = false)]
async fn a_pool_lowered_while_its_creations_wait_sends_no_create(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 1)]).await;
    w.settle(3).await;
    let creates = w.fake.calls(Call::CreateServer);
    set_count(&w, "web", 3).await;
    let pass = w.pass().await;
    assert_eq!(pass.enqueued.len(), 2, "{pass:?}");
    // Lowered again before the creations ran.
    set_count(&w, "web", 1).await;
    let ran = drain_rounds(&w, 1).await;
    let given_up: Vec<String> = ran
        .iter()
        .filter_map(|r| match r {
            Ran::Create(CreateOutcome::GivenUp { cause, .. }) => Some(cause.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(given_up.len(), 2, "{ran:?}");
    assert!(
        given_up.iter().all(|c| c.contains("lowered to 1")),
        "{given_up:?}"
    );
    assert_eq!(w.fake.calls(Call::CreateServer), creates);
    assert_eq!(w.fake.servers().len(), 1);
    assert_eq!(w.count("select count(*) from shepherd.sinbin").await, 0);
    assert_eq!(w.count("select count(*) from shepherd.in_flight").await, 0);

    // Raised and lowered again with a pass in between: the pass itself
    // ends the creations nobody tried yet, so they hold no room meanwhile,
    // and their jobs send nothing.
    set_count(&w, "web", 3).await;
    let pass = w.pass().await;
    assert_eq!(pass.enqueued.len(), 2, "{pass:?}");
    set_count(&w, "web", 1).await;
    w.pass().await;
    assert_eq!(w.count("select count(*) from shepherd.in_flight").await, 0);
    let ended = w.events("creation_given_up").await;
    assert_eq!(
        ended
            .iter()
            .filter(|e| e["message"]
                .as_str()
                .is_some_and(|m| m.contains("before it was sent")))
            .count(),
        2,
        "{ended:?}"
    );
    drain_rounds(&w, 1).await;
    assert_eq!(w.fake.calls(Call::CreateServer), creates);
    assert_eq!(w.fake.servers().len(), 1);
    common::assert_rebuild_equals_live(&w.pool).await;
}

#[sqlx::test(migrations = false)]
async fn an_operators_deprovision_stands_and_a_release_ends_it(db: PgPool) {
    use shepherd::events::event::DeletionRequested;
    use shepherd::events::{NewEvent, record};
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    setting(&w, "leave_hook", "ack").await;
    let device = server_ids(&w)[0].clone();
    sqlx::query("select shepherd.deprovision_machine($1, 'retire it', 'ops')")
        .bind(&device)
        .execute(&w.pool)
        .await
        .unwrap();
    let operator: String =
        sqlx::query_scalar("select request from shepherd.pending_deletions where provider_id = $1")
            .bind(&device)
            .fetch_one(&w.pool)
            .await
            .unwrap();
    // A pass that read the fleet before the deprovision committed asks
    // for the same machine: the operator's request stands.
    let (machine_id, unit): (uuid::Uuid, Option<uuid::Uuid>) = sqlx::query_as(
        "select machine_id, reservation_id from shepherd.managed_machines where provider_id = $1",
    )
    .bind(&device)
    .fetch_one(&w.pool)
    .await
    .unwrap();
    let mut tx = w.pool.begin().await.unwrap();
    record(
        &mut tx,
        vec![NewEvent::new(DeletionRequested {
            machine_id,
            provider_id: device.clone(),
            reservation: unit,
            pool: Some("web".into()),
            request: uuid::Uuid::new_v4(),
            cause: "surplus".into(),
            message: "a late pass".into(),
            by: "reconcile".into(),
        })],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let (request, by): (String, String) = sqlx::query_as(
        "select request, requested_by from shepherd.pending_deletions where provider_id = $1",
    )
    .bind(&device)
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert_eq!((request.as_str(), by.as_str()), (operator.as_str(), "ops"));
    common::assert_rebuild_equals_live(&w.pool).await;
    // The provider loses the server; the operator releases it from SQL
    // (having checked): its pending deletion ends with it.
    assert!(w.fake.reclaim(&device));
    sqlx::query(
        "select shepherd.release_machine($1, 'gone at the provider', 'ops',
                                         p_provider_says_gone => true)",
    )
    .bind(&device)
    .execute(&w.pool)
    .await
    .unwrap();
    assert_eq!(
        w.count("select count(*) from shepherd.pending_deletions")
            .await,
        0
    );
    common::assert_rebuild_equals_live(&w.pool).await;
}

/// The hostname of our server on `place` of pool web.
fn hostname_on(w: &World, place: u32) -> String {
    w.fake
        .servers()
        .into_iter()
        .map(|s| s.hostname)
        .find(|h| h.starts_with(&format!("shepherd-web-{place}-")))
        .unwrap_or_else(|| panic!("no server on web/{place}"))
}

#[sqlx::test(migrations = false)]
async fn a_copied_hostname_is_not_ours_and_holds_only_its_pool(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2), pool("api", "DAL", 1)]).await;
    w.settle(3).await;
    let ids = server_ids(&w);
    // Someone makes a server by hand in the project with the name of
    // ours on web/0: its witness names our request for that very place,
    // but that request made another machine, and every create it sent
    // was answered.
    let copied = hostname_on(&w, 0);
    let project = w.fake.project().to_string();
    let copy = w
        .fake
        .add_foreign_server(&project, "c2-small-x86", "DAL", &copied);
    // web is lowered and api raised meanwhile.
    set_count(&w, "web", 1).await;
    sqlx::query(
        "select shepherd.set_pool('api', 'c2-small-x86', 'DAL', 2, 'ubuntu_24_04_x64_lts',
                                  '{}', 'the test raises it', 'test', false)",
    )
    .execute(&w.pool)
    .await
    .unwrap();
    let pass = w.pass().await;
    assert!(pass.adopted.is_empty(), "{pass:?}");
    assert_eq!(pass.unknown_devices, vec![copy.clone()]);
    // Only web is held: nothing is deleted in it; api goes on.
    assert!(pass.refused.is_none(), "{pass:?}");
    assert!(pass.deletions.is_empty(), "{pass:?}");
    assert_eq!(pass.enqueued.len(), 1, "{pass:?}");
    let held = w.events("deletions_held").await;
    assert!(
        held.iter()
            .any(|h| h["pool"] == "web" && h["guard"] == "discrepancy"),
        "{held:?}"
    );
    drain_rounds(&w, 1).await;
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    assert!(server_ids(&w).contains(&copy));
    let api = w
        .fake
        .servers()
        .into_iter()
        .filter(|s| s.hostname.starts_with("shepherd-api-"))
        .count();
    assert_eq!(api, 2);
    let managed: Vec<String> = sqlx::query_scalar(
        "select provider_id from shepherd.managed_machines where hostname like 'shepherd-web-%'
         order by 1",
    )
    .fetch_all(&w.pool)
    .await
    .unwrap();
    let mut expected: Vec<String> = ids
        .iter()
        .filter(|id| {
            w.fake
                .servers()
                .iter()
                .any(|s| s.id == **id && s.hostname.starts_with("shepherd-web-"))
        })
        .cloned()
        .collect();
    expected.sort();
    assert_eq!(managed, expected);
    // Explained (deleted at the provider by whoever made it): web is
    // lowered as asked.
    assert!(w.fake.reclaim(&copy));
    let pass = w.pass().await;
    assert!(pass.unknown_devices.is_empty(), "{pass:?}");
    assert_eq!(pass.deletions.len(), 1, "{pass:?}");
}

#[sqlx::test(migrations = false)]
async fn a_longer_prefix_of_another_deployment_stops_nothing(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 1)]).await;
    w.settle(3).await;
    // Another deployment's prefix extends ours: `shepherd-staging-`.
    let project = w.fake.project().to_string();
    let theirs = w.fake.add_foreign_server(
        &project,
        "c2-small-x86",
        "DAL",
        "shepherd-staging-web-0-abcdef12",
    );
    set_count(&w, "web", 2).await;
    let pass = w.pass().await;
    assert!(pass.refused.is_none(), "{pass:?}");
    assert_eq!(pass.enqueued.len(), 1, "{pass:?}");
    drain_rounds(&w, 1).await;
    set_count(&w, "web", 1).await;
    let pass = w.pass().await;
    assert!(pass.refused.is_none(), "{pass:?}");
    assert_eq!(pass.deletions.len(), 1, "{pass:?}");
    assert_ne!(pass.deletions[0], theirs);
    drain_rounds(&w, 1).await;
    assert!(server_ids(&w).contains(&theirs));
    let managed = w
        .count("select count(*) from shepherd.managed_machines")
        .await;
    assert_eq!(managed, 1);
}

#[sqlx::test(migrations = false)]
async fn an_adopted_machine_without_our_witness_is_shed_with_its_pool(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 1)]).await;
    w.settle(3).await;
    // Adopted on purpose, by an operator's hand (assimilate mode adopts
    // no witness our log does not know): it stands on web/1, a place of
    // the pool once raised, and no request of ours made it.
    let project = w.fake.project().to_string();
    let adopted =
        w.fake
            .add_foreign_server(&project, "c2-small-x86", "DAL", "shepherd-web-1-deadbeef");
    set_count(&w, "web", 2).await;
    let pass = w.pass().await;
    assert_eq!(pass.unknown_devices, vec![adopted.clone()], "{pass:?}");
    assert!(pass.enqueued.is_empty(), "{pass:?}");
    sqlx::query("select shepherd.enqueue_assimilate($1::text)")
        .bind(&adopted)
        .execute(&w.pool)
        .await
        .expect("enqueue_assimilate");
    drain_rounds(&w, 1).await;
    set_count(&w, "web", 1).await;
    // The pool's count is 1 and it holds 2: the one beyond goes, through
    // the same guards, instead of being billed forever.
    let pass = w.pass().await;
    assert_eq!(pass.deletions, vec![adopted.clone()], "{pass:?}");
    drain_rounds(&w, 1).await;
    assert!(!server_ids(&w).contains(&adopted));
    assert_eq!(w.fake.calls(Call::DestroyServer), 1);
    assert_eq!(server_ids(&w).len(), 1);
}
