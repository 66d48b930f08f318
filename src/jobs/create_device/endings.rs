//! How an attempt ends: each outcome committed with what follows from it,
//! in one transaction (the machine and its assimilation; a failure and the
//! successor that tries again or looks; the penalty that ends the
//! creation), always under the check that this request still owns its
//! unit's pending creation, and every ending (created, given up, race
//! lost) under the proof, in its own transaction, that the run still holds
//! its unit's lease by the database's clock. A run that stalled past its
//! lease records what it saw as unresolved (`late`) and frees nothing: the
//! run holding the unit now settles it by looking.

use chrono::{DateTime, TimeDelta, Utc};
use uuid::Uuid;

use crate::cluster::ClusterSettings;
use crate::events::event::*;
use crate::events::views;
use crate::events::{NewEvent, record};
use crate::jobs::place::PlaceLock;
use crate::jobs::{AssimilateArgs, CreateDeviceArgs, JobContext, JobError};
use crate::jobs::{follow_up, queue};
use crate::provider::ErrorClass;
use crate::provider::{Created, ProviderError};

use super::CreateOutcome;

/// Records the device and enqueues its assimilation, in one transaction,
/// under `held`'s lease; the lease is let go in the same transaction when
/// `give_back`.
pub(super) async fn created_outcome(
    ctx: &JobContext,
    args: &CreateDeviceArgs,
    job_id: &str,
    created: Created,
    held: &PlaceLock,
    give_back: bool,
) -> Result<CreateOutcome, JobError> {
    let recovered = created.recovered;
    let id = created.machine.id;
    let hostname = created
        .machine
        .hostname
        .unwrap_or_else(|| ctx.provider.hostname(args.reservation, args.request));
    let mut tx = ctx.pool.begin().await?;
    if !held.held_in(&mut tx).await? {
        drop(tx);
        return late(ctx, args, job_id, &format!("machine {id} was made")).await;
    }
    let lock = give_back.then_some(held);
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
        created: Some(crate::jobs::CreatedDeviceFacts { hostname }),
        attempt: 1,
    };
    let lease = lock.map(PlaceLock::giving_back);
    match (follow_up::claimant(), lease) {
        (Some(claimant), lease) => {
            let job_id = queue::push_assimilate_claimed(&mut tx, &next, lease, &claimant).await?;
            follow_up::claimed(follow_up::FollowUp { job_id, args: next });
        }
        (None, Some(lease)) => {
            queue::push_assimilate_releasing(&mut tx, &next, lease).await?;
        }
        (None, None) => {
            queue::push_assimilate(&mut tx, &next, None).await?;
        }
    }
    tx.commit().await?;
    if let Some(lock) = lock {
        lock.given_back();
    }
    Ok(CreateOutcome::Created {
        device: id,
        recovered,
    })
}

pub(super) async fn retry_later(
    ctx: &JobContext,
    args: &CreateDeviceArgs,
    job_id: &str,
    e: &ProviderError,
    unknown_since: Option<DateTime<Utc>>,
    creates: u32,
) -> Result<CreateOutcome, JobError> {
    let next_attempt = args.attempt + 1;
    // The wait grows with the creates sent, not with the looks an unknown
    // creation made in between: five looks and two failed creates wait as
    // two failed creates do. A retry that sent nothing (its unit held a
    // moment by another run, its lease not confirmed) waits as the creates
    // before it earned: grown by attempts, a creation that had looked a
    // few times waited minutes for a unit a dead worker's lease held for
    // seconds, its pool one machine short meanwhile.
    let after = ctx.config.create_retry.backoff(creates + 1);
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
        unknown: unknown_since.is_some(),
        unknown_since,
        creates: Some(creates),
        ..args.clone()
    };
    queue::push_create_device(&mut tx, &successor, Some(after)).await?;
    tx.commit().await?;
    Ok(CreateOutcome::Retrying {
        next_attempt,
        after,
    })
}

/// The outcome is unknown and the attempts are spent: the creation stays in
/// flight, marked unresolved, and a successor only looks, until it can tell.
pub(super) async fn unresolved(
    ctx: &JobContext,
    args: &CreateDeviceArgs,
    job_id: &str,
    message: &str,
    since: DateTime<Utc>,
) -> Result<CreateOutcome, JobError> {
    tracing::warn!(reservation = %args.reservation, %message, "creation outcome unknown; it stays in flight until a look settles it");
    unknown_from_now(ctx, args, job_id, message, since, false).await
}

/// This run's answer came after it lost its unit's lease (it stalled past
/// it, or the database moved on without it): it records what it saw as
/// unresolved and frees nothing. The creation stays in flight; the run
/// that holds the unit now, or the successor enqueued here (merged with
/// that run's own, keyed by attempt), settles it by looking. A second
/// server this late write made carries the request's witness, and the
/// unresolved creation makes it ours for the pass, which adopts it; two
/// machines on one place are surplus, shed within the deletion guards.
pub(super) async fn late(
    ctx: &JobContext,
    args: &CreateDeviceArgs,
    job_id: &str,
    saw: &str,
) -> Result<CreateOutcome, JobError> {
    let message = format!(
        "this run's lease on the unit was lost before its outcome could be recorded ({saw}); \
         the unit's holder settles it by looking"
    );
    tracing::error!(reservation = %args.reservation, request = %args.request, %message, "a creation's outcome came after its lease was lost");
    unknown_from_now(ctx, args, job_id, &message, Utc::now(), true).await
}

async fn unknown_from_now(
    ctx: &JobContext,
    args: &CreateDeviceArgs,
    job_id: &str,
    message: &str,
    since: DateTime<Utc>,
    lease_lost: bool,
) -> Result<CreateOutcome, JobError> {
    let next_attempt = args.attempt + 1;
    let after = ctx.config.create_retry.backoff(next_attempt);
    let mut tx = ctx.pool.begin().await?;
    let unresolved = unresolved_event(args, message, lease_lost, false);
    record(&mut tx, vec![unresolved.caused_by(job_id)]).await?;
    let successor = CreateDeviceArgs {
        attempt: next_attempt,
        admitted: true,
        unknown: true,
        unknown_since: Some(since),
        verify: true,
        ..args.clone()
    };
    queue::push_create_device(&mut tx, &successor, Some(after)).await?;
    tx.commit().await?;
    Ok(CreateOutcome::Unresolved {
        next_attempt,
        after,
    })
}

pub(super) async fn race_lost(
    ctx: &JobContext,
    settings: &ClusterSettings,
    args: &CreateDeviceArgs,
    job_id: &str,
    other_device: Option<String>,
    held: &PlaceLock,
) -> Result<CreateOutcome, JobError> {
    let cause = "the reservation was taken by another party".to_string();
    let mut tx = ctx.pool.begin().await?;
    if !still_owns(&mut tx, args).await? {
        return Ok(not_owner());
    }
    if !held.held_in(&mut tx).await? {
        drop(tx);
        return late(ctx, args, job_id, "another party holds the unit").await;
    }
    let mut events = vec![NewEvent::new(RaceLost {
        reservation: args.reservation,
        other_device: other_device.clone(),
        request: Some(args.request),
    })];
    events.extend(
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

/// Why a creation ends without a device: the class of the last answer,
/// in words, and the scope of stock it lacked, if that was it.
pub(super) struct GiveUp {
    pub class: ErrorClass,
    pub cause: String,
    pub scope: Option<String>,
}

/// This attempt's `creation_unresolved`: after a create that may have gone
/// out (`looked` false), or after a look that still could not tell.
pub(super) fn unresolved_event(
    args: &CreateDeviceArgs,
    message: &str,
    lease_lost: bool,
    looked: bool,
) -> NewEvent {
    NewEvent::new(CreationUnresolved {
        reservation: args.reservation,
        request: args.request,
        attempt: args.attempt,
        message: crate::text::bounded(message, 1000),
        lease_lost,
        looked,
    })
}

/// Ends the creation without a device. Only reached when no device of ours
/// can exist: the slot is freed and the reservation penalised, with the
/// `scope` of stock it draws on when the provider had none.
pub(super) async fn give_up(
    ctx: &JobContext,
    settings: &ClusterSettings,
    args: &CreateDeviceArgs,
    job_id: &str,
    held: &PlaceLock,
    why: GiveUp,
) -> Result<CreateOutcome, JobError> {
    let GiveUp {
        class,
        cause,
        scope,
    } = why;
    let mut tx = ctx.pool.begin().await?;
    if !still_owns(&mut tx, args).await? {
        return Ok(not_owner());
    }
    if !held.held_in(&mut tx).await? {
        drop(tx);
        return late(
            ctx,
            args,
            job_id,
            &format!("the creation would end: {cause}"),
        )
        .await;
    }
    let mut events = vec![NewEvent::new(CreationGivenUp {
        reservation: args.reservation,
        class,
        message: cause.clone(),
        request: Some(args.request),
    })];
    events.extend(penalty(settings, &mut tx, args.reservation, &cause, class, scope).await?);
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
pub(super) async fn still_owns(
    tx: &mut sqlx::PgConnection,
    args: &CreateDeviceArgs,
) -> Result<bool, JobError> {
    sqlx::query(
        "select pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended($1::text, 0::int8))",
    )
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

pub(super) fn not_owner() -> CreateOutcome {
    CreateOutcome::Skipped {
        reason: "the creation ended while this run was under way".into(),
    }
}

/// Transient answers and unknown outcomes are worth another attempt: the
/// next one starts by looking for the device the last one may have made.
pub(super) fn retryable(e: &ProviderError) -> bool {
    matches!(
        e.class,
        ErrorClass::Transient
            | ErrorClass::RateLimited
            | ErrorClass::Ambiguous
            | ErrorClass::Cancelled
    )
}

/// The unit's penalty for a failed creation: growing with its failures,
/// and none while a machine of ours stands on it (a managed unit is never
/// penalised; the creation that failed there was not its machine's).
pub(super) async fn penalty(
    settings: &ClusterSettings,
    conn: &mut sqlx::PgConnection,
    reservation: Uuid,
    cause: &str,
    class: ErrorClass,
    scope: Option<String>,
) -> Result<Option<NewEvent>, JobError> {
    let standing: bool = sqlx::query_scalar(
        "select exists(select 1 from shepherd.managed_machines where reservation_id = $1)
             or exists(select 1 from shepherd.unassimilated_devices where reservation_id = $1)",
    )
    .bind(reservation)
    .fetch_one(&mut *conn)
    .await?;
    if standing {
        return Ok(None);
    }
    penalty_event(settings, conn, reservation, cause, class, scope)
        .await
        .map(Some)
}

/// The unit's next penalty, growing with its failures (its sinbin row keeps
/// the count even after a penalty ends).
pub(crate) async fn penalty_event(
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
    // Timed by the database's clock, which the sinbin is read against.
    let now: DateTime<Utc> = sqlx::query_scalar("select now()")
        .fetch_one(&mut *conn)
        .await?;
    Ok(NewEvent::new(ReservationPenalised {
        reservation,
        until: now + TimeDelta::from_std(duration).unwrap_or(TimeDelta::MAX),
        cause: cause.to_string(),
        class: Some(class),
        scope,
    }))
}
