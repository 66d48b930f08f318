//! A run that ended well is kept by the queue's own acknowledgement
//! (migration `runs_at_ack`): once, numbered as the queue counts runs, with
//! the handler's words; nothing else that changes a job's row (an
//! operator's cancel, a dead worker's job handed back, a failure, an edit
//! by hand) writes a run. The worker's side is walked end to end in
//! `workers/tests/walk.rs`.

mod common;

use sqlx::PgPool;

async fn runs(db: &PgPool, id: &str) -> Vec<(i32, String, Option<String>, Option<String>)> {
    sqlx::query_as(
        "select run, outcome, worker, result from shepherd.job_runs where job_id = $1 order by run",
    )
    .bind(id)
    .fetch_all(db)
    .await
    .expect("reading the job's runs")
}

/// Claims the job as apalis's fetch does; returns the claimed id.
async fn claim(db: &PgPool, worker: &str) -> String {
    sqlx::query_scalar("select id from apalis.get_jobs($1, 'reconcile', 1)")
        .bind(worker)
        .fetch_one(db)
        .await
        .expect("a job to claim")
}

/// Acknowledges as apalis-postgres's `handle_result.sql` does.
async fn ack(db: &PgPool, id: &str, worker: &str, status: &str, result: serde_json::Value) {
    let done = sqlx::query(
        "update apalis.jobs set status = $3, attempts = attempts + 1, last_result = $4,
                done_at = now()
         where id = $1 and lock_by = $2",
    )
    .bind(id)
    .bind(worker)
    .bind(status)
    .bind(result)
    .execute(db)
    .await
    .expect("the acknowledgement");
    assert_eq!(done.rows_affected(), 1);
}

#[sqlx::test(migrations = false)]
async fn a_run_acknowledged_done_is_kept_once_and_nothing_else_writes_one(db: PgPool) {
    common::migrated(&db).await;
    // The queue's workers, as apalis registers them: a claim names one.
    sqlx::query(
        "insert into apalis.workers (id, worker_type, storage_name)
         select w, 'reconcile', 'PostgresStorage' from unnest(array['w1', 'w2', 'w3', 'w4']) w",
    )
    .execute(&db)
    .await
    .expect("registering the workers");
    let push = "select shepherd.push_job('reconcile', '{\"requested_by\": \"test\"}'::jsonb, now() - interval '1 second', 25, null)";
    let first: String = sqlx::query_scalar(push).fetch_one(&db).await.unwrap();

    // A failure is the worker's to record (it alone tells dropped from
    // failed): the acknowledgement writes nothing.
    assert_eq!(claim(&db, "w1").await, first);
    ack(
        &db,
        &first,
        "w1",
        "Failed",
        serde_json::json!({"Err": "boom"}),
    )
    .await;
    assert!(
        runs(&db, &first).await.is_empty(),
        "a failed run was written at its ack"
    );

    // Its second run ends well: kept as run 2, on its worker, in its words.
    sqlx::query("update apalis.jobs set run_at = now() - interval '1 second' where id = $1")
        .bind(&first)
        .execute(&db)
        .await
        .unwrap();
    assert_eq!(claim(&db, "w2").await, first);
    ack(
        &db,
        &first,
        "w2",
        "Done",
        serde_json::json!({"Ok": "Ran { enqueued: 3 }"}),
    )
    .await;
    assert_eq!(
        runs(&db, &first).await,
        vec![(
            2,
            "ok".into(),
            Some("w2".into()),
            Some("Ran { enqueued: 3 }".into())
        )]
    );
    // An edit by hand of the finished row writes no second run.
    sqlx::query(
        "update apalis.jobs set status = 'Done', last_result = '{\"Ok\": \"x\"}' where id = $1",
    )
    .bind(&first)
    .execute(&db)
    .await
    .unwrap();
    assert_eq!(runs(&db, &first).await.len(), 1);

    // A job cancelled by an operator, and one handed back from a dead
    // worker, ran no run that ended: neither is written.
    let second: String = sqlx::query_scalar(push).fetch_one(&db).await.unwrap();
    shepherd::jobs::manage::cancel(&db, &second, "op", "not wanted")
        .await
        .expect("the cancel");
    let third: String = sqlx::query_scalar(push).fetch_one(&db).await.unwrap();
    assert_eq!(claim(&db, "w4").await, third);
    sqlx::query(
        "update apalis.jobs set status = 'Pending', attempts = attempts + 1, lock_by = null,
                last_result = '{\"Err\": \"Re-enqueued due to worker heartbeat timeout.\"}'
         where id = $1",
    )
    .bind(&third)
    .execute(&db)
    .await
    .unwrap();
    assert!(runs(&db, &second).await.is_empty(), "a cancel wrote a run");
    assert!(
        runs(&db, &third).await.is_empty(),
        "a hand-back wrote a run"
    );
}

/// A created machine's Assimilate pushed claimed by the worker that made
/// it (`jobs::follow_up`): no worker is woken for it and no fetch takes
/// it; its acknowledgement is apalis's, kept as apalis's are; a row the
/// queue took from the claimant meanwhile is left to the queue.
#[sqlx::test(migrations = false)]
async fn a_claimed_follow_up_wakes_no_worker_and_is_acknowledged_as_apalis_would(db: PgPool) {
    use shepherd::jobs::AssimilateArgs;
    use shepherd::jobs::queue::{self, Ending};
    common::migrated(&db).await;
    let claimant = "create_device@test:1#0";
    // A claim names a registered worker (apalis's foreign key).
    sqlx::query(
        "insert into apalis.workers (id, worker_type, storage_name)
         values ($1, 'create_device', 'PostgresStorage'), ('assimilate@x', 'assimilate', 'PostgresStorage')",
    )
    .bind(claimant)
    .execute(&db)
    .await
    .expect("registering the claimant");
    let mut listener = sqlx::postgres::PgListener::connect_with(&db)
        .await
        .expect("a listener");
    listener
        .listen("apalis::job::insert")
        .await
        .expect("listening");
    let args = |device: &str| AssimilateArgs {
        device: device.into(),
        reservation: None,
        manual: false,
        created: None,
        attempt: 1,
    };
    let mut conn = db.acquire().await.unwrap();
    let mut push = async |device: &str| {
        let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
        let id = queue::push_assimilate_claimed(&mut tx, &args(device), None, claimant)
            .await
            .expect("the claimed push");
        tx.commit().await.unwrap();
        id
    };
    let (done, taken, failed) = (push("d1").await, push("d2").await, push("d3").await);
    // An ordinary push, which does wake the workers.
    let mut tx = db.begin().await.unwrap();
    let ordinary = queue::push_assimilate(&mut tx, &args("d4"), None)
        .await
        .unwrap()
        .expect("an id");
    tx.commit().await.unwrap();
    let woken = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
        .await
        .expect("the ordinary push's notification")
        .unwrap();
    assert!(
        woken.payload().contains(&ordinary),
        "woken by {}",
        woken.payload()
    );
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(300), listener.recv())
            .await
            .is_err(),
        "a claimed push woke the workers"
    );
    let fetched: Vec<String> =
        sqlx::query_scalar("select id from apalis.get_jobs('assimilate@x', 'assimilate', 10)")
            .fetch_all(&db)
            .await
            .unwrap();
    assert_eq!(
        fetched,
        vec![ordinary.clone()],
        "a fetch took a claimed row"
    );

    let mut conn = db.acquire().await.unwrap();
    let finished =
        queue::finish_claimed(&mut conn, &done, claimant, &Ending::Done("Managed".into()))
            .await
            .unwrap();
    assert!(finished);
    assert_eq!(
        runs(&db, &done).await,
        vec![(
            1,
            "ok".into(),
            Some(claimant.into()),
            Some("Managed".into())
        )]
    );

    // Taken from the claimant meanwhile, as apalis hands back a silent
    // worker's rows: the late acknowledgement leaves it to the queue.
    sqlx::query(
        "update apalis.jobs set status = 'Pending', attempts = attempts + 1, lock_by = null,
                lock_at = null, last_result = '{\"Err\": \"Re-enqueued due to worker heartbeat timeout.\"}'
         where id = $1",
    )
    .bind(&taken)
    .execute(&db)
    .await
    .unwrap();
    let finished = queue::finish_claimed(&mut conn, &taken, claimant, &Ending::Done("late".into()))
        .await
        .unwrap();
    assert!(!finished, "a late acknowledgement took the row back");
    let status: (String, i32) =
        sqlx::query_as("select status, attempts from apalis.jobs where id = $1")
            .bind(&taken)
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(status, ("Pending".into(), 1));
    assert!(runs(&db, &taken).await.is_empty());

    // A failure goes back to the queue with a run counted, for a fetch.
    let finished =
        queue::finish_claimed(&mut conn, &failed, claimant, &Ending::Failed("boom".into()))
            .await
            .unwrap();
    assert!(finished);
    let again: Vec<(String, i32)> = sqlx::query_as(
        "select id, attempts from apalis.get_jobs('assimilate@x', 'assimilate', 10)",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    // The row handed back, and the failed one.
    assert_eq!(again, vec![(taken.clone(), 1), (failed.clone(), 1)]);

    // A claim whose run was cut short goes back unrun, once; a claim that
    // never committed is nothing to hand back.
    let mut tx = db.begin().await.unwrap();
    let unrun = queue::push_assimilate_claimed(&mut tx, &args("d5"), None, claimant)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(
        queue::hand_back_claimed(&mut conn, &unrun, claimant)
            .await
            .unwrap()
    );
    assert!(
        !queue::hand_back_claimed(&mut conn, &unrun, claimant)
            .await
            .unwrap()
    );
    let row: (String, Option<String>, i32) =
        sqlx::query_as("select status, lock_by, attempts from apalis.jobs where id = $1")
            .bind(&unrun)
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(row, ("Pending".into(), None, 0));
    let mut tx = db.begin().await.unwrap();
    let rolled_back = queue::push_assimilate_claimed(&mut tx, &args("d6"), None, claimant)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(
        !queue::hand_back_claimed(&mut conn, &rolled_back, claimant)
            .await
            .unwrap()
    );
}
