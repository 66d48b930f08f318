//! `shepherd pools plan`: what a pass would do for each Latitude.sh pool,
//! read from the live API (or the fake) and changing nothing. The jobs do
//! not provision Latitude yet (docs/providers.md); this is how an operator
//! checks pools, stock and hostnames before they do.

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use shepherd::latitude::Stock;
use shepherd::latitude::pools::{self, Shortfall};

use crate::settings::LatitudeArgs;
use crate::table::Table;

#[derive(Debug, Subcommand)]
pub enum PoolsCommand {
    /// What a pass would create in each pool, bounded by stock and the
    /// limit, from the provider's answers; changes nothing
    Plan(PoolsPlanArgs),
}

#[derive(Debug, Args)]
pub struct PoolsPlanArgs {
    #[command(flatten)]
    latitude: LatitudeArgs,

    /// Hostname prefix of shepherd's servers
    #[arg(long, env = "SHEPHERD_DEVICE_PREFIX", default_value = "shepherd-")]
    device_prefix: String,

    /// Room left under the cluster's limit (default: unbounded)
    #[arg(long)]
    room: Option<u64>,

    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

pub async fn run(command: PoolsCommand) -> anyhow::Result<()> {
    let PoolsCommand::Plan(args) = command;
    let latitude = &args.latitude;
    if latitude.pools.is_empty() {
        bail!("no pools: give at least one --pool name=...,plan=...,site=...,count=N,os=...");
    }
    pools::validate(&latitude.pools, &args.device_prefix).map_err(anyhow::Error::msg)?;
    let client = latitude.client()?;
    let servers = client
        .list_servers(None)
        .await
        .context("cannot list the project's servers")?;
    let mut stock = BTreeMap::new();
    for p in &latitude.pools {
        if let std::collections::btree_map::Entry::Vacant(slot) =
            stock.entry((p.plan.clone(), p.site.clone()))
        {
            let s = client
                .stock(&p.plan, &p.site)
                .await
                .with_context(|| format!("cannot read the stock of {} in {}", p.plan, p.site))?;
            slot.insert(s);
        }
    }
    let plans = pools::plan(
        &args.device_prefix,
        &latitude.pools,
        &servers,
        &stock,
        &HashMap::new(),
        &HashSet::new(),
        args.room.unwrap_or(u64::MAX),
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&plans)?);
        return Ok(());
    }
    let mut table = Table::new(&[
        "POOL", "PLAN", "SITE", "WANT", "HAVE", "FAILED", "STOCK", "CREATE", "SHORT",
    ]);
    for (p, plan) in latitude.pools.iter().zip(&plans) {
        table.row(vec![
            p.name.clone(),
            p.plan.clone(),
            p.site.clone(),
            plan.want.to_string(),
            plan.have.to_string(),
            plan.failed.to_string(),
            match plan.stock {
                Stock::Unavailable => "not in site".into(),
                Stock::Empty => "none".into(),
                Stock::Some(Some(n)) => n.to_string(),
                Stock::Some(None) => "in stock".into(),
            },
            plan.create.to_string(),
            match plan.short {
                None => String::new(),
                Some((n, why)) => format!(
                    "{n}: {}",
                    match why {
                        Shortfall::NotInSite => "the plan is not offered in the site",
                        Shortfall::OutOfStock => "out of stock",
                        Shortfall::AtLimit => "at the limit",
                        Shortfall::Penalised => "penalised",
                    }
                ),
            },
        ]);
    }
    print!("{}", table.render());
    println!(
        "(a dry run: nothing was created; servers in flight are not counted until the jobs \
         provision Latitude)"
    );
    Ok(())
}
