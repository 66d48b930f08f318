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
    let Some(lock) = PlaceLock::try_take(&ctx.pool, unit).await? else {
        let busy = ProviderError::new(
            ErrorClass::Transient,
            "another run holds the machine's unit; it is tried again later",
        );
        return look_again_later(ctx, args, &busy).await;
    };
    let outcome = holding(ctx, &settings, args, &leaving, job_id, Some(&lock)).await;
    lock.release().await;
    outcome
}

async fn read(ctx: &JobContext, args: &DeleteMachineArgs) -> Result<Option<Leaving>, JobError> {
    type Row = (serde_json::Value, Option<String>, Option<Uuid>, bool, bool);
    let row: Option<Row> = sqlx::query_as(
        "select to_jsonb(d), m.hostname, m.reservation_id, m.protected, m.ready_at is not null
         from shepherd.pending_deletions d
         join shepherd.managed_machines m on m.machine_id = d.machine_id
         where d.machine_id = $1 and d.request = $2",
    )
    .bind(args.machine_id)
    .bind(args.request.to_string())
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
    // Pausing deletions pauses the hooks: no machine is asked to drain for
    // a delete that is not going to be sent.
    if deletions_paused(ctx).await? {
        let until = Utc::now() + TimeDelta::from_std(LEAVE_POLL * 6).unwrap_or_default();
        return Ok(Leave::Done(wait_until(ctx, args, until).await?));
    }
    // Asked from now on: the deadline counts from the first ask, durably,
    // whoever asks next.
    let asked_at = match leaving.deletion.asked_at {
        Some(at) => at,
        None => {
            note(
                ctx,
                job_id,
                LeaveAsked {
                    machine_id: args.machine_id,
                    provider_id: args.device.clone(),
                    request: args.request,
                    by: match hook {
                        LeaveHook::Http(url) => format!("hook:{}", hook_host(url)),
                        _ => "ack".into(),
                    },
                },
            )
            .await?;
            Utc::now()
        }
    };
    if let LeaveHook::Http(url) = hook {
        match call_hook(ctx, url, HookCall::Leaving, args, leaving).await {
            HookAnswer::Done => {
                note(
                    ctx,
                    job_id,
                    LeaveAcknowledged {
                        machine_id: args.machine_id,
                        provider_id: args.device.clone(),
                        request: args.request,
                        by: format!("hook:{}", hook_host(url)),
                    },
                )
                .await?;
                return Ok(Leave::Go);
            }
            HookAnswer::Draining | HookAnswer::NotYet => {}
        }
    }
    let deadline = asked_at + TimeDelta::from_std(l.leave_timeout).unwrap_or(TimeDelta::MAX);
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
        LeaveDeadline::GiveUp => {
            tell_hook_it_stays(ctx, settings, args, leaving).await;
            Leave::Done(DeleteOutcome::Failed {
                reason: format!(
                    "the leave hook did not answer within {}; the machine stays",
                    crate::config::format_duration(l.leave_timeout)
                ),
            })
        }
    })
}

/// What the deletion tells an HTTP leave hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HookCall {
    /// The machine is to leave: drain it, and answer when it may go.
    Leaving,
    /// The deletion was cancelled: the machine stays.
    Cancelled,
}

impl HookCall {
    fn as_str(self) -> &'static str {
        match self {
            HookCall::Leaving => "leaving",
            HookCall::Cancelled => "cancelled",
        }
    }
}

/// What an HTTP leave hook said. Only an explicit answer counts: 200 or
/// 204 is "done, the machine may go"; 202 is "still draining, ask again";
/// anything else (a redirect to a log-in page, an error, no answer) is no
/// consent, and the deadline decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HookAnswer {
    Done,
    Draining,
    NotYet,
}

/// The hook's host, as events and logs name it: the whole address may
/// carry a token in its path or query.
fn hook_host(url: &str) -> String {
    let host = reqwest::Url::parse(url)
        .ok()
        .and_then(|u| {
            let host = u.host_str()?.to_string();
            Some(match u.port() {
                Some(port) => format!("{host}:{port}"),
                None => host,
            })
        })
        .unwrap_or_else(|| "unparsable address".into());
    crate::text::bounded(&host, 255)
}

/// The signature of a hook request: HMAC-SHA256 of `<timestamp>.<body>`
/// under the cluster's hook secret, in hex, as `X-Shepherd-Signature:
/// sha256=<hex>` beside `X-Shepherd-Timestamp` (docs/pools.md): the hook
/// can tell shepherd's requests from anyone's, and a replayed one by its
/// age.
pub fn hook_signature(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// POSTs the machine to the hook, signed when the cluster has a secret,
/// redirects not followed (a hook behind a log-in proxy answers 302 to a
/// page that answers 200: no consent).
async fn call_hook(
    ctx: &JobContext,
    url: &str,
    call: HookCall,
    args: &DeleteMachineArgs,
    leaving: &Leaving,
) -> HookAnswer {
    let body = serde_json::json!({
        "event": call.as_str(),
        "machine_id": args.machine_id,
        "device": args.device,
        "hostname": leaving.hostname,
        "pool": leaving.deletion.pool,
        "cause": leaving.deletion.cause,
        "message": leaving.deletion.message,
        "request": args.request,
    });
    let host = hook_host(url);
    let client = match reqwest::Client::builder()
        .timeout(HOOK_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "cannot build the leave hook's HTTP client");
            return HookAnswer::NotYet;
        }
    };
    let body = body.to_string();
    let mut request = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json");
    if let Some(secret) = &ctx.config.leave_hook_secret {
        let timestamp = Utc::now().timestamp();
        let signature = hook_signature(secret.expose().as_bytes(), timestamp, body.as_bytes());
        request = request
            .header("x-shepherd-timestamp", timestamp.to_string())
            .header("x-shepherd-signature", format!("sha256={signature}"));
    }
    match request.body(body).send().await {
        Ok(r) => match r.status().as_u16() {
            200 | 204 => HookAnswer::Done,
            202 => {
                tracing::info!(device = %args.device, %host, "the leave hook is still draining the machine");
                HookAnswer::Draining
            }
            status => {
                tracing::warn!(device = %args.device, %host, status, event = call.as_str(), "the leave hook's answer is no consent (only 200 or 204 is; 202 means still draining)");
                HookAnswer::NotYet
            }
        },
        Err(e) => {
            tracing::warn!(device = %args.device, %host, error = %crate::provider::discipline::describe_transport_error(&e), "the leave hook did not answer");
            HookAnswer::NotYet
        }
    }
}

async fn deletions_paused(ctx: &JobContext) -> Result<bool, JobError> {
    Ok(sqlx::query_scalar(
        "select exists(select 1 from shepherd.controls where name = 'deletions' and paused)",
    )
    .fetch_one(&ctx.pool)
    .await?)
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
            return cancel(ctx, settings, args, leaving, job_id, reason).await;
        }
        Recheck::CannotTell(reason) => {
            // No positive evidence either way: the machine stays, and the
            // deletion asks again later.
            tracing::warn!(device = %args.device, %reason, "the deletion's cause could not be checked again; the machine stays for now");
            let e = ProviderError::new(ErrorClass::Transient, reason);
            return look_again_later(ctx, args, &e).await;
        }
    };
    if deletions_paused(ctx).await? {
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
        Ok(d) => deleted(ctx, settings, args, leaving, job_id, d.already_gone).await,
        Err(e) if matches!(e.class, ErrorClass::Ambiguous | ErrorClass::Cancelled) => {
            unresolved(ctx, args, job_id, &e.to_string()).await
        }
        Err(e) if matches!(e.class, ErrorClass::Transient | ErrorClass::RateLimited) => {
            if args.tries() < ctx.config.create_retry.max_attempts {
                retry_later(ctx, args, &e).await
            } else {
                let outcome = failed(
                    ctx,
                    args,
                    job_id,
                    format!("gave up after {} attempts: {e}", args.tries()),
                )
                .await;
                tell_hook_it_stays(ctx, settings, args, leaving).await;
                outcome
            }
        }
        Err(e) => {
            let outcome = failed(ctx, args, job_id, e.to_string()).await;
            tell_hook_it_stays(ctx, settings, args, leaving).await;
            outcome
        }
    }
}

/// What the last look before the delete found.
enum Recheck {
    /// The cause still holds; for a surplus, the pool as it stood then,
    /// which the fence holds the delete to.
    Holds(Option<PoolThen>),
    /// The cause no longer holds: the deletion is cancelled.
    NoLonger(String),
    /// The provider could not be asked: no evidence, so nothing is sent.
    CannotTell(String),
}

/// A pool's declared size when a surplus was checked again.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PoolThen {
    name: String,
    count: i32,
    removed: bool,
}

/// Checks again, under the unit's lock and against a fresh read of the
/// machine, that what the deletion rests on still holds (Karpenter
/// validates a disruption the same way just before it acts): the machine
/// is still ours and not protected, a failed one still failed, one never
/// ready still deploying and never ready, a surplus still a surplus
/// against what the provider lists now.
async fn recheck(
    ctx: &JobContext,
    args: &DeleteMachineArgs,
    leaving: &Leaving,
) -> Result<Recheck, JobError> {
    if leaving.protected {
        return Ok(Recheck::NoLonger("the machine is protected".into()));
    }
    let facts = match ctx.provider.machine(&args.device).await {
        Ok(facts) => Some(facts),
        // Gone already: the delete will find it so.
        Err(e) if e.not_found() => None,
        Err(e) => {
            return Ok(Recheck::CannotTell(format!(
                "the machine could not be read before its delete: {e}"
            )));
        }
    };
    if let Some(facts) = &facts {
        if let Some(foreign) = &facts.foreign {
            return Ok(Recheck::NoLonger(format!(
                "not provably ours any more: {foreign}"
            )));
        }
        if leaving.hostname.is_some() && facts.hostname != leaving.hostname {
            return Ok(Recheck::NoLonger(format!(
                "not provably ours any more: its hostname is {} now, not {}",
                facts
                    .hostname
                    .as_deref()
                    .map(crate::text::bounded_word)
                    .unwrap_or_else(|| "none".into()),
                leaving.hostname.as_deref().unwrap_or_default()
            )));
        }
    }
    let word = |f: &crate::provider::MachineFacts| {
        f.status
            .as_deref()
            .map(crate::text::bounded_word)
            .unwrap_or_else(|| "nothing".into())
    };
    match leaving.deletion.cause.as_str() {
        "failed" => match &facts {
            Some(f) if !f.failed() => Ok(Recheck::NoLonger(format!(
                "its deployment no longer reads as failed (the provider says {})",
                word(f)
            ))),
            _ => Ok(Recheck::Holds(None)),
        },
        "not_ready" => match &facts {
            _ if leaving.ready_once => Ok(Recheck::NoLonger(
                "it was ready once: a machine that ran is not replaced as never ready".into(),
            )),
            Some(f) if f.condition != crate::provider::Condition::Deploying => {
                Ok(Recheck::NoLonger(format!(
                    "it is no longer deploying (the provider says {})",
                    word(f)
                )))
            }
            _ => Ok(Recheck::Holds(None)),
        },
        "surplus" | "pool_removed" => surplus_holds(ctx, args, leaving).await,
        _ => Ok(Recheck::Holds(None)),
    }
}

/// A surplus still holds when the pool's other machines that the provider
/// lists now (managed, not leaving for another reason) are at least its
/// count: a machine the provider took away meanwhile, or a pool raised,
/// leaves nothing to shed.
async fn surplus_holds(
    ctx: &JobContext,
    args: &DeleteMachineArgs,
    leaving: &Leaving,
) -> Result<Recheck, JobError> {
    let Some(pool) = &leaving.deletion.pool else {
        return Ok(Recheck::Holds(None));
    };
    let then: Option<(i32, bool)> =
        sqlx::query_as("select count, removed from shepherd.pools where name = $1")
            .bind(pool)
            .fetch_optional(&ctx.pool)
            .await?;
    let (count, removed) = then.unwrap_or((0, true));
    let wanted = if removed { 0 } else { count.max(0) as u32 };
    let listed = match ctx.provider.machines().await {
        Ok(listed) => listed,
        Err(e) => {
            return Ok(Recheck::CannotTell(format!(
                "the provider's machines could not be listed to count the pool: {e}"
            )));
        }
    };
    let listed: std::collections::HashSet<String> = listed.into_iter().map(|m| m.id).collect();
    let rows: Vec<(String, Option<Uuid>, bool)> = sqlx::query_as(
        "select m.provider_id, m.reservation_id,
                exists(select 1 from shepherd.pending_deletions d
                       where d.machine_id = m.machine_id)
         from shepherd.managed_machines m where m.machine_id <> $1",
    )
    .bind(args.machine_id)
    .fetch_all(&ctx.pool)
    .await?;
    let others = rows
        .iter()
        .filter(|(device, unit, leaving)| {
            !leaving
                && listed.contains(device)
                && unit
                    .and_then(|u| ctx.provider.unit_place(u))
                    .is_some_and(|(p, _)| p == *pool)
        })
        .count() as u32;
    if others < wanted {
        return Ok(Recheck::NoLonger(format!(
            "pool {pool} no longer holds more than its count of {wanted}: the provider lists {others} other machines of it"
        )));
    }
    Ok(Recheck::Holds(Some(PoolThen {
        name: pool.clone(),
        count,
        removed,
    })))
}

/// The fence of a deletion: the unit's lock still holds (where there is a
/// unit), the deletion is still this request's, the machine is not
/// protected, and deletions are not paused.
struct DeletionFence<'a> {
    lock: Option<&'a PlaceLock>,
    pool: &'a sqlx::PgPool,
    machine: Uuid,
    request: String,
    /// A surplus's pool as it stood when checked again: raised, lowered
    /// or declared anew since, the count that made it surplus is gone.
    pool_then: Option<PoolThen>,
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
            if let Some(then) = &self.pool_then {
                let now: Option<(i32, bool)> =
                    sqlx::query_as("select count, removed from shepherd.pools where name = $1")
                        .bind(&then.name)
                        .fetch_optional(self.pool)
                        .await
                        .map_err(|e| format!("the deletion could not be checked: {e}"))?;
                if now != Some((then.count, then.removed)) && !(now.is_none() && then.removed) {
                    return Err(format!(
                        "pool {} changed since its surplus was counted",
                        then.name
                    ));
                }
            }
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
    settings: &ClusterSettings,
    args: &DeleteMachineArgs,
    leaving: &Leaving,
    job_id: &str,
    reason: String,
) -> Result<DeleteOutcome, JobError> {
    let reason = crate::text::bounded(&reason, 1000);
    tracing::warn!(device = %args.device, %reason, "deletion cancelled: the machine stays");
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
    tell_hook_it_stays(ctx, settings, args, leaving).await;
    Ok(DeleteOutcome::Cancelled { reason })
}

/// A hook that may have been asked to drain the machine is told it stays
/// (best effort: the ending is recorded whatever it says).
async fn tell_hook_it_stays(
    ctx: &JobContext,
    settings: &ClusterSettings,
    args: &DeleteMachineArgs,
    leaving: &Leaving,
) {
    if let LeaveHook::Http(url) = &settings.lifecycle.leave_hook {
        call_hook(ctx, url, HookCall::Cancelled, args, leaving).await;
    }
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

/// Asks again later without having tried the delete (the unit was busy,
/// the machine could not be read): a wait, which uses up none of the
/// delete's tries.
async fn look_again_later(
    ctx: &JobContext,
    args: &DeleteMachineArgs,
    e: &ProviderError,
) -> Result<DeleteOutcome, JobError> {
    let next_attempt = args.attempt + 1;
    let after = ctx
        .config
        .create_retry
        .backoff(args.waits.saturating_add(1).min(10));
    tracing::info!(device = %args.device, error = %e, "deletion will look again later");
    let waited = DeleteMachineArgs {
        waits: args.waits + 1,
        ..args.clone()
    };
    successor(ctx, &waited, next_attempt, args.unknown, after).await?;
    Ok(DeleteOutcome::Retrying {
        next_attempt,
        after,
    })
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

#[cfg(test)]
mod tests {
    use super::hook_signature;

    #[test]
    fn a_hook_signature_is_hmac_sha256_of_the_timestamp_and_body() {
        // As Python's hmac.new(key, b"1700000000." + body, sha256) computes it.
        assert_eq!(
            hook_signature(
                b"a-hook-secret-of-16+",
                1_700_000_000,
                br#"{"event":"leaving"}"#
            ),
            "6d02779f22aa871c91bbdaa0856cc7aa5cd7508e73212a5e1baaa6abff15ed84"
        );
    }
}
