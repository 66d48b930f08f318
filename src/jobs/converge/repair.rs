//! Repair: a machine whose deployment failed, or that is still not ready
//! past the deadline, is deleted so that its place is filled again. When
//! too many of a pool look unhealthy at once, that is an outage at the
//! provider, not a reason to delete: none is replaced (Cluster API's
//! `maxUnhealthy`).

use chrono::TimeDelta;

use super::{Cause, Decision, Guard, Health, Held, Member, Policy, Target};

pub struct Repair {
    pub chosen: Vec<Decision>,
    /// Protected machines that would have been replaced.
    pub protected: u32,
}

/// Why a member is to be replaced, on positive evidence only: the
/// provider names a failure, or a machine we created has been deploying
/// past the deadline since our creation was recorded and was never ready.
/// A machine ready once, one we did not create, or one in any other state
/// (off, rescue, unknown, a word never seen) is not replaced for it.
fn unhealthy(m: &Member, policy: &Policy) -> Option<Cause> {
    match m.health {
        Health::Failed => Some(Cause::Failed),
        Health::Deploying if !m.ready_once => {
            let deadline = TimeDelta::from_std(policy.ready_deadline).unwrap_or(TimeDelta::MAX);
            m.made_at
                .filter(|at| policy.now - *at > deadline)
                .map(|_| Cause::NotReady)
        }
        Health::Deploying | Health::Ready | Health::Dormant => None,
    }
}

pub fn candidates(t: &Target, surplus: &[Decision], policy: &Policy) -> Result<Repair, Held> {
    let mut out = Repair {
        chosen: vec![],
        protected: 0,
    };
    if t.removed {
        return Ok(out);
    }
    // Every unhealthy member counts toward the outage check, those already
    // leaving included; only the others can be chosen.
    let sick: Vec<(&Member, Cause)> = t
        .members
        .iter()
        .filter_map(|m| Some((m, unhealthy(m, policy)?)))
        .collect();
    if sick.is_empty() {
        return Ok(out);
    }
    let allowed = (u64::from(t.count) * u64::from(policy.max_unhealthy_percent)).div_ceil(100);
    if sick.len() as u64 > allowed {
        return Err(Held {
            pool: t.pool.clone(),
            guard: Guard::Unhealthy,
            count: sick.iter().filter(|(m, _)| !m.leaving).count() as u32,
            message: format!(
                "{} of the pool's {} machines look unhealthy, more than max_unhealthy allows ({allowed}): \
                 an outage at the provider is not a reason to delete, so none is replaced",
                sick.len(),
                t.count
            ),
        });
    }
    for (m, cause) in sick {
        if m.leaving || surplus.iter().any(|d| d.member.machine_id == m.machine_id) {
            continue;
        }
        if m.protected {
            out.protected += 1;
            continue;
        }
        out.chosen.push(Decision {
            pool: t.pool.clone(),
            member: m.clone(),
            cause,
            message: match cause {
                Cause::Failed => {
                    format!("its deployment failed; place {} is filled again", m.index)
                }
                _ => format!(
                    "never ready, still deploying {} after shepherd created it; place {} is filled again",
                    crate::config::format_duration(policy.ready_deadline),
                    m.index
                ),
            },
        });
    }
    Ok(out)
}
