//! Injected misbehaviour shared by every fake: latency, and rules that make
//! a request fail, each rule for one operation or all of them. What a rule
//! does (`Kind`) and what it is drawn for (`Op`) belong to each provider's
//! fake.

use rand::Rng;
use serde::{Deserialize, Serialize};

/// Whether a kind of fault means anything for an operation (an
/// accept-then-fail means nothing on a listing).
pub trait AppliesTo<Op> {
    fn applies_to(&self, op: Op) -> bool;
}

/// Everything a fake does wrong on purpose. The default does nothing wrong.
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    default,
    bound(deserialize = "Op: Deserialize<'de>, Kind: Deserialize<'de> + Default")
)]
pub struct Faults<Op, Kind> {
    /// Added to every request, authorised or not.
    pub latency_ms: u64,
    /// Plus a uniform random extra of `0..=latency_jitter_ms`.
    pub latency_jitter_ms: u64,
    /// Checked in order; the first rule that fires decides the answer.
    pub rules: Vec<FaultRule<Op, Kind>>,
}

impl<Op, Kind> Default for Faults<Op, Kind> {
    fn default() -> Self {
        Faults {
            latency_ms: 0,
            latency_jitter_ms: 0,
            rules: vec![],
        }
    }
}

impl<Op: Copy + PartialEq, Kind: Clone + AppliesTo<Op>> Faults<Op, Kind> {
    /// No latency and no rules.
    pub fn none() -> Self {
        Self::default()
    }

    pub fn with_latency(mut self, latency_ms: u64, jitter_ms: u64) -> Self {
        self.latency_ms = latency_ms;
        self.latency_jitter_ms = jitter_ms;
        self
    }

    pub fn with_rule(mut self, rule: FaultRule<Op, Kind>) -> Self {
        self.rules.push(rule);
        self
    }

    /// Picks the fault for one request to `op`, using up one of the rule's
    /// `remaining` firings. Rules whose kind makes no sense for `op` are
    /// skipped without drawing, so a catch-all `accept_then_fail` rule is not
    /// spent on a listing.
    pub fn pick(&mut self, op: Op, rng: &mut impl Rng) -> Option<Kind> {
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
    pub fn latency(&self, rng: &mut impl Rng) -> u64 {
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
#[serde(
    default,
    bound(deserialize = "Op: Deserialize<'de>, Kind: Deserialize<'de> + Default")
)]
pub struct FaultRule<Op, Kind> {
    /// `None` matches every operation.
    pub op: Option<Op>,
    /// Chance, from 0 to 1, that a matching request triggers the rule.
    /// Defaults to 1 so that a rule written without it fires.
    pub probability: f64,
    /// How many more times the rule may fire; `None` is unlimited.
    pub remaining: Option<u64>,
    /// Matching requests to let through before the rule may fire: a fault
    /// that starts mid-operation (the read before a create succeeds, the
    /// reads after it fail).
    pub after: u64,
    pub kind: Kind,
}

impl<Op, Kind: Default> Default for FaultRule<Op, Kind> {
    fn default() -> Self {
        FaultRule {
            op: None,
            probability: 1.0,
            remaining: None,
            after: 0,
            kind: Kind::default(),
        }
    }
}

impl<Op, Kind: Default> FaultRule<Op, Kind> {
    /// A rule that fires on every request of every operation it applies to.
    pub fn new(kind: Kind) -> Self {
        FaultRule {
            kind,
            ..FaultRule::default()
        }
    }

    /// A rule that fires on every request to `op`.
    pub fn on(op: Op, kind: Kind) -> Self {
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
