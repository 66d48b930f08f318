//! One event of every type, as the log's round-trip tests write them.

use super::*;

pub fn one_of_each() -> Vec<Event> {
    let run = Uuid::new_v4();
    let r = Uuid::new_v4();
    let d = Uuid::new_v4();
    let (m, q) = (Uuid::new_v4(), Uuid::new_v4());
    vec![
        ReconcileStarted {
            run,
            max_machines: 50,
            chunk_size: 20,
            requested_by: None,
        }
        .into(),
        ReservationsListed {
            run,
            counts: ReservationCounts {
                total: 10,
                available: 5,
                in_use: 3,
                not_provisionable: 1,
                penalised: 1,
                in_flight: 0,
            },
        }
        .into(),
        PoolsSurveyed {
            run,
            pools: vec![shepherd::provider::PoolReport {
                name: "web".into(),
                plan: "c2-small-x86".into(),
                site: "SAO".into(),
                scope: "c2-small-x86@SAO".into(),
                count: 4,
                taken: 3,
                failed: 1,
                stock: Some(shepherd::provider::PoolStock {
                    offered: true,
                    in_stock: true,
                    count: Some(12),
                }),
                machines: 3,
                removed: false,
                dormant: 1,
                price: Some(shepherd::provider::Price {
                    currency: "USD".into(),
                    hour: 0.33,
                    month: Some(198.0),
                    year: None,
                }),
            }],
            listing: Some(shepherd::provider::ListingCost {
                scope: "servers whose hostname starts with shepherd-".into(),
                reads: 1,
                machines: 3,
            }),
        }
        .into(),
        DiscrepancyFound {
            run,
            unknown_devices: vec![d.to_string()],
            missing_devices: vec![],
        }
        .into(),
        ReconcileRefused {
            run,
            reason: "discrepancy".into(),
        }
        .into(),
        CreationsEnqueued {
            run,
            reservations: vec![r],
        }
        .into(),
        ReconcileFinished {
            run,
            managed: 3,
            in_flight: 1,
            enqueued: 1,
            at_limit: false,
        }
        .into(),
        CreationRequested {
            reservation: r,
            request: Uuid::new_v4(),
            manual: false,
            requested_by: None,
            sinbin_override: None,
            place: None,
        }
        .into(),
        CreationAttemptFailed {
            reservation: r,
            class: ErrorClass::Transient,
            message: "503".into(),
            attempt: 1,
        }
        .into(),
        DeviceCreated {
            reservation: r,
            device: d.to_string(),
            hostname: "h".into(),
            witness: "w".into(),
            recovered: true,
            request: None,
        }
        .into(),
        CreationGivenUp {
            reservation: r,
            class: ErrorClass::Permanent,
            message: "422".into(),
            request: None,
        }
        .into(),
        RaceLost {
            reservation: r,
            other_device: Some(Uuid::new_v4().to_string()),
            request: None,
        }
        .into(),
        ReservationPenalised {
            reservation: r,
            until: Utc::now(),
            cause: "c".into(),
            class: Some(ErrorClass::RaceLost),
            scope: None,
        }
        .into(),
        PenaltyCleared {
            reservation: r,
            by: "ops".into(),
            reason: "fixed".into(),
        }
        .into(),
        MachineAssimilated {
            machine_id: Uuid::new_v4(),
            provider: PROVIDER_METAL.into(),
            provider_id: d.to_string(),
            reservation: Some(r),
            hostname: Some("h".into()),
        }
        .into(),
        AssimilationSkipped {
            device: d.to_string(),
            machine_id: Uuid::new_v4(),
        }
        .into(),
        AssimilationRejected {
            device: d.to_string(),
            reason: "not found".into(),
        }
        .into(),
        SshKeyEnsured {
            label: "shepherd".into(),
            key_id: Uuid::new_v4().to_string(),
        }
        .into(),
        AssimilationRequested {
            device: d.to_string(),
            requested_by: "cli:alice".into(),
        }
        .into(),
        ViewsReplaced {
            by: "cli:alice".into(),
            differences: 2,
        }
        .into(),
        JobRetried {
            job: "01JA0000000000000000000000".into(),
            kind: "assimilate".into(),
            by: "console:alice".into(),
            reason: "the provider is back".into(),
        }
        .into(),
        JobCancelled {
            job: "01JA0000000000000000000001".into(),
            kind: "create_device".into(),
            by: "console:alice".into(),
            reason: "wrong plan".into(),
            reservation: Some(r),
            request: Some(Uuid::new_v4()),
        }
        .into(),
        CreationRefused {
            reservation: r,
            request: Uuid::new_v4(),
            reason: "at the limit".into(),
        }
        .into(),
        AdoptionRequested {
            run,
            device: d.to_string(),
            reservation: Some(r),
            witnessed: true,
        }
        .into(),
        CreationsPaused {
            by: "ops".into(),
            reason: "window".into(),
        }
        .into(),
        CreationsResumed {
            by: "ops".into(),
            reason: String::new(),
        }
        .into(),
        CreationUnresolved {
            reservation: r,
            request: Uuid::new_v4(),
            attempt: 5,
            message: "createDevice: outcome unknown".into(),
            lease_lost: true,
            looked: false,
        }
        .into(),
        CreationResumed {
            reservation: r,
            request: Uuid::new_v4(),
            reason: "no job was left to end it".into(),
        }
        .into(),
        PoolDeclared {
            name: "web".into(),
            plan: "c2-small-x86".into(),
            site: "DAL".into(),
            count: 3,
            operating_system: "ubuntu_24_04_x64_lts".into(),
            ssh_keys: vec![],
            by: "cli:alice".into(),
            reason: "launch".into(),
        }
        .into(),
        PoolChanged {
            name: "web".into(),
            plan: "c2-small-x86".into(),
            site: "DAL".into(),
            count: 0,
            operating_system: "ubuntu_24_04_x64_lts".into(),
            ssh_keys: vec!["ssh_a".into()],
            by: "cli:alice".into(),
            reason: "winding down".into(),
            confirmed: true,
        }
        .into(),
        PoolRemoved {
            name: "web".into(),
            by: "cli:alice".into(),
            reason: "gone".into(),
            confirmed: true,
        }
        .into(),
        DeletionRequested {
            machine_id: m,
            provider_id: d.to_string(),
            reservation: Some(r),
            pool: Some("web".into()),
            request: q,
            cause: "surplus".into(),
            message: "pool web holds more machines than its count of 2".into(),
            by: "reconcile".into(),
        }
        .into(),
        LeaveAcknowledged {
            machine_id: m,
            provider_id: d.to_string(),
            request: q,
            by: "cli:alice".into(),
        }
        .into(),
        LeaveTimedOut {
            machine_id: m,
            provider_id: d.to_string(),
            request: q,
            action: "proceed".into(),
        }
        .into(),
        DeletionUnresolved {
            machine_id: m,
            provider_id: d.to_string(),
            request: q,
            message: "destroy-server: outcome unknown".into(),
            lease_lost: false,
        }
        .into(),
        MachineDeleted {
            machine_id: m,
            provider: "latitude".into(),
            provider_id: d.to_string(),
            reservation: Some(r),
            request: q,
            already_gone: false,
        }
        .into(),
        DeletionFailed {
            machine_id: m,
            provider_id: d.to_string(),
            request: q,
            message: "refused".into(),
        }
        .into(),
        DeletionCancelled {
            machine_id: m,
            provider_id: d.to_string(),
            request: q,
            reason: "the pool grew".into(),
            by: "shepherd".into(),
        }
        .into(),
        MachineProtected {
            machine_id: m,
            provider_id: d.to_string(),
            by: "cli:alice".into(),
            reason: "database primary".into(),
        }
        .into(),
        MachineUnprotected {
            machine_id: m,
            provider_id: d.to_string(),
            by: "cli:alice".into(),
            reason: "migrated".into(),
        }
        .into(),
        MachineReady {
            machine_id: m,
            provider_id: d.to_string(),
            status: Some("on".into()),
        }
        .into(),
        LeaveAsked {
            machine_id: m,
            provider_id: d.to_string(),
            request: q,
            by: "hook:drain.example".into(),
        }
        .into(),
        DeletionsPaused {
            by: "ops".into(),
            reason: "incident".into(),
        }
        .into(),
        DeletionsResumed {
            by: "ops".into(),
            reason: String::new(),
        }
        .into(),
        SurplusFound {
            run,
            pools: vec![SurplusReport {
                pool: "web".into(),
                count: 2,
                machines: 3,
                doubled: vec!["web/1".into()],
                extra: vec![d.to_string()],
            }],
        }
        .into(),
        DeletionsHeld {
            run,
            pool: "web".into(),
            held: 3,
            guard: "budget".into(),
            message: "the budget is spent".into(),
        }
        .into(),
        MachineNotFound {
            run,
            machine_id: Uuid::new_v4(),
            provider_id: d.to_string(),
            message: "get-server: not found (404)".into(),
        }
        .into(),
        MachineLost {
            machine_id: Uuid::new_v4(),
            provider: PROVIDER_METAL.into(),
            provider_id: d.to_string(),
            reservation: Some(r),
            evidence: "not found twice".into(),
        }
        .into(),
        LimitExceeded {
            device: d.to_string(),
            managed: 6,
            in_flight: 0,
            limit: 5,
        }
        .into(),
        CreationSettled {
            reservation: r,
            request: Uuid::new_v4(),
            message: "nothing of ours after the settle window".into(),
        }
        .into(),
        AssimilationResumed {
            device: d.to_string(),
            reason: "no job was left to end it".into(),
        }
        .into(),
        MachineReleased {
            machine_id: Uuid::new_v4(),
            provider: PROVIDER_METAL.into(),
            provider_id: d.to_string(),
            by: "ops".into(),
            reason: "deleted by hand".into(),
        }
        .into(),
        SettingsChanged {
            by: "ops".into(),
            reason: "growth".into(),
            settings: [("max_machines".to_string(), serde_json::json!(80))]
                .into_iter()
                .collect(),
        }
        .into(),
        ReconcileCoalesced {
            run,
            newer_pass_started_at: Utc::now(),
        }
        .into(),
        DatabaseMoved {
            from: "7716714676140452049/1/16387".into(),
            to: "7716714676140452049/2/16387".into(),
        }
        .into(),
    ]
}
