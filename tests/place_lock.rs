//! A unit's lease (`shepherd.leases`): one holder at a time, no connection
//! held between its statements, a crashed holder's lease taken over once
//! it expires, and a holder whose lease was taken refused at its fence.

mod common;

use std::time::{Duration, Instant};

use shepherd::jobs::place::PlaceLock;
use shepherd::provider::Fence;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

const TERM: Duration = Duration::from_secs(60);
const GRACE: Duration = Duration::from_secs(1);

async fn one_connection(db: &PgPool) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with((*db.connect_options()).clone())
        .await
        .expect("a pool of one connection")
}

async fn expires_in(pool: &PgPool, unit: Uuid) -> f64 {
    sqlx::query_scalar(
        "select extract(epoch from expires_at - clock_timestamp())::float8
         from shepherd.leases where key = 'place/' || $1::text",
    )
    .bind(unit)
    .fetch_one(pool)
    .await
    .expect("the unit's lease row")
}

/// Every lease set to expire `secs` seconds from now.
async fn expire_in(db: &PgPool, secs: i64) {
    sqlx::query(
        "update shepherd.leases set expires_at = clock_timestamp() + make_interval(secs => $1)",
    )
    .bind(secs as f64)
    .execute(db)
    .await
    .expect("moving the lease's expiry");
}

/// The lease taken over by another run (`other:2`), as after this holder
/// stalled past its term.
async fn given_to_another(db: &PgPool) {
    sqlx::query("update shepherd.leases set lease = gen_random_uuid(), holder = 'other:2'")
        .execute(db)
        .await
        .expect("handing the lease to another holder");
}

#[sqlx::test(migrations = false)]
async fn a_lease_holds_no_connection_and_one_holder_at_a_time(db: PgPool) {
    common::migrated(&db).await;
    // One connection in all: if a held lease kept it, the next statement
    // would time out.
    let pool = one_connection(&db).await;
    let unit = Uuid::new_v4();
    let lock = PlaceLock::try_take(&pool, unit, TERM)
        .await
        .unwrap()
        .expect("free");
    let one: i32 = sqlx::query_scalar("select 1")
        .fetch_one(&pool)
        .await
        .expect("the pool's one connection is free while the lease is held");
    assert_eq!(one, 1);
    assert!(
        PlaceLock::try_take(&pool, unit, TERM)
            .await
            .unwrap()
            .is_none(),
        "a second holder took a held unit"
    );
    lock.release().await;
    let again = PlaceLock::try_take(&pool, unit, TERM)
        .await
        .unwrap()
        .expect("a released unit is free");
    // Dropped without a release (a job cut off): given back by a task.
    drop(again);
    let started = Instant::now();
    loop {
        if let Some(lock) = PlaceLock::try_take(&pool, unit, TERM).await.unwrap() {
            lock.release().await;
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "a dropped lease was never given back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[sqlx::test(migrations = false)]
async fn a_crashed_holders_lease_is_taken_once_it_expires_and_not_before(db: PgPool) {
    common::migrated(&db).await;
    let unit = Uuid::new_v4();
    // A holder that died: its row stays, unrenewed.
    sqlx::query(
        "insert into shepherd.leases (key, lease, holder, expires_at)
         values ('place/' || $1::text, gen_random_uuid(), 'dead:1', clock_timestamp() + interval '1 hour')",
    )
    .bind(unit)
    .execute(&db)
    .await
    .unwrap();
    assert!(
        PlaceLock::try_take(&db, unit, TERM)
            .await
            .unwrap()
            .is_none(),
        "a lease in its term was taken"
    );
    expire_in(&db, -1).await;
    let lock = PlaceLock::try_take(&db, unit, TERM)
        .await
        .unwrap()
        .expect("an expired lease is free to take");
    let holder: String = sqlx::query_scalar("select holder from shepherd.leases")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(holder, shepherd::fleet::process_name());
    lock.release().await;
}

#[sqlx::test(migrations = false)]
async fn a_fence_renews_the_lease_and_refuses_once_another_holds_it(db: PgPool) {
    common::migrated(&db).await;
    let unit = Uuid::new_v4();
    let lock = PlaceLock::try_take(&db, unit, TERM)
        .await
        .unwrap()
        .expect("free");
    // Near its end, a check renews it for a whole term.
    expire_in(&db, 2).await;
    lock.standing().await.expect("the lease is ours");
    let left = expires_in(&db, unit).await;
    assert!(
        left > 50.0,
        "the check did not renew the lease: {left} s left"
    );
    // Expired and taken by another run meanwhile (this holder stalled past
    // its term): the next check refuses, so no write leaves.
    given_to_another(&db).await;
    let err = lock
        .standing()
        .await
        .expect_err("a lost lease was confirmed");
    assert!(err.contains("lease was lost"), "{err}");
    let fence = lock.creation(Uuid::new_v4(), GRACE);
    assert!(
        fence.check().await.is_err(),
        "a creation's fence let a write out on a lost lease"
    );
    // Its release does not free the other holder's lease.
    lock.release().await;
    let holder: String = sqlx::query_scalar("select holder from shepherd.leases")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(holder, "other:2");
}

/// A creation gives its unit back in the transaction that records its
/// outcome: the unit is free exactly when that commits, never before (a
/// rollback keeps it held, and the holder's own release still frees it),
/// and a holder that gave it back cannot free it again from a later one.
#[sqlx::test(migrations = false)]
async fn a_unit_given_back_with_its_outcome_is_free_only_once_that_commits(db: PgPool) {
    common::migrated(&db).await;
    let unit = Uuid::new_v4();
    let first = PlaceLock::try_take(&db, unit, TERM)
        .await
        .unwrap()
        .expect("a free unit is taken");

    let mut tx = db.begin().await.unwrap();
    first.release_in(&mut tx).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(
        PlaceLock::try_take(&db, unit, TERM)
            .await
            .unwrap()
            .is_none(),
        "a give-back that rolled back left the unit free"
    );
    // Not given back: its own release frees the unit, as before.
    first.release().await;
    let second = PlaceLock::try_take(&db, unit, TERM)
        .await
        .unwrap()
        .expect("released, the unit is free");

    let mut tx = db.begin().await.unwrap();
    second.release_in(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    second.given_back();
    let third = PlaceLock::try_take(&db, unit, TERM)
        .await
        .unwrap()
        .expect("given back with a committed outcome, the unit is free");
    // The second holder's release, later, leaves the third's lease alone.
    second.release().await;
    assert!(
        PlaceLock::try_take(&db, unit, TERM)
            .await
            .unwrap()
            .is_none(),
        "an old holder freed a unit another holds"
    );
    assert!(expires_in(&db, unit).await > 50.0);
    third.release().await;
}

/// The xmin of the unit's lease row: it changes exactly when a statement
/// wrote the row.
async fn row_version(pool: &PgPool, unit: Uuid) -> String {
    sqlx::query_scalar("select xmin::text from shepherd.leases where key = 'place/' || $1::text")
        .bind(unit)
        .fetch_one(pool)
        .await
        .expect("the unit's lease row")
}

/// A creation's fence right after the take only reads the lease (its commit
/// flushes nothing); once more than its grace has gone it renews the lease
/// for a whole term, as before; and a lease not this holder's is refused
/// whichever way the check goes.
#[sqlx::test(migrations = false)]
async fn a_fence_within_its_grace_reads_the_lease_and_renews_it_past_that(db: PgPool) {
    common::migrated(&db).await;
    let unit = Uuid::new_v4();
    let request = Uuid::new_v4();
    sqlx::query("insert into shepherd.pending_creations (reservation_id, request, enqueued_at) values ($1, $2, now())")
        .bind(unit)
        .bind(request.to_string())
        .execute(&db)
        .await
        .unwrap();
    let lock = PlaceLock::try_take(&db, unit, TERM)
        .await
        .unwrap()
        .expect("free");
    let fence = lock.creation(request, GRACE);
    let before = row_version(&db, unit).await;
    fence.check().await.expect("the creation owns the unit");
    assert_eq!(
        row_version(&db, unit).await,
        before,
        "a fence within its grace wrote the lease row"
    );
    // More than the grace gone since the take: the fence renews.
    expire_in(&db, 58).await;
    fence.check().await.expect("the creation owns the unit");
    let left = expires_in(&db, unit).await;
    assert!(
        left > 59.0,
        "a fence past its grace did not renew the lease: {left} s left"
    );
    // Within its grace again, but the lease is another holder's now.
    given_to_another(&db).await;
    let err = fence
        .check()
        .await
        .expect_err("a lost lease let the write out");
    assert!(err.contains("lease was lost"), "{err}");
    lock.release().await;
}

async fn leases_on(pool: &PgPool, unit: Uuid) -> i64 {
    sqlx::query_scalar("select count(*) from shepherd.leases where key = 'place/' || $1::text")
        .bind(unit)
        .fetch_one(pool)
        .await
        .expect("counting the unit's leases")
}

/// The pass's one creation job: its id and its arguments.
async fn creation_job(db: &PgPool) -> (String, serde_json::Value) {
    sqlx::query_as(
        "select id, convert_from(job, 'UTF8')::jsonb from apalis.jobs
         where job_type = 'create_device'",
    )
    .fetch_one(db)
    .await
    .expect("the pass's creation job")
}

/// A creation takes its unit's lease in its first statement only when its
/// request owns the creation: a run of a request that does not own it ends
/// without holding the unit, and the owner's run then takes it, creates,
/// and gives it back with the machine's record.
#[sqlx::test(migrations = false)]
async fn a_creation_takes_its_unit_only_as_the_owner_and_gives_it_back_with_its_machine(
    db: PgPool,
) {
    use common::world::*;
    use shepherd::jobs::CreateDeviceArgs;
    use shepherd::jobs::create_device::{CreateOutcome, create_device};
    let w = World::with(db.clone(), 1, fast_config()).await;
    w.reconcile().await;
    let (id, body) = creation_job(&db).await;
    let owner: CreateDeviceArgs = serde_json::from_value(body).unwrap();
    let stranger = CreateDeviceArgs {
        request: Uuid::new_v4(),
        ..owner.clone()
    };
    let outcome = create_device(&w.ctx, &stranger, "01J00000000000000000000000")
        .await
        .expect("the stranger's run");
    assert!(
        matches!(outcome, CreateOutcome::Skipped { .. }),
        "{outcome:?}"
    );
    assert_eq!(
        leases_on(&db, owner.reservation).await,
        0,
        "a stranger held the unit"
    );
    let outcome = create_device(&w.ctx, &owner, &id)
        .await
        .expect("the owner's run");
    assert!(
        matches!(outcome, CreateOutcome::Created { .. }),
        "{outcome:?}"
    );
    assert_eq!(
        leases_on(&db, owner.reservation).await,
        0,
        "the unit's lease outlived the creation's record"
    );
    assert_eq!(w.fake.devices().len(), 1);
}

/// A creation that finds its unit held by another run late in its life
/// (after looks at an unknown outcome raised its attempt count) comes back
/// as soon as the creates it sent earned, not after a wait grown by every
/// attempt: the unit is free again within a rescue window, and the pool is
/// one machine short until the creation comes back.
#[sqlx::test(migrations = false)]
async fn a_creation_finding_its_unit_held_waits_as_its_creates_earned(db: PgPool) {
    use common::world::*;
    use shepherd::jobs::CreateDeviceArgs;
    use shepherd::jobs::create_device::{CreateOutcome, create_device};
    let mut config = fast_config();
    config.create_retry.initial_backoff = Duration::from_secs(1);
    config.create_retry.factor = 2.0;
    config.create_retry.max_backoff = Duration::from_secs(600);
    let w = World::with(db.clone(), 1, config).await;
    w.reconcile().await;
    let (id, body) = creation_job(&db).await;
    let first: CreateDeviceArgs = serde_json::from_value(body).unwrap();
    let late = CreateDeviceArgs {
        attempt: 9,
        creates: Some(2),
        admitted: true,
        ..first.clone()
    };
    let other = PlaceLock::try_take(&db, first.reservation, TERM)
        .await
        .expect("the lease statement")
        .expect("the unit free for another run to take");
    let outcome = create_device(&w.ctx, &late, &id)
        .await
        .expect("the late attempt");
    match outcome {
        CreateOutcome::Retrying {
            next_attempt: 10,
            after,
        } => assert_eq!(
            after,
            Duration::from_secs(2),
            "two creates sent earn the wait of a third (1 s doubled once), not one grown by nine attempts"
        ),
        other => panic!("expected a retry, got {other:?}"),
    }
    assert!(w.fake.devices().is_empty(), "a create left a held unit");
    other.release().await;
}
