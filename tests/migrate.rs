//! `shepherd::db::migrate` on a database already up to date takes no lock
//! (behind a pooler in transaction mode, the migrators' session lock can
//! stay held on a server connection another client gets), and on one with
//! a migration pending still waits for whoever holds it.

use std::time::Duration;

use sqlx::migrate::Migrate;
use sqlx::{Connection, PgConnection, PgPool};

async fn holder(pool: &PgPool) -> PgConnection {
    let mut conn = PgConnection::connect_with(&pool.connect_options())
        .await
        .expect("a connection of its own");
    // The very lock `Migrator::run` takes (it is keyed by the database).
    conn.lock().await.expect("taking the migrators' lock");
    conn
}

#[sqlx::test(migrations = false)]
async fn an_up_to_date_database_is_left_alone_without_the_lock(pool: PgPool) {
    shepherd::db::migrate(&pool).await.expect("first migration");
    let ours = shepherd::db::migrator();
    assert!(shepherd::db::up_to_date(&pool, &ours).await.unwrap());
    let queue = apalis_postgres::PostgresStorage::<()>::migrations();
    assert!(shepherd::db::up_to_date(&pool, &queue).await.unwrap());

    let mut held = holder(&pool).await;
    tokio::time::timeout(Duration::from_secs(10), shepherd::db::migrate(&pool))
        .await
        .expect("an up-to-date database does not wait for the migrators' lock")
        .expect("migrate on an up-to-date database");

    // One migration forgotten by the ledger: pending again, so migrate
    // waits for the lock, and applies it once the holder lets go.
    let last = ours.iter().map(|m| m.version).max().unwrap();
    sqlx::query("delete from shepherd._sqlx_migrations where version = $1")
        .bind(last)
        .execute(&pool)
        .await
        .unwrap();
    assert!(!shepherd::db::up_to_date(&pool, &ours).await.unwrap());
    let again = tokio::spawn({
        let pool = pool.clone();
        async move { shepherd::db::migrate(&pool).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !again.is_finished(),
        "a pending migration is applied under the lock, which is held"
    );
    held.unlock().await.expect("letting the lock go");
    tokio::time::timeout(Duration::from_secs(30), again)
        .await
        .expect("migrate goes on once the lock is free")
        .unwrap()
        .expect("the pending migration applies");
    assert!(shepherd::db::up_to_date(&pool, &ours).await.unwrap());
}

#[sqlx::test(migrations = false)]
async fn a_changed_or_unknown_migration_is_not_up_to_date(pool: PgPool) {
    let ours = shepherd::db::migrator();
    assert!(
        !shepherd::db::up_to_date(&pool, &ours).await.unwrap(),
        "no ledger at all"
    );
    shepherd::db::migrate(&pool).await.unwrap();
    let first = ours.iter().map(|m| m.version).min().unwrap();
    let kept: Vec<u8> =
        sqlx::query_scalar("select checksum from shepherd._sqlx_migrations where version = $1")
            .bind(first)
            .fetch_one(&pool)
            .await
            .unwrap();
    let set = |checksum: Vec<u8>| {
        sqlx::query("update shepherd._sqlx_migrations set checksum = $2 where version = $1")
            .bind(first)
            .bind(checksum)
            .execute(&pool)
    };
    set(vec![0]).await.unwrap();
    assert!(!shepherd::db::up_to_date(&pool, &ours).await.unwrap());
    let refused = shepherd::db::migrate(&pool).await.unwrap_err().to_string();
    assert!(refused.contains("migration failed"), "{refused}");
    set(kept).await.unwrap();
    assert!(shepherd::db::up_to_date(&pool, &ours).await.unwrap());
    sqlx::query(
        "insert into shepherd._sqlx_migrations (version, description, success, checksum, execution_time)
         values (99990101000000, 'from a newer build', true, '\\x00', 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert!(!shepherd::db::up_to_date(&pool, &ours).await.unwrap());
}

/// A role that may not read the ledgers (a least-privilege role started
/// without --skip-migrations) is told what to do, as one that may not
/// migrate is, not handed the bare permission error.
#[sqlx::test(migrations = false)]
async fn a_role_that_cannot_read_the_ledgers_is_told_to_skip_migrations(pool: PgPool) {
    shepherd::db::migrate(&pool).await.expect("first migration");
    let role = format!("shepherd_ledger_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("create role {role} login")))
        .execute(&pool)
        .await
        .unwrap();
    let options = (*pool.connect_options()).clone().username(&role);
    let outsider = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .expect("the role logs in");
    let refused = shepherd::db::migrate(&outsider)
        .await
        .unwrap_err()
        .to_string();
    outsider.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("drop role {role}")))
        .execute(&pool)
        .await
        .unwrap();
    assert!(
        refused.contains("permission denied") && refused.contains("--skip-migrations"),
        "{refused}"
    );
}
