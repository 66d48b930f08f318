//! A created machine's Assimilate, claimed and run by the worker that made
//! the machine (`shepherd::jobs::follow_up`): done without the queue's
//! fetch, handed back to the queue when it fails, and taken up by another
//! worker when its own dies.

use super::*;

/// Installs, as the test's superuser, a fault on the first
/// `machine_assimilated` event the database is asked to record: `fault` is
/// PL/pgSQL run once (a sequence counts, since a raise rolls back any
/// table it would have written).
async fn on_first_assimilation(pool: &PgPool, fault: &str) {
    sqlx::query("create sequence public.first_assimilation")
        .execute(pool)
        .await
        .unwrap();
    // The fault is the test's own text.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "create function public.first_assimilation_fault() returns trigger language plpgsql as $$
         begin
             if new.event_type = 'machine_assimilated'
                and nextval('public.first_assimilation') = 1 then
                 {fault};
             end if;
             return new;
         end $$"
    )))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "create trigger first_assimilation_fault before insert on shepherd.events
         for each row execute function public.first_assimilation_fault()",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// Each Assimilate job: its status, runs counted, claimant; and each of
/// its kept runs: worker and outcome, in order.
async fn assimilations(pool: &PgPool) -> Vec<(String, i32, String, Vec<(String, String)>)> {
    let rows: Vec<(String, String, i32, Option<String>)> = sqlx::query_as(
        "select id, status, attempts, lock_by from apalis.jobs
         where job_type = 'assimilate' order by id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut out = vec![];
    for (id, status, attempts, lock_by) in rows {
        let runs: Vec<(Option<String>, String)> = sqlx::query_as(
            "select worker, outcome from shepherd.job_runs where job_id = $1 order by run",
        )
        .bind(&id)
        .fetch_all(pool)
        .await
        .unwrap();
        let runs = runs
            .into_iter()
            .map(|(w, o)| (w.unwrap_or_default(), o))
            .collect();
        out.push((status, attempts, lock_by.unwrap_or_default(), runs));
    }
    out
}

fn kind_of(worker: &str) -> &str {
    worker.split('@').next().unwrap_or_default()
}

#[sqlx::test(migrations = false)]
async fn a_created_machine_is_assimilated_by_the_worker_that_made_it(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 3, Faults::default()).await;
    migrate(&c).await;
    c.spawn_worker(&["--max-machines", "3"]);
    c.wait_for(3, 3, Duration::from_secs(60)).await;
    let done = assimilations(&c.pool).await;
    assert_eq!(done.len(), 3, "{done:?}");
    for (status, attempts, lock_by, runs) in &done {
        assert_eq!((status.as_str(), *attempts), ("Done", 1), "{done:?}");
        // Claimed by the creating worker, never fetched by the queue's.
        assert_eq!(kind_of(lock_by), "create_device", "{done:?}");
        assert_eq!(runs.len(), 1, "{done:?}");
        assert_eq!(
            (runs[0].0.as_str(), runs[0].1.as_str()),
            (lock_by.as_str(), "ok")
        );
    }
    // Each acknowledged in the transaction that recorded its machine: the
    // same `now()` stamps both.
    let apart = c
        .count(
            "select count(*) from apalis.jobs j
             join shepherd.events e on e.job_id = j.id and e.event_type = 'machine_assimilated'
             where j.job_type = 'assimilate' and e.recorded_at is distinct from j.done_at",
        )
        .await;
    let machines = c
        .count("select count(*) from shepherd.events where event_type = 'machine_assimilated'")
        .await;
    assert_eq!(
        (apart, machines),
        (0, 3),
        "acknowledged apart from the record"
    );
    c.stop_all();
    let managed = c.managed_ids().await;
    c.assert_consistent(&managed);
}

#[sqlx::test(migrations = false)]
async fn an_assimilation_that_fails_on_its_creator_goes_back_to_the_queue(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 1, Faults::default()).await;
    migrate(&c).await;
    on_first_assimilation(
        &c.pool,
        "raise exception 'injected: the first assimilation fails'",
    )
    .await;
    c.spawn_worker(&["--max-machines", "1"]);
    c.wait_for(1, 1, Duration::from_secs(60)).await;
    let done = assimilations(&c.pool).await;
    let [(status, attempts, lock_by, runs)] = done.as_slice() else {
        panic!("one assimilation expected: {done:?}");
    };
    assert_eq!((status.as_str(), *attempts), ("Done", 2), "{done:?}");
    // The creator's run failed and was kept; the queue's worker ran it again.
    assert_eq!(runs.len(), 2, "{done:?}");
    assert_eq!(
        (kind_of(&runs[0].0), runs[0].1.as_str()),
        ("create_device", "failed"),
        "{done:?}"
    );
    assert_eq!(
        (kind_of(&runs[1].0), runs[1].1.as_str()),
        ("assimilate", "ok"),
        "{done:?}"
    );
    assert_eq!(kind_of(lock_by), "assimilate", "{done:?}");
    c.stop_all();
    let managed = c.managed_ids().await;
    assert_eq!(managed.len(), 1);
    c.assert_consistent(&managed);
}

#[sqlx::test(migrations = false)]
async fn an_assimilation_whose_creator_dies_is_taken_up_by_another_worker(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 1, Faults::default()).await;
    migrate(&c).await;
    // The creator's assimilation holds for 5 s: long enough to be killed in.
    on_first_assimilation(&c.pool, "perform pg_catalog.pg_sleep(5)").await;
    c.spawn_worker(&["--max-machines", "1"]);
    let claimed_at = Instant::now();
    loop {
        let claimed = c
            .count(
                "select count(*) from apalis.jobs
                 where job_type = 'assimilate' and status = 'Queued'
                   and lock_by like 'create_device@%'",
            )
            .await;
        if claimed == 1 {
            break;
        }
        assert!(
            claimed_at.elapsed() < Duration::from_secs(60),
            "the creator never claimed its machine's assimilation"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal(&c.workers[0], "KILL");
    assert!(!c.workers[0].wait().unwrap().success());
    assert_eq!(c.managed().await, 0, "assimilated before the kill");
    c.spawn_plain_worker(&["--max-machines", "1"]);
    c.wait_for(1, 1, Duration::from_secs(60)).await;
    let done = assimilations(&c.pool).await;
    let [(status, _, lock_by, runs)] = done.as_slice() else {
        panic!("one assimilation expected: {done:?}");
    };
    // Done by the second process, its killed run leaving no record.
    let second = format!(":{}:", c.workers[1].id());
    assert_eq!(status, "Done", "{done:?}");
    assert!(lock_by.contains(&second), "{second} {done:?}");
    assert_eq!(runs.len(), 1, "{done:?}");
    assert!(runs[0].0.contains(&second) && runs[0].1 == "ok", "{done:?}");
    c.stop_all();
    let managed = c.managed_ids().await;
    assert_eq!(managed.len(), 1);
    assert_eq!(c.fake.devices().len(), 1, "a second machine was made");
    c.assert_consistent(&managed);
}

/// The creation's acknowledgement waits for its follow-up, then goes at
/// once: the queue's nudge comes when both runs are over, not when the
/// creation's own ends (then, with a poll of a minute and a heartbeat of
/// 30 s, the creation stayed unacknowledged for half a minute).
#[sqlx::test(migrations = false)]
async fn a_creation_is_acknowledged_as_soon_as_its_follow_up_ends(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 1, Faults::default()).await;
    migrate(&c).await;
    on_first_assimilation(&c.pool, "perform pg_catalog.pg_sleep(1)").await;
    super::queue::one_machine_acknowledged_within(&mut c, Duration::from_secs(10)).await;
    c.stop_all();
}

/// A queue worker's row, last heard from `silent_secs` ago.
async fn queue_worker(c: &Cluster, worker: &str, silent_secs: u32) {
    sqlx::query(
        "insert into apalis.workers (id, worker_type, storage_name, last_seen)
         values ($1, split_part($1, '@', 1), 'PostgresStorage',
                 now() - make_interval(secs => $2))
         on conflict (id) do nothing",
    )
    .bind(worker)
    .bind(f64::from(silent_secs))
    .execute(&c.pool)
    .await
    .expect("a queue worker's row");
}

/// An assimilation claimed by `worker` in `status`: its id.
async fn claimed_by(c: &Cluster, worker: &str, status: &str) -> String {
    let id: String = sqlx::query_scalar(
        "select shepherd.push_job('assimilate', jsonb_build_object('device', $1::text))",
    )
    .bind(format!("{worker}/{status}"))
    .fetch_one(&c.pool)
    .await
    .expect("a job");
    sqlx::query("update apalis.jobs set status = $2, lock_by = $3, lock_at = now() where id = $1")
        .bind(&id)
        .bind(status)
        .bind(worker)
        .execute(&c.pool)
        .await
        .expect("claiming the job");
    id
}

/// Each row's status, claimant and runs counted, in the order of `ids`.
async fn rows_of(c: &Cluster, ids: &[String]) -> Vec<(String, Option<String>, i32)> {
    let mut rows = vec![];
    for id in ids {
        let row = sqlx::query_as("select status, lock_by, attempts from apalis.jobs where id = $1")
            .bind(id)
            .fetch_one(&c.pool)
            .await
            .expect("the job's row");
        rows.push(row);
    }
    rows
}

/// Two processes may share a host and a pid (two pid-1 containers on host
/// networking, hosts without /etc/hostname): their names differ by the id
/// each draws at start. A process starting hands back only what a process
/// on its host with its pid left claimed and then fell silent for the
/// rescue window (a container restarted as pid 1), never a live one's
/// claims, nor another host's or pid's; a name of the release before the
/// start id counts as its host and pid.
#[sqlx::test(migrations = false)]
async fn claims_of_a_silent_process_on_this_host_and_pid_are_handed_back_and_a_live_ones_kept(
    pool: PgPool,
) {
    let c = Cluster::new(pool, 0, Faults::default()).await;
    migrate(&c).await;
    // (worker, silent for): a dead predecessor, a live twin, a predecessor
    // of the old naming, another pid, another host.
    let workers = [
        ("create_device@h:7:aaaa0000#0", 600),
        ("assimilate@h:7:bbbb0000#3", 0),
        ("assimilate@h:7#0", 600),
        ("assimilate@h:77:cccc0000#0", 600),
        ("assimilate@h_7:dddd0000#0", 600),
    ];
    let mut claimed = vec![];
    for (worker, silent) in workers {
        queue_worker(&c, worker, silent).await;
        claimed.push(claimed_by(&c, worker, "Queued").await);
    }
    let released = shepherd_workers::services::runtime::release_previous(
        &c.pool,
        "h:7:ffff0000",
        Duration::from_secs(60),
    )
    .await
    .expect("the release");
    assert_eq!(released, 2);
    let rows = rows_of(&c, &claimed).await;
    assert_eq!(
        rows,
        vec![
            ("Pending".into(), None, 1),
            ("Queued".into(), Some("assimilate@h:7:bbbb0000#3".into()), 0),
            ("Pending".into(), None, 1),
            (
                "Queued".into(),
                Some("assimilate@h:77:cccc0000#0".into()),
                0
            ),
            ("Queued".into(), Some("assimilate@h_7:dddd0000#0".into()), 0),
        ]
    );
}

/// A worker's claims handed back when it stops (its drain cut short): a
/// row whose run had started counts it, so that its next run is a rerun,
/// which looks for what the cut-off run may have sent before it sends
/// anything; a row claimed and never started does not.
#[sqlx::test(migrations = false)]
async fn a_handed_back_running_row_counts_its_run(pool: PgPool) {
    let c = Cluster::new(pool, 0, Faults::default()).await;
    migrate(&c).await;
    let worker = "create_device@h:7:aaaa0000#0";
    queue_worker(&c, worker, 0).await;
    let mut ids = vec![];
    for status in ["Running", "Queued"] {
        ids.push(claimed_by(&c, worker, status).await);
    }
    shepherd_workers::services::runtime::release(&c.pool, worker).await;
    let rows = rows_of(&c, &ids).await;
    assert_eq!(
        rows,
        vec![("Pending".into(), None, 1), ("Pending".into(), None, 0)]
    );
}
