//! Surplus: a pool with more machines than its count (lowered, removed, or
//! two machines on one place) sheds the extra ones, chosen by the policy:
//! failed first, then not yet ready; among equals, the hourly machine
//! nearest its next billed hour (the least paid time thrown away), then
//! the newest. A protected machine never goes, and a healthy one paid for
//! to the end of a monthly or yearly term stays until the term ends.

use std::cmp::Reverse;

use chrono::{DateTime, Utc};

use super::{Cause, Decision, Member, Target};
use crate::provider::{Billing, Condition};

pub struct Surplus {
    pub chosen: Vec<Decision>,
    /// Protected machines the policy would have taken.
    pub protected: u32,
    /// The prepaid machines it would have taken.
    pub prepaid: Vec<Prepaid>,
}

/// A machine paid for to the end of a term, kept as surplus until then.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prepaid {
    pub billing: Billing,
    /// When its term ends (`None`: not known).
    pub until: Option<DateTime<Utc>>,
}

/// Seconds until an hourly machine's next billed hour begins (a machine
/// of unknown age or billing: an hour, the most).
fn to_next_billed_hour(m: &Member, now: DateTime<Utc>) -> i64 {
    match (m.billing, m.created_at) {
        (Some(Billing::Hourly), Some(created)) if created <= now => {
            3600 - (now - created).num_seconds().rem_euclid(3600)
        }
        _ => 3600,
    }
}

/// Whether a healthy machine is paid for to the end of a term, and when
/// that term ends (`Some(None)`: a term of unknown start, kept all the
/// same: no positive evidence that it is over). A failed machine is not
/// kept for it.
fn prepaid_until(m: &Member, now: DateTime<Utc>) -> Option<Option<DateTime<Utc>>> {
    if m.health == Condition::Failed {
        return None;
    }
    let billing = m.billing?;
    let Some(created) = m.created_at else {
        return (billing != Billing::Hourly).then_some(None);
    };
    // Terms renew from the creation: the end of the one running now,
    // counted from the creation each time (a month added to a month's end
    // would drift: 31 Jan, 28 Feb, 28 Mar).
    let mut terms = 1;
    let end = loop {
        let end = billing.term_end_after(created, terms)?;
        if end > now {
            break end;
        }
        terms += 1;
    };
    // Within its last hours the term is spent: the machine goes now, as
    // surplus, rather than renew for another term.
    (end - now > LAST_HOURS_OF_A_TERM).then_some(Some(end))
}

/// How long before its term ends a prepaid machine is let go as surplus:
/// long enough for the passes and the deletion budget to delete it before
/// the next term is billed.
const LAST_HOURS_OF_A_TERM: chrono::TimeDelta = chrono::TimeDelta::hours(12);

pub fn candidates(t: &Target, now: DateTime<Utc>) -> Surplus {
    let mut active: Vec<_> = t.members.iter().filter(|m| !m.leaving).collect();
    let over = active.len().saturating_sub(t.count as usize);
    let mut out = Surplus {
        chosen: vec![],
        protected: 0,
        prepaid: vec![],
    };
    if over == 0 {
        return out;
    }
    active.sort_by_key(|m| {
        (
            m.protected,
            prepaid_until(m, now).is_some(),
            m.health,
            !m.adopted,
            to_next_billed_hour(m, now),
            Reverse(m.created_at),
            Reverse(m.index),
        )
    });
    let cause = if t.removed {
        Cause::PoolRemoved
    } else {
        Cause::Surplus
    };
    for m in active.into_iter().take(over) {
        if m.protected {
            out.protected += 1;
            continue;
        }
        if let Some(until) = prepaid_until(m, now) {
            out.prepaid.push(Prepaid {
                billing: m.billing.unwrap_or(Billing::Monthly),
                until,
            });
            continue;
        }
        out.chosen.push(Decision {
            pool: t.pool.clone(),
            member: m.clone(),
            cause,
            message: if t.removed {
                format!("pool {} was removed", t.pool)
            } else {
                format!(
                    "pool {} holds more machines than its count of {}",
                    t.pool, t.count
                )
            },
        });
    }
    out
}
