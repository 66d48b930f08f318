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
