//! Managed machines a pass's listing lacked: looked up one by one, and
//! recorded as lost only when the provider has twice said, some time
//! apart, that it does not know them.

use uuid::Uuid;

use crate::jobs::{JobContext, JobError};

use super::*;

/// What the pass made of the managed machines its listing lacked.
pub(super) struct Confirmed {
    /// Still a discrepancy: the machine exists (the listing omitted it), a
    /// first "not found", or a look that failed.
    pub(super) uncertain: Vec<String>,
    /// Recorded as lost: the provider said twice, some time apart, that it
    /// does not know them.
    pub(super) lost: Vec<String>,
}

/// A missing machine as recorded: its id, unit, when it was recorded, the
/// database's now, and the first "not found" since.
pub(super) type MissingRow = (
    Uuid,
    Option<Uuid>,
    chrono::DateTime<chrono::Utc>,
    chrono::DateTime<chrono::Utc>,
    Option<chrono::DateTime<chrono::Utc>>,
);

/// Looks each missing machine up by its id. A machine recorded within the
/// settle window is not missing yet: the listings can lag behind creates.
/// A definite "not found" is recorded (`machine_not_found`); one seen again
/// at least a quarter of the settle window later (and no sooner than a
/// second) confirms it, and the machine is recorded as lost
/// (`machine_lost`, with the evidence), which frees its unit. Anything less
/// certain leaves it a discrepancy, and the pass refuses to work.
pub(super) async fn confirm_missing(
    ctx: &JobContext,
    settings: &crate::cluster::ClusterSettings,
    job_id: &str,
    run: Uuid,
    missing: &[String],
) -> Result<Confirmed, JobError> {
    let mut out = Confirmed {
        uncertain: vec![],
        lost: vec![],
    };
    if missing.is_empty() {
        return Ok(out);
    }
    let settle =
        chrono::TimeDelta::from_std(settings.settle_window).unwrap_or(chrono::TimeDelta::MAX);
    let gap = (settle / 4).max(chrono::TimeDelta::seconds(1));
    for id in missing {
        let row: Option<MissingRow> = sqlx::query_as(
            "select m.machine_id, m.reservation_id, m.assimilated_at, now(),
                        (select min(e.recorded_at) from shepherd.events e
                         where e.stream = 'device/' || m.provider_id
                           and e.event_type = 'machine_not_found'
                           and e.recorded_at >= m.assimilated_at)
                 from shepherd.managed_machines m where m.provider_id = $1",
        )
        .bind(id)
        .fetch_optional(&ctx.pool)
        .await?;
        // Released meanwhile: nothing to confirm.
        let Some((machine_id, unit, recorded_at, now, seen_gone)) = row else {
            continue;
        };
        if now - recorded_at < settle {
            tracing::info!(device = %id, "a machine recorded within the settle window is not listed yet");
            continue;
        }
        match ctx.provider.machine(id).await {
            Ok(_) => {
                tracing::warn!(device = %id, "the listing omitted a machine that exists");
                ctx.provider.listing_omitted(id);
                out.uncertain.push(id.clone());
            }
            Err(e) if e.not_found() => {
                // Measured from the first "not found": passes come every
                // second or so, and the latest one is always recent.
                let event: Event = match seen_gone {
                    Some(first) if now - first >= gap => {
                        tracing::warn!(device = %id, %first, "the provider does not know a managed machine, seen twice: recorded as lost");
                        out.lost.push(id.clone());
                        MachineLost {
                            machine_id,
                            provider: ctx.provider.name().into(),
                            provider_id: id.clone(),
                            reservation: unit,
                            evidence: format!(
                                "not listed, and the provider answered \"not found\" for it at {first} and at {now}"
                            ),
                        }
                        .into()
                    }
                    Some(_) => {
                        // Seen once already; the first one is the evidence.
                        out.uncertain.push(id.clone());
                        continue;
                    }
                    None => {
                        out.uncertain.push(id.clone());
                        MachineNotFound {
                            run,
                            machine_id,
                            provider_id: id.clone(),
                            message: e.to_string(),
                        }
                        .into()
                    }
                };
                note(ctx, job_id, vec![event]).await?;
            }
            Err(e) => {
                tracing::warn!(device = %id, error = %e, "could not look a missing machine up");
                out.uncertain.push(id.clone());
            }
        }
    }
    Ok(out)
}
