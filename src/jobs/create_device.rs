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
use crate::cluster::ClusterSettings;
use crate::events::event::*;
use crate::events::views;
use crate::events::{NewEvent, record};
use crate::provider::ErrorClass;
use crate::provider::{Created, Failure, ProviderError};

/// The decision an attempt reached.
#[derive(Debug, Clone, PartialEq)]
pub enum CreateOutcome {
    Created {
        device: String,
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
        other_device: Option<String>,
    },
    /// The outcome is unknown; a successor looks after `after`.
    Unresolved {
        next_attempt: u32,
        after: std::time::Duration,
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

impl CreateOutcome {
    /// Logs the outcome with one field per fact (`outcome`, `device`,
    /// `recovered`, ...), so a JSON log has fields, not Rust debug text.
    pub fn log(&self) {
        const DONE: &str = "create_device finished";
        match self {
            CreateOutcome::Created { device, recovered } => {
                tracing::info!(outcome = "created", %device, recovered, "{DONE}")
            }
            CreateOutcome::Retrying {
                next_attempt,
                after,
            } => tracing::info!(
                outcome = "retrying",
                next_attempt,
                after_ms = after.as_millis() as u64,
                "{DONE}"
            ),
            CreateOutcome::GivenUp { class, cause } => {
                tracing::info!(outcome = "given_up", class = class.as_str(), %cause, "{DONE}")
            }
            CreateOutcome::RaceLost { other_device } => match other_device {
                Some(d) => tracing::info!(outcome = "race_lost", other_device = %d, "{DONE}"),
                None => tracing::info!(outcome = "race_lost", "{DONE}"),
            },
            CreateOutcome::Unresolved {
                next_attempt,
                after,
            } => tracing::info!(
                outcome = "unresolved",
                next_attempt,
                after_ms = after.as_millis() as u64,
                "{DONE}"
            ),
            CreateOutcome::Refused { reason } => {
                tracing::info!(outcome = "refused", %reason, "{DONE}")
            }
            CreateOutcome::Skipped { reason } => {
                tracing::info!(outcome = "skipped", %reason, "{DONE}")
            }
        }
    }
}
pub async fn create_device(
    ctx: &JobContext,
    args: &CreateDeviceArgs,
    job_id: &str,
) -> Result<CreateOutcome, JobError> {
    // One round trip for what the job needs to know first: the cluster's
    // settings; whether this is a second run of the same job row (a worker
    // killed or presumed dead, a drain cut short), which may follow a POST
    // whose outcome nobody saw; and who owns the reservation's creation (a
    // re-run of the same request resumes it).
    let (stored, rerun, owner): (Option<serde_json::Value>, Option<bool>, Option<String>) =
        sqlx::query_as(
            "select (select jsonb_object_agg(key, value) from shepherd.cluster_settings),
                    (select attempts > 1 from apalis.jobs where id = $1),
                    (select request from shepherd.pending_creations where reservation_id = $2)",
        )
        .bind(job_id)
        .bind(args.reservation)
        .fetch_one(&ctx.pool)
        .await?;
    let stored = match stored {
        Some(serde_json::Value::Object(map)) => map.into_iter().collect(),
        _ => Default::default(),
    };
    let settings = ctx.adopt(&stored)?;
    let args = &CreateDeviceArgs {
        unknown: args.unknown || rerun.unwrap_or(false),
        ..args.clone()
    };
    let ours = args.request.to_string();
    match owner {
        Some(owner) if owner == ours => {}
        Some(_) if args.admitted || args.verify => {
            return Ok(CreateOutcome::Skipped {
                reason: "another request owns the reservation's creation".into(),
            });
        }
        None if args.admitted || args.verify => {
            return Ok(CreateOutcome::Skipped {
                reason: "no pending creation for this request".into(),
            });
        }
        _ => {
            // A re-run of a manual job whose creation already ended (the
            // device made, the attempt given up) must not start another.
            let seen: bool = sqlx::query_scalar(
                "select exists(select 1 from shepherd.events
                 where event_type = 'creation_requested' and body->>'request' = $1)",
            )
            .bind(&ours)
            .fetch_one(&ctx.pool)
            .await?;
            if seen {
                return Ok(CreateOutcome::Skipped {
                    reason: "this request's creation has already ended".into(),
                });
            }
            if let Some(refused) = admit_manual(ctx, args, job_id).await? {
                return Ok(refused);
            }
        }
    }
    if args.verify {
        return verify(ctx, &settings, args, job_id).await;
    }

    // The attempt's budget covers the wait for the limiter and the API's own
    // retries; when it runs out the attempt's outcome is unknown, and the
    // next one starts by looking for what this one may have made.
    let attempt = async {
        let key = ctx.ssh_key_id().await?;
        ctx.provider
            .create(args.reservation, args.request, &key, &ctx.creation_limiter)
            .await
    };
    let result = tokio::time::timeout(ctx.config.create_retry.timeout, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(ProviderError::new(
                ErrorClass::Cancelled,
                "createDevice: deadline exceeded",
            ))
        });

    match result {
        Ok(created) => created_outcome(ctx, args, job_id, created).await,
        Err(ProviderError {
            failure: Failure::RaceLost { other },
            ..
        }) => race_lost(ctx, &settings, args, job_id, other).await,
        Err(e) => {
            let unknown =
                args.unknown || matches!(e.class, ErrorClass::Ambiguous | ErrorClass::Cancelled);
            let key_refused = e.failure == Failure::SshKeyRefused;
            if key_refused {
                // Rotated or deleted at the provider: the next attempt
                // looks the key up again instead of repeating a stale id.
                ctx.forget_ssh_key().await;
            }
            let worth_another = retryable(&e) || key_refused;
            if worth_another && args.attempt < ctx.config.create_retry.max_attempts {
                retry_later(ctx, args, job_id, &e, unknown).await
            } else if unknown {
                unresolved(ctx, args, job_id, &e.to_string()).await
            } else {
                let cause = if worth_another {
                    format!("gave up after {} attempts: {e}", args.attempt)
                } else {
                    e.to_string()
                };
                let scope = match e.failure {
                    Failure::OutOfStock { scope } => scope,
                    _ => None,
                };
                give_up(ctx, &settings, args, job_id, e.class, cause, scope).await
            }
        }
    }
}

/// Records the device and enqueues its assimilation, in one transaction.
async fn created_outcome(
    ctx: &JobContext,
    args: &CreateDeviceArgs,
    job_id: &str,
    created: Created,
) -> Result<CreateOutcome, JobError> {
    let recovered = created.recovered;
    let id = created.machine.id;
    let hostname = created
        .machine
        .hostname
        .unwrap_or_else(|| ctx.provider.hostname(args.reservation, args.request));
    let mut tx = ctx.pool.begin().await?;
    record(
        &mut tx,
        vec![
            NewEvent::new(DeviceCreated {
                reservation: args.reservation,
                device: id.clone(),
                hostname: hostname.clone(),
                witness: ctx.provider.witness(args.request),
                recovered,
                request: Some(args.request),
            })
            .caused_by(job_id),
        ],
    )
    .await?;
    let next = AssimilateArgs {
        device: id.clone(),
        reservation: Some(args.reservation),
        manual: false,
        created: Some(super::CreatedDeviceFacts { hostname }),
        attempt: 1,
    };
    queue::push_assimilate(&mut tx, &next, None).await?;
    tx.commit().await?;
    Ok(CreateOutcome::Created {
        device: id,
        recovered,
    })
}

async fn retry_later(
    ctx: &JobContext,
    args: &CreateDeviceArgs,
    job_id: &str,
    e: &ProviderError,
    unknown: bool,
) -> Result<CreateOutcome, JobError> {
    let next_attempt = args.attempt + 1;
    let after = ctx.config.create_retry.backoff(next_attempt);
    let mut tx = ctx.pool.begin().await?;
    record(
        &mut tx,
        vec![
            NewEvent::new(CreationAttemptFailed {
                reservation: args.reservation,
                class: e.class,
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
        unknown,
        ..args.clone()
    };
    queue::push_create_device(&mut tx, &successor, Some(at(after))).await?;
    tx.commit().await?;
    Ok(CreateOutcome::Retrying {
        next_attempt,
        after,
    })
}

/// The outcome is unknown and the attempts are spent: the creation stays in
/// flight, marked unresolved, and a successor only looks, until it can tell.
async fn unresolved(
    ctx: &JobContext,
    args: &CreateDeviceArgs,
    job_id: &str,
    message: &str,
) -> Result<CreateOutcome, JobError> {
    let next_attempt = args.attempt + 1;
    let after = ctx.config.create_retry.backoff(next_attempt);
    tracing::warn!(reservation = %args.reservation, %message, "creation outcome unknown; it stays in flight until a look settles it");
    let mut tx = ctx.pool.begin().await?;
    record(
        &mut tx,
        vec![
            NewEvent::new(CreationUnresolved {
                reservation: args.reservation,
                request: args.request,
                attempt: args.attempt,
                message: message.to_string(),
            })
            .caused_by(job_id),
        ],
    )
    .await?;
    let successor = CreateDeviceArgs {
        attempt: next_attempt,
        admitted: true,
        unknown: true,
        verify: true,
        ..args.clone()
    };
    queue::push_create_device(&mut tx, &successor, Some(at(after))).await?;
    tx.commit().await?;
    Ok(CreateOutcome::Unresolved {
        next_attempt,
        after,
    })
}

/// Settles an unknown outcome by looking at the reservation for the witness.
async fn verify(
    ctx: &JobContext,
    settings: &ClusterSettings,
    args: &CreateDeviceArgs,
    job_id: &str,
) -> Result<CreateOutcome, JobError> {
    match ctx
        .provider
        .find_created(args.reservation, args.request)
        .await
    {
        Ok(Some(created)) => created_outcome(ctx, args, job_id, created).await,
        Ok(None) => {
            let cause = "no device of ours exists after an unknown outcome; the creation failed"
                .to_string();
            give_up(
                ctx,
                settings,
                args,
                job_id,
                ErrorClass::Ambiguous,
                cause,
                None,
            )
            .await
        }
        Err(ProviderError {
            failure: Failure::RaceLost { other },
            ..
        }) => race_lost(ctx, settings, args, job_id, other).await,
        // No device of ours can stand on a reservation the provider does not know.
        Err(e) if e.not_found() => {
            give_up(ctx, settings, args, job_id, e.class, e.to_string(), None).await
        }
        Err(e) => unresolved(ctx, args, job_id, &format!("looking failed: {e}")).await,
    }
}

async fn race_lost(
    ctx: &JobContext,
    settings: &ClusterSettings,
    args: &CreateDeviceArgs,
    job_id: &str,
    other_device: Option<String>,
) -> Result<CreateOutcome, JobError> {
    let cause = "the reservation was taken by another party".to_string();
    let mut tx = ctx.pool.begin().await?;
    if !still_owns(&mut tx, args).await? {
        return Ok(not_owner());
    }
    let mut events = vec![NewEvent::new(RaceLost {
        reservation: args.reservation,
        other_device: other_device.clone(),
        request: Some(args.request),
    })];
    events.push(
        penalty(
            settings,
            &mut tx,
            args.reservation,
            &cause,
            ErrorClass::RaceLost,
            None,
        )
        .await?,
    );
    record(
        &mut tx,
        events.into_iter().map(|e| e.caused_by(job_id)).collect(),
    )
    .await?;
    tx.commit().await?;
    Ok(CreateOutcome::RaceLost { other_device })
}

/// Ends the creation without a device. Only reached when no device of ours
/// can exist: the slot is freed and the reservation penalised, with the
/// `scope` of stock it draws on when the provider had none.
async fn give_up(
    ctx: &JobContext,
    settings: &ClusterSettings,
    args: &CreateDeviceArgs,
    job_id: &str,
    class: ErrorClass,
    cause: String,
    scope: Option<String>,
) -> Result<CreateOutcome, JobError> {
    let mut tx = ctx.pool.begin().await?;
    if !still_owns(&mut tx, args).await? {
        return Ok(not_owner());
    }
    let mut events = vec![NewEvent::new(CreationGivenUp {
        reservation: args.reservation,
        class,
        message: cause.clone(),
        request: Some(args.request),
    })];
    events.push(penalty(settings, &mut tx, args.reservation, &cause, class, scope).await?);
    record(
        &mut tx,
        events.into_iter().map(|e| e.caused_by(job_id)).collect(),
    )
    .await?;
    tx.commit().await?;
    Ok(CreateOutcome::GivenUp { class, cause })
}

/// Whether this request still owns the reservation's pending creation,
/// checked under the reservation's lock (the one `record()` takes), so a
/// stale run of an ended request cannot free a newer request's slot or
/// penalise the reservation it is creating on.
async fn still_owns(
    tx: &mut sqlx::PgConnection,
    args: &CreateDeviceArgs,
) -> Result<bool, JobError> {
    sqlx::query("select pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("reservation/{}", args.reservation))
        .execute(&mut *tx)
        .await?;
    let owner: Option<Option<String>> = sqlx::query_scalar(
        "select request from shepherd.pending_creations where reservation_id = $1",
    )
    .bind(args.reservation)
    .fetch_optional(&mut *tx)
    .await?;
    Ok(owner.flatten().as_deref() == Some(args.request.to_string().as_str()))
}

fn not_owner() -> CreateOutcome {
    CreateOutcome::Skipped {
        reason: "the creation ended while this run was under way".into(),
    }
}

fn at(after: std::time::Duration) -> chrono::DateTime<Utc> {
    Utc::now() + TimeDelta::from_std(after).unwrap_or(TimeDelta::MAX)
}

/// Transient answers and unknown outcomes are worth another attempt: the
/// next one starts by looking for the device the last one may have made.
fn retryable(e: &ProviderError) -> bool {
    matches!(
        e.class,
        ErrorClass::Transient
            | ErrorClass::RateLimited
            | ErrorClass::Ambiguous
            | ErrorClass::Cancelled
    )
}

async fn penalty(
    settings: &ClusterSettings,
    conn: &mut sqlx::PgConnection,
    reservation: Uuid,
    cause: &str,
    class: ErrorClass,
    scope: Option<String>,
) -> Result<NewEvent, JobError> {
    let failures = views::penalty(conn, reservation)
        .await?
        .map_or(0, |p| p.failures.max(0) as u32);
    let duration = settings.penalty.duration(failures);
    Ok(NewEvent::new(ReservationPenalised {
        reservation,
        until: Utc::now() + TimeDelta::from_std(duration).unwrap_or(TimeDelta::MAX),
        cause: cause.to_string(),
        class: Some(class),
        scope,
    }))
}

/// A job pushed from SQL passes the capacity check here, before any API call.
async fn admit_manual(
    ctx: &JobContext,
    args: &CreateDeviceArgs,
    job_id: &str,
) -> Result<Option<CreateOutcome>, JobError> {
    // An unknown reservation is refused here rather than by the create.
    match ctx.provider.unit_exists(args.reservation).await {
        Ok(true) => {}
        Ok(false) => {
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
        &queue::Admission {
            manual: true,
            push_jobs: false,
            caused_by: Some(job_id),
            requested_by: args.requested_by.clone(),
            sinbin_override: args.sinbin_override.clone(),
        },
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
