//! Putting jobs on the queue, and admitting creations against the limit.
//!
//! Jobs are pushed with `shepherd.push_job()` inside the caller's
//! transaction, so a job exists exactly when the events that asked for it
//! were committed. Admission is where invariant 2 lives: under one
//! cluster-wide lock it counts managed machines plus creations in flight and
//! admits no more than `max_machines` allows, and never a second creation
//! for a reservation that already has one pending.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use std::time::Duration;

use super::{ASSIMILATE_QUEUE, AssimilateArgs, CREATE_DEVICE_QUEUE, CreateDeviceArgs};
use super::{DELETE_MACHINE_QUEUE, DeleteMachineArgs};
use super::{RECONCILE_QUEUE, ReconcileArgs};
use crate::cluster::MachineLimit;
use crate::events::event::{CreationRefused, CreationRequested};
use crate::events::{NewEvent, StoreError, record};

/// Pushes a job; `None` when its idempotency key was already used.
pub async fn push<T: Serialize>(
    conn: &mut PgConnection,
    queue: &str,
    args: &T,
    run_at: Option<DateTime<Utc>>,
    idempotency_key: Option<&str>,
) -> Result<Option<String>, sqlx::Error> {
    let args = serde_json::to_value(args).expect("job arguments are plain data");
    sqlx::query_scalar("select shepherd.push_job($1, $2, coalesce($3, now()), 25, $4)")
        .bind(queue)
        .bind(args)
        .bind(run_at)
        .bind(idempotency_key)
        .fetch_one(&mut *conn)
        .await
}

/// Pushes an Assimilate and, in the same statement, gives back the lease
/// `lease` (key and holder) held over what the job follows from: one round
/// trip fewer for every creation that made a machine.
pub async fn push_assimilate_releasing(
    conn: &mut PgConnection,
    args: &AssimilateArgs,
    lease: (&str, Uuid),
) -> Result<Option<String>, sqlx::Error> {
    let args = serde_json::to_value(args).expect("job arguments are plain data");
    sqlx::query_scalar(
        "with given_back as (delete from shepherd.leases where key = $3 and lease = $4)
         select shepherd.push_job($1, $2, now(), 25, null)",
    )
    .bind(ASSIMILATE_QUEUE)
    .bind(args)
    .bind(lease.0)
    .bind(lease.1)
    .fetch_one(&mut *conn)
    .await
}

/// Pushes a created machine's Assimilate already claimed by `claimant`, a
/// registered apalis worker that runs it next (`jobs::follow_up`), and
/// gives back `lease` (key and holder) in the same statement. Its `run_at`
/// is the statement's clock, after the transaction's `now()`, so apalis's
/// insert trigger raises no notification: no queue worker wakes to fetch a
/// row that is already claimed.
pub async fn push_assimilate_claimed(
    conn: &mut PgConnection,
    args: &AssimilateArgs,
    lease: Option<(&str, Uuid)>,
    claimant: &str,
) -> Result<String, sqlx::Error> {
    let args = serde_json::to_value(args).expect("job arguments are plain data");
    let (key, holder) = lease.unzip();
    sqlx::query_scalar(
        "with given_back as (delete from shepherd.leases where key = $3 and lease = $4)
         insert into apalis.jobs
             (id, job_type, job, status, attempts, max_attempts, run_at, priority, lock_by, lock_at)
         values (apalis.generate_ulid(), $1, convert_to($2::text, 'UTF8'), 'Queued', 0, 25,
                 clock_timestamp(), 0, $5, now())
         returning id",
    )
    .bind(ASSIMILATE_QUEUE)
    .bind(args)
    .bind(key)
    .bind(holder)
    .bind(claimant)
    .fetch_one(&mut *conn)
    .await
}

/// Hands a row `claimant` claimed itself back to the queue unrun: its run
/// was cut short, or its claim's commit went unanswered. Nothing where the
/// claim never committed or the row is no longer the claimant's.
pub async fn hand_back_claimed(
    conn: &mut PgConnection,
    job_id: &str,
    claimant: &str,
) -> Result<bool, sqlx::Error> {
    let handed = sqlx::query(
        "update apalis.jobs set status = 'Pending', lock_by = null, lock_at = null
         where id = $1 and lock_by = $2 and status in ('Queued', 'Running')",
    )
    .bind(job_id)
    .bind(claimant)
    .execute(&mut *conn)
    .await?;
    Ok(handed.rows_affected() == 1)
}

/// How a job that a worker claimed itself ended, in the words apalis
/// acknowledges its own with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    Done(String),
    /// Run again by the queue while it has attempts left.
    Failed(String),
    /// Never run again.
    Killed(String),
}

/// Acknowledges a job claimed by `claimant` as apalis would (its status,
/// its run counted, its result); a run that ended well is kept by the
/// acknowledgement's trigger. `false` when the row was no longer the
/// claimant's: the queue took it back from a claimant it thought dead, or
/// gave it to another worker meanwhile.
pub async fn finish_claimed(
    conn: &mut PgConnection,
    job_id: &str,
    claimant: &str,
    ending: &Ending,
) -> Result<bool, sqlx::Error> {
    let (status, result) = match ending {
        Ending::Done(r) => ("Done", serde_json::json!({ "Ok": r })),
        Ending::Failed(e) => ("Failed", serde_json::json!({ "Err": e })),
        Ending::Killed(e) => ("Killed", serde_json::json!({ "Err": e })),
    };
    let finished = sqlx::query(
        "update apalis.jobs
         set status = $3, attempts = attempts + 1, last_result = $4, done_at = now()
         where id = $1 and lock_by = $2 and status in ('Queued', 'Running')",
    )
    .bind(job_id)
    .bind(claimant)
    .bind(status)
    .bind(result)
    .execute(&mut *conn)
    .await?;
    Ok(finished.rows_affected() == 1)
}

pub async fn push_reconcile(
    conn: &mut PgConnection,
    args: &ReconcileArgs,
    idempotency_key: Option<&str>,
) -> Result<Option<String>, sqlx::Error> {
    push(conn, RECONCILE_QUEUE, args, None, idempotency_key).await
}

/// Pushes a pass to run at `at`, once per key.
pub async fn push_reconcile_at(
    conn: &mut PgConnection,
    args: &ReconcileArgs,
    at: DateTime<Utc>,
    idempotency_key: &str,
) -> Result<Option<String>, sqlx::Error> {
    push(conn, RECONCILE_QUEUE, args, Some(at), Some(idempotency_key)).await
}

pub async fn push_assimilate(
    conn: &mut PgConnection,
    args: &AssimilateArgs,
    run_at: Option<DateTime<Utc>>,
) -> Result<Option<String>, sqlx::Error> {
    push(conn, ASSIMILATE_QUEUE, args, run_at, None).await
}

/// Pushes a job to run `after` from now by the database's clock (the
/// queue compares `run_at` with it): a worker whose clock is off neither
/// delays a successor nor runs it early. `None` when its idempotency key
/// was already used.
pub async fn push_after<T: Serialize>(
    conn: &mut PgConnection,
    queue: &str,
    args: &T,
    after: Duration,
    idempotency_key: Option<&str>,
) -> Result<Option<String>, sqlx::Error> {
    let args = serde_json::to_value(args).expect("job arguments are plain data");
    sqlx::query_scalar(
        "select shepherd.push_job($1, $2, now() + $3::int8 * interval '1 millisecond', 25, $4)",
    )
    .bind(queue)
    .bind(args)
    .bind(super::lease::millis(after))
    .bind(idempotency_key)
    .fetch_one(&mut *conn)
    .await
}

/// Pushes a creation attempt, to run `after` from now by the database's
/// clock. The key is the request and attempt, so a retried push of the
/// same successor is stored once.
pub async fn push_create_device(
    conn: &mut PgConnection,
    args: &CreateDeviceArgs,
    after: Option<Duration>,
) -> Result<Option<String>, sqlx::Error> {
    let key = format!("{}/{}", args.request, args.attempt);
    let after = after.unwrap_or_default();
    push_after(conn, CREATE_DEVICE_QUEUE, args, after, Some(&key)).await
}

/// Pushes a deletion attempt, keyed by its request and attempt as a
/// creation's is (`shepherd.deprovision_machine()` keys its first alike).
pub async fn push_delete_machine(
    conn: &mut PgConnection,
    args: &DeleteMachineArgs,
    after: Option<Duration>,
) -> Result<Option<String>, sqlx::Error> {
    let key = format!("{}/{}", args.request, args.attempt);
    let after = after.unwrap_or_default();
    push_after(conn, DELETE_MACHINE_QUEUE, args, after, Some(&key)).await
}

/// How many creations the limit allows now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    pub managed: u64,
    pub in_flight: u64,
    /// The cluster's limit, read under the lock.
    pub limit: MachineLimit,
    /// `None`: no limit.
    pub room: Option<u64>,
}

/// Takes the capacity lock (held until the transaction ends) and counts
/// against the cluster's limit as recorded: never a process's own idea of it.
pub async fn lock_capacity(conn: &mut PgConnection) -> Result<Capacity, StoreError> {
    sqlx::query("select pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('shepherd/capacity'::text, 0::int8))")
        .execute(&mut *conn)
        .await?;
    // The limit and the counts in one round trip: this runs under the
    // cluster-wide lock, on every admission.
    let (limit, managed, in_flight): (Option<i64>, i64, i64) = sqlx::query_as(
        "select shepherd.max_machines(),
                (select count(*) from shepherd.managed_machines),
                (select count(*) from shepherd.in_flight)",
    )
    .fetch_one(&mut *conn)
    .await?;
    let limit = match limit {
        Some(n) if n >= 0 => MachineLimit(n as u64),
        _ => {
            return Err(StoreError::Invalid(
                "the cluster has no settings yet: start a worker once (its flags become the cluster's settings)"
                    .into(),
            ));
        }
    };
    let (managed, in_flight) = (managed as u64, in_flight as u64);
    Ok(Capacity {
        managed,
        in_flight,
        limit,
        room: limit.room(managed + in_flight),
    })
}

/// Why a reservation was not admitted.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    Paused {
        by: String,
        reason: String,
    },
    AtLimit {
        limit: MachineLimit,
    },
    AlreadyPending,
    AlreadyManaged,
    Penalised {
        until: DateTime<Utc>,
        cause: String,
    },
    /// The spend cap holds it back.
    SpendCap(super::spend::Held),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Paused { by, reason } => {
                write!(f, "creations are paused by {by}: {reason}")
            }
            Refusal::AtLimit { limit } => write!(
                f,
                "managed machines plus creations in flight are at the cluster's max_machines ({limit})"
            ),
            Refusal::AlreadyPending => f.write_str("a creation is already in flight for it"),
            Refusal::AlreadyManaged => f.write_str("it already has a managed machine"),
            Refusal::Penalised { until, cause } => write!(
                f,
                "it is penalised until {until} ({cause}); override the sinbin with a reason to create anyway"
            ),
            Refusal::SpendCap(held) => held.fmt(f),
        }
    }
}

/// Who asks for creations, and how they are to be admitted.
#[derive(Debug, Clone, Default)]
pub struct Admission<'a> {
    /// By hand (CLI or SQL) rather than by a pass.
    pub manual: bool,
    /// Push each admitted creation's job in the same transaction (a pass and
    /// the CLI); a job already running (pushed from SQL) goes on itself.
    pub push_jobs: bool,
    pub caused_by: Option<&'a str>,
    pub requested_by: Option<String>,
    /// An operator's reason to admit penalised reservations anyway.
    pub sinbin_override: Option<String>,
    /// What the provider says of the units beside their ids.
    pub units: &'a [UnitFacts],
}

/// What admission knows of a unit beside its id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitFacts {
    pub unit: Uuid,
    /// The stock it draws on (`Unit::scope`), where it shares one: a
    /// penalty of its scope holds it back as its own would.
    pub scope: Option<String>,
    /// Its place, where the provider has places (`web/3`).
    pub place: Option<String>,
    /// What the listing said a create needs (`Unit::hint`).
    pub hint: Option<serde_json::Value>,
}

/// Admits creations for `reservations` in order, as far as the cluster's
/// limit, the pause and the sinbin allow: records `CreationRequested` for
/// each and pushes its job when asked. Returns the admitted
/// `(reservation, request)` pairs and the refused ones. The caller commits.
pub async fn admit(
    conn: &mut PgConnection,
    reservations: &[(Uuid, Uuid)],
    how: &Admission<'_>,
) -> Result<(Vec<(Uuid, Uuid)>, Vec<(Uuid, Refusal)>), StoreError> {
    let capacity = lock_capacity(conn).await?;
    let paused = crate::events::views::read_pause(conn).await?;
    let ids: Vec<Uuid> = reservations.iter().map(|(r, _)| *r).collect();
    // In flight: a creation pending, or a device made and not yet assimilated.
    let pending: Vec<Uuid> = sqlx::query_scalar(
        "select reservation_id from shepherd.pending_creations where reservation_id = any($1)
         union
         select reservation_id from shepherd.unassimilated_devices where reservation_id = any($1)",
    )
    .bind(&ids)
    .fetch_all(&mut *conn)
    .await?;
    let managed: Vec<Uuid> = sqlx::query_scalar(
        "select reservation_id from shepherd.managed_machines where reservation_id = any($1)",
    )
    .bind(&ids)
    .fetch_all(&mut *conn)
    .await?;
    // Penalties of the units themselves, and of the stock they draw on.
    let scopes: Vec<String> = how.units.iter().filter_map(|u| u.scope.clone()).collect();
    let penalties: Vec<(Uuid, DateTime<Utc>, String, Option<String>)> = sqlx::query_as(
        "select reservation_id, until, cause, scope from shepherd.sinbin
         where (reservation_id = any($1) or scope = any($2)) and now() <= until",
    )
    .bind(&ids)
    .bind(&scopes)
    .fetch_all(&mut *conn)
    .await?;
    let penalised: Vec<(Uuid, DateTime<Utc>, String)> = reservations
        .iter()
        .filter_map(|(unit, _)| {
            let scope = how
                .units
                .iter()
                .find(|u| u.unit == *unit)
                .and_then(|u| u.scope.as_ref());
            penalties
                .iter()
                .find(|(r, _, _, s)| r == unit || (s.is_some() && s.as_ref() == scope))
                .map(|(_, until, cause, s)| {
                    let cause = match s {
                        Some(s) if Some(s) == scope => format!("{cause} (holds back {s})"),
                        _ => cause.clone(),
                    };
                    (*unit, *until, cause)
                })
        })
        .collect();

    // Read after the capacity lock: what the fleet costs cannot move under
    // it, as its size cannot.
    let mut spend = super::spend::Guard::read(conn).await?;
    let mut room = capacity.room;
    let mut admitted = Vec::new();
    let mut refused = Vec::new();
    for &(reservation, request) in reservations {
        let penalty = penalised.iter().find(|(r, _, _)| *r == reservation);
        if let Some(p) = &paused {
            refused.push((
                reservation,
                Refusal::Paused {
                    by: p.by.clone(),
                    reason: p.reason.clone(),
                },
            ));
        } else if pending.contains(&reservation) || admitted.iter().any(|(r, _)| *r == reservation)
        {
            refused.push((reservation, Refusal::AlreadyPending));
        } else if managed.contains(&reservation) {
            refused.push((reservation, Refusal::AlreadyManaged));
        } else if let Some((_, until, cause)) = penalty
            && how.sinbin_override.is_none()
        {
            refused.push((
                reservation,
                Refusal::Penalised {
                    until: *until,
                    cause: cause.clone(),
                },
            ));
        } else if room == Some(0) {
            refused.push((
                reservation,
                Refusal::AtLimit {
                    limit: capacity.limit,
                },
            ));
        } else if let Some(Err(held)) = spend.as_mut().map(|g| {
            g.admit(
                how.units
                    .iter()
                    .find(|u| u.unit == reservation)
                    .and_then(|u| u.place.as_deref())
                    .and_then(|place| place.split_once('/'))
                    .map(|(pool, _)| pool),
            )
        }) {
            refused.push((reservation, Refusal::SpendCap(held)));
        } else {
            room = room.map(|r| r - 1);
            admitted.push((reservation, request));
        }
    }
    let events: Vec<NewEvent> = admitted
        .iter()
        .map(|&(reservation, request)| {
            let overridden = penalised.iter().any(|(r, _, _)| *r == reservation);
            let e = NewEvent::new(CreationRequested {
                reservation,
                request,
                manual: how.manual,
                requested_by: how.requested_by.clone(),
                sinbin_override: how.sinbin_override.clone().filter(|_| overridden),
                place: how
                    .units
                    .iter()
                    .find(|u| u.unit == reservation)
                    .and_then(|u| u.place.clone()),
            });
            match how.caused_by {
                Some(job) => e.caused_by(job),
                None => e,
            }
        })
        .collect();
    record(conn, events).await?;
    if how.push_jobs {
        for &(reservation, request) in &admitted {
            let args = CreateDeviceArgs {
                requested_by: how.requested_by.clone(),
                hint: how
                    .units
                    .iter()
                    .find(|u| u.unit == reservation)
                    .and_then(|u| u.hint.clone()),
                ..CreateDeviceArgs::admitted(reservation, request)
            };
            push_create_device(conn, &args, None).await?;
        }
    }
    Ok((admitted, refused))
}

/// Records that a manual creation was refused.
pub async fn record_refusal(
    conn: &mut PgConnection,
    reservation: Uuid,
    request: Uuid,
    reason: &Refusal,
    caused_by: Option<&str>,
) -> Result<(), StoreError> {
    let mut e = NewEvent::new(CreationRefused {
        reservation,
        request,
        reason: reason.to_string(),
    });
    if let Some(job) = caused_by {
        e = e.caused_by(job);
    }
    record(conn, vec![e]).await?;
    Ok(())
}
