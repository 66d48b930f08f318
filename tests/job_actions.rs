//! An operator retries or cancels single jobs (the console's buttons,
//! `shepherd::jobs::manage`) while the cluster runs: a cancel frees the
//! capacity of a creation that never left, and nothing else; a retry never
//! gives work a second job; a cancel racing a worker's claim loses or wins
//! whole, never both.

mod common;

use common::assert_rebuild_equals_live;
use common::world::*;
use shepherd::config::ProvisionerConfig;
use shepherd::jobs::manage::{self, JobActionError};
use shepherd::jobs::sweep;
use sqlx::PgPool;

fn config(max_machines: u64) -> ProvisionerConfig {
    ProvisionerConfig {
        max_machines,
        chunk_size: max_machines.max(1),
        ..fast_config()
    }
}

async fn pending_create_jobs(w: &World) -> Vec<String> {
    sqlx::query_scalar(
        "select id from apalis.jobs where job_type = 'create_device' and status = 'Pending'
         order by id",
    )
    .fetch_all(&w.pool)
    .await
    .unwrap()
}

async fn status(w: &World, id: &str) -> String {
    sqlx::query_scalar("select status from apalis.jobs where id = $1")
        .bind(id)
        .fetch_one(&w.pool)
        .await
        .unwrap()
}

fn refused(result: Result<(), JobActionError>) -> String {
    match result {
        Err(JobActionError::Refused(why)) => why,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[sqlx::test(migrations = false)]
async fn cancelling_a_creation_that_never_left_frees_its_place(pool: PgPool) {
    let w = World::with(pool, 3, config(1)).await;
    let r = w.reconcile().await.enqueued[0];
    let job = pending_create_jobs(&w).await.remove(0);
    assert_eq!(w.in_flight().await, 1);

    manage::cancel(&w.pool, &job, "console:alice", "wrong plan")
        .await
        .unwrap();
    assert_eq!(status(&w, &job).await, "Killed");
    assert_eq!(
        w.in_flight().await,
        0,
        "the cancelled creation still counts"
    );
    let (by, stream): (String, String) = sqlx::query_as(
        "select body->>'by', stream from shepherd.events where event_type = 'job_cancelled'",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert_eq!(by, "console:alice");
    assert_eq!(stream, format!("reservation/{r}"));
    // The sweep sees nothing to resume: the creation ended, it did not
    // lose its job.
    let swept = sweep::run_once(&w.pool).await.unwrap();
    assert!(swept.creations_resumed.is_empty(), "{swept:?}");
    assert!(w.fake.devices().is_empty(), "a cancelled creation was sent");
    // A second cancel finds the job ended.
    refused(manage::cancel(&w.pool, &job, "console:alice", "again").await);

    // The place is free for the next pass, which provisions within the limit.
    w.reconcile().await;
    w.drain().await;
    assert_eq!(w.managed().await, 1);
    assert_eq!(w.fake.devices().len(), 1);
    w.assert_fleet_consistent().await;
    assert_rebuild_equals_live(&w.pool).await;
}

#[sqlx::test(migrations = false)]
async fn a_creation_tried_before_is_not_cancelled(pool: PgPool) {
    let w = World::with(pool, 2, config(1)).await;
    w.reconcile().await;
    let job = pending_create_jobs(&w).await.remove(0);
    // Its worker claimed it and died mid-create; apalis handed it back as
    // it does after a missed heartbeat: pending again, one attempt counted.
    // The create may have reached the provider.
    sqlx::query(
        "update apalis.jobs set status = 'Pending', attempts = attempts + 1,
             last_result = '{\"Err\": \"Re-enqueued due to worker heartbeat timeout.\"}'
         where id = $1",
    )
    .bind(&job)
    .execute(&w.pool)
    .await
    .unwrap();
    let successor = job;
    let why = refused(manage::cancel(&w.pool, &successor, "console:alice", "stop").await);
    assert!(why.contains("tried before"), "{why}");
    assert_eq!(status(&w, &successor).await, "Pending");
    assert_eq!(w.in_flight().await, 1);
    assert_eq!(w.events("job_cancelled").await, 0);
    w.make_due().await;
    w.drain().await;
    assert_eq!(w.managed().await, 1);
    w.assert_fleet_consistent().await;
}

#[sqlx::test(migrations = false)]
async fn a_retry_never_gives_work_a_second_job(pool: PgPool) {
    let w = World::with(pool, 2, config(1)).await;
    w.reconcile().await;
    let job = pending_create_jobs(&w).await.remove(0);
    let why = refused(manage::retry(&w.pool, &job, "console:alice", "now").await);
    assert!(why.contains("only a failed or killed job"), "{why}");

    // Killed from SQL mid-flight: the sweep gives the creation a new job,
    // so retrying the killed one would run the creation twice.
    sqlx::query("update apalis.jobs set status = 'Killed', done_at = now() where id = $1")
        .bind(&job)
        .execute(&w.pool)
        .await
        .unwrap();
    let swept = sweep::run_once(&w.pool).await.unwrap();
    assert_eq!(swept.creations_resumed.len(), 1);
    let why = refused(manage::retry(&w.pool, &job, "console:alice", "now").await);
    assert!(why.contains("already carries this creation"), "{why}");
    assert_eq!(status(&w, &job).await, "Killed");

    // Once the resumed job has run, the killed one may run again: it finds
    // its creation ended and does nothing.
    w.drain().await;
    assert_eq!(w.managed().await, 1);
    manage::retry(&w.pool, &job, "console:bob", "see it finish")
        .await
        .unwrap();
    let (state, attempts): (String, i32) =
        sqlx::query_as("select status, attempts from apalis.jobs where id = $1")
            .bind(&job)
            .fetch_one(&w.pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), attempts), ("Pending", 0));
    w.drain().await;
    assert_eq!(w.fake.devices().len(), 1, "the retried job created again");
    assert_eq!(w.managed().await, 1);
    let by: String = sqlx::query_scalar(
        "select body->>'by' from shepherd.events where event_type = 'job_retried'",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert_eq!(by, "console:bob");
    // The job's own page lists the retry beside what its runs recorded.
    let history = shepherd::events::store::read_by_job(&w.pool, &job)
        .await
        .unwrap();
    assert!(
        history.iter().any(|e| e.event.type_name() == "job_retried"),
        "{history:?}"
    );
    w.assert_fleet_consistent().await;
    assert_rebuild_equals_live(&w.pool).await;
}

#[sqlx::test(migrations = false)]
async fn an_assimilation_the_sweep_would_resume_is_not_cancelled(pool: PgPool) {
    let w = World::with(pool, 1, config(1)).await;
    w.reconcile().await;
    w.run_next().await.expect("the creation runs");
    let job: String = sqlx::query_scalar(
        "select id from apalis.jobs where job_type = 'assimilate' and status = 'Pending'",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    let why = refused(manage::cancel(&w.pool, &job, "console:alice", "no").await);
    assert!(why.contains("release the machine"), "{why}");
    assert!(matches!(
        manage::cancel(&w.pool, "01JA0000000000000000000000", "console:alice", "x").await,
        Err(JobActionError::NotFound(_))
    ));
    w.drain().await;
    assert_eq!(w.managed().await, 1);
}

/// The console's cancel and a worker's claim race for the same waiting
/// creation: whichever wins, the other sees it, and a claimed creation is
/// never also recorded as cancelled.
#[sqlx::test(migrations = false)]
async fn a_cancel_racing_a_claim_wins_or_loses_whole(pool: PgPool) {
    let w = World::with(pool, 40, config(40)).await;
    sqlx::query(
        "insert into apalis.workers (id, worker_type, storage_name, layers, last_seen)
         values ('racer', 'create_device', 'test', '', now())",
    )
    .execute(&w.pool)
    .await
    .unwrap();
    w.reconcile().await;
    let jobs = pending_create_jobs(&w).await;
    assert!(jobs.len() >= 20, "{}", jobs.len());
    let (mut cancels, mut claims) = (0, 0);
    for (i, job) in jobs.iter().enumerate() {
        // Every other claim starts a little late, so each side comes first
        // for some of the jobs.
        let stagger = std::time::Duration::from_micros(if i % 2 == 0 { 0 } else { 1_000 });
        let claim = sqlx::query_scalar::<_, String>(
            "update apalis.jobs set status = 'Queued', lock_by = 'racer', lock_at = now()
             where id = (select id from apalis.jobs where id = $1 and status = 'Pending'
                         for update skip locked)
             returning id",
        )
        .bind(job)
        .fetch_optional(&w.pool);
        let claim = async {
            tokio::time::sleep(stagger).await;
            claim.await
        };
        let cancel = manage::cancel(&w.pool, job, "console:alice", "race");
        let (claimed, cancelled) = tokio::join!(claim, cancel);
        let claimed = claimed.unwrap().is_some();
        match cancelled {
            Ok(()) => cancels += 1,
            Err(JobActionError::Refused(_)) => {}
            Err(e) => panic!("{e}"),
        }
        if claimed {
            claims += 1;
        }
    }
    eprintln!("{cancels} cancels won, {claims} claims won");
    // Every job went one way; the pending rows left are the claimed ones.
    assert_eq!(cancels + claims, jobs.len(), "{cancels} + {claims}");
    let killed = w
        .count("select count(*) from apalis.jobs where status = 'Killed'")
        .await;
    assert_eq!(killed as usize, cancels);
    assert_eq!(w.events("job_cancelled").await as usize, cancels);
    assert_eq!(
        w.in_flight().await as usize,
        claims,
        "in flight should be exactly the claimed creations"
    );
    assert_rebuild_equals_live(&w.pool).await;
}

/// A retried job keeps the queue's count of its runs: a creation whose
/// row ran before (it may have sent its create) must know it when it runs
/// again, and read before it creates; reset to 0, the count would make
/// it take itself for a first run and send on the pass's listing.
#[sqlx::test(migrations = false)]
async fn a_retried_creation_knows_it_ran_before(pool: PgPool) {
    use shepherd::metal::Operation;
    let w = World::with(pool, 2, config(1)).await;
    w.reconcile().await;
    let job = pending_create_jobs(&w).await.remove(0);
    // Its runs are spent: the queue filed it Failed for good.
    sqlx::query(
        "update apalis.jobs set status = 'Failed', attempts = max_attempts, done_at = now()
         where id = $1",
    )
    .bind(&job)
    .execute(&w.pool)
    .await
    .unwrap();
    manage::retry(&w.pool, &job, "console:alice", "the outage is over")
        .await
        .unwrap();
    let (state, attempts, max): (String, i32, i32) =
        sqlx::query_as("select status, attempts, max_attempts from apalis.jobs where id = $1")
            .bind(&job)
            .fetch_one(&w.pool)
            .await
            .unwrap();
    assert_eq!((state.as_str(), attempts), ("Pending", max));
    let reads = w.fake.calls(Operation::FindHardwareReservationById);
    w.drain().await;
    assert!(
        w.fake.calls(Operation::FindHardwareReservationById) > reads,
        "the rerun sent its create without reading the reservation"
    );
    assert_eq!(w.fake.duplicate_creates(), 0);
    assert_eq!(w.managed().await, 1);
    w.assert_fleet_consistent().await;
}
