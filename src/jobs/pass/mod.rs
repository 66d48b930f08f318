//! The decisions of a reconcile pass, as pure functions over what it read:
//! which devices to adopt and which are discrepancies, and which
//! reservations to take and why the others are skipped. The reconcile job
//! and the dry-run `shepherd plan` both call them, so the plan cannot drift
//! from what a pass does.

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::events::event::ReservationCounts;
use crate::provider::{Inventory, Machine};

/// What shepherd's own tables say, read in one snapshot.
#[derive(Debug, Default)]
pub struct Fleet {
    /// Managed machines by their provider's id.
    pub managed: HashSet<String>,
    /// Units (reservations) with a creation in flight.
    pub pending: HashSet<Uuid>,
    /// Machines made and not yet assimilated, by their provider's id.
    pub unassimilated: HashSet<String>,
    pub penalised: HashSet<Uuid>,
    /// Stock under a penalty (`Unit::scope`): no unit drawing on it is taken.
    pub penalised_scopes: HashSet<String>,
    /// Units a machine of ours stands on by our own records: managed, or
    /// made and not yet assimilated (a listing may not show it yet).
    pub held_units: HashSet<Uuid>,
    /// Managed machines by their provider's id: their id, and whether they
    /// are protected.
    pub machines: HashMap<String, (Uuid, bool)>,
    /// Machines leaving (a deletion pending), by machine id.
    pub leaving: HashSet<Uuid>,
    /// Managed machines a pass has seen ready, by the provider's id: ready
    /// once, never replaced as "not ready".
    pub ready_once: HashSet<String>,
    /// When our own creation of each managed machine never seen ready was
    /// recorded (`device_created`), by the provider's id: the ready
    /// deadline counts from there, never from the provider's `created_at`.
    /// A machine we did not create (adopted, assimilated by hand) has none,
    /// and is never replaced as "not ready".
    pub made_at: HashMap<String, chrono::DateTime<chrono::Utc>>,
    /// Machines shepherd deleted in the last day, by the provider's id: a
    /// listing that lags behind deletes may still show them, and they are
    /// neither orphans to adopt nor members of a pool.
    pub deleted: HashSet<String>,
}

impl Fleet {
    pub fn in_flight(&self) -> u64 {
        (self.pending.len() + self.unassimilated.len()) as u64
    }
}

pub async fn read_fleet(pool: &PgPool) -> Result<Fleet, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("set transaction isolation level repeatable read read only")
        .execute(&mut *tx)
        .await?;
    let ids = |sql: &'static str| sqlx::query_scalar::<_, Uuid>(sql);
    // Protection and "ready once" follow the device across its managed
    // lives (lost or released, then adopted again under a new id): the
    // device's stream holds them whichever machine id recorded them.
    let managed_rows: Vec<(String, Uuid, bool, Option<Uuid>, bool)> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "select m.provider_id, m.machine_id, {}, m.reservation_id, {}
             from shepherd.managed_machines m",
            crate::fleet::PROTECTED,
            crate::fleet::READY_ONCE
        )))
        .fetch_all(&mut *tx)
        .await?;
    // The later of our creation and the machine's assimilation: a machine
    // lost and adopted again under a new id counts from its return, not
    // from a creation long ago.
    let made_at: Vec<(String, Option<chrono::DateTime<chrono::Utc>>)> = sqlx::query_as(
        "select m.provider_id,
                greatest((select min(e.recorded_at) from shepherd.events e
                          where e.event_type = 'device_created'
                            and e.body->>'device' = m.provider_id),
                         m.assimilated_at)
         from shepherd.managed_machines m
         where m.ready_at is null
           and exists (select 1 from shepherd.events e
                       where e.event_type = 'device_created' and e.body->>'device' = m.provider_id)",
    )
    .fetch_all(&mut *tx)
    .await?;
    let unassimilated: Vec<(String, Option<Uuid>)> =
        sqlx::query_as("select device_id, reservation_id from shepherd.unassimilated_devices")
            .fetch_all(&mut *tx)
            .await?;
    // Active penalties once: their units, and the stock some hold back.
    let penalties: Vec<(Uuid, Option<String>)> =
        sqlx::query_as("select reservation_id, scope from shepherd.sinbin where now() <= until")
            .fetch_all(&mut *tx)
            .await?;
    let fleet = Fleet {
        managed: managed_rows.iter().map(|r| r.0.clone()).collect(),
        pending: ids("select reservation_id from shepherd.pending_creations")
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .collect(),
        unassimilated: unassimilated.iter().map(|(d, _)| d.clone()).collect(),
        held_units: managed_rows
            .iter()
            .filter_map(|r| r.3)
            .chain(unassimilated.iter().filter_map(|(_, u)| *u))
            .collect(),
        machines: managed_rows
            .iter()
            .map(|(device, id, protected, _, _)| (device.clone(), (*id, *protected)))
            .collect(),
        ready_once: managed_rows
            .iter()
            .filter(|r| r.4)
            .map(|r| r.0.clone())
            .collect(),
        made_at: made_at
            .into_iter()
            .filter_map(|(device, at)| Some((device, at?)))
            .collect(),
        leaving: ids("select machine_id from shepherd.pending_deletions")
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .collect(),
        deleted: sqlx::query_scalar::<_, String>(
            "select body->>'provider_id' from shepherd.events
             where event_type = 'machine_deleted' and recorded_at > now() - interval '1 day'",
        )
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .collect(),
        penalised: penalties.iter().map(|(unit, _)| *unit).collect(),
        penalised_scopes: penalties
            .into_iter()
            .filter_map(|(_, scope)| scope)
            .collect(),
    };
    tx.commit().await?;
    Ok(fleet)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adoption {
    pub device: String,
    pub reservation: Option<Uuid>,
    pub witnessed: bool,
}

/// How the pass sees the provider's devices against its own records.
#[derive(Debug, Default)]
pub struct Comparison {
    /// Prefixed devices to adopt: witnessed orphans, or, when `assimilate`
    /// is on, devices on a unit of ours that carry no witness at all.
    pub adopt: Vec<Adoption>,
    /// Prefixed devices nobody manages and no witness explains, on a unit
    /// shepherd provisions: a pass does no work until they are explained.
    pub unknown: Vec<String>,
    /// Prefixed devices on no unit shepherd provisions (another
    /// deployment whose prefix extends ours, `shepherd-staging-…`):
    /// reported, never adopted, and they stop nothing, since no creation
    /// or deletion of ours concerns them.
    pub strangers: Vec<String>,
    /// Managed machines whose device is gone from the provider.
    pub missing: Vec<String>,
}

/// Which machines a witness proves ours, by the provider's id. A witness
/// (the whole request, Metal's tag, or its first 8 hex digits, in a
/// Latitude hostname) proves a machine ours only when our log holds a
/// creation request it names **for the machine's own place**, and no other
/// machine was recorded as that request's creation unless one of its
/// creates went unanswered: a request whose every create was answered made
/// one machine, so a server made by hand with a copied hostname is not
/// ours, whatever its name says.
pub async fn our_requests(
    pool: &PgPool,
    machines: &[Machine],
) -> Result<HashSet<String>, sqlx::Error> {
    let named: Vec<&Machine> = machines.iter().filter(|m| m.witness.is_some()).collect();
    if named.is_empty() {
        return Ok(HashSet::new());
    }
    let ids: Vec<String> = named.iter().map(|m| m.id.clone()).collect();
    let witnesses: Vec<String> = named.iter().filter_map(|m| m.witness.clone()).collect();
    let units: Vec<Option<Uuid>> = named.iter().map(|m| m.unit).collect();
    let found: Vec<String> = sqlx::query_scalar(
        "select m.id from unnest($1::text[], $2::text[], $3::uuid[]) as m(id, w, unit)
         where exists (
             select 1 from shepherd.events c
             where c.event_type = 'creation_requested'
               and (c.body->>'request' = m.w
                    or (length(m.w) = 8 and left(c.body->>'request', 8) = m.w))
               and (m.unit is null or c.body->>'reservation' = m.unit::text)
               and (not exists (
                        select 1 from shepherd.events d
                        where d.event_type = 'device_created'
                          and d.body->>'request' = c.body->>'request'
                          and d.body->>'device' <> m.id)
                    -- A create of the request went unanswered: it may have
                    -- made a second machine, ours all the same.
                    or exists (
                        select 1 from shepherd.events u
                        where u.event_type = 'creation_unresolved'
                          and u.body->>'request' = c.body->>'request')))",
    )
    .bind(&ids)
    .bind(&witnesses)
    .bind(&units)
    .fetch_all(pool)
    .await?;
    Ok(found.into_iter().collect())
}

/// Compares the provider's devices with shepherd's records. `before` was
/// read before the listing and `after` once it was done: a machine counts as
/// missing only if it was managed before the listing began (a device made
/// during the listing may be absent from it), and a device counts as
/// unknown only if nothing recorded it by the time the listing ended (its
/// creation may have committed during the listing).
pub fn compare(
    devices: &[Machine],
    before: &Fleet,
    after: &Fleet,
    prefix: &str,
    assimilate: bool,
    ours: &HashSet<String>,
) -> Comparison {
    let mut c = Comparison::default();
    let present: HashSet<String> = devices.iter().map(|d| d.id.clone()).collect();
    let fleet = after;
    for d in devices {
        let id = d.id.clone();
        let prefixed = d.hostname.as_deref().is_some_and(|h| h.starts_with(prefix));
        // A device whose creation is still committing is in flight, not an
        // orphan; one deleted a moment ago is gone, whatever a lagging
        // listing says.
        let in_flight =
            fleet.unassimilated.contains(&id) || d.unit.is_some_and(|r| fleet.pending.contains(&r));
        if !prefixed || fleet.managed.contains(&id) || in_flight || after.deleted.contains(&id) {
            continue;
        }
        // Another deployment's witness is no proof: only a request in our
        // log for this very place, that made no other machine. Assimilate
        // mode adopts what carries no witness at all, on a place of ours;
        // a witness our log does not know is someone else's claim, and a
        // machine on no place of ours is a stranger, whatever the mode.
        let witnessed = ours.contains(&id);
        let unclaimed = d.unit.is_some() && d.witness.is_none();
        if witnessed || (assimilate && unclaimed) {
            c.adopt.push(Adoption {
                device: id,
                reservation: d.unit,
                witnessed,
            });
        } else if d.unit.is_none() {
            c.strangers.push(id);
        } else {
            c.unknown.push(id);
        }
    }
    let mut missing: Vec<String> = before
        .managed
        .intersection(&after.managed)
        .filter(|m| !present.contains(*m))
        .cloned()
        .collect();
    missing.sort();
    c.missing = missing;
    c
}

/// The pools an unknown device stands on a place of, when every unknown
/// device stands on one: the discrepancy concerns those pools alone, which
/// are held (no creation, no deletion) while the others go on. `None` when
/// any stands on no pool's place (Metal's reservations): then no pass can
/// tell what it concerns, and it does no work.
pub fn pools_of_unknown(
    unknown: &[String],
    devices: &[Machine],
    place: PlaceOf<'_>,
) -> Option<std::collections::BTreeSet<String>> {
    unknown
        .iter()
        .map(|id| {
            let d = devices.iter().find(|d| d.id == *id)?;
            place(d.unit?).map(|(pool, _)| pool)
        })
        .collect()
}

/// Why a reservation is not taken.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Skip {
    InUse,
    NotProvisionable,
    Penalised,
    InFlight,
    /// A candidate beyond what the limit leaves room for.
    BeyondLimit,
    /// A candidate beyond what one pass takes (the chunk size).
    BeyondChunk,
    /// A candidate beyond the stock the provider counts for its scope: the
    /// create would be refused.
    BeyondStock,
    /// A free place of a pool that has its count already (a machine kept
    /// beyond its places, or one made and not listed yet).
    PoolWhole,
}

/// What a pass takes from a listing of reservations.
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    pub counts: ReservationCounts,
    /// In listing order, at most `room` and `chunk_size` of them.
    pub chosen: Vec<Uuid>,
    pub skipped: Vec<(Uuid, Skip)>,
}

/// Classifies the reservations against the fleet and takes the candidates
/// the room (`None`: no limit), the chunk size and the stock the provider
/// counts allow.
pub fn select(
    inventory: &Inventory,
    fleet: &Fleet,
    room: Option<u64>,
    chunk_size: u64,
    lacking: &HashMap<String, u32>,
) -> Selection {
    let mut lacking = lacking.clone();
    let reservations = &inventory.units;
    let take = room.unwrap_or(u64::MAX).min(chunk_size);
    // What each scope's stock still allows this pass, where it is counted.
    let mut stock: HashMap<&str, u32> = inventory
        .pools
        .iter()
        .filter_map(|p| Some((p.scope.as_str(), p.stock?.count?)))
        .collect();
    // Creations in flight will take their stock when they land.
    for r in reservations
        .iter()
        .filter(|r| fleet.pending.contains(&r.id))
    {
        if let Some(left) = r.scope.as_deref().and_then(|s| stock.get_mut(s)) {
            *left = left.saturating_sub(1);
        }
    }
    let mut counts = ReservationCounts {
        total: reservations.len() as u64,
        available: 0,
        in_use: 0,
        not_provisionable: 0,
        penalised: 0,
        in_flight: 0,
    };
    let mut chosen = Vec::new();
    let mut skipped = Vec::new();
    for r in reservations {
        // A unit our own records put a machine on is in use whatever the
        // listing says: a listing that lags behind a create shows it free,
        // and choosing it spent the pool's lacking count on a unit the
        // admission then refused, while the place really empty waited (the
        // Latitude demo ended a machine short, its last pass idle).
        let skip = if r.taken || fleet.held_units.contains(&r.id) {
            counts.in_use += 1;
            Skip::InUse
        } else if !r.provisionable {
            counts.not_provisionable += 1;
            Skip::NotProvisionable
        } else if fleet.pending.contains(&r.id) {
            counts.in_flight += 1;
            Skip::InFlight
        } else if fleet.penalised.contains(&r.id)
            || r.scope
                .as_ref()
                .is_some_and(|s| fleet.penalised_scopes.contains(s))
        {
            counts.penalised += 1;
            Skip::Penalised
        } else {
            counts.available += 1;
            let left = r.scope.as_deref().and_then(|s| stock.get_mut(s));
            let pool_left = r.pool.as_deref().and_then(|p| lacking.get_mut(p));
            if pool_left.as_deref() == Some(&0) {
                Skip::PoolWhole
            } else if left.as_deref() == Some(&0) {
                Skip::BeyondStock
            } else if (chosen.len() as u64) < take {
                if let Some(left) = left {
                    *left -= 1;
                }
                if let Some(left) = pool_left {
                    *left -= 1;
                }
                chosen.push(r.id);
                continue;
            } else if room.is_some_and(|room| room < chunk_size) {
                Skip::BeyondLimit
            } else {
                Skip::BeyondChunk
            }
        };
        skipped.push((r.id, skip));
    }
    Selection {
        counts,
        chosen,
        skipped,
    }
}

/// Where a machine stands: its pool and place, per the provider.
pub type PlaceOf<'a> = &'a dyn Fn(Uuid) -> Option<(String, u32)>;

/// How many machines each pool lacks: its count, less the machines of
/// ours on any of its places (as listed, and those our records hold that a
/// lagging listing may not show yet) and its creations in flight. A pass
/// takes no more of a pool's free places than that, so a pool whose
/// kept machines stand beyond its places is not filled past its count.
pub fn lacking(
    pools: &[crate::provider::pool::Declared],
    devices: &[Machine],
    fleet: &Fleet,
    place: PlaceOf<'_>,
) -> HashMap<String, u32> {
    let mut held: HashMap<String, u32> = HashMap::new();
    let mut counted: HashSet<Uuid> = HashSet::new();
    for d in devices.iter().filter(|d| !fleet.deleted.contains(&d.id)) {
        let Some(unit) = d.unit else { continue };
        if let Some((pool, _)) = place(unit) {
            *held.entry(pool).or_default() += 1;
            counted.insert(unit);
        }
    }
    for unit in fleet.held_units.iter().chain(fleet.pending.iter()) {
        if counted.insert(*unit)
            && let Some((pool, _)) = place(*unit)
        {
            *held.entry(pool).or_default() += 1;
        }
    }
    pools
        .iter()
        .filter(|p| !p.removed)
        .map(|p| {
            let have = held.get(&p.pool.name).copied().unwrap_or(0);
            (p.pool.name.clone(), p.pool.count.saturating_sub(have))
        })
        .collect()
}

/// Each pool's managed machines, as the lifecycle weighs them: a machine
/// is managed only once our log recorded it (created by us, its witness
/// proven for its place, or adopted by a recorded decision), and every
/// managed machine on a pool's place is a member, with or without a
/// witness, so a lowered or removed pool sheds it through the same guards
/// instead of billing it forever.
pub fn targets(
    pools: &[crate::provider::pool::Declared],
    devices: &[Machine],
    fleet: &Fleet,
    ours: &HashSet<String>,
    place: PlaceOf<'_>,
    scope: &dyn Fn(Uuid) -> Option<String>,
) -> Vec<super::converge::Target> {
    use super::converge::{Member, Target};
    let mut out: Vec<Target> = pools
        .iter()
        .map(|p| Target {
            pool: p.pool.name.clone(),
            count: if p.removed { 0 } else { p.pool.count },
            removed: p.removed,
            scope: None,
            members: vec![],
        })
        .collect();
    for d in devices {
        let Some(unit) = d.unit else {
            continue;
        };
        let Some(&(machine_id, protected)) = fleet.machines.get(&d.id) else {
            continue;
        };
        let Some((pool, index)) = place(unit) else {
            continue;
        };
        let Some(t) = out.iter_mut().find(|t| t.pool == pool) else {
            continue;
        };
        t.scope = t.scope.take().or_else(|| scope(unit));
        t.members.push(Member {
            device: d.id.clone(),
            machine_id,
            unit,
            index,
            health: d.condition,
            ready_once: fleet.ready_once.contains(&d.id) || d.ready(),
            made_at: fleet.made_at.get(&d.id).copied(),
            created_at: d.created_at,
            protected,
            leaving: fleet.leaving.contains(&machine_id),
            adopted: !ours.contains(&d.id),
            billing: d.billing,
        });
    }
    out.retain(|t| !t.members.is_empty() || !t.removed);
    out
}

/// Pools holding more machines of ours than declared, as listed: beyond
/// the count, or two on one place. Reported by every pass that sees it.
pub fn surplus(
    pools: &[crate::provider::pool::Declared],
    devices: &[Machine],
    fleet: &Fleet,
    ours: &HashSet<String>,
    place: PlaceOf<'_>,
) -> Vec<crate::events::event::SurplusReport> {
    let mut by_pool: HashMap<String, Vec<(u32, &Machine)>> = HashMap::new();
    for d in devices.iter().filter(|d| !fleet.deleted.contains(&d.id)) {
        let Some(unit) = d.unit else { continue };
        let mine = fleet.managed.contains(&d.id)
            || fleet.unassimilated.contains(&d.id)
            || ours.contains(&d.id);
        if !mine {
            continue;
        }
        if let Some((pool, index)) = place(unit) {
            by_pool.entry(pool).or_default().push((index, d));
        }
    }
    let mut out = vec![];
    for p in pools {
        let Some(members) = by_pool.get_mut(&p.pool.name) else {
            continue;
        };
        let count = if p.removed { 0 } else { p.pool.count };
        members.sort_by_key(|(index, d)| (*index, d.created_at, d.id.clone()));
        let mut doubled = vec![];
        for w in members.windows(2) {
            if w[0].0 == w[1].0 {
                let label = format!("{}/{}", p.pool.name, w[0].0);
                if !doubled.contains(&label) {
                    doubled.push(label);
                }
            }
        }
        if members.len() as u32 > count || !doubled.is_empty() {
            // The extra ones: beyond the count's places first, then the
            // later of two on one place.
            let mut seen = HashSet::new();
            let extra = members
                .iter()
                .filter(|(index, _)| *index >= count || !seen.insert(*index))
                .map(|(_, d)| d.id.clone())
                .collect();
            out.push(crate::events::event::SurplusReport {
                pool: p.pool.name.clone(),
                count,
                machines: members.len() as u32,
                doubled,
                extra,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests;
