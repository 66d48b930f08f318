//! Pools kept whole in both directions, through every path that changes
//! them: a pool lowered sheds its surplus (newest first, within the
//! deletion budget), raised fills again, removed drains only when
//! confirmed; a failed machine is replaced and its place penalised; the
//! guards hold (the pause for deletions, protection, too many unhealthy at
//! once); the leave hook is waited for (acknowledged from SQL, answered
//! over HTTP, or timed out); operators deprovision from SQL on both
//! providers; and a deletion whose answer was lost looks before it sends
//! again. Against the fake Latitude (and the fake Metal) over HTTP and a
//! real Postgres; the jobs are claimed from the real queue.

#[path = "lifecycle/billing.rs"]
mod billing;
mod common;
#[path = "lifecycle/leave_hook.rs"]
mod leave_hook;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::latitude::{World, pool};
use common::world::{Ran, drain_with};
use shepherd::jobs::delete_machine::DeleteOutcome;
use shepherd_fakes::latitude::{Call, FaultKind, FaultRule, Faults};
use sqlx::PgPool;

/// A pass, then every job it led to, twice (successors made due).
async fn round(w: &World) -> Vec<Ran> {
    w.pass().await;
    let mut ran = drain_with(&w.pool, &w.ctx).await;
    w.make_due().await;
    ran.extend(drain_with(&w.pool, &w.ctx).await);
    ran
}

async fn sql(w: &World, statement: &'static str) {
    sqlx::query(statement)
        .execute(&w.pool)
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
}

/// The hostnames of our servers at the fake, by pool.
fn ours(w: &World, pool: &str) -> Vec<String> {
    let mut names: Vec<String> = w
        .fake
        .servers()
        .into_iter()
        .filter(|s| s.hostname.starts_with(&format!("shepherd-{pool}-")))
        .map(|s| s.hostname)
        .collect();
    names.sort();
    names
}

async fn set_count(w: &World, pool: &str, count: u32, confirm: bool) -> Result<(), sqlx::Error> {
    sqlx::query(
        "select shepherd.set_pool($1, 'c2-small-x86', 'DAL', $2, 'ubuntu_24_04_x64_lts',
                                  '{}', 'the test resizes it', 'test', $3)",
    )
    .bind(pool)
    .bind(count as i32)
    .bind(confirm)
    .execute(&w.pool)
    .await
    .map(|_| ())
}

/// Every server of ours is managed and every managed machine a server; no
/// place holds two; the views equal the log.
async fn assert_consistent(w: &World) {
    let servers = w.fake.servers();
    let mut hostnames = HashSet::new();
    for s in &servers {
        assert!(hostnames.insert(s.hostname.clone()), "{} twice", s.hostname);
    }
    let ours: HashSet<String> = servers
        .iter()
        .filter(|s| s.hostname.starts_with("shepherd-") && !s.created_by_other)
        .map(|s| s.id.clone())
        .collect();
    let managed: HashSet<String> =
        sqlx::query_scalar("select provider_id from shepherd.managed_machines")
            .fetch_all(&w.pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    assert_eq!(managed, ours, "managed machines and our servers differ");
    assert_eq!(w.fake.duplicate_hostnames(), 0);
    common::assert_rebuild_equals_live(&w.pool).await;
}

/// The place a hostname of ours names.
fn place_of(hostname: &str) -> u32 {
    hostname
        .split('-')
        .nth(2)
        .and_then(|i| i.parse().ok())
        .unwrap_or_else(|| panic!("not a hostname of ours: {hostname}"))
}

#[sqlx::test(migrations = false)]
async fn a_pool_lowered_sheds_within_the_budget_by_billed_hour_and_raised_fills_again(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 5)]).await;
    lowered_then_raised(&w).await;
}

/// The same with one database connection for every job: no pass,
/// creation or deletion holds a connection while it asks for another (a
/// worker's pool is two, shared with its queues).
#[sqlx::test(migrations = false)]
async fn a_pool_lowered_and_raised_on_one_connection(db: PgPool) {
    let w = World::on_one_connection(db, 10, vec![pool("web", "DAL", 5)]).await;
    lowered_then_raised(&w).await;
}

async fn lowered_then_raised(w: &World) {
    w.settle(3).await;
    assert_eq!(ours(w, "web").len(), 5);
    // Place 0's machine is replaced a second later: the newest machine
    // stands on the lowest place, so "newest" and "highest place" differ.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let first = w
        .fake
        .servers()
        .into_iter()
        .find(|s| place_of(&s.hostname) == 0)
        .unwrap();
    sqlx::query("select shepherd.deprovision_machine($1, 'renewed', 'test')")
        .bind(&first.id)
        .execute(&w.pool)
        .await
        .unwrap();
    drain_with(&w.pool, &w.ctx).await;
    w.settle(3).await;
    let renewed = w
        .fake
        .servers()
        .into_iter()
        .find(|s| place_of(&s.hostname) == 0)
        .unwrap();
    assert_ne!(renewed.id, first.id);
    set_count(w, "web", 2, false).await.unwrap();
    // The default budget: 10% of the pool or 2 machines a period, the
    // larger. The third waits, and the pass says so.
    round(w).await;
    assert_eq!(ours(w, "web").len(), 3, "{:?}", ours(w, "web"));
    let requested = w.events("deletion_requested").await;
    let surplus: Vec<&serde_json::Value> = requested
        .iter()
        .filter(|e| e["cause"] == "surplus")
        .collect();
    assert_eq!(surplus.len(), 2, "{requested:?}");
    let held = w.events("deletions_held").await;
    assert!(
        held.iter()
            .any(|e| e["guard"] == "budget" && e["held"] == 1),
        "{held:?}"
    );
    // The fake bills by the hour. Among equals the machine nearest its
    // next billed hour goes first (the least paid time thrown away): the
    // renewed machine on place 0, the newest, is the furthest from its
    // next billed hour and stays (it went first when surplus went newest
    // first, before billing was read).
    let gone: Vec<&str> = surplus
        .iter()
        .map(|e| e["provider_id"].as_str().unwrap())
        .collect();
    assert!(!gone.contains(&renewed.id.as_str()), "{gone:?}");
    let places: Vec<u32> = ours(w, "web").iter().map(|h| place_of(h)).collect();
    assert!(places.contains(&0), "{places:?}");
    // A wider budget lets the last surplus go.
    sql(
        w,
        "select shepherd.change_setting('deletion_budget', '100%,5', 'the test', 'test')",
    )
    .await;
    round(w).await;
    assert_eq!(ours(w, "web").len(), 2);
    assert_eq!(w.events("machine_deleted").await.len(), 4);
    let places: Vec<u32> = ours(w, "web").iter().map(|h| place_of(h)).collect();
    assert!(places.contains(&0), "the renewed machine went: {places:?}");
    // Nothing more goes, nothing is created.
    let ran = round(w).await;
    assert!(ran.is_empty(), "{ran:?}");
    // Raised again: filled, on free places only.
    set_count(w, "web", 4, false).await.unwrap();
    w.settle(3).await;
    assert_eq!(ours(w, "web").len(), 4);
    assert_consistent(w).await;
    // No place was ever penalised for a surplus or an operator's deletion.
    assert_eq!(w.count("select count(*) from shepherd.sinbin").await, 0);
}

#[sqlx::test(migrations = false)]
async fn emptying_or_removing_a_pool_needs_confirmation_then_drains_it(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2), pool("db", "DAL", 2)]).await;
    w.settle(3).await;
    sql(
        &w,
        "select shepherd.change_setting('deletion_budget', '100%,5', 'the test', 'test')",
    )
    .await;
    let refused = set_count(&w, "web", 0, false).await.unwrap_err();
    assert!(refused.to_string().contains("confirm"), "{refused}");
    let refused = sqlx::query("select shepherd.remove_pool('db', 'gone', 'test', false)")
        .execute(&w.pool)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("confirm"), "{refused}");
    // Refused, nothing moved.
    round(&w).await;
    assert_eq!(w.fake.servers().len(), 4);
    set_count(&w, "web", 0, true).await.unwrap();
    sql(
        &w,
        "select shepherd.remove_pool('db', 'gone', 'test', true)",
    )
    .await;
    round(&w).await;
    assert!(w.fake.servers().is_empty(), "{:?}", w.fake.servers());
    let causes: Vec<String> = w
        .events("deletion_requested")
        .await
        .iter()
        .map(|e| e["cause"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        causes.iter().filter(|c| *c == "pool_removed").count(),
        2,
        "{causes:?}"
    );
    assert_eq!(causes.iter().filter(|c| *c == "surplus").count(), 2);
    // The removed pool is marked so; the emptied one stays, at 0.
    let rows: Vec<(String, i32, bool)> =
        sqlx::query_as("select name, count, removed from shepherd.pools order by name")
            .fetch_all(&w.pool)
            .await
            .unwrap();
    assert_eq!(
        rows,
        vec![("db".into(), 0, true), ("web".into(), 0, false)],
        "{rows:?}"
    );
    let ran = round(&w).await;
    assert!(ran.is_empty(), "{ran:?}");
    assert_consistent(&w).await;
}

#[sqlx::test(migrations = false)]
async fn a_protected_machine_stays_and_paused_deletions_hold_everything(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 3)]).await;
    w.settle(3).await;
    sql(
        &w,
        "select shepherd.change_setting('deletion_budget', '100%,5', 'the test', 'test')",
    )
    .await;
    let keep: String = w.fake.servers()[0].id.clone();
    sqlx::query("select shepherd.protect_machine($1, 'holds the only copy', 'test')")
        .bind(&keep)
        .execute(&w.pool)
        .await
        .unwrap();
    sql(
        &w,
        "select shepherd.pause_deletions('a migration is running', 'test')",
    )
    .await;
    set_count(&w, "web", 0, true).await.unwrap();
    round(&w).await;
    assert_eq!(w.fake.servers().len(), 3, "deleted while paused");
    assert!(w.events("deletion_requested").await.is_empty());
    let held = w.events("deletions_held").await;
    assert!(held.iter().any(|e| e["guard"] == "paused"), "{held:?}");
    sql(&w, "select shepherd.resume_deletions('done', 'test')").await;
    round(&w).await;
    let left: Vec<String> = w.fake.servers().into_iter().map(|s| s.id).collect();
    assert_eq!(
        left,
        vec![keep.clone()],
        "the protected one went, or others stayed"
    );
    let held = w.events("deletions_held").await;
    assert!(held.iter().any(|e| e["guard"] == "protected"), "{held:?}");
    // An operator cannot deprovision it either, until it is unprotected.
    let refused = sqlx::query("select shepherd.deprovision_machine($1, 'by hand', 'test')")
        .bind(&keep)
        .execute(&w.pool)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("protected"), "{refused}");
    sqlx::query("select shepherd.protect_machine($1, 'copied', 'test', false)")
        .bind(&keep)
        .execute(&w.pool)
        .await
        .unwrap();
    round(&w).await;
    assert!(w.fake.servers().is_empty());
    assert_consistent(&w).await;
}

/// Deletions requested, then paused before their job runs, then a machine
/// protected while its deletion waits: the job checks both again, and its
/// fence right before the DELETE; nothing is sent until both allow it.
#[sqlx::test(migrations = false)]
async fn a_deletion_rechecks_the_pause_and_protection_before_it_sends(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    sql(
        &w,
        "select shepherd.change_setting('deletion_budget', '100%,5', 'the test', 'test')",
    )
    .await;
    set_count(&w, "web", 0, true).await.unwrap();
    let pass = w.pass().await;
    assert_eq!(pass.deletions.len(), 2, "{pass:?}");
    sql(&w, "select shepherd.pause_deletions('wait', 'test')").await;
    let ran = drain_with(&w.pool, &w.ctx).await;
    assert!(
        ran.iter()
            .all(|r| matches!(r, Ran::Delete(DeleteOutcome::Waiting { .. }))),
        "{ran:?}"
    );
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    // One is protected meanwhile: its deletion is cancelled.
    sqlx::query("select shepherd.protect_machine($1, 'wanted after all', 'test')")
        .bind(&pass.deletions[0])
        .execute(&w.pool)
        .await
        .unwrap();
    sql(&w, "select shepherd.resume_deletions('go', 'test')").await;
    w.make_due().await;
    let ran = drain_with(&w.pool, &w.ctx).await;
    assert_eq!(w.fake.calls(Call::DestroyServer), 1, "{ran:?}");
    let left: Vec<String> = w.fake.servers().into_iter().map(|s| s.id).collect();
    assert_eq!(left, vec![pass.deletions[0].clone()]);
    let cancelled = w.events("deletion_cancelled").await;
    assert_eq!(cancelled.len(), 1, "{cancelled:?}");
    assert_eq!(
        w.count("select count(*) from shepherd.pending_deletions")
            .await,
        0
    );
    assert_consistent(&w).await;
}

/// A surplus deletion waits for the leave hook; the pool is raised back
/// meanwhile, and the deletion, checked again, is cancelled: nothing that
/// is no longer meant to go is deleted.
#[sqlx::test(migrations = false)]
async fn a_deletion_no_longer_wanted_is_cancelled(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 3)]).await;
    w.settle(3).await;
    sql(
        &w,
        "select shepherd.change_setting('leave_hook', 'ack', 'the test', 'test')",
    )
    .await;
    set_count(&w, "web", 2, false).await.unwrap();
    let pass = w.pass().await;
    assert_eq!(pass.deletions.len(), 1);
    let ran = drain_with(&w.pool, &w.ctx).await;
    assert!(
        matches!(ran[..], [Ran::Delete(DeleteOutcome::Waiting { .. })]),
        "{ran:?}"
    );
    set_count(&w, "web", 3, false).await.unwrap();
    sqlx::query("select shepherd.acknowledge_leave($1, 'test')")
        .bind(&pass.deletions[0])
        .execute(&w.pool)
        .await
        .unwrap();
    w.make_due().await;
    let ran = drain_with(&w.pool, &w.ctx).await;
    assert!(
        ran.iter()
            .any(|r| matches!(r, Ran::Delete(DeleteOutcome::Cancelled { .. }))),
        "{ran:?}"
    );
    assert_eq!(w.fake.servers().len(), 3);
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    assert_consistent(&w).await;
}

/// Failed deployments are replaced one by one, but when most of a pool
/// reads as failed at once (an outage at the provider, not bad machines),
/// none is: the guard holds and says so.
#[sqlx::test(migrations = false)]
async fn too_many_failed_at_once_are_held_not_replaced(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 4)]).await;
    w.fake.set_faults(
        Faults::none()
            .with_rule(FaultRule::on(Call::CreateServer, FaultKind::FailDeployment).times(3)),
    );
    round(&w).await;
    assert_eq!(w.fake.servers().iter().filter(|s| s.failed).count(), 3);
    // 3 of 4 failed: more than max_unhealthy (40%). Nothing is deleted.
    round(&w).await;
    assert!(w.events("deletion_requested").await.is_empty());
    let held = w.events("deletions_held").await;
    assert!(held.iter().any(|e| e["guard"] == "unhealthy"), "{held:?}");
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    // The operator judges it is the machines after all.
    sql(
        &w,
        "select shepherd.change_setting('max_unhealthy', '100%', 'the test', 'test')",
    )
    .await;
    round(&w).await;
    let requested = w.events("deletion_requested").await;
    assert!(!requested.is_empty());
    assert!(
        requested.iter().all(|e| e["cause"] == "failed"),
        "{requested:?}"
    );
    // Each replaced place is penalised: it is not filled again at once.
    let penalised = w.count("select count(*) from shepherd.sinbin").await;
    assert_eq!(penalised as usize, requested.len());
    assert_consistent(&w).await;
}

/// An operator deprovisions a machine from SQL; the delete's answer is
/// lost (a 504 after the work was done); the next run looks the machine
/// up, finds it gone, and records it deleted without a second DELETE.
#[sqlx::test(migrations = false)]
async fn a_deprovision_whose_answer_was_lost_is_settled_by_looking(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    let victim = w.fake.servers()[0].id.clone();
    let refused = sqlx::query("select shepherd.deprovision_machine($1, '', 'test')")
        .bind(&victim)
        .execute(&w.pool)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("reason"), "{refused}");
    let refused = sqlx::query("select shepherd.deprovision_machine('sv_nobody', 'x', 'test')")
        .execute(&w.pool)
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("no managed machine"),
        "{refused}"
    );
    sqlx::query("select shepherd.deprovision_machine($1, 'bad disk', 'test')")
        .bind(&victim)
        .execute(&w.pool)
        .await
        .unwrap();
    // The gateway answers 504 after the server was deleted, and every
    // DELETE after it 503, until the client's retries run out.
    w.fake.set_faults(
        Faults::none()
            .with_rule(
                FaultRule::on(
                    Call::DestroyServer,
                    FaultKind::GatewayTimeout {
                        status: 504,
                        hidden_ms: 0,
                    },
                )
                .times(1),
            )
            .with_rule(FaultRule::on(
                Call::DestroyServer,
                FaultKind::Status { status: 503 },
            )),
    );
    // The client's retries run out: unknown. The successor (due at once
    // here) looks the server up and finds it gone: one absence, recorded,
    // and the machine stays managed until a second look a gap later
    // agrees with a listing.
    let deletes = |ran: Vec<Ran>| -> Vec<DeleteOutcome> {
        ran.into_iter()
            .filter_map(|r| match r {
                Ran::Delete(o) => Some(o),
                _ => None,
            })
            .collect()
    };
    let outcomes = deletes(drain_with(&w.pool, &w.ctx).await);
    assert!(
        matches!(
            outcomes[..],
            [
                DeleteOutcome::Unresolved { .. },
                DeleteOutcome::Waiting { .. }
            ]
        ),
        "{outcomes:?}"
    );
    assert!(w.events("machine_deleted").await.is_empty());
    assert_eq!(w.events("machine_not_found").await.len(), 1);
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    w.make_due().await;
    let outcomes = deletes(drain_with(&w.pool, &w.ctx).await);
    assert!(
        matches!(
            outcomes[..],
            [DeleteOutcome::Deleted {
                already_gone: false
            }]
        ),
        "{outcomes:?}"
    );
    assert!(w.fake.servers().iter().all(|s| s.id != victim));
    let log = w.fake.request_log();
    let last_delete = log
        .iter()
        .rposition(|r| r.call == Call::DestroyServer)
        .unwrap();
    assert!(
        log[last_delete + 1..]
            .iter()
            .any(|r| r.call == Call::GetServer && r.status == 404),
        "the unknown deletion was not settled by a look"
    );
    assert_eq!(log[last_delete].status, 503);
    assert_eq!(w.events("deletion_unresolved").await.len(), 1);
    // An operator's deletion is not a replacement: no penalty, and the
    // pass fills the place again.
    assert_eq!(w.count("select count(*) from shepherd.sinbin").await, 0);
    w.settle(3).await;
    assert_eq!(w.fake.servers().len(), 2);
    assert_consistent(&w).await;
}

/// On Metal, a machine is a device on a reservation: deprovisioning one
/// deletes the device (DELETE /devices/{id}), frees the reservation, and
/// the next pass provisions it again, with a new device. Lowering the limit
/// deletes nothing (Metal has no pools: the reservations are the capacity).
#[sqlx::test(migrations = false)]
async fn deprovisioning_on_metal_frees_the_reservation_for_a_new_device(db: PgPool) {
    use common::world::{World as Metal, fast_config};
    let config = shepherd::config::ProvisionerConfig {
        max_machines: 3,
        ..fast_config()
    };
    let w = Metal::with(db, 3, config).await;
    w.reconcile().await;
    w.drain().await;
    assert_eq!(w.managed().await, 3);
    let victim = w.fake.devices()[0].clone();
    sqlx::query("select shepherd.deprovision_machine($1, 'a bad disk', 'test')")
        .bind(victim.id.to_string())
        .execute(&w.pool)
        .await
        .unwrap();
    let ran = w.drain().await;
    assert!(
        ran.iter().any(|r| matches!(
            r,
            Ran::Delete(DeleteOutcome::Deleted {
                already_gone: false
            })
        )),
        "{ran:?}"
    );
    assert!(w.fake.devices().iter().all(|d| d.id != victim.id));
    assert_eq!(w.managed().await, 2);
    let pass = w.reconcile().await;
    assert_eq!(pass.enqueued, vec![victim.reservation.unwrap()], "{pass:?}");
    w.drain().await;
    let again = w
        .fake
        .devices()
        .into_iter()
        .find(|d| d.reservation == victim.reservation)
        .unwrap();
    assert_ne!(again.id, victim.id);
    // A lower limit deletes nothing.
    sqlx::query("select shepherd.change_setting('max_machines', '1', 'the test', 'test')")
        .execute(&w.pool)
        .await
        .unwrap();
    w.reconcile().await;
    w.drain().await;
    assert_eq!(w.fake.devices().len(), 3);
    assert!(events_of(&w.pool, "deletion_requested").await.len() == 1);
    w.assert_fleet_consistent().await;
    common::assert_rebuild_equals_live(&w.pool).await;
}

async fn events_of(pool: &PgPool, kind: &str) -> Vec<serde_json::Value> {
    sqlx::query_scalar("select body from shepherd.events where event_type = $1")
        .bind(kind)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// A plan that fails every deployment does not spend money in a loop: each
/// failed machine is replaced once and its place penalised; with the
/// penalties lifted by an operator, the next failures penalise the plan at
/// the site as a whole, and nothing more is created there.
#[sqlx::test(migrations = false)]
async fn a_plan_that_always_fails_is_held_back_not_churned(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    for (key, value) in [("deletion_budget", "100%,10"), ("max_unhealthy", "100%")] {
        sqlx::query("select shepherd.change_setting($1, $2, 'the test', 'test')")
            .bind(key)
            .bind(value)
            .execute(&w.pool)
            .await
            .unwrap();
    }
    w.fake.set_faults(
        Faults::none().with_rule(FaultRule::on(Call::CreateServer, FaultKind::FailDeployment)),
    );
    for _ in 0..6 {
        round(&w).await;
    }
    assert_eq!(
        w.fake.calls(Call::CreateServer),
        2,
        "the failures were churned"
    );
    assert!(w.fake.servers().is_empty(), "a failed server was kept");
    assert_eq!(w.count("select count(*) from shepherd.sinbin").await, 2);
    let failed: Vec<serde_json::Value> = w.events("deletion_requested").await;
    assert!(failed.iter().all(|e| e["cause"] == "failed"), "{failed:?}");
    // The operator lifts the penalties: one more try each, and the plan at
    // the site is held back as a whole after the third failure in a row.
    sql(
        &w,
        "select shepherd.clear_all_penalties('try again', 'test')",
    )
    .await;
    for _ in 0..6 {
        round(&w).await;
    }
    assert_eq!(w.fake.calls(Call::CreateServer), 4);
    let scoped = w
        .count("select count(*) from shepherd.sinbin where scope = 'c2-small-x86@DAL' and until > now()")
        .await;
    assert!(scoped >= 1, "the plan at the site was not held back");
    assert_consistent(&w).await;
}
