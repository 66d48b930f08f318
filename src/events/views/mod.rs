//! The views built from the log: managed machines, the sinbin, and what is
//! in flight (pending creations, devices not yet assimilated).
//!
//! One pure [`apply`] folds an event into a [`ViewState`]. The live path
//! loads the rows an event touches, applies it, and writes back what
//! changed, in the appending transaction. The rebuild folds the whole log
//! into an empty state. Both use the same function, so they cannot drift.

use std::collections::BTreeMap;

use chrono::{DateTime, SubsecRound, Utc};
use uuid::Uuid;

use super::event::Event;
pub use crate::config::PenaltyPolicy;

/// Metal's name in the views (events written before 2026-12-04 say
/// `equinix`, and read as `metal`).
pub const PROVIDER_METAL: &str = "metal";

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ManagedMachine {
    pub machine_id: Uuid,
    pub provider: String,
    pub provider_id: String,
    pub reservation_id: Option<Uuid>,
    pub hostname: Option<String>,
    pub assimilated_at: DateTime<Utc>,
    /// Scale-in protection: never deleted by shepherd while set.
    #[serde(default)]
    pub protected: bool,
    /// When a pass first saw it ready (`machine_ready`): a machine ready
    /// once is never replaced as "not ready".
    #[serde(default)]
    pub ready_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Penalty {
    pub reservation_id: Uuid,
    pub until: DateTime<Utc>,
    pub cause: String,
    pub failures: i32,
    /// The stock the penalty covers beside its own unit (`Unit::scope`).
    #[serde(default)]
    pub scope: Option<String>,
}

impl Penalty {
    /// The seed's sinbin: penalised while now <= until.
    pub fn is_active(&self, now: DateTime<Utc>) -> bool {
        now <= self.until
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PendingCreation {
    pub reservation_id: Uuid,
    /// The request that owns it (the witness is derived from it).
    pub request: Option<String>,
    pub enqueued_at: DateTime<Utc>,
    /// Since when its outcome is unknown, if it is.
    pub unresolved_since: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    /// The unit's place, where the provider has places (`web/3`).
    #[serde(default)]
    pub place: Option<String>,
}

/// A machine leaving: its deletion requested and not ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PendingDeletion {
    pub machine_id: Uuid,
    pub provider_id: String,
    pub reservation_id: Option<Uuid>,
    pub pool: Option<String>,
    pub request: String,
    pub cause: String,
    pub message: String,
    pub requested_by: String,
    pub requested_at: DateTime<Utc>,
    /// From when the delete may be sent (the leave hook answered, or had
    /// nothing to wait for).
    pub cleared_at: Option<DateTime<Utc>>,
    /// When the machine was first asked to leave (`leave_asked`): the
    /// leave's deadline counts from here.
    #[serde(default)]
    pub asked_at: Option<DateTime<Utc>>,
    pub unresolved_since: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
}

/// One cluster setting as the view holds it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Setting {
    pub value: serde_json::Value,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UnassimilatedDevice {
    pub device_id: String,
    pub reservation_id: Option<Uuid>,
    pub hostname: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A pool of the cluster's desired state, as the view holds it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolRow {
    pub name: String,
    pub plan: String,
    pub site: String,
    pub count: u32,
    pub operating_system: String,
    pub ssh_keys: Vec<String>,
    /// The most places it ever had: machines may stand on them while it
    /// drains.
    pub places_ever: u32,
    /// Removed: its count is 0 and it drains.
    pub removed: bool,
    pub updated_at: DateTime<Utc>,
    pub updated_by: String,
    pub reason: String,
}

impl PoolRow {
    /// The pool as a provider takes it.
    pub fn pool(&self) -> crate::provider::Pool {
        crate::provider::Pool {
            name: self.name.clone(),
            plan: self.plan.clone(),
            site: self.site.clone(),
            count: self.count,
            operating_system: self.operating_system.clone(),
            ssh_keys: self.ssh_keys.clone(),
        }
    }
}

/// Creations are paused, by whom and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Pause {
    pub by: String,
    pub reason: String,
    pub since: DateTime<Utc>,
}

/// All the views, or the part of them one event touches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ViewState {
    /// `Some` while creations are paused.
    pub paused: Option<Pause>,
    /// `Some` while deletions are paused.
    pub deletions_paused: Option<Pause>,
    /// Machines leaving, by machine id.
    pub pending_deletions: BTreeMap<Uuid, PendingDeletion>,
    /// By provider id (unique per provider; shepherd has one provider).
    pub machines: BTreeMap<String, ManagedMachine>,
    pub sinbin: BTreeMap<Uuid, Penalty>,
    pub pending_creations: BTreeMap<Uuid, PendingCreation>,
    pub unassimilated: BTreeMap<String, UnassimilatedDevice>,
    pub settings: BTreeMap<String, Setting>,
    pub pools: BTreeMap<String, PoolRow>,
}

/// Folds one event into the views. `at` is the event's recorded time, so
/// replaying the log gives the same timestamps the live path wrote.
pub fn apply(state: &mut ViewState, event: &Event, at: DateTime<Utc>) {
    match event {
        Event::CreationRequested(e) => {
            state.pending_creations.insert(
                e.reservation,
                PendingCreation {
                    reservation_id: e.reservation,
                    request: Some(e.request.to_string()),
                    enqueued_at: at,
                    unresolved_since: None,
                    last_error: None,
                    place: e.place.clone(),
                },
            );
        }
        Event::DeviceCreated(e) => {
            close_pending(state, e.reservation, e.request);
            // Success resets the growing penalty.
            state.sinbin.remove(&e.reservation);
            if !state.machines.contains_key(&e.device) {
                state.unassimilated.insert(
                    e.device.clone(),
                    UnassimilatedDevice {
                        device_id: e.device.clone(),
                        reservation_id: Some(e.reservation),
                        hostname: Some(e.hostname.clone()),
                        created_at: at,
                    },
                );
            }
        }
        Event::CreationUnresolved(e) => {
            if let Some(p) = state.pending_creations.get_mut(&e.reservation)
                && p.request.as_deref() == Some(e.request.to_string().as_str())
            {
                p.unresolved_since.get_or_insert(at);
                p.last_error = Some(e.message.clone());
            }
        }
        Event::CreationSettled(e) => {
            if let Some(p) = state.pending_creations.get_mut(&e.reservation)
                && p.request.as_deref() == Some(e.request.to_string().as_str())
            {
                p.unresolved_since = None;
                p.last_error = None;
            }
        }
        Event::MachineReleased(e) => {
            state.machines.remove(&e.provider_id);
            state
                .pending_deletions
                .retain(|_, d| d.provider_id != e.provider_id);
        }
        Event::MachineLost(e) => {
            state.machines.remove(&e.provider_id);
            state.pending_deletions.remove(&e.machine_id);
        }
        Event::DeletionRequested(e) => {
            // The first request stands: a pass that read the fleet before
            // an operator's deprovision committed must not take it over
            // (its own job then finds no deletion of its request, and
            // skips).
            state
                .pending_deletions
                .entry(e.machine_id)
                .or_insert(PendingDeletion {
                    machine_id: e.machine_id,
                    provider_id: e.provider_id.clone(),
                    reservation_id: e.reservation,
                    pool: e.pool.clone(),
                    request: e.request.to_string(),
                    cause: e.cause.clone(),
                    message: e.message.clone(),
                    requested_by: e.by.clone(),
                    requested_at: at,
                    cleared_at: None,
                    asked_at: None,
                    unresolved_since: None,
                    last_error: None,
                });
        }
        Event::LeaveAsked(e) => {
            if let Some(d) = deletion_of(state, e.machine_id, e.request) {
                d.asked_at.get_or_insert(at);
            }
        }
        Event::LeaveAcknowledged(e) => {
            if let Some(d) = deletion_of(state, e.machine_id, e.request) {
                d.cleared_at.get_or_insert(at);
            }
        }
        Event::LeaveTimedOut(e) => {
            if e.action == "give_up" {
                if deletion_of(state, e.machine_id, e.request).is_some() {
                    state.pending_deletions.remove(&e.machine_id);
                }
            } else if let Some(d) = deletion_of(state, e.machine_id, e.request) {
                d.cleared_at.get_or_insert(at);
            }
        }
        Event::DeletionUnresolved(e) => {
            if let Some(d) = deletion_of(state, e.machine_id, e.request) {
                d.unresolved_since.get_or_insert(at);
                d.last_error = Some(e.message.clone());
            }
        }
        Event::MachineDeleted(e) => {
            state.machines.remove(&e.provider_id);
            state.pending_deletions.remove(&e.machine_id);
        }
        Event::DeletionFailed(e) => {
            if deletion_of(state, e.machine_id, e.request).is_some() {
                state.pending_deletions.remove(&e.machine_id);
            }
        }
        Event::DeletionCancelled(e) => {
            if deletion_of(state, e.machine_id, e.request).is_some() {
                state.pending_deletions.remove(&e.machine_id);
            }
        }
        Event::MachineProtected(e) => {
            if let Some(m) = state.machines.get_mut(&e.provider_id) {
                m.protected = true;
            }
        }
        Event::MachineUnprotected(e) => {
            if let Some(m) = state.machines.get_mut(&e.provider_id) {
                m.protected = false;
            }
        }
        Event::MachineReady(e) => {
            if let Some(m) = state.machines.get_mut(&e.provider_id)
                && m.machine_id == e.machine_id
            {
                m.ready_at = m.ready_at.or(Some(at));
            }
        }
        Event::DeletionsPaused(e) => {
            state.deletions_paused = Some(Pause {
                by: e.by.clone(),
                reason: e.reason.clone(),
                since: at,
            });
        }
        Event::DeletionsResumed(_) => state.deletions_paused = None,
        Event::SettingsChanged(e) => {
            for (key, value) in &e.settings {
                state.settings.insert(
                    key.clone(),
                    Setting {
                        value: value.clone(),
                        updated_at: at,
                    },
                );
            }
        }
        Event::PoolDeclared(e) => set_pool(
            state,
            &e.name,
            crate::provider::Pool {
                name: e.name.clone(),
                plan: e.plan.clone(),
                site: e.site.clone(),
                count: e.count,
                operating_system: e.operating_system.clone(),
                ssh_keys: e.ssh_keys.clone(),
            },
            (&e.by, &e.reason),
            at,
        ),
        Event::PoolChanged(e) => set_pool(
            state,
            &e.name,
            crate::provider::Pool {
                name: e.name.clone(),
                plan: e.plan.clone(),
                site: e.site.clone(),
                count: e.count,
                operating_system: e.operating_system.clone(),
                ssh_keys: e.ssh_keys.clone(),
            },
            (&e.by, &e.reason),
            at,
        ),
        Event::PoolRemoved(e) => {
            if let Some(p) = state.pools.get_mut(&e.name) {
                p.removed = true;
                p.count = 0;
                p.updated_at = at;
                p.updated_by = e.by.clone();
                p.reason = e.reason.clone();
            }
        }
        Event::CreationGivenUp(e) => close_pending(state, e.reservation, e.request),
        Event::JobCancelled(e) => {
            if let (Some(reservation), Some(request)) = (e.reservation, e.request) {
                close_pending(state, reservation, Some(request));
            }
        }
        Event::RaceLost(e) => close_pending(state, e.reservation, e.request),
        Event::ReservationPenalised(e) => {
            // The table keeps microseconds; the view must equal it.
            let until = e.until.trunc_subsecs(6);
            let penalty = state
                .sinbin
                .entry(e.reservation)
                .or_insert_with(|| Penalty {
                    reservation_id: e.reservation,
                    until,
                    cause: e.cause.clone(),
                    failures: 0,
                    scope: None,
                });
            // The seed's sinbin keeps the later deadline.
            penalty.until = penalty.until.max(until);
            penalty.cause = e.cause.clone();
            // Like the cause, the scope is the latest penalty's.
            penalty.scope = e.scope.clone();
            penalty.failures += 1;
        }
        Event::PenaltyCleared(e) => {
            state.sinbin.remove(&e.reservation);
        }
        Event::MachineAssimilated(e) => {
            state.unassimilated.remove(&e.provider_id);
            if let Some(r) = e.reservation {
                state.pending_creations.remove(&r);
            }
            state
                .machines
                .entry(e.provider_id.clone())
                .or_insert_with(|| ManagedMachine {
                    machine_id: e.machine_id,
                    provider: e.provider.clone(),
                    provider_id: e.provider_id.clone(),
                    reservation_id: e.reservation,
                    hostname: e.hostname.clone(),
                    assimilated_at: at,
                    protected: false,
                    ready_at: None,
                });
        }
        Event::AdoptionRequested(e) => {
            if !state.machines.contains_key(&e.device) {
                state
                    .unassimilated
                    .entry(e.device.clone())
                    .or_insert(UnassimilatedDevice {
                        device_id: e.device.clone(),
                        reservation_id: e.reservation,
                        hostname: None,
                        created_at: at,
                    });
            }
        }
        Event::AssimilationSkipped(e) => {
            state.unassimilated.remove(&e.device);
        }
        Event::AssimilationRejected(e) => {
            state.unassimilated.remove(&e.device);
        }
        Event::CreationsPaused(e) => {
            state.paused = Some(Pause {
                by: e.by.clone(),
                reason: e.reason.clone(),
                since: at,
            });
        }
        Event::CreationsResumed(_) => state.paused = None,
        Event::ReconcileStarted(_)
        | Event::ReservationsListed(_)
        | Event::PoolsSurveyed(_)
        | Event::DiscrepancyFound(_)
        | Event::ReconcileRefused(_)
        | Event::CreationsEnqueued(_)
        | Event::ReconcileFinished(_)
        | Event::ReconcileCoalesced(_)
        | Event::DatabaseMoved(_)
        | Event::CreationResumed(_)
        | Event::AssimilationResumed(_)
        | Event::CreationAttemptFailed(_)
        | Event::CreationRefused(_)
        | Event::LimitExceeded(_)
        | Event::MachineNotFound(_)
        | Event::SurplusFound(_)
        | Event::DeletionsHeld(_)
        | Event::SshKeyEnsured(_)
        | Event::AssimilationRequested(_)
        | Event::ViewsReplaced(_)
        | Event::JobRetried(_)
        | Event::Unknown { .. } => {}
    }
}

/// The machine's pending deletion, if `request` owns it: a stale run of an
/// ended deletion cannot end a newer one.
fn deletion_of(
    state: &mut ViewState,
    machine: Uuid,
    request: Uuid,
) -> Option<&mut PendingDeletion> {
    state
        .pending_deletions
        .get_mut(&machine)
        .filter(|d| d.request == request.to_string())
}

/// A pool declared or changed: its places ever grow with its count.
fn set_pool(
    state: &mut ViewState,
    name: &str,
    pool: crate::provider::Pool,
    (by, reason): (&str, &str),
    at: DateTime<Utc>,
) {
    let places_ever = state
        .pools
        .get(name)
        .map_or(pool.count, |p| p.places_ever.max(pool.count));
    state.pools.insert(
        name.to_string(),
        PoolRow {
            name: name.to_string(),
            plan: pool.plan,
            site: pool.site,
            count: pool.count,
            operating_system: pool.operating_system,
            ssh_keys: pool.ssh_keys,
            places_ever,
            removed: false,
            updated_at: at,
            updated_by: by.to_string(),
            reason: reason.to_string(),
        },
    );
}

/// Ends a reservation's pending creation, but only the one `request` owns:
/// a stale run of an ended request must not close a newer request's
/// creation. Events written before requests were recorded close any.
fn close_pending(state: &mut ViewState, reservation: Uuid, request: Option<Uuid>) {
    let owned = match (state.pending_creations.get(&reservation), request) {
        (Some(p), Some(r)) => p.request.as_deref() == Some(r.to_string().as_str()),
        (Some(_), None) => true,
        (None, _) => false,
    };
    if owned {
        state.pending_creations.remove(&reservation);
    }
}

/// The rows a batch of events can touch.
#[derive(Debug, Clone, Default)]
pub(crate) struct Keys {
    reservations: Vec<Uuid>,
    devices: Vec<String>,
    pools: Vec<String>,
    controls: bool,
    settings: bool,
}

impl Keys {
    pub(crate) fn of<'a>(events: impl Iterator<Item = &'a Event>) -> Keys {
        let mut k = Keys::default();
        for event in events {
            match event {
                Event::CreationRequested(e) => k.reservations.push(e.reservation),
                Event::DeviceCreated(e) => {
                    k.reservations.push(e.reservation);
                    k.devices.push(e.device.clone());
                }
                Event::CreationGivenUp(e) => k.reservations.push(e.reservation),
                Event::JobCancelled(e) => k.reservations.extend(e.reservation),
                Event::CreationUnresolved(e) => k.reservations.push(e.reservation),
                Event::CreationSettled(e) => k.reservations.push(e.reservation),
                Event::MachineReleased(e) => k.devices.push(e.provider_id.clone()),
                Event::MachineLost(e) => k.devices.push(e.provider_id.clone()),
                Event::DeletionRequested(e) => k.devices.push(e.provider_id.clone()),
                Event::LeaveAcknowledged(e) => k.devices.push(e.provider_id.clone()),
                Event::LeaveTimedOut(e) => k.devices.push(e.provider_id.clone()),
                Event::LeaveAsked(e) => k.devices.push(e.provider_id.clone()),
                Event::DeletionUnresolved(e) => k.devices.push(e.provider_id.clone()),
                Event::MachineDeleted(e) => k.devices.push(e.provider_id.clone()),
                Event::DeletionFailed(e) => k.devices.push(e.provider_id.clone()),
                Event::DeletionCancelled(e) => k.devices.push(e.provider_id.clone()),
                Event::MachineProtected(e) => k.devices.push(e.provider_id.clone()),
                Event::MachineUnprotected(e) => k.devices.push(e.provider_id.clone()),
                Event::MachineReady(e) => k.devices.push(e.provider_id.clone()),
                Event::SettingsChanged(_) => k.settings = true,
                Event::PoolDeclared(e) => k.pools.push(e.name.clone()),
                Event::PoolChanged(e) => k.pools.push(e.name.clone()),
                Event::PoolRemoved(e) => k.pools.push(e.name.clone()),
                Event::RaceLost(e) => k.reservations.push(e.reservation),
                Event::ReservationPenalised(e) => k.reservations.push(e.reservation),
                Event::PenaltyCleared(e) => k.reservations.push(e.reservation),
                Event::MachineAssimilated(e) => {
                    k.reservations.extend(e.reservation);
                    k.devices.push(e.provider_id.clone());
                }
                Event::AdoptionRequested(e) => k.devices.push(e.device.clone()),
                Event::AssimilationSkipped(e) => k.devices.push(e.device.clone()),
                Event::AssimilationRejected(e) => k.devices.push(e.device.clone()),
                Event::CreationsPaused(_)
                | Event::CreationsResumed(_)
                | Event::DeletionsPaused(_)
                | Event::DeletionsResumed(_) => k.controls = true,
                _ => {}
            }
        }
        k.reservations.sort();
        k.reservations.dedup();
        k.devices.sort();
        k.devices.dedup();
        k.pools.sort();
        k.pools.dedup();
        k
    }

    pub(crate) fn reservations(&self) -> &[Uuid] {
        &self.reservations
    }

    pub(crate) fn devices(&self) -> &[String] {
        &self.devices
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.reservations.is_empty()
            && self.devices.is_empty()
            && self.pools.is_empty()
            && !self.controls
            && !self.settings
    }

    /// The advisory locks that serialise writers per reservation and device
    /// (and pool, and the operator's controls and settings). The append
    /// takes them in sorted order (`shepherd.append_reading`), so two
    /// writers cannot deadlock; transaction-scoped, released at commit.
    pub(crate) fn lock_names(&self) -> Vec<String> {
        self.reservations
            .iter()
            .map(|r| format!("reservation/{r}"))
            .chain(self.devices.iter().map(|d| format!("device/{d}")))
            .chain(self.pools.iter().map(|p| format!("pool/{p}")))
            .chain(self.controls.then(|| "operator/controls".to_string()))
            .chain(self.settings.then(|| "operator/settings".to_string()))
            .collect()
    }
}

mod live;
mod rebuild;
mod tables;

pub(crate) use live::{apply_loaded, rows_read};
pub use rebuild::{RebuildReport, differences, fold_log, rebuild, rebuild_by};
pub use tables::{is_penalised, penalty, read_deletions_pause, read_live, read_pause, read_pools};

#[cfg(test)]
mod tests {
    use crate::events::event::{CreationGivenUp, CreationRequested};

    #[test]
    fn a_stale_request_cannot_close_a_newer_requests_creation() {
        let (r, a, b) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let at = Utc::now();
        let mut state = ViewState::default();
        let requested = |request| {
            Event::CreationRequested(CreationRequested {
                reservation: r,
                request,
                manual: true,
                requested_by: None,
                sinbin_override: None,
                place: None,
            })
        };
        let given_up = |request| {
            Event::CreationGivenUp(CreationGivenUp {
                reservation: r,
                class: crate::provider::ErrorClass::Permanent,
                message: "m".into(),
                request,
            })
        };
        apply(&mut state, &requested(b), at);
        apply(&mut state, &given_up(Some(a)), at);
        assert!(
            state.pending_creations.contains_key(&r),
            "A closed B's creation"
        );
        apply(&mut state, &given_up(Some(b)), at);
        assert!(!state.pending_creations.contains_key(&r));
        // Events from before requests were recorded close whatever is pending.
        apply(&mut state, &requested(b), at);
        apply(&mut state, &given_up(None), at);
        assert!(!state.pending_creations.contains_key(&r));
    }

    use super::*;
    use std::time::Duration;

    #[test]
    fn the_default_penalty_is_the_seeds_hour() {
        let p = PenaltyPolicy::default();
        assert_eq!(p.duration(0), Duration::from_secs(3600));
        assert_eq!(p.duration(5), Duration::from_secs(3600));
    }

    #[test]
    fn a_growing_penalty_grows_and_stops_at_its_maximum() {
        let p = PenaltyPolicy {
            initial: Duration::from_secs(60),
            factor: 2.0,
            max: Duration::from_secs(600),
        };
        assert_eq!(p.duration(0), Duration::from_secs(60));
        assert_eq!(p.duration(1), Duration::from_secs(120));
        assert_eq!(p.duration(3), Duration::from_secs(480));
        assert_eq!(p.duration(4), Duration::from_secs(600));
        assert_eq!(p.duration(40), Duration::from_secs(600));
    }
}
