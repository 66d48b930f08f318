//! Fenced (issue 46): a run that stalls past its unit's lease, between its
//! last check and the bytes of its write leaving, may still have its
//! write done by the provider. Its answer is then not the run's to record:
//! it is kept as unresolved for the unit's holder, nothing is ended or
//! freed on it, and what the late write did is repaired by the passes.
//! The stall is the fake holding the write on its way in (`Held`) while
//! the lease runs out, as a stopped worker's keeper would let it, and the
//! job row is handed to another worker, as apalis does for a worker it
//! presumed dead.

use super::*;
use common::world::{drain_with, run_next};
use shepherd::jobs::create_device::create_device;
use shepherd::jobs::delete_machine::delete_machine;
use shepherd::jobs::{CreateDeviceArgs, DeleteMachineArgs};
use shepherd_fakes::latitude::{FaultKind, FaultRule, Faults};

/// How long the fake holds the stalled write: under the client's attempt
/// timeout (2 s), so the late answer reaches the stalled run.
const HELD_MS: u64 = 1_500;

/// Claims the runnable job of `kind` as a worker does: its row's id and
/// its arguments.
async fn claim(w: &World, kind: &str) -> (String, serde_json::Value) {
    sqlx::query_as(
        "update apalis.jobs j set status = 'Running'
         from (select id from apalis.jobs
               where job_type = $1 and status = 'Pending' and run_at <= now()
               order by run_at, id limit 1 for update skip locked) next
         where j.id = next.id
         returning j.id, convert_from(j.job, 'UTF8')::jsonb",
    )
    .bind(kind)
    .fetch_one(&w.pool)
    .await
    .unwrap_or_else(|e| panic!("no runnable {kind} job: {e}"))
}

/// The stalled run's lease runs out, by the database's clock (its keeper
/// stopped with it), and its row is handed to another worker: apalis
/// counts the run it presumes dead, and the row runs again.
async fn lease_runs_out_and_row_is_rescued(w: &World, job_id: &str) {
    let expired = sqlx::query(
        "update shepherd.leases set expires_at = clock_timestamp() - interval '1 second'",
    )
    .execute(&w.pool)
    .await
    .expect("expiring the stalled run's lease")
    .rows_affected();
    assert_eq!(expired, 1, "the stalled run held no lease");
    sqlx::query("update apalis.jobs set attempts = attempts + 1 where id = $1")
        .bind(job_id)
        .execute(&w.pool)
        .await
        .expect("counting the stalled run");
}

async fn done(w: &World, job_id: &str) {
    sqlx::query("update apalis.jobs set status = 'Done', done_at = now() where id = $1")
        .bind(job_id)
        .execute(&w.pool)
        .await
        .expect("ending the job row");
}

/// Bodies of the unresolved outcomes of `kind` that came after a lost
/// lease.
async fn late(w: &World, kind: &str) -> Vec<serde_json::Value> {
    w.events(kind)
        .await
        .into_iter()
        .filter(|b| b["lease_lost"] == serde_json::Value::Bool(true))
        .collect()
}

/// Runs the job row `job` (`run` runs it once) as a stalled run: its write
/// reaches the fake and is held there, `meanwhile` happens, its lease runs
/// out and its row is handed back; then the rescued run runs to its end
/// before the stalled one's answer comes. Both outcomes, rescued first.
async fn stalled_then_rescued<O, Fut>(
    w: &World,
    job: &str,
    run: impl Fn() -> Fut,
    meanwhile: impl std::future::Future<Output = ()>,
) -> (O, O)
where
    O: Send + 'static,
    Fut: std::future::Future<Output = Result<O, shepherd::jobs::JobError>> + Send + 'static,
{
    let stalled = tokio::spawn(run());
    // Long enough for the stalled run to pass its fence and reach the fake.
    tokio::time::sleep(Duration::from_millis(400)).await;
    meanwhile.await;
    lease_runs_out_and_row_is_rescued(w, job).await;
    let rescued = run().await.expect("the rescued run");
    assert!(
        !stalled.is_finished(),
        "the stalled run ended before the rescued one: the stall was not taken"
    );
    let stalled = stalled.await.unwrap().expect("the stalled run");
    done(w, job).await;
    (rescued, stalled)
}

#[sqlx::test(migrations = false)]
async fn a_create_answered_after_its_lease_was_lost_is_not_recorded_and_the_place_ends_with_one(
    db: PgPool,
) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 1)]).await;
    w.fake
        .set_faults(Faults::none().with_rule(
            FaultRule::on(Call::CreateServer, FaultKind::Held { ms: HELD_MS }).times(1),
        ));
    w.pass().await;
    let (job, args) = claim(&w, "create_device").await;
    let args: CreateDeviceArgs = serde_json::from_value(args).expect("create_device args");
    let run = || {
        let (ctx, args, job) = (w.ctx.clone(), args.clone(), job.clone());
        async move { create_device(&ctx, &args, &job).await }
    };
    let (rescued, stalled) = stalled_then_rescued(&w, &job, run, async {}).await;
    // The rescued run looked, found nothing (the stalled POST had not been
    // handled yet) and, its settle window over, created.
    assert!(
        matches!(rescued, CreateOutcome::Created { .. }),
        "{rescued:?}"
    );
    // Its POST was done: two servers for the place at the provider.
    assert_eq!(w.fake.servers().len(), 2, "the stalled write was not made");
    assert!(
        matches!(stalled, CreateOutcome::Unresolved { .. }),
        "{stalled:?}"
    );
    // One recorded server; the late answer kept for the holder, once.
    assert_eq!(w.events("device_created").await.len(), 1);
    assert_eq!(late(&w, "creation_unresolved").await.len(), 1);

    // The passes adopt the second server (the request's witness, its
    // create unresolved) and shed one of the two as surplus, within the
    // deletion guards.
    for _ in 0..6 {
        w.pass().await;
        drain_rounds(&w, 2).await;
        if w.fake.servers().len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(w.fake.servers().len(), 1, "the place kept two servers");
    let requested = w.events("deletion_requested").await;
    assert_eq!(requested.len(), 1, "{requested:?}");
    assert_eq!(requested[0]["cause"], "surplus", "{requested:?}");
    w.settle(3).await;
    w.assert_invariants().await;
}

#[sqlx::test(migrations = false)]
async fn a_delete_answered_after_its_deletion_was_cancelled_is_not_recorded_deleted(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    assert_eq!(w.fake.servers().len(), 2);
    set_count(&w, "web", 1).await;
    let pass = w.pass().await;
    assert_eq!(pass.deletions.len(), 1, "{pass:?}");
    w.fake.set_faults(
        Faults::none().with_rule(
            FaultRule::on(Call::DestroyServer, FaultKind::Held { ms: HELD_MS }).times(1),
        ),
    );
    let (job, args) = claim(&w, "delete_machine").await;
    let args: DeleteMachineArgs = serde_json::from_value(args).expect("delete_machine args");
    let run = || {
        let (ctx, args, job) = (w.ctx.clone(), args.clone(), job.clone());
        async move { delete_machine(&ctx, &args, &job).await }
    };
    // The pool is raised back while the DELETE is held: the rescued run's
    // check finds the machine wanted again, cancels, and tells the hook
    // it stays.
    let raised = set_count(&w, "web", 2);
    let (rescued, stalled) = stalled_then_rescued(&w, &job, run, raised).await;
    assert!(
        matches!(rescued, DeleteOutcome::Cancelled { .. }),
        "{rescued:?}"
    );
    assert_eq!(w.fake.servers().len(), 1, "the stalled DELETE was not done");
    assert!(
        matches!(stalled, DeleteOutcome::Unresolved { .. }),
        "{stalled:?}"
    );
    // Not recorded deleted: the cancellation stands, and the late answer
    // is kept as unresolved.
    assert!(w.events("machine_deleted").await.is_empty());
    assert_eq!(w.events("deletion_cancelled").await.len(), 1);
    assert_eq!(late(&w, "deletion_unresolved").await.len(), 1);

    // The machine the late DELETE took is found gone by the passes (twice,
    // a gap apart, and by a listing) and replaced: the pool ends whole.
    for _ in 0..8 {
        w.pass().await;
        drain_rounds(&w, 2).await;
        if w.fake.servers().len() == 2 && !w.events("machine_lost").await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    assert_eq!(w.events("machine_lost").await.len(), 1);
    assert_eq!(w.fake.servers().len(), 2, "the pool was not made whole");
    w.settle(3).await;
    w.assert_invariants().await;
}

/// The successor of a creation whose create went unanswered, its arguments
/// carrying the unseen create's time as a worker whose clock runs 90 s
/// behind wrote it (or as an earlier run's successor did, merged with a
/// later one's under one key): the settle window runs from the unseen
/// create as the database recorded it, so the look does not trust
/// "nothing there" early, and the server the gateway hid is found, not
/// made twice.
#[sqlx::test(migrations = false)]
async fn an_unseen_create_is_settled_by_the_databases_clock_not_a_workers(db: PgPool) {
    let settle = Duration::from_secs(3);
    let w = World::with_settle(db, 10, vec![pool("web", "DAL", 1)], settle).await;
    w.fake.set_faults(create_lost_then_hidden(2_000));
    w.pass().await;
    let first = run_next(&w.pool, &w.ctx).await;
    assert!(
        matches!(first, Some(Ran::Create(CreateOutcome::Retrying { .. }))),
        "{first:?}"
    );
    assert_eq!(w.fake.servers().len(), 1, "the 504's server was not made");
    let behind = sqlx::query(
        "update apalis.jobs
         set job = convert_to(jsonb_set(convert_from(job, 'UTF8')::jsonb, '{unknown_since}',
                                        to_jsonb(now() - interval '90 seconds'))::text, 'UTF8')
         where job_type = 'create_device' and status = 'Pending'",
    )
    .execute(&w.pool)
    .await
    .expect("the successor's arguments, as a clock behind wrote them")
    .rows_affected();
    assert_eq!(behind, 1);
    let second = run_next(&w.pool, &w.ctx).await;
    assert!(
        matches!(second, Some(Ran::Create(CreateOutcome::Unresolved { .. }))),
        "the look trusted \"nothing there\" within the settle window: {second:?}"
    );
    // Until it settles: the hidden server shows and is recorded.
    let began = std::time::Instant::now();
    while w.events("device_created").await.is_empty() && began.elapsed() < settle * 3 {
        w.make_due().await;
        drain_with(&w.pool, &w.ctx).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(w.events("device_created").await.len(), 1);
    assert!(w.events("creation_settled").await.is_empty());
    assert_eq!(w.fake.servers().len(), 1, "a second server was made");
    w.settle(3).await;
    w.assert_invariants().await;
}

/// The other way: a successor whose arguments carry the unseen create's
/// time as a worker whose clock runs 90 s ahead wrote it. The window runs
/// from the database's record, never from a time past the database's now,
/// so a create that made nothing is tried again once the window is over,
/// not 90 s later.
#[sqlx::test(migrations = false)]
async fn a_clock_ahead_does_not_hold_an_unseen_create_past_its_window(db: PgPool) {
    let settle = Duration::from_secs(2);
    let w = World::with_settle(db, 10, vec![pool("web", "DAL", 1)], settle).await;
    // A gateway's 504 for a create that never reached the origin.
    w.fake.set_faults(
        Faults::none().with_rule(
            FaultRule::on(Call::CreateServer, FaultKind::Status { status: 504 }).times(1),
        ),
    );
    w.pass().await;
    let first = run_next(&w.pool, &w.ctx).await;
    assert!(
        matches!(first, Some(Ran::Create(CreateOutcome::Retrying { .. }))),
        "{first:?}"
    );
    assert!(w.fake.servers().is_empty());
    let ahead = sqlx::query(
        "update apalis.jobs
         set job = convert_to(jsonb_set(convert_from(job, 'UTF8')::jsonb, '{unknown_since}',
                                        to_jsonb(now() + interval '90 seconds'))::text, 'UTF8')
         where job_type = 'create_device' and status = 'Pending'",
    )
    .execute(&w.pool)
    .await
    .expect("the successor's arguments, as a clock ahead wrote them")
    .rows_affected();
    assert_eq!(ahead, 1);
    // One job at a time, so the bound below is the test's and not a
    // drain's that waits the whole skewed window.
    let began = std::time::Instant::now();
    while w.events("device_created").await.is_empty() && began.elapsed() < settle * 5 {
        w.make_due().await;
        run_next(&w.pool, &w.ctx).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        w.events("device_created").await.len(),
        1,
        "the creation waited on a clock 90 s ahead"
    );
    assert!(began.elapsed() < settle * 5, "{:?}", began.elapsed());
    assert_eq!(w.events("creation_settled").await.len(), 1);
    assert_eq!(w.fake.servers().len(), 1);
}
