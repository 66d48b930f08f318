//! Creations a pool no longer wants. A pool lowered or removed after a
//! pass admitted creations for its places leaves them waiting in the
//! queue: each would end at its own fence before it sent anything, but
//! until its job runs (a backoff can be minutes) it holds room under the
//! limit. The pass ends those whose create was never tried, each under its
//! unit's lock; one tried before may have made a server, and its own job
//! settles that by looking first.

use uuid::Uuid;

use crate::events::event::CreationGivenUp;
use crate::events::{NewEvent, record};
use crate::jobs::place::PlaceLock;
use crate::jobs::{JobContext, JobError};
use crate::provider::ErrorClass;

/// Pending creations whose place's pool is gone, removed or lowered below
/// it, whose outcome is not unknown, and no job of whose request has run.
const UNTRIED_AND_UNWANTED: &str = "
    select pc.reservation_id, pc.request
    from shepherd.pending_creations pc
    left join shepherd.pools po on po.name = regexp_replace(pc.place, '/[0-9]+$', '')
    where pc.place ~ '/[0-9]{1,9}$' and pc.request is not null and pc.unresolved_since is null
      and (po.name is null or po.removed
           or substring(pc.place from '/([0-9]+)$')::int >= po.count)
      and not exists (
          select 1 from apalis.jobs j
          where j.job_type = 'create_device'
            and shepherd.job_args(j.job)->>'request' = pc.request
            and (j.attempts > 0 or j.status <> 'Pending'))";

/// Ends the untried creations the pools no longer want; returns their
/// units.
pub(super) async fn end_unwanted_creations(
    ctx: &JobContext,
    job_id: &str,
) -> Result<Vec<Uuid>, JobError> {
    let candidates: Vec<(Uuid, String)> = sqlx::query_as(UNTRIED_AND_UNWANTED)
        .fetch_all(&ctx.pool)
        .await?;
    let mut ended = vec![];
    for (unit, request) in candidates {
        // A job that holds the unit is at work on it: its fence decides.
        let Some(lock) = PlaceLock::try_take(&ctx.pool, unit, ctx.lease_term()).await? else {
            continue;
        };
        let outcome = end_one(ctx, job_id, &lock, &request).await;
        lock.release().await;
        if outcome? {
            ended.push(unit);
        }
    }
    Ok(ended)
}

/// Under the unit's lock: still this request's, still unwanted, nothing
/// of ours on the unit, and still untried (a job claimed since would have
/// run into the lock; one claimed before it is seen here).
async fn end_one(
    ctx: &JobContext,
    job_id: &str,
    lock: &PlaceLock,
    request: &str,
) -> Result<bool, JobError> {
    let Ok(standing) = lock.standing().await else {
        return Ok(false);
    };
    let Some(why) = standing.unwanted.clone() else {
        return Ok(false);
    };
    if standing.owner.as_deref() != Some(request) || standing.machines > 0 {
        return Ok(false);
    }
    let Ok(request_id) = request.parse::<Uuid>() else {
        return Ok(false);
    };
    let mut tx = ctx.pool.begin().await?;
    let untried: bool = sqlx::query_scalar(
        "select not exists (
             select 1 from apalis.jobs j
             where j.job_type = 'create_device'
               and shepherd.job_args(j.job)->>'request' = $1
               and (j.attempts > 0 or j.status <> 'Pending'))",
    )
    .bind(request)
    .fetch_one(&mut *tx)
    .await?;
    if !untried {
        return Ok(false);
    }
    let cause = format!("{why}; the pass ended this creation before it was sent");
    tracing::info!(reservation = %lock.unit(), %cause, "a creation the pools no longer want");
    record(
        &mut tx,
        vec![
            NewEvent::new(CreationGivenUp {
                reservation: lock.unit(),
                class: ErrorClass::Permanent,
                message: cause,
                request: Some(request_id),
            })
            .caused_by(job_id),
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}
