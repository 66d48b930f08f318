//! What the next pass would do, from the same reads a pass makes and the
//! same decisions, changing nothing: `shepherd plan` and the console.

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::events::event::DiscrepancyFound;
use crate::events::views::{self, Pause};
use crate::jobs::pass::Skip;
use crate::jobs::pass::{self, compare, our_requests, read_fleet};
use crate::provider::{Provider, ProviderError};

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
