//! The provisioner's behaviour, pass by pass: the seed's smoke test, the
//! limit, discrepancies, penalties, lost races, ambiguous creates, and
//! concurrent passes with manual jobs. Jobs are claimed from the real queue
//! table and run by their handlers; the fake Metal server answers over HTTP.

mod common;
#[path = "provisioning/manual_jobs.rs"]
mod manual_jobs;
#[path = "provisioning/passes.rs"]
mod passes;

use std::time::Duration;

use common::world::*;
use common::{fake_config, next};
use shepherd::config::ProvisionerConfig;
use shepherd::jobs::create_device::CreateOutcome;
use shepherd::jobs::{AssimilateArgs, CreateDeviceArgs, queue};
use shepherd::metal::Operation;
use shepherd_fakes::metal::FaultKind;
use sqlx::PgPool;
use uuid::Uuid;

fn config(max_machines: u64, chunk_size: u64) -> ProvisionerConfig {
    ProvisionerConfig {
        max_machines,
        chunk_size,
        ..fast_config()
    }
}

#[sqlx::test(migrations = false)]
async fn the_seeds_smoke_test_reaches_the_limit_in_three_passes(pool: PgPool) {
    let w = World::with(pool, 100, config(10, 4)).await;
    reaches_the_limit_in_three_passes(&w).await;
}

/// The same fill, and a create whose answer was lost, with one database
/// connection for every job: no pass, creation or assimilation holds a
/// connection while it asks for another (a worker's pool is two, shared
/// with its queues).
#[sqlx::test(migrations = false)]
async fn a_fleet_is_provisioned_on_one_connection(pool: PgPool) {
    let w = World::on_one_connection(pool, 100, config(10, 4)).await;
    w.fake.set_faults(next(
        Operation::CreateDevice,
        1,
        FaultKind::AcceptThenFail { status: 500 },
    ));
    reaches_the_limit_in_three_passes(&w).await;
    let recovered: i64 = sqlx::query_scalar(
        "select count(*) from shepherd.events
         where event_type = 'device_created' and (body->>'recovered')::bool",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert_eq!(recovered, 1);
}

async fn reaches_the_limit_in_three_passes(w: &World) {
    let mut per_pass = Vec::new();
    for _ in 0..5 {
        let pass = w.reconcile().await;
        assert!(pass.refused.is_none(), "{pass:?}");
        per_pass.push(pass.enqueued.len());
        w.drain().await;
    }
    assert_eq!(per_pass, vec![4, 4, 2, 0, 0]);
    assert_eq!(w.managed().await, 10);
    assert_eq!(w.in_flight().await, 0);
    assert_eq!(w.fake.devices().len(), 10);
    w.assert_fleet_consistent().await;
}

/// A fill does not wait for the scheduler's tick: a pass the chunk held
/// back queues the next one at once, once; not while a chunk of creations
/// already waits to be sent, and not when the chunk was not what held it.
#[sqlx::test(migrations = false)]
async fn a_pass_held_back_by_its_chunk_queues_the_next_at_once(pool: PgPool) {
    let w = World::with(pool, 10, config(10, 4)).await;
    let queued = || async {
        let rows: Vec<(String, f64)> = sqlx::query_as(
            "select convert_from(job, 'UTF8')::jsonb->>'requested_by',
                    extract(epoch from run_at - now())::float8
             from apalis.jobs where job_type = 'reconcile' and status = 'Pending'",
        )
        .fetch_all(&w.pool)
        .await
        .unwrap();
        rows
    };
    let first = w.reconcile().await;
    assert_eq!(first.enqueued.len(), 4, "{first:?}");
    assert!(first.follow_up, "{first:?}");
    let after_first = queued().await;
    assert_eq!(after_first.len(), 1, "{after_first:?}");
    assert!(after_first[0].0.contains("chunk"), "{after_first:?}");
    assert!(after_first[0].1 <= 2.0, "not at once: {after_first:?}");
    // A chunk of creations waits to be sent: the next pass takes its own
    // chunk and leaves the rest to the tick.
    let second = w.reconcile().await;
    assert_eq!(second.enqueued.len(), 4, "{second:?}");
    assert!(!second.follow_up, "{second:?}");
    assert_eq!(queued().await.len(), 1);
    w.drain().await;
    // The last two are not held back by the chunk.
    let third = w.reconcile().await;
    assert_eq!(third.enqueued.len(), 2, "{third:?}");
    assert!(!third.follow_up, "{third:?}");
    assert_eq!(queued().await.len(), 1);
    w.drain().await;
    assert_eq!(w.managed().await, 10);
    w.assert_fleet_consistent().await;
}

/// A creation's first attempt sends its create on what the pass listed,
/// with no read of the reservation before it: one call a machine. A
/// reservation another party took since the pass is told apart by the
/// refusal and a read after it: the race is lost, nothing of ours is made,
/// and no create is sent twice.
#[sqlx::test(migrations = false)]
async fn a_first_create_goes_out_without_reading_its_reservation(pool: PgPool) {
    let w = World::with(pool, 10, config(6, 5)).await;
    let first = w.reconcile().await;
    assert_eq!(first.enqueued.len(), 5, "{first:?}");
    let reads = w.fake.calls(Operation::FindHardwareReservationById);
    w.drain().await;
    assert_eq!(
        w.fake.calls(Operation::FindHardwareReservationById) - reads,
        0,
        "a first create read its reservation"
    );
    assert_eq!(w.fake.calls(Operation::CreateDevice), 5);
    assert_eq!(w.managed().await, 5);
    // Another party takes the next chosen reservation after the pass.
    let second = w.reconcile().await;
    assert_eq!(second.enqueued.len(), 1, "{second:?}");
    let taken = second.enqueued[0];
    w.fake.add_foreign_device(taken, "someone-else", vec![]);
    let ran = w.drain().await;
    assert!(
        ran.iter()
            .any(|r| matches!(r, Ran::Create(CreateOutcome::RaceLost { .. }))),
        "{ran:?}"
    );
    assert_eq!(w.fake.calls(Operation::CreateDevice), 6);
    assert_eq!(w.fake.duplicate_creates(), 0);
    assert_eq!(w.managed().await, 5);
    w.assert_fleet_consistent().await;
}

#[sqlx::test(migrations = false)]
async fn at_the_limit_a_pass_lists_no_reservations_and_enqueues_nothing(pool: PgPool) {
    let w = World::with(pool, 10, config(3, 20)).await;
    w.reconcile().await;
    w.drain().await;
    assert_eq!(w.managed().await, 3);
    let lists = w.fake.calls(Operation::FindProjectHardwareReservations);
    let jobs = w.jobs("create_device").await;
    let pass = w.reconcile().await;
    assert!(pass.at_limit && !pass.listed_reservations, "{pass:?}");
    assert!(pass.enqueued.is_empty());
    assert_eq!(
        w.fake.calls(Operation::FindProjectHardwareReservations),
        lists
    );
    assert_eq!(w.jobs("create_device").await, jobs);
}

#[sqlx::test(migrations = false)]
async fn no_limit_provisions_every_provisionable_reservation(pool: PgPool) {
    let mut fake = fake_config(30);
    fake.not_provisionable_every = 5;
    let w = World::new(pool, fake, config(0, 100)).await;
    w.reconcile().await;
    w.drain().await;
    let provisionable = 30 - 6;
    assert_eq!(w.managed().await, provisionable);
    let pass = w.reconcile().await;
    assert!(pass.enqueued.is_empty() && !pass.at_limit);
    w.assert_fleet_consistent().await;
}

#[sqlx::test(migrations = false)]
async fn a_vanished_device_is_a_discrepancy_and_stops_work(pool: PgPool) {
    let w = World::with(pool, 10, config(4, 2)).await;
    w.reconcile().await;
    w.drain().await;
    let gone: Uuid = sqlx::query_scalar::<_, String>(
        "select provider_id from shepherd.managed_machines limit 1",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap()
    .parse()
    .unwrap();
    assert!(w.fake.delete_device(gone));
    let jobs = w.jobs("create_device").await;
    let pass = w.reconcile().await;
    assert!(pass.refused.is_some());
    assert_eq!(pass.missing_devices, vec![gone.to_string()]);
    assert_eq!(w.jobs("create_device").await, jobs, "nothing enqueued");
    assert_eq!(w.events("discrepancy_found").await, 1);
    assert_eq!(w.events("reconcile_refused").await, 1);
}

#[sqlx::test(migrations = false)]
async fn an_unwitnessed_prefixed_device_is_a_discrepancy_unless_assimilate_is_on(pool: PgPool) {
    let w = World::with(pool.clone(), 10, config(5, 5)).await;
    let r = w.fake.reservations()[0].id;
    let stranger = w.fake.add_foreign_device(r, "shepherd-handmade", vec![]);
    let pass = w.reconcile().await;
    assert_eq!(pass.unknown_devices, vec![stranger.to_string()]);
    assert!(pass.enqueued.is_empty() && pass.refused.is_some());
    assert_eq!(w.jobs("create_device").await, 0);

    // The cluster switched to assimilate mode: the device is adopted.
    sqlx::query("select shepherd.change_setting('assimilate', 'true', 'adopt hand-made machines')")
        .execute(&w.pool)
        .await
        .unwrap();
    let w2 = w;
    let pass = w2.reconcile().await;
    assert_eq!(pass.adopted, vec![stranger.to_string()]);
    assert!(pass.refused.is_none(), "{pass:?}");
    w2.drain().await;
    let managed: Vec<String> =
        sqlx::query_scalar("select provider_id from shepherd.managed_machines")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(managed.contains(&stranger.to_string()));
}

#[sqlx::test(migrations = false)]
async fn a_witnessed_orphan_is_adopted_not_a_reason_to_halt(pool: PgPool) {
    let w = World::with(pool, 10, config(5, 5)).await;
    let r = w.fake.reservations()[0].id;
    // A device whose creation our log holds, but which an older release
    // gave up on while the device was being made.
    let request = Uuid::new_v4();
    record_request_given_up(&w, r, request).await;
    let orphan = w.fake.add_foreign_device(
        r,
        "shepherd-orphan",
        vec![shepherd::metal::Witness::new(request).tag()],
    );
    let pass = w.reconcile().await;
    assert!(pass.refused.is_none(), "{pass:?}");
    assert_eq!(pass.adopted, vec![orphan.to_string()]);
    w.drain().await;
    w.assert_fleet_consistent().await;
}

async fn record_request_given_up(w: &World, reservation: Uuid, request: Uuid) {
    use shepherd::events::event::{CreationGivenUp, CreationRequested};
    let mut tx = w.pool.begin().await.unwrap();
    shepherd::events::record(
        &mut tx,
        vec![
            shepherd::events::NewEvent::new(CreationRequested {
                reservation,
                request,
                manual: false,
                requested_by: None,
                sinbin_override: None,
                place: None,
            }),
            shepherd::events::NewEvent::new(CreationGivenUp {
                reservation,
                class: shepherd::metal::ErrorClass::Permanent,
                message: "an older release's guess".into(),
                request: Some(request),
            }),
        ],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

#[sqlx::test(migrations = false)]
async fn another_deployments_witness_is_a_discrepancy_not_an_adoption(pool: PgPool) {
    let w = World::with(pool, 10, config(5, 5)).await;
    let r = w.fake.reservations()[0].id;
    // A second shepherd sharing the project and the prefix: its witness
    // names a request our log never held.
    let foreign = w.fake.add_foreign_device(
        r,
        "shepherd-theirs",
        vec![shepherd::metal::Witness::new(Uuid::new_v4()).tag()],
    );
    let pass = w.reconcile().await;
    assert!(pass.adopted.is_empty(), "{pass:?}");
    assert_eq!(pass.unknown_devices, vec![foreign.to_string()]);
    assert!(pass.refused.is_some());
    assert_eq!(w.managed().await, 0);
}

#[sqlx::test(migrations = false)]
async fn a_permanent_failure_penalises_the_reservation_until_it_expires(pool: PgPool) {
    let mut c = config(1, 1);
    c.penalty.initial = Duration::from_secs(2);
    c.penalty.max = Duration::from_secs(2);
    let w = World::with(pool, 3, c).await;
    w.fake.set_faults(next(
        Operation::CreateDevice,
        1,
        FaultKind::Status { status: 422 },
    ));
    let first = w.reconcile().await.enqueued[0];
    let ran = w.drain().await;
    assert!(
        matches!(&ran[0], Ran::Create(CreateOutcome::GivenUp { .. })),
        "{ran:?}"
    );
    let (cause, failures): (String, i32) =
        sqlx::query_as("select cause, failures from shepherd.sinbin where reservation_id = $1")
            .bind(first)
            .fetch_one(&w.pool)
            .await
            .unwrap();
    assert!(cause.contains("422"), "{cause}");
    assert_eq!(failures, 1);
    // The next pass skips it and takes another.
    let second = w.reconcile().await.enqueued;
    assert_eq!(second.len(), 1);
    assert_ne!(second[0], first);
    w.drain().await;
    // With the limit raised and the penalty expired, it is tried again.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    sqlx::query("select shepherd.change_setting('max_machines', '3', 'room for more')")
        .execute(&w.pool)
        .await
        .unwrap();
    let third = w.reconcile().await.enqueued;
    assert!(third.contains(&first), "{third:?}");
}

#[sqlx::test(migrations = false)]
async fn a_lost_race_penalises_and_leaves_no_device_of_ours(pool: PgPool) {
    let w = World::with(pool, 3, config(1, 1)).await;
    let r = w.reconcile().await.enqueued[0];
    // Taken the moment our create arrives (a first create reads nothing
    // before it, so the race is lost at the POST).
    w.fake.set_faults(next(
        Operation::CreateDevice,
        1,
        FaultKind::StealReservation,
    ));
    let ran = w.drain().await;
    assert!(
        matches!(&ran[0], Ran::Create(CreateOutcome::RaceLost { .. })),
        "{ran:?}"
    );
    let cause: String =
        sqlx::query_scalar("select cause from shepherd.sinbin where reservation_id = $1")
            .bind(r)
            .fetch_one(&w.pool)
            .await
            .unwrap();
    assert!(cause.contains("another party"));
    let devices = w.fake.devices();
    assert!(
        devices
            .iter()
            .filter(|d| d.reservation == Some(r))
            .all(|d| d.created_by_other)
    );
    assert_eq!(w.managed().await, 0);
    assert_eq!(w.in_flight().await, 0);
}

#[sqlx::test(migrations = false)]
async fn accept_then_fail_yields_one_device_managed_once(pool: PgPool) {
    let w = World::with(pool, 3, config(1, 1)).await;
    w.fake.set_faults(next(
        Operation::CreateDevice,
        1,
        FaultKind::AcceptThenFail { status: 500 },
    ));
    let r = w.reconcile().await.enqueued[0];
    w.drain().await;
    let on_r: Vec<_> = w
        .fake
        .devices()
        .into_iter()
        .filter(|d| d.reservation == Some(r))
        .collect();
    assert_eq!(on_r.len(), 1);
    assert_eq!(w.managed().await, 1);
    assert_eq!(w.fake.calls(Operation::CreateDevice), 1);
    let recovered: bool = sqlx::query_scalar(
        "select (body->>'recovered')::bool from shepherd.events where event_type = 'device_created'",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert!(recovered);
}

#[sqlx::test(migrations = false)]
async fn a_transient_failure_is_retried_by_a_delayed_successor(pool: PgPool) {
    let mut c = config(1, 1);
    c.create_retry.initial_backoff = Duration::from_secs(30);
    c.create_retry.max_backoff = Duration::from_secs(60);
    let w = World::with(pool, 3, c).await;
    w.fake.set_faults(next(
        Operation::CreateDevice,
        1000,
        FaultKind::Status { status: 503 },
    ));
    let mut short_budget = common::client_config(&w.fake, w.fake.project_id());
    short_budget.retry.max_elapsed = Duration::from_millis(100);
    let w = World {
        ctx: std::sync::Arc::new(shepherd::jobs::JobContext::new(
            w.pool.clone(),
            shepherd::metal::MetalClient::new(short_budget, Default::default()).unwrap(),
            w.ctx.config.clone(),
            PUBLIC_KEY.into(),
        )),
        ..w
    };
    w.reconcile().await;
    let ran = w.drain().await;
    assert!(
        matches!(
            &ran[0],
            Ran::Create(CreateOutcome::Retrying {
                next_attempt: 2,
                ..
            })
        ),
        "{ran:?}"
    );
    // The retry waits in the queue, not in a worker: its run_at is the backoff away
    // (apalis itself would hand a failed job straight back).
    let delay: f64 = sqlx::query_scalar(
        "select extract(epoch from run_at - now())::float8 from apalis.jobs
         where job_type = 'create_device' and status = 'Pending'",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert!(delay > 25.0, "the successor runs in {delay}s");
    assert_eq!(w.in_flight().await, 1, "still in flight while it waits");
    assert_eq!(w.events("creation_attempt_failed").await, 1);
}

#[sqlx::test(migrations = false)]
async fn a_job_run_twice_at_once_makes_one_device(pool: PgPool) {
    let w = World::with(pool, 3, config(2, 1)).await;
    w.reconcile().await;
    let args: serde_json::Value = sqlx::query_scalar(
        "select convert_from(job, 'UTF8')::jsonb from apalis.jobs where job_type = 'create_device'",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    let args: CreateDeviceArgs = serde_json::from_value(args).unwrap();
    let (a, b) = tokio::join!(
        shepherd::jobs::create_device::create_device(&w.ctx, &args, "dup-1"),
        shepherd::jobs::create_device::create_device(&w.ctx, &args, "dup-2"),
    );
    let outcomes = [a.unwrap(), b.unwrap()];
    assert!(
        outcomes
            .iter()
            .any(|o| matches!(o, CreateOutcome::Created { .. })),
        "{outcomes:?}"
    );
    let ours: Vec<_> = w
        .fake
        .devices()
        .into_iter()
        .filter(|d| d.reservation == Some(args.reservation))
        .collect();
    assert_eq!(ours.len(), 1, "{outcomes:?}");
    w.drain().await;
    assert_eq!(w.managed().await, 1);
    w.assert_fleet_consistent().await;
}

#[sqlx::test(migrations = false)]
async fn concurrent_passes_and_manual_jobs_never_double_create_or_pass_the_limit(pool: PgPool) {
    let w = World::with(pool, 40, config(12, 8)).await;
    let reservations: Vec<Uuid> = w
        .fake
        .reservations()
        .iter()
        .map(|r| r.id)
        .take(10)
        .collect();
    // Two passes at once, and manual creations for the same reservations,
    // from SQL (admitted by the handler) and as admitted CLI jobs.
    let manual = async {
        for r in &reservations {
            // SQL refuses at once what is already in flight or at the
            // limit; what it lets through, the job admits again.
            if let Err(e) = sqlx::query("select shepherd.enqueue_create_device($1)")
                .bind(r)
                .execute(&w.pool)
                .await
            {
                let msg = e.to_string();
                assert!(
                    msg.contains("already") || msg.contains("max_machines"),
                    "{msg}"
                );
            }
            let mut tx = w.pool.begin().await.unwrap();
            queue::admit(
                &mut tx,
                &[(*r, Uuid::new_v4())],
                &queue::Admission {
                    manual: true,
                    push_jobs: true,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
            tx.commit().await.unwrap();
        }
    };
    let (a, b, ()) = tokio::join!(w.reconcile(), w.reconcile(), manual);
    assert!(a.skipped || b.skipped || a.enqueued.len() + b.enqueued.len() <= 12);
    w.assert_within_limit().await;
    for _ in 0..4 {
        let (_, _, ran) = tokio::join!(w.reconcile(), w.reconcile(), w.drain());
        let _ = ran;
        w.assert_within_limit().await;
    }
    w.drain().await;
    assert_eq!(w.managed().await, 12);
    w.assert_fleet_consistent().await;
    common::assert_rebuild_equals_live(&w.pool).await;
}

#[sqlx::test(migrations = false)]
async fn a_pause_stops_creations_and_a_resume_restarts_them(pool: PgPool) {
    let w = World::with(pool, 10, config(5, 5)).await;
    sqlx::query("select shepherd.pause_creations('maintenance')")
        .execute(&w.pool)
        .await
        .unwrap();
    let pass = w.reconcile().await;
    assert!(pass.enqueued.is_empty(), "{pass:?}");
    assert!(pass.listed_reservations, "a paused pass still reports");
    assert!(
        pass.refused
            .as_deref()
            .unwrap_or("")
            .contains("maintenance"),
        "{pass:?}"
    );
    // A manual job is refused too, with the reason recorded.
    sqlx::query("select shepherd.enqueue_create_device($1)")
        .bind(w.fake.reservations()[0].id)
        .execute(&w.pool)
        .await
        .unwrap();
    w.drain().await;
    assert_eq!(w.fake.calls(Operation::CreateDevice), 0);
    assert_eq!(w.events("creation_refused").await, 1);
    sqlx::query("select shepherd.resume_creations()")
        .execute(&w.pool)
        .await
        .unwrap();
    let pass = w.reconcile().await;
    assert_eq!(pass.enqueued.len(), 5);
    w.drain().await;
    assert_eq!(w.managed().await, 5);
    // The pause is a view like the others: a row nobody recorded is a
    // difference, and a rebuild removes it.
    sqlx::query(
        "insert into shepherd.controls values ('creations', true, 'nobody', 'hand-made', now())",
    )
    .execute(&w.pool)
    .await
    .unwrap();
    let report = shepherd::events::views::rebuild(&w.pool, true)
        .await
        .unwrap();
    assert_eq!(report.differences.len(), 1, "{report:?}");
    let report = shepherd::events::views::rebuild(&w.pool, false)
        .await
        .unwrap();
    assert!(report.differences.is_empty(), "{report:?}");
}

/// Our own create's answer is recorded without the capacity lock (it moves
/// from in flight to managed, the sum every admission counts unchanged), so
/// assimilations no longer queue behind admissions and each other; a
/// device not yet counted (an adoption, a manual assimilation) still takes
/// the lock, and the limit holds either way.
#[sqlx::test(migrations = false)]
async fn our_own_creations_are_recorded_without_the_capacity_lock(pool: PgPool) {
    let w = World::with(pool, 3, config(2, 2)).await;
    w.reconcile().await;
    // The creations run; their assimilations wait in the queue.
    for _ in 0..2 {
        let ran = w.run_next().await.expect("a creation to run");
        assert!(
            matches!(ran, Ran::Create(CreateOutcome::Created { .. })),
            "{ran:?}"
        );
    }
    // Someone holds the capacity lock (an admission, say) meanwhile.
    let mut holder = w.pool.acquire().await.unwrap();
    sqlx::query(
        "select pg_advisory_lock(pg_catalog.hashtextextended('shepherd/capacity'::text, 0::int8))",
    )
    .execute(&mut *holder)
    .await
    .unwrap();
    for _ in 0..2 {
        let ran = tokio::time::timeout(Duration::from_secs(10), w.run_next())
            .await
            .expect("our own creation's assimilation does not wait on the capacity lock")
            .expect("an assimilation to run");
        assert!(matches!(ran, Ran::Assimilate(_)), "{ran:?}");
    }
    assert_eq!(w.managed().await, 2);
    assert_eq!(w.in_flight().await, 0);
    // An assimilation of a device not counted in flight still waits.
    let device: String =
        sqlx::query_scalar("select provider_id from shepherd.managed_machines limit 1")
            .fetch_one(&w.pool)
            .await
            .unwrap();
    sqlx::query("select shepherd.enqueue_assimilate($1::text)")
        .bind(&device)
        .execute(&w.pool)
        .await
        .unwrap();
    let skipped = || async {
        sqlx::query_scalar::<_, i64>(
            "select count(*) from shepherd.events where event_type = 'assimilation_skipped'",
        )
        .fetch_one(&w.pool)
        .await
        .expect("counting skipped assimilations")
    };
    let (ran, ()) = tokio::join!(w.run_next(), async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            skipped().await,
            0,
            "a manual assimilation went past the capacity lock"
        );
        sqlx::query(
            "select pg_advisory_unlock(pg_catalog.hashtextextended('shepherd/capacity'::text, 0::int8))",
        )
        .execute(&mut *holder)
        .await
        .unwrap();
    });
    assert!(matches!(ran, Some(Ran::Assimilate(_))), "{ran:?}");
    assert_eq!(skipped().await, 1);
    w.assert_within_limit().await;
    w.assert_fleet_consistent().await;
}
