//! Every creation in flight has an owner and an end, and an outcome shepherd
//! could not observe is unknown, not failed: settled by looking, never by
//! guessing. The fake Metal server answers over HTTP; jobs are claimed from
//! the real queue table.

mod common;

use common::next;
use common::world::*;
use shepherd::config::ProvisionerConfig;
use shepherd::jobs::create_device::{CreateOutcome, create_device};
use shepherd::jobs::{CreateDeviceArgs, sweep};
use shepherd::metal::Operation;
use shepherd_fakes::metal::{FaultKind, FaultRule, Faults};
use sqlx::PgPool;

fn config(max_machines: u64) -> ProvisionerConfig {
    ProvisionerConfig {
        max_machines,
        chunk_size: max_machines.max(1),
        ..fast_config()
    }
}

/// No reservation is both penalised and managed; no reservation has two
/// devices; nothing is left in flight.
async fn assert_settled(w: &World) {
    w.assert_fleet_consistent().await;
    let both = w
        .count(
            "select count(*) from shepherd.sinbin s join shepherd.managed_machines m
               on m.reservation_id = s.reservation_id where now() <= s.until",
        )
        .await;
    assert_eq!(both, 0, "a reservation holding our device is penalised");
    assert_eq!(w.in_flight().await, 0, "something is left in flight");
}

#[sqlx::test(migrations = false)]
async fn an_accepted_create_with_an_unreadable_answer_ends_managed_not_penalised(pool: PgPool) {
    let w = World::with(pool, 3, config(1)).await;
    // 201 with a body that is not a device: the device exists, the answer
    // cannot be read. Today's code took this for a permanent failure.
    w.fake.set_faults(next(
        Operation::CreateDevice,
        5,
        FaultKind::AcceptThenFail { status: 201 },
    ));
    let r = w.reconcile().await.enqueued[0];
    w.drain().await;
    assert_eq!(w.managed().await, 1);
    assert_eq!(w.events("creation_given_up").await, 0);
    assert_eq!(w.events("reservation_penalised").await, 0);
    let on_r = w
        .fake
        .devices()
        .into_iter()
        .filter(|d| d.reservation == Some(r))
        .count();
    assert_eq!(on_r, 1);
    assert_settled(&w).await;
}

#[sqlx::test(migrations = false)]
async fn an_unknown_outcome_holds_its_slot_until_a_look_settles_it(pool: PgPool) {
    let mut c = config(1);
    // Each attempt ends at its deadline while the reads keep failing.
    c.create_retry.timeout = std::time::Duration::from_secs(1);
    let w = World::with(pool, 4, c).await;
    // The first create goes out on the pass's listing (no read before it),
    // is accepted and its answer garbled, and every read after it fails:
    // the outcome cannot be known.
    w.fake.set_faults(Faults {
        rules: vec![
            FaultRule::on(
                Operation::CreateDevice,
                FaultKind::AcceptThenFail { status: 201 },
            )
            .times(1),
            FaultRule::on(
                Operation::FindHardwareReservationById,
                FaultKind::Status { status: 503 },
            ),
        ],
        ..Faults::default()
    });
    let r = w.reconcile().await.enqueued[0];
    // Run the attempts out (each fails on the unreadable reservation).
    let mut unresolved = false;
    for _ in 0..10 {
        match w.run_next().await {
            Some(Ran::Create(CreateOutcome::Unresolved { .. })) => {
                unresolved = true;
                break;
            }
            Some(_) => {}
            None => {
                w.make_due().await;
            }
        }
    }
    assert!(unresolved, "the creation never became unresolved");
    assert_eq!(w.events("creation_given_up").await, 0);
    assert_eq!(w.events("reservation_penalised").await, 0);
    // Still in flight, so the limit of 1 leaves no room for another.
    assert_eq!(w.in_flight().await, 1);
    let since: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
        "select unresolved_since from shepherd.pending_creations where reservation_id = $1",
    )
    .bind(r)
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert!(since.is_some());
    // status, the page and /metrics read this overview.
    let overview = shepherd::fleet::overview(&w.pool).await.unwrap();
    assert_eq!(overview.unresolved.len(), 1);
    assert_eq!(overview.unresolved[0].reservation_id, r);
    assert!(overview.unresolved[0].last_error.is_some());
    let pass = w.reconcile().await;
    assert!(pass.at_limit && pass.enqueued.is_empty(), "{pass:?}");
    let manual = sqlx::query("select shepherd.enqueue_create_device($1)")
        .bind(w.fake.reservations()[1].id)
        .execute(&w.pool)
        .await;
    assert!(manual.unwrap_err().to_string().contains("max_machines"));

    // The provider answers again: the look finds our device.
    w.fake.set_faults(Faults::default());
    w.make_due().await;
    w.drain().await;
    assert_eq!(w.managed().await, 1);
    assert_settled(&w).await;
}

#[sqlx::test(migrations = false)]
async fn a_look_that_finds_nothing_frees_the_slot_and_penalises(pool: PgPool) {
    let w = World::with(pool, 3, config(1)).await;
    // Every POST is answered 500 without doing the work: ambiguous each
    // time, and the looks find no device.
    w.fake.set_faults(next(
        Operation::CreateDevice,
        1000,
        FaultKind::Status { status: 500 },
    ));
    let r = w.reconcile().await.enqueued[0];
    for _ in 0..12 {
        if w.run_next().await.is_none() {
            w.make_due().await;
        }
        if w.events("creation_given_up").await > 0 {
            break;
        }
    }
    assert_eq!(w.events("creation_unresolved").await, 1);
    assert_eq!(w.events("creation_given_up").await, 1);
    assert_eq!(w.in_flight().await, 0);
    assert!(w.has_penalty(r).await);
    assert!(w.fake.devices().is_empty());
}

#[sqlx::test(migrations = false)]
async fn a_manual_creation_whose_run_died_is_resumed_by_its_own_request(pool: PgPool) {
    let w = World::with(pool, 3, config(5)).await;
    let r = w.fake.reservations()[0].id;
    let job: String = sqlx::query_scalar("select shepherd.enqueue_create_device($1)")
        .bind(r)
        .fetch_one(&w.pool)
        .await
        .unwrap();
    let args: CreateDeviceArgs = serde_json::from_value(
        sqlx::query_scalar("select shepherd.job_args(job) from apalis.jobs where id = $1")
            .bind(&job)
            .fetch_one(&w.pool)
            .await
            .unwrap(),
    )
    .unwrap();
    // What the first run committed before it was killed mid-POST: the
    // admission of its own request (and, at the fake, the device).
    let mut tx = w.pool.begin().await.unwrap();
    let (admitted, _) = shepherd::jobs::queue::admit(
        &mut tx,
        &[(r, args.request)],
        &shepherd::jobs::queue::Admission {
            manual: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(admitted.len(), 1);
    tx.commit().await.unwrap();
    w.fake
        .set_faults(next(Operation::CreateDevice, 1, FaultKind::AcceptThenDrop));
    // The re-run of the same job resumes it (today's code refused it as
    // "already pending" and left the creation in flight for good).
    let resumed = create_device(&w.ctx, &args, &job).await.unwrap();
    assert!(
        matches!(resumed, CreateOutcome::Created { .. }),
        "{resumed:?}"
    );
    assert_eq!(w.events("creation_refused").await, 0);
    // A further re-run after the close does nothing.
    let again = create_device(&w.ctx, &args, &job).await.unwrap();
    assert!(matches!(again, CreateOutcome::Skipped { .. }), "{again:?}");
    w.drain().await;
    assert_eq!(w.managed().await, 1);
    assert_settled(&w).await;
}

#[sqlx::test(migrations = false)]
async fn the_sweep_gives_a_stranded_creation_and_assimilation_a_job(pool: PgPool) {
    let w = World::with(pool, 4, config(3)).await;
    let pass = w.reconcile().await;
    assert_eq!(pass.enqueued.len(), 3);
    // One creation's job is killed before it runs (a poison row, an
    // operator, a pruning gone wrong): nothing else would ever end it.
    sqlx::query(
        "update apalis.jobs set status = 'Killed', done_at = now()
         where id = (select id from apalis.jobs where job_type = 'create_device' order by id limit 1)",
    )
    .execute(&w.pool)
    .await
    .unwrap();
    w.drain().await;
    assert_eq!(w.managed().await, 2);
    assert_eq!(
        w.in_flight().await,
        1,
        "the stranded creation is still in flight"
    );
    let out = sweep::run_once(&w.pool).await.unwrap();
    assert_eq!(out.creations_resumed.len(), 1, "{out:?}");
    // A second sweep finds the resumed job live and does nothing.
    let again = sweep::run_once(&w.pool).await.unwrap();
    assert!(again.creations_resumed.is_empty() && again.assimilations_resumed.is_empty());
    w.drain().await;
    assert_eq!(w.managed().await, 3);
    assert_eq!(w.events("creation_resumed").await, 1);
    assert_settled(&w).await;
    common::assert_rebuild_equals_live(&w.pool).await;
}

#[sqlx::test(migrations = false)]
async fn the_sweep_resumes_an_assimilation_whose_job_is_gone(pool: PgPool) {
    let w = World::with(pool, 2, config(1)).await;
    w.reconcile().await;
    // Run the creation; then lose its assimilation job.
    match w.run_next().await {
        Some(Ran::Create(CreateOutcome::Created { .. })) => {}
        other => panic!("{other:?}"),
    }
    sqlx::query("delete from apalis.jobs where job_type = 'assimilate'")
        .execute(&w.pool)
        .await
        .unwrap();
    assert!(w.run_next().await.is_none());
    assert_eq!(w.in_flight().await, 1);
    let out = sweep::run_once(&w.pool).await.unwrap();
    assert_eq!(out.assimilations_resumed.len(), 1, "{out:?}");
    w.drain().await;
    assert_eq!(w.managed().await, 1);
    assert_settled(&w).await;
}

#[sqlx::test(migrations = false)]
async fn a_rotated_ssh_key_is_looked_up_again_not_penalised(pool: PgPool) {
    let w = World::with(pool, 3, config(2)).await;
    w.reconcile().await;
    w.drain().await;
    assert_eq!(w.managed().await, 2);
    // The key is deleted and made anew at the provider (rotated): the id
    // this process cached is stale.
    let old = w.fake.ssh_keys()[0].id;
    w.metal.delete_ssh_key(old).await.unwrap();
    let fresh = shepherd::metal::model::SshKeyInput {
        label: w.ctx.config.ssh_key_label.clone(),
        key: PUBLIC_KEY.into(),
    };
    w.metal.create_ssh_key(&fresh).await.unwrap();
    sqlx::query("select shepherd.change_setting('max_machines', '3', 'one more')")
        .execute(&w.pool)
        .await
        .unwrap();
    let pass = w.reconcile().await;
    assert_eq!(pass.enqueued.len(), 1);
    for _ in 0..6 {
        if w.run_next().await.is_none() {
            w.make_due().await;
        }
    }
    w.drain().await;
    assert_eq!(w.managed().await, 3);
    assert_eq!(w.events("reservation_penalised").await, 0);
    assert_eq!(w.events("creation_given_up").await, 0);
}

/// A second run of a job row may follow a POST nobody saw: it starts by
/// looking, never by creating, and never frees the slot on a look that
/// failed. Only a look that succeeds and shows no device of ours lets it
/// create; a definite refusal of that create then ends the creation.
#[sqlx::test(migrations = false)]
async fn a_rerun_of_the_same_job_never_frees_the_slot_on_a_guess(pool: PgPool) {
    let mut c = config(1);
    c.create_retry.max_attempts = 2;
    let w = World::with(pool, 3, c).await;
    let r = w.reconcile().await.enqueued[0];
    // The job row was claimed before (a worker killed after its POST): this
    // run cannot know what the last one did.
    sqlx::query("update apalis.jobs set attempts = 1 where job_type = 'create_device'")
        .execute(&w.pool)
        .await
        .unwrap();
    // Its look fails for as long as the client retries.
    w.fake.set_faults(next(
        Operation::FindHardwareReservationById,
        1_000,
        FaultKind::Status { status: 503 },
    ));
    match w.run_next().await {
        Some(Ran::Create(CreateOutcome::Unresolved { .. })) => {}
        other => panic!("a re-run whose look failed did not stay unknown: {other:?}"),
    }
    assert_eq!(w.fake.calls(Operation::CreateDevice), 0, "it created");
    assert_eq!(w.events("creation_given_up").await, 0);
    assert_eq!(w.in_flight().await, 1);
    // The look succeeds and finds no device: the creation is known again,
    // and its create, refused for good, ends it.
    w.fake.set_faults(next(
        Operation::CreateDevice,
        1,
        FaultKind::Status { status: 422 },
    ));
    w.make_due().await;
    w.drain().await;
    assert_eq!(w.events("creation_settled").await, 1);
    assert_eq!(w.fake.calls(Operation::CreateDevice), 1);
    assert_eq!(w.events("creation_given_up").await, 1);
    assert_eq!(w.in_flight().await, 0);
    assert!(w.has_penalty(r).await);
}
