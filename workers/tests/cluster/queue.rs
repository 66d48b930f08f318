//! The queue's housekeeping with real workers: finished jobs pruned after
//! their retention, and a job body that does not decode failing alone.

use super::*;

#[sqlx::test(migrations = false)]
async fn finished_jobs_are_pruned_after_their_retention(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let c = Cluster::new(pool, 1, Faults::default()).await;
    migrate(&c).await;
    for (status, age_hours) in [
        ("Done", 48),
        ("Killed", 48),
        ("Done", 1),
        ("Pending", 48),
        ("Failed", 48),
    ] {
        let id: String = sqlx::query_scalar("select shepherd.push_job('reconcile', '{}')")
            .fetch_one(&c.pool)
            .await
            .unwrap();
        sqlx::query(
            "update apalis.jobs set status = $2, done_at = now() - make_interval(hours => $3),
                    run_at = now() - make_interval(hours => $3) where id = $1",
        )
        .bind(&id)
        .bind(status)
        .bind(age_hours)
        .execute(&c.pool)
        .await
        .unwrap();
        // Each ran once; its run goes with it.
        sqlx::query(
            "insert into shepherd.job_runs (job_id, run, kind, started_at, ended_at, outcome, result)
             values ($1, 1, 'reconcile', now() - make_interval(hours => $2), now(), 'ok', 'x')",
        )
        .bind(&id)
        .bind(age_hours)
        .execute(&c.pool)
        .await
        .unwrap();
    }
    // And a run left of a job someone deleted by hand long ago.
    sqlx::query(
        "insert into shepherd.job_runs (job_id, run, kind, started_at, ended_at, outcome)
         values ('deleted-by-hand', 1, 'reconcile', now() - interval '3 days',
                 now() - interval '3 days', 'ok')",
    )
    .execute(&c.pool)
    .await
    .unwrap();
    let pruned =
        shepherd_workers::services::scheduler::prune(&c.pool, Duration::from_secs(24 * 3600))
            .await
            .unwrap();
    // Old Done and Killed go; a recent Done, a Pending, and a Failed job
    // with attempts left stay.
    assert_eq!(pruned, 2);
    let left = c.count("select count(*) from apalis.jobs").await;
    assert_eq!(left, 3);
    let runs = c
        .count(
            "select count(*) from shepherd.job_runs r
             where exists (select 1 from apalis.jobs j where j.id = r.job_id)",
        )
        .await;
    let all_runs = c.count("select count(*) from shepherd.job_runs").await;
    assert_eq!((runs, all_runs), (3, 3), "runs outlived their jobs");
}

#[sqlx::test(migrations = false)]
async fn a_job_body_that_does_not_decode_fails_alone(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 5, Faults::default()).await;
    migrate(&c).await;
    let poison: String =
        sqlx::query_scalar("select shepherd.push_job('assimilate', '{\"nope\": 1}')")
            .fetch_one(&c.pool)
            .await
            .unwrap();
    c.spawn_worker(&["--max-machines", "2"]);
    c.wait_for(2, 2, Duration::from_secs(60)).await;
    let (status, result): (String, String) =
        sqlx::query_as("select status, last_result::text from apalis.jobs where id = $1")
            .bind(&poison)
            .fetch_one(&c.pool)
            .await
            .unwrap();
    assert_eq!(status, "Killed");
    assert!(result.contains("undecodable"), "{result}");
    c.stop_all();
}
