//! `shepherd pools`: the cluster's pools, its desired state where the
//! provider has no reservations (Latitude.sh: keep N of a plan in a site).
//! They live in Postgres and change for every worker at once, recorded
//! with who and why: `list`, `set`, `remove`, the declarative `apply FILE`
//! (a file an operator keeps in git), and `plan`, the next pass dry.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use shepherd::pools::{Change, PoolRow};
use shepherd::provider::Pool;

use crate::commands::database::{DatabaseArgs, explain};
use crate::table::Table;

#[derive(Debug, Subcommand)]
pub enum PoolsCommand {
    /// The cluster's pools, with the machines each holds
    List(ListArgs),
    /// Declare a pool, or change one: `pools set web count=8`, or a whole
    /// spec for a new one (`plan=...,site=...,count=N,os=...`)
    Set(SetArgs),
    /// Remove a pool: its machines are deleted as it drains
    Remove(RemoveArgs),
    /// Make the cluster's pools those of a file (one pool a line, as
    /// `--pool` takes it; `#` starts a comment): declares, changes and
    /// removes, all or nothing
    Apply(ApplyArgs),
    /// What the next pass would create and delete, from the provider's
    /// answers and the cluster's state; changes nothing (as `shepherd plan`)
    Plan(Box<crate::commands::operate::PlanArgs>),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Also the pools removed that hold no machine any more
    #[arg(long)]
    all: bool,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct SetArgs {
    /// The pool's name (lowercase letters, digits and inner '-')
    name: String,
    /// What to set: plan=..., site=..., count=N, os=..., ssh_keys=ID+ID (a
    /// new pool needs the first four)
    spec: String,
    /// Why; recorded with the change
    #[arg(long)]
    reason: String,
    /// Confirms that a count of 0 deletes every machine of the pool
    #[arg(long)]
    confirm_delete: bool,
    #[command(flatten)]
    db: DatabaseArgs,
}

#[derive(Debug, Args)]
pub struct RemoveArgs {
    name: String,
    /// Why; recorded with the removal
    #[arg(long)]
    reason: String,
    /// Confirms that every machine of the pool is deleted
    #[arg(long)]
    confirm_delete: bool,
    #[command(flatten)]
    db: DatabaseArgs,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The file: one pool a line, `name=web,plan=...,site=...,count=N,os=...`
    file: PathBuf,
    /// Why; recorded with every change
    #[arg(long)]
    reason: Option<String>,
    /// Print what would change, created and deleted, and why; change nothing
    #[arg(long)]
    dry_run: bool,
    /// Confirms the deletions a pool removed or set to 0 makes
    #[arg(long)]
    confirm_delete: bool,
    #[command(flatten)]
    db: DatabaseArgs,
}

pub async fn run(command: PoolsCommand) -> anyhow::Result<()> {
    match command {
        PoolsCommand::List(args) => list(args).await,
        PoolsCommand::Set(args) => set(args).await,
        PoolsCommand::Remove(args) => remove(args).await,
        PoolsCommand::Apply(args) => apply(args).await,
        PoolsCommand::Plan(args) => crate::commands::operate::plan(*args).await,
    }
}

fn who() -> String {
    super::cli_user()
}

pub use shepherd::pools::Occupancy;

async fn occupancy(
    pool: &sqlx::PgPool,
    rows: &[PoolRow],
) -> anyhow::Result<BTreeMap<String, Occupancy>> {
    let prefix = crate::settings::Recorded::read(pool).await?.prefix();
    let mut conn = pool.acquire().await?;
    shepherd::pools::occupancy(&mut conn, &prefix, rows)
        .await
        .map_err(explain)
}

/// One server's price by plan and site, as the last pass read it.
type Prices = BTreeMap<(String, String), shepherd::provider::Price>;

async fn prices(pool: &sqlx::PgPool) -> anyhow::Result<Prices> {
    let mut conn = pool.acquire().await?;
    Ok(shepherd::jobs::spend::last_survey(&mut conn)
        .await
        .map_err(explain)?
        .into_iter()
        .filter_map(|r| r.price.map(|p| ((r.plan, r.site.to_uppercase()), p)))
        .collect())
}

/// What a change of `delta` servers of `plan` at `site` does to the bill.
fn cost_change(prices: &Prices, plan: &str, site: &str, delta: i64) -> String {
    if delta == 0 {
        return String::new();
    }
    let site = site.to_uppercase();
    let price = prices.get(&(plan.to_string(), site.clone()));
    shepherd::fleet::cost::change_words(plan, &site, delta, price)
}

async fn read_rows(pool: &sqlx::PgPool) -> anyhow::Result<Vec<PoolRow>> {
    let mut conn = pool.acquire().await?;
    shepherd::pools::read(&mut conn).await.map_err(explain)
}

async fn list(args: ListArgs) -> anyhow::Result<()> {
    let pool = args.db.connect(2).await?;
    let rows = read_rows(&pool).await?;
    let occupied = occupancy(&pool, &rows).await?;
    let rows: Vec<&PoolRow> = rows
        .iter()
        .filter(|r| args.all || !r.removed || occupied[&r.name].machines > 0)
        .collect();
    if args.json {
        let json: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "pool": r,
                    "standing": occupied[&r.name],
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    if rows.is_empty() {
        // A Metal cluster refuses pools: telling its operator to declare
        // one would only lead to that refusal.
        let provider: Option<String> = sqlx::query_scalar(
            "select value #>> '{}' from shepherd.cluster_settings where key = 'provider'",
        )
        .fetch_optional(&pool)
        .await?
        .flatten();
        if provider.as_deref() == Some("metal") {
            println!(
                "the cluster has no pools: it provisions Equinix Metal hardware reservations, which have none (pools are a Latitude.sh cluster's)"
            );
        } else {
            println!(
                "the cluster has no pools (declare one: shepherd pools set NAME plan=...,site=...,count=N,os=... --reason \"...\")"
            );
        }
        return Ok(());
    }
    let mut t = Table::new(&[
        "POOL", "PLAN", "SITE", "OS", "COUNT", "MACHINES", "CREATING", "LEAVING", "COST/H",
        "CHANGED",
    ]);
    let prices = prices(&pool).await?;
    for r in rows {
        let o = &occupied[&r.name];
        // Machines standing and creations in flight are billed; what is
        // leaving is priced apart (paid for, on its way out).
        let cost = match prices.get(&(r.plan.clone(), r.site.to_uppercase())) {
            Some(p) => {
                let mut cell =
                    shepherd::fleet::cost::money(f64::from(o.billed()) * p.hour, &p.currency);
                if o.leaving > 0 {
                    cell.push_str(&format!(
                        " ({} leaving)",
                        shepherd::fleet::cost::money(f64::from(o.leaving) * p.hour, &p.currency)
                    ));
                }
                cell
            }
            None => "no price".into(),
        };
        t.row(vec![
            if r.removed {
                format!("{} (removed)", r.name)
            } else {
                r.name.clone()
            },
            r.plan.clone(),
            r.site.clone(),
            r.operating_system.clone(),
            r.count.to_string(),
            o.machines.to_string(),
            o.creating.to_string(),
            o.leaving.to_string(),
            cost,
            format!(
                "{} by {}: {}",
                r.updated_at.format("%Y-%m-%d %H:%M:%S"),
                r.updated_by,
                r.reason
            ),
        ]);
    }
    print!("{}", t.render());
    let overview = shepherd::fleet::overview(&pool).await.map_err(explain)?;
    if let Some(seen) = &overview.pools {
        print!("{}", crate::commands::status::fleet_cost_line(seen));
    }
    print!(
        "{}",
        crate::commands::status::spend_cap_line(overview.spend_cap.as_ref())
    );
    Ok(())
}

/// A pool as `set` asks for it: the spec's fields over the pool's own.
fn merged(name: &str, spec: &str, current: Option<&PoolRow>) -> anyhow::Result<Pool> {
    let mut fields: BTreeMap<String, String> = match current {
        Some(r) if !r.removed => BTreeMap::from([
            ("plan".into(), r.plan.clone()),
            ("site".into(), r.site.clone()),
            ("count".into(), r.count.to_string()),
            ("os".into(), r.operating_system.clone()),
            ("ssh_keys".into(), r.ssh_keys.join("+")),
        ]),
        _ => BTreeMap::new(),
    };
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').with_context(|| {
            format!("{part:?} is not key=value (plan, site, count, os, ssh_keys)")
        })?;
        if k.trim() == "name" {
            bail!("the pool's name is the first argument, not name= in the spec");
        }
        fields.insert(k.trim().to_string(), v.trim().to_string());
    }
    fields.insert("name".into(), name.to_string());
    if fields.get("ssh_keys").is_some_and(|k| k.is_empty()) {
        fields.remove("ssh_keys");
    }
    let text: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
    text.join(",").parse::<Pool>().map_err(anyhow::Error::msg)
}

async fn set(args: SetArgs) -> anyhow::Result<()> {
    let pool = args.db.connect(2).await?;
    let rows = read_rows(&pool).await?;
    let spec = merged(
        &args.name,
        &args.spec,
        rows.iter().find(|r| r.name == args.name),
    )?;
    let mut tx = pool.begin().await?;
    let done = shepherd::pools::set(&mut tx, &spec, &args.reason, &who(), args.confirm_delete)
        .await
        .map_err(explain)?;
    tx.commit().await?;
    match done {
        Change::Unchanged => println!("pool {} is as asked already (nothing recorded)", args.name),
        done => {
            println!(
                "pool {} {done}: {} of {} in {} ({}), for every worker",
                args.name, spec.count, spec.plan, spec.site, spec.operating_system
            );
            // What it adds or saves, against what stands now.
            let standing = occupancy(&pool, &read_rows(&pool).await?).await?;
            let have = standing.get(&args.name).map_or(0, Occupancy::billed);
            let change = cost_change(
                &prices(&pool).await?,
                &spec.plan,
                &spec.site,
                i64::from(spec.count) - i64::from(have),
            );
            if !change.is_empty() {
                println!("cost: {change}");
            }
        }
    }
    Ok(())
}

async fn remove(args: RemoveArgs) -> anyhow::Result<()> {
    let pool = args.db.connect(2).await?;
    let mut tx = pool.begin().await?;
    let removed = shepherd::pools::remove(
        &mut tx,
        &args.name,
        &args.reason,
        &who(),
        args.confirm_delete,
    )
    .await
    .map_err(explain)?;
    tx.commit().await?;
    if !removed {
        bail!("there is no pool {} (or it was removed already)", args.name);
    }
    println!(
        "pool {} removed: its machines are deleted as it drains (shepherd pools list shows them until they are gone)",
        args.name
    );
    Ok(())
}

/// Reads a pools file: one pool a line, blank lines and `#` comments
/// skipped; errors name the line.
pub fn read_file(path: &std::path::Path) -> anyhow::Result<Vec<Pool>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut pools: Vec<Pool> = vec![];
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let pool: Pool = line
            .parse()
            .map_err(|e| anyhow::anyhow!("{}:{}: {e}", path.display(), n + 1))?;
        if pools.iter().any(|p| p.name == pool.name) {
            bail!(
                "{}:{}: pool {} is declared twice",
                path.display(),
                n + 1,
                pool.name
            );
        }
        pools.push(pool);
    }
    Ok(pools)
}

/// One line of what `apply` does.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Declare(Pool),
    Change { from: Pool, to: Pool },
    Remove(String),
}

async fn apply(args: ApplyArgs) -> anyhow::Result<()> {
    let wanted = read_file(&args.file)?;
    let pool = args.db.connect(2).await?;
    let rows = read_rows(&pool).await?;
    let occupied = occupancy(&pool, &rows).await?;
    let mut steps = vec![];
    for p in &wanted {
        match rows.iter().find(|r| r.name == p.name && !r.removed) {
            None => steps.push(Step::Declare(p.clone())),
            Some(r) if r.pool() != *p => steps.push(Step::Change {
                from: r.pool(),
                to: p.clone(),
            }),
            Some(_) => {}
        }
    }
    for r in rows.iter().filter(|r| !r.removed) {
        if !wanted.iter().any(|p| p.name == r.name) {
            steps.push(Step::Remove(r.name.clone()));
        }
    }
    if steps.is_empty() {
        println!(
            "the cluster's pools are those of {} already",
            args.file.display()
        );
        return Ok(());
    }
    let standing = |name: &str| occupied.get(name).cloned().unwrap_or_default();
    let prices = prices(&pool).await?;
    for step in &steps {
        println!("{}", describe(step, &standing, &rows, &prices));
    }
    if args.dry_run {
        println!("(a dry run: nothing was changed)");
        return Ok(());
    }
    let Some(reason) = args.reason.filter(|r| !r.trim().is_empty()) else {
        bail!("say why with --reason: every change records it with who acted");
    };
    // All or nothing: one refusal undoes every change before it.
    let mut tx = pool.begin().await?;
    let by = who();
    for step in &steps {
        match step {
            Step::Declare(p) | Step::Change { to: p, .. } => {
                shepherd::pools::set(&mut tx, p, &reason, &by, args.confirm_delete)
                    .await
                    .map_err(explain)
                    .with_context(|| format!("pool {}", p.name))?;
            }
            Step::Remove(name) => {
                shepherd::pools::remove(&mut tx, name, &reason, &by, args.confirm_delete)
                    .await
                    .map_err(explain)
                    .with_context(|| format!("pool {name}"))?;
            }
        }
    }
    tx.commit().await?;
    println!("applied: {} changes, for every worker", steps.len());
    Ok(())
}

fn describe(
    step: &Step,
    standing: &dyn Fn(&str) -> Occupancy,
    rows: &[PoolRow],
    prices: &Prices,
) -> String {
    let effect = |name: &str, count: u32| {
        let o = standing(name);
        let have = o.machines + o.creating;
        let (plan, site) = match step {
            Step::Declare(p) | Step::Change { to: p, .. } => (p.plan.clone(), p.site.clone()),
            Step::Remove(_) => rows
                .iter()
                .find(|r| r.name == name)
                .map(|r| (r.plan.clone(), r.site.clone()))
                .unwrap_or_default(),
        };
        let cost = cost_change(prices, &plan, &site, i64::from(count) - i64::from(have));
        if have < count {
            format!("would create {}: {cost}", count - have)
        } else if have > count {
            format!(
                "would delete {} (failed first, then not ready, then newest; protected never): {cost}",
                have - count
            )
        } else {
            "nothing to create or delete".into()
        }
    };
    match step {
        Step::Declare(p) => format!(
            "declare {}: {} of {} in {} ({}); {}",
            p.name,
            p.count,
            p.plan,
            p.site,
            p.operating_system,
            effect(&p.name, p.count)
        ),
        Step::Change { from, to } => {
            let mut what = vec![];
            if from.count != to.count {
                what.push(format!("count {} -> {}", from.count, to.count));
            }
            if from.plan != to.plan {
                what.push(format!("plan {} -> {}", from.plan, to.plan));
            }
            if from.site != to.site {
                what.push(format!("site {} -> {}", from.site, to.site));
            }
            if from.operating_system != to.operating_system {
                what.push(format!(
                    "os {} -> {}",
                    from.operating_system, to.operating_system
                ));
            }
            if from.ssh_keys != to.ssh_keys {
                what.push("ssh_keys".into());
            }
            format!(
                "change {}: {}; {}",
                to.name,
                what.join(", "),
                effect(&to.name, to.count)
            )
        }
        Step::Remove(name) => format!("remove {name}; {}", effect(name, 0)),
    }
}
