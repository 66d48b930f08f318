//! CreateDevice: one attempt at making a machine on one unit of capacity.
//!
//! An attempt takes its unit's lock (one owner per unit at every moment,
//! `place.rs`), waits for the cluster-wide creation limiter, and calls the
//! provider's create with a witness derived from the request (stable across
//! attempts and crashes) and a fence asked right before the create leaves.
//! It commits the outcome with what follows from it in one transaction:
//! the machine and its Assimilate job; or the failure and a delayed
//! successor; or the penalty that ends it.
//!
//! A create whose answer was not seen is unknown, never failed: the unit
//! stays held by the creation, and its successors only look (never create)
//! until a look after the cluster's settle window finds nothing of ours,
//! on a provider that does not itself refuse a second machine on a unit
//! (`Provider::one_machine_per_unit`). A failed look is unknown too.

use chrono::{DateTime, TimeDelta, Utc};
use uuid::Uuid;

use super::lease::take_where;
use super::place::{PlaceLock, Standing};
use super::queue;
use super::{CreateDeviceArgs, JobContext, JobError};
use crate::cluster::ClusterSettings;
use crate::events::event::*;
use crate::events::{NewEvent, record};
use crate::provider::ErrorClass;
use crate::provider::{Failure, ProviderError};

mod admit;
mod endings;

use admit::admit_manual;
pub(super) use endings::penalty_event;
use endings::*;

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
    // whose outcome nobody saw; who owns the reservation's creation (a
    // re-run of the same request resumes it); and, when that is this
    // request, the unit's lease, taken in the same statement (issue 31).
    // What stands on the unit is read after the lease is held
    // (`PlaceLock::confirmed`): this statement's snapshot predates any wait
    // on a holder committing its outcome.
    type First = (
        Option<serde_json::Value>,
        Option<bool>,
        Option<String>,
        Option<serde_json::Value>,
        bool,
        bool,
        bool,
    );
    let ours = args.request.to_string();
    let lease = Uuid::new_v4();
    let term = ctx.lease_term();
    // apalis counts a run in `attempts` when it ends (or when it hands a
    // dead worker's job back), never when it claims one: a row that ran
    // before, however that run ended, has attempts above 0 when it runs
    // again.
    let (stored, rerun, owner, pools, taken, moved_unrecorded, moved): First =
        sqlx::query_as(sqlx::AssertSqlSafe(FIRST.as_str()))
            .bind(PlaceLock::key_of(args.reservation))
            .bind(lease)
            .bind(crate::jobs::lease::millis(term))
            .bind(crate::fleet::process_name())
            .bind(job_id)
            .bind(args.reservation)
            .bind(&ours)
            .fetch_one(&ctx.pool)
            .await?;
    // Kept (and given back if this run ends early) from here on.
    let mut lock = taken.then(|| PlaceLock::taken(&ctx.pool, args.reservation, lease, term));
    let pools: Vec<crate::pools::PoolRow> = match pools {
        Some(json) => serde_json::from_value(json)
            .map_err(|e| JobError::Database(sqlx::Error::Decode(Box::new(e))))?,
        None => vec![],
    };
    ctx.adopt_pools(&pools);
    let stored = match stored {
        Some(serde_json::Value::Object(map)) => map.into_iter().collect(),
        _ => Default::default(),
    };
    let settings = ctx.adopt(&stored)?;
    let rerun = rerun.unwrap_or(false);
    // The database moved back in time since this creation was requested
    // (or just now, unrecorded yet): its create may have gone out, even
    // made its server, after the backup the log came from. It looks first,
    // and waits the settle window from the move (`UNSEEN_SINCE`).
    let moved = moved || (moved_unrecorded && super::moved::check(&ctx.pool).await?.is_some());
    let args = &CreateDeviceArgs {
        unknown: args.unknown || rerun || moved,
        // An earlier run of this very row may have sent a create a moment
        // ago, whatever its arguments said: the window starts now.
        unknown_since: if rerun {
            Some(Utc::now())
        } else {
            args.unknown_since
        },
        ..args.clone()
    };
    match owner {
        Some(owner) if owner == ours => {
            if rerun {
                rerun_may_have_sent(ctx, args, job_id).await?;
            }
        }
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
            // Admitted just now: the first read did not try the lease.
            lock = PlaceLock::try_take(&ctx.pool, args.reservation, term).await?;
        }
    }
    let Some(lock) = lock else {
        // Another run holds the unit (a duplicate run of this job, a run
        // still going that was presumed dead, a deletion or assimilation
        // of a machine on it): this one comes back later.
        let busy = ProviderError::new(
            ErrorClass::Transient,
            "another run holds the unit; it is looked at again later",
        );
        let since = args
            .unknown
            .then(|| args.unknown_since.unwrap_or_else(Utc::now));
        return retry_later(ctx, args, job_id, &busy, since, args.creates_before()).await;
    };
    let standing = match lock.confirmed(ctx.config.rescue.fence_grace()).await {
        Ok(standing) => standing,
        Err(reason) => {
            lock.release().await;
            let since = args
                .unknown
                .then(|| args.unknown_since.unwrap_or_else(Utc::now));
            let e = ProviderError::new(ErrorClass::Transient, reason);
            return retry_later(ctx, args, job_id, &e, since, args.creates_before()).await;
        }
    };
    let outcome = holding(ctx, &settings, args, job_id, &lock, standing).await;
    lock.release().await;
    outcome
}

/// The first statement of an attempt (`create_device`), built once.
static FIRST: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "with held as ({})
         select (select jsonb_object_agg(key, value) from shepherd.cluster_settings),
                (select attempts > 0 from apalis.jobs where id = $5),
                (select request from shepherd.pending_creations where reservation_id = $6),
                (select jsonb_agg(to_jsonb(p)) from shepherd.pools p),
                exists(select 1 from held),
                {},
                exists(select 1 from shepherd.events m
                       where m.event_type = 'database_moved'
                         and m.position > (select max(c.position) from shepherd.events c
                                           where c.event_type = 'creation_requested'
                                             and c.body->>'request' = $7
                                             and left(c.body->>'request', 8) = left($7, 8)))",
        take_where(
            "exists(select 1 from shepherd.pending_creations
                    where reservation_id = $6 and request = $7)"
        ),
        super::moved::UNRECORDED,
    )
});

/// The attempt proper, while `lock` holds the unit, on what stood there
/// once it was held.
async fn holding(
    ctx: &JobContext,
    settings: &ClusterSettings,
    args: &CreateDeviceArgs,
    job_id: &str,
    lock: &PlaceLock,
    standing: Standing,
) -> Result<CreateOutcome, JobError> {
    let ours = args.request.to_string();
    if standing.owner.as_deref() != Some(ours.as_str()) {
        return Ok(not_owner());
    }
    if standing.machines > 0 {
        // A machine of ours stands on the unit now (an operator assimilated
        // one): this creation ends, and the unit is not penalised for it.
        return end_unsent(
            ctx,
            args,
            job_id,
            "a machine of ours stands on the unit now; this creation ends".into(),
            lock,
        )
        .await;
    }
    if args.unknown || args.verify {
        match settle(ctx, settings, args, job_id, lock).await? {
            Looked::Done(outcome) => return Ok(outcome),
            Looked::Nothing if args.verify => {
                let cause = "no machine of ours appeared within the settle window after an \
                             unknown outcome; the creation failed"
                    .to_string();
                let why = GiveUp {
                    class: ErrorClass::Ambiguous,
                    cause,
                    scope: None,
                };
                return give_up(ctx, settings, args, job_id, lock, why).await;
            }
            Looked::Nothing => {}
        }
    }

    // Looked, and nothing of ours stands there: a place the pools no
    // longer want (lowered or removed since this creation was admitted)
    // gets no create.
    if let Some(why) = &standing.unwanted {
        return end_unsent(
            ctx,
            args,
            job_id,
            format!("{why}; this creation ends unsent"),
            lock,
        )
        .await;
    }
    // The attempt's budget covers the wait for the limiter and the API's own
    // retries; when it runs out the attempt's outcome is unknown, and the
    // next one starts by looking for what this one may have made.
    let fence = lock.creation(args.request, ctx.config.rescue.fence_grace());
    // Nothing can have been sent for this request before its first
    // attempt: its create may go out on what the pass's listing said.
    let fresh = args.attempt == 1 && !args.unknown && !args.verify && args.creates_before() == 0;
    let first = args.hint.as_ref().filter(|_| fresh);
    let attempt = async {
        let key = ctx.ssh_key_id().await?;
        ctx.provider
            .create(
                args.reservation,
                args.request,
                &key,
                &ctx.creation_limiter,
                &fence,
                first,
            )
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
        Ok(created) => created_outcome(ctx, args, job_id, created, lock, true).await,
        Err(ProviderError {
            failure: Failure::RaceLost { other },
            ..
        }) => race_lost(ctx, settings, args, job_id, other, lock).await,
        Err(e) => {
            // Only this attempt's create can be unknown here: an earlier
            // unknown one was settled above, or the attempt would not have
            // been made.
            let unseen = matches!(e.class, ErrorClass::Ambiguous | ErrorClass::Cancelled);
            let unknown_since = unseen.then(Utc::now);
            let key_refused = e.failure == Failure::SshKeyRefused;
            if key_refused {
                // Rotated or deleted at the provider: the next attempt
                // looks the key up again instead of repeating a stale id.
                ctx.forget_ssh_key().await;
            }
            let worth_another = retryable(&e) || key_refused;
            // This attempt counts against the budget whatever it sent; the
            // looks of an unknown creation (`settle`) do not.
            let sent = args.creates_before() + 1;
            if worth_another && sent < ctx.config.create_retry.max_attempts {
                retry_later(ctx, args, job_id, &e, unknown_since, sent).await
            } else if let Some(since) = unknown_since {
                let args = &CreateDeviceArgs {
                    creates: Some(sent),
                    ..args.clone()
                };
                unresolved(ctx, args, job_id, &e.to_string(), since).await
            } else {
                let cause = if worth_another {
                    format!("gave up after {sent} creates: {e}")
                } else {
                    e.to_string()
                };
                let scope = match e.failure {
                    Failure::OutOfStock { scope } => scope,
                    _ => None,
                };
                let why = GiveUp {
                    class: e.class,
                    cause,
                    scope,
                };
                give_up(ctx, settings, args, job_id, lock, why).await
            }
        }
    }
}

/// What a look at an unknown creation's unit found.
enum Looked {
    /// The creation ended (its machine found, the unit taken by another
    /// party) or stays unknown with a successor enqueued.
    Done(CreateOutcome),
    /// Nothing of ours, in a look that can be trusted: the settle window
    /// has passed (or the provider refuses a second machine on a unit).
    Nothing,
}

/// A second run of this job row: the run before it may have sent a create
/// a moment ago and stopped before recording anything (killed, presumed
/// dead, handed back by a drain cut short). Recorded, by the database's
/// clock, as a create nobody saw answered, so that every later run of the
/// creation (this one, a successor, or one merged with another's) waits
/// out the settle window from now before it trusts "nothing there".
async fn rerun_may_have_sent(
    ctx: &JobContext,
    args: &CreateDeviceArgs,
    job_id: &str,
) -> Result<(), JobError> {
    let message = "this job row ran before and did not finish: its create may have gone out unseen";
    let mut tx = ctx.pool.begin().await?;
    let unresolved = unresolved_event(args, message, false, false);
    record(&mut tx, vec![unresolved.caused_by(job_id)]).await?;
    tx.commit().await?;
    Ok(())
}

/// When the latest create of request `$1` that nobody saw answered may
/// have gone out, and the time now, both by the database's clock: the
/// creation's events on its unit's stream `$2` since it was requested that
/// mark one (an unseen or cut-off create, a rerun of a row, an answer that
/// came after its lease; not a look that still could not tell), and a move
/// of the database since it was requested (`jobs::moved`). Every run
/// of the creation reads it, whatever its arguments carry, so runs whose
/// successors merged lose no unseen create, and no worker's clock decides.
/// `$3`, the time a job's arguments carry (written by a release before
/// this record), counts too, but never past the database's now. The
/// request is matched by its first 8 characters too, which
/// `events_creation_request_prefix_idx` holds.
const UNSEEN_SINCE: &str = "with asked as (
         select position from shepherd.events
         where event_type = 'creation_requested' and body->>'request' = $1
           and left(body->>'request', 8) = left($1, 8)
         order by position desc limit 1)
     select greatest(
              (select max(e.recorded_at) from shepherd.events e, asked
               where e.stream = $2 and e.position > asked.position
                 and ((e.event_type = 'creation_unresolved' and e.body->>'request' = $1
                       and not coalesce((e.body->>'looked')::bool, false))
                   or (e.event_type = 'creation_attempt_failed'
                       and e.body->>'class' in ('ambiguous', 'cancelled')))),
              (select max(m.recorded_at) from shepherd.events m, asked
               where m.event_type = 'database_moved' and m.position > asked.position),
              least($3::timestamptz, pg_catalog.clock_timestamp())),
            pg_catalog.clock_timestamp()";

/// Settles an unknown creation by looking for its witness, never by
/// creating: the look is trusted to say "nothing" only once the settle
/// window since the latest unseen create has passed, since a provider's
/// listings can lag behind its creates. Anything less keeps the unit held.
/// The window is timed by the database's clock (`UNSEEN_SINCE`), read
/// before the look: a look that ends after it is at least as late.
async fn settle(
    ctx: &JobContext,
    settings: &ClusterSettings,
    args: &CreateDeviceArgs,
    job_id: &str,
    lock: &PlaceLock,
) -> Result<Looked, JobError> {
    let (since, now): (Option<DateTime<Utc>>, DateTime<Utc>) = sqlx::query_as(UNSEEN_SINCE)
        .bind(args.request.to_string())
        .bind(format!("reservation/{}", args.reservation))
        .bind(args.unknown_since)
        .fetch_one(&ctx.pool)
        .await?;
    // Nothing recorded and nothing carried: the window runs from now.
    let since = since.unwrap_or(now);
    let settled_at = if ctx.provider.one_machine_per_unit() {
        since
    } else {
        since + TimeDelta::from_std(settings.settle_window).unwrap_or(TimeDelta::MAX)
    };
    let until_settled = (settled_at - now).to_std().unwrap_or_default();
    let looked = ctx
        .provider
        .find_created(args.reservation, args.request)
        .await;
    Ok(match looked {
        // The unit is given back by the caller, once this run is over.
        Ok(Some(created)) => {
            Looked::Done(created_outcome(ctx, args, job_id, created, lock, false).await?)
        }
        Err(ProviderError {
            failure: Failure::RaceLost { other },
            ..
        }) => Looked::Done(race_lost(ctx, settings, args, job_id, other, lock).await?),
        // No machine of ours can stand on a unit the provider does not know.
        Err(e) if e.not_found() => {
            let why = GiveUp {
                class: e.class,
                cause: e.to_string(),
                scope: None,
            };
            Looked::Done(give_up(ctx, settings, args, job_id, lock, why).await?)
        }
        Ok(None) if until_settled.is_zero() => {
            let mut tx = ctx.pool.begin().await?;
            record(
                &mut tx,
                vec![
                    NewEvent::new(CreationSettled {
                        reservation: args.reservation,
                        request: args.request,
                        message: format!(
                            "nothing of ours on the unit at {now} (database clock) after an \
                             unknown outcome at {since}"
                        ),
                    })
                    .caused_by(job_id),
                ],
            )
            .await?;
            tx.commit().await?;
            Looked::Nothing
        }
        Ok(None) => Looked::Done(
            still_unknown(
                ctx,
                args,
                job_id,
                since,
                until_settled,
                format!(
                    "nothing of ours is seen yet; a look after {settled_at} (database clock) \
                     settles it"
                ),
            )
            .await?,
        ),
        Err(e) => Looked::Done(
            still_unknown(
                ctx,
                args,
                job_id,
                since,
                until_settled,
                format!("looking failed: {e}"),
            )
            .await?,
        ),
    })
}

/// The creation stays unknown: recorded, and a successor looks again,
/// before the settle window ends if the backoff comes first (the machine
/// may show up early), and once it has passed.
async fn still_unknown(
    ctx: &JobContext,
    args: &CreateDeviceArgs,
    job_id: &str,
    since: DateTime<Utc>,
    until_settled: std::time::Duration,
    message: String,
) -> Result<CreateOutcome, JobError> {
    let next_attempt = args.attempt + 1;
    let backoff = ctx.config.create_retry.backoff(next_attempt);
    let after = if until_settled.is_zero() {
        backoff
    } else {
        backoff.min(until_settled + std::time::Duration::from_millis(100))
    };
    tracing::warn!(reservation = %args.reservation, %message, "creation outcome still unknown");
    let mut tx = ctx.pool.begin().await?;
    let unresolved = unresolved_event(args, &message, false, true);
    record(&mut tx, vec![unresolved.caused_by(job_id)]).await?;
    let successor = CreateDeviceArgs {
        attempt: next_attempt,
        admitted: true,
        unknown: true,
        unknown_since: Some(since),
        // Out of creates: only looks from here on, until it can tell. The
        // looks themselves are not creates, and do not use them up.
        verify: args.verify || args.creates_before() >= ctx.config.create_retry.max_attempts,
        creates: Some(args.creates_before()),
        ..args.clone()
    };
    queue::push_create_device(&mut tx, &successor, Some(after)).await?;
    tx.commit().await?;
    Ok(CreateOutcome::Unresolved {
        next_attempt,
        after,
    })
}

/// A machine of ours stands on the unit (an operator assimilated one while
/// this creation waited): the creation ends, without a penalty.
/// The creation ends unsent, and nothing failed, so nothing is penalised:
/// the pools no longer want its place, or a machine of ours stands there.
async fn end_unsent(
    ctx: &JobContext,
    args: &CreateDeviceArgs,
    job_id: &str,
    cause: String,
    held: &PlaceLock,
) -> Result<CreateOutcome, JobError> {
    tracing::info!(reservation = %args.reservation, %cause, "a creation ends unsent");
    let mut tx = ctx.pool.begin().await?;
    if !still_owns(&mut tx, args).await? {
        return Ok(not_owner());
    }
    if !held.held_in(&mut tx).await? {
        drop(tx);
        return late(ctx, args, job_id, &format!("it would end unsent: {cause}")).await;
    }
    record(
        &mut tx,
        vec![
            NewEvent::new(CreationGivenUp {
                reservation: args.reservation,
                class: ErrorClass::Permanent,
                message: cause.clone(),
                request: Some(args.request),
            })
            .caused_by(job_id),
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(CreateOutcome::GivenUp {
        class: ErrorClass::Permanent,
        cause,
    })
}
