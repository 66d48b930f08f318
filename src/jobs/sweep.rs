//! The sweep: nothing stays in flight (or leaving) without a job that will
//! end it.
//!
//! A creation in flight is owned by its request, and a device awaiting
//! assimilation by its device id; each should have a live job (pending,
//! claimed, running, or failed with attempts left). A job can still vanish:
//! killed, pruned, or ended by a release that did not record its close.
//! The sweep finds in-flight rows with no live job and gives each one: a
//! creation resumes under its own request (the job reads the reservation,
//! recognises its witnessed device, or tries again, and settles by looking
//! if its outcome stays unknown); a device is assimilated again. Each
//! resumption is an event.
//!
//! Safe with any number of workers: one sweep runs at a time (a
//! transaction-scoped advisory lock, tried, not awaited), and it pushes its
//! jobs in the transaction that found the rows, so the next sweep sees them
//! live. Admission commits a pending row together with its job, so a row
//! without a live job is never one that is still being admitted.

use sqlx::PgPool;
use uuid::Uuid;

use super::queue;
use super::{AssimilateArgs, CreateDeviceArgs, DeleteMachineArgs};
use crate::events::event::{AssimilationResumed, CreationResumed};
use crate::events::{NewEvent, StoreError, record};

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Another sweep held the lock; this one looked at nothing.
    pub skipped: bool,
    /// Reservations whose creation was given a job again.
    pub creations_resumed: Vec<Uuid>,
    /// Devices whose assimilation was given a job again.
    pub assimilations_resumed: Vec<String>,
    /// Machines whose deletion was given a job again.
    pub deletions_resumed: Vec<String>,
}

/// Job states in which a job will still run (apalis claims `Failed` rows
/// with attempts left again; `Queued`/`Running` rows of a dead worker are
/// handed back by apalis's own rescue).
macro_rules! live {
    () => {
        "(j.status in ('Pending', 'Queued', 'Running')
          or (j.status = 'Failed' and j.attempts < j.max_attempts))"
    };
}

const REASON: &str = "no job was left to end it";

pub async fn run_once(pool: &PgPool) -> Result<SweepOutcome, StoreError> {
    let mut tx = pool.begin().await?;
    let got: bool = sqlx::query_scalar(
        "select pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtextextended('shepherd/sweep'::text, 0::int8))",
    )
    .fetch_one(&mut *tx)
    .await?;
    if !got {
        return Ok(SweepOutcome {
            skipped: true,
            ..Default::default()
        });
    }
    let creations: Vec<(Uuid, String, i32)> = sqlx::query_as(concat!(
        "with live as (
             select shepherd.job_args(j.job)->>'request' as request
             from apalis.jobs j where j.job_type = 'create_device' and ",
        live!(),
        "),
         tried as (
             select shepherd.job_args(j.job)->>'request' as request,
                    -- A row whose attempt is not a number (a bad row from
                    -- SQL, killed on decode) must not stop the sweep.
                    max(case when jsonb_typeof(shepherd.job_args(j.job)->'attempt') = 'number'
                             then least((shepherd.job_args(j.job)->>'attempt')::numeric, 1000000)::int
                        end) as attempt
             from apalis.jobs j where j.job_type = 'create_device'
             group by 1)
         select p.reservation_id, p.request, coalesce(t.attempt, 0)
         from shepherd.pending_creations p
         left join tried t on t.request = p.request
         where p.request is not null
           and not exists (select 1 from live where live.request = p.request)
         order by p.reservation_id"
    ))
    .fetch_all(&mut *tx)
    .await?;
    let devices: Vec<(String, Option<Uuid>)> = sqlx::query_as(concat!(
        "with live as (
             select shepherd.job_args(j.job)->>'device' as device
             from apalis.jobs j where j.job_type = 'assimilate' and ",
        live!(),
        ")
         select d.device_id, d.reservation_id from shepherd.unassimilated_devices d
         where not exists (select 1 from live where live.device = d.device_id)
         order by d.device_id"
    ))
    .fetch_all(&mut *tx)
    .await?;

    let deletions: Vec<(Uuid, String, String, i32)> = sqlx::query_as(concat!(
        "with live as (
             select shepherd.job_args(j.job)->>'request' as request
             from apalis.jobs j where j.job_type = 'delete_machine' and ",
        live!(),
        "),
         tried as (
             select shepherd.job_args(j.job)->>'request' as request,
                    max(case when jsonb_typeof(shepherd.job_args(j.job)->'attempt') = 'number'
                             then least((shepherd.job_args(j.job)->>'attempt')::numeric, 1000000)::int
                        end) as attempt
             from apalis.jobs j where j.job_type = 'delete_machine'
             group by 1)
         select d.machine_id, d.provider_id, d.request, coalesce(t.attempt, 0)
         from shepherd.pending_deletions d
         left join tried t on t.request = d.request
         where not exists (select 1 from live where live.request = d.request)
         order by d.machine_id"
    ))
    .fetch_all(&mut *tx)
    .await?;

    let mut out = SweepOutcome::default();
    let mut events = Vec::new();
    let mut create_jobs = Vec::new();
    let mut assimilate_jobs = Vec::new();
    for (reservation, request, last_attempt) in creations {
        let Ok(request) = request.parse::<Uuid>() else {
            continue;
        };
        // The crashed run may have posted: resume as unknown, so a failure
        // ends by looking, never by freeing the slot on a guess. The attempt
        // number follows the highest used, so its key is new.
        let args = CreateDeviceArgs {
            attempt: (last_attempt.max(0) as u32) + 1,
            unknown: true,
            ..CreateDeviceArgs::admitted(reservation, request)
        };
        create_jobs.push(args);
        events.push(NewEvent::new(CreationResumed {
            reservation,
            request,
            reason: REASON.into(),
        }));
        out.creations_resumed.push(reservation);
    }
    for (device, reservation) in devices {
        let args = AssimilateArgs {
            device: device.clone(),
            reservation,
            manual: false,
            created: None,
            attempt: 1,
        };
        assimilate_jobs.push(args);
        events.push(NewEvent::new(AssimilationResumed {
            device: device.clone(),
            reason: REASON.into(),
        }));
        out.assimilations_resumed.push(device);
    }
    let mut delete_jobs = Vec::new();
    for (machine_id, device, request, last_attempt) in deletions {
        let Ok(request) = request.parse::<Uuid>() else {
            continue;
        };
        // The crashed run may have sent its delete: the next one looks
        // first.
        delete_jobs.push(DeleteMachineArgs {
            attempt: (last_attempt.max(0) as u32) + 1,
            unknown: true,
            ..DeleteMachineArgs::first(machine_id, device.clone(), request)
        });
        out.deletions_resumed.push(device);
    }
    if !events.is_empty() || !delete_jobs.is_empty() {
        tracing::warn!(
            deletions = ?out.deletions_resumed,
            creations = ?out.creations_resumed,
            assimilations = ?out.assimilations_resumed,
            "in-flight work had no job left; the sweep resumed it"
        );
    }
    // The events first: an append is its transaction's first write.
    record(&mut tx, events).await?;
    for args in &create_jobs {
        queue::push_create_device(&mut tx, args, None).await?;
    }
    for args in &assimilate_jobs {
        queue::push_assimilate(&mut tx, args, None).await?;
    }
    for args in &delete_jobs {
        queue::push_delete_machine(&mut tx, args, None).await?;
    }
    tx.commit().await?;
    Ok(out)
}
