//! The guards every deletion passes, in one place: a pause for deletions,
//! and a budget per pool and period.

use super::{Decision, Guard, Held, Policy, Target};

/// How many machines a pool may lose per period: the larger of its share
/// and the minimum, the share taken of its count (or of its members, for a
/// pool removed or shrunk to nothing).
pub fn budget(count: u32, members: u32, percent: u32, min: u32) -> u32 {
    let base = u64::from(count.max(members));
    let share = (base * u64::from(percent)).div_ceil(100);
    (share as u32).max(min)
}

/// The decisions the guards let through, and what they held back.
pub fn apply(
    t: &Target,
    wanted: Vec<Decision>,
    used: u32,
    policy: &Policy,
) -> (Vec<Decision>, Vec<Held>) {
    if wanted.is_empty() {
        return (vec![], vec![]);
    }
    if policy.paused {
        let held = Held {
            pool: t.pool.clone(),
            guard: Guard::Paused,
            count: wanted.len() as u32,
            message: "deletions are paused".into(),
        };
        return (vec![], vec![held]);
    }
    let allowed = budget(
        t.count,
        t.members.len() as u32,
        policy.budget_percent,
        policy.budget_min,
    );
    let left = allowed.saturating_sub(used) as usize;
    if wanted.len() <= left {
        return (wanted, vec![]);
    }
    let held = Held {
        pool: t.pool.clone(),
        guard: Guard::Budget,
        count: (wanted.len() - left) as u32,
        message: format!(
            "the pool's deletion budget is {allowed} a period and {used} were used: {} wait for the next",
            wanted.len() - left
        ),
    };
    let mut wanted = wanted;
    wanted.truncate(left);
    (wanted, vec![held])
}
