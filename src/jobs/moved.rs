//! A log that moved back in time. A restore from a backup, a point-in-time
//! recovery or a failover to a standby that had not received the last
//! transactions leaves shepherd's log older than the provider: servers it
//! made since are in no record, and creations in flight at the backup may
//! already have their server. Such a move changes the database's identity
//! (`shepherd.database_identity_now()`: system identifier, WAL timeline,
//! database oid) while the row that kept the last one seen comes back with
//! the log. `check` notices, records `database_moved` once, and brings the
//! row up to date; a creation requested before the move then looks before
//! it sends (`create_device`).

use sqlx::PgPool;

use crate::events::event::DatabaseMoved;
use crate::events::{NewEvent, record};
use crate::jobs::JobError;

/// Whether the database moved since the last check: the identities
/// (`from`, `to`) when it did, recorded as `database_moved`. The first
/// check of a new cluster records its identity and says nothing.
pub async fn check(pool: &PgPool) -> Result<Option<DatabaseMoved>, JobError> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "select pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('cluster/database'::text, 0::int8))",
    )
    .execute(&mut *tx)
    .await?;
    let (kept, now): (Option<String>, String) = sqlx::query_as(
        "select (select identity from shepherd.database_identity),
                shepherd.database_identity_now()",
    )
    .fetch_one(&mut *tx)
    .await?;
    if kept.as_deref() == Some(now.as_str()) {
        return Ok(None);
    }
    sqlx::query(
        "insert into shepherd.database_identity (one, identity, recorded_at)
         values (true, $1, now())
         on conflict (one) do update set identity = excluded.identity,
                                         recorded_at = excluded.recorded_at",
    )
    .bind(&now)
    .execute(&mut *tx)
    .await?;
    let Some(from) = kept else {
        tx.commit().await?;
        return Ok(None);
    };
    let moved = DatabaseMoved { from, to: now };
    record(&mut tx, vec![NewEvent::new(moved.clone())]).await?;
    tx.commit().await?;
    tracing::error!(
        from = %moved.from,
        to = %moved.to,
        "!!! the database was restored from a backup, recovered to a point in time or failed \
         over: the log may be older than the provider. Creations requested before now look \
         before they send; servers made since the backup show as discrepancies (see \
         docs/operations.md, backups, restores and failover)"
    );
    Ok(Some(moved))
}

/// The first statement's test of whether the database moved and no check
/// has recorded it yet (`check` then does).
pub(crate) const UNRECORDED: &str = "coalesce((select identity from shepherd.database_identity)
                      <> shepherd.database_identity_now(), false)";
