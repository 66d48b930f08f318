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

/// A worker at rest holds no more than the queue's own connections (the
/// listener, and two its pollers and heartbeats take in turn: at most 3),
/// after the jobs' pool has given back what a burst of work opened.
#[sqlx::test(migrations = false)]
async fn a_worker_at_rest_holds_at_most_three_connections(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 3, Faults::default()).await;
    migrate(&c).await;
    c.spawn_plain_worker(&[
        "--db-idle-timeout",
        "2s",
        "--sweep-interval",
        "1h",
        "--max-machines",
        "3",
    ]);
    // A burst of work: a pass and its creations and assimilations.
    sqlx::query("select shepherd.enqueue_reconcile()")
        .execute(&c.pool)
        .await
        .unwrap();
    c.wait_for(3, 3, Duration::from_secs(60)).await;
    let held = |name: &'static str| {
        let pool = c.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "select count(*) from pg_stat_activity
                 where datname = current_database() and application_name = $1",
            )
            .bind(name)
            .fetch_one(&pool)
            .await
            .expect("reading pg_stat_activity")
        }
    };
    // The burst opened more than the queue's few.
    let busy = held("shepherd").await + held("shepherd-queue").await;
    // Past the jobs' pool's idle timeout (2 s) and the reaper's round.
    let started = Instant::now();
    let (mut jobs, mut queue) = (held("shepherd").await, held("shepherd-queue").await);
    let most = i64::from(shepherd::db::QUEUE_CONNECTIONS);
    assert!(most <= 3, "the queue's pool alone is {most}");
    while jobs + queue > most && started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        (jobs, queue) = (held("shepherd").await, held("shepherd-queue").await);
    }
    // Still so a while later: the pollers keep only the queue's open.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (jobs, queue) = (held("shepherd").await, held("shepherd-queue").await);
    eprintln!(
        "connections: {busy} just after the work, then {jobs} of the jobs' and {queue} of the queue's at rest"
    );
    assert!(queue <= most, "the queue holds {queue}");
    assert!(
        jobs + queue <= most,
        "at rest: {jobs} of the jobs' and {queue} of the queue's"
    );
    c.stop_all();
}
