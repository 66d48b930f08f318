//! CreateDevice: one attempt at making a device on one reservation.
//!
//! An attempt waits for the cluster-wide creation limiter, calls the
//! idempotent `create_device` with a witness derived from the request (stable
//! across attempts and crashes), and commits the outcome with what follows
//! from it in one transaction: the device and its Assimilate job; or the
//! failure and a delayed successor attempt; or the penalty that ends it.

use chrono::{TimeDelta, Utc};
use uuid::Uuid;

use super::queue;
use super::{AssimilateArgs, CreateDeviceArgs, JobContext, JobError};
use crate::events::event::*;
use crate::events::views;
use crate::events::{NewEvent, record};
use crate::metal::{CreateDevice, ErrorClass, MetalError, Witness};

/// The decision an attempt reached.
#[derive(Debug, Clone, PartialEq)]
pub enum CreateOutcome {
    Created {
        device: Uuid,
        recovered: bool,
    },
    /// A successor attempt is enqueued to run after `after`.
    Retrying {
        next_attempt: u32,
        after: std::time::Duration,
    },
    /// The reservation is penalised; the creation is over.
    GivenUp {
        class: ErrorClass,
        cause: String,
    },
    RaceLost {
        other_device: Option<Uuid>,
    },
    /// A manual job that was not admitted.
    Refused {
        reason: String,
    },
    /// Nothing to do: this job is not the reservation's pending creation
    /// (a duplicate run, or one that an operator superseded).
    Skipped {
        reason: String,
    },
}

pub async fn create_device(
    ctx: &JobContext,
    args: &CreateDeviceArgs,
    job_id: &str,
) -> Result<CreateOutcome, JobError> {
    let config = &ctx.config;
    if args.admitted {
        let pending: Option<String> = sqlx::query_scalar(
            "select job_id from shepherd.pending_creations where reservation_id = $1",
        )
        .bind(args.reservation)
        .fetch_optional(&ctx.pool)
        .await?;
        if pending.as_deref() != Some(&args.request.to_string()) {
            return Ok(CreateOutcome::Skipped {
                reason: "no pending creation for this request".into(),
            });
        }
    } else if let Some(refused) = admit_manual(ctx, args, job_id).await? {
        return Ok(refused);
    }

    // The attempt's budget covers the wait for the limiter and the API's own
    // retries; when it runs out the attempt counts as failed, and the next
    // one starts by looking for what this one may have made.
    let attempt = async {
        let key = ctx.ssh_key_id().await?;
        let request = CreateDevice {
            reservation: args.reservation,
            hostname: config.hostname(args.reservation),
            operating_system: config.os.clone(),
            ssh_keys: vec![key],
            witness: Witness::new(args.request),
        };
        let pace = || async {
            let waited =
                ctx.creation_limiter
                    .acquire()
                    .await
                    .map_err(|e| MetalError::Transient {
                        op: crate::metal::Operation::CreateDevice,
                        reason: format!("the creation limiter's database is unreachable: {e}"),
                    })?;
            if !waited.is_zero() {
                tracing::debug!(
                    waited_ms = waited.as_millis() as u64,
                    "waited for the creation limiter"
                );
            }
            Ok(())
        };
        ctx.metal.create_device_paced(&request, pace).await
    };
    let result = tokio::time::timeout(config.create_retry.timeout, attempt)
        .await
        .unwrap_or(Err(MetalError::DeadlineExceeded {
            op: crate::metal::Operation::CreateDevice,
        }));

    let mut tx = ctx.pool.begin().await?;
    let outcome = match result {
        Ok(created) => {
            let device = created.device.id;
            let hostname = created
                .device
                .hostname
                .clone()
                .unwrap_or_else(|| config.hostname(args.reservation));
            record(
                &mut tx,
                vec![
                    NewEvent::new(DeviceCreated {
                        reservation: args.reservation,
                        device,
                        hostname: hostname.clone(),
                        witness: Witness::new(args.request).tag(),
                        recovered: created.recovered,
                    })
                    .caused_by(job_id),
                ],
            )
            .await?;
            let next = AssimilateArgs {
                device,
                reservation: Some(args.reservation),
                manual: false,
                created: Some(super::CreatedDeviceFacts { hostname }),
                attempt: 1,
            };
            queue::push_assimilate(&mut tx, &next, None).await?;
            CreateOutcome::Created {
                device,
                recovered: created.recovered,
            }
        }
        Err(e) if retryable(&e) && args.attempt < config.create_retry.max_attempts => {
            let next_attempt = args.attempt + 1;
            let after = config.create_retry.backoff(next_attempt);
            record(
                &mut tx,
                vec![
                    NewEvent::new(CreationAttemptFailed {
                        reservation: args.reservation,
                        class: e.class(),
                        message: e.to_string(),
                        attempt: args.attempt,
                    })
                    .caused_by(job_id),
                ],
            )
            .await?;
            let successor = CreateDeviceArgs {
                attempt: next_attempt,
                admitted: true,
                ..args.clone()
            };
            let run_at = Utc::now() + TimeDelta::from_std(after).unwrap_or(TimeDelta::MAX);
            queue::push_create_device(&mut tx, &successor, Some(run_at)).await?;
            CreateOutcome::Retrying {
                next_attempt,
                after,
            }
        }
        Err(MetalError::RaceLost {
            device: other_device,
            ..
        }) => {
            let cause = "the reservation was taken by another party".to_string();
            let mut events = vec![NewEvent::new(RaceLost {
                reservation: args.reservation,
                other_device,
            })];
            events
                .push(penalty(ctx, &mut tx, args.reservation, &cause, ErrorClass::RaceLost).await?);
            record(
                &mut tx,
                events.into_iter().map(|e| e.caused_by(job_id)).collect(),
            )
            .await?;
            CreateOutcome::RaceLost { other_device }
        }
        Err(e) => {
            let class = e.class();
            let cause = if retryable(&e) {
                format!("gave up after {} attempts: {e}", args.attempt)
            } else {
                e.to_string()
            };
            let mut events = vec![NewEvent::new(CreationGivenUp {
                reservation: args.reservation,
                class,
                message: cause.clone(),
            })];
            events.push(penalty(ctx, &mut tx, args.reservation, &cause, class).await?);
            record(
                &mut tx,
                events.into_iter().map(|e| e.caused_by(job_id)).collect(),
            )
            .await?;
            CreateOutcome::GivenUp { class, cause }
        }
    };
    tx.commit().await?;
    Ok(outcome)
}

/// Transient answers and unknown outcomes are worth another attempt: the
/// next one starts by looking for the device the last one may have made.
fn retryable(e: &MetalError) -> bool {
    matches!(
        e.class(),
        ErrorClass::Transient
            | ErrorClass::RateLimited
            | ErrorClass::Ambiguous
            | ErrorClass::Cancelled
    )
}

async fn penalty(
    ctx: &JobContext,
    conn: &mut sqlx::PgConnection,
    reservation: Uuid,
    cause: &str,
    class: ErrorClass,
) -> Result<NewEvent, JobError> {
    let failures = views::penalty(conn, reservation)
        .await?
        .map_or(0, |p| p.failures.max(0) as u32);
    let duration = ctx.config.penalty.duration(failures);
    Ok(NewEvent::new(ReservationPenalised {
        reservation,
        until: Utc::now() + TimeDelta::from_std(duration).unwrap_or(TimeDelta::MAX),
        cause: cause.to_string(),
        class: Some(class),
    }))
}

/// A job pushed from SQL passes the capacity check here, before any API call.
async fn admit_manual(
    ctx: &JobContext,
    args: &CreateDeviceArgs,
    job_id: &str,
) -> Result<Option<CreateOutcome>, JobError> {
    // An unknown reservation is refused here rather than by the create.
    match ctx.metal.get_reservation(args.reservation, &[]).await {
        Ok(_) => {}
        Err(MetalError::NotFound { .. }) => {
            let reason = format!(
                "reservation {} is not known to the provider",
                args.reservation
            );
            let mut tx = ctx.pool.begin().await?;
            record(
                &mut tx,
                vec![
                    NewEvent::new(CreationRefused {
                        reservation: args.reservation,
                        request: args.request,
                        reason: reason.clone(),
                    })
                    .caused_by(job_id),
                ],
            )
            .await?;
            tx.commit().await?;
            return Ok(Some(CreateOutcome::Refused { reason }));
        }
        // Anything else is for the create to meet and classify.
        Err(_) => {}
    }
    let mut tx = ctx.pool.begin().await?;
    let (_, refused) = queue::admit(
        &mut tx,
        &[(args.reservation, args.request)],
        ctx.config.max_machines,
        true,
        false,
        Some(job_id),
    )
    .await?;
    let outcome = match refused.first() {
        Some((_, reason)) => {
            queue::record_refusal(
                &mut tx,
                args.reservation,
                args.request,
                reason,
                Some(job_id),
            )
            .await?;
            Some(CreateOutcome::Refused {
                reason: reason.to_string(),
            })
        }
        None => None,
    };
    tx.commit().await?;
    Ok(outcome)
}
