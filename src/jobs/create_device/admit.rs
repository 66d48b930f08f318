//! Admission of a creation pushed by hand (SQL or the CLI): the same limit
//! and sinbin a pass obeys, judged under the capacity lock before any API
//! call.

use crate::events::event::*;
use crate::events::{NewEvent, record};
use crate::jobs::queue;
use crate::jobs::{CreateDeviceArgs, JobContext, JobError};

use super::CreateOutcome;

/// A job pushed from SQL passes the capacity check here, before any API call.
pub(super) async fn admit_manual(
    ctx: &JobContext,
    args: &CreateDeviceArgs,
    job_id: &str,
) -> Result<Option<CreateOutcome>, JobError> {
    // An unknown reservation is refused here rather than by the create.
    match ctx.provider.unit_exists(args.reservation).await {
        Ok(true) => {}
        Ok(false) => {
            let reason = format!(
                "reservation {} is not known to the provider",
                args.reservation
            );
            let mut tx = ctx.pool.begin().await?;
            record(
                &mut tx,
                vec![
                    NewEvent::new(CreationRefused {
                        reservation: args.reservation,
                        request: args.request,
                        reason: reason.clone(),
                    })
                    .caused_by(job_id),
                ],
            )
            .await?;
            tx.commit().await?;
            return Ok(Some(CreateOutcome::Refused { reason }));
        }
        // Anything else is for the create to meet and classify.
        Err(_) => {}
    }
    let units = [queue::UnitFacts {
        unit: args.reservation,
        scope: ctx.provider.unit_scope(args.reservation),
        place: ctx.provider.unit_label(args.reservation),
        // A manual creation reads its unit before its create.
        hint: None,
    }];
    let mut tx = ctx.pool.begin().await?;
    let (_, refused) = queue::admit(
        &mut tx,
        &[(args.reservation, args.request)],
        &queue::Admission {
            manual: true,
            push_jobs: false,
            caused_by: Some(job_id),
            requested_by: args.requested_by.clone(),
            sinbin_override: args.sinbin_override.clone(),
            units: &units,
        },
    )
    .await?;
    let outcome = match refused.first() {
        Some((_, reason)) => {
            queue::record_refusal(
                &mut tx,
                args.reservation,
                args.request,
                reason,
                Some(job_id),
            )
            .await?;
            Some(CreateOutcome::Refused {
                reason: reason.to_string(),
            })
        }
        None => None,
    };
    tx.commit().await?;
    Ok(outcome)
}
