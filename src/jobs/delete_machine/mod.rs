//! DeleteMachine: one attempt at deleting a managed machine whose deletion
//! was requested (a pass's surplus or replacement, or an operator's
//! `machines deprovision`), with the discipline of a creation:
//!
//! 1. The machine leaves gracefully: where the cluster has a leave hook
//!    (an acknowledgement through the CLI or SQL, or an HTTP endpoint), the
//!    delete waits for its answer up to `leave_timeout`, then does what
//!    `leave_deadline` says. A machine whose deployment failed runs nothing
//!    and may skip the wait (`failed_skip_leave`).
//! 2. The unit's lock is taken (`place.rs`): no creation or assimilation
//!    acts on the unit meanwhile, and a second run of the deletion waits.
//! 3. What the decision rested on is checked again (Karpenter's
//!    validation): the machine is still managed and not protected, deletions
//!    are running, and a surplus is still a surplus, a failed machine still
//!    failed.
//! 4. The delete is fenced: right before it leaves, the lock's own
//!    connection is asked whether the lock holds, the deletion is still
//!    this request's, the machine is not protected and deletions are not
//!    paused.
//! 5. The outcome is an event: `machine_deleted`, `deletion_failed`,
//!    `deletion_cancelled`, or, for an answer not seen, `deletion_unresolved`
//!    and a successor that looks the machine up before it sends again.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use uuid::Uuid;

use super::create_device::penalty_event;
use super::place::PlaceLock;
use super::queue;
use super::{DeleteMachineArgs, JobContext, JobError};
use crate::cluster::ClusterSettings;
use crate::config::{LeaveDeadline, LeaveHook};
use crate::events::event::*;
use crate::events::views::PendingDeletion;
use crate::events::{NewEvent, record};
use crate::provider::{ErrorClass, Fence, ProviderError};

mod leave;
mod recheck;

pub use leave::hook_signature;
use leave::{LEAVE_POLL, Leave, deletions_paused, leave, tell_hook_it_stays};
use recheck::{DeletionFence, Recheck, recheck};

/// The decision an attempt reached.
#[derive(Debug, Clone, PartialEq)]
pub enum DeleteOutcome {
    Deleted {
        already_gone: bool,
    },
    /// Waiting for the leave hook (or the pause for deletions) until about
    /// `until`; a successor asks again.
    Waiting {
        until: DateTime<Utc>,
    },
    Retrying {
        next_attempt: u32,
        after: Duration,
    },
    /// The answer was not seen; a successor looks the machine up.
    Unresolved {
        next_attempt: u32,
        after: Duration,
    },
    /// Refused by the provider, or given up at the leave hook's deadline.
    Failed {
        reason: String,
    },
    /// What it rested on no longer holds.
    Cancelled {
        reason: String,
    },
    /// Not this request's deletion (a duplicate run, or one already ended).
    Skipped {
        reason: String,
    },
}

impl DeleteOutcome {
    /// Logs the outcome with one field per fact, as `CreateOutcome::log`.
    pub fn log(&self) {
        const DONE: &str = "delete_machine finished";
        match self {
            DeleteOutcome::Deleted { already_gone } => {
                tracing::info!(outcome = "deleted", already_gone, "{DONE}")
            }
            DeleteOutcome::Waiting { until } => {
                tracing::info!(outcome = "waiting", %until, "{DONE}")
            }
            DeleteOutcome::Retrying {
                next_attempt,
                after,
            } => tracing::info!(
                outcome = "retrying",
                next_attempt,
                after_ms = after.as_millis() as u64,
                "{DONE}"
            ),
            DeleteOutcome::Unresolved {
                next_attempt,
                after,
            } => tracing::info!(
                outcome = "unresolved",
                next_attempt,
                after_ms = after.as_millis() as u64,
                "{DONE}"
            ),
            DeleteOutcome::Failed { reason } => {
                tracing::info!(outcome = "failed", %reason, "{DONE}")
            }
            DeleteOutcome::Cancelled { reason } => {
                tracing::info!(outcome = "cancelled", %reason, "{DONE}")
            }
            DeleteOutcome::Skipped { reason } => {
                tracing::info!(outcome = "skipped", %reason, "{DONE}")
            }
        }
    }
}

/// The machine as the deletion sees it, read with its pending deletion.
struct Leaving {
    deletion: PendingDeletion,
    hostname: Option<String>,
    unit: Option<Uuid>,
    protected: bool,
    /// A pass has seen the machine ready (`machine_ready`).
    ready_once: bool,
}

pub async fn delete_machine(
    ctx: &JobContext,
    args: &DeleteMachineArgs,
    job_id: &str,
) -> Result<DeleteOutcome, JobError> {
    let settings = ctx.settings().await?;
    // As for a creation: apalis counts a run when it ends or is handed
    // back, so attempts above 0 means this row ran before.
    let rerun: Option<bool> =
        sqlx::query_scalar("select attempts > 0 from apalis.jobs where id = $1")
            .bind(job_id)
            .fetch_optional(&ctx.pool)
            .await?;
    // A second run of this row may follow a delete nobody saw answered.
    let args = &DeleteMachineArgs {
        unknown: args.unknown || rerun.unwrap_or(false),
        ..args.clone()
    };
    let Some(leaving) = read(ctx, args).await? else {
        return Ok(DeleteOutcome::Skipped {
            reason: "no deletion of this request is pending for the machine".into(),
        });
    };
    // The leave hook is a promise kept on every path: whether it was kept
    // is the deletion's durable state (`cleared_at`: acknowledged, or timed
    // out with "proceed"), never a guess from this run's history. A rerun,
    // a swept deletion or another worker asks the hook again until then.
    if leaving.deletion.cleared_at.is_none() {
        match leave(ctx, &settings, args, &leaving, job_id).await? {
            Leave::Go => {}
            Leave::Done(outcome) => return Ok(outcome),
        }
    }
    let Some(unit) = leaving.unit else {
        return holding(ctx, &settings, args, &leaving, job_id, None).await;
    };
    let Some(lock) = PlaceLock::try_take(&ctx.pool, unit, ctx.lease_term()).await? else {
        let busy = ProviderError::new(
            ErrorClass::Transient,
            "another run holds the machine's unit; it is tried again later",
        );
        return retry_later(ctx, args, &busy, Tried::Nothing).await;
    };
    let outcome = holding(ctx, &settings, args, &leaving, job_id, Some(&lock)).await;
    lock.release().await;
    outcome
}

/// The deletion and its machine. The job's device must be the machine's
/// and the deletion's: the row found by the machine's id is no licence to
/// delete another device. Protection as the log has it too (the latest on
/// the device's stream, whichever of its managed lives recorded it): the
/// view's flag is a table a worker's role writes, the log's events only an
/// operator records. "Ready once" follows the device as well.
static READ: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "select to_jsonb(d), m.hostname, m.reservation_id, {}, {}
         from shepherd.pending_deletions d
         join shepherd.managed_machines m on m.machine_id = d.machine_id
         where d.machine_id = $1 and d.request = $2
           and d.provider_id = $3 and m.provider_id = $3",
        crate::fleet::PROTECTED,
        crate::fleet::READY_ONCE
    )
});

async fn read(ctx: &JobContext, args: &DeleteMachineArgs) -> Result<Option<Leaving>, JobError> {
    type Row = (serde_json::Value, Option<String>, Option<Uuid>, bool, bool);
    let row: Option<Row> = sqlx::query_as(sqlx::AssertSqlSafe(READ.as_str()))
        .bind(args.machine_id)
        .bind(args.request.to_string())
        .bind(&args.device)
        .fetch_optional(&ctx.pool)
        .await?;
    let Some((deletion, hostname, unit, protected, ready_once)) = row else {
        return Ok(None);
    };
    let deletion: PendingDeletion = serde_json::from_value(deletion)
        .map_err(|e| JobError::Database(sqlx::Error::Decode(Box::new(e))))?;
    Ok(Some(Leaving {
        deletion,
        hostname,
        unit,
        protected,
        ready_once,
    }))
}

/// The deletion proper, while `lock` (if the machine has a unit) holds it.
async fn holding(
    ctx: &JobContext,
    settings: &ClusterSettings,
    args: &DeleteMachineArgs,
    leaving: &Leaving,
    job_id: &str,
    lock: Option<&PlaceLock>,
) -> Result<DeleteOutcome, JobError> {
    let pool_then = match recheck(ctx, args, leaving).await? {
        Recheck::Holds(pool_then) => pool_then,
        Recheck::NoLonger(reason) => {
            return cancel(ctx, settings, args, leaving, job_id, reason, lock).await;
        }
        Recheck::CannotTell(reason) => {
            // No positive evidence either way: the machine stays, and the
            // deletion asks again later.
            tracing::warn!(device = %args.device, %reason, "the deletion's cause could not be checked again; the machine stays for now");
            let e = ProviderError::new(ErrorClass::Transient, reason);
            return retry_later(ctx, args, &e, Tried::Nothing).await;
        }
        // The look was the one a run after an unseen delete needs too.
        Recheck::NotFound(message) => {
            return not_found(ctx, settings, args, leaving, job_id, &message, lock).await;
        }
    };
    if deletions_paused(ctx).await? || held_by_discrepancy(ctx, leaving).await? {
        let until = Utc::now() + TimeDelta::from_std(LEAVE_POLL * 6).unwrap_or_default();
        return wait_until(ctx, args, until).await;
    }
    let fence = DeletionFence {
        lock,
        pool: &ctx.pool,
        machine: args.machine_id,
        request: args.request.to_string(),
        pool_then,
    };
    let result = tokio::time::timeout(
        ctx.config.create_retry.timeout,
        ctx.provider.delete(&args.device, &fence),
    )
    .await
    .unwrap_or_else(|_| {
        Err(ProviderError::new(
            ErrorClass::Cancelled,
            "deleteMachine: deadline exceeded",
        ))
    });
    match result {
        Ok(d) if d.not_found => {
            let message = "the DELETE was answered \"not found\"";
            not_found(ctx, settings, args, leaving, job_id, message, lock).await
        }
        Ok(_) => deleted(ctx, settings, args, leaving, job_id, false, lock).await,
        Err(e) if matches!(e.class, ErrorClass::Ambiguous | ErrorClass::Cancelled) => {
            unresolved(ctx, args, job_id, &e.to_string()).await
        }
        Err(e) if matches!(e.class, ErrorClass::Transient | ErrorClass::RateLimited) => {
            if args.tries() < ctx.config.create_retry.max_attempts {
                retry_later(ctx, args, &e, Tried::Delete).await
            } else {
                let outcome = failed(
                    ctx,
                    args,
                    job_id,
                    format!("gave up after {} attempts: {e}", args.tries()),
                    lock,
                )
                .await;
                tell_hook_it_stays(ctx, settings, args, leaving).await;
                outcome
            }
        }
        Err(e) => {
            let outcome = failed(ctx, args, job_id, e.to_string(), lock).await;
            tell_hook_it_stays(ctx, settings, args, leaving).await;
            outcome
        }
    }
}

/// A pass's deletion waits while the latest pass held its pool for a
/// server on one of its places that nothing proves ours (or refused the
/// whole cluster for one): what a pool holds is in question, so nothing of
/// it is shed or replaced until that is explained, those already requested
/// included. An operator's deletion names its machine and goes on.
async fn held_by_discrepancy(ctx: &JobContext, leaving: &Leaving) -> Result<bool, JobError> {
    if leaving.deletion.cause == "operator" {
        return Ok(false);
    }
    let Some(pool) = &leaving.deletion.pool else {
        return Ok(false);
    };
    Ok(sqlx::query_scalar(
        "with last as (
             select 'reconcile/' || (body->>'run') as stream from shepherd.events
             where event_type = 'reconcile_started' order by position desc limit 1)
         select exists(
             select 1 from shepherd.events e join last on e.stream = last.stream
             where (e.event_type = 'deletions_held' and e.body->>'guard' = 'discrepancy'
                    and e.body->>'pool' = $1)
                or (e.event_type = 'discrepancy_found'
                    and jsonb_array_length(coalesce(e.body->'unknown_devices', '[]')) > 0
                    and exists (select 1 from shepherd.events r
                                where r.stream = e.stream and r.event_type = 'reconcile_refused')))",
    )
    .bind(pool)
    .fetch_one(&ctx.pool)
    .await?)
}

/// The provider said it does not know the machine: gone only when that
/// is confirmed (`jobs::gone`); until then the machine stays managed, and
/// the deletion asks again after the gap.
async fn not_found(
    ctx: &JobContext,
    settings: &ClusterSettings,
    args: &DeleteMachineArgs,
    leaving: &Leaving,
    job_id: &str,
    message: &str,
    lock: Option<&PlaceLock>,
) -> Result<DeleteOutcome, JobError> {
    let verdict = crate::jobs::gone::not_found(
        ctx,
        settings,
        job_id,
        args.request,
        args.machine_id,
        &args.device,
        message,
        crate::jobs::gone::Listing::Ask,
    )
    .await?;
    match verdict {
        crate::jobs::gone::Verdict::Gone { evidence } => {
            tracing::warn!(device = %args.device, %evidence, "the machine is gone: recorded deleted");
            // After a delete whose answer was not seen, ours did the work.
            deleted(ctx, settings, args, leaving, job_id, !args.unknown, lock).await
        }
        crate::jobs::gone::Verdict::NotYet { after, why } => {
            tracing::warn!(device = %args.device, %why, "the provider answered \"not found\"; the machine stays managed until that is confirmed");
            let until = Utc::now() + TimeDelta::from_std(after).unwrap_or_default();
            wait_until(ctx, args, until).await
        }
    }
}

/// The machine is gone: no longer managed, its unit free. A replaced
/// machine's place is penalised (growing with each failure, so that a plan
/// that always fails does not churn money), and the plan at the site too
/// when its deployments keep failing.
async fn deleted(
    ctx: &JobContext,
    settings: &ClusterSettings,
    args: &DeleteMachineArgs,
    leaving: &Leaving,
    job_id: &str,
    already_gone: bool,
    lock: Option<&PlaceLock>,
) -> Result<DeleteOutcome, JobError> {
    let replaced = matches!(leaving.deletion.cause.as_str(), "failed" | "not_ready");
    let unit = leaving.unit.filter(|_| replaced);
    let scope = unit.and_then(|u| ctx.provider.unit_scope(u));
    // Counted before the transaction takes its connection: a job that held
    // one while asking the pool for another could wait for good beside
    // another doing the same, on a worker's pool of two.
    let recent = match (&scope, &leaving.deletion.pool) {
        (Some(scope), Some(_)) => failures_in_scope(ctx, settings, scope).await?,
        _ => 0,
    };
    let mut tx = ctx.pool.begin().await?;
    if let Some(why) = not_ours_now(&mut tx, args, lock).await? {
        drop(tx);
        let saw = if already_gone {
            "the machine was found gone"
        } else {
            "its DELETE was accepted"
        };
        return late(ctx, args, job_id, &format!("{saw}, but {why}")).await;
    }
    let mut events = vec![NewEvent::new(MachineDeleted {
        machine_id: args.machine_id,
        provider: ctx.provider.name().into(),
        provider_id: args.device.clone(),
        reservation: leaving.unit,
        request: args.request,
        already_gone,
    })];
    if let Some(unit) = unit {
        let cause = format!(
            "machine {} was replaced: {}",
            args.device, leaving.deletion.message
        );
        // Three replacements of one plan at one site within a penalty: the
        // plan keeps failing there, and the whole of it waits.
        let scope = scope.filter(|_| recent >= SCOPE_FAILURES);
        events.push(
            penalty_event(
                settings,
                &mut tx,
                unit,
                &cause,
                ErrorClass::Permanent,
                scope,
            )
            .await?,
        );
    }
    record(
        &mut tx,
        events.into_iter().map(|e| e.caused_by(job_id)).collect(),
    )
    .await?;
    tx.commit().await?;
    Ok(DeleteOutcome::Deleted { already_gone })
}

/// Replacements of one plan at one site within a penalty after which the
/// whole of it is penalised.
const SCOPE_FAILURES: i64 = 3;

/// Replacements requested lately for pools drawing on `scope`.
async fn failures_in_scope(
    ctx: &JobContext,
    settings: &ClusterSettings,
    scope: &str,
) -> Result<i64, JobError> {
    let pools: Vec<String> = crate::pools::declared(&ctx.pool)
        .await?
        .into_iter()
        .filter(|d| format!("{}@{}", d.pool.plan, d.pool.site) == scope)
        .map(|d| d.pool.name)
        .collect();
    let window = TimeDelta::from_std(settings.penalty.initial).unwrap_or(TimeDelta::MAX);
    Ok(sqlx::query_scalar(
        "select count(*) from shepherd.events
         where event_type = 'deletion_requested' and body->>'cause' in ('failed', 'not_ready')
           and body->>'pool' = any($1) and recorded_at > now() - $2",
    )
    .bind(&pools)
    .bind(window)
    .fetch_one(&ctx.pool)
    .await?)
}

async fn cancel(
    ctx: &JobContext,
    settings: &ClusterSettings,
    args: &DeleteMachineArgs,
    leaving: &Leaving,
    job_id: &str,
    reason: String,
    lock: Option<&PlaceLock>,
) -> Result<DeleteOutcome, JobError> {
    let reason = crate::text::bounded(&reason, 1000);
    let mut tx = ctx.pool.begin().await?;
    if let Some(why) = not_ours_now(&mut tx, args, lock).await? {
        drop(tx);
        let saw = format!("it would cancel the deletion ({reason}), but {why}");
        return late(ctx, args, job_id, &saw).await;
    }
    tracing::warn!(device = %args.device, %reason, "deletion cancelled: the machine stays");
    let event = DeletionCancelled {
        machine_id: args.machine_id,
        provider_id: args.device.clone(),
        request: args.request,
        reason: reason.clone(),
        by: "shepherd".into(),
    };
    record(&mut tx, vec![NewEvent::new(event).caused_by(job_id)]).await?;
    tx.commit().await?;
    tell_hook_it_stays(ctx, settings, args, leaving).await;
    Ok(DeleteOutcome::Cancelled { reason })
}

async fn failed(
    ctx: &JobContext,
    args: &DeleteMachineArgs,
    job_id: &str,
    reason: String,
    lock: Option<&PlaceLock>,
) -> Result<DeleteOutcome, JobError> {
    let mut tx = ctx.pool.begin().await?;
    if let Some(why) = not_ours_now(&mut tx, args, lock).await? {
        drop(tx);
        let saw = format!("it would give the deletion up ({reason}), but {why}");
        return late(ctx, args, job_id, &saw).await;
    }
    tracing::warn!(device = %args.device, %reason, "deletion failed; the machine stays managed");
    let event = DeletionFailed {
        machine_id: args.machine_id,
        provider_id: args.device.clone(),
        request: args.request,
        message: reason.clone(),
    };
    record(&mut tx, vec![NewEvent::new(event).caused_by(job_id)]).await?;
    tx.commit().await?;
    Ok(DeleteOutcome::Failed { reason })
}

/// Whether a run that asks again later tried the delete (a transient
/// answer), or only could not get to it (the unit busy, the machine
/// unreadable): the latter is a wait, and uses up none of the delete's
/// tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tried {
    Delete,
    Nothing,
}

async fn retry_later(
    ctx: &JobContext,
    args: &DeleteMachineArgs,
    e: &ProviderError,
    tried: Tried,
) -> Result<DeleteOutcome, JobError> {
    let next_attempt = args.attempt + 1;
    let next = DeleteMachineArgs {
        waits: args.waits + u32::from(tried == Tried::Nothing),
        ..args.clone()
    };
    // A wait backs off with the waits (to a cap), a try with the attempts.
    let after = ctx.config.create_retry.backoff(match tried {
        Tried::Delete => next_attempt,
        Tried::Nothing => next.waits.min(10),
    });
    tracing::info!(device = %args.device, error = %e, ?tried, "deletion will be tried again");
    successor(ctx, &next, next_attempt, args.unknown, after).await?;
    Ok(DeleteOutcome::Retrying {
        next_attempt,
        after,
    })
}

async fn unresolved(
    ctx: &JobContext,
    args: &DeleteMachineArgs,
    job_id: &str,
    message: &str,
) -> Result<DeleteOutcome, JobError> {
    tracing::warn!(device = %args.device, %message, "deletion outcome unknown; a successor looks first");
    unknown_from_now(ctx, args, job_id, message, false).await
}

/// Why this run may no longer end its deletion, if it may not: its unit's
/// lease is no longer its own by the database's clock (it stalled past
/// it), or the deletion is no longer pending under its request (another
/// run cancelled or ended it meanwhile). Both rows stay locked until the
/// transaction ends.
async fn not_ours_now(
    tx: &mut sqlx::PgConnection,
    args: &DeleteMachineArgs,
    lock: Option<&PlaceLock>,
) -> Result<Option<&'static str>, JobError> {
    if let Some(lock) = lock
        && !lock.held_in(&mut *tx).await?
    {
        return Ok(Some("this run's lease on the unit was lost"));
    }
    let pending: Option<i32> = sqlx::query_scalar(
        "select 1 from shepherd.pending_deletions
         where machine_id = $1 and request = $2 for update",
    )
    .bind(args.machine_id)
    .bind(args.request.to_string())
    .fetch_optional(&mut *tx)
    .await?;
    Ok(pending
        .is_none()
        .then_some("the deletion is no longer pending under this run's request"))
}

/// This run's outcome came when it no longer owned the deletion: what it
/// saw is recorded as unresolved and nothing is ended or freed. A
/// successor looks (and finds the deletion gone if it ended another way);
/// a machine a late DELETE took away is found missing by the passes and
/// replaced, as any machine lost.
async fn late(
    ctx: &JobContext,
    args: &DeleteMachineArgs,
    job_id: &str,
    saw: &str,
) -> Result<DeleteOutcome, JobError> {
    let message = format!("this run no longer owned the deletion when its answer came: {saw}");
    tracing::error!(device = %args.device, request = %args.request, %message, "a deletion's outcome came after it lost its lease");
    unknown_from_now(ctx, args, job_id, &message, true).await
}

async fn unknown_from_now(
    ctx: &JobContext,
    args: &DeleteMachineArgs,
    job_id: &str,
    message: &str,
    lease_lost: bool,
) -> Result<DeleteOutcome, JobError> {
    let next_attempt = args.attempt + 1;
    let after = ctx.config.create_retry.backoff(next_attempt);
    note(
        ctx,
        job_id,
        DeletionUnresolved {
            machine_id: args.machine_id,
            provider_id: args.device.clone(),
            request: args.request,
            message: crate::text::bounded(message, 1000),
            lease_lost,
        },
    )
    .await?;
    successor(ctx, args, next_attempt, true, after).await?;
    Ok(DeleteOutcome::Unresolved {
        next_attempt,
        after,
    })
}

/// Asks again later, at `until`, under the next attempt's key (waiting is
/// not failing: the attempt count only names the job).
async fn wait_until(
    ctx: &JobContext,
    args: &DeleteMachineArgs,
    until: DateTime<Utc>,
) -> Result<DeleteOutcome, JobError> {
    let after = (until - Utc::now()).to_std().unwrap_or_default();
    let args = &DeleteMachineArgs {
        waits: args.waits + 1,
        ..args.clone()
    };
    successor(ctx, args, args.attempt + 1, args.unknown, after).await?;
    Ok(DeleteOutcome::Waiting { until })
}

async fn successor(
    ctx: &JobContext,
    args: &DeleteMachineArgs,
    attempt: u32,
    unknown: bool,
    after: Duration,
) -> Result<(), JobError> {
    let next = DeleteMachineArgs {
        attempt,
        unknown,
        ..args.clone()
    };
    let mut tx = ctx.pool.begin().await?;
    queue::push_delete_machine(&mut tx, &next, Some(after)).await?;
    tx.commit().await?;
    Ok(())
}

async fn note(ctx: &JobContext, job_id: &str, event: impl Into<Event>) -> Result<(), JobError> {
    let mut tx = ctx.pool.begin().await?;
    record(&mut tx, vec![NewEvent::new(event).caused_by(job_id)]).await?;
    tx.commit().await?;
    Ok(())
}
