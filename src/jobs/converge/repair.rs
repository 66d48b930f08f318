//! Repair: a machine whose deployment failed, or that is still not ready
//! past the deadline, is deleted so that its place is filled again. When
//! too many look unhealthy at once, that is an outage at the provider, not
//! a reason to delete: none is replaced (Cluster API's `maxUnhealthy`).
//! "Too many" is counted across every pool of the plan at the site (the
//! pool's `scope`; a pool without one alone), since a fault at the
//! provider strikes them together, and rounds down as Cluster API does:
//! `max_unhealthy` of 40 % lets 2 of 5 be replaced, none of 2, and none of
//! a pool of one unless the rest of its plan and site is healthy and large
//! enough to carry it.

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

/// How unhealthy a scope (every pool of one plan at one site) is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scope {
    /// The counts of its pools, added up.
    pub count: u64,
    /// Its members that look unhealthy, those already leaving included.
    pub sick: u64,
}

/// The scope each pool is counted in: its plan and site, or itself.
pub fn scope_key(t: &Target) -> String {
    match &t.scope {
        Some(scope) => format!("scope:{scope}"),
        None => format!("pool:{}", t.pool),
    }
}

/// Every scope's counts, over the pools not removed.
pub fn scopes(targets: &[Target], policy: &Policy) -> std::collections::HashMap<String, Scope> {
    let mut out: std::collections::HashMap<String, Scope> = std::collections::HashMap::new();
    for t in targets.iter().filter(|t| !t.removed) {
        let s = out.entry(scope_key(t)).or_default();
        s.count += u64::from(t.count);
        s.sick += t
            .members
            .iter()
            .filter(|m| unhealthy(m, policy).is_some())
            .count() as u64;
    }
    out
}

pub fn candidates(
    t: &Target,
    scope: Scope,
    surplus: &[Decision],
    policy: &Policy,
) -> Result<Repair, Held> {
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
    // Nothing to replace (every sick one leaving already, or shed as
    // surplus): nothing for the guard to hold either.
    if !sick
        .iter()
        .any(|(m, _)| !m.leaving && !surplus.iter().any(|d| d.member.machine_id == m.machine_id))
    {
        return Ok(out);
    }
    // Rounded down: a share of a small count allows fewer, never more.
    let allowed = scope.count * u64::from(policy.max_unhealthy_percent) / 100;
    if scope.sick > allowed {
        let whole = match &t.scope {
            Some(s) if scope.count > u64::from(t.count) => {
                format!("of the {} machines its pools of {s} count", scope.count)
            }
            _ => format!("of the pool's {}", scope.count),
        };
        return Err(Held {
            pool: t.pool.clone(),
            guard: Guard::Unhealthy,
            count: sick.iter().filter(|(m, _)| !m.leaving).count() as u32,
            message: format!(
                "{} {whole} look unhealthy, more than max_unhealthy ({}%, rounded down) allows \
                 ({allowed}): an outage at the provider is not a reason to delete, so none is replaced",
                scope.sick, policy.max_unhealthy_percent
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
