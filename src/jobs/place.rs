//! One owner per unit at every moment. A creation, the look that settles
//! an unknown one, a deletion and an assimilation each hold their unit's
//! lease (`lease.rs`) while they may act on it, so that nothing else can
//! act on the unit meanwhile; a crashed holder's lease expires with the
//! cluster's rescue window, when its jobs go to others.
//!
//! The lease alone cannot stop a request already waiting for its turn
//! under the provider's budget: the wait can outlast it. So every write is
//! fenced (`provider::Fence`): right before it leaves, one statement
//! confirms the lease (failing if it is no longer this holder's; renewing
//! it unless that was done within the fence's grace) and reads whether the
//! work still owns the unit (its pending row is still its own, and no
//! machine stands there).

use std::sync::LazyLock;
use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::PgPool;
use uuid::Uuid;

use super::lease::{CONFIRM, Lease, RENEW, millis};
use crate::provider::Fence;

/// A unit's lease, held until [`PlaceLock::release`] or until dropped.
/// It holds no connection: each check takes one from the pool for one
/// statement (issue 31: a lock's connection held across provider calls
/// was half of what a creation cost the database).
#[derive(Debug)]
pub struct PlaceLock {
    unit: Uuid,
    lease: Lease,
}

fn key(unit: Uuid) -> String {
    format!("place/{unit}")
}

impl PlaceLock {
    /// Takes the unit's lease for `term` if nobody holds it; `None` if
    /// somebody does.
    pub async fn try_take(
        pool: &PgPool,
        unit: Uuid,
        term: Duration,
    ) -> Result<Option<PlaceLock>, sqlx::Error> {
        Ok(Lease::try_take(pool, &key(unit), term)
            .await?
            .map(|lease| PlaceLock { unit, lease }))
    }

    pub fn unit(&self) -> Uuid {
        self.unit
    }

    /// Lets the unit go.
    pub async fn release(self) {
        self.lease.release().await;
    }

    /// Lets the unit go in `conn`'s transaction, the one recording the
    /// outcome; [`PlaceLock::given_back`] once it commits.
    pub async fn release_in(&self, conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
        self.lease.release_in(conn).await
    }

    /// Whether this holder still holds the unit, proven in `conn`'s
    /// transaction and kept until it ends (`Lease::held_in`).
    pub async fn held_in(&self, conn: &mut sqlx::PgConnection) -> Result<bool, sqlx::Error> {
        self.lease.held_in(conn).await
    }

    /// The lease for a statement of the caller's that deletes it in the
    /// transaction recording the outcome (`queue::push_assimilate_releasing`);
    /// [`PlaceLock::given_back`] once it commits.
    pub(crate) fn giving_back(&self) -> (&str, Uuid) {
        self.lease.giving_back()
    }

    pub fn given_back(&self) {
        self.lease.given_back();
    }

    /// The unit's lease, just taken as `id` by a statement of the caller's
    /// built on [`super::lease::take_where`] and bound as [`PlaceLock::key_of`].
    pub(crate) fn taken(pool: &PgPool, unit: Uuid, id: Uuid, term: Duration) -> PlaceLock {
        PlaceLock {
            unit,
            lease: Lease::taken(pool, &key(unit), id, term),
        }
    }

    /// The lease key of `unit`.
    pub(crate) fn key_of(unit: Uuid) -> String {
        key(unit)
    }

    /// Who stands on the unit, read in the statement that renews the
    /// lease: an error means the lease is lost or cannot be confirmed.
    pub async fn standing(&self) -> Result<Standing, String> {
        static RENEWING: LazyLock<String> =
            LazyLock::new(|| standing_sql(&format!("held as ({RENEW})"), "$4"));
        self.read_standing(&RENEWING, None).await
    }

    /// [`PlaceLock::standing`] right before a write: the lease is renewed
    /// only if more than `grace` of its term has gone (`lease::CONFIRM`).
    pub async fn confirmed(&self, grace: Duration) -> Result<Standing, String> {
        static CONFIRMING: LazyLock<String> = LazyLock::new(|| standing_sql(CONFIRM, "$4"));
        self.read_standing(&CONFIRMING, Some(millis(grace))).await
    }

    /// Runs `sql` (built by [`standing_sql`], the unit bound as `$4`).
    async fn read_standing(
        &self,
        sql: &'static str,
        grace: Option<i64>,
    ) -> Result<Standing, String> {
        if self.lease.known_lost() {
            return Err("the unit's lease was lost".into());
        }
        let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(self.lease.key())
            .bind(self.lease.id())
            .bind(self.lease.term_millis())
            .bind(self.unit);
        if let Some(grace) = grace {
            query = query.bind(grace);
        }
        let row: StandingRow = query
            .fetch_one(self.lease.pool())
            .await
            .map_err(|e| format!("the unit's lease cannot be confirmed: {e}"))?;
        let (held, standing) = standing_of(row);
        if !held {
            return Err(
                "the unit's lease was lost (it expired, or another run holds it now)".into(),
            );
        }
        Ok(standing)
    }

    /// The fence of a creation by `request` while this lock is held; it
    /// may leave the lease unrenewed within `grace` of its last renewal
    /// (`Rescue::fence_grace`).
    pub fn creation(&self, request: Uuid, grace: Duration) -> CreationFence<'_> {
        CreationFence {
            lock: self,
            request: request.to_string(),
            grace,
        }
    }
}

/// Whether the lease statement in front held the unit, who owns its
/// creation, its machines and unassimilated devices, and its place with its
/// pool's count and whether that pool is removed.
type StandingRow = (
    bool,
    Option<String>,
    i64,
    i64,
    Option<String>,
    Option<i32>,
    Option<bool>,
);

/// `lease` (the common table expressions of a statement, the last named
/// `held` and holding a row when the unit is this holder's) followed by the
/// read of who stands on the unit bound as `unit`. The
/// place a pending creation names (`web/3`) comes with its pool as declared
/// now: a creation admitted before the pool was lowered or removed is not
/// sent.
fn standing_sql(lease: &str, unit: &str) -> String {
    format!(
        "with {lease}
         select exists(select 1 from held),
                pc.request,
                (select count(*) from shepherd.managed_machines where reservation_id = {unit}),
                (select count(*) from shepherd.unassimilated_devices where reservation_id = {unit}),
                pc.place, po.count, po.removed
         from (select 1) one
         left join shepherd.pending_creations pc on pc.reservation_id = {unit}
         left join shepherd.pools po
                on pc.place is not null and po.name = regexp_replace(pc.place, '/[0-9]+$', '')"
    )
}

fn standing_of(row: StandingRow) -> (bool, Standing) {
    let (held, owner, machines, unassimilated, place, count, removed) = row;
    let standing = Standing {
        owner,
        machines: (machines + unassimilated) as u64,
        unwanted: place.and_then(|p| unwanted(&p, count, removed)),
    };
    (held, standing)
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
    grace: Duration,
}

impl Fence for CreationFence<'_> {
    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            // The statement proves at least the term less the grace left
            // when it ran. Timed from before it was sent, by the monotonic
            // clock: an answer that took longer than the grace to come back
            // (a slow pool, a process stalled) has eaten the margin the
            // create needs to end before anyone else may hold the unit.
            // A grace of zero is a window with no margin over an attempt
            // (Metal's, whose provider refuses a second device itself):
            // there is no margin to keep.
            let began = std::time::Instant::now();
            let standing = self.lock.confirmed(self.grace).await?;
            let took = began.elapsed();
            if !self.grace.is_zero() && took > self.grace {
                return Err(format!(
                    "the unit's lease was confirmed, but the check took {} ms, over its grace of \
                     {} ms: the create does not leave on it",
                    took.as_millis(),
                    self.grace.as_millis()
                ));
            }
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
