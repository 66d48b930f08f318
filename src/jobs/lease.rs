//! Leases: the right to act on a unit, or to run the pass, held as a row
//! of `shepherd.leases` with an expiry rather than as a session advisory
//! lock. A lock lived in its connection, so a creation held two
//! connections across its provider calls (its work's and its lock's) and
//! nothing could stand between shepherd and Postgres that hands a server
//! connection to another client between transactions (PgBouncer in
//! transaction mode). A lease holds no connection between its statements.
//!
//! What the lock gave and the lease keeps:
//! - one holder at a time: taking is one statement that inserts the row or
//!   takes it over only once it has expired;
//! - nothing acts on a lease it lost: every check a holder makes before it
//!   writes to the provider (a `Fence`) confirms the lease in the same
//!   statement that reads who stands on the unit (renewing it unless that
//!   was done within the fence's grace, `CONFIRM`), and fails when the row
//!   is no longer its own, so the write does not leave;
//! - a crash frees the unit: a lease not renewed expires after the
//!   cluster's rescue window, when the crashed worker's jobs go to others
//!   (`Rescue`). The check right before a write leaves the lease at least
//!   a whole window less the grace, and one API attempt and a heartbeat end
//!   inside that (`Rescue::fence_grace`), so a second holder can never
//!   start while a first one's write is on the wire.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

/// A held lease, renewed in the background until [`Lease::release`] or
/// until dropped (a dropped lease is released by a task of its own: a job
/// cut off mid-way gives its unit back as a closed connection did).
pub struct Lease {
    pool: PgPool,
    key: String,
    id: Uuid,
    term: Duration,
    /// Set by the keeper when a renewal found the row gone or another's.
    lost: Arc<AtomicBool>,
    keeper: tokio::task::JoinHandle<()>,
    released: bool,
    /// Deleted by a transaction that committed ([`Lease::release_in`]).
    given_back: AtomicBool,
    /// A transaction is giving the lease back: a renewal that finds it gone
    /// is that, not a loss.
    giving_back: Arc<AtomicBool>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// The statement that takes `$1` as lease `$2` for `$3` milliseconds, held
/// by `$4`, where `cond` holds and nobody holds it or its holder's lease has
/// expired; it returns `$2` when taken. A caller that needs to know
/// something else before deciding to take a lease asks it in the same round
/// trip, with this in front (`create_device`); what it reads shares the
/// statement's snapshot, taken before any wait on a holder, so what the
/// lease guards is read again after.
pub(crate) fn take_where(cond: &str) -> String {
    format!(
        "insert into shepherd.leases as l (key, lease, holder, taken_at, expires_at)
         select $1::text, $2::uuid, $4::text, pg_catalog.clock_timestamp(),
                pg_catalog.clock_timestamp() + $3::int8 * interval '1 millisecond'
         where {cond}
         on conflict (key) do update
             set lease = excluded.lease, holder = excluded.holder,
                 taken_at = excluded.taken_at, expires_at = excluded.expires_at
             where l.expires_at <= pg_catalog.clock_timestamp()
         returning lease"
    )
}

/// A term as the lease statements bind it, in milliseconds.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 2)
}

impl Lease {
    /// Takes `key` for `term` if nobody holds it (or its holder's lease has
    /// expired); `None` if somebody does. Renewed every third of `term`.
    pub async fn try_take(
        pool: &PgPool,
        key: &str,
        term: Duration,
    ) -> Result<Option<Lease>, sqlx::Error> {
        let id = Uuid::new_v4();
        static TAKE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| take_where("true"));
        let taken: Option<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(TAKE.as_str()))
            .bind(key)
            .bind(id)
            .bind(millis(term))
            .bind(crate::fleet::process_name())
            .fetch_optional(pool)
            .await?;
        Ok((taken == Some(id)).then(|| Lease::taken(pool, key, id, term)))
    }

    /// The lease `id` that a statement built on [`take_where`] has just taken
    /// (it returned `id`): kept from now on, as [`Lease::try_take`] keeps
    /// its own.
    pub(crate) fn taken(pool: &PgPool, key: &str, id: Uuid, term: Duration) -> Lease {
        let lost = Arc::new(AtomicBool::new(false));
        let giving_back = Arc::new(AtomicBool::new(false));
        let keeper = tokio::spawn(keep(
            pool.clone(),
            key.to_string(),
            id,
            term,
            lost.clone(),
            giving_back.clone(),
        ));
        Lease {
            pool: pool.clone(),
            key: key.to_string(),
            id,
            term,
            lost,
            keeper,
            released: false,
            given_back: AtomicBool::new(false),
            giving_back,
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// This holder's id, as the row carries it.
    pub fn id(&self) -> Uuid {
        self.id
    }

    pub fn term(&self) -> Duration {
        self.term
    }

    /// The term in milliseconds, as the lease statements bind it.
    pub(crate) fn term_millis(&self) -> i64 {
        millis(self.term)
    }

    /// The pool the lease's statements run on.
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Whether a renewal has found the lease gone. `false` proves nothing:
    /// only a check in the database does ([`Lease::renew`]).
    pub fn known_lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// Renews the lease for a whole term; `false` if it is not ours any
    /// more (expired and taken, or deleted by an operator).
    pub async fn renew(&self) -> Result<bool, sqlx::Error> {
        let ours = renew(&self.pool, &self.key, self.id, self.term).await?;
        if !ours {
            self.lost.store(true, Ordering::Relaxed);
        }
        Ok(ours)
    }

    /// Whether the lease is still this holder's and unexpired by the
    /// database's clock, proven in `conn`'s transaction; the row stays
    /// locked until that transaction ends, so nobody takes the lease over
    /// between the proof and the commit. A run's terminal outcome is
    /// recorded only under this proof: a run that stalled past its lease
    /// (a frozen VM, a stopped process) may find another run holding the
    /// unit by the time it comes back.
    pub async fn held_in(&self, conn: &mut sqlx::PgConnection) -> Result<bool, sqlx::Error> {
        let held: Option<i32> = sqlx::query_scalar(
            "select 1 from shepherd.leases
             where key = $1 and lease = $2 and expires_at > pg_catalog.clock_timestamp()
             for update",
        )
        .bind(&self.key)
        .bind(self.id)
        .fetch_optional(conn)
        .await?;
        if held.is_none() {
            self.lost.store(true, Ordering::Relaxed);
        }
        Ok(held.is_some())
    }

    /// Gives the lease back in `conn`'s transaction, the one that records
    /// what the lease guarded: the unit is free exactly when the outcome is
    /// in, and no statement of its own is spent on it (issue 31). Renewals
    /// go on until [`Lease::given_back`] (a transaction rolled back leaves
    /// the lease held and kept); one that finds the row gone meanwhile
    /// stops quietly, as that is the give-back committing. Without
    /// `given_back`, [`Lease::release`] gives it back on its own.
    pub async fn release_in(&self, conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
        self.giving_back.store(true, Ordering::Relaxed);
        sqlx::query("delete from shepherd.leases where key = $1 and lease = $2")
            .bind(&self.key)
            .bind(self.id)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// The lease as a statement of the caller's gives it back in a
    /// transaction (as [`Lease::release_in`] does, in a statement of the
    /// caller's own): its key and holder. [`Lease::given_back`] once that
    /// commits.
    pub(crate) fn giving_back(&self) -> (&str, Uuid) {
        self.giving_back.store(true, Ordering::Relaxed);
        (&self.key, self.id)
    }

    /// The transaction of [`Lease::release_in`] committed.
    pub fn given_back(&self) {
        self.keeper.abort();
        self.given_back.store(true, Ordering::Relaxed);
    }

    /// Gives the lease back (only if it is still ours).
    pub async fn release(mut self) {
        self.keeper.abort();
        self.released = true;
        if self.given_back.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = release(&self.pool, &self.key, self.id).await {
            tracing::warn!(key = %self.key, error = %e, "could not give a lease back; it expires on its own");
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.keeper.abort();
        if self.released || self.given_back.load(Ordering::Relaxed) {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (pool, key, id) = (self.pool.clone(), self.key.clone(), self.id);
            rt.spawn(async move {
                let _ = release(&pool, &key, id).await;
            });
        }
    }
}

/// The statement that renews `key` for `term` if `id` still holds it.
/// Fences put it in front of their own reads (see `place.rs`).
pub(crate) const RENEW: &str = "update shepherd.leases
     set expires_at = pg_catalog.clock_timestamp() + $3::int8 * interval '1 millisecond'
     where key = $1 and lease = $2 and expires_at > pg_catalog.clock_timestamp()
     returning 1 as held";

/// [`RENEW`] for a holder about to write: the lease is renewed only when
/// more than `$5` milliseconds of its term `$3` have gone since it was taken
/// or renewed, and otherwise only read. A read commits without a WAL flush,
/// and a creation's fence follows the take by milliseconds. Ends in `held`,
/// a row when the lease is this holder's with at least `$3 - $5` left.
pub(crate) const CONFIRM: &str = "now as (select pg_catalog.clock_timestamp() as t),
     renewed as (
         update shepherd.leases l set expires_at = now.t + $3::int8 * interval '1 millisecond'
         from now
         where l.key = $1 and l.lease = $2 and l.expires_at > now.t
           and l.expires_at < now.t + ($3::int8 - $5::int8) * interval '1 millisecond'
         returning 1),
     held as (
         select 1 from renewed
         union all
         select 1 from shepherd.leases l, now
         where l.key = $1 and l.lease = $2
           and l.expires_at >= now.t + ($3::int8 - $5::int8) * interval '1 millisecond')";

async fn renew(pool: &PgPool, key: &str, id: Uuid, term: Duration) -> Result<bool, sqlx::Error> {
    let row: Option<i32> = sqlx::query_scalar(RENEW)
        .bind(key)
        .bind(id)
        .bind(millis(term))
        .fetch_optional(pool)
        .await?;
    Ok(row.is_some())
}

async fn release(pool: &PgPool, key: &str, id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("delete from shepherd.leases where key = $1 and lease = $2")
        .bind(key)
        .bind(id)
        .execute(pool)
        .await?;
    Ok(())
}

/// Renews every third of the term. A database that does not answer is
/// tried again at the next beat: the lease still has two thirds of its
/// term, and every fence checks it anyway.
async fn keep(
    pool: PgPool,
    key: String,
    id: Uuid,
    term: Duration,
    lost: Arc<AtomicBool>,
    giving_back: Arc<AtomicBool>,
) {
    let beat = (term / 3).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(beat).await;
        match renew(&pool, &key, id, term).await {
            Ok(true) => {}
            // Gone while a transaction gives it back: most likely that
            // committed; said nowhere, but marked, as the lease is not
            // held either way.
            Ok(false) if giving_back.load(Ordering::Relaxed) => {
                lost.store(true, Ordering::Relaxed);
                return;
            }
            Ok(false) => {
                lost.store(true, Ordering::Relaxed);
                tracing::error!(
                    key = %key,
                    "this job's lease expired or was taken: it will not write to the provider again"
                );
                return;
            }
            Err(e) => {
                tracing::warn!(key = %key, error = %e, "could not renew a lease; trying again");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::millis;
    use std::time::Duration;

    #[test]
    fn a_term_is_sent_in_milliseconds_and_never_overflows() {
        assert_eq!(millis(Duration::from_secs(60)), 60_000);
        assert!(millis(Duration::MAX) > 0);
    }
}
