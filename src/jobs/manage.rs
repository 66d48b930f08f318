//! An operator's hands on single jobs: run a failed or killed job again,
//! or cancel one that is waiting. Each is recorded with who and why, and
//! neither may break what the sweep and admission keep true:
//!
//! - a retry never gives a creation or an assimilation a second live job
//!   (it runs under the sweep's lock and refuses when the sweep, or
//!   anything else, already gave the work a job);
//! - a cancel never forgets a creation that may have reached the provider:
//!   only a creation whose one and only job was never claimed is
//!   cancelled, and its pending row is closed in the same transaction, so
//!   the sweep does not resume it and the limit counts it no more;
//! - an assimilation the sweep would only resume is not cancelled (release
//!   the machine instead).
//!
//! The job row is locked (`for update`) while it is judged; apalis claims
//! with `skip locked`, so a worker cannot take it in between.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{ASSIMILATE_QUEUE, CREATE_DEVICE_QUEUE, DELETE_MACHINE_QUEUE, RECONCILE_QUEUE};
use crate::events::event::{JobCancelled, JobRetried};
use crate::events::{NewEvent, StoreError, record};

#[derive(Debug, thiserror::Error)]
pub enum JobActionError {
    #[error("no shepherd job {0} in the queue (finished jobs are pruned after the retention)")]
    NotFound(String),
    /// The action would break an invariant or makes no sense in the job's
    /// state; the message says why and what to do instead.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for JobActionError {
    fn from(e: sqlx::Error) -> Self {
        JobActionError::Store(StoreError::Database(e))
    }
}

#[derive(sqlx::FromRow)]
struct Row {
    job_type: String,
    status: String,
    attempts: i32,
    max_attempts: i32,
    lock_by: Option<String>,
    args: Option<serde_json::Value>,
}

impl Row {
    fn arg(&self, name: &str) -> Option<String> {
        self.args.as_ref()?.get(name)?.as_str().map(str::to_string)
    }

    fn ended(&self) -> bool {
        self.status == "Killed" || (self.status == "Failed" && self.attempts >= self.max_attempts)
    }

    fn waiting(&self) -> bool {
        self.lock_by.is_none()
            && (self.status == "Pending"
                || (self.status == "Failed" && self.attempts < self.max_attempts))
    }
}

/// Locks the job row and the sweep (so neither moves while it is judged).
async fn lock(conn: &mut PgConnection, id: &str) -> Result<Row, JobActionError> {
    sqlx::query("select pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('shepherd/sweep'::text, 0::int8))")
        .execute(&mut *conn)
        .await?;
    sqlx::query_as(
        "select job_type, status, attempts, max_attempts, lock_by, shepherd.job_args(job) as args
         from apalis.jobs where id = $1 and job_type = any($2) for update",
    )
    .bind(id)
    .bind(
        [
            RECONCILE_QUEUE,
            CREATE_DEVICE_QUEUE,
            ASSIMILATE_QUEUE,
            DELETE_MACHINE_QUEUE,
        ]
        .map(str::to_string),
    )
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| JobActionError::NotFound(id.to_string()))
}

/// Another job that will still run and carries the same work (`key` is
/// `request` for creations, `device` for assimilations).
async fn other_live_job(
    conn: &mut PgConnection,
    id: &str,
    kind: &str,
    key: &str,
    value: &str,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar(
        "select id from apalis.jobs
         where job_type = $1 and id <> $2 and shepherd.job_args(job)->>$3 = $4
           and (status in ('Pending', 'Queued', 'Running')
                or (status = 'Failed' and attempts < max_attempts))
         limit 1",
    )
    .bind(kind)
    .bind(id)
    .bind(key)
    .bind(value)
    .fetch_optional(conn)
    .await
}

/// Runs a failed or killed job again, as soon as a worker is free.
pub async fn retry(pool: &PgPool, id: &str, by: &str, reason: &str) -> Result<(), JobActionError> {
    let mut tx = pool.begin().await?;
    let row = lock(&mut tx, id).await?;
    // A creation that ended in its own words (given up, refused, lost to
    // another party) did what a creation does: running the row again would
    // not help. What would is said instead.
    if row.status == "Done" && row.job_type == CREATE_DEVICE_QUEUE {
        let unit = row.arg("reservation").unwrap_or_else(|| "its unit".into());
        return Err(JobActionError::Refused(format!(
            "job {id} is a creation that ended (given up, refused or lost, as its page says); a \
             creation is not run again as a job. To have a machine on {unit}: clear the unit's \
             penalty (shepherd sinbin clear {unit} --reason ...), and the next pass creates \
             there, or enqueue a creation now (shepherd enqueue create-device --reservation \
             {unit})"
        )));
    }
    if !row.ended() {
        return Err(JobActionError::Refused(format!(
            "job {id} is {}: only a failed or killed job is retried (the queue ran this row {} \
             times; a job's own retries are new rows, listed by `shepherd history`)",
            row.status, row.attempts
        )));
    }
    let key = match row.job_type.as_str() {
        CREATE_DEVICE_QUEUE => Some(("request", "creation")),
        ASSIMILATE_QUEUE => Some(("device", "device")),
        DELETE_MACHINE_QUEUE => Some(("request", "deletion")),
        _ => None,
    };
    if let Some((key, what)) = key
        && let Some(value) = row.arg(key)
        && let Some(other) = other_live_job(&mut tx, id, &row.job_type, key, &value).await?
    {
        return Err(JobActionError::Refused(format!(
            "job {other} already carries this {what}: a second job would run it twice"
        )));
    }
    // The count of runs stays: a row that ran before must know it when it
    // runs again (its request may have been sent; see create_device), and
    // the queue claims a Pending row whatever its count.
    sqlx::query(
        "update apalis.jobs
         set status = 'Pending', run_at = now(), lock_by = null, lock_at = null,
             done_at = null
         where id = $1",
    )
    .bind(id)
    .execute(&mut *tx)
    .await?;
    record(
        &mut tx,
        vec![NewEvent::new(JobRetried {
            job: id.to_string(),
            kind: row.job_type.clone(),
            by: by.to_string(),
            reason: reason.to_string(),
        })],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Cancels a job that is waiting for a worker.
pub async fn cancel(pool: &PgPool, id: &str, by: &str, reason: &str) -> Result<(), JobActionError> {
    let mut tx = pool.begin().await?;
    let row = lock(&mut tx, id).await?;
    if !row.waiting() {
        return Err(JobActionError::Refused(format!(
            "job {id} is {}{}: only a job waiting for a worker is cancelled (a claimed job \
             finishes its attempt)",
            row.status,
            if row.lock_by.is_some() {
                ", claimed"
            } else {
                ""
            }
        )));
    }
    let mut cancelled = JobCancelled {
        job: id.to_string(),
        kind: row.job_type.clone(),
        by: by.to_string(),
        reason: reason.to_string(),
        reservation: None,
        request: None,
    };
    match row.job_type.as_str() {
        CREATE_DEVICE_QUEUE => {
            let (Some(reservation), Some(request)) = (
                row.arg("reservation").and_then(|r| r.parse::<Uuid>().ok()),
                row.arg("request").and_then(|r| r.parse::<Uuid>().ok()),
            ) else {
                return Err(JobActionError::Refused(format!(
                    "job {id} does not name its reservation and request"
                )));
            };
            // Any earlier job of this request, or an attempt of this one,
            // may have sent the create: that creation is settled by looking,
            // not forgotten.
            let runs: i64 = sqlx::query_scalar(
                "select count(*) from apalis.jobs
                 where job_type = $1 and shepherd.job_args(job)->>'request' = $2
                   and (id <> $3 or attempts > 0 or status <> 'Pending')",
            )
            .bind(CREATE_DEVICE_QUEUE)
            .bind(request.to_string())
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
            if runs > 0 {
                return Err(JobActionError::Refused(format!(
                    "the creation of job {id} has been tried before, and a device may exist for \
                     it: shepherd settles it by looking; pause creations to stop new ones"
                )));
            }
            cancelled.reservation = Some(reservation);
            cancelled.request = Some(request);
        }
        ASSIMILATE_QUEUE => {
            let awaiting: bool = sqlx::query_scalar(
                "select exists (select 1 from shepherd.unassimilated_devices
                                where device_id::text = $1)",
            )
            .bind(row.arg("device"))
            .fetch_one(&mut *tx)
            .await?;
            if awaiting {
                return Err(JobActionError::Refused(format!(
                    "the device of job {id} awaits assimilation, and the sweep would give it a \
                     new job: let it run, or release the machine"
                )));
            }
        }
        DELETE_MACHINE_QUEUE => {
            let (Some(machine), Some(request), Some(device)) = (
                row.arg("machine_id").and_then(|m| m.parse::<Uuid>().ok()),
                row.arg("request").and_then(|r| r.parse::<Uuid>().ok()),
                row.arg("device"),
            ) else {
                return Err(JobActionError::Refused(format!(
                    "job {id} does not name its machine and request"
                )));
            };
            // A delete that may have been sent is settled by looking, as a
            // create is: only a deletion never tried is cancelled.
            let runs: i64 = sqlx::query_scalar(
                "select count(*) from apalis.jobs
                 where job_type = $1 and shepherd.job_args(job)->>'request' = $2
                   and (id <> $3 or attempts > 0 or status <> 'Pending')",
            )
            .bind(DELETE_MACHINE_QUEUE)
            .bind(request.to_string())
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
            if runs > 0 {
                return Err(JobActionError::Refused(format!(
                    "the deletion of job {id} has been tried before, and the machine may be gone:                      shepherd settles it by looking; protect the machine to stop a deletion not yet sent"
                )));
            }
            record(
                &mut tx,
                vec![NewEvent::new(crate::events::event::DeletionCancelled {
                    machine_id: machine,
                    provider_id: device,
                    request,
                    reason: reason.to_string(),
                    by: by.to_string(),
                })],
            )
            .await?;
        }
        _ => {}
    }
    sqlx::query(
        "update apalis.jobs
         set status = 'Killed', done_at = now(),
             last_result = jsonb_build_object('Err', 'cancelled by ' || $2 || ': ' || $3)
         where id = $1",
    )
    .bind(id)
    .bind(by)
    .bind(reason)
    .execute(&mut *tx)
    .await?;
    record(&mut tx, vec![NewEvent::new(cancelled)]).await?;
    tx.commit().await?;
    Ok(())
}
