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

/// A missing machine as recorded: its id, unit, when it was recorded, and
/// the database's now.
type MissingRow = (
    Uuid,
    Option<Uuid>,
    chrono::DateTime<chrono::Utc>,
    chrono::DateTime<chrono::Utc>,
);

/// Looks each missing machine up by its id. A machine recorded within the
/// settle window is not missing yet: the listings can lag behind creates.
/// A "not found" is judged by the one rule of `jobs::gone`: recorded the
/// first time (`machine_not_found`), and the machine recorded as lost
/// (`machine_lost`, with the evidence, which frees its unit) only when a
/// second comes a gap later with no sighting between. Anything less
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
    for id in missing {
        let row: Option<MissingRow> = sqlx::query_as(
            "select m.machine_id, m.reservation_id, m.assimilated_at, now()
                 from shepherd.managed_machines m where m.provider_id = $1",
        )
        .bind(id)
        .fetch_optional(&ctx.pool)
        .await?;
        // Released meanwhile: nothing to confirm.
        let Some((machine_id, unit, recorded_at, now)) = row else {
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
                let verdict = crate::jobs::gone::not_found(
                    ctx,
                    settings,
                    job_id,
                    run,
                    machine_id,
                    id,
                    &e.to_string(),
                    crate::jobs::gone::Listing::Lacked,
                )
                .await?;
                let crate::jobs::gone::Verdict::Gone { evidence } = verdict else {
                    out.uncertain.push(id.clone());
                    continue;
                };
                tracing::warn!(device = %id, %evidence, "the provider does not know a managed machine, seen twice: recorded as lost");
                out.lost.push(id.clone());
                note(
                    ctx,
                    job_id,
                    vec![
                        MachineLost {
                            machine_id,
                            provider: ctx.provider.name().into(),
                            provider_id: id.clone(),
                            reservation: unit,
                            evidence,
                        }
                        .into(),
                    ],
                )
                .await?;
            }
            Err(e) => {
                tracing::warn!(device = %id, error = %e, "could not look a missing machine up");
                out.uncertain.push(id.clone());
            }
        }
    }
    Ok(out)
}
