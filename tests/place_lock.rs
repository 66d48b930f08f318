//! A unit's lock on a connection of its own: released, the connection
//! goes back to the pool (a fresh backend per creation was most of a job's
//! cost); dropped mid-way, it is closed, so the lock dies with it and is
//! never handed to whoever takes that connection next.

use std::time::{Duration, Instant};

use shepherd::jobs::place::PlaceLock;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

async fn pid(pool: &PgPool) -> i32 {
    sqlx::query_scalar("select pg_backend_pid()")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_released_lock_hands_its_connection_back_and_a_dropped_one_closes_it(db: PgPool) {
    // One connection: whatever the lock does with it shows in the next
    // query's backend.
    let options = (*db.connect_options()).clone();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .unwrap();
    let first = pid(&pool).await;
    let unit = Uuid::new_v4();
    let lock = PlaceLock::try_take(&pool, unit)
        .await
        .unwrap()
        .expect("free");
    lock.release().await;
    assert_eq!(
        pid(&pool).await,
        first,
        "the released connection was not reused"
    );
    // Dropped without a release: the connection is closed and the lock
    // dies with it; the pool opens another.
    let held = PlaceLock::try_take(&pool, unit)
        .await
        .unwrap()
        .expect("free again");
    drop(held);
    let started = Instant::now();
    loop {
        if let Some(lock) = PlaceLock::try_take(&pool, unit).await.unwrap() {
            lock.release().await;
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "a dropped lock was never let go"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_ne!(
        pid(&pool).await,
        first,
        "a dropped lock's connection was pooled"
    );
}
