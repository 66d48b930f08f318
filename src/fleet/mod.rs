//! What an operator asks first: how the fleet stands, and what the next
//! pass would do. Read-only; shared by `shepherd status`, `shepherd plan`,
//! the status page and the metrics.

pub mod cost;
pub mod ledger;
mod liveness;
mod plan;
pub use liveness::{
    CLOCK_OFF_MS, Liveness, LivenessState, ProcessRecord, ProcessRow, clock_offset_ms,
    process_name, record_process,
};
pub use plan::{Plan, PlanError, WouldDelete, WouldHold, plan};

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::events::event::{DiscrepancyFound, Event, ReconcileFinished};
use crate::events::store::read_stream;
use crate::events::views::{self, Pause};

/// Whether managed machine `m` is protected: the view's flag, or the
/// latest protection event on its device's stream, whichever managed life
/// of the device recorded it (protection follows the server; the view's
/// row is new for each life). Every read that shows or decides protection
/// uses it.
pub const PROTECTED: &str = "(m.protected or coalesce(
    (select e.event_type = 'machine_protected' from shepherd.events e
     where e.stream = 'device/' || m.provider_id
       and e.event_type in ('machine_protected', 'machine_unprotected')
     order by e.position desc limit 1), false))";

/// Whether managed machine `m` was ready once: its view row says so, or a
/// pass saw its device ready in an earlier managed life.
pub const READY_ONCE: &str = "(m.ready_at is not null
    or exists (select 1 from shepherd.events e
               where e.stream = 'device/' || m.provider_id
                 and e.event_type = 'machine_ready'))";

/// The devices whose managed machine is protected, by [`PROTECTED`].
pub async fn protected_devices(
    conn: &mut sqlx::PgConnection,
) -> Result<std::collections::HashSet<String>, sqlx::Error> {
    let rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "select m.provider_id from shepherd.managed_machines m where {PROTECTED}"
    )))
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().collect())
}
pub use crate::jobs::pass::Skip;

#[derive(Debug, Clone, Serialize)]
pub struct QueueRow {
    pub kind: String,
    pub state: String,
    pub jobs: i64,
    /// Age of the oldest job in this state, by its run time.
    pub oldest_seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PenaltyRow {
    pub reservation_id: Uuid,
    pub until: DateTime<Utc>,
    pub seconds_left: i64,
    pub failures: i32,
    pub cause: String,
    /// The stock the penalty holds back with the reservation, if any.
    pub scope: Option<String>,
}

/// The pools as the last pass saw them.
#[derive(Debug, Clone, Serialize)]
pub struct PoolsSeen {
    pub surveyed_at: DateTime<Utc>,
    pub pools: Vec<PoolState>,
    /// What the pass's listing asked for and cost.
    pub listing: Option<crate::provider::ListingCost>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PoolState {
    #[serde(flatten)]
    pub report: crate::provider::PoolReport,
    /// Until when a penalty for want of stock holds the pool's free places
    /// back.
    pub held_until: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct UnresolvedRow {
    pub reservation_id: Uuid,
    pub request: Option<String>,
    pub seconds: f64,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkerRow {
    pub name: String,
    pub queue: String,
    pub seconds_since_seen: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LastReconcile {
    pub run: Uuid,
    pub started_at: DateTime<Utc>,
    pub finished: Option<ReconcileFinished>,
    pub refused: Option<String>,
    pub discrepancy: Option<DiscrepancyFound>,
    /// Pools holding more machines of ours than declared, as it saw them.
    pub surplus: Vec<crate::events::event::SurplusReport>,
    /// Deletions a guard held back.
    pub held: Vec<crate::events::event::DeletionsHeld>,
}

/// A machine leaving: its deletion requested and not ended.
#[derive(Debug, Clone, Serialize)]
pub struct LeavingRow {
    pub machine_id: Uuid,
    pub device: String,
    pub hostname: Option<String>,
    pub pool: Option<String>,
    pub cause: String,
    pub message: String,
    pub requested_by: String,
    pub seconds: f64,
    /// The delete may be sent (the leave hook answered, or had nothing to
    /// wait for).
    pub cleared: bool,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Overview {
    pub now: DateTime<Utc>,
    /// The cluster's limit; `None` before any worker recorded the settings.
    pub max_machines: Option<u64>,
    /// The cluster's settings as stored, by key.
    pub settings: std::collections::BTreeMap<String, serde_json::Value>,
    pub managed: i64,
    pub pending_creations: i64,
    pub unassimilated_devices: i64,
    /// Creations whose outcome is unknown, oldest first.
    pub unresolved: Vec<UnresolvedRow>,
    /// Age of the oldest thing in flight (creation or assimilation).
    pub oldest_in_flight_seconds: Option<f64>,
    pub penalised: Vec<PenaltyRow>,
    /// `None` when no pass has surveyed pools (a provider without them).
    pub pools: Option<PoolsSeen>,
    pub queue: Vec<QueueRow>,
    pub last_reconcile: Option<LastReconcile>,
    /// When the last pass that ended without refusing finished.
    pub last_successful_reconcile: Option<DateTime<Utc>>,
    pub workers: Vec<WorkerRow>,
    /// What the worker processes recorded of themselves at start.
    pub process_records: Vec<ProcessRecord>,
    pub paused: Option<Pause>,
    pub events: i64,
    /// The cluster's pools as declared (its desired state).
    pub desired: Vec<crate::pools::PoolRow>,
    /// Machines leaving, oldest first.
    pub leaving: Vec<LeavingRow>,
    pub protected: i64,
    /// `Some` while deletions are paused.
    pub deletions_paused: Option<Pause>,
    /// The scheduler's period as its last passes were spaced; `None` before
    /// it has run two.
    pub tick_seconds: Option<f64>,
    /// The spend cap and what the fleet costs against it; `None`: no cap.
    pub spend_cap: Option<crate::jobs::spend::CapState>,
    /// The last time the database was found restored or failed over
    /// (`database_moved`), within the last week.
    pub database_moved: Option<MovedRow>,
}

/// A move of the database, as `database_moved` recorded it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct MovedRow {
    pub at: DateTime<Utc>,
    pub from: String,
    pub to: String,
}

impl Overview {
    pub fn in_flight(&self) -> i64 {
        self.pending_creations + self.unassimilated_devices
    }
}

pub async fn overview(pool: &PgPool) -> Result<Overview, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("set transaction isolation level repeatable read read only")
        .execute(&mut *tx)
        .await?;
    let now: DateTime<Utc> = sqlx::query_scalar("select now()")
        .fetch_one(&mut *tx)
        .await?;
    let settings = crate::cluster::stored(&mut tx).await?;
    let unresolved = sqlx::query_as::<_, (Uuid, Option<String>, f64, Option<String>)>(
        "select reservation_id, request, extract(epoch from now() - unresolved_since)::float8,
                last_error
         from shepherd.pending_creations where unresolved_since is not null
         order by unresolved_since",
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(
        |(reservation_id, request, seconds, last_error)| UnresolvedRow {
            reservation_id,
            request,
            seconds,
            last_error,
        },
    )
    .collect();
    let oldest_in_flight_seconds: Option<f64> = sqlx::query_scalar(
        "select extract(epoch from now() - min(since))::float8 from shepherd.in_flight",
    )
    .fetch_one(&mut *tx)
    .await?;
    let (managed, pending_creations, unassimilated_devices, events): (i64, i64, i64, i64) =
        sqlx::query_as(
            "select (select count(*) from shepherd.managed_machines),
                    (select count(*) from shepherd.pending_creations),
                    (select count(*) from shepherd.unassimilated_devices),
                    (select coalesce(max(position), 0) from shepherd.events)",
        )
        .fetch_one(&mut *tx)
        .await?;
    let penalised: Vec<PenaltyRow> =
        sqlx::query_as::<_, (Uuid, DateTime<Utc>, i32, String, Option<String>)>(
            "select reservation_id, until, failures, cause, scope from shepherd.sinbin
             where now() <= until order by until desc",
        )
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(
            |(reservation_id, until, failures, cause, scope)| PenaltyRow {
                reservation_id,
                until,
                seconds_left: (until - now).num_seconds().max(0),
                failures,
                cause,
                scope,
            },
        )
        .collect();
    // The last pass's survey of the pools; a cluster keeps one provider, so
    // none means a provider without pools.
    let surveyed: Option<(i32, serde_json::Value, DateTime<Utc>)> = sqlx::query_as(
        "select schema_version, body, recorded_at from shepherd.events
         where event_type = 'pools_surveyed'
         order by position desc limit 1",
    )
    .fetch_optional(&mut *tx)
    .await?;
    let mut pools = surveyed.and_then(|(version, body, surveyed_at)| {
        match Event::decode("pools_surveyed", version, body) {
            Ok(Event::PoolsSurveyed(e)) => Some(PoolsSeen {
                surveyed_at,
                listing: e.listing,
                pools: e
                    .pools
                    .into_iter()
                    .map(|report| PoolState {
                        held_until: penalised
                            .iter()
                            .filter(|p| p.scope.as_deref() == Some(report.scope.as_str()))
                            .map(|p| p.until)
                            .max(),
                        report,
                    })
                    .collect(),
            }),
            _ => None,
        }
    });
    // A pass that did not read the stock (at the limit, or after a
    // discrepancy) recorded no prices: each pool's last known one stands,
    // if it was read for the plan and site the pool has.
    if let Some(seen) = pools.as_mut()
        && seen.pools.iter().any(|p| p.report.price.is_none())
    {
        let known = crate::jobs::spend::last_prices(&mut tx).await?;
        for p in seen.pools.iter_mut().filter(|p| p.report.price.is_none()) {
            if let Some((plan, site, price)) = known.get(&p.report.name)
                && *plan == p.report.plan
                && site.eq_ignore_ascii_case(&p.report.site)
            {
                p.report.price = Some(price.clone());
            }
        }
    }
    let queue = sqlx::query_as::<_, (String, String, i64, Option<f64>)>(
        "select kind, state, jobs, extract(epoch from oldest_age)::float8 from shepherd.queue_depth",
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|(kind, state, jobs, oldest_seconds)| QueueRow {
        kind,
        state,
        jobs,
        oldest_seconds,
    })
    .collect();
    let workers = sqlx::query_as::<_, (String, String, f64)>(
        "select id, worker_type, extract(epoch from now() - last_seen)::float8 from apalis.workers
         where last_seen > now() - interval '10 minutes' order by id",
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|(name, queue, seconds_since_seen)| WorkerRow {
        name,
        queue,
        seconds_since_seen,
    })
    .collect();
    let process_records = sqlx::query_as::<_, ProcessRecord>(
        "select name, version, started_at, clock_offset_ms from shepherd.processes order by name",
    )
    .fetch_all(&mut *tx)
    .await?;
    let spend_cap = crate::jobs::spend::CapState::read(&mut tx).await?;
    let last_run: Option<(String, DateTime<Utc>)> = sqlx::query_as(
        "select stream, recorded_at from shepherd.events where event_type = 'reconcile_started'
         order by position desc limit 1",
    )
    .fetch_optional(&mut *tx)
    .await?;
    let last_successful_reconcile: Option<DateTime<Utc>> = sqlx::query_scalar(
        "select max(f.recorded_at) from shepherd.events f
         where f.event_type = 'reconcile_finished'
           and not exists (select 1 from shepherd.events r
                           where r.stream = f.stream and r.event_type = 'reconcile_refused')",
    )
    .fetch_one(&mut *tx)
    .await?;
    // The scheduler's period, as its last passes were spaced (the median
    // gap, so a pass asked for by hand does not shorten it).
    let ticks: Vec<DateTime<Utc>> = sqlx::query_scalar(
        "select recorded_at from shepherd.events
         where event_type = 'reconcile_started' and body->>'requested_by' = 'scheduler'
         order by recorded_at desc limit 7",
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut gaps: Vec<f64> = ticks
        .windows(2)
        .map(|w| (w[0] - w[1]).num_milliseconds() as f64 / 1000.0)
        .collect();
    gaps.sort_by(f64::total_cmp);
    let tick_seconds = gaps.get(gaps.len() / 2).copied();
    let paused = views::read_pause(&mut tx).await?;
    let deletions_paused = views::read_deletions_pause(&mut tx).await?;
    let desired = crate::pools::read(&mut tx).await?;
    let protected: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "select count(*) from shepherd.managed_machines m where {PROTECTED}"
    )))
    .fetch_one(&mut *tx)
    .await?;
    let leaving = sqlx::query_as::<
        _,
        (
            Uuid,
            String,
            Option<String>,
            Option<String>,
            String,
            String,
            String,
            f64,
            bool,
            Option<String>,
        ),
    >(
        "select d.machine_id, d.provider_id, m.hostname, d.pool, d.cause, d.message,
                d.requested_by, extract(epoch from now() - d.requested_at)::float8,
                d.cleared_at is not null, d.last_error
         from shepherd.pending_deletions d
         left join shepherd.managed_machines m on m.machine_id = d.machine_id
         order by d.requested_at",
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(
        |(
            machine_id,
            device,
            hostname,
            pool,
            cause,
            message,
            requested_by,
            seconds,
            cleared,
            last_error,
        )| {
            LeavingRow {
                machine_id,
                device,
                hostname,
                pool,
                cause,
                message,
                requested_by,
                seconds,
                cleared,
                last_error,
            }
        },
    )
    .collect();
    let database_moved = sqlx::query_as::<_, MovedRow>(
        "select recorded_at as at, coalesce(body->>'from', '') as from, coalesce(body->>'to', '') as to
         from shepherd.events
         where event_type = 'database_moved' and recorded_at > now() - interval '7 days'
         order by position desc limit 1",
    )
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;

    let last_reconcile = match last_run {
        Some((stream, started_at)) => {
            let events = read_stream(pool, &stream).await.map_err(|e| match e {
                crate::events::StoreError::Database(d) => d,
                other => sqlx::Error::Protocol(other.to_string()),
            })?;
            let mut last = LastReconcile {
                run: stream
                    .strip_prefix("reconcile/")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_default(),
                started_at,
                finished: None,
                refused: None,
                discrepancy: None,
                surplus: vec![],
                held: vec![],
            };
            for e in events {
                match e.event {
                    Event::ReconcileFinished(f) => last.finished = Some(f),
                    Event::ReconcileRefused(r) => last.refused = Some(r.reason),
                    Event::DiscrepancyFound(d) => last.discrepancy = Some(d),
                    Event::SurplusFound(s) => last.surplus = s.pools,
                    Event::DeletionsHeld(h) => last.held.push(h),
                    _ => {}
                }
            }
            Some(last)
        }
        None => None,
    };
    Ok(Overview {
        database_moved,
        now,
        max_machines: settings.get("max_machines").and_then(|v| v.as_u64()),
        settings,
        unresolved,
        oldest_in_flight_seconds,
        managed,
        pending_creations,
        unassimilated_devices,
        penalised,
        pools,
        queue,
        last_reconcile,
        last_successful_reconcile,
        workers,
        process_records,
        spend_cap,
        paused,
        events,
        desired,
        leaving,
        protected,
        deletions_paused,
        tick_seconds,
    })
}
