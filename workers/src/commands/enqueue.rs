//! `shepherd enqueue`: manual jobs, validated before anything is written.

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use shepherd::jobs::{AssimilateArgs, ReconcileArgs, queue};
use shepherd::metal::{ClientMetrics, MetalError};
use uuid::Uuid;

use crate::commands::database::DatabaseArgs;
use crate::settings::MetalArgs;

#[derive(Debug, Subcommand)]
pub enum EnqueueCommand {
    /// A reconcile pass, now
    Reconcile(EnqueueReconcile),
    /// A device creation on one reservation (admitted against the cluster's
    /// max_machines, the pause and the sinbin)
    CreateDevice(EnqueueCreate),
    /// Recording one provider device as a managed machine
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
    metal: MetalArgs,
    /// The reservation's id (a UUID)
    #[arg(long)]
    reservation: Uuid,
    /// Create even though the reservation is penalised; the reason is recorded
    #[arg(long, value_name = "REASON")]
    override_sinbin: Option<String>,
}

#[derive(Debug, Args)]
pub struct EnqueueAssimilate {
    #[command(flatten)]
    db: DatabaseArgs,
    #[command(flatten)]
    metal: MetalArgs,
    /// The device's id (a UUID)
    #[arg(long)]
    device: Uuid,
}

pub(crate) fn who() -> String {
    std::env::var("USER").unwrap_or_else(|_| "unknown".into())
}

pub async fn enqueue(command: EnqueueCommand) -> anyhow::Result<()> {
    match command {
        EnqueueCommand::Reconcile(args) => {
            let pool = args.db.prepare(2).await?;
            let mut tx = pool.begin().await?;
            let id = queue::push_reconcile(
                &mut tx,
                &ReconcileArgs {
                    requested_by: format!("cli:{}", who()),
                },
                None,
            )
            .await?;
            tx.commit().await?;
            println!("enqueued reconcile job {}", id.unwrap_or_default());
        }
        EnqueueCommand::CreateDevice(args) => {
            let client = args.metal.client(None, ClientMetrics::default())?;
            let pool = args.db.prepare(2).await?;
            match client.get_reservation(args.reservation, &[]).await {
                Ok(r) if r.device.is_some() => {
                    bail!("reservation {} already has a device", args.reservation)
                }
                Ok(_) => {}
                Err(MetalError::NotFound { .. }) => bail!(
                    "reservation {} is not known to the provider (project {})",
                    args.reservation,
                    client.project_id()
                ),
                Err(e) => return Err(e).context("cannot check the reservation at the provider"),
            }
            if args
                .override_sinbin
                .as_deref()
                .is_some_and(|r| r.trim().is_empty())
            {
                bail!("--override-sinbin needs a reason");
            }
            let request = Uuid::new_v4();
            let mut tx = pool.begin().await?;
            let (admitted, refused) = queue::admit(
                &mut tx,
                &[(args.reservation, request)],
                &queue::Admission {
                    manual: true,
                    push_jobs: true,
                    caused_by: None,
                    requested_by: Some(format!("cli:{}", who())),
                    sinbin_override: args.override_sinbin.clone(),
                    units: &[],
                },
            )
            .await?;
            if let Some((_, reason)) = refused.first() {
                tx.rollback().await?;
                bail!("reservation {} not admitted: {reason}", args.reservation);
            }
            tx.commit().await?;
            println!(
                "enqueued create_device for reservation {} (request {})",
                admitted[0].0, admitted[0].1
            );
        }
        EnqueueCommand::Assimilate(args) => {
            let client = args.metal.client(None, ClientMetrics::default())?;
            let pool = args.db.prepare(2).await?;
            let device = match client.get_device(args.device).await {
                Ok(d) => d,
                Err(MetalError::NotFound { .. }) => {
                    bail!("device {} is not known to the provider", args.device)
                }
                Err(e) => return Err(e).context("cannot check the device at the provider"),
            };
            if let Some(p) = device.project_id()
                && p != client.project_id()
            {
                bail!(
                    "device {} belongs to project {p}, not to {}",
                    args.device,
                    client.project_id()
                );
            }
            let mut tx = pool.begin().await?;
            shepherd::events::record(
                &mut tx,
                vec![shepherd::events::NewEvent::new(
                    shepherd::events::event::AssimilationRequested {
                        device: args.device.to_string(),
                        requested_by: format!("cli:{}", who()),
                    },
                )],
            )
            .await?;
            queue::push_assimilate(
                &mut tx,
                &AssimilateArgs {
                    device: args.device.to_string(),
                    reservation: device.reservation_id(),
                    manual: true,
                    created: None,
                    attempt: 1,
                },
                None,
            )
            .await?;
            tx.commit().await?;
            println!("enqueued assimilate for device {}", args.device);
        }
    }
    Ok(())
}
