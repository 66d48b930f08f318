//! Assimilate: record a provider device as a managed machine.
//!
//! Idempotent: a device already managed is a recorded no-op. A device the
//! provider does not know, or one in another project, is rejected with the
//! reason recorded. The check and the record happen under the device's lock,
//! so two runs of the same job cannot both assimilate it.

use chrono::{TimeDelta, Utc};
use uuid::Uuid;

use super::queue;
use super::{AssimilateArgs, JobContext, JobError};
use crate::events::event::*;
use crate::events::{NewEvent, record};
use crate::provider::ErrorClass;

#[derive(Debug, Clone, PartialEq)]
pub enum AssimilateOutcome {
    Assimilated { machine_id: Uuid },
    AlreadyManaged { machine_id: Uuid },
    Rejected { reason: String },
    Retrying { next_attempt: u32 },
}

impl AssimilateOutcome {
    /// Logs the outcome with one field per fact, as `CreateOutcome::log`.
    pub fn log(&self) {
        const DONE: &str = "assimilate finished";
        match self {
            AssimilateOutcome::Assimilated { machine_id } => {
                tracing::info!(outcome = "assimilated", machine = %machine_id, "{DONE}")
            }
            AssimilateOutcome::AlreadyManaged { machine_id } => {
                tracing::info!(outcome = "already_managed", machine = %machine_id, "{DONE}")
            }
            AssimilateOutcome::Rejected { reason } => {
                tracing::info!(outcome = "rejected", %reason, "{DONE}")
            }
            AssimilateOutcome::Retrying { next_attempt } => {
                tracing::info!(outcome = "retrying", next_attempt, "{DONE}")
            }
        }
    }
}

pub async fn assimilate(
    ctx: &JobContext,
    args: &AssimilateArgs,
    job_id: &str,
) -> Result<AssimilateOutcome, JobError> {
    // Our own create just returned this device: nothing to verify.
    if let Some(facts) = &args.created {
        return record_machine(
            ctx,
            args,
            job_id,
            args.reservation,
            Some(facts.hostname.clone()),
        )
        .await;
    }
    let facts = match ctx.provider.machine(&args.device).await {
        Ok(f) => f,
        Err(e)
            if matches!(e.class, ErrorClass::Transient | ErrorClass::RateLimited)
                && args.attempt < ctx.config.assimilate_retry.max_attempts =>
        {
            let next = AssimilateArgs {
                attempt: args.attempt + 1,
                ..args.clone()
            };
            let after = ctx.config.assimilate_retry.backoff(next.attempt);
            let mut tx = ctx.pool.begin().await?;
            queue::push_assimilate(
                &mut tx,
                &next,
                Some(Utc::now() + TimeDelta::from_std(after).unwrap_or(TimeDelta::MAX)),
            )
            .await?;
            tx.commit().await?;
            tracing::warn!(device = %args.device, error = %e, attempt = args.attempt, "assimilation will be retried");
            return Ok(AssimilateOutcome::Retrying {
                next_attempt: next.attempt,
            });
        }
        Err(e) if e.not_found() => {
            return reject(
                ctx,
                args,
                job_id,
                "the provider does not know this device".into(),
            )
            .await;
        }
        Err(e) => return reject(ctx, args, job_id, e.to_string()).await,
    };
    if let Some(reason) = facts.foreign {
        return reject(ctx, args, job_id, reason).await;
    }
    record_machine(
        ctx,
        args,
        job_id,
        facts.unit.or(args.reservation),
        facts.hostname,
    )
    .await
}

/// Records the machine, or that it was already managed, under the device's lock.
async fn record_machine(
    ctx: &JobContext,
    args: &AssimilateArgs,
    job_id: &str,
    reservation: Option<Uuid>,
    hostname: Option<String>,
) -> Result<AssimilateOutcome, JobError> {
    let mut tx = ctx.pool.begin().await?;
    sqlx::query("select pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("device/{}", args.device))
        .execute(&mut *tx)
        .await?;
    let existing: Option<Uuid> = sqlx::query_scalar(
        "select machine_id from shepherd.managed_machines where provider = $1 and provider_id = $2",
    )
    .bind(ctx.provider.name())
    .bind(&args.device)
    .fetch_optional(&mut *tx)
    .await?;
    let outcome = match existing {
        Some(machine_id) => {
            record(
                &mut tx,
                vec![
                    NewEvent::new(AssimilationSkipped {
                        device: args.device.clone(),
                        machine_id,
                    })
                    .caused_by(job_id),
                ],
            )
            .await?;
            AssimilateOutcome::AlreadyManaged { machine_id }
        }
        None => {
            let machine_id = Uuid::new_v4();
            record(
                &mut tx,
                vec![
                    NewEvent::new(MachineAssimilated {
                        machine_id,
                        provider: ctx.provider.name().into(),
                        provider_id: args.device.clone(),
                        reservation,
                        hostname,
                    })
                    .caused_by(job_id),
                ],
            )
            .await?;
            AssimilateOutcome::Assimilated { machine_id }
        }
    };
    tx.commit().await?;
    Ok(outcome)
}

async fn reject(
    ctx: &JobContext,
    args: &AssimilateArgs,
    job_id: &str,
    reason: String,
) -> Result<AssimilateOutcome, JobError> {
    tracing::warn!(device = %args.device, %reason, "assimilation rejected");
    let mut tx = ctx.pool.begin().await?;
    record(
        &mut tx,
        vec![
            NewEvent::new(AssimilationRejected {
                device: args.device.clone(),
                reason: reason.clone(),
            })
            .caused_by(job_id),
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(AssimilateOutcome::Rejected { reason })
}
