//! One owner per unit at every moment. A creation, the look that settles
//! an unknown one, a deletion and an assimilation each hold their unit's
//! lock while they may act on it: a session advisory lock on a connection
//! of its own, so that it dies with this process's connection (a crash, a
//! database restart) and nothing else can act on the unit meanwhile.
//!
//! The lock alone cannot stop a request already waiting for its turn under
//! the provider's budget: the wait can outlast the lock. So every write is
//! fenced (`provider::Fence`): right before it leaves, the lock's own
//! connection is asked whether the lock still holds and whether the work
//! still owns the unit (its pending row is still its own, and no machine
//! stands there).

use futures::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::provider::Fence;

/// A unit's lock, held until [`PlaceLock::release`] or until dropped (its
/// connection is then closed, never handed back to the pool still holding
/// the lock: a creation cut off mid-way must not leave its unit locked for
/// whoever takes that connection next). A release the server confirms
/// hands the connection back to the pool: a fresh backend per creation
/// (authentication, cold caches, every statement parsed again) was most
/// of a job's cost (issue 31).
pub struct PlaceLock {
    unit: Uuid,
    /// `None` once released.
    conn: Mutex<Option<PoolConnection<Postgres>>>,
}

impl Drop for PlaceLock {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.get_mut().as_mut() {
            conn.close_on_drop();
        }
    }
}

impl std::fmt::Debug for PlaceLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlaceLock")
            .field("unit", &self.unit)
            .finish_non_exhaustive()
    }
}

fn key(unit: Uuid) -> String {
    format!("place/{unit}")
}

impl PlaceLock {
    /// Takes the unit's lock if nobody holds it; `None` if somebody does.
    pub async fn try_take(pool: &PgPool, unit: Uuid) -> Result<Option<PlaceLock>, sqlx::Error> {
        let mut conn = pool.acquire().await?;
        let got: bool = sqlx::query_scalar("select pg_catalog.pg_try_advisory_lock(pg_catalog.hashtextextended($1::text, 0::int8))")
            .bind(key(unit))
            .fetch_one(&mut *conn)
            .await?;
        Ok(got.then(|| PlaceLock {
            unit,
            conn: Mutex::new(Some(conn)),
        }))
    }

    pub fn unit(&self) -> Uuid {
        self.unit
    }

    /// Lets the unit go. A connection whose unlock the server confirmed
    /// goes back to the pool; any other is closed, so that a lock that
    /// could not be released dies with it.
    pub async fn release(mut self) {
        let Some(mut conn) = self.conn.get_mut().take() else {
            return;
        };
        let unlocked: Result<bool, _> = sqlx::query_scalar(
            "select pg_catalog.pg_advisory_unlock(pg_catalog.hashtextextended($1::text, 0::int8))",
        )
        .bind(key(self.unit))
        .fetch_one(&mut *conn)
        .await;
        if !matches!(unlocked, Ok(true)) {
            conn.close_on_drop();
        }
    }

    /// Who stands on the unit, asked on the lock's own connection: an
    /// error means the lock may be lost.
    pub async fn standing(&self) -> Result<Standing, String> {
        let mut guard = self.conn.lock().await;
        let conn = guard
            .as_mut()
            .ok_or_else(|| "the unit's lock was released".to_string())?;
        type Row = (
            Option<String>,
            i64,
            i64,
            Option<String>,
            Option<i32>,
            Option<bool>,
        );
        // The place a pending creation names (`web/3`) and its pool as
        // declared now: a creation admitted before the pool was lowered or
        // removed is not sent.
        let (owner, machines, unassimilated, place, count, removed): Row = sqlx::query_as(
            "select pc.request,
                    (select count(*) from shepherd.managed_machines where reservation_id = $1),
                    (select count(*) from shepherd.unassimilated_devices where reservation_id = $1),
                    pc.place, po.count, po.removed
             from (select 1) one
             left join shepherd.pending_creations pc on pc.reservation_id = $1
             left join shepherd.pools po
                    on pc.place is not null and po.name = regexp_replace(pc.place, '/[0-9]+$', '')",
        )
        .bind(self.unit)
        .fetch_one(&mut **conn)
        .await
        .map_err(|e| format!("the unit's lock may be lost: {e}"))?;
        Ok(Standing {
            owner,
            machines: (machines + unassimilated) as u64,
            unwanted: place.and_then(|p| unwanted(&p, count, removed)),
        })
    }

    /// The fence of a creation by `request` while this lock is held.
    pub fn creation(&self, request: Uuid) -> CreationFence<'_> {
        CreationFence {
            lock: self,
            request: request.to_string(),
        }
    }
}

/// What stands on a unit, as its lock's holder sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    /// The request whose creation is pending on the unit, if any.
    pub owner: Option<String>,
    /// Machines of ours on the unit: managed, or made and not yet
    /// assimilated.
    pub machines: u64,
    /// Why the pools no longer want a machine on the unit's place, if they
    /// do not (the pool was lowered below it, or removed).
    pub unwanted: Option<String>,
}

/// Why `place` (`web/3`) is no longer wanted, given its pool's count and
/// whether it is removed (both `None`: no such pool).
fn unwanted(place: &str, count: Option<i32>, removed: Option<bool>) -> Option<String> {
    let (pool, index) = place.rsplit_once('/')?;
    let index: i64 = index.parse().ok()?;
    match (count, removed) {
        (None, _) | (_, None) => Some(format!("pool {pool} is not declared any more")),
        (_, Some(true)) => Some(format!("pool {pool} was removed")),
        (Some(count), Some(false)) if index >= i64::from(count) => Some(format!(
            "pool {pool} was lowered to {count}: place {place} is not wanted"
        )),
        _ => None,
    }
}

impl Standing {
    /// Why a creation by `request` may not send, if it may not.
    pub fn refuses_creation(&self, request: &str) -> Option<String> {
        if self.owner.as_deref() != Some(request) {
            return Some(match &self.owner {
                Some(other) => format!("the creation by request {other} owns the unit now"),
                None => "the creation has ended; nothing is pending on the unit".into(),
            });
        }
        if self.machines > 0 {
            return Some("a machine of ours stands on the unit".into());
        }
        self.unwanted.clone()
    }
}

/// A creation's fence: the unit's lock still holds, the creation still
/// owns the unit, and no machine stands on it.
pub struct CreationFence<'a> {
    lock: &'a PlaceLock,
    request: String,
}

impl Fence for CreationFence<'_> {
    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            let standing = self.lock.standing().await?;
            match standing.refuses_creation(&self.request) {
                None => Ok(()),
                Some(why) => Err(why),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::unwanted;

    #[test]
    fn a_place_beyond_its_pools_count_or_of_a_removed_pool_is_unwanted() {
        assert_eq!(unwanted("web/2", Some(3), Some(false)), None);
        assert!(unwanted("web/3", Some(3), Some(false)).is_some());
        assert!(unwanted("web/0", Some(3), Some(true)).is_some());
        assert!(unwanted("web/0", None, None).is_some());
        assert_eq!(unwanted("no place", Some(3), Some(false)), None);
    }
}
