//! `shepherd plan` (and `pools plan`): a pass's dry run, in the cluster's
//! provider's words.

use clap::Args;
use shepherd::fleet;

use crate::commands::database::DatabaseArgs;
use crate::settings::ProvisionerArgs;
use crate::table::Table;

use super::status::render_pools;

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    #[command(flatten)]
    provider: crate::settings::ProviderArgs,
    #[command(flatten)]
    provisioner: ProvisionerArgs,
    /// Print JSON instead of a report
    #[arg(long)]
    json: bool,
}

pub async fn plan(args: PlanArgs) -> anyhow::Result<()> {
    let mut config = args.provisioner.config_with(&args.provider.metal)?;
    let pool = args.db.connect(2).await?;
    let (kind, provider) = args.provider.provider(&pool, &config.os).await?;
    let recorded = crate::settings::Recorded::read(&pool).await?;
    config.device_prefix = recorded.prefix();
    let words = Words::of(kind);
    let plan = fleet::plan(&pool, provider.as_ref(), &config).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
        return Ok(());
    }
    print!("{}", render_plan(&plan, &words, &config));
    Ok(())
}

/// A provider's own words: Metal has reservations and devices, Latitude.sh
/// places (in pools) and servers.
pub struct Words {
    pub unit: &'static str,
    pub units: &'static str,
    pub machine: &'static str,
    pub machines: &'static str,
}

impl Words {
    pub fn of(kind: crate::settings::ProviderKind) -> Words {
        match kind {
            crate::settings::ProviderKind::Metal => Words {
                unit: "reservation",
                units: "reservations",
                machine: "device",
                machines: "devices",
            },
            crate::settings::ProviderKind::Latitude => Words {
                unit: "place",
                units: "places",
                machine: "server",
                machines: "servers",
            },
        }
    }

    /// The words of the provider a [`shepherd::provider::Provider`] names
    /// itself (Metal's where it is not Latitude.sh).
    pub fn named(name: &str) -> Words {
        Words::of(if name == shepherd::latitude::provider::NAME {
            crate::settings::ProviderKind::Latitude
        } else {
            crate::settings::ProviderKind::Metal
        })
    }

    /// Why a unit is skipped, in these words.
    pub fn skip(&self, why: shepherd::jobs::pass::Skip) -> String {
        use shepherd::jobs::pass::Skip;
        match why {
            Skip::InUse => format!("a {} stands on it", self.machine),
            Skip::NotProvisionable if self.unit == "place" => {
                "the pool's plan is out of stock in its site".into()
            }
            Skip::NotProvisionable => "not provisionable".into(),
            Skip::Penalised => "penalised (see shepherd sinbin)".into(),
            Skip::InFlight => "a creation is in flight on it".into(),
            Skip::BeyondLimit => "beyond the cluster's max_machines".into(),
            Skip::BeyondChunk => "beyond the chunk size of one pass".into(),
            Skip::BeyondStock => "beyond the stock the provider counts".into(),
            Skip::PoolWhole => "the pool has its count already".into(),
        }
    }
}

pub fn render_plan(
    plan: &fleet::Plan,
    words: &Words,
    config: &shepherd::config::ProvisionerConfig,
) -> String {
    let mut out = String::new();
    if !plan.settings_recorded {
        out.push_str(
            "the cluster has no recorded settings yet (no worker has started): using this command's flags\n",
        );
    }
    out.push_str(&format!(
        "listed {} {}; {} managed, {} in flight, limit {}\n",
        plan.devices_listed,
        words.machines,
        plan.managed,
        plan.in_flight,
        if plan.max_machines == 0 {
            "none".to_string()
        } else {
            plan.max_machines.to_string()
        }
    ));
    if let Some(l) = &plan.listing {
        out.push_str(&format!("listed: {}\n", listing_words(l)));
    }
    if !plan.would_adopt.is_empty() {
        out.push_str(&format!(
            "would adopt {} {}: {}\n",
            plan.would_adopt.len(),
            words.machines,
            plan.would_adopt.join(", ")
        ));
    }
    if let Some(d) = &plan.discrepancy {
        if plan.held.iter().any(|h| h.guard == "discrepancy") {
            out.push_str(
                "DISCREPANCY: the pass would hold the pools it concerns (below) and go on with the others\n",
            );
        } else {
            out.push_str("DISCREPANCY: the pass would refuse to work\n");
        }
        out.push_str(&format!(
            "  unknown {}: {}\n",
            words.machines,
            d.unknown_devices.join(", ")
        ));
        out.push_str(&format!(
            "  missing {}: {}\n",
            words.machines,
            d.missing_devices.join(", ")
        ));
        return out;
    }
    if !plan.would_delete.is_empty() {
        out.push_str(&format!(
            "would delete {} {}:\n",
            plan.would_delete.len(),
            words.machines
        ));
        for d in &plan.would_delete {
            out.push_str(&format!("  {} ({}): {}\n", d.device, d.cause, d.message));
        }
    }
    for h in &plan.held {
        out.push_str(&format!(
            "held back in pool {} ({}): {}\n",
            h.pool, h.guard, h.message
        ));
    }
    if plan.at_limit {
        out.push_str(&format!(
            "at the limit: the pass would not list {}\n",
            words.units
        ));
        return out;
    }
    if let Some(p) = &plan.paused {
        out.push_str(&format!("creations are paused by {}: {}\n", p.by, p.reason));
    }
    out.push_str(&format!(
        "listed {} {}\n",
        plan.reservations_listed, words.units
    ));
    if !plan.pools.is_empty() {
        let pools: Vec<fleet::PoolState> = plan
            .pools
            .iter()
            .map(|report| fleet::PoolState {
                report: report.clone(),
                held_until: None,
            })
            .collect();
        out.push_str(&render_pools(&pools, false));
    }
    out.push_str(&format!(
        "would create {} {} (chunk size {}):\n",
        plan.would_create.len(),
        words.machines,
        plan.chunk_size
    ));
    for r in &plan.would_create {
        match plan.labels.get(r) {
            // A place's hostname carries the creation's request, which a
            // dry run does not have yet.
            Some(label) => out.push_str(&format!("  {r}  -> place {label}\n")),
            None => out.push_str(&format!("  {r}  -> {}\n", config.hostname(*r))),
        }
    }
    // What the pass would add to or take off the bill, per pool, at the
    // prices read with the stock: creations by their places' pools,
    // deletions by theirs.
    for report in &plan.pools {
        let created = plan
            .would_create
            .iter()
            .filter_map(|r| plan.labels.get(r))
            .filter(|label| label.split_once('/').is_some_and(|(p, _)| p == report.name))
            .count() as i64;
        let deleted = plan
            .would_delete
            .iter()
            .filter(|d| d.pool == report.name)
            .count() as i64;
        let delta = created - deleted;
        if delta == 0 {
            continue;
        }
        let change = shepherd::fleet::cost::change_words(
            &report.plan,
            &report.site,
            delta,
            report.price.as_ref(),
        );
        out.push_str(&format!("cost of pool {}: {change}\n", report.name));
    }
    let header = if words.unit == "place" {
        "SKIPPED PLACE"
    } else {
        "SKIPPED RESERVATION"
    };
    let mut t = Table::new(&[header, "WHY"]);
    for (r, why) in &plan.skipped {
        t.row(vec![
            match plan.labels.get(r) {
                Some(label) => format!("{r} ({label})"),
                None => r.to_string(),
            },
            words.skip(*why),
        ]);
    }
    out.push_str(&t.render());
    out
}

/// What a pass's listing read, in one line: "servers whose hostname starts
/// with shepherd-: 40 in 1 read".
pub fn listing_words(l: &shepherd::provider::ListingCost) -> String {
    format!(
        "{}: {} in {} read{}",
        l.scope,
        l.machines,
        l.reads,
        if l.reads == 1 { "" } else { "s" }
    )
}
