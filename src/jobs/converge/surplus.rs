//! Surplus: a pool with more machines than its count (lowered, removed, or
//! two machines on one place) sheds the extra ones, chosen by the policy:
//! failed first, then not yet ready, then the newest; a protected machine
//! never.

use std::cmp::Reverse;

use super::{Cause, Decision, Target};

pub struct Surplus {
    pub chosen: Vec<Decision>,
    /// Protected machines the policy would have taken.
    pub protected: u32,
}

pub fn candidates(t: &Target) -> Surplus {
    let mut active: Vec<_> = t.members.iter().filter(|m| !m.leaving).collect();
    let over = active.len().saturating_sub(t.count as usize);
    let mut out = Surplus {
        chosen: vec![],
        protected: 0,
    };
    if over == 0 {
        return out;
    }
    active.sort_by_key(|m| {
        (
            m.protected,
            m.health,
            !m.adopted,
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
