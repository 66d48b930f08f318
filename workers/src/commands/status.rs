//! `shepherd status`: how the fleet stands, in one screen. Its first line
//! says whether anything works; then the fleet, the last pass, the pools,
//! what is leaving, the sinbin, the queue, the workers, and the jobs that
//! ended failed with the ids `shepherd job retry` takes.

use clap::Args;
use shepherd::fleet::{self, Overview};

use crate::commands::database::DatabaseArgs;
use crate::commands::operate::listing_words;
use crate::table::Table;
use shepherd::fleet::cost::money;

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Print JSON instead of tables
    #[arg(long)]
    json: bool,
}

fn age(seconds: f64) -> String {
    if seconds < 0.0 {
        // A queue row whose every job is scheduled ahead.
        return format!("due in {}", age(-seconds));
    }
    crate::table::human_duration(chrono::TimeDelta::milliseconds((seconds * 1000.0) as i64))
}

pub fn render_status(o: &Overview) -> String {
    let mut out = String::new();
    // First: is anything working?
    let l = o.liveness();
    let last_pass = l
        .last_pass_seconds
        .map_or_else(|| "never".to_string(), |s| format!("{} ago", age(s)));
    out.push_str(&match l.state {
        shepherd::fleet::LivenessState::Working => format!(
            "working      {} worker process{} heard from within {}; last successful pass {last_pass} (every {})\n",
            l.processes,
            if l.processes == 1 { "" } else { "es" },
            age(l.window_seconds),
            age(l.tick_seconds)
        ),
        shepherd::fleet::LivenessState::NoWorker => format!(
            "NO WORKER    none running: the last was heard from {}; nothing is created, assimilated or deleted until one starts\n",
            l.last_heard_seconds
                .map_or_else(|| "over 10 minutes ago".to_string(), |s| format!("{} ago", age(s)))
        ),
        shepherd::fleet::LivenessState::NoPass => format!(
            "NO PASS      {} worker process{} running, but the last successful pass was {last_pass} (passes every {}): no scheduler, or every pass refused\n",
            l.processes,
            if l.processes == 1 { "" } else { "es" },
            age(l.tick_seconds)
        ),
    });
    if let Some(m) = &o.database_moved {
        out.push_str(&format!(
            "MOVED        !!! the database was restored or failed over {} ago ({} -> {}): the log may \
             be older than the provider; creations requested before it look first, and servers \
             made since the backup show as discrepancies (docs/operations.md, backups, restores \
             and failover)\n",
            age((o.now - m.at).num_milliseconds() as f64 / 1000.0),
            m.from,
            m.to
        ));
    }
    let limit = match o.max_machines {
        Some(0) => "no limit".to_string(),
        Some(n) => n.to_string(),
        None => "unknown (no worker has recorded the cluster's settings yet)".to_string(),
    };
    out.push_str(&format!(
        "managed      {} / {limit}\nin flight    {} ({} creations pending, {} devices not yet assimilated)\n",
        o.managed,
        o.in_flight(),
        o.pending_creations,
        o.unassimilated_devices
    ));
    out.push_str(&spend_cap_line(o.spend_cap.as_ref()));
    if let Some(age_s) = o.oldest_in_flight_seconds {
        out.push_str(&format!(
            "             oldest in flight for {}\n",
            age(age_s)
        ));
    }
    if !o.unresolved.is_empty() {
        out.push_str(&format!(
            "UNRESOLVED   {} creations whose outcome is unknown (settled by looking at the provider):\n",
            o.unresolved.len()
        ));
        for u in &o.unresolved {
            out.push_str(&format!(
                "  reservation {} for {}: {}\n",
                u.reservation_id,
                age(u.seconds),
                u.last_error.as_deref().unwrap_or("")
            ));
        }
    }
    if let Some(max) = o.max_machines.filter(|m| *m > 0)
        && (o.managed + o.in_flight()) as u64 > max
    {
        out.push_str(&format!(
            "OVER LIMIT   {} past max_machines: machines of ours that existed were recorded anyway \
             (events limit_exceeded); lower the pools, or raise the limit\n",
            (o.managed + o.in_flight()) as u64 - max
        ));
    }
    match &o.paused {
        Some(p) => out.push_str(&format!(
            "creations    PAUSED by {} since {}: {}\n",
            p.by,
            p.since.format("%Y-%m-%d %H:%M:%S"),
            p.reason
        )),
        None => out.push_str("creations    running\n"),
    }
    match &o.deletions_paused {
        Some(p) => out.push_str(&format!(
            "deletions    PAUSED by {} since {}: {}\n",
            p.by,
            p.since.format("%Y-%m-%d %H:%M:%S"),
            p.reason
        )),
        None if !o.desired.is_empty() || !o.leaving.is_empty() => {
            out.push_str("deletions    running\n")
        }
        None => {}
    }
    if o.protected > 0 {
        out.push_str(&format!(
            "protected    {} machines shepherd never deletes\n",
            o.protected
        ));
    }
    out.push_str("\nlast reconcile\n");
    match &o.last_reconcile {
        None => out.push_str("  none yet\n"),
        Some(r) => {
            out.push_str(&format!(
                "  run {} started {} ago\n",
                r.run,
                crate::table::human_duration(o.now - r.started_at)
            ));
            if let Some(d) = &r.discrepancy {
                if r.refused.is_some() {
                    out.push_str("  !!! DISCREPANCY: the provider and shepherd disagree; no work is being done !!!\n");
                } else {
                    out.push_str("  !!! DISCREPANCY: servers nothing proves ours stand on places of pools; those pools are held, the others go on !!!\n");
                }
                for id in &d.unknown_devices {
                    out.push_str(&format!(
                        "  !!! unknown prefixed device {id} (not managed, not witnessed)\n"
                    ));
                }
                for id in &d.missing_devices {
                    out.push_str(&format!(
                        "  !!! managed machine's device {id} is gone from the provider\n"
                    ));
                }
            }
            if let Some(reason) = &r.refused {
                out.push_str(&format!("  refused: {reason}\n"));
            }
            for s in &r.surplus {
                out.push_str(&format!(
                    "  SURPLUS: pool {} holds {} machines for a count of {}{}; the extra ones are \
                     deleted within the guards\n",
                    s.pool,
                    s.machines,
                    s.count,
                    if s.doubled.is_empty() {
                        String::new()
                    } else {
                        format!(" (two on {})", s.doubled.join(", "))
                    }
                ));
            }
            for h in &r.held {
                out.push_str(&format!(
                    "  held back in pool {} ({}): {}\n",
                    h.pool, h.guard, h.message
                ));
            }
            match &r.finished {
                Some(f) => out.push_str(&format!(
                    "  finished: {} managed, {} in flight, {} enqueued{}\n",
                    f.managed,
                    f.in_flight,
                    f.enqueued,
                    if f.at_limit { ", at the limit" } else { "" }
                )),
                None if r.refused.is_none() => out.push_str("  still running\n"),
                None => {}
            }
        }
    }
    // The pools as declared, where no pass has surveyed them yet.
    let unsurveyed: Vec<&shepherd::pools::PoolRow> = o
        .desired
        .iter()
        .filter(|p| !p.removed)
        .filter(|p| {
            o.pools
                .as_ref()
                .is_none_or(|seen| seen.pools.iter().all(|s| s.report.name != p.name))
        })
        .collect();
    if !unsurveyed.is_empty() {
        out.push_str("\npools declared and not surveyed by a pass yet\n");
        let mut t = Table::new(&["POOL", "PLAN", "SITE", "COUNT", "OS", "CHANGED"]);
        for p in unsurveyed {
            t.row(vec![
                p.name.clone(),
                p.plan.clone(),
                p.site.clone(),
                p.count.to_string(),
                p.operating_system.clone(),
                format!(
                    "{} by {}",
                    p.updated_at.format("%Y-%m-%d %H:%M:%S"),
                    p.updated_by
                ),
            ]);
        }
        out.push_str(&t.render());
    }
    if let Some(seen) = &o.pools {
        out.push_str(&format!(
            "\npools (as the last pass saw them, {} ago)\n",
            crate::table::human_duration(o.now - seen.surveyed_at)
        ));
        out.push_str(&render_pools(&seen.pools, true));
        out.push_str(&fleet_cost_line(seen));
        if let Some(l) = &seen.listing {
            out.push_str(&format!(
                "listed: {}
",
                listing_words(l)
            ));
        }
    }
    if !o.leaving.is_empty() {
        out.push_str(&format!("\nleaving ({})\n", o.leaving.len()));
        let mut t = Table::new(&["MACHINE", "POOL", "WHY", "FOR", "STATE"]);
        for l in &o.leaving {
            t.row(vec![
                l.hostname.clone().unwrap_or_else(|| l.device.clone()),
                l.pool.clone().unwrap_or_default(),
                format!("{}: {}", l.cause, l.message),
                age(l.seconds),
                match (&l.last_error, l.cleared) {
                    (Some(e), _) => format!("unknown: {e}"),
                    (None, true) => "deleting".into(),
                    (None, false) => "waiting for its leave hook".into(),
                },
            ]);
        }
        out.push_str(&t.render());
    }
    out.push_str(&format!(
        "\npenalised {} ({})\n",
        if o.desired.is_empty() {
            "reservations"
        } else {
            "places"
        },
        o.penalised.len()
    ));
    if !o.penalised.is_empty() {
        let mut t = Table::new(&["RESERVATION", "TIME LEFT", "FAILURES", "CAUSE"]);
        for p in &o.penalised {
            t.row(vec![
                p.reservation_id.to_string(),
                age(p.seconds_left as f64),
                p.failures.to_string(),
                match &p.scope {
                    Some(scope) => format!("{} (holds back {scope})", p.cause),
                    None => p.cause.clone(),
                },
            ]);
        }
        out.push_str(&t.render());
    }
    out.push_str("\nqueue\n");
    if o.queue.is_empty() {
        out.push_str("  empty\n");
    } else {
        let mut t = Table::new(&["KIND", "STATE", "JOBS", "OLDEST"]);
        for q in &o.queue {
            t.row(vec![
                q.kind.clone(),
                q.state.clone(),
                q.jobs.to_string(),
                q.oldest_seconds.map(age).unwrap_or_default(),
            ]);
        }
        out.push_str(&t.render());
    }
    let processes = o.processes();
    out.push_str(&format!(
        "\nworker processes heard from in the last 10 minutes ({})\n",
        processes.len()
    ));
    if !processes.is_empty() {
        let mut t = Table::new(&[
            "PROCESS",
            "RELEASE",
            "STARTED",
            "QUEUES",
            "LAST SEEN",
            "CLOCK",
            "STATE",
        ]);
        for p in &processes {
            t.row(vec![
                p.name.clone(),
                p.version.clone().unwrap_or_else(|| "-".into()),
                p.started_at
                    .map(|at| at.format("%Y-%m-%d %H:%M:%S").to_string())
                    .unwrap_or_else(|| "-".into()),
                p.queues.join(","),
                format!("{} ago", age(p.seconds_since_seen)),
                clock(p.clock_offset_ms),
                if p.live { "live" } else { "silent (dead)" }.into(),
            ]);
        }
        out.push_str(&t.render());
    }
    out
}

/// How far a process's clock was off the database's at its start: "ok"
/// within `CLOCK_OFF_MS`, the offset and a warning beyond.
fn clock(offset_ms: Option<i64>) -> String {
    match offset_ms {
        None => "-".into(),
        Some(ms) if ms.abs() <= shepherd::fleet::CLOCK_OFF_MS => "ok".into(),
        Some(ms) => format!(
            "!! {:.1}s {}",
            ms.unsigned_abs() as f64 / 1000.0,
            if ms > 0 { "ahead" } else { "behind" }
        ),
    }
}

/// The spend cap, what the fleet costs against it, and whether it holds
/// creations back (`held: spend cap`).
pub(crate) fn spend_cap_line(cap: Option<&shepherd::jobs::spend::CapState>) -> String {
    let Some(c) = cap else {
        return String::new();
    };
    let currency = c.currency.as_deref().unwrap_or("(no price read yet)");
    let mut out = format!(
        "spend cap    {} {currency}/h; the fleet costs {} {currency}/h by our records ({:.0}%)\n",
        format_args!("{:.2}", c.cap),
        format_args!("{:.2}", c.spent),
        100.0 * c.spent / c.cap
    );
    if let Some(held) = &c.held {
        out.push_str(&format!("HELD         {held}\n"));
    }
    out
}

/// What the fleet costs, as the last pass priced it: per hour, per month
/// (an estimate: hourly billing over an average month), what of it is
/// wasted, and the pools the provider gave no price for.
pub(crate) fn fleet_cost_line(seen: &fleet::PoolsSeen) -> String {
    let mut out = String::new();
    for f in seen.fleet_cost() {
        out.push_str(&format!(
            "cost: {}/h, about {}/month at hourly rates; wasted on surplus and failed machines: {}/h\n",
            money(f.per_hour, &f.currency),
            money(f.per_month(), &f.currency),
            money(f.wasted_per_hour, &f.currency),
        ));
    }
    let unpriced = seen.unpriced();
    if !unpriced.is_empty() {
        out.push_str(&format!(
            "cost unknown for pool(s) {}: the provider gave no price with their stock\n",
            unpriced.join(", ")
        ));
    }
    out
}

/// One line per pool: declared, standing, and the provider's stock.
/// (`shepherd plan` shows the sinbin's hold in its skipped places instead.)
pub(crate) fn render_pools(pools: &[fleet::PoolState], with_hold: bool) -> String {
    let mut headers = vec![
        "POOL", "PLAN", "SITE", "MACHINES", "PLACES", "FAILED", "STOCK",
    ];
    if with_hold {
        headers.push("HELD BACK");
    }
    headers.push("COST/H");
    let mut t = Table::new(&headers);
    for p in pools {
        let r = &p.report;
        let mut row = vec![
            if r.removed {
                format!("{} (removed)", r.name)
            } else {
                r.name.clone()
            },
            r.plan.clone(),
            r.site.clone(),
            {
                let mut cell = if r.machines > r.taken {
                    format!("{} (+{} surplus)", r.taken, r.machines - r.taken)
                } else {
                    r.taken.to_string()
                };
                if r.dormant > 0 {
                    cell.push_str(&format!(" ({} dormant)", r.dormant));
                }
                cell
            },
            r.count.to_string(),
            r.failed.to_string(),
            match r.stock {
                None => "not read".into(),
                Some(s) if !s.offered => "not offered".into(),
                Some(s) if !s.in_stock => "none".into(),
                Some(s) => s.count.map_or_else(|| "in stock".into(), |n| n.to_string()),
            },
        ];
        if with_hold {
            row.push(
                p.held_until
                    .map(|u| format!("out of stock until {}", u.format("%Y-%m-%d %H:%M:%S")))
                    .unwrap_or_else(|| "no".into()),
            );
        }
        row.push(match shepherd::fleet::cost::pool_cost(r) {
            Some(c) if c.wasted_per_hour > 0.0 => format!(
                "{} ({} wasted)",
                money(c.per_hour, &c.currency),
                money(c.wasted_per_hour, &c.currency)
            ),
            Some(c) => money(c.per_hour, &c.currency),
            None if r.stock.is_none() => "not read".into(),
            None => "no price given".into(),
        });
        t.row(row);
    }
    t.render()
}

pub async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let pool = args.db.connect(2).await?;
    let overview = fleet::overview(&pool).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&overview)?);
    } else {
        print!("{}", render_status(&overview));
        print!("{}", render_ended(&ended_jobs(&pool).await?));
    }
    Ok(())
}

/// A job the queue gave up on, or that was killed: what `shepherd job
/// retry` takes.
struct EndedJob {
    id: String,
    kind: String,
    state: String,
    attempts: i32,
    seconds: f64,
    error: Option<String>,
}

/// The newest jobs that ended failed or killed, which an operator may
/// retry by id.
async fn ended_jobs(pool: &sqlx::PgPool) -> anyhow::Result<Vec<EndedJob>> {
    let rows: Vec<(String, String, String, i32, f64, Option<String>)> = sqlx::query_as(
        "select id, kind, state, attempts,
                extract(epoch from now() - coalesce(done_at, run_at))::float8,
                left(coalesce(last_result->>'Err', last_result::text), 200)
         from shepherd.failed_jobs
         where kind in ('reconcile', 'create_device', 'assimilate', 'delete_machine')
           and (state = 'Killed' or attempts >= max_attempts)
         limit 10",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, kind, state, attempts, seconds, error)| EndedJob {
            id,
            kind,
            state,
            attempts,
            seconds,
            error,
        })
        .collect())
}

fn render_ended(jobs: &[EndedJob]) -> String {
    if jobs.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\njobs that ended failed or killed (newest {}; retry one with: shepherd job retry ID --reason ...)\n",
        jobs.len()
    );
    let mut t = Table::new(&["ID", "KIND", "STATE", "RUNS", "ENDED", "LAST ERROR"]);
    for j in jobs {
        t.row(vec![
            j.id.clone(),
            j.kind.clone(),
            if j.state == "Killed" {
                "cancelled".into()
            } else {
                "failed".into()
            },
            j.attempts.to_string(),
            format!("{} ago", age(j.seconds)),
            j.error
                .as_deref()
                .map(|e| shepherd::text::bounded(e, 120))
                .unwrap_or_default(),
        ]);
    }
    out.push_str(&t.render());
    out
}
