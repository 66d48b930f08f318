//! The queue's housekeeping with real workers: finished jobs pruned after
//! their retention, a job body that does not decode failing alone, and a
//! finished job acknowledged without waiting for the poll.

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

/// A worker at rest holds at most 3 connections with the defaults (the
/// listener, and the pool of 2 its queues' polls and heartbeats take in
/// turn), after the pool has given back what a burst of work opened.
#[sqlx::test(migrations = false)]
async fn a_worker_at_rest_holds_at_most_three_connections(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 3, Faults::default()).await;
    migrate(&c).await;
    let metrics = c.spawn_plain_worker(&[
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
    let held = || {
        let pool = c.pool.clone();
        async move {
            sqlx::query_as::<_, (i64, i64)>(
                "select count(*) filter (where application_name = 'shepherd'),
                        count(*) filter (where application_name = 'shepherd-listen')
                 from pg_stat_activity where datname = current_database()",
            )
            .fetch_one(&pool)
            .await
            .expect("reading pg_stat_activity")
        }
    };
    let most = shepherd_workers::commands::worker::DEFAULT_DB_CONNECTIONS
        + shepherd::db::LISTEN_CONNECTIONS;
    assert!(most <= 3, "a default worker may hold {most}");
    let most = i64::from(most);
    // Past the pool's idle timeout (2 s) and the reaper's round.
    let started = Instant::now();
    let (mut pooled, mut listening) = held().await;
    while pooled + listening > most && started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        (pooled, listening) = held().await;
    }
    // Still so a while later, sampled: the polls keep no more open.
    let mut peak = 0;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (pooled, listening) = held().await;
        assert_eq!(listening, 1, "one connection listens");
        peak = peak.max(pooled + listening);
    }
    eprintln!("connections at rest: at most {peak}");
    assert!(peak <= most, "at rest: {peak} held, at most {most} allowed");
    // The worker's /metrics says the same of its pool as the server does.
    let text = reqwest::get(format!("http://{metrics}/metrics"))
        .await
        .expect("scraping the worker")
        .text()
        .await
        .expect("reading the scrape");
    let figure = |series: &str| -> i64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"));
        line.rsplit_once(' ').unwrap().1.parse().unwrap()
    };
    assert_eq!(
        figure("shepherd_db_connections_max{pool=\"work\"}"),
        i64::from(shepherd_workers::commands::worker::DEFAULT_DB_CONNECTIONS)
    );
    let open = figure("shepherd_db_connections{pool=\"work\",state=\"in_use\"}")
        + figure("shepherd_db_connections{pool=\"work\",state=\"idle\"}");
    // Its pool, and the listener beside it, within the bound.
    let listener = i64::from(shepherd::db::LISTEN_CONNECTIONS);
    assert!(
        open + listener <= most,
        "the worker says its pool holds {open}"
    );
    c.stop_all();
}

/// apalis sends a run's acknowledgement from its worker's next poll, and an
/// idle worker polls on a wake, its poll interval or its heartbeat: the
/// last job of a burst stayed unacknowledged (its status, its run's record)
/// until then. The worker polls its queue once more when the last of its
/// runs ends, so with a poll of a minute and a heartbeat of 30 s a lone job
/// is acknowledged at once.
#[sqlx::test(migrations = false)]
async fn a_lone_job_is_acknowledged_without_waiting_for_the_poll(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 1, Faults::default()).await;
    migrate(&c).await;
    one_machine_acknowledged_within(&mut c, Duration::from_secs(20)).await;
    let ok: i64 = sqlx::query_scalar("select count(*) from shepherd.job_runs where outcome = 'ok'")
        .fetch_one(&c.pool)
        .await
        .expect("counting the runs");
    assert_eq!(
        ok, 3,
        "one run each for the pass, the creation and the assimilation"
    );
    c.stop_all();
}

/// One worker polling once a minute with a heartbeat of 30 s makes one
/// machine; every job it ran is then acknowledged within `limit`, never
/// left to the poll or the heartbeat.
pub(crate) async fn one_machine_acknowledged_within(c: &mut Cluster, limit: Duration) {
    c.spawn_plain_worker(&[
        "--poll-interval",
        "60s",
        "--heartbeat",
        "30s",
        "--max-machines",
        "1",
    ]);
    sqlx::query("select shepherd.enqueue_reconcile()")
        .execute(&c.pool)
        .await
        .unwrap();
    c.wait_for(1, 1, Duration::from_secs(60)).await;
    // The runs ended, and nothing else is coming: their acknowledgements
    // come now, not at the next poll.
    let started = Instant::now();
    loop {
        let open: i64 = sqlx::query_scalar(
            "select count(*) from apalis.jobs where status in ('Queued', 'Running')",
        )
        .fetch_one(&c.pool)
        .await
        .expect("counting unacknowledged jobs");
        if open == 0 {
            break;
        }
        assert!(
            started.elapsed() < limit,
            "{open} finished jobs still unacknowledged after {:?} (the poll is a minute); logs in {}",
            started.elapsed(),
            c.dir.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
