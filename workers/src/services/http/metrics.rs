//! `/metrics`: figures read from the database at each scrape, and the
//! API client's own counters, in the OpenMetrics text format when the
//! scraper asks for it (Prometheus does) and in the classic text format
//! (0.0.4) otherwise, which is what `curl`, `promtool check metrics` and
//! older scrapers read.

use super::*;

mod process;
use process::{connection_metrics, process_metrics};
use shepherd::jobs::{
    ASSIMILATE_QUEUE, CREATE_DEVICE_QUEUE, DELETE_MACHINE_QUEUE, RECONCILE_QUEUE,
};

/// The states apalis gives a job.
const JOB_STATES: [&str; 6] = ["Pending", "Queued", "Running", "Done", "Failed", "Killed"];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ClassLabel {
    pub(super) class: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabel {
    pub(super) outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct QueueLabels {
    pub(super) kind: String,
    pub(super) state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PoolLabels {
    pub(super) pool: String,
    pub(super) plan: String,
    pub(super) site: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PoolCostLabels {
    pub(super) pool: String,
    pub(super) currency: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CurrencyLabel {
    pub(super) currency: String,
}

/// Outcomes counted over the whole log.
#[derive(sqlx::FromRow)]
pub(super) struct Outcomes {
    pub(super) created: i64,
    pub(super) recovered: i64,
    pub(super) given_up: i64,
    pub(super) race_lost: i64,
    pub(super) attempt_failed: i64,
    pub(super) refused: i64,
    pub(super) discrepancies: i64,
    pub(super) assimilated: i64,
    pub(super) skipped: i64,
    pub(super) rejected: i64,
    pub(super) deletions_requested: i64,
    pub(super) deleted: i64,
    pub(super) deletion_failed: i64,
    pub(super) deletion_cancelled: i64,
    pub(super) lost: i64,
    pub(super) limit_exceeded: i64,
    pub(super) late_outcomes: i64,
    pub(super) database_moves: i64,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct HeldLabels {
    pub(super) pool: String,
    pub(super) guard: String,
}

/// The provisioner's figures at one scrape.
pub(super) struct Figures {
    pub(super) overview: Overview,
    /// The last listing's counts and when it was recorded.
    pub(super) listed: Option<(ReservationCounts, DateTime<Utc>)>,
    pub(super) outcomes: Outcomes,
}

impl Figures {
    pub(super) async fn read(pool: &PgPool) -> Result<Figures, sqlx::Error> {
        let overview = fleet::overview(pool).await?;
        let listed: Option<(i32, Value, DateTime<Utc>)> = sqlx::query_as(
            "select schema_version, body, recorded_at from shepherd.events
             where event_type = 'reservations_listed' order by position desc limit 1",
        )
        .fetch_optional(pool)
        .await?;
        // Decoded like any reader would, so an older body is upcast and a
        // newer one this build cannot read is left out rather than misread.
        let listed = listed.and_then(|(version, body, at)| {
            match Event::decode("reservations_listed", version, body) {
                Ok(Event::ReservationsListed(e)) => Some((e.counts, at)),
                _ => None,
            }
        });
        // events_type_idx keeps this to the counted types' rows.
        let outcomes = sqlx::query_as(
            "select
               count(*) filter (where event_type = 'device_created'
                                  and not coalesce((body->>'recovered')::bool, false)) as created,
               count(*) filter (where event_type = 'device_created'
                                  and coalesce((body->>'recovered')::bool, false)) as recovered,
               count(*) filter (where event_type = 'creation_given_up') as given_up,
               count(*) filter (where event_type = 'race_lost') as race_lost,
               count(*) filter (where event_type = 'creation_attempt_failed') as attempt_failed,
               count(*) filter (where event_type = 'creation_refused') as refused,
               count(*) filter (where event_type = 'discrepancy_found') as discrepancies,
               count(*) filter (where event_type = 'machine_assimilated') as assimilated,
               count(*) filter (where event_type = 'assimilation_skipped') as skipped,
               count(*) filter (where event_type = 'assimilation_rejected') as rejected,
               count(*) filter (where event_type = 'deletion_requested') as deletions_requested,
               count(*) filter (where event_type = 'machine_deleted') as deleted,
               count(*) filter (where event_type = 'deletion_failed') as deletion_failed,
               count(*) filter (where event_type = 'deletion_cancelled') as deletion_cancelled,
               count(*) filter (where event_type = 'machine_lost') as lost,
               count(*) filter (where event_type = 'limit_exceeded') as limit_exceeded,
               count(*) filter (where event_type in ('creation_unresolved', 'deletion_unresolved')
                                  and coalesce((body->>'lease_lost')::bool, false))
                 as late_outcomes,
               count(*) filter (where event_type = 'database_moved') as database_moves
             from shepherd.events
             where event_type in ('device_created', 'creation_given_up', 'race_lost',
                                  'creation_attempt_failed', 'creation_refused',
                                  'discrepancy_found', 'machine_assimilated',
                                  'assimilation_skipped', 'assimilation_rejected',
                                  'deletion_requested', 'machine_deleted', 'deletion_failed',
                                  'deletion_cancelled', 'machine_lost', 'limit_exceeded',
                                  'creation_unresolved', 'deletion_unresolved',
                                  'database_moved')",
        )
        .fetch_one(pool)
        .await?;
        Ok(Figures {
            overview,
            listed,
            outcomes,
        })
    }

    pub(super) fn register(self, registry: &mut Registry) {
        let Figures {
            overview: o,
            listed,
            outcomes: n,
        } = self;

        if let Some((c, at)) = listed {
            // Passes at the limit skip the listing: the classes below are
            // as old as this says.
            registry.register_with_unit(
                "shepherd_reservations_listed_age",
                "Time since the reservations were last listed (the age of shepherd_reservations)",
                Unit::Seconds,
                ConstGauge::new(seconds_between(at, o.now)),
            );
            let reservations = Family::<ClassLabel, Gauge<u64, AtomicU64>>::default();
            // No "total" beside its parts: `sum()` over the classes is the
            // total, and a total among them would be counted twice.
            for (class, value) in [
                ("available", c.available),
                ("in_use", c.in_use),
                ("not_provisionable", c.not_provisionable),
                ("penalised", c.penalised),
                ("in_flight", c.in_flight),
            ] {
                reservations.get_or_create(&ClassLabel { class }).set(value);
            }
            registry.register(
                "shepherd_reservations",
                "Hardware reservations by class, as the last reconcile listed them",
                reservations,
            );
        }

        if let Some(seen) = &o.pools {
            registry.register_with_unit(
                "shepherd_pools_surveyed_age",
                "Time since a pass last surveyed the pools (the age of shepherd_pool_*)",
                Unit::Seconds,
                ConstGauge::new(seconds_between(seen.surveyed_at, o.now)),
            );
            let places = Family::<PoolLabels, Gauge<u64, AtomicU64>>::default();
            let machines = Family::<PoolLabels, Gauge<u64, AtomicU64>>::default();
            let in_stock = Family::<PoolLabels, Gauge<u64, AtomicU64>>::default();
            let stock = Family::<PoolLabels, Gauge<u64, AtomicU64>>::default();
            let held = Family::<PoolLabels, Gauge<u64, AtomicU64>>::default();
            let failed = Family::<PoolLabels, Gauge<u64, AtomicU64>>::default();
            let dormant = Family::<PoolLabels, Gauge<u64, AtomicU64>>::default();
            let surplus = Family::<PoolLabels, Gauge<u64, AtomicU64>>::default();
            for p in &seen.pools {
                let r = &p.report;
                let labels = PoolLabels {
                    pool: r.name.clone(),
                    plan: r.plan.clone(),
                    site: r.site.clone(),
                };
                places.get_or_create(&labels).set(u64::from(r.count));
                machines.get_or_create(&labels).set(u64::from(r.taken));
                failed.get_or_create(&labels).set(u64::from(r.failed));
                dormant.get_or_create(&labels).set(u64::from(r.dormant));
                surplus
                    .get_or_create(&labels)
                    .set(u64::from(r.machines.saturating_sub(r.taken)));
                // Absent, not 0, where the last pass did not read the stock.
                if let Some(s) = r.stock {
                    in_stock.get_or_create(&labels).set(u64::from(s.in_stock));
                    if let Some(n) = s.count {
                        stock.get_or_create(&labels).set(u64::from(n));
                    }
                }
                held.get_or_create(&labels)
                    .set(u64::from(p.held_until.is_some_and(|until| until >= o.now)));
            }
            registry.register(
                "shepherd_pool_places",
                "Places an operator declared in each pool",
                places,
            );
            registry.register(
                "shepherd_pool_machines",
                "Places of each pool a machine of ours stands on, as the last listing saw them",
                machines,
            );
            registry.register(
                "shepherd_pool_failed_machines",
                "Machines of each pool whose deployment failed; shepherd replaces them unless a guard holds it back",
                failed,
            );
            registry.register(
                "shepherd_pool_dormant_machines",
                "Machines of each pool that are off, in rescue, of unknown status or named by a word shepherd does not know: kept, never replaced for it",
                dormant,
            );
            registry.register(
                "shepherd_pool_surplus_machines",
                "Machines of ours in each pool beyond one a place within its count, as the last listing saw them",
                surplus,
            );
            registry.register(
                "shepherd_pool_in_stock",
                "1 while the provider has the pool's plan in stock at its site, as last listed",
                in_stock,
            );
            registry.register(
                "shepherd_pool_stock",
                "Machines of the pool's plan in stock at its site, where the provider counts them",
                stock,
            );
            registry.register(
                "shepherd_pool_held_back",
                "1 while a create refused for want of stock holds the pool's free places back",
                held,
            );
            // Cost, from the prices read with the stock; a pool the
            // provider gave no price for has no series (not a 0).
            let pool_cost = Family::<PoolCostLabels, Gauge<f64, AtomicU64>>::default();
            let pool_wasted = Family::<PoolCostLabels, Gauge<f64, AtomicU64>>::default();
            for c in seen.costs() {
                let labels = PoolCostLabels {
                    pool: c.pool.clone(),
                    currency: c.currency.clone(),
                };
                pool_cost.get_or_create(&labels).set(c.per_hour);
                pool_wasted.get_or_create(&labels).set(c.wasted_per_hour);
            }
            let fleet_cost = Family::<CurrencyLabel, Gauge<f64, AtomicU64>>::default();
            let fleet_wasted = Family::<CurrencyLabel, Gauge<f64, AtomicU64>>::default();
            for f in seen.fleet_cost() {
                let labels = CurrencyLabel {
                    currency: f.currency.clone(),
                };
                fleet_cost.get_or_create(&labels).set(f.per_hour);
                fleet_wasted.get_or_create(&labels).set(f.wasted_per_hour);
            }
            registry.register(
                "shepherd_pool_cost_per_hour",
                "What each pool's machines cost per hour at the provider's price, as the last pass saw them",
                pool_cost,
            );
            registry.register(
                "shepherd_pool_wasted_cost_per_hour",
                "Of that, what its surplus and failed machines cost per hour",
                pool_wasted,
            );
            registry.register(
                "shepherd_fleet_cost_per_hour",
                "What every priced pool's machines cost per hour, per currency",
                fleet_cost,
            );
            registry.register(
                "shepherd_fleet_wasted_cost_per_hour",
                "Of that, what surplus and failed machines cost per hour",
                fleet_wasted,
            );
        }

        if let Some(c) = &o.spend_cap {
            let cap = Family::<CurrencyLabel, Gauge<f64, AtomicU64>>::default();
            cap.get_or_create(&CurrencyLabel {
                currency: c.currency.clone().unwrap_or_default(),
            })
            .set(c.cap);
            registry.register(
                "shepherd_spend_cap_per_hour",
                "The cluster's spend_cap: what the fleet may cost per hour (absent when none is set)",
                cap,
            );
            registry.register(
                "shepherd_spend_cap_held",
                "1 while the spend cap holds back every creation a pool lacks, else 0",
                ConstGauge::new(i64::from(c.held.is_some())),
            );
        }
        registry.register(
            "shepherd_machines_managed",
            "Machines shepherd manages",
            ConstGauge::new(o.managed),
        );
        registry.register(
            "shepherd_machines_in_flight",
            "Pending creations plus created devices not yet assimilated",
            ConstGauge::new(o.in_flight()),
        );
        if let Some(limit) = o.max_machines {
            registry.register(
                "shepherd_machines_limit",
                "The cluster's max_machines (0: no limit)",
                ConstGauge::new(limit),
            );
        }
        registry.register(
            "shepherd_unresolved_creations",
            "Creations whose outcome is unknown, held in flight until a look settles them",
            ConstGauge::new(o.unresolved.len() as i64),
        );
        registry.register(
            "shepherd_oldest_unresolved_creation_seconds",
            "Age of the oldest unresolved creation (0 when none)",
            ConstGauge::<f64>::new(o.unresolved.first().map_or(0.0, |u| u.seconds)),
        );
        registry.register(
            "shepherd_sinbin_reservations",
            "Reservations under an active penalty",
            ConstGauge::new(o.penalised.len() as i64),
        );
        registry.register(
            "shepherd_creations_paused",
            "1 while an operator has paused new creations",
            ConstGauge::new(i64::from(o.paused.is_some())),
        );
        registry.register(
            "shepherd_deletions_paused",
            "1 while an operator has paused deletions",
            ConstGauge::new(i64::from(o.deletions_paused.is_some())),
        );
        registry.register(
            "shepherd_machines_leaving",
            "Machines whose deletion is requested and not ended",
            ConstGauge::new(o.leaving.len() as i64),
        );
        registry.register(
            "shepherd_machines_protected",
            "Machines under scale-in protection",
            ConstGauge::new(o.protected),
        );
        let used = o.managed + o.in_flight();
        registry.register(
            "shepherd_machines_over_limit",
            "Managed plus in flight beyond max_machines (machines of ours recorded although they existed past it)",
            ConstGauge::new(match o.max_machines {
                Some(max) if max > 0 => (used - max as i64).max(0),
                _ => 0,
            }),
        );
        let held = Family::<HeldLabels, Gauge<u64, AtomicU64>>::default();
        if let Some(last) = &o.last_reconcile {
            for h in &last.held {
                held.get_or_create(&HeldLabels {
                    pool: h.pool.clone(),
                    guard: h.guard.clone(),
                })
                .set(u64::from(h.held));
            }
        }
        registry.register(
            "shepherd_deletions_held",
            "Deletions the last pass held back, by pool and guard (paused, protected, unhealthy, budget)",
            held,
        );

        let creations = Family::<OutcomeLabel, Counter>::default();
        for (outcome, events) in [
            ("created", n.created),
            ("recovered", n.recovered),
            ("given_up", n.given_up),
            ("race_lost", n.race_lost),
            ("attempt_failed", n.attempt_failed),
            ("refused", n.refused),
        ] {
            creations
                .get_or_create(&OutcomeLabel { outcome })
                .inc_by(count(events));
        }
        registry.register(
            "shepherd_creations",
            "Device creations by outcome, over the whole event log",
            creations,
        );
        registry.register(
            "shepherd_discrepancies",
            "Reconcile passes that found provider and shepherd disagreeing",
            ConstCounter::new(count(n.discrepancies)),
        );
        let assimilations = Family::<OutcomeLabel, Counter>::default();
        for (outcome, events) in [
            ("assimilated", n.assimilated),
            ("skipped", n.skipped),
            ("rejected", n.rejected),
        ] {
            assimilations
                .get_or_create(&OutcomeLabel { outcome })
                .inc_by(count(events));
        }
        registry.register(
            "shepherd_assimilations",
            "Assimilations by outcome, over the whole event log",
            assimilations,
        );
        let deletions = Family::<OutcomeLabel, Counter>::default();
        for (outcome, events) in [
            ("requested", n.deletions_requested),
            ("deleted", n.deleted),
            ("failed", n.deletion_failed),
            ("cancelled", n.deletion_cancelled),
        ] {
            deletions
                .get_or_create(&OutcomeLabel { outcome })
                .inc_by(count(events));
        }
        registry.register(
            "shepherd_deletions",
            "Deletions by outcome, over the whole event log",
            deletions,
        );
        registry.register(
            "shepherd_machines_lost",
            "Managed machines the provider confirmed gone (not found twice, some time apart)",
            ConstCounter::new(count(n.lost)),
        );
        registry.register(
            "shepherd_limit_exceeded",
            "Machines of ours recorded past the cluster's limit",
            ConstCounter::new(count(n.limit_exceeded)),
        );
        registry.register(
            "shepherd_late_outcomes",
            "Answers to creates and deletes that came after their run had lost its unit's lease \
             (it stalled past it): recorded as unresolved for the unit's holder to settle",
            ConstCounter::new(count(n.late_outcomes)),
        );
        registry.register(
            "shepherd_database_moves",
            "Times the database was found restored from a backup, recovered to a point in time or \
             failed over (its identity changed under the log)",
            ConstCounter::new(count(n.database_moves)),
        );

        let jobs = Family::<QueueLabels, Gauge>::default();
        // Every kind in every state, at zero when empty: an alert on the
        // first killed job needs the series to exist before it.
        for kind in [
            RECONCILE_QUEUE,
            CREATE_DEVICE_QUEUE,
            ASSIMILATE_QUEUE,
            DELETE_MACHINE_QUEUE,
        ] {
            for state in JOB_STATES {
                jobs.get_or_create(&QueueLabels {
                    kind: kind.to_string(),
                    state: state.to_string(),
                })
                .set(0);
            }
        }
        let oldest = Family::<QueueLabels, Gauge<f64, AtomicU64>>::default();
        for row in &o.queue {
            let labels = QueueLabels {
                kind: row.kind.clone(),
                state: row.state.clone(),
            };
            jobs.get_or_create(&labels).set(row.jobs);
            if let Some(seconds) = row.oldest_seconds {
                oldest.get_or_create(&labels).set(seconds);
            }
        }
        registry.register("shepherd_jobs", "Jobs on the queue by kind and state", jobs);
        registry.register_with_unit(
            "shepherd_job_oldest_age",
            "Age of the oldest job of each kind and state, by its run time",
            Unit::Seconds,
            oldest,
        );
        let liveness = o.liveness();
        registry.register(
            "shepherd_workers_alive",
            "Worker processes heard from within their missed heartbeats (heartbeat x missed_heartbeats)",
            ConstGauge::new(liveness.processes as i64),
        );
        registry.register_with_unit(
            "shepherd_reconcile_period",
            "The scheduler's period, as its last passes were spaced (60 s before it has run two)",
            Unit::Seconds,
            ConstGauge::new(liveness.tick_seconds),
        );
        if let Some(at) = o.last_successful_reconcile {
            registry.register_with_unit(
                "shepherd_last_successful_reconcile_age",
                "Time since the last reconcile pass that was not refused finished",
                Unit::Seconds,
                ConstGauge::new(seconds_between(at, o.now)),
            );
        }
    }
}

/// SQL's `count(*)` is a bigint, but never a negative one.
pub(super) fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or_default()
}

pub(super) fn seconds_between(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_milliseconds() as f64 / 1000.0
}

/// The classic text format's media type.
pub(super) const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether the scraper prefers OpenMetrics: it names it, at a weight no
/// lower than any `text/plain` it also names. Without an `Accept` header
/// the answer is the classic format.
pub(super) fn wants_openmetrics(accept: Option<&str>) -> bool {
    let Some(accept) = accept else { return false };
    let weight = |wanted: &str| {
        accept
            .split(',')
            .filter(|part| part.trim().starts_with(wanted))
            .map(|part| {
                part.split(';')
                    .filter_map(|p| p.trim().strip_prefix("q="))
                    .find_map(|q| q.trim().parse::<f64>().ok())
                    .unwrap_or(1.0)
            })
            .fold(None, |best: Option<f64>, q| {
                Some(best.map_or(q, |b| b.max(q)))
            })
    };
    match (weight("application/openmetrics-text"), weight("text/plain")) {
        (Some(om), Some(text)) => om > 0.0 && om >= text,
        (Some(om), None) => om > 0.0,
        _ => false,
    }
}

/// OpenMetrics text as the classic format: a counter's family takes the
/// `_total` its samples carry (the classic parser matches HELP and TYPE to
/// sample names), `unknown` becomes `untyped`, and the `# UNIT` and `# EOF`
/// lines, which it does not know, go.
pub(super) fn to_classic(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            let name = if counters.contains(name) {
                format!("{name}_total")
            } else {
                name.to_string()
            };
            let tail = if *prefix == "# TYPE " && tail == "unknown" {
                "untyped"
            } else {
                tail
            };
            Some(format!("{prefix}{name} {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

pub(super) async fn metrics(
    State(state): State<HttpState>,
    headers: axum::http::HeaderMap,
) -> Result<Response, Failure> {
    let figures = Figures::read(&state.pool)
        .await
        .map_err(|e| database_failure("metrics", e))?;
    // A fresh registry per scrape: the provisioner's figures are read, not
    // accumulated, and a family left from an earlier scrape would go stale.
    let mut registry = Registry::default();
    state.client_metrics.register(&mut registry);
    state.job_metrics.register(&mut registry);
    figures.register(&mut registry);
    process_metrics(&mut registry);
    let mut pools = vec![("console", &state.pool)];
    if let Some(work) = &state.work_pool {
        pools.insert(0, ("work", work));
    }
    connection_metrics(&mut registry, &pools);
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, &registry)
        .map_err(|e| Failure::Internal(format!("cannot encode the metrics: {e}")))?;
    let accept = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    if wants_openmetrics(accept) {
        Ok(([(CONTENT_TYPE, OPENMETRICS)], body).into_response())
    } else {
        Ok(([(CONTENT_TYPE, CLASSIC)], to_classic(&body)).into_response())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scrapers_preference_decides_the_format() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(Some(prometheus)));
        assert!(wants_openmetrics(Some("application/openmetrics-text")));
        assert!(!wants_openmetrics(None));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(Some("text/plain; version=0.0.4")));
        assert!(!wants_openmetrics(Some(
            "text/plain;q=0.9, application/openmetrics-text;q=0.5"
        )));
        assert!(!wants_openmetrics(Some("application/openmetrics-text;q=0")));
    }

    #[test]
    fn counters_take_their_total_and_openmetrics_only_lines_go() {
        let om = "# HELP a_b Things.\n# TYPE a_b counter\na_b_total{x=\"1\"} 2\n# HELP g A gauge.\n# TYPE g gauge\n# UNIT g seconds\ng 1.5\n# TYPE u unknown\nu 1\n# EOF\n";
        assert_eq!(
            to_classic(om),
            "# HELP a_b_total Things.\n# TYPE a_b_total counter\na_b_total{x=\"1\"} 2\n# HELP g A gauge.\n# TYPE g gauge\ng 1.5\n# TYPE u untyped\nu 1\n"
        );
    }
}
