//! `shepherd cost`: the ledger of machine-hours and cost per pool and day
//! (`shepherd::fleet::ledger`), with totals.

use anyhow::bail;
use chrono::{DateTime, Utc};
use clap::Args;
use shepherd::fleet::cost::money;

use crate::commands::database::{DatabaseArgs, explain};
use crate::table::Table;

#[derive(Debug, Args)]
pub struct CostArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// How far back: 30d, 12h, ... (before `--until`)
    #[arg(long, default_value = "30d", value_parser = shepherd::config::parse_duration)]
    since: std::time::Duration,
    /// The end of the period, RFC 3339 (2026-12-01T00:00:00Z); now by default
    #[arg(long)]
    until: Option<DateTime<Utc>>,
    /// One pool only
    #[arg(long)]
    pool: Option<String>,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

pub async fn cost(args: CostArgs) -> anyhow::Result<()> {
    let until = args.until.unwrap_or_else(Utc::now);
    let Ok(back) = chrono::TimeDelta::from_std(args.since) else {
        bail!("--since {:?} is too long", args.since);
    };
    let since = until - back;
    let pool = args.db.connect(2).await?;
    let rows = shepherd::fleet::ledger::ledger(&pool, since, until, args.pool.as_deref())
        .await
        .map_err(explain)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "since": since, "until": until, "days": rows,
            }))?
        );
        return Ok(());
    }
    println!(
        "machine-hours and cost from {} to {} (UTC days; each machine from when shepherd \
         recorded it to when it recorded it gone, at the price in force then)",
        since.format("%Y-%m-%d %H:%M:%S"),
        until.format("%Y-%m-%d %H:%M:%S")
    );
    if rows.is_empty() {
        println!("no machine of ours ran in that time");
        return Ok(());
    }
    let mut t = Table::new(&["DAY", "POOL", "MACHINE-HOURS", "COST", "UNPRICED HOURS"]);
    let mut totals: std::collections::BTreeMap<(String, Option<String>), (f64, f64, f64)> =
        Default::default();
    for r in &rows {
        let currency = r.currency.clone();
        t.row(vec![
            r.day.to_string(),
            r.pool.clone(),
            format!("{:.2}", r.machine_hours),
            currency
                .as_deref()
                .map_or_else(|| "-".into(), |c| money(r.cost, c)),
            format!("{:.2}", r.unpriced_hours),
        ]);
        let total = totals.entry((r.pool.clone(), currency)).or_default();
        total.0 += r.machine_hours;
        total.1 += r.cost;
        total.2 += r.unpriced_hours;
    }
    print!("{}", t.render());
    println!();
    let mut t = Table::new(&["POOL", "MACHINE-HOURS", "COST", "UNPRICED HOURS"]);
    let mut all: std::collections::BTreeMap<Option<String>, (f64, f64)> = Default::default();
    for ((pool, currency), (hours, cost, unpriced)) in &totals {
        t.row(vec![
            pool.clone(),
            format!("{hours:.2}"),
            currency
                .as_deref()
                .map_or_else(|| "-".into(), |c| money(*cost, c)),
            format!("{unpriced:.2}"),
        ]);
        let sum = all.entry(currency.clone()).or_default();
        sum.0 += hours;
        sum.1 += cost;
    }
    print!("{}", t.render());
    for (currency, (hours, cost)) in all {
        match currency {
            Some(c) => println!("total: {hours:.2} machine-hours, {}", money(cost, &c)),
            None => println!("total: {hours:.2} machine-hours, unpriced"),
        }
    }
    println!(
        "(an estimate of the bill: the provider bills whole hours, and a monthly or yearly \
         plan bills by its term)"
    );
    Ok(())
}
