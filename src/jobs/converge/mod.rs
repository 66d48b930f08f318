//! What a pass deletes to keep the cluster's pools as declared, as pure
//! decisions over what it read (Karpenter's disruption methods, shepherd's
//! size). Growing a pool is the pass's selection of free places; shrinking
//! it, and replacing what failed, is here. Each reason to delete is a
//! module of its own (`surplus`, `repair`), and every guard is applied in
//! one place (`guards`), in a fixed order:
//!
//! 1. deletions paused: nothing is deleted;
//! 2. a protected machine is never deleted;
//! 3. too many machines of a plan at a site look unhealthy at once (an
//!    outage at the provider, not a reason to delete): none of them is
//!    replaced;
//! 4. the pool's deletion budget for the period: no more than that.
//!
//! A decision names its machine and why; the pass records it
//! (`deletion_requested`) and the deletion job re-checks it before it sends
//! anything. What a guard held back is reported (`deletions_held`).

mod guards;
mod repair;
mod surplus;

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

pub use guards::budget;

/// What a machine's status means for its lifecycle (the provider's
/// `Condition`): only `Failed`, and `Deploying` for a machine never ready
/// since our own creation, are reasons to replace it.
pub use crate::provider::Condition as Health;

/// A managed machine of a pool, proven ours by its witness.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// The provider's id.
    pub device: String,
    pub machine_id: Uuid,
    pub unit: Uuid,
    /// Its place in the pool.
    pub index: u32,
    pub health: Health,
    /// A pass has seen it ready (`machine_ready`), or sees it so now.
    pub ready_once: bool,
    /// When our own creation of it was recorded; none for a machine we did
    /// not create. The ready deadline counts from here.
    pub made_at: Option<DateTime<Utc>>,
    /// When the provider says it was made (the newest goes first as
    /// surplus).
    pub created_at: Option<DateTime<Utc>>,
    pub protected: bool,
    /// Its deletion is under way already.
    pub leaving: bool,
    /// Managed by an operator's adoption, not proven ours by a witness:
    /// among equals, what shepherd made is kept over what it adopted.
    pub adopted: bool,
    /// How the provider bills it: a monthly or yearly one is kept as
    /// surplus until its term ends, an hourly one nearest its next billed
    /// hour goes first among equals.
    pub billing: Option<crate::provider::Billing>,
}

/// A pool as declared, and its members.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub pool: String,
    pub count: u32,
    pub removed: bool,
    /// The stock its places draw on (a penalty's scope).
    pub scope: Option<String>,
    pub members: Vec<Member>,
}

/// The cluster's lifecycle settings, as a pass applies them.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Deletions are paused.
    pub paused: bool,
    /// A pool may lose the larger of this share of its count and
    /// `budget_min` machines per period.
    pub budget_percent: u32,
    pub budget_min: u32,
    /// No machine of a pool is replaced while more than this share of it
    /// looks unhealthy.
    pub max_unhealthy_percent: u32,
    /// A machine we created that is still deploying this long after its
    /// creation was recorded, and was never ready, is replaced.
    pub ready_deadline: Duration,
    pub now: DateTime<Utc>,
    /// Each pool's price as the last pass read it, to say what a prepaid
    /// machine kept still holds of its term.
    pub prices: std::collections::BTreeMap<String, crate::provider::Price>,
}

/// Why a machine is to be deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Its pool has more machines than its count.
    Surplus,
    /// Its pool was removed.
    PoolRemoved,
    /// Its deployment failed: replaced.
    Failed,
    /// Never ready, still deploying past the deadline: replaced.
    NotReady,
}

impl Cause {
    /// As events record it.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Surplus => "surplus",
            Cause::PoolRemoved => "pool_removed",
            Cause::Failed => "failed",
            Cause::NotReady => "not_ready",
        }
    }

    /// A replacement: the place is filled again, and penalised so that a
    /// plan that always fails does not churn money.
    pub fn replaces(self) -> bool {
        matches!(self, Cause::Failed | Cause::NotReady)
    }
}

/// Which guard held deletions back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    Paused,
    Protected,
    Unhealthy,
    Budget,
    /// Paid for to the end of a monthly or yearly term.
    Prepaid,
}

impl Guard {
    pub fn as_str(self) -> &'static str {
        match self {
            Guard::Paused => "paused",
            Guard::Protected => "protected",
            Guard::Unhealthy => "unhealthy",
            Guard::Budget => "budget",
            Guard::Prepaid => "prepaid",
        }
    }
}

/// One machine to delete, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub pool: String,
    pub member: Member,
    pub cause: Cause,
    pub message: String,
}

/// Deletions a guard held back in one pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub pool: String,
    pub guard: Guard,
    pub count: u32,
    pub message: String,
}

/// What a pass deletes, and what it holds back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub delete: Vec<Decision>,
    pub held: Vec<Held>,
}

/// Decides, pool by pool, what to delete: surplus first (by the policy:
/// failed, then not ready, then newest), then replacements, within the
/// guards. `used` is each pool's deletions requested in the current period.
pub fn plan(targets: &[Target], used: &HashMap<String, u32>, policy: &Policy) -> Plan {
    let mut out = Plan::default();
    let scopes = repair::scopes(targets, policy);
    for t in targets {
        let surplus = surplus::candidates(t, policy.now);
        let scope = scopes
            .get(&repair::scope_key(t))
            .copied()
            .unwrap_or_default();
        let repair = repair::candidates(t, scope, &surplus.chosen, policy);
        let mut wanted: Vec<Decision> = surplus.chosen;
        let mut held: Vec<Held> = vec![];
        if !surplus.prepaid.is_empty() {
            held.push(prepaid_held(t, &surplus.prepaid, policy));
        }
        if surplus.protected > 0 {
            held.push(Held {
                pool: t.pool.clone(),
                guard: Guard::Protected,
                count: surplus.protected,
                message: format!(
                    "{} protected machines stand beyond the pool's count of {}: they stay",
                    surplus.protected, t.count
                ),
            });
        }
        match repair {
            Ok(r) => {
                wanted.extend(r.chosen);
                if r.protected > 0 {
                    held.push(Held {
                        pool: t.pool.clone(),
                        guard: Guard::Protected,
                        count: r.protected,
                        message: format!("{} protected machines failed: they stay", r.protected),
                    });
                }
            }
            Err(h) => held.push(h),
        }
        let (delete, budget_held) =
            guards::apply(t, wanted, used.get(&t.pool).copied().unwrap_or(0), policy);
        out.delete.extend(delete);
        held.extend(budget_held);
        out.held.extend(held);
    }
    out
}

/// What keeping prepaid surplus says: how many, until when, and what
/// their remaining terms are worth at the pool's price (an estimate:
/// the term's price spread evenly over it).
fn prepaid_held(t: &Target, prepaid: &[surplus::Prepaid], policy: &Policy) -> Held {
    let unknown_end = prepaid.iter().any(|p| p.until.is_none());
    let until = match prepaid.iter().filter_map(|p| p.until).max() {
        Some(until) if !unknown_end => until.format("%Y-%m-%d %H:%M UTC").to_string(),
        _ => "a date the provider did not give".into(),
    };
    let price = policy.prices.get(&t.pool);
    let mut value = 0.0;
    let mut valued = 0;
    for p in prepaid {
        let (Some(until), Some(price)) = (p.until, price) else {
            continue;
        };
        let (term_price, months) = match p.billing {
            crate::provider::Billing::Monthly => (price.month, 1),
            crate::provider::Billing::Yearly => (price.year, 12),
            crate::provider::Billing::Hourly => (None, 0),
        };
        let (Some(term_price), Some(start)) = (
            term_price,
            until.checked_sub_months(chrono::Months::new(months)),
        ) else {
            continue;
        };
        let whole = (until - start).num_seconds().max(1) as f64;
        let left = (until - policy.now).num_seconds().max(0) as f64;
        value += term_price * left / whole;
        valued += 1;
    }
    let worth = match price {
        Some(p) if valued == prepaid.len() => format!(
            "; what remains of their terms is worth about {} (paid, not refunded)",
            crate::fleet::cost::money(value, &p.currency)
        ),
        _ => String::new(),
    };
    Held {
        pool: t.pool.clone(),
        guard: Guard::Prepaid,
        count: prepaid.len() as u32,
        message: format!(
            "{} machine(s) beyond the pool's count of {}, paid for to the end of monthly or \
             yearly terms (the last ends {until}){worth}: kept until then; to delete one \
             sooner, deprovision it (shepherd machines deprovision)",
            prepaid.len(),
            t.count,
        ),
    }
}

#[cfg(test)]
mod tests;
