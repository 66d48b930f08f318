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
use futures::future::BoxFuture;
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

/// How often a machine waiting for its leave hook asks again.
const LEAVE_POLL: Duration = Duration::from_secs(5);
/// How long one call to an HTTP leave hook may take.
const HOOK_TIMEOUT: Duration = Duration::from_secs(10);

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
    if leaving.deletion.cleared_at.is_none() && !args.unknown {
        match leave(ctx, &settings, args, &leaving, job_id).await? {
            Leave::Go => {}
            Leave::Done(outcome) => return Ok(outcome),
        }
    }
    let Some(unit) = leaving.unit else {
        return holding(ctx, &settings, args, &leaving, job_id, None).await;
    };
    let Some(lock) = PlaceLock::try_take(&ctx.pool, unit).await? else {
        let busy = ProviderError::new(
            ErrorClass::Transient,
            "another run holds the machine's unit; it is tried again later",
        );
        return retry_later(ctx, args, &busy).await;
    };
    let outcome = holding(ctx, &settings, args, &leaving, job_id, Some(&lock)).await;
    lock.release().await;
    outcome
}

async fn read(ctx: &JobContext, args: &DeleteMachineArgs) -> Result<Option<Leaving>, JobError> {
    let row: Option<(serde_json::Value, Option<String>, Option<Uuid>, bool)> = sqlx::query_as(
        "select to_jsonb(d), m.hostname, m.reservation_id, m.protected
         from shepherd.pending_deletions d
         join shepherd.managed_machines m on m.machine_id = d.machine_id
         where d.machine_id = $1 and d.request = $2",
    )
    .bind(args.machine_id)
    .bind(args.request.to_string())
    .fetch_optional(&ctx.pool)
    .await?;
    let Some((deletion, hostname, unit, protected)) = row else {
        return Ok(None);
    };
    let deletion: PendingDeletion = serde_json::from_value(deletion)
        .map_err(|e| JobError::Database(sqlx::Error::Decode(Box::new(e))))?;
    Ok(Some(Leaving {
        deletion,
        hostname,
        unit,
        protected,
    }))
}

enum Leave {
    /// The delete may be sent.
    Go,
    Done(DeleteOutcome),
}

/// The graceful leave: the leave hook's answer, or its deadline.
async fn leave(
    ctx: &JobContext,
    settings: &ClusterSettings,
    args: &DeleteMachineArgs,
    leaving: &Leaving,
    job_id: &str,
) -> Result<Leave, JobError> {
    let l = &settings.lifecycle;
    let hook = &l.leave_hook;
    if *hook == LeaveHook::None || (leaving.deletion.cause == "failed" && l.failed_skip_leave) {
        return Ok(Leave::Go);
    }
    if let LeaveHook::Http(url) = hook
        && call_hook(url, args, leaving).await
    {
        note(
            ctx,
            job_id,
            LeaveAcknowledged {
                machine_id: args.machine_id,
                provider_id: args.device.clone(),
                request: args.request,
                by: format!("hook:{url}"),
            },
        )
        .await?;
        return Ok(Leave::Go);
    }
    let deadline = leaving.deletion.requested_at
        + TimeDelta::from_std(l.leave_timeout).unwrap_or(TimeDelta::MAX);
    let now = Utc::now();
    if now < deadline {
        let until = (now + TimeDelta::from_std(LEAVE_POLL).unwrap_or_default()).min(deadline);
        return Ok(Leave::Done(wait_until(ctx, args, until).await?));
    }
    let action = l.leave_deadline;
    tracing::warn!(device = %args.device, action = action.as_str(), "the leave hook did not answer in time");
    note(
        ctx,
        job_id,
        LeaveTimedOut {
            machine_id: args.machine_id,
            provider_id: args.device.clone(),
            request: args.request,
            action: action.as_str().into(),
        },
    )
    .await?;
    Ok(match action {
        LeaveDeadline::Proceed => Leave::Go,
        LeaveDeadline::GiveUp => Leave::Done(DeleteOutcome::Failed {
            reason: format!(
                "the leave hook did not answer within {}; the machine stays",
                crate::config::format_duration(l.leave_timeout)
            ),
        }),
    })
}

/// POSTs the leaving machine to the hook; a 2xx answer lets it go.
async fn call_hook(url: &str, args: &DeleteMachineArgs, leaving: &Leaving) -> bool {
    let body = serde_json::json!({
        "machine_id": args.machine_id,
        "device": args.device,
        "hostname": leaving.hostname,
        "pool": leaving.deletion.pool,
        "cause": leaving.deletion.cause,
        "message": leaving.deletion.message,
        "request": args.request,
    });
    let client = match reqwest::Client::builder().timeout(HOOK_TIMEOUT).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "cannot build the leave hook's HTTP client");
            return false;
        }
    };
    match client.post(url).json(&body).send().await {
        Ok(r) if r.status().is_success() => true,
        Ok(r) => {
            tracing::info!(device = %args.device, status = r.status().as_u16(), "the leave hook does not let the machine go yet");
            false
        }
        Err(e) => {
            tracing::warn!(device = %args.device, error = %crate::provider::discipline::describe_transport_error(&e), "the leave hook did not answer");
            false
        }
    }
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
    if let Some(reason) = still_wanted(ctx, args, leaving).await? {
        return cancel(ctx, args, job_id, reason).await;
    }
    let paused: Option<(String, String)> = sqlx::query_as(
        "select by, reason from shepherd.controls where name = 'deletions' and paused",
    )
    .fetch_optional(&ctx.pool)
    .await?;
    if paused.is_some() {
        let until = Utc::now() + TimeDelta::from_std(LEAVE_POLL * 6).unwrap_or_default();
        return wait_until(ctx, args, until).await;
    }
    // A delete whose answer was not seen may have done its work: look first.
    if args.unknown {
        match ctx.provider.machine(&args.device).await {
            Err(e) if e.not_found() => {
                return deleted(ctx, settings, args, leaving, job_id, false).await;
            }
            Err(e) => return unresolved(ctx, args, job_id, &format!("looking failed: {e}")).await,
            Ok(_) => {}
        }
    }
    let fence = DeletionFence {
        lock,
        pool: &ctx.pool,
        machine: args.machine_id,
        request: args.request.to_string(),
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
        Ok(d) => deleted(ctx, settings, args, leaving, job_id, d.already_gone).await,
        Err(e) if matches!(e.class, ErrorClass::Ambiguous | ErrorClass::Cancelled) => {
            unresolved(ctx, args, job_id, &e.to_string()).await
        }
        Err(e) if matches!(e.class, ErrorClass::Transient | ErrorClass::RateLimited) => {
            if args.attempt < ctx.config.create_retry.max_attempts {
                retry_later(ctx, args, &e).await
            } else {
                failed(
                    ctx,
                    args,
                    job_id,
                    format!("gave up after {} attempts: {e}", args.attempt),
                )
                .await
            }
        }
        Err(e) => failed(ctx, args, job_id, e.to_string()).await,
    }
}

/// Why the deletion no longer holds, if it does not: what the pass decided
/// is checked again now, under the unit's lock.
async fn still_wanted(
    ctx: &JobContext,
    args: &DeleteMachineArgs,
    leaving: &Leaving,
) -> Result<Option<String>, JobError> {
    if leaving.protected {
        return Ok(Some("the machine is protected".into()));
    }
    match leaving.deletion.cause.as_str() {
        "surplus" | "pool_removed" => {
            let Some(pool) = &leaving.deletion.pool else {
                return Ok(None);
            };
            let declared = crate::pools::declared(&ctx.pool).await?;
            let count = declared
                .iter()
                .find(|d| d.pool.name == *pool)
                .map_or(0, |d| if d.removed { 0 } else { d.pool.count });
            // The pool's managed machines, those leaving for other reasons
            // not counted: this one still goes only if the rest are more
            // than the count.
            let rows: Vec<(Option<Uuid>, bool)> = sqlx::query_as(
                "select m.reservation_id,
                        exists(select 1 from shepherd.pending_deletions d
                               where d.machine_id = m.machine_id and d.machine_id <> $1)
                 from shepherd.managed_machines m where m.machine_id <> $1",
            )
            .bind(args.machine_id)
            .fetch_all(&ctx.pool)
            .await?;
            let others = rows
                .iter()
                .filter(|(unit, leaving)| {
                    !leaving
                        && unit
                            .and_then(|u| ctx.provider.unit_place(u))
                            .is_some_and(|(p, _)| p == *pool)
                })
                .count() as u32;
            Ok((others < count)
                .then(|| format!("pool {pool} no longer holds more than its count of {count}")))
        }
        "failed" | "not_ready" => match ctx.provider.machine(&args.device).await {
            Ok(facts) if !facts.failed && leaving.deletion.cause == "failed" => {
                Ok(Some("its deployment no longer reads as failed".into()))
            }
            _ => Ok(None),
        },
        _ => Ok(None),
    }
}

/// The fence of a deletion: the unit's lock still holds (where there is a
/// unit), the deletion is still this request's, the machine is not
/// protected, and deletions are not paused.
struct DeletionFence<'a> {
    lock: Option<&'a PlaceLock>,
    pool: &'a sqlx::PgPool,
    machine: Uuid,
    request: String,
}

impl Fence for DeletionFence<'_> {
    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            if let Some(lock) = self.lock {
                lock.standing().await?;
            }
            let (ours, protected, paused): (bool, bool, bool) = sqlx::query_as(
                "select exists(select 1 from shepherd.pending_deletions
                               where machine_id = $1 and request = $2),
                        coalesce((select protected from shepherd.managed_machines
                                  where machine_id = $1), false),
                        exists(select 1 from shepherd.controls where name = 'deletions' and paused)",
            )
            .bind(self.machine)
            .bind(&self.request)
            .fetch_one(self.pool)
            .await
            .map_err(|e| format!("the deletion could not be checked: {e}"))?;
            if !ours {
                Err("the deletion has ended or another owns it".into())
            } else if protected {
                Err("the machine is protected now".into())
            } else if paused {
                Err("deletions are paused now".into())
            } else {
                Ok(())
            }
        })
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
) -> Result<DeleteOutcome, JobError> {
    let mut tx = ctx.pool.begin().await?;
    let mut events = vec![NewEvent::new(MachineDeleted {
        machine_id: args.machine_id,
        provider: ctx.provider.name().into(),
        provider_id: args.device.clone(),
        reservation: leaving.unit,
        request: args.request,
        already_gone,
    })];
    let replaced = matches!(leaving.deletion.cause.as_str(), "failed" | "not_ready");
    if let (true, Some(unit)) = (replaced, leaving.unit) {
        let scope = ctx.provider.unit_scope(unit);
        let recent = match (&scope, &leaving.deletion.pool) {
            (Some(scope), Some(_)) => failures_in_scope(ctx, settings, scope).await?,
            _ => 0,
        };
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
    args: &DeleteMachineArgs,
    job_id: &str,
    reason: String,
) -> Result<DeleteOutcome, JobError> {
    tracing::info!(device = %args.device, %reason, "deletion cancelled");
    note(
        ctx,
        job_id,
        DeletionCancelled {
            machine_id: args.machine_id,
            provider_id: args.device.clone(),
            request: args.request,
            reason: reason.clone(),
            by: "shepherd".into(),
        },
    )
    .await?;
    Ok(DeleteOutcome::Cancelled { reason })
}

async fn failed(
    ctx: &JobContext,
    args: &DeleteMachineArgs,
    job_id: &str,
    reason: String,
) -> Result<DeleteOutcome, JobError> {
    tracing::warn!(device = %args.device, %reason, "deletion failed; the machine stays managed");
    note(
        ctx,
        job_id,
        DeletionFailed {
            machine_id: args.machine_id,
            provider_id: args.device.clone(),
            request: args.request,
            message: reason.clone(),
        },
    )
    .await?;
    Ok(DeleteOutcome::Failed { reason })
}

async fn retry_later(
    ctx: &JobContext,
    args: &DeleteMachineArgs,
    e: &ProviderError,
) -> Result<DeleteOutcome, JobError> {
    let next_attempt = args.attempt + 1;
    let after = ctx.config.create_retry.backoff(next_attempt);
    tracing::info!(device = %args.device, error = %e, "deletion will be tried again");
    successor(ctx, args, next_attempt, args.unknown, after).await?;
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
    let next_attempt = args.attempt + 1;
    let after = ctx.config.create_retry.backoff(next_attempt);
    tracing::warn!(device = %args.device, %message, "deletion outcome unknown; a successor looks first");
    note(
        ctx,
        job_id,
        DeletionUnresolved {
            machine_id: args.machine_id,
            provider_id: args.device.clone(),
            request: args.request,
            message: message.to_string(),
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
    queue::push_delete_machine(
        &mut tx,
        &next,
        Some(Utc::now() + TimeDelta::from_std(after).unwrap_or(TimeDelta::MAX)),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

async fn note(ctx: &JobContext, job_id: &str, event: impl Into<Event>) -> Result<(), JobError> {
    let mut tx = ctx.pool.begin().await?;
    record(&mut tx, vec![NewEvent::new(event).caused_by(job_id)]).await?;
    tx.commit().await?;
    Ok(())
}
