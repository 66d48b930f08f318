//! What an operator asks first: how the fleet stands, and what the next
//! pass would do. Read-only; shared by `shepherd status`, `shepherd plan`,
//! the status page and the metrics.

pub mod cost;
pub mod ledger;
mod liveness;
pub use liveness::{
    CLOCK_OFF_MS, Liveness, LivenessState, ProcessRecord, ProcessRow, clock_offset_ms,
    process_name, record_process,
};

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
use crate::jobs::pass::{self, compare, our_requests, read_fleet};
use crate::provider::{Provider, ProviderError};

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

#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// False before any worker recorded the cluster's settings: the plan
    /// then used this command's own flags.
    pub settings_recorded: bool,
    pub max_machines: u64,
    pub chunk_size: u64,
    pub managed: u64,
    pub in_flight: u64,
    pub devices_listed: usize,
    /// What the listing asked for and cost, where the provider says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listing: Option<crate::provider::ListingCost>,
    pub discrepancy: Option<DiscrepancyFound>,
    pub would_adopt: Vec<String>,
    pub at_limit: bool,
    pub paused: Option<Pause>,
    pub reservations_listed: usize,
    pub would_create: Vec<Uuid>,
    pub skipped: Vec<(Uuid, Skip)>,
    /// How each pool stands (a provider with pools).
    pub pools: Vec<crate::provider::PoolReport>,
    /// Names an operator reads for the units above, where the provider
    /// has them (Latitude: `web/3`).
    pub labels: std::collections::BTreeMap<Uuid, String>,
    /// Machines the pass would delete (surplus, replacements), and why.
    pub would_delete: Vec<WouldDelete>,
    /// Deletions a guard would hold back.
    pub held: Vec<WouldHold>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct WouldDelete {
    pub device: String,
    pub pool: String,
    pub cause: String,
    pub message: String,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct WouldHold {
    pub pool: String,
    pub guard: String,
    pub held: u32,
    pub message: String,
}

/// The next pass, dry: the same listings and the same rules, nothing written.
pub async fn plan(
    pool: &PgPool,
    provider: &dyn Provider,
    config: &crate::config::ProvisionerConfig,
) -> Result<Plan, PlanError> {
    let current =
        crate::cluster::current(pool, &crate::cluster::ClusterSettings::proposed_by(config))
            .await?;
    let settings = current.settings;
    let before = read_fleet(pool).await?;
    // As a pass reads them, in one survey (Latitude lists its servers once),
    // and like a pass, no units when already at the limit.
    let full = settings
        .max_machines
        .is_reached(before.managed.len() as u64 + before.in_flight());
    let survey = provider.survey(!full).await;
    let listing = survey.listing.clone();
    let devices = survey.machines?;
    let fleet = read_fleet(pool).await?;
    let ours = our_requests(pool, &devices).await?;
    let comparison = compare(
        &devices,
        &before,
        &fleet,
        &config.device_prefix,
        settings.assimilate,
        &ours,
    );
    let paused = views::read_pause(&mut *pool.acquire().await?).await?;
    let mut plan = Plan {
        settings_recorded: current.recorded,
        max_machines: settings.max_machines.0,
        chunk_size: settings.chunk_size,
        managed: fleet.managed.len() as u64,
        in_flight: fleet.in_flight() + comparison.adopt.len() as u64,
        devices_listed: devices.len(),
        listing,
        discrepancy: None,
        would_adopt: comparison.adopt.iter().map(|a| a.device.clone()).collect(),
        at_limit: false,
        paused,
        reservations_listed: 0,
        would_create: vec![],
        skipped: vec![],
        pools: vec![],
        labels: Default::default(),
        would_delete: vec![],
        held: vec![],
    };
    // As a pass: unknown servers on places of pools alone hold those pools.
    let held_pools = match comparison.missing.is_empty() && !comparison.unknown.is_empty() {
        true => pass::pools_of_unknown(&comparison.unknown, &devices, &|u| provider.unit_place(u)),
        false => None,
    }
    .unwrap_or_default();
    if !comparison.unknown.is_empty() || !comparison.missing.is_empty() {
        plan.discrepancy = Some(DiscrepancyFound {
            run: Uuid::nil(),
            unknown_devices: comparison.unknown,
            missing_devices: comparison.missing,
        });
        if held_pools.is_empty() {
            return Ok(plan);
        }
        plan.held = held_pools
            .iter()
            .map(|pool| WouldHold {
                pool: pool.clone(),
                guard: "discrepancy".into(),
                held: 0,
                message: format!(
                    "a server on a place of pool {pool} that nothing proves ours: neither creations nor deletions in the pool"
                ),
            })
            .collect();
    }
    // What the pass would delete, as it decides it.
    let declared = crate::pools::declared(pool).await?;
    if !declared.is_empty() {
        let place = |u: Uuid| provider.unit_place(u);
        let scope = |u: Uuid| provider.unit_scope(u);
        let unheld: Vec<_> = declared
            .iter()
            .filter(|d| !held_pools.contains(&d.pool.name))
            .cloned()
            .collect();
        let targets = pass::targets(&unheld, &devices, &fleet, &ours, &place, &scope);
        let mut conn = pool.acquire().await?;
        let paused = views::read_deletions_pause(&mut conn).await?;
        let l = &settings.lifecycle;
        let period = chrono::TimeDelta::from_std(l.budget_period).unwrap_or(chrono::TimeDelta::MAX);
        let used: Vec<(Option<String>, i64)> = sqlx::query_as(
            "select body->>'pool', count(*) from shepherd.events
             where event_type = 'deletion_requested' and recorded_at > now() - $1 group by 1",
        )
        .bind(period)
        .fetch_all(&mut *conn)
        .await?;
        let used = used
            .into_iter()
            .filter_map(|(p, n)| Some((p?, n.max(0) as u32)))
            .collect();
        let decided = crate::jobs::converge::plan(
            &targets,
            &used,
            &crate::jobs::converge::Policy {
                paused: paused.is_some(),
                budget_percent: l.budget_percent,
                budget_min: l.budget_min,
                max_unhealthy_percent: l.max_unhealthy_percent,
                ready_deadline: l.ready_deadline,
                now: chrono::Utc::now(),
                prices: plan
                    .pools
                    .iter()
                    .filter_map(|r| r.price.clone().map(|p| (r.name.clone(), p)))
                    .collect(),
            },
        );
        plan.would_delete = decided
            .delete
            .iter()
            .map(|d| WouldDelete {
                device: d.member.device.clone(),
                pool: d.pool.clone(),
                cause: d.cause.as_str().into(),
                message: d.message.clone(),
            })
            .collect();
        plan.held.extend(decided.held.iter().map(|h| WouldHold {
            pool: h.pool.clone(),
            guard: h.guard.as_str().into(),
            held: h.count,
            message: h.message.clone(),
        }));
    }
    let room = settings.max_machines.room(plan.managed + plan.in_flight);
    if room == Some(0) {
        plan.at_limit = true;
        return Ok(plan);
    }
    let inventory = match survey.units {
        Some(units) => units?,
        None => provider.units().await?,
    };
    plan.reservations_listed = inventory.units.len();
    plan.pools = inventory.pools.clone();
    // Paused: nothing would be admitted (queue::admit refuses every one).
    let room = if plan.paused.is_some() { Some(0) } else { room };
    let place = |u: Uuid| provider.unit_place(u);
    let mut lacking = pass::lacking(&declared, &devices, &fleet, &place);
    for pool in &held_pools {
        lacking.insert(pool.clone(), 0);
    }
    let selection = pass::select(&inventory, &fleet, room, settings.chunk_size, &lacking);
    plan.would_create = selection.chosen;
    plan.skipped = selection.skipped;
    plan.labels = plan
        .would_create
        .iter()
        .chain(plan.skipped.iter().map(|(u, _)| u))
        .filter_map(|&u| Some((u, provider.unit_label(u)?)))
        .collect();
    Ok(plan)
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("provider API: {0}")]
    Provider(#[from] ProviderError),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}
