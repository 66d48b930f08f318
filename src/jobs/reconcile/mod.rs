//! One reconcile pass: the seed's `runInSession` + `reconcile`, as a job.
//!
//! Lists the provider's prefixed devices and shepherd's managed machines,
//! refuses to work on a discrepancy (adopting witnessed orphans instead of
//! halting on them), stops at the limit without listing reservations, and
//! otherwise admits creations for the candidate reservations. Only one pass
//! runs at a time across the cluster: a pass holds a transaction-scoped
//! advisory lock for its duration, and a second one finds it taken and ends.

use uuid::Uuid;

use super::lease::Lease;
use super::pass::{self, compare, our_requests, read_fleet};
use super::queue;
use super::{AssimilateArgs, JobContext, JobError};
use crate::events::event::*;
use crate::events::{NewEvent, record};

mod deletions;
mod missing;
mod unwanted;

use deletions::converge;
use missing::confirm_missing;

/// What a pass did, for logs, metrics and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileOutcome {
    pub run: Option<Uuid>,
    /// Another pass held the lock; this one did nothing.
    pub skipped: bool,
    /// A newer pass had started since this one was queued; it did nothing.
    pub coalesced: bool,
    /// Why the pass did no work, if it did none.
    pub refused: Option<String>,
    pub managed: u64,
    pub in_flight: u64,
    pub at_limit: bool,
    pub listed_reservations: bool,
    pub enqueued: Vec<Uuid>,
    pub adopted: Vec<String>,
    pub unknown_devices: Vec<String>,
    pub missing_devices: Vec<String>,
    /// Managed machines the provider confirmed gone, recorded as lost.
    pub lost: Vec<String>,
    /// Machines whose deletion the pass requested (surplus, replacements).
    pub deletions: Vec<String>,
    /// The chunk held the pass back while the budget had room: the next
    /// pass was queued to run at once rather than at the scheduler's tick.
    pub follow_up: bool,
}

async fn note(ctx: &JobContext, job_id: &str, events: Vec<Event>) -> Result<(), JobError> {
    let mut tx = ctx.pool.begin().await?;
    record(
        &mut tx,
        events
            .into_iter()
            .map(|e| NewEvent::new(e).caused_by(job_id))
            .collect(),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

pub async fn reconcile(ctx: &JobContext, job_id: &str) -> Result<ReconcileOutcome, JobError> {
    reconcile_requested(ctx, job_id, None).await
}

/// A pass, recording who asked for it (the job's `requested_by`) on its
/// `reconcile_started` event.
pub async fn reconcile_requested(
    ctx: &JobContext,
    job_id: &str,
    requested_by: Option<&str>,
) -> Result<ReconcileOutcome, JobError> {
    // One pass at a time, by lease: it holds no connection while the pass
    // reads the provider, and a crashed pass's lease expires with the
    // rescue window, when its job goes to another worker.
    let Some(lease) = Lease::try_take(&ctx.pool, PASS_LEASE, ctx.lease_term()).await? else {
        tracing::info!("another reconcile pass is running; this one ends");
        return Ok(ReconcileOutcome {
            skipped: true,
            ..Default::default()
        });
    };
    // A log restored or failed over is announced before anything is read
    // against it (and the creations it left in flight look first). A check
    // that cannot be made stops no pass: the next one checks again.
    if let Err(e) = super::moved::check(&ctx.pool).await {
        tracing::warn!(error = %e, "cannot check whether the database was restored or failed over; the next pass checks again");
    }
    let outcome = run_pass(ctx, job_id, requested_by, &lease).await;
    // Released before the outcome is returned, so the next pass finds the
    // lease free.
    lease.release().await;
    outcome
}

/// The lease of the one pass running.
pub const PASS_LEASE: &str = "shepherd/reconcile";

/// What the listing said of each machine of ours, for the pages to show
/// beside it (`shepherd.machine_status`): a cache of the latest sighting,
/// not a record, so it is written in place, one statement a pass.
async fn note_statuses(
    pool: &sqlx::PgPool,
    devices: &[crate::provider::Machine],
    prefix: &str,
) -> Result<(), JobError> {
    let ours: Vec<&crate::provider::Machine> = devices
        .iter()
        .filter(|d| d.hostname.as_deref().is_some_and(|h| h.starts_with(prefix)))
        .collect();
    let ids: Vec<String> = ours.iter().map(|d| d.id.clone()).collect();
    let statuses: Vec<Option<String>> = ours.iter().map(|d| d.status.clone()).collect();
    sqlx::query(
        "with seen as (
             insert into shepherd.machine_status (provider_id, status, seen_at)
             select s.provider_id, s.status, now()
             from unnest($1::text[], $2::text[]) as s(provider_id, status)
             on conflict (provider_id) do update
                 set status = excluded.status, seen_at = excluded.seen_at
             returning provider_id)
         delete from shepherd.machine_status m
         where m.seen_at < now() - interval '1 day'
           and m.provider_id <> all($1)
           and not exists (select 1 from shepherd.managed_machines x where x.provider_id = m.provider_id)",
    )
    .bind(&ids)
    .bind(&statuses)
    .execute(pool)
    .await?;
    Ok(())
}

/// Records `machine_ready` for each managed machine the listing shows
/// ready for the first time: the durable evidence that it was ready once,
/// so that no later status (off, rescue, a reinstall) is taken for a
/// deployment that never finished.
async fn note_ready(
    ctx: &JobContext,
    job_id: &str,
    devices: &[crate::provider::Machine],
    fleet: &mut pass::Fleet,
) -> Result<(), JobError> {
    let seen: Vec<(String, NewEvent)> = devices
        .iter()
        .filter(|d| d.ready() && !fleet.ready_once.contains(&d.id))
        .filter_map(|d| {
            let (machine_id, _) = fleet.machines.get(&d.id)?;
            let event = NewEvent::new(MachineReady {
                machine_id: *machine_id,
                provider_id: d.id.clone(),
                status: d.status.as_deref().map(crate::text::bounded_word),
            })
            .caused_by(job_id);
            Some((d.id.clone(), event))
        })
        .collect();
    if seen.is_empty() {
        return Ok(());
    }
    let (ids, events): (Vec<String>, Vec<NewEvent>) = seen.into_iter().unzip();
    let mut tx = ctx.pool.begin().await?;
    record(&mut tx, events).await?;
    tx.commit().await?;
    fleet.ready_once.extend(ids);
    Ok(())
}

/// The pass proper, run while the caller holds the reconcile lock.
async fn run_pass(
    ctx: &JobContext,
    job_id: &str,
    requested_by: Option<&str>,
    lease: &Lease,
) -> Result<ReconcileOutcome, JobError> {
    let run = Uuid::new_v4();
    let mut out = ReconcileOutcome {
        run: Some(run),
        ..Default::default()
    };
    // Passes queued while no worker ran (an outage, a backlog of manual
    // requests) would each list everything in turn: one that finds a newer
    // pass started since it was queued has nothing left to do.
    // The newest pass another job started (a re-run of this job must not
    // count its own crashed start), compared with when this one was queued;
    // only the newest is read, so the cost does not grow with the log.
    let newer: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
        "select latest.recorded_at
         from (select recorded_at from shepherd.events
               where event_type = 'reconcile_started' and job_id is distinct from $1
               order by position desc limit 1) latest,
              apalis.jobs j
         where j.id = $1 and latest.recorded_at > j.run_at",
    )
    .bind(job_id)
    .fetch_optional(&ctx.pool)
    .await?;
    if let Some(started_at) = newer {
        tracing::info!(%started_at, "a newer pass ran since this one was queued; this one ends");
        note(
            ctx,
            job_id,
            vec![
                ReconcileCoalesced {
                    run,
                    newer_pass_started_at: started_at,
                }
                .into(),
            ],
        )
        .await?;
        out.coalesced = true;
        return Ok(out);
    }
    let settings = ctx.settings().await?;
    let limit = settings.max_machines;
    note(
        ctx,
        job_id,
        vec![
            ReconcileStarted {
                run,
                max_machines: limit.0,
                chunk_size: settings.chunk_size,
                requested_by: requested_by.filter(|by| !by.is_empty()).map(str::to_string),
            }
            .into(),
        ],
    )
    .await?;

    // The fleet first: the database answers at once, and a pass already at
    // the limit lists no reservations. Otherwise the provider surveys both
    // at once (Metal's two listings overlap their round trips, BENCHMARKS.md
    // scenario 4; Latitude's units come from the one server listing); a pass
    // that then finds a discrepancy, or reaches the limit through
    // adoptions, drops the reservations it listed.
    let before = read_fleet(&ctx.pool).await?;
    let full = limit.is_reached(before.managed.len() as u64 + before.in_flight());
    let survey = ctx.provider.survey(!full).await;
    let (devices, listed, listing) = (survey.machines, survey.units, survey.listing);
    let devices = match devices {
        Ok(d) => d,
        Err(e) => {
            return refuse(
                ctx,
                job_id,
                out,
                format!("listing the provider's devices failed: {e}"),
            )
            .await;
        }
    };
    note_statuses(&ctx.pool, &devices, &ctx.config.device_prefix).await?;
    // How the pools stand, recorded on every path from here: by the units'
    // listing when there is one (with the stock), else by the machines
    // alone, so a full pool's failed machines still show.
    // By name on every path: the units' listing gives them sorted, the
    // provider's own list in its declared order, and the pages show them
    // as recorded.
    let surveyed = |mut pools: Vec<crate::provider::PoolReport>| -> Vec<Event> {
        pools.sort_by(|a, b| a.name.cmp(&b.name));
        if pools.is_empty() {
            vec![]
        } else {
            vec![
                PoolsSurveyed {
                    run,
                    pools,
                    listing: listing.clone(),
                }
                .into(),
            ]
        }
    };
    // Only the passes that end before admitting need it.
    let pools_seen = |listed: &Option<Result<crate::provider::Inventory, _>>| match listed {
        Some(Ok(inventory)) => inventory.pools.clone(),
        _ => ctx.provider.pools(&devices),
    };
    // Read after the listing, so what it skips as in flight and what the
    // admission counts come from the same moment or later.
    let mut fleet = read_fleet(&ctx.pool).await?;
    let ours = our_requests(&ctx.pool, &devices).await?;
    note_ready(ctx, job_id, &devices, &mut fleet).await?;
    let mut comparison = compare(
        &devices,
        &before,
        &fleet,
        &ctx.config.device_prefix,
        settings.assimilate,
        &ours,
    );
    // A managed machine missing from the listing is a fact to confirm:
    // looked up by its id, lost only on a definite "not found" seen twice.
    let confirmed = confirm_missing(ctx, &settings, job_id, run, &comparison.missing).await?;
    comparison.missing = confirmed.uncertain;
    out.lost = confirmed.lost;
    if !out.lost.is_empty() {
        // A lost machine freed its unit: what the pass fills is read anew.
        fleet = read_fleet(&ctx.pool).await?;
    }
    out.managed = fleet.managed.len() as u64;
    out.in_flight = fleet.in_flight();

    if !comparison.adopt.is_empty() {
        // Adopted devices count as in flight from here, so the limit
        // leaves room for them before any creation is admitted. Under the
        // capacity lock: a manual admission cannot slip in between, and a
        // unit a creation took since the fleet was read is left to it.
        let mut tx = ctx.pool.begin().await?;
        let capacity = queue::lock_capacity(&mut tx).await?;
        let units: Vec<Uuid> = comparison
            .adopt
            .iter()
            .filter_map(|a| a.reservation)
            .collect();
        let taken: Vec<Uuid> = sqlx::query_scalar(
            "select reservation_id from shepherd.pending_creations where reservation_id = any($1)",
        )
        .bind(&units)
        .fetch_all(&mut *tx)
        .await?;
        let adopt: Vec<&pass::Adoption> = comparison
            .adopt
            .iter()
            .filter(|a| a.reservation.is_none_or(|u| !taken.contains(&u)))
            .collect();
        let mut events: Vec<NewEvent> = adopt
            .iter()
            .map(|a| {
                NewEvent::new(AdoptionRequested {
                    run,
                    device: a.device.clone(),
                    reservation: a.reservation,
                    witnessed: a.witnessed,
                })
                .caused_by(job_id)
            })
            .collect();
        // A machine of ours exists whether or not the limit has room for
        // it: it is adopted, and the excess recorded.
        let used = capacity.managed + capacity.in_flight + adopt.len() as u64;
        if capacity.limit.is_limited()
            && used > capacity.limit.0
            && let Some(last) = adopt.last()
        {
            events.push(
                NewEvent::new(LimitExceeded {
                    device: last.device.clone(),
                    managed: capacity.managed,
                    in_flight: capacity.in_flight + adopt.len() as u64,
                    limit: capacity.limit.0,
                })
                .caused_by(job_id),
            );
        }
        record(&mut tx, events).await?;
        for a in &adopt {
            let args = AssimilateArgs {
                device: a.device.clone(),
                reservation: a.reservation,
                manual: false,
                created: None,
                attempt: 1,
            };
            queue::push_assimilate(&mut tx, &args, None).await?;
        }
        tx.commit().await?;
        out.adopted = adopt.iter().map(|a| a.device.clone()).collect();
        // One line per device, so each id is a field of its own (a log
        // pipeline finds a device's line by its id, not inside a list).
        tracing::warn!(
            count = out.adopted.len(),
            "adopting prefixed devices that shepherd does not manage"
        );
        for device in &out.adopted {
            tracing::warn!(%device, "adopting a prefixed device that shepherd does not manage");
        }
        out.in_flight += out.adopted.len() as u64;
    }
    for device in &comparison.strangers {
        tracing::warn!(%device, kind = "stranger", "a device with the cluster's prefix on no place of its pools: not ours, left alone (another deployment's prefix may extend ours)");
    }
    // An unknown server on a place of a pool holds that pool alone.
    let held_pools = match comparison.missing.is_empty() && !comparison.unknown.is_empty() {
        true => pass::pools_of_unknown(&comparison.unknown, &devices, &|u| {
            ctx.provider.unit_place(u)
        }),
        false => None,
    };
    if let Some(held) = &held_pools {
        for device in &comparison.unknown {
            tracing::error!(%device, kind = "unknown", "a server on a place of a pool that nothing proves ours: the pool is held (no creation, no deletion) until it is explained");
        }
        let mut events: Vec<Event> = vec![
            DiscrepancyFound {
                run,
                unknown_devices: comparison.unknown.clone(),
                missing_devices: vec![],
            }
            .into(),
        ];
        for pool in held {
            events.push(
                DeletionsHeld {
                    run,
                    pool: pool.clone(),
                    held: 0,
                    guard: "discrepancy".into(),
                    message: format!(
                        "a server on a place of pool {pool} that nothing proves ours: neither creations nor \
                         deletions in the pool until it is explained (deleted or renamed at the provider \
                         by whoever made it)"
                    ),
                }
                .into(),
            );
        }
        note(ctx, job_id, events).await?;
        out.unknown_devices = std::mem::take(&mut comparison.unknown);
    }
    if !comparison.unknown.is_empty() || !comparison.missing.is_empty() {
        let mut reason = "the provider and shepherd disagree about which machines exist; refusing to do any work".to_string();
        if !comparison.missing.is_empty() {
            reason.push_str(
                " (a managed machine missing from the listing: it is looked up by its id at \
                 every pass, and recorded as lost once the provider says twice, some time \
                 apart, that it does not know it; `shepherd machines release <device> --reason \
                 ...` records it at once)",
            );
        }
        tracing::error!(
            unknown = comparison.unknown.len(),
            missing = comparison.missing.len(),
            "{reason}"
        );
        for device in &comparison.unknown {
            tracing::error!(%device, kind = "unknown", "a prefixed device nobody manages and nothing witnessed");
        }
        for device in &comparison.missing {
            tracing::error!(%device, kind = "missing", "a managed machine whose device is gone");
        }
        let mut events = surveyed(pools_seen(&listed));
        events.extend([
            DiscrepancyFound {
                run,
                unknown_devices: comparison.unknown.clone(),
                missing_devices: comparison.missing.clone(),
            }
            .into(),
            ReconcileRefused {
                run,
                reason: reason.clone(),
            }
            .into(),
        ]);
        note(ctx, job_id, events).await?;
        out.unknown_devices = comparison.unknown;
        out.missing_devices = comparison.missing;
        out.refused = Some(reason);
        return Ok(out);
    }

    // The listing can be trusted: keep the pools as declared, shedding
    // surplus and replacing what failed, within the guards.
    let declared: Vec<crate::provider::pool::Declared> = {
        let mut conn = ctx.pool.acquire().await?;
        crate::pools::read(&mut conn)
            .await?
            .iter()
            .map(crate::pools::PoolRow::declared)
            .collect()
    };
    let held = held_pools.unwrap_or_default();
    let unheld: Vec<crate::provider::pool::Declared> = declared
        .iter()
        .filter(|d| !held.contains(&d.pool.name))
        .cloned()
        .collect();
    let place = |u: Uuid| ctx.provider.unit_place(u);
    // Two passes deciding surplus at once could each pick a different
    // machine to shed: a pass that cannot confirm it is still the one
    // running decides nothing.
    if !lease.renew().await? {
        return Err(JobError::Store(crate::events::StoreError::Invalid(
            "this pass's lease expired or was taken before it decided anything; the next pass decides".into(),
        )));
    }
    out.deletions = converge(
        ctx, &settings, job_id, run, &unheld, &devices, &fleet, &ours,
    )
    .await?;
    let ended = unwanted::end_unwanted_creations(ctx, job_id).await?;
    if !ended.is_empty() {
        // Their room under the limit is free again for this pass.
        out.in_flight = out.in_flight.saturating_sub(ended.len() as u64);
    }

    if limit.is_reached(out.managed + out.in_flight) {
        tracing::info!(
            managed = out.managed,
            in_flight = out.in_flight,
            limit = limit.0,
            "at the machine limit; not listing reservations"
        );
        out.at_limit = true;
        let mut events = surveyed(pools_seen(&listed));
        events.push(finished(run, &out));
        note(ctx, job_id, events).await?;
        return Ok(out);
    }

    let listed = match listed {
        Some(listed) => listed,
        None => ctx.provider.units().await,
    };
    let inventory = match listed {
        Ok(r) => r,
        Err(e) => {
            return refuse(
                ctx,
                job_id,
                out,
                format!("listing the provider's capacity failed: {e}"),
            )
            .await;
        }
    };
    out.listed_reservations = true;
    let mut tx = ctx.pool.begin().await?;
    let capacity = queue::lock_capacity(&mut tx).await?;
    let mut lacking = pass::lacking(&declared, &devices, &fleet, &place);
    for pool in &held {
        lacking.insert(pool.clone(), 0);
    }
    let selection = pass::select(
        &inventory,
        &fleet,
        capacity.room,
        settings.chunk_size,
        &lacking,
    );
    let mut listed = vec![
        ReservationsListed {
            run,
            counts: selection.counts.clone(),
        }
        .into(),
    ];
    listed.extend(surveyed(inventory.pools.clone()));
    record(
        &mut tx,
        listed
            .into_iter()
            .map(|e| NewEvent::new(e).caused_by(job_id))
            .collect(),
    )
    .await?;
    let chosen: Vec<(Uuid, Uuid)> = selection
        .chosen
        .iter()
        .map(|&r| (r, Uuid::new_v4()))
        .collect();
    let units: Vec<queue::UnitFacts> = chosen
        .iter()
        .map(|(unit, _)| queue::UnitFacts {
            unit: *unit,
            scope: inventory
                .units
                .iter()
                .find(|u| u.id == *unit)
                .and_then(|u| u.scope.clone()),
            place: ctx.provider.unit_label(*unit),
            hint: inventory
                .units
                .iter()
                .find(|u| u.id == *unit)
                .and_then(|u| u.hint.clone()),
        })
        .collect();
    let (admitted, refused) = queue::admit(
        &mut tx,
        &chosen,
        &queue::Admission {
            push_jobs: true,
            caused_by: Some(job_id),
            requested_by: Some("reconcile".into()),
            units: &units,
            ..Default::default()
        },
    )
    .await?;
    // Paused: the pass still reports what it saw, and says why it did nothing.
    out.refused = refused
        .iter()
        .find(|(_, why)| matches!(why, queue::Refusal::Paused { .. }))
        .map(|(_, why)| why.to_string());
    out.enqueued = admitted.iter().map(|(r, _)| *r).collect();
    out.managed = capacity.managed;
    out.in_flight = capacity.in_flight + admitted.len() as u64;
    out.at_limit = capacity
        .room
        .is_some_and(|room| room <= admitted.len() as u64);
    // A fill does not wait for the clock: a pass that the chunk held back,
    // while less than a chunk of creations was already waiting to be
    // sent, queues the next pass at once. Once a chunk waits, the next
    // waits for the tick: admitted creations queue behind the provider's
    // write budget, and a deeper queue would only outlast their deadlines.
    let beyond_chunk = selection
        .skipped
        .iter()
        .any(|(_, why)| *why == pass::Skip::BeyondChunk);
    if beyond_chunk
        && out.refused.is_none()
        && admitted.len() as u64 == settings.chunk_size
        && capacity.in_flight < settings.chunk_size
    {
        let args = crate::jobs::ReconcileArgs {
            requested_by: "reconcile (the chunk held the last pass back)".into(),
        };
        // A moment later, so that this pass's lock is free when it starts.
        let at = chrono::Utc::now() + chrono::TimeDelta::seconds(1);
        out.follow_up = queue::push_reconcile_at(&mut tx, &args, at, &format!("after/{run}"))
            .await?
            .is_some();
    }
    let mut closing: Vec<NewEvent> = Vec::new();
    if !admitted.is_empty() {
        closing.push(NewEvent::new(CreationsEnqueued {
            run,
            reservations: out.enqueued.clone(),
        }));
    }
    if let Some(reason) = &out.refused {
        closing.push(NewEvent::new(ReconcileRefused {
            run,
            reason: reason.clone(),
        }));
    }
    closing.push(NewEvent::new(finished(run, &out)));
    record(
        &mut tx,
        closing.into_iter().map(|e| e.caused_by(job_id)).collect(),
    )
    .await?;
    tx.commit().await?;
    tracing::info!(
        run = %run,
        managed = out.managed,
        in_flight = out.in_flight,
        enqueued = out.enqueued.len(),
        "reconcile pass finished"
    );
    Ok(out)
}

/// Ends the pass without work, recording why.
async fn refuse(
    ctx: &JobContext,
    job_id: &str,
    mut out: ReconcileOutcome,
    reason: String,
) -> Result<ReconcileOutcome, JobError> {
    tracing::warn!(%reason, "reconcile pass refused");
    let run = out.run.unwrap_or_default();
    note(
        ctx,
        job_id,
        vec![
            ReconcileRefused {
                run,
                reason: reason.clone(),
            }
            .into(),
        ],
    )
    .await?;
    out.refused = Some(reason);
    Ok(out)
}

fn finished(run: Uuid, out: &ReconcileOutcome) -> Event {
    ReconcileFinished {
        run,
        managed: out.managed,
        in_flight: out.in_flight,
        enqueued: out.enqueued.len() as u64,
        at_limit: out.at_limit,
    }
    .into()
}
