//! A worker and its database: the one listening connection, a server with
//! no connection left at start, and a database lost mid-run.

use super::*;

/// One connection listens for new jobs in a worker, not one per queue: a
/// job inserted from SQL wakes the worker through it long before its 30 s
/// poll. With --no-listen the worker holds no listening connection (as
/// PgBouncer in transaction mode requires) and finds the job by polling.
#[sqlx::test(migrations = false)]
async fn one_connection_listens_and_a_worker_can_poll_without_it(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 2, Faults::default()).await;
    migrate(&c).await;
    c.spawn_worker(&["--max-machines", "2", "--device-creation-rate", "10ms,1"]);
    c.wait_for(2, 2, Duration::from_secs(60)).await;
    c.stop_all();

    let db = c.pool.clone();
    let listening = || {
        let pool = db.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "select count(*) from pg_stat_activity
                 where datname = current_database() and application_name = 'shepherd-listen'
                   and query like 'LISTEN%'",
            )
            .fetch_one(&pool)
            .await
            .expect("reading pg_stat_activity")
        }
    };
    for (listen, poll) in [(true, "30s"), (false, "1s")] {
        let port = format!("127.0.0.1:{}", free_port());
        let mut args = vec![
            "worker",
            "--metrics-listen",
            &port,
            "--poll-interval",
            poll,
            "--max-machines",
            "2",
        ];
        if !listen {
            args.push("--no-listen");
        }
        let log = std::fs::File::create(c.dir.join(format!("listen-{listen}.log"))).unwrap();
        let child = c
            .command(&args)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        c.workers.push(child);
        // Started and listening (or not): four queues, one listener.
        let started = Instant::now();
        while listening().await != i64::from(listen) && started.elapsed() < Duration::from_secs(20)
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            listening().await,
            i64::from(listen),
            "listening connections"
        );

        // A pass asked for from SQL is taken up: at once when listening
        // (its poll is 30 s away), within its 1 s poll when not.
        let before = c
            .count("select count(*) from shepherd.events where event_type = 'reconcile_started'")
            .await;
        sqlx::query("select shepherd.enqueue_reconcile()")
            .execute(&c.pool)
            .await
            .unwrap();
        let asked = Instant::now();
        loop {
            let now = c
                .count(
                    "select count(*) from shepherd.events where event_type = 'reconcile_started'",
                )
                .await;
            if now > before {
                break;
            }
            assert!(
                asked.elapsed() < Duration::from_secs(10),
                "the pass was not taken up within 10 s (listen: {listen}); logs in {}",
                c.dir.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        c.stop_all();
    }
}

/// The cluster's URL as a role with a connection limit of 0: every
/// connection it asks for is refused with SQLSTATE 53300, as on a full
/// server.
async fn full_role_url(c: &Cluster) -> String {
    migrate(c).await;
    sqlx::query(
        "do $$ begin
             create role shepherd_full_test login connection limit 0;
         exception when duplicate_object or unique_violation then null;
         end $$",
    )
    .execute(&c.pool)
    .await
    .expect("creating a role with no connection allowed");
    let as_full = c
        .db_url
        .replacen("://postgres@", "://shepherd_full_test@", 1);
    assert_ne!(as_full, c.db_url);
    as_full
}

/// Postgres's "no connection left" (a server at max_connections, a role at
/// its limit: SQLSTATE 53300) is named as such, with what a worker holds
/// and what to do, not taken for a wrong password.
#[sqlx::test(migrations = false)]
async fn a_full_postgres_is_named_with_the_next_step(pool: PgPool) {
    let c = Cluster::new(pool, 1, Faults::default()).await;
    let as_full = full_role_url(&c).await;
    let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["status"])
        .env("DATABASE_URL", &as_full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("no connection left"), "{stderr}");
    assert!(stderr.contains("max_connections"), "{stderr}");
    assert!(!stderr.contains("Check the user, password"), "{stderr}");
}

/// A worker whose Postgres has no connection left does not exit (a
/// supervisor restarting it would only add to the crowd): it says so once,
/// with the formula, and keeps trying.
#[sqlx::test(migrations = false)]
async fn a_worker_without_a_connection_says_so_once_and_waits(pool: PgPool) {
    let mut c = Cluster::new(pool, 1, Faults::default()).await;
    let as_full = full_role_url(&c).await;
    c.spawn_worker_with_env(&["--skip-migrations"], &[("DATABASE_URL", &as_full)]);
    // Three tries at least (one every 5 s).
    tokio::time::sleep(Duration::from_secs(12)).await;
    let still = c.workers[0].try_wait().expect("asking after the worker");
    let log = std::fs::read_to_string(c.dir.join("worker-0.log")).expect("the worker's log");
    assert!(still.is_none(), "the worker exited ({still:?}): {log}");
    assert_eq!(
        log.matches("no connection left").count(),
        1,
        "said more or less than once: {log}"
    );
    assert!(log.contains("waiting for a connection"), "{log}");
    assert!(log.contains("5 with the defaults"), "{log}");
    c.stop_all();
}

/// A TCP door between a worker and Postgres that the test can shut: shut,
/// it cuts every connection through it and drops new ones at once, as a
/// server that went away does; opened again, it forwards as before.
struct Door {
    url: String,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
}

impl Door {
    async fn before(db_url: &str) -> Door {
        let server = "127.0.0.1:5432";
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding the door");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let addr = listener.local_addr().expect("the door's address");
        let url = db_url.replacen(server, &addr.to_string(), 1);
        assert_ne!(url, db_url, "the test database is not at {server}");
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (cut, cuts) = tokio::sync::watch::channel(0u64);
        let is_open = open.clone();
        // On a thread and runtime of its own: the test blocks its own
        // runtime when it waits for a worker to exit (`Cluster::stop_all`),
        // and a door served there stopped passing the stopping worker's
        // last statements, so the worker never exited (seen in CI: the
        // test hung at its end).
        let door = async move {
            let listener =
                tokio::net::TcpListener::from_std(listener).expect("the door's listener");
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !is_open.load(std::sync::atomic::Ordering::SeqCst) {
                    continue;
                }
                // Cut by later shuts only, not by the ones before it.
                let mut cuts = cuts.clone();
                cuts.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(server).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        };
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the door's runtime")
                .block_on(door)
        });
        Door { url, open, cut }
    }

    fn shut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        self.cut.send_modify(|n| *n += 1);
    }

    fn reopen(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A worker whose database goes away mid-run says so once, naming the
/// server's trouble, however often its four queues fail and restart
/// meanwhile; it stays up, says when the server answers again, and runs
/// the next job.
#[sqlx::test(migrations = false)]
async fn a_worker_that_loses_its_database_says_so_once_and_carries_on(pool: PgPool) {
    let _quiet = TIMED.read().await;
    let mut c = Cluster::new(pool, 3, Faults::default()).await;
    migrate(&c).await;
    let door = Door::before(&c.db_url).await;
    c.spawn_worker_with_env(
        &[
            "--skip-migrations",
            "--max-machines",
            "2",
            "--device-creation-rate",
            "10ms,1",
            // Its scheduler's ticks and its sweeps fail too while the
            // database is away: said once with the queues', not each time.
            "--scheduler",
            "--sweep-interval",
            "2s",
        ],
        &[
            ("DATABASE_URL", &door.url),
            (
                "SHEPHERD_LOG",
                "info,shepherd_workers::services::outage=debug",
            ),
        ],
    );
    sqlx::query("select shepherd.enqueue_reconcile()")
        .execute(&c.pool)
        .await
        .expect("enqueueing a pass");
    c.wait_for(2, 2, Duration::from_secs(60)).await;
    let path = c.dir.join("worker-0.log");
    let log = || std::fs::read_to_string(&path).expect("the worker's log");
    // The CPU it spends while its database is away: waiting, not
    // reconnecting in a loop. Read from /proc (its /metrics needs the
    // database): utime and stime, in the kernel's 100 ticks a second.
    let pid = c.workers[0].id();
    let cpu = || async move {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .expect("reading the worker's /proc stat");
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .expect("a stat line")
            .1
            .split_whitespace()
            .collect();
        let ticks = |n: usize| fields[n - 3].parse::<f64>().expect("a tick count");
        (ticks(14) + ticks(15)) / 100.0
    };
    let cpu_before = cpu().await;
    door.shut();
    // Long enough for each queue to fail twice: a fetch waits out the
    // pool's 10 s before it fails, and a worker restarts within 2 s.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let still = c.workers[0].try_wait().expect("asking after the worker");
    let during = log();
    assert!(still.is_none(), "the worker exited ({still:?}): {during}");
    // The queues failed again and again (said at DEBUG, which this
    // worker logs), and the outage was said once at ERROR.
    assert!(
        during
            .matches("failed while the database is unavailable")
            .count()
            >= 2,
        "{during}"
    );
    assert_eq!(
        during.matches("the database cannot be used").count(),
        1,
        "said more or less than once: {during}"
    );
    assert!(during.contains("cannot reach Postgres"), "{during}");
    for what in ["scheduler tick", "sweep"] {
        let said = |level: &str| {
            during
                .lines()
                .filter(|l| l.contains(level) && l.contains(&format!("what=\"{what}\"")))
                .count()
        };
        assert!(
            said(" DEBUG ") >= 1,
            "the {what} never failed quietly: {during}"
        );
        assert!(
            said(" WARN ") == 0 && said(" ERROR ") <= 1,
            "the {what}'s failures were said aloud: {during}"
        );
    }
    assert!(
        !during.contains("scheduler tick failed (database unreachable?)")
            && !during.contains("sweep failed (database unreachable?)"),
        "{during}"
    );
    let spent = cpu().await - cpu_before;
    eprintln!("{spent:.2} s of CPU in 25 s without a database");
    assert!(
        spent < 5.0,
        "{spent:.1} s of CPU in 25 s without a database"
    );
    door.reopen();
    let started = Instant::now();
    while !log().contains("the database takes connections again") {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the worker never said the database was back: {}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // And it works again: a pass enqueued from SQL runs.
    let passes = || {
        let pool = c.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "select count(*) from shepherd.events where event_type = 'reconcile_finished'",
            )
            .fetch_one(&pool)
            .await
            .expect("counting passes")
        }
    };
    let before = passes().await;
    sqlx::query("select shepherd.enqueue_reconcile()")
        .execute(&c.pool)
        .await
        .expect("enqueueing a pass");
    let started = Instant::now();
    while passes().await == before {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no pass ran after the database came back: {}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    c.stop_all();
}
