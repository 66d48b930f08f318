//! The Metal fake's faults: the ways the real API (or the network in front
//! of it) has been seen to fail, drawn per Metal operation.

use serde::{Deserialize, Serialize};

use shepherd::metal::Operation;

use crate::faults::AppliesTo;

/// Everything the fake Metal API does wrong on purpose (see
/// [`crate::faults::Faults`] for the JSON form).
pub type Faults = crate::faults::Faults<Operation, FaultKind>;
/// One way to fail, for one Metal operation or all of them.
pub type FaultRule = crate::faults::FaultRule<Operation, FaultKind>;

/// What a fired rule does to the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultKind {
    /// Answer with this status and an error body, without doing the work.
    Status {
        #[serde(default = "internal_error")]
        status: u16,
    },
    /// Answer 429 with `Retry-After` and the `X-RateLimit-*` headers.
    RateLimited {
        #[serde(default = "one_second")]
        retry_after_secs: u64,
    },
    /// `createDevice` only: create the device, then answer with this status.
    AcceptThenFail {
        #[serde(default = "internal_error")]
        status: u16,
    },
    /// `createDevice` only: create the device, then break the connection
    /// half-way through a 201 answer.
    AcceptThenDrop,
    /// `findHardwareReservationById` and `createDevice` only: just before
    /// the request is handled, another party puts a device on the requested
    /// reservation, if it has none.
    StealReservation,
    /// Answer with this raw body (labelled `application/json` whatever it
    /// holds, as a confused proxy might) and status.
    Garbage {
        #[serde(default)]
        body: String,
        #[serde(default = "bad_gateway")]
        status: u16,
    },
}

impl Default for FaultKind {
    fn default() -> Self {
        FaultKind::Status {
            status: internal_error(),
        }
    }
}

impl AppliesTo<Operation> for FaultKind {
    fn applies_to(&self, op: Operation) -> bool {
        match self {
            FaultKind::AcceptThenFail { .. } | FaultKind::AcceptThenDrop => {
                op == Operation::CreateDevice
            }
            FaultKind::StealReservation => matches!(
                op,
                Operation::CreateDevice | Operation::FindHardwareReservationById
            ),
            FaultKind::Status { .. }
            | FaultKind::RateLimited { .. }
            | FaultKind::Garbage { .. } => true,
        }
    }
}

fn internal_error() -> u16 {
    500
}

fn bad_gateway() -> u16 {
    502
}

fn one_second() -> u64 {
    1
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn rules_parse_with_defaults() {
        let faults: Faults = serde_json::from_str(
            r#"{"rules":[{"op":"createDevice","remaining":2,"kind":{"kind":"accept_then_drop"}},
                         {"kind":{"kind":"status"}}]}"#,
        )
        .unwrap();
        assert_eq!(faults.latency_ms, 0);
        assert_eq!(
            faults.rules[0],
            FaultRule::on(Operation::CreateDevice, FaultKind::AcceptThenDrop).times(2)
        );
        assert_eq!(
            faults.rules[1],
            FaultRule::new(FaultKind::Status { status: 500 })
        );
    }

    #[test]
    fn remaining_runs_out_and_kinds_stay_in_their_lane() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut faults = Faults::none()
            .with_rule(FaultRule::new(FaultKind::AcceptThenFail { status: 500 }).times(1))
            .with_rule(FaultRule::on(
                Operation::FindProjectDevices,
                FaultKind::Status { status: 503 },
            ));
        assert_eq!(faults.pick(Operation::FindDeviceById, &mut rng), None);
        assert_eq!(
            faults.pick(Operation::CreateDevice, &mut rng),
            Some(FaultKind::AcceptThenFail { status: 500 })
        );
        assert_eq!(faults.pick(Operation::CreateDevice, &mut rng), None);
        assert_eq!(faults.rules[0].remaining, Some(0));
        assert_eq!(
            faults.pick(Operation::FindProjectDevices, &mut rng),
            Some(FaultKind::Status { status: 503 })
        );
    }

    #[test]
    fn zero_probability_never_fires() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut faults = Faults::none()
            .with_rule(FaultRule::new(FaultKind::AcceptThenDrop).with_probability(0.0));
        assert!((0..100).all(|_| faults.pick(Operation::CreateDevice, &mut rng).is_none()));
    }
}
