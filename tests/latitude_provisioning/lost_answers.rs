//! One server per place when answers are lost: a creation run twice, cut
//! off mid-create, answered after its server hid, handed back after its
//! worker died; and the looks and waits between creates.

use super::*;

/// Two runs of one creation at once (a worker presumed dead while it was
/// still creating, and the run that replaced it): Latitude would accept two
/// creates with one hostname, so the place's lock lets one send while the
/// other waits its turn, and one server stands on the place.
#[sqlx::test(migrations = false)]
async fn two_runs_of_one_creation_make_one_server(db: PgPool) {
    use shepherd::jobs::CreateDeviceArgs;
    use shepherd::jobs::create_device::create_device;
    let w = World::new(db, 5, vec![pool("web", "DAL", 1)]).await;
    // Slow answers, so the two runs overlap.
    w.fake.set_faults(Faults {
        latency_ms: 200,
        ..Faults::default()
    });
    let pass = w.pass().await;
    assert_eq!(pass.enqueued.len(), 1);
    let (id, args): (String, serde_json::Value) = sqlx::query_as(
        "select id, convert_from(job, 'UTF8')::jsonb from apalis.jobs
         where job_type = 'create_device'",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    let args: CreateDeviceArgs = serde_json::from_value(args).unwrap();
    let (a, b) = tokio::join!(
        create_device(&w.ctx, &args, &id),
        create_device(&w.ctx, &args, &id)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(w.fake.servers().len(), 1, "{a:?} / {b:?}");
    w.fake.set_faults(Faults::default());
    w.settle(5).await;
    assert_eq!(w.fake.servers().len(), 1);
    w.assert_invariants().await;
}

/// A creation cut off mid-create (its attempt's deadline, a shutdown) must
/// not leave its unit locked: its lease, dropped, is given back by a task
/// of its own instead of waiting out its term.
/// Its next run finds the unit free, settles the unknown create by looking,
/// and leaves one server on the place whether the cut-off create reached
/// the fake or not.
#[sqlx::test(migrations = false)]
async fn a_creation_cut_off_mid_create_leaves_no_lock_behind(db: PgPool) {
    use shepherd::jobs::CreateDeviceArgs;
    use shepherd::jobs::create_device::create_device;
    let w = World::new(db, 5, vec![pool("web", "DAL", 1)]).await;
    let unit = w.ctx.provider.units().await.unwrap().units[0].id;
    let request = uuid::Uuid::new_v4();
    let mut tx = w.pool.begin().await.unwrap();
    let (admitted, _) = shepherd::jobs::queue::admit(
        &mut tx,
        &[(unit, request)],
        &shepherd::jobs::queue::Admission::default(),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(admitted.len(), 1);
    w.fake.set_faults(Faults::none().with_latency(3_000, 0));
    let args = CreateDeviceArgs::admitted(unit, request);
    let cut = tokio::time::timeout(
        Duration::from_millis(800),
        create_device(&w.ctx, &args, "cut-off-run"),
    )
    .await;
    assert!(cut.is_err(), "the create finished inside its deadline");
    // The unit's lease, as `shepherd.leases` holds it.
    let locks = || async {
        sqlx::query_scalar::<_, i64>(
            "select count(*) from shepherd.leases
             where key = $1 and expires_at > clock_timestamp()",
        )
        .bind(format!("place/{unit}"))
        .fetch_one(&w.pool)
        .await
        .unwrap()
    };
    // The cut-off run's lease is given back by a task a moment later.
    let mut held = locks().await;
    for _ in 0..50 {
        if held == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        held = locks().await;
    }
    assert_eq!(held, 0, "the cut-off creation's unit is still locked");
    // Its next run is unknown (the create may be on its way): it looks,
    // and creates only if nothing of ours stands there.
    w.fake.set_faults(Faults::none());
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let rerun = CreateDeviceArgs {
        attempt: 2,
        unknown: true,
        ..args
    };
    let outcome = create_device(&w.ctx, &rerun, "next-run").await.unwrap();
    assert!(
        matches!(
            outcome,
            shepherd::jobs::create_device::CreateOutcome::Created { .. }
        ),
        "{outcome:?}"
    );
    assert_eq!(w.fake.servers().len(), 1);
    assert_eq!(locks().await, 0);
}

/// A gateway in front of the API answers 504 with an HTML page while the
/// origin makes the server, and the new server stays out of every read for
/// a while (the weather that made a pool of 6 hold 11 servers). The
/// creation stays unknown, holds its place, and only looks, never creates,
/// until the settle window has passed: one server, one create.
#[sqlx::test(migrations = false)]
async fn a_lost_answer_whose_server_stays_hidden_is_never_created_twice(db: PgPool) {
    let w = World::with_settle(db, 5, vec![pool("web", "DAL", 1)], Duration::from_secs(3)).await;
    w.fake.set_faults(create_lost_then_hidden(1_500));
    let pass = w.pass().await;
    assert_eq!(pass.enqueued.len(), 1);
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        drain_with(&w.pool, &w.ctx).await;
        w.make_due().await;
        if w.count("select count(*) from shepherd.in_flight").await == 0 {
            break;
        }
        // While the server is hidden, another pass takes nothing: the
        // place is held by its unknown creation.
        let pass = w.pass().await;
        assert!(pass.enqueued.is_empty(), "{pass:?}");
        assert!(w.fake.servers().len() <= 1, "a second server");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        w.fake.calls(Call::CreateServer),
        1,
        "the create was sent again"
    );
    assert_eq!(w.fake.servers().len(), 1);
    assert_eq!(w.fake.duplicate_hostnames(), 0);
    let unresolved = w
        .count("select count(*) from shepherd.events where event_type = 'creation_unresolved'")
        .await;
    assert!(unresolved >= 1, "the creation was never unknown");
    let recovered = w
        .count(
            "select count(*) from shepherd.events
             where event_type = 'device_created' and (body->>'recovered')::boolean",
        )
        .await;
    assert_eq!(
        recovered, 1,
        "the hidden server was not found by its hostname"
    );
    w.settle(3).await;
    w.assert_invariants().await;
}

/// A creation whose worker died after its POST is handed back by apalis
/// with one attempt counted (apalis counts a run when it ends or is handed
/// back, never when it is claimed). Its next run must know it is a rerun:
/// it looks its hostname up and finds the server the dead run made, and
/// never sends a second POST for the place.
#[sqlx::test(migrations = false)]
async fn a_creation_handed_back_after_its_worker_died_looks_before_it_posts(db: PgPool) {
    use shepherd::jobs::CreateDeviceArgs;
    use shepherd::jobs::create_device::{CreateOutcome, create_device};
    use shepherd::latitude::CreateServer;
    let w = World::new(db, 5, vec![pool("web", "DAL", 1)]).await;
    let pass = w.pass().await;
    assert_eq!(pass.enqueued.len(), 1);
    let (id, args): (String, serde_json::Value) = sqlx::query_as(
        "select id, convert_from(job, 'UTF8')::jsonb from apalis.jobs
         where job_type = 'create_device'",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    let args: CreateDeviceArgs = serde_json::from_value(args).unwrap();
    // What the dead run's POST made, and how apalis hands its row back.
    let hostname = w.ctx.provider.hostname(args.reservation, args.request);
    w.client()
        .create_server(&CreateServer {
            plan: "c2-small-x86".into(),
            site: "DAL".into(),
            operating_system: "ubuntu_24_04_x64_lts".into(),
            hostname: hostname.clone(),
            ssh_keys: vec![],
        })
        .await
        .unwrap();
    sqlx::query(
        "update apalis.jobs set status = 'Pending', attempts = attempts + 1,
             last_result = '{\"Err\": \"Re-enqueued due to worker heartbeat timeout.\"}'
         where id = $1",
    )
    .bind(&id)
    .execute(&w.pool)
    .await
    .unwrap();
    let outcome = create_device(&w.ctx, &args, &id).await.unwrap();
    assert!(
        matches!(
            &outcome,
            CreateOutcome::Created {
                recovered: true,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(
        w.fake.duplicate_hostnames(),
        0,
        "a second POST for {hostname}"
    );
    assert_eq!(w.fake.servers().len(), 1);
}

/// The budget of attempts counts creates, not looks: an unknown creation
/// looks many times while its settle window runs (here every run is made
/// due at once), and still has its creates left after it. Two creates
/// answered 503 (the work not done, which the client cannot know), each
/// settled by looking; the third makes the server.
#[sqlx::test(migrations = false)]
async fn looks_inside_the_settle_window_do_not_use_up_the_creates(db: PgPool) {
    let w = World::with_settle(
        db,
        5,
        vec![pool("web", "DAL", 1)],
        Duration::from_millis(400),
    )
    .await;
    w.fake.set_faults(
        Faults::none().with_rule(
            FaultRule::on(Call::CreateServer, FaultKind::Status { status: 503 }).times(2),
        ),
    );
    w.pass().await;
    let started = std::time::Instant::now();
    while w.fake.servers().is_empty() && started.elapsed() < Duration::from_secs(10) {
        drain_with(&w.pool, &w.ctx).await;
        w.make_due().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drain_with(&w.pool, &w.ctx).await;
    let looks = w
        .count("select count(*) from shepherd.events where event_type = 'creation_unresolved'")
        .await;
    assert!(
        looks > 3,
        "only {looks} looks: the test did not exercise the budget"
    );
    assert_eq!(w.fake.calls(Call::CreateServer), 3);
    assert_eq!(w.fake.servers().len(), 1, "the creation gave up");
    assert_eq!(w.count("select count(*) from shepherd.sinbin").await, 0);
    w.settle(3).await;
    w.assert_invariants().await;
}

/// The wait before a creation sends again grows with the creates it sent,
/// not with the looks an unknown creation made in between: after five
/// looks, a second failed create waits as a second failed create does (a
/// chaos run once waited 32 s, 64 s, then 128 s after three 503s).
#[sqlx::test(migrations = false)]
async fn the_wait_between_creates_grows_with_creates_not_looks(db: PgPool) {
    use shepherd::jobs::create_device::CreateOutcome;
    let w = World::with_config(
        db,
        5,
        vec![pool("web", "DAL", 1)],
        Duration::from_millis(400),
        |c| {
            c.create_retry.initial_backoff = Duration::from_secs(1);
            c.create_retry.factor = 2.0;
            c.create_retry.max_backoff = Duration::from_secs(600);
        },
    )
    .await;
    w.fake.set_faults(
        Faults::none().with_rule(
            FaultRule::on(Call::CreateServer, FaultKind::Status { status: 503 }).times(2),
        ),
    );
    w.pass().await;
    let mut waits = vec![];
    let mut looks = 0;
    let started = std::time::Instant::now();
    while w.fake.servers().is_empty() && started.elapsed() < Duration::from_secs(15) {
        for ran in drain_with(&w.pool, &w.ctx).await {
            match ran {
                common::world::Ran::Create(CreateOutcome::Retrying { after, .. }) => {
                    waits.push(after)
                }
                common::world::Ran::Create(CreateOutcome::Unresolved { .. }) => looks += 1,
                _ => {}
            }
        }
        w.make_due().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(w.fake.servers().len(), 1);
    assert!(
        looks >= 2,
        "only {looks} looks: the test did not look between creates"
    );
    assert_eq!(
        waits,
        vec![Duration::from_secs(1), Duration::from_secs(2)],
        "the waits after the first and second creates ({looks} looks between)"
    );
}
