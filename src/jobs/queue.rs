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

use super::{ASSIMILATE_QUEUE, AssimilateArgs, CREATE_DEVICE_QUEUE, CreateDeviceArgs};
use super::{RECONCILE_QUEUE, ReconcileArgs};
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

pub async fn push_reconcile(
    conn: &mut PgConnection,
    args: &ReconcileArgs,
    idempotency_key: Option<&str>,
) -> Result<Option<String>, sqlx::Error> {
    push(conn, RECONCILE_QUEUE, args, None, idempotency_key).await
}

pub async fn push_assimilate(
    conn: &mut PgConnection,
    args: &AssimilateArgs,
    run_at: Option<DateTime<Utc>>,
) -> Result<Option<String>, sqlx::Error> {
    push(conn, ASSIMILATE_QUEUE, args, run_at, None).await
}

/// Pushes a creation attempt. The key is the request and attempt, so a
/// retried push of the same successor is stored once.
pub async fn push_create_device(
    conn: &mut PgConnection,
    args: &CreateDeviceArgs,
    run_at: Option<DateTime<Utc>>,
) -> Result<Option<String>, sqlx::Error> {
    let key = format!("{}/{}", args.request, args.attempt);
    push(conn, CREATE_DEVICE_QUEUE, args, run_at, Some(&key)).await
}

/// How many creations the limit allows now, and which of the given
/// reservations are already taken care of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    pub managed: u64,
    pub in_flight: u64,
    /// `None`: no limit.
    pub room: Option<u64>,
}

/// Takes the capacity lock (held until the transaction ends) and counts.
pub async fn lock_capacity(
    conn: &mut PgConnection,
    max_machines: u64,
) -> Result<Capacity, sqlx::Error> {
    sqlx::query("select pg_advisory_xact_lock(hashtextextended('shepherd/capacity', 0))")
        .execute(&mut *conn)
        .await?;
    let (managed, in_flight): (i64, i64) = sqlx::query_as(
        "select (select count(*) from shepherd.managed_machines),
                (select count(*) from shepherd.pending_creations)
              + (select count(*) from shepherd.unassimilated_devices)",
    )
    .fetch_one(&mut *conn)
    .await?;
    let (managed, in_flight) = (managed as u64, in_flight as u64);
    let room = (max_machines > 0).then(|| max_machines.saturating_sub(managed + in_flight));
    Ok(Capacity {
        managed,
        in_flight,
        room,
    })
}

/// Why a reservation was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Paused { by: String, reason: String },
    AtLimit { max_machines: u64 },
    AlreadyPending,
    AlreadyManaged,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Paused { by, reason } => {
                write!(f, "creations are paused by {by}: {reason}")
            }
            Refusal::AtLimit { max_machines } => write!(
                f,
                "managed machines plus creations in flight are at max_machines ({max_machines})"
            ),
            Refusal::AlreadyPending => f.write_str("a creation is already pending for it"),
            Refusal::AlreadyManaged => f.write_str("it already has a managed machine"),
        }
    }
}

/// Admits creations for `reservations` in order, as far as the limit
/// allows: records `CreationRequested` for each and, when `push_jobs`, pushes
/// its job. Returns the admitted `(reservation, request)` pairs and the
/// refused ones. The caller commits.
pub async fn admit(
    conn: &mut PgConnection,
    reservations: &[(Uuid, Uuid)],
    max_machines: u64,
    manual: bool,
    push_jobs: bool,
    caused_by: Option<&str>,
) -> Result<(Vec<(Uuid, Uuid)>, Vec<(Uuid, Refusal)>), StoreError> {
    let capacity = lock_capacity(conn, max_machines).await?;
    let paused = crate::events::views::read_pause(conn).await?;
    let ids: Vec<Uuid> = reservations.iter().map(|(r, _)| *r).collect();
    let pending: Vec<Uuid> = sqlx::query_scalar(
        "select reservation_id from shepherd.pending_creations where reservation_id = any($1)",
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
    let mut room = capacity.room;
    let mut admitted = Vec::new();
    let mut refused = Vec::new();
    for &(reservation, request) in reservations {
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
        } else if room == Some(0) {
            refused.push((reservation, Refusal::AtLimit { max_machines }));
        } else {
            room = room.map(|r| r - 1);
            admitted.push((reservation, request));
        }
    }
    let events: Vec<NewEvent> = admitted
        .iter()
        .map(|&(reservation, request)| {
            let e = NewEvent::new(CreationRequested {
                reservation,
                request,
                manual,
            });
            match caused_by {
                Some(job) => e.caused_by(job),
                None => e,
            }
        })
        .collect();
    record(conn, events).await?;
    if push_jobs {
        for &(reservation, request) in &admitted {
            let args = CreateDeviceArgs {
                reservation,
                request,
                attempt: 1,
                admitted: true,
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
