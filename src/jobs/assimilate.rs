//! Assimilate: record a provider device as a managed machine.
//!
//! Idempotent: a device already managed is a recorded no-op. A device the
//! provider does not know, or one in another project, is rejected with the
//! reason recorded. The check and the record happen under the device's lock,
//! so two runs of the same job cannot both assimilate it; under its unit's
//! lock, so no creation sends on the unit meanwhile; and under the capacity
//! lock, so admissions count it at once.

use chrono::{TimeDelta, Utc};
use uuid::Uuid;

use super::place::PlaceLock;
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
    // Our own create just returned this device: nothing to verify, and its
    // unit is held by it (made and not yet assimilated) since then.
    if let Some(facts) = &args.created {
        let found = Found {
            unit: args.reservation,
            hostname: Some(facts.hostname.clone()),
            witness: None,
        };
        return record_machine(ctx, args, job_id, found).await;
    }
    // The machine's unit is read from the cluster's pools as they are now.
    ctx.pools().await?;
    let facts = match ctx.provider.machine(&args.device).await {
        Ok(f) => f,
        Err(e)
            if matches!(e.class, ErrorClass::Transient | ErrorClass::RateLimited)
                && args.attempt < ctx.config.assimilate_retry.max_attempts =>
        {
            return retry_later(ctx, args, &e.to_string()).await;
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
    // An answer about another server, or in no project: nothing adopted on
    // it, and asked again while attempts remain.
    if let Some(reason) = facts.unproven {
        if args.attempt < ctx.config.assimilate_retry.max_attempts {
            return retry_later(ctx, args, &reason).await;
        }
        return reject(ctx, args, job_id, reason).await;
    }
    let found = Found {
        unit: facts.unit.or(args.reservation),
        hostname: facts.hostname,
        witness: facts.witness,
    };
    // One owner per unit: no creation may send on the unit while a machine
    // is recorded on it.
    let Some(unit) = found.unit else {
        return record_machine(ctx, args, job_id, found).await;
    };
    let Some(lock) = PlaceLock::try_take(&ctx.pool, unit, ctx.lease_term()).await? else {
        return retry_later(ctx, args, "another run holds the machine's unit").await;
    };
    let outcome = record_machine(ctx, args, job_id, found).await;
    lock.release().await;
    outcome
}

/// What is known of the machine to record.
struct Found {
    unit: Option<Uuid>,
    hostname: Option<String>,
    /// The request its witness names (unknown for our own create's answer,
    /// which needs none).
    witness: Option<String>,
}

async fn retry_later(
    ctx: &JobContext,
    args: &AssimilateArgs,
    error: &str,
) -> Result<AssimilateOutcome, JobError> {
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
    tracing::warn!(device = %args.device, %error, attempt = args.attempt, "assimilation will be retried");
    Ok(AssimilateOutcome::Retrying {
        next_attempt: next.attempt,
    })
}

/// Records the machine, or that it was already managed, under the device's
/// lock and the capacity lock, so that admissions see it at once. A machine
/// of ours is recorded even past the limit (it exists and is billed; hiding
/// it would be worse), and that is recorded too. Its unit's penalty ends:
/// a unit a machine of ours stands on is never penalised.
async fn record_machine(
    ctx: &JobContext,
    args: &AssimilateArgs,
    job_id: &str,
    found: Found,
) -> Result<AssimilateOutcome, JobError> {
    // Our own create's answer is counted in flight since the create: made
    // managed, it moves from one count to the other in one transaction, and
    // an admission counting meanwhile sees the same sum either side. It
    // needs no capacity lock, which every admission and every other
    // assimilation waits on (issue 31: assimilations serialised on it).
    // Confirmed under the device's lock; otherwise, the lock as always.
    if args.created.is_some() {
        let mut tx = ctx.pool.begin().await?;
        let seen = Seen::locked(&mut tx, ctx, &args.device, found.unit).await?;
        if seen.in_flight {
            return record_locked(ctx, args, job_id, found, tx, seen, None).await;
        }
    }
    let mut tx = ctx.pool.begin().await?;
    let capacity = queue::lock_capacity(&mut tx).await?;
    let seen = Seen::locked(&mut tx, ctx, &args.device, found.unit).await?;
    record_locked(ctx, args, job_id, found, tx, seen, Some(capacity)).await
}

/// What the record depends on, read under the device's lock in the call
/// that takes it (issue 31: each statement a job sends costs Postgres more
/// than the reads in it). `shepherd.assimilation_seen` is a volatile
/// function, so its read is a snapshot taken once the lock is held: it sees
/// what the lock's last holder committed.
struct Seen {
    /// The machine that already manages the device.
    existing: Option<Uuid>,
    /// Counted in flight: made (or adopted) and not yet assimilated.
    in_flight: bool,
    /// The request whose creation owns the unit.
    owner: Option<String>,
    /// The unit is in the sinbin.
    penalised: bool,
}

impl Seen {
    /// Takes the device's lock in `conn`'s transaction (the lock an append
    /// of its events takes too) and reads what stands under it.
    async fn locked(
        conn: &mut sqlx::PgConnection,
        ctx: &JobContext,
        device: &str,
        unit: Option<Uuid>,
    ) -> Result<Seen, sqlx::Error> {
        let (existing, in_flight, owner, penalised) = sqlx::query_as(
            "select existing, in_flight, owner, penalised
             from shepherd.assimilation_seen($1, $2, $3, $4)",
        )
        .bind(format!("device/{device}"))
        .bind(ctx.provider.name())
        .bind(device)
        .bind(unit)
        .fetch_one(&mut *conn)
        .await?;
        Ok(Seen {
            existing,
            in_flight,
            owner,
            penalised,
        })
    }
}

/// The record, with the device's lock held in `tx` (and `seen` read under
/// it), and the capacity lock too where `capacity` is given (a machine not
/// yet counted in flight).
async fn record_locked(
    ctx: &JobContext,
    args: &AssimilateArgs,
    job_id: &str,
    found: Found,
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    seen: Seen,
    capacity: Option<queue::Capacity>,
) -> Result<AssimilateOutcome, JobError> {
    let Seen {
        existing,
        in_flight,
        owner,
        penalised,
    } = seen;
    if let Some(machine_id) = existing {
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
        let outcome = AssimilateOutcome::AlreadyManaged { machine_id };
        super::follow_up::acknowledge(&mut tx, &outcome).await?;
        tx.commit().await?;
        return Ok(outcome);
    }
    // A creation by another request still owns the unit: it may be sending,
    // or its create may land later. The machine waits until it ends.
    if let Some(owner) = &owner {
        let its_own = found
            .witness
            .as_deref()
            .is_some_and(|w| !w.is_empty() && owner.starts_with(w));
        if !its_own {
            drop(tx);
            let reason = format!(
                "a creation (request {owner}) is in flight on unit {}: a machine is recorded \
                 there once it ends",
                found.unit.map(|u| u.to_string()).unwrap_or_default()
            );
            return if args.manual {
                reject(ctx, args, job_id, reason).await
            } else {
                retry_later(ctx, args, &reason).await
            };
        }
    }
    let machine_id = Uuid::new_v4();
    let mut events = vec![NewEvent::new(MachineAssimilated {
        machine_id,
        provider: ctx.provider.name().into(),
        provider_id: args.device.clone(),
        reservation: found.unit,
        hostname: found.hostname,
    })];
    // Counted in flight already when made or adopted; else one more.
    if let Some(capacity) = capacity
        && let used = capacity.managed + capacity.in_flight + u64::from(!in_flight)
        && capacity.limit.is_limited()
        && used > capacity.limit.0
    {
        tracing::warn!(device = %args.device, limit = capacity.limit.0, used, "a machine of ours takes the cluster past its limit; recorded anyway");
        events.push(NewEvent::new(LimitExceeded {
            device: args.device.clone(),
            managed: capacity.managed + 1,
            in_flight: capacity.in_flight.saturating_sub(u64::from(in_flight)),
            limit: capacity.limit.0,
        }));
    }
    if let Some(unit) = found.unit
        && penalised
    {
        events.push(NewEvent::new(PenaltyCleared {
            reservation: unit,
            by: "shepherd".into(),
            reason: format!("machine {} of ours stands on the unit", args.device),
        }));
    }
    record(
        &mut tx,
        events.into_iter().map(|e| e.caused_by(job_id)).collect(),
    )
    .await?;
    let outcome = AssimilateOutcome::Assimilated { machine_id };
    super::follow_up::acknowledge(&mut tx, &outcome).await?;
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
