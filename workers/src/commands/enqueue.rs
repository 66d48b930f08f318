//! `shepherd enqueue`: manual jobs, validated before anything is written,
//! against whichever provider the cluster provisions.

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use shepherd::jobs::{AssimilateArgs, ReconcileArgs, queue};
use uuid::Uuid;

use crate::commands::database::{DatabaseArgs, explain};
use crate::settings::ProviderArgs;

#[derive(Debug, Subcommand)]
pub enum EnqueueCommand {
    /// A reconcile pass, now
    Reconcile(EnqueueReconcile),
    /// A creation on one unit of capacity: a Metal reservation or a
    /// Latitude.sh place (admitted against the cluster's max_machines, the
    /// pause and the sinbin)
    CreateDevice(EnqueueCreate),
    /// Recording one machine of the provider as a managed machine
    Assimilate(EnqueueAssimilate),
}

#[derive(Debug, Args)]
pub struct EnqueueReconcile {
    #[command(flatten)]
    db: DatabaseArgs,
}

#[derive(Debug, Args)]
pub struct EnqueueCreate {
    #[command(flatten)]
    db: DatabaseArgs,
    #[command(flatten)]
    provider: ProviderArgs,
    /// The unit: a Metal reservation's id (a UUID), or a Latitude.sh place
    /// by its name (`web/3`) or its unit id
    #[arg(long, visible_alias = "unit", value_name = "ID")]
    reservation: String,
    /// Create even though the unit is penalised; the reason is recorded
    #[arg(long, value_name = "REASON")]
    override_sinbin: Option<String>,
}

#[derive(Debug, Args)]
pub struct EnqueueAssimilate {
    #[command(flatten)]
    db: DatabaseArgs,
    #[command(flatten)]
    provider: ProviderArgs,
    /// The machine's id at the provider (a Metal device's UUID, a
    /// Latitude.sh server's `sv_...`)
    #[arg(long, visible_alias = "machine", value_name = "ID")]
    device: String,
}

pub async fn enqueue(command: EnqueueCommand) -> anyhow::Result<()> {
    match command {
        EnqueueCommand::Reconcile(args) => {
            let pool = args.db.connect(2).await?;
            let mut tx = pool.begin().await?;
            let id = queue::push_reconcile(
                &mut tx,
                &ReconcileArgs {
                    requested_by: super::cli_user(),
                },
                None,
            )
            .await
            .map_err(explain)?;
            tx.commit().await?;
            println!("enqueued reconcile job {}", id.unwrap_or_default());
        }
        EnqueueCommand::CreateDevice(args) => create(args).await?,
        EnqueueCommand::Assimilate(args) => assimilate(args).await?,
    }
    Ok(())
}

async fn create(args: EnqueueCreate) -> anyhow::Result<()> {
    if args
        .override_sinbin
        .as_deref()
        .is_some_and(|r| r.trim().is_empty())
    {
        bail!("--override-sinbin needs a reason");
    }
    let is_place = args
        .reservation
        .split_once('/')
        .is_some_and(|(pool, index)| !pool.is_empty() && index.parse::<u32>().is_ok());
    if args.reservation.parse::<Uuid>().is_err() && !is_place {
        bail!(
            "--reservation {:?}: neither a unit id (a UUID) nor a place of a pool (web/3)",
            args.reservation
        );
    }
    let pool = args.db.connect(2).await?;
    let (_, provider) = args.provider.provider(&pool, &args_os()).await?;
    let unit = match args.reservation.parse::<Uuid>() {
        Ok(u) => u,
        Err(_) => provider.unit_by_label(&args.reservation).with_context(|| {
            format!(
                "{:?} is neither a unit id (a UUID) nor a place of the cluster's pools (web/3)",
                args.reservation
            )
        })?,
    };
    let label = provider
        .unit_label(unit)
        .map(|l| format!("{unit} ({l})"))
        .unwrap_or_else(|| unit.to_string());
    // What the provider says of it now: a unit it does not know, one
    // holding a machine, or one it would refuse is refused here, with the
    // reason, before anything is written.
    if !provider
        .unit_exists(unit)
        .await
        .context("cannot check the unit at the provider")?
    {
        bail!("unit {label} is not known to the provider (or not a place of a pool declared now)");
    }
    match provider
        .unit(unit)
        .await
        .context("cannot check the unit at the provider")?
    {
        None => bail!("unit {label} is not known to the provider"),
        Some(u) if u.taken => bail!("unit {label} already has a machine"),
        Some(u) if !u.provisionable => bail!(
            "unit {label} is not provisionable now{}",
            u.scope
                .map(|s| format!(" (no stock of {s})"))
                .unwrap_or_default()
        ),
        Some(_) => {}
    }
    let request = Uuid::new_v4();
    let units = [queue::UnitFacts {
        unit,
        scope: provider.unit_scope(unit),
        place: provider.unit_label(unit),
        hint: None,
    }];
    let mut tx = pool.begin().await?;
    let (admitted, refused) = queue::admit(
        &mut tx,
        &[(unit, request)],
        &queue::Admission {
            manual: true,
            push_jobs: true,
            caused_by: None,
            requested_by: Some(super::cli_user()),
            sinbin_override: args.override_sinbin.clone(),
            units: &units,
        },
    )
    .await?;
    if let Some((_, reason)) = refused.first() {
        tx.rollback().await?;
        bail!("unit {label} not admitted: {reason}");
    }
    tx.commit().await?;
    println!(
        "enqueued create_device for unit {label} (request {})",
        admitted[0].1
    );
    Ok(())
}

async fn assimilate(args: EnqueueAssimilate) -> anyhow::Result<()> {
    let pool = args.db.connect(2).await?;
    let (_, provider) = args.provider.provider(&pool, &args_os()).await?;
    let facts = match provider.machine(&args.device).await {
        Ok(f) => f,
        Err(e) if e.not_found() => {
            bail!("machine {} is not known to the provider ({e})", args.device)
        }
        Err(e) => return Err(e).context("cannot check the machine at the provider"),
    };
    if let Some(foreign) = facts.foreign {
        bail!("machine {} is not shepherd's: {foreign}", args.device);
    }
    if let Some(unproven) = facts.unproven {
        bail!(
            "machine {} cannot be checked: {unproven}; nothing was enqueued",
            args.device
        );
    }
    let mut tx = pool.begin().await?;
    shepherd::events::record(
        &mut tx,
        vec![shepherd::events::NewEvent::new(
            shepherd::events::event::AssimilationRequested {
                device: args.device.clone(),
                requested_by: super::cli_user(),
            },
        )],
    )
    .await?;
    queue::push_assimilate(
        &mut tx,
        &AssimilateArgs {
            device: args.device.clone(),
            reservation: facts.unit,
            manual: true,
            created: None,
            attempt: 1,
        },
        None,
    )
    .await?;
    tx.commit().await?;
    println!("enqueued assimilate for machine {}", args.device);
    Ok(())
}

/// The OS a Metal provider built by a command names; a command creates
/// nothing, so the default does.
fn args_os() -> String {
    std::env::var("SHEPHERD_OS")
        .unwrap_or_else(|_| shepherd::config::ProvisionerConfig::default().os)
}
