//! Injected misbehaviour: latency and rules that make a request fail in the
//! ways the real API (or the network in front of it) has been seen to fail.

use rand::Rng;
use serde::{Deserialize, Serialize};

use shepherd::metal::Operation;

/// Everything the fake does wrong on purpose. The default does nothing wrong.
///
/// As JSON (the admin API's `PUT /_fake/faults`):
///
/// ```json
/// {
///   "latency_ms": 20,
///   "latency_jitter_ms": 10,
///   "rules": [
///     {"op": "createDevice", "remaining": 1, "kind": {"kind": "accept_then_fail", "status": 500}},
///     {"probability": 0.1, "kind": {"kind": "status", "status": 503}}
///   ]
/// }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Faults {
    /// Added to every Metal request, authorised or not.
    pub latency_ms: u64,
    /// Plus a uniform random extra of `0..=latency_jitter_ms`.
    pub latency_jitter_ms: u64,
    /// Checked in order; the first rule that fires decides the answer.
    pub rules: Vec<FaultRule>,
}

impl Faults {
    /// No latency and no rules.
    pub fn none() -> Self {
        Self::default()
    }

    pub fn with_latency(mut self, latency_ms: u64, jitter_ms: u64) -> Self {
        self.latency_ms = latency_ms;
        self.latency_jitter_ms = jitter_ms;
        self
    }

    pub fn with_rule(mut self, rule: FaultRule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Picks the fault for one request to `op`, using up one of the rule's
    /// `remaining` firings. Rules whose kind makes no sense for `op` are
    /// skipped without drawing, so a catch-all `accept_then_fail` rule is not
    /// spent on a listing.
    pub(super) fn pick(&mut self, op: Operation, rng: &mut impl Rng) -> Option<FaultKind> {
        for rule in &mut self.rules {
            if rule.op.is_some_and(|o| o != op)
                || !rule.kind.applies_to(op)
                || rule.remaining == Some(0)
            {
                continue;
            }
            if rule.after > 0 {
                rule.after -= 1;
                continue;
            }
            let draw: f64 = rng.random();
            if draw < rule.probability.clamp(0.0, 1.0) {
                if let Some(left) = rule.remaining.as_mut() {
                    *left -= 1;
                }
                return Some(rule.kind.clone());
            }
        }
        None
    }

    /// The latency to add to one request, in milliseconds.
    pub(super) fn latency(&self, rng: &mut impl Rng) -> u64 {
        let jitter = if self.latency_jitter_ms == 0 {
            0
        } else {
            rng.random_range(0..=self.latency_jitter_ms)
        };
        self.latency_ms.saturating_add(jitter)
    }
}

/// One way to fail, for some operation or all of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FaultRule {
    /// `None` matches every operation.
    pub op: Option<Operation>,
    /// Chance, from 0 to 1, that a matching request triggers the rule.
    /// Defaults to 1 so that a rule written without it fires.
    pub probability: f64,
    /// How many more times the rule may fire; `None` is unlimited.
    pub remaining: Option<u64>,
    /// Matching requests to let through before the rule may fire: a fault
    /// that starts mid-operation (the read before a create succeeds, the
    /// reads after it fail).
    pub after: u64,
    pub kind: FaultKind,
}

impl Default for FaultRule {
    fn default() -> Self {
        FaultRule {
            op: None,
            probability: 1.0,
            remaining: None,
            after: 0,
            kind: FaultKind::default(),
        }
    }
}

impl FaultRule {
    /// A rule that fires on every request of every operation it applies to.
    pub fn new(kind: FaultKind) -> Self {
        FaultRule {
            kind,
            ..FaultRule::default()
        }
    }

    /// A rule that fires on every request to `op`.
    pub fn on(op: Operation, kind: FaultKind) -> Self {
        FaultRule {
            op: Some(op),
            ..FaultRule::new(kind)
        }
    }

    /// Lets the first `n` matching requests through.
    pub fn after(mut self, n: u64) -> Self {
        self.after = n;
        self
    }

    /// Limits the rule to `n` firings.
    pub fn times(mut self, n: u64) -> Self {
        self.remaining = Some(n);
        self
    }

    pub fn with_probability(mut self, probability: f64) -> Self {
        self.probability = probability;
        self
    }
}

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

impl FaultKind {
    /// Whether the kind means anything for `op`.
    pub fn applies_to(&self, op: Operation) -> bool {
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
