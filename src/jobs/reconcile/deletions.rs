//! The pass's second direction: what the pools have too many of. The pure
//! choice of what to delete is `jobs/converge/`; this records it (the
//! surplus seen, each deletion requested with its `delete_machine` job,
//! what the guards held back) in the pass's transaction.

use uuid::Uuid;

use crate::events::{NewEvent, record};
use crate::jobs::pass;
use crate::jobs::queue;
use crate::jobs::{JobContext, JobError};

use super::*;

/// Keeps the pools as declared in the other direction: records the surplus
/// it sees, and requests the deletions the lifecycle decides (each an
/// event, with a `delete_machine` job that re-checks it before sending
/// anything), and what the guards held back. Returns the machines whose
/// deletion it requested.
#[allow(clippy::too_many_arguments)]
pub(super) async fn converge(
    ctx: &JobContext,
    settings: &crate::cluster::ClusterSettings,
    job_id: &str,
    run: Uuid,
    declared: &[crate::provider::pool::Declared],
    devices: &[crate::provider::Machine],
    fleet: &pass::Fleet,
    ours: &std::collections::HashSet<String>,
) -> Result<Vec<String>, JobError> {
    use crate::jobs::converge::{Policy, plan};
    if declared.is_empty() {
        return Ok(vec![]);
    }
    let place = |u: Uuid| ctx.provider.unit_place(u);
    let scope = |u: Uuid| ctx.provider.unit_scope(u);
    let surplus = pass::surplus(declared, devices, fleet, ours, &place);
    let targets = pass::targets(declared, devices, fleet, ours, &place, &scope);
    let l = &settings.lifecycle;
    let mut conn = ctx.pool.acquire().await?;
    let paused = crate::events::views::read_deletions_pause(&mut conn).await?;
    let period = chrono::TimeDelta::from_std(l.budget_period).unwrap_or(chrono::TimeDelta::MAX);
    let used: Vec<(Option<String>, i64)> = sqlx::query_as(
        "select body->>'pool', count(*) from shepherd.events
         where event_type = 'deletion_requested' and recorded_at > now() - $1
         group by 1",
    )
    .bind(period)
    .fetch_all(&mut *conn)
    .await?;
    // The prices the passes read, to value what a prepaid machine kept
    // still holds of its term.
    let prices = crate::jobs::spend::last_survey(&mut conn)
        .await?
        .into_iter()
        .filter_map(|r| r.price.map(|p| (r.name, p)))
        .collect();
    drop(conn);
    let used = used
        .into_iter()
        .filter_map(|(pool, n)| Some((pool?, n.max(0) as u32)))
        .collect();
    let decided = plan(
        &targets,
        &used,
        &Policy {
            paused: paused.is_some(),
            budget_percent: l.budget_percent,
            budget_min: l.budget_min,
            max_unhealthy_percent: l.max_unhealthy_percent,
            ready_deadline: l.ready_deadline,
            now: chrono::Utc::now(),
            prices,
        },
    );
    let mut events: Vec<NewEvent> = vec![];
    if !surplus.is_empty() {
        for s in &surplus {
            tracing::warn!(pool = %s.pool, count = s.count, machines = s.machines, doubled = ?s.doubled, "a pool holds more machines of ours than declared");
        }
        events.push(NewEvent::new(SurplusFound {
            run,
            pools: surplus,
        }));
    }
    for h in &decided.held {
        tracing::warn!(pool = %h.pool, guard = h.guard.as_str(), held = h.count, "{}", h.message);
        events.push(NewEvent::new(DeletionsHeld {
            run,
            pool: h.pool.clone(),
            held: h.count,
            guard: h.guard.as_str().into(),
            message: h.message.clone(),
        }));
    }
    let mut jobs = vec![];
    let unplaced = unplaced(ctx, settings, run, devices, fleet, paused.is_some()).await?;
    for (machine_id, device, unit) in &unplaced.delete {
        let request = Uuid::new_v4();
        tracing::warn!(%device, "deleting a managed machine that stands on no place of the cluster's pools");
        events.push(NewEvent::new(DeletionRequested {
            machine_id: *machine_id,
            provider_id: device.clone(),
            reservation: *unit,
            pool: None,
            request,
            cause: UNPLACED.into(),
            message: "it stands on no place of the cluster's pools: billed, and in no pool".into(),
            by: "reconcile".into(),
        }));
        jobs.push(crate::jobs::DeleteMachineArgs::first(
            *machine_id,
            device.clone(),
            request,
        ));
    }
    events.extend(unplaced.held.into_iter().map(NewEvent::new));
    for d in &decided.delete {
        let request = Uuid::new_v4();
        tracing::info!(device = %d.member.device, pool = %d.pool, cause = d.cause.as_str(), "deleting a machine: {}", d.message);
        events.push(NewEvent::new(DeletionRequested {
            machine_id: d.member.machine_id,
            provider_id: d.member.device.clone(),
            reservation: Some(d.member.unit),
            pool: Some(d.pool.clone()),
            request,
            cause: d.cause.as_str().into(),
            message: d.message.clone(),
            by: "reconcile".into(),
        }));
        jobs.push(crate::jobs::DeleteMachineArgs::first(
            d.member.machine_id,
            d.member.device.clone(),
            request,
        ));
    }
    if events.is_empty() {
        return Ok(vec![]);
    }
    let mut tx = ctx.pool.begin().await?;
    record(
        &mut tx,
        events.into_iter().map(|e| e.caused_by(job_id)).collect(),
    )
    .await?;
    for args in &jobs {
        queue::push_delete_machine(&mut tx, args, None).await?;
    }
    tx.commit().await?;
    Ok(unplaced
        .delete
        .into_iter()
        .map(|(_, device, _)| device)
        .chain(decided.delete.into_iter().map(|d| d.member.device))
        .collect())
}

/// The cause of a managed machine's deletion that stands on no place of
/// the cluster's pools (adopted by hand on a name beyond any place, say).
pub const UNPLACED: &str = "unplaced";

/// The name such machines are reported under where a pool's would be.
const NO_PLACE: &str = "(no place)";

/// What a pass does with managed machines on no place of the pools.
struct Unplaced {
    /// (machine id, device, unit) of each one to delete.
    delete: Vec<(Uuid, String, Option<Uuid>)>,
    /// What the guards held back, said.
    held: Vec<DeletionsHeld>,
}

/// A managed machine the provider lists on no place of the cluster's
/// pools serves no pool and is billed: it is reported, and deleted within
/// the guards (not while deletions are paused, never a protected one, and
/// no more a period than the deletion budget's minimum), its cause checked
/// again before the DELETE as every other's.
async fn unplaced(
    ctx: &JobContext,
    settings: &crate::cluster::ClusterSettings,
    run: Uuid,
    devices: &[crate::provider::Machine],
    fleet: &pass::Fleet,
    paused: bool,
) -> Result<Unplaced, JobError> {
    let mut out = Unplaced {
        delete: vec![],
        held: vec![],
    };
    let mut found: Vec<(Uuid, String, Option<Uuid>, bool)> = devices
        .iter()
        .filter(|d| d.unit.and_then(|u| ctx.provider.unit_place(u)).is_none())
        .filter_map(|d| {
            let &(machine_id, protected) = fleet.machines.get(&d.id)?;
            (!fleet.leaving.contains(&machine_id))
                .then(|| (machine_id, d.id.clone(), d.unit, protected))
        })
        .collect();
    if found.is_empty() {
        return Ok(out);
    }
    found.sort_by(|a, b| a.1.cmp(&b.1));
    for (_, device, _, _) in &found {
        tracing::warn!(%device, "a managed machine stands on no place of the cluster's pools");
    }
    let protected = found.iter().filter(|m| m.3).count() as u32;
    if protected > 0 {
        out.held.push(DeletionsHeld {
            run,
            pool: NO_PLACE.into(),
            held: protected,
            guard: "protected".into(),
            message: format!(
                "{protected} protected machine(s) stand on no place of the cluster's pools: they stay"
            ),
        });
    }
    let open: Vec<_> = found.into_iter().filter(|m| !m.3).collect();
    if open.is_empty() {
        return Ok(out);
    }
    if paused {
        out.held.push(DeletionsHeld {
            run,
            pool: NO_PLACE.into(),
            held: open.len() as u32,
            guard: "paused".into(),
            message: format!(
                "{} machine(s) on no place of the cluster's pools wait: deletions are paused",
                open.len()
            ),
        });
        return Ok(out);
    }
    let l = &settings.lifecycle;
    let period = chrono::TimeDelta::from_std(l.budget_period).unwrap_or(chrono::TimeDelta::MAX);
    let used: i64 = sqlx::query_scalar(
        "select count(*) from shepherd.events
         where event_type = 'deletion_requested' and body->>'cause' = $1
           and recorded_at > now() - $2",
    )
    .bind(UNPLACED)
    .bind(period)
    .fetch_one(&ctx.pool)
    .await?;
    let room = (l.budget_min as usize).saturating_sub(used.max(0) as usize);
    if open.len() > room {
        out.held.push(DeletionsHeld {
            run,
            pool: NO_PLACE.into(),
            held: (open.len() - room) as u32,
            guard: "budget".into(),
            message: format!(
                "{} machine(s) on no place of the cluster's pools wait for the next period \
                 (at most {} a period)",
                open.len() - room,
                l.budget_min
            ),
        });
    }
    out.delete = open
        .into_iter()
        .take(room)
        .map(|(id, device, unit, _)| (id, device, unit))
        .collect();
    Ok(out)
}
