//! Every outcome shepherd records, as one enum.
//!
//! A row stores the type name, a schema version and a JSON body. Writing
//! always uses the current version; reading accepts every version ever
//! written (older bodies are upcast here) and keeps a type this build does
//! not know as [`Event::Unknown`], so a newer writer never breaks an older
//! reader or a rebuild.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::provider::ErrorClass;

/// Where an event belongs: the thing it is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stream {
    Reservation(Uuid),
    /// A machine by its provider's id (a Metal device's UUID, a
    /// Latitude server's `sv_…`).
    Device(String),
    Reconcile(Uuid),
    SshKey(String),
    Operator,
    Settings,
    /// A pool of the cluster's desired state, by name.
    Pool(String),
    /// Operations on the views themselves.
    Views,
    /// An operator's retries and cancels of single jobs.
    Jobs,
    /// The database the log is in.
    Database,
}

impl Stream {
    pub fn name(&self) -> String {
        match self {
            Stream::Reservation(id) => format!("reservation/{id}"),
            Stream::Device(id) => format!("device/{id}"),
            Stream::Reconcile(id) => format!("reconcile/{id}"),
            Stream::SshKey(label) => format!("ssh_key/{label}"),
            Stream::Operator => "operator/controls".to_string(),
            Stream::Settings => "operator/settings".to_string(),
            Stream::Pool(name) => format!("pool/{name}"),
            Stream::Views => "operator/views".to_string(),
            Stream::Jobs => "operator/jobs".to_string(),
            Stream::Database => "cluster/database".to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReservationCounts {
    pub total: u64,
    pub available: u64,
    pub in_use: u64,
    pub not_provisionable: u64,
    pub penalised: u64,
    #[serde(default)]
    pub in_flight: u64,
}

/// One pool's surplus as a pass found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SurplusReport {
    pub pool: String,
    pub count: u32,
    /// Machines of ours on the pool's places, any of them.
    pub machines: u32,
    /// Places holding more than one machine (`web/3`).
    #[serde(default)]
    pub doubled: Vec<String>,
    /// The machines beyond the count, by the provider's id.
    #[serde(default)]
    pub extra: Vec<String>,
}

macro_rules! events {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal, $version:literal { $( $(#[$fdoc:meta])* $field:ident : $ty:ty),* $(,)? } )*) => {
        $(
            $(#[$doc])*
            #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
            pub struct $variant { $( $(#[$fdoc])* pub $field: $ty),* }

            impl From<$variant> for Event {
                fn from(e: $variant) -> Event { Event::$variant(e) }
            }
        )*

        #[derive(Debug, Clone, PartialEq)]
        pub enum Event {
            $( $variant($variant), )*
            /// A type (or a version) this build does not know; kept verbatim.
            Unknown { event_type: String, schema_version: i32, body: Value },
        }

        impl Event {
            pub fn type_name(&self) -> &str {
                match self {
                    $( Event::$variant(_) => $name, )*
                    Event::Unknown { event_type, .. } => event_type,
                }
            }

            pub fn schema_version(&self) -> i32 {
                match self {
                    $( Event::$variant(_) => $version, )*
                    Event::Unknown { schema_version, .. } => *schema_version,
                }
            }

            pub fn body(&self) -> Value {
                let encoded = match self {
                    $( Event::$variant(e) => serde_json::to_value(e), )*
                    Event::Unknown { body, .. } => Ok(body.clone()),
                };
                encoded.expect("event bodies are plain data")
            }

            /// Decodes a stored row; `Err` only for a body that does not fit
            /// the type and version it claims.
            pub fn decode(event_type: &str, schema_version: i32, body: Value) -> Result<Event, serde_json::Error> {
                let body = upcast(event_type, schema_version, body);
                match (event_type, schema_version) {
                    $( ($name, v) if v <= $version => Ok(Event::$variant(serde_json::from_value(body)?)), )*
                    _ => Ok(Event::Unknown { event_type: event_type.to_string(), schema_version, body }),
                }
            }

            pub const TYPE_NAMES: &'static [&'static str] = &[$($name),*];
        }
    };
}

events! {
    /// A reconcile pass began.
    ReconcileStarted = "reconcile_started", 1 {
        run: Uuid,
        max_machines: u64,
        chunk_size: u64,
        /// Who asked for the pass: `scheduler`, `cli:<user>`, `sql:<role>`
        /// (absent before 2026-12).
        #[serde(default)]
        requested_by: Option<String>,
    }
    /// What the pass listed, by class.
    ReservationsListed = "reservations_listed", 1 { run: Uuid, counts: ReservationCounts }
    /// How each pool stood as the pass saw it (a provider with pools), its
    /// stock where the pass read it.
    PoolsSurveyed = "pools_surveyed", 1 {
        run: Uuid,
        pools: Vec<crate::provider::PoolReport>,
        /// What the pass's listing asked for and cost (absent before
        /// 2026-12-05).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        listing: Option<crate::provider::ListingCost>,
    }
    /// Provider and shepherd disagree about which machines exist.
    DiscrepancyFound = "discrepancy_found", 1 {
        run: Uuid,
        /// Prefixed devices nobody manages and nothing witnessed.
        unknown_devices: Vec<String>,
        /// Managed machines whose device is gone from the provider.
        missing_devices: Vec<String>,
    }
    /// The pass did no work, and why.
    ReconcileRefused = "reconcile_refused", 1 { run: Uuid, reason: String }
    /// The pass enqueued creations for these reservations.
    CreationsEnqueued = "creations_enqueued", 1 { run: Uuid, reservations: Vec<Uuid> }
    /// The pass ended.
    ReconcileFinished = "reconcile_finished", 1 { run: Uuid, managed: u64, in_flight: u64, enqueued: u64, at_limit: bool }
    /// A creation was admitted for a reservation (by a pass or by hand):
    /// from here until it ends it counts as in flight.
    CreationRequested = "creation_requested", 1 {
        reservation: Uuid,
        /// Stable across the job's retries; the witness is derived from it.
        request: Uuid,
        manual: bool,
        /// `scheduler`, `cli:<user>` or `sql:<role>` (absent before 2026-12).
        #[serde(default)]
        requested_by: Option<String>,
        /// Set when an operator admitted a penalised reservation on purpose.
        #[serde(default)]
        sinbin_override: Option<String>,
        /// The unit's place, where the provider has places (`web/3`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        place: Option<String>,
    }
    /// An operator declared a pool (or declared again one removed before).
    PoolDeclared = "pool_declared", 1 {
        name: String,
        plan: String,
        site: String,
        count: u32,
        operating_system: String,
        ssh_keys: Vec<String>,
        by: String,
        reason: String,
    }
    /// An operator changed a pool; `confirmed` when it went to 0.
    PoolChanged = "pool_changed", 1 {
        name: String,
        plan: String,
        site: String,
        count: u32,
        operating_system: String,
        ssh_keys: Vec<String>,
        by: String,
        reason: String,
        #[serde(default)]
        confirmed: bool,
    }
    /// An operator removed a pool, confirming that its machines go.
    PoolRemoved = "pool_removed", 1 { name: String, by: String, reason: String, confirmed: bool }
    /// A manual creation was not admitted, and why.
    CreationRefused = "creation_refused", 1 { reservation: Uuid, request: Uuid, reason: String }
    /// One attempt to create a device failed; the job will try again.
    CreationAttemptFailed = "creation_attempt_failed", 1 { reservation: Uuid, class: ErrorClass, message: String, attempt: u32 }
    /// A device now exists for the reservation.
    DeviceCreated = "device_created", 1 {
        reservation: Uuid,
        device: String,
        hostname: String,
        witness: String,
        /// Found after an ambiguous answer or a crash rather than returned by the create.
        recovered: bool,
        /// The creation's request (absent before 2026-12): only its own
        /// pending row is closed.
        #[serde(default)]
        request: Option<Uuid>,
    }
    /// The creation's outcome is unknown (an answer that could not be read,
    /// a timeout after the request was sent): it stays in flight, and is
    /// settled by looking at the reservation for its witness.
    CreationUnresolved = "creation_unresolved", 1 {
        reservation: Uuid,
        request: Uuid,
        attempt: u32,
        message: String,
        /// Recorded by a run that had lost its unit's lease by the time
        /// its answer came (it stalled past the lease): what it saw is
        /// left for the unit's holder to settle by looking.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        lease_lost: bool,
        /// Recorded by a look that still could not tell, not after a create
        /// that may have gone out: it does not move the creation's settle
        /// window, which runs from the latest create nobody saw answered.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        looked: bool,
    }
    /// An unknown creation's settle window passed and a look found nothing
    /// of ours on the unit: the creation is known again, and may create.
    CreationSettled = "creation_settled", 1 { reservation: Uuid, request: Uuid, message: String }
    /// A creation in flight had no job left to end it (a crash, a killed or
    /// pruned job); the sweep gave it one.
    CreationResumed = "creation_resumed", 1 { reservation: Uuid, request: Uuid, reason: String }
    /// The creation job ended without a device.
    CreationGivenUp = "creation_given_up", 1 {
        reservation: Uuid,
        class: ErrorClass,
        message: String,
        /// The creation's request (absent before 2026-12).
        #[serde(default)]
        request: Option<Uuid>,
    }
    /// Another party took the reservation.
    RaceLost = "race_lost", 1 {
        reservation: Uuid,
        other_device: Option<String>,
        /// The creation's request (absent before 2026-12).
        #[serde(default)]
        request: Option<Uuid>,
    }
    /// The reservation is skipped until `until`. With a `scope` (the stock
    /// it draws on, after the provider had none), so is every unit that
    /// draws on the same stock.
    ReservationPenalised = "reservation_penalised", 2 {
        reservation: Uuid,
        until: DateTime<Utc>,
        cause: String,
        class: Option<ErrorClass>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<String>,
    }
    /// An operator lifted a penalty early.
    PenaltyCleared = "penalty_cleared", 1 { reservation: Uuid, by: String, reason: String }
    /// An operator stopped new creations cluster-wide.
    CreationsPaused = "creations_paused", 1 { by: String, reason: String }
    /// An operator let new creations start again.
    CreationsResumed = "creations_resumed", 1 { by: String, reason: String }
    /// A device became a managed machine.
    MachineAssimilated = "machine_assimilated", 1 {
        machine_id: Uuid,
        provider: String,
        provider_id: String,
        reservation: Option<Uuid>,
        hostname: Option<String>,
    }
    /// A pass found a prefixed device to adopt (a witnessed orphan, or any
    /// unknown one with `assimilate` on): in flight until assimilated.
    AdoptionRequested = "adoption_requested", 1 { run: Uuid, device: String, reservation: Option<Uuid>, witnessed: bool }
    /// A device waiting to be assimilated had no job left; the sweep gave it one.
    AssimilationResumed = "assimilation_resumed", 1 { device: String, reason: String }
    /// A managed machine missing from a pass's listing, for which the
    /// provider answered "not found" when asked by its id: a first sighting.
    MachineNotFound = "machine_not_found", 1 { run: Uuid, machine_id: Uuid, provider_id: String, message: String }
    /// The provider confirmed a managed machine gone ("not found", seen
    /// twice some time apart): it is no longer managed, and its unit is
    /// free to be filled again.
    MachineLost = "machine_lost", 1 {
        machine_id: Uuid,
        provider: String,
        provider_id: String,
        reservation: Option<Uuid>,
        evidence: String,
    }
    /// A machine is to be deleted, and why (`cause`: surplus, failed,
    /// not_ready, pool_removed, operator): from here it is leaving, until
    /// its deletion ends. Recorded before any call is made.
    DeletionRequested = "deletion_requested", 1 {
        machine_id: Uuid,
        provider_id: String,
        reservation: Option<Uuid>,
        pool: Option<String>,
        request: Uuid,
        cause: String,
        message: String,
        by: String,
    }
    /// The leave hook answered (or an operator acknowledged): the delete
    /// may be sent.
    LeaveAcknowledged = "leave_acknowledged", 1 { machine_id: Uuid, provider_id: String, request: Uuid, by: String }
    /// The leave hook did not answer by its deadline; `action` is the
    /// cluster's `leave_deadline`: `proceed` (the delete may be sent) or
    /// `give_up` (the deletion ends, the machine stays).
    /// The machine was first asked to leave (its hook called, or an
    /// acknowledgement awaited): the leave's deadline counts from here, not
    /// from the request, so time spent paused is no drain time lost.
    LeaveAsked = "leave_asked", 1 { machine_id: Uuid, provider_id: String, request: Uuid, by: String }
    LeaveTimedOut = "leave_timed_out", 1 { machine_id: Uuid, provider_id: String, request: Uuid, action: String }
    /// A delete's answer was not seen: the machine may be gone or not; a
    /// successor looks it up.
    DeletionUnresolved = "deletion_unresolved", 1 {
        machine_id: Uuid,
        provider_id: String,
        request: Uuid,
        message: String,
        /// As for a creation: the run's outcome came after its lease was
        /// lost, or after its deletion ended another way.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        lease_lost: bool,
    }
    /// The provider deleted the machine (or had already): it is no longer
    /// managed, and its unit is free.
    MachineDeleted = "machine_deleted", 1 {
        machine_id: Uuid,
        provider: String,
        provider_id: String,
        reservation: Option<Uuid>,
        request: Uuid,
        already_gone: bool,
    }
    /// The provider refused the delete, or the leave hook's deadline gave
    /// it up: the machine stays managed.
    DeletionFailed = "deletion_failed", 1 { machine_id: Uuid, provider_id: String, request: Uuid, message: String }
    /// What the deletion was for no longer holds (the pool grew back, the
    /// machine was protected, an operator cancelled it): it ends unsent.
    DeletionCancelled = "deletion_cancelled", 1 { machine_id: Uuid, provider_id: String, request: Uuid, reason: String, by: String }
    /// Scale-in protection: shepherd never deletes the machine while it
    /// holds.
    MachineProtected = "machine_protected", 1 { machine_id: Uuid, provider_id: String, by: String, reason: String }
    MachineUnprotected = "machine_unprotected", 1 { machine_id: Uuid, provider_id: String, by: String, reason: String }
    /// A pass saw a managed machine ready (running) for the first time:
    /// from then on it was ready once, and no status it shows later is
    /// taken for a deployment that never finished.
    MachineReady = "machine_ready", 1 { machine_id: Uuid, provider_id: String, status: Option<String> }
    /// An operator stopped deletions cluster-wide (creations go on).
    DeletionsPaused = "deletions_paused", 1 { by: String, reason: String }
    DeletionsResumed = "deletions_resumed", 1 { by: String, reason: String }
    /// A pass found more machines of ours than the desired state holds: in
    /// a pool beyond its count, or two on one place.
    SurplusFound = "surplus_found", 1 { run: Uuid, pools: Vec<SurplusReport> }
    /// A pass held deletions back, and which guard did (`paused`,
    /// `protected`, `budget`, `unhealthy`).
    DeletionsHeld = "deletions_held", 1 { run: Uuid, pool: String, held: u32, guard: String, message: String }
    /// An operator recorded that a managed machine is no longer managed
    /// (its device is gone), so passes stop reporting it missing.
    MachineReleased = "machine_released", 1 { machine_id: Uuid, provider: String, provider_id: String, by: String, reason: String }
    /// The cluster's settings changed (or were first recorded): new values by key.
    SettingsChanged = "settings_changed", 1 { by: String, reason: String, settings: std::collections::BTreeMap<String, Value> }
    /// The log is in another database than the last check found it in
    /// (`system/timeline/oid`): restored from a backup, recovered to a
    /// point in time, or failed over to a standby. What the log says may
    /// be older than what the provider holds; creations requested before
    /// it look before they send.
    DatabaseMoved = "database_moved", 1 { from: String, to: String }
    /// A queued pass found that a newer one had started since it was
    /// queued, and ended without listing anything.
    ReconcileCoalesced = "reconcile_coalesced", 1 { run: Uuid, newer_pass_started_at: DateTime<Utc> }
    /// Assimilation found the device already managed.
    AssimilationSkipped = "assimilation_skipped", 1 { device: String, machine_id: Uuid }
    /// A machine of ours was recorded although it takes managed plus in
    /// flight past the cluster's limit (it existed: hiding it would be
    /// worse). The figures are after it was recorded.
    LimitExceeded = "limit_exceeded", 1 { device: String, managed: u64, in_flight: u64, limit: u64 }
    /// Assimilation refused the device (unknown to the provider, or not ours).
    AssimilationRejected = "assimilation_rejected", 1 { device: String, reason: String }
    /// The managed SSH key exists with the configured public key.
    SshKeyEnsured = "ssh_key_ensured", 1 { label: String, key_id: String }
    /// An operator asked for a device to be assimilated (`cli:<user>` or
    /// `sql:<role>`); the outcome follows on the device's stream.
    AssimilationRequested = "assimilation_requested", 1 { device: String, requested_by: String }
    /// An operator replaced the live views with the ones rebuilt from the
    /// log (`shepherd views rebuild --replace`).
    ViewsReplaced = "views_replaced", 1 { by: String, differences: u64 }
    /// An operator ran a failed or killed job again.
    JobRetried = "job_retried", 1 { job: String, kind: String, by: String, reason: String }
    /// An operator cancelled a job that was waiting. A creation's cancel
    /// names it: its pending creation ends here.
    JobCancelled = "job_cancelled", 1 {
        job: String,
        kind: String,
        by: String,
        reason: String,
        reservation: Option<Uuid>,
        request: Option<Uuid>,
    }
}

/// Brings an older body to the current version's shape.
fn upcast(event_type: &str, version: i32, mut body: Value) -> Value {
    if let ("reservation_penalised", 1) = (event_type, version) {
        // v1 had no error class; it is unknown for those rows.
        if let Some(map) = body.as_object_mut() {
            map.entry("class").or_insert(Value::Null);
        }
    }
    // Metal was called `equinix` in the log until 2026-12-04: one name for
    // it everywhere now, the one `--provider` takes.
    let renamed = match event_type {
        "settings_changed" => body.pointer_mut("/settings/provider"),
        "machine_assimilated" | "machine_released" | "machine_lost" | "machine_deleted" => {
            body.get_mut("provider")
        }
        _ => None,
    };
    if let Some(provider) = renamed
        && provider == "equinix"
    {
        *provider = Value::from("metal");
    }
    body
}

impl Event {
    /// The stream an event belongs to.
    pub fn stream(&self) -> Stream {
        match self {
            Event::ReconcileStarted(e) => Stream::Reconcile(e.run),
            Event::ReservationsListed(e) => Stream::Reconcile(e.run),
            Event::PoolsSurveyed(e) => Stream::Reconcile(e.run),
            Event::DiscrepancyFound(e) => Stream::Reconcile(e.run),
            Event::ReconcileRefused(e) => Stream::Reconcile(e.run),
            Event::CreationsEnqueued(e) => Stream::Reconcile(e.run),
            Event::ReconcileFinished(e) => Stream::Reconcile(e.run),
            Event::ReconcileCoalesced(e) => Stream::Reconcile(e.run),
            Event::DatabaseMoved(_) => Stream::Database,
            Event::CreationUnresolved(e) => Stream::Reservation(e.reservation),
            Event::CreationResumed(e) => Stream::Reservation(e.reservation),
            Event::CreationSettled(e) => Stream::Reservation(e.reservation),
            Event::AssimilationResumed(e) => Stream::Device(e.device.clone()),
            Event::MachineReleased(e) => Stream::Device(e.provider_id.clone()),
            Event::MachineNotFound(e) => Stream::Device(e.provider_id.clone()),
            Event::MachineLost(e) => Stream::Device(e.provider_id.clone()),
            Event::DeletionRequested(e) => Stream::Device(e.provider_id.clone()),
            Event::LeaveAcknowledged(e) => Stream::Device(e.provider_id.clone()),
            Event::LeaveTimedOut(e) => Stream::Device(e.provider_id.clone()),
            Event::DeletionUnresolved(e) => Stream::Device(e.provider_id.clone()),
            Event::MachineDeleted(e) => Stream::Device(e.provider_id.clone()),
            Event::DeletionFailed(e) => Stream::Device(e.provider_id.clone()),
            Event::DeletionCancelled(e) => Stream::Device(e.provider_id.clone()),
            Event::MachineProtected(e) => Stream::Device(e.provider_id.clone()),
            Event::MachineUnprotected(e) => Stream::Device(e.provider_id.clone()),
            Event::MachineReady(e) => Stream::Device(e.provider_id.clone()),
            Event::LeaveAsked(e) => Stream::Device(e.provider_id.clone()),
            Event::SurplusFound(e) => Stream::Reconcile(e.run),
            Event::DeletionsHeld(e) => Stream::Reconcile(e.run),
            Event::SettingsChanged(_) => Stream::Settings,
            Event::PoolDeclared(e) => Stream::Pool(e.name.clone()),
            Event::PoolChanged(e) => Stream::Pool(e.name.clone()),
            Event::PoolRemoved(e) => Stream::Pool(e.name.clone()),
            Event::CreationRequested(e) => Stream::Reservation(e.reservation),
            Event::CreationRefused(e) => Stream::Reservation(e.reservation),
            Event::CreationAttemptFailed(e) => Stream::Reservation(e.reservation),
            Event::DeviceCreated(e) => Stream::Reservation(e.reservation),
            Event::CreationGivenUp(e) => Stream::Reservation(e.reservation),
            Event::RaceLost(e) => Stream::Reservation(e.reservation),
            Event::ReservationPenalised(e) => Stream::Reservation(e.reservation),
            Event::PenaltyCleared(e) => Stream::Reservation(e.reservation),
            Event::MachineAssimilated(e) => Stream::Device(e.provider_id.clone()),
            Event::AdoptionRequested(e) => Stream::Device(e.device.clone()),
            Event::AssimilationSkipped(e) => Stream::Device(e.device.clone()),
            Event::AssimilationRejected(e) => Stream::Device(e.device.clone()),
            Event::LimitExceeded(e) => Stream::Device(e.device.clone()),
            Event::SshKeyEnsured(e) => Stream::SshKey(e.label.clone()),
            Event::AssimilationRequested(e) => Stream::Device(e.device.clone()),
            Event::ViewsReplaced(_) => Stream::Views,
            Event::JobRetried(_) => Stream::Jobs,
            Event::JobCancelled(e) => match e.reservation {
                Some(r) => Stream::Reservation(r),
                None => Stream::Jobs,
            },
            Event::CreationsPaused(_)
            | Event::CreationsResumed(_)
            | Event::DeletionsPaused(_)
            | Event::DeletionsResumed(_) => Stream::Operator,
            Event::Unknown { .. } => Stream::Operator,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v1_penalty_still_decodes() {
        let body = serde_json::json!({
            "reservation": "2b0f6b1c-0d3a-4e8a-9a4b-1d2c3e4f5a6b",
            "until": "2026-12-01T10:00:00Z",
            "cause": "createDevice: rejected as invalid (422)"
        });
        let e = Event::decode("reservation_penalised", 1, body).unwrap();
        match e {
            Event::ReservationPenalised(p) => assert_eq!(p.class, None),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unknown_type_or_a_future_version_is_kept_not_refused() {
        let e = Event::decode("machine_teleported", 1, serde_json::json!({"x": 1})).unwrap();
        assert_eq!(e.type_name(), "machine_teleported");
        let e = Event::decode("race_lost", 9, serde_json::json!({"new": true})).unwrap();
        assert!(matches!(
            e,
            Event::Unknown {
                schema_version: 9,
                ..
            }
        ));
    }

    #[test]
    fn type_names_are_unique() {
        let mut names = Event::TYPE_NAMES.to_vec();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Event::TYPE_NAMES.len());
    }
}
