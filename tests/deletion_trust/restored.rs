//! A database restored from a backup (issue 46): the log moves back in
//! time and the provider does not. The backup is a real `pg_dump` of the
//! cluster's database, restored into a new database with `psql`, and the
//! restored cluster runs against the same fake Latitude.

use super::*;
use common::world::run_next;
use shepherd_fakes::latitude::Call;
use sqlx::postgres::PgPoolOptions;

/// `pg_dump` of the database `db` is in, as plain SQL.
async fn dump(db: &PgPool) -> Vec<u8> {
    let name: String = sqlx::query_scalar("select current_database()")
        .fetch_one(db)
        .await
        .expect("the database's name");
    let out = std::process::Command::new("pg_dump")
        .args([
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "--no-owner",
            "-d",
            &name,
        ])
        .output()
        .expect("pg_dump must be installed: the backup cannot be taken without it");
    assert!(
        out.status.success(),
        "pg_dump failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A new database holding `backup`, restored with `psql`; dropped when the
/// test ends.
struct Restored {
    name: String,
    pool: PgPool,
    admin: PgPool,
}

impl Restored {
    async fn from(admin: &PgPool, backup: &[u8]) -> Restored {
        let name = format!("shepherd_restored_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(sqlx::AssertSqlSafe(format!("create database {name}")))
            .execute(admin)
            .await
            .expect("a database to restore into");
        let mut psql = std::process::Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                &name,
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("psql must be installed: the backup cannot be restored without it");
        {
            use std::io::Write;
            let mut stdin = psql.stdin.take().expect("psql's stdin");
            stdin.write_all(backup).expect("feeding the backup to psql");
        }
        assert!(psql.wait().expect("psql").success(), "the restore failed");
        let options = (*admin.connect_options()).clone().database(&name);
        let pool = PgPoolOptions::new()
            .max_connections(5)
            .connect_with(options)
            .await
            .expect("connecting to the restored database");
        Restored {
            name,
            pool,
            admin: admin.clone(),
        }
    }

    async fn drop_database(self) {
        self.pool.close().await;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "drop database {} with (force)",
            self.name
        )))
        .execute(&self.admin)
        .await
        .expect("dropping the restored database");
    }
}

/// Done-when (a) of issue 46: a backup taken mid-fill of a pool of 10,
/// the fill finished on the live database, then the database restored
/// from the backup. The creations the backup left in flight had made
/// their servers after it: each looks before it sends, finds its server
/// by its witness and records it. No place gets two servers, nothing is
/// created or deleted, every server is managed again with no operator
/// step, and the move is announced.
#[sqlx::test(migrations = false)]
async fn a_database_restored_from_a_backup_taken_mid_fill_converges_by_itself(db: PgPool) {
    let w = World::new(db.clone(), 10, vec![pool("web", "DAL", 10)]).await;
    let pass = w.pass().await;
    assert_eq!(pass.enqueued.len(), 10, "{pass:?}");
    for _ in 0..4 {
        run_next(&w.pool, &w.ctx)
            .await
            .expect("a creation to run before the backup");
    }
    let backup = dump(&w.pool).await;
    // The live cluster fills the pool after the backup was taken.
    w.settle(3).await;
    assert_eq!(w.fake.servers().len(), 10);
    let creates = w.fake.calls(Call::CreateServer);

    // The database is restored from the backup; the provider is as it was.
    let restored = Restored::from(&db, &backup).await;
    let r = w
        .restored(restored.pool.clone(), Duration::from_secs(1))
        .await;
    let in_flight = r
        .count("select count(*) from shepherd.pending_creations")
        .await;
    assert_eq!(in_flight, 6, "the backup was not taken mid-fill");
    let began = std::time::Instant::now();
    loop {
        r.pass().await;
        drain_rounds(&r, 2).await;
        let managed = r
            .count("select count(*) from shepherd.managed_machines")
            .await;
        let pending = r
            .count("select count(*) from shepherd.pending_creations")
            .await;
        if managed == 10 && pending == 0 {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(180),
            "not converged in 3 minutes: {managed} managed, {pending} pending"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(r.fake.servers().len(), 10, "a place got a second server");
    assert_eq!(
        r.fake.calls(Call::CreateServer),
        creates,
        "a server was created"
    );
    assert_eq!(r.fake.calls(Call::DestroyServer), 0, "a server was deleted");
    assert!(r.events("deletion_requested").await.is_empty());
    // Announced once, where an operator looks.
    let moved = r.events("database_moved").await;
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_ne!(moved[0]["from"], moved[0]["to"], "{moved:?}");
    let overview = shepherd::fleet::overview(&r.pool)
        .await
        .expect("the overview");
    assert!(overview.database_moved.is_some());
    r.settle(3).await;
    r.assert_invariants().await;
    drop(r);
    restored.drop_database().await;
}
