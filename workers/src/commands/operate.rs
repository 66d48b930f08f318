//! The operator's commands: `history`, `pause`, `resume`, `sinbin clear`,
//! the settings, a machine released, deprovisioned or protected, and job
//! retry and cancel (`status` in status.rs, `plan` in plan.rs).

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use uuid::Uuid;

use crate::commands::database::DatabaseArgs;
use crate::table::{Table, print_event};

pub use super::plan::{PlanArgs, Words, listing_words, plan, render_plan};
pub use super::status::{StatusArgs, render_status, status};

#[derive(Debug, Subcommand)]
pub enum HistoryOf {
    /// A unit's events: a Metal reservation's id, or a Latitude.sh place by
    /// its unit id or its name (`web/3`)
    #[command(visible_alias = "unit")]
    Reservation {
        id: String,
        #[command(flatten)]
        db: DatabaseArgs,
        #[arg(long)]
        json: bool,
    },
    /// A machine's events, with the creation that made it: any provider's
    /// id (a Metal device's UUID, a Latitude.sh server's `sv_...`)
    #[command(visible_alias = "machine")]
    Device {
        id: String,
        #[command(flatten)]
        db: DatabaseArgs,
        #[arg(long)]
        json: bool,
    },
}

pub async fn history(of: HistoryOf) -> anyhow::Result<()> {
    let (events, what, json) = match of {
        HistoryOf::Reservation { id, db, json } => {
            let pool = db.connect(2).await?;
            let unit = match id.parse::<Uuid>() {
                Ok(u) => u,
                Err(_) => unit_of_place(&pool, &id).await?,
            };
            let stream = format!("reservation/{unit}");
            let events = shepherd::events::store::read_stream(&pool, &stream)
                .await
                .map_err(store_message)?;
            (events, format!("unit {id}"), json)
        }
        HistoryOf::Device { id, db, json } => {
            let pool = db.connect(2).await?;
            let events = shepherd::events::store::read_device_history(&pool, &id)
                .await
                .map_err(store_message)?;
            (events, format!("machine {id}"), json)
        }
    };
    if events.is_empty() {
        bail!("no events for {what}: shepherd has recorded nothing about it");
    }
    for e in &events {
        print_event(e, json)?;
    }
    Ok(())
}

/// The unit of a Latitude.sh place named `pool/index`, derived as every
/// process derives it, from the cluster's project.
async fn unit_of_place(pool: &sqlx::PgPool, place: &str) -> anyhow::Result<Uuid> {
    let recorded = crate::settings::Recorded::read(pool).await?;
    let (name, index) = place
        .split_once('/')
        .and_then(|(p, i)| Some((p, i.parse::<u32>().ok()?)))
        .with_context(|| {
            format!("{place:?} is neither a unit id (a UUID) nor a place such as web/3")
        })?;
    match (recorded.provider.as_deref(), recorded.project) {
        (Some("latitude"), Some(project)) => {
            Ok(shepherd::latitude::provider::unit_id(&project, name, index))
        }
        _ => bail!("{place:?} names a place, and this cluster has no Latitude.sh pools"),
    }
}

fn store_message(e: shepherd::events::StoreError) -> anyhow::Error {
    match e {
        shepherd::events::StoreError::Database(e) => crate::commands::database::explain(e),
        other => anyhow::Error::from(other),
    }
}

#[derive(Debug, Args)]
pub struct PauseArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Why (recorded in the event, shown to everyone who asks)
    #[arg(long)]
    reason: String,
    /// Pause deletions (surplus, replacements, deprovisions) instead of
    /// creations
    #[arg(long)]
    deletions: bool,
}

#[derive(Debug, Args)]
pub struct ResumeArgs {
    #[command(flatten)]
    control: ControlArgs,
    /// Resume deletions instead of creations
    #[arg(long)]
    deletions: bool,
}

#[derive(Debug, Args)]
pub struct ControlArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Why (recorded in the event)
    #[arg(long, default_value = "")]
    reason: String,
}

fn operator() -> String {
    super::cli_user()
}

pub async fn pause(args: PauseArgs) -> anyhow::Result<()> {
    let pool = args.db.connect(2).await?;
    if args.deletions {
        let paused: bool = sqlx::query_scalar("select shepherd.pause_deletions($1, $2)")
            .bind(&args.reason)
            .bind(operator())
            .fetch_one(&pool)
            .await
            .map_err(database_message)
            .context("cannot pause deletions")?;
        if paused {
            println!("deletions paused cluster-wide; creations and passes go on");
        } else {
            println!("deletions were already paused (nothing recorded)");
        }
        return Ok(());
    }
    let paused: bool = sqlx::query_scalar("select shepherd.pause_creations($1, $2)")
        .bind(&args.reason)
        .bind(operator())
        .fetch_one(&pool)
        .await
        .map_err(database_message)
        .context("cannot pause creations")?;
    if paused {
        println!("creations paused cluster-wide; reconciles go on reporting");
    } else {
        let mut conn = pool.acquire().await?;
        match shepherd::events::views::read_pause(&mut conn).await? {
            Some(p) => println!(
                "creations were already paused by {} since {}: {} (nothing recorded)",
                p.by,
                p.since.format("%Y-%m-%d %H:%M:%S"),
                p.reason
            ),
            None => println!("creations were already paused (nothing recorded)"),
        }
    }
    Ok(())
}

/// The message Postgres raised, without sqlx's wrapping (and, for a
/// database never migrated, what to run).
fn database_message(e: sqlx::Error) -> anyhow::Error {
    crate::commands::database::explain(e)
}

pub async fn resume(args: ResumeArgs) -> anyhow::Result<()> {
    let deletions = args.deletions;
    let args = args.control;
    let pool = args.db.connect(2).await?;
    if deletions {
        let resumed: bool = sqlx::query_scalar("select shepherd.resume_deletions($1, $2)")
            .bind(&args.reason)
            .bind(operator())
            .fetch_one(&pool)
            .await
            .map_err(database_message)
            .context("cannot resume deletions")?;
        if resumed {
            println!("deletions resumed");
        } else {
            println!("deletions were not paused (nothing recorded)");
        }
        return Ok(());
    }
    let resumed: bool = sqlx::query_scalar("select shepherd.resume_creations($1, $2)")
        .bind(&args.reason)
        .bind(operator())
        .fetch_one(&pool)
        .await
        .map_err(database_message)
        .context("cannot resume creations")?;
    if resumed {
        println!("creations resumed");
    } else {
        println!("creations were not paused (nothing recorded)");
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum SinbinCommand {
    /// Lift penalties early (recorded with who and why)
    Clear(ClearArgs),
}

#[derive(Debug, Args)]
pub struct ClearArgs {
    /// The unit whose penalty to lift: a Metal reservation's id, or a
    /// Latitude.sh place by its name (`web/3`) or its unit id
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    reservation: Option<String>,
    /// Lift every active penalty
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    control: ControlArgs,
}

pub async fn sinbin_clear(args: ClearArgs) -> anyhow::Result<()> {
    let pool = args.control.db.connect(2).await?;
    match args.reservation {
        Some(given) => {
            let r = match given.parse::<Uuid>() {
                Ok(id) => id,
                Err(_) => unit_of_place(&pool, &given).await?,
            };
            let cleared: bool = sqlx::query_scalar("select shepherd.clear_penalty($1, $2, $3)")
                .bind(r)
                .bind(&args.control.reason)
                .bind(operator())
                .fetch_one(&pool)
                .await?;
            if !cleared {
                bail!("{given} is not in the sinbin");
            }
            println!("penalty of {given} lifted");
        }
        None => {
            let n: i32 = sqlx::query_scalar("select shepherd.clear_all_penalties($1, $2)")
                .bind(&args.control.reason)
                .bind(operator())
                .fetch_one(&pool)
                .await?;
            println!("{n} penalties lifted");
        }
    }
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum SettingsCommand {
    /// The cluster's settings, with when each last changed
    Show {
        #[command(flatten)]
        db: DatabaseArgs,
        #[arg(long)]
        json: bool,
    },
    /// Change one of the cluster's settings for every worker (recorded with who and why)
    Set {
        /// One of: max_machines, chunk_size, assimilate, device_creation_rate,
        /// api_rate, penalty, penalty_factor, penalty_max, settle_window,
        /// heartbeat, missed_heartbeats, api_timeout,
        /// latitude_reads_per_minute, latitude_writes_per_minute,
        /// deletion_budget, deletion_period, max_unhealthy, ready_deadline,
        /// leave_hook, leave_timeout, leave_deadline, failed_skip_leave
        /// (docs/configuration.md, docs/pools.md)
        key: String,
        /// The new value, written as its flag takes it (50, 5s,1, 1h, true,
        /// 10%,2, 40%, ack, https://...)
        #[arg(allow_negative_numbers = true)]
        value: String,
        /// Why; recorded with the change
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        db: DatabaseArgs,
    },
}

pub async fn settings(command: SettingsCommand) -> anyhow::Result<()> {
    match command {
        SettingsCommand::Show { db, json } => {
            let pool = db.connect(2).await?;
            let rows: Vec<(String, serde_json::Value, chrono::DateTime<chrono::Utc>)> =
                sqlx::query_as(
                    "select key, value, updated_at from shepherd.cluster_settings order by key",
                )
                .fetch_all(&pool)
                .await?;
            if rows.is_empty() {
                bail!(
                    "the cluster has no settings yet: start a worker once (its flags become the cluster's settings)"
                );
            }
            if json {
                let map: serde_json::Map<String, serde_json::Value> =
                    rows.into_iter().map(|(k, v, _)| (k, v)).collect();
                println!("{}", serde_json::to_string_pretty(&map)?);
                return Ok(());
            }
            let mut t = Table::new(&["SETTING", "VALUE", "CHANGED"]);
            for (key, value, at) in rows {
                let value = match value {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                t.row(vec![key, value, at.format("%Y-%m-%d %H:%M:%S").to_string()]);
            }
            print!("{}", t.render());
        }
        SettingsCommand::Set {
            key,
            value,
            reason,
            db,
        } => {
            let pool = db.connect(2).await?;
            shepherd::cluster::change(&pool, &key, &value, &reason, &operator())
                .await
                .map_err(database_message)?;
            println!("{key} is now {value} for the whole cluster");
        }
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The machine's id, or its id at the provider
    id: String,
    /// Why it is released; recorded with the release
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    db: DatabaseArgs,
    #[command(flatten)]
    provider: crate::settings::ProviderArgs,
}

/// Records that a machine the provider no longer has is no longer managed.
/// The provider is asked first, whichever it is: a machine that still
/// exists in the project is not released (deprovision it to delete it).
pub async fn release(args: ReleaseArgs) -> anyhow::Result<()> {
    if args.reason.trim().is_empty() {
        bail!("say why with --reason: the log records it with who acted");
    }
    let pool = args.db.connect(2).await?;
    let machine: Option<(Uuid, String)> = sqlx::query_as(
        "select machine_id, provider_id from shepherd.managed_machines
         where machine_id::text = $1 or provider_id = $1",
    )
    .bind(&args.id)
    .fetch_optional(&pool)
    .await
    .map_err(crate::commands::database::explain)?;
    let Some((machine_id, device)) = machine else {
        bail!("no managed machine has id or device {}", args.id);
    };
    let (_, provider) = args
        .provider
        .provider(&pool, &shepherd::config::ProvisionerConfig::default().os)
        .await?;
    match provider.machine(&device).await {
        Err(e) if e.not_found() => {}
        Ok(facts) if facts.foreign.is_some() => {}
        Ok(_) => bail!(
            "machine {device} still exists in the project; shepherd releases only machines the \
             provider no longer has (to delete it: shepherd machines deprovision {device} --reason ...)"
        ),
        Err(e) => return Err(e).context("cannot check the machine at the provider"),
    }
    // The release and a pass to look again, together: the discrepancy the
    // missing machine raised clears at once rather than at the next tick.
    let mut tx = pool.begin().await?;
    sqlx::query("select shepherd.release_machine($1, $2, $3, p_provider_says_gone => true)")
        .bind(machine_id.to_string())
        .bind(&args.reason)
        .bind(operator())
        .execute(&mut *tx)
        .await
        .map_err(database_message)?;
    shepherd::jobs::queue::push_reconcile(
        &mut tx,
        &shepherd::jobs::ReconcileArgs {
            requested_by: format!("{} (after a release)", operator()),
        },
        None,
    )
    .await?;
    tx.commit().await?;
    println!(
        "machine {machine_id} (device {device}) is no longer managed; a pass is queued to look again"
    );
    Ok(())
}

#[derive(Debug, Args)]
pub struct MachineActionArgs {
    /// The machine's id, or its id at the provider
    id: String,
    /// Why; recorded with who acted
    #[arg(long)]
    reason: String,
    #[command(flatten)]
    db: DatabaseArgs,
}

/// Deletes one machine through the deletion job: the request is recorded,
/// and the job checks it again before it sends the delete.
pub async fn deprovision(args: MachineActionArgs) -> anyhow::Result<()> {
    let pool = args.db.connect(2).await?;
    let job: Option<String> = sqlx::query_scalar("select shepherd.deprovision_machine($1, $2, $3)")
        .bind(&args.id)
        .bind(&args.reason)
        .bind(operator())
        .fetch_one(&pool)
        .await
        .map_err(database_message)?;
    println!(
        "machine {} is leaving: deletion job {} (shepherd machines shows it until it is gone)",
        args.id,
        job.unwrap_or_default()
    );
    Ok(())
}

/// Scale-in protection, on or off.
pub async fn protect(args: MachineActionArgs, on: bool) -> anyhow::Result<()> {
    let pool = args.db.connect(2).await?;
    let changed: bool = sqlx::query_scalar("select shepherd.protect_machine($1, $2, $3, $4)")
        .bind(&args.id)
        .bind(&args.reason)
        .bind(operator())
        .bind(on)
        .fetch_one(&pool)
        .await
        .map_err(database_message)?;
    let state = if on { "protected" } else { "not protected" };
    if changed {
        println!("machine {} is {state}", args.id);
    } else {
        println!("machine {} was {state} already (nothing recorded)", args.id);
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct AckArgs {
    /// The leaving machine's id, or its id at the provider
    id: String,
    #[command(flatten)]
    db: DatabaseArgs,
}

/// Lets a leaving machine go: the answer an `ack` leave hook waits for.
pub async fn ack(args: AckArgs) -> anyhow::Result<()> {
    let pool = args.db.connect(2).await?;
    let acked: bool = sqlx::query_scalar("select shepherd.acknowledge_leave($1, $2)")
        .bind(&args.id)
        .bind(operator())
        .fetch_one(&pool)
        .await
        .map_err(database_message)?;
    if !acked {
        bail!(
            "machine {} is not waiting to leave (no deletion pending, or it was let go already)",
            args.id
        );
    }
    println!("machine {} may go: its delete is sent next", args.id);
    Ok(())
}

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Run a failed or killed job again (refused if its work already has
    /// a live job)
    Retry(JobActionArgs),
    /// Cancel a job waiting for a worker (a creation only if it was never
    /// tried: one that may have reached the provider is settled by looking)
    Cancel(JobActionArgs),
}

#[derive(Debug, Args)]
pub struct JobActionArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// The job's id (`shepherd status`, the console's /jobs, or apalis.jobs.id)
    id: String,
    /// Why (recorded in the event with who acted)
    #[arg(long)]
    reason: String,
}

pub async fn job(command: JobCommand) -> anyhow::Result<()> {
    use shepherd::jobs::manage;
    let (args, retry) = match command {
        JobCommand::Retry(a) => (a, true),
        JobCommand::Cancel(a) => (a, false),
    };
    if args.reason.trim().is_empty() {
        anyhow::bail!("say why with --reason: the log records it with who acted");
    }
    let pool = args.db.connect(2).await?;
    let by = operator();
    let done = if retry {
        manage::retry(&pool, &args.id, &by, &args.reason).await
    } else {
        manage::cancel(&pool, &args.id, &by, &args.reason).await
    };
    let verb = if retry { "retry" } else { "cancel" };
    done.with_context(|| format!("cannot {verb} job {}", args.id))?;
    if retry {
        println!("job {} will run again as soon as a worker is free", args.id);
    } else {
        println!("job {} cancelled", args.id);
    }
    Ok(())
}
