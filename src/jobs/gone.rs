//! Gone only on agreement (invariant 15): a managed machine is believed
//! gone, and recorded deleted or lost, only when the provider has said
//! "not found" twice, the second at least a gap after the first with no
//! sighting of the machine between them, and a listing read after the
//! second lacks it too. A lone 404 (a CDN's, a lagging replica's, a
//! gateway's) is one absence: it is recorded (`machine_not_found`) and
//! proves nothing yet. One rule for every path that could record a machine
//! gone: a pass's missing machines (`reconcile/missing.rs`) and a
//! deletion's look or DELETE (`delete_machine`). Times are the database's.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use uuid::Uuid;

use super::{JobContext, JobError};
use crate::cluster::ClusterSettings;
use crate::events::event::MachineNotFound;
use crate::events::{NewEvent, record};

/// A "not found" event `e` of managed machine `m` since it was last seen
/// (listed by a pass, read by a deletion's look): one of the streak that
/// may prove it gone. A machine with one is suspected gone.
pub const NOT_FOUND_SINCE_SEEN: &str = "e.stream = 'device/' || m.provider_id
    and e.event_type = 'machine_not_found'
    and e.body->>'machine_id' = m.machine_id::text
    and e.recorded_at > coalesce(
        (select s.seen_at from shepherd.machine_status s
         where s.provider_id = m.provider_id), '-infinity')";

static STREAK: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "select now(),
                (select min(e.recorded_at) from shepherd.events e
                 where {NOT_FOUND_SINCE_SEEN})
         from shepherd.managed_machines m
         where m.machine_id = $1 and m.provider_id = $2"
    )
});

/// What one more "not found" amounts to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The provider said twice, a gap apart, that it does not know the
    /// machine, and a listing lacks it: it is gone.
    Gone { evidence: String },
    /// Not proven: ask again after `after`. The machine stays.
    NotYet { after: Duration, why: String },
}

/// What the caller knows of a listing read with this "not found".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listing {
    /// A listing the caller read lacked the machine (a pass's).
    Lacked,
    /// The caller read none: one is read here when the two "not found"s
    /// agree, and only then.
    Ask,
}

/// How far apart two "not found"s must be to confirm each other: a quarter
/// of the settle window, and no less than a second.
pub fn gap(settings: &ClusterSettings) -> TimeDelta {
    let settle = TimeDelta::from_std(settings.settle_window).unwrap_or(TimeDelta::MAX);
    (settle / 4).max(TimeDelta::seconds(1))
}

/// Judges one "not found" for managed machine `machine_id` (the provider's
/// `device`), with the ones recorded before it since the machine was last
/// seen (recorded, listed by a pass, or read by a deletion's look). The
/// first of a streak is recorded as `machine_not_found` (`run`: the pass or
/// the deletion's request that saw it).
#[allow(clippy::too_many_arguments)]
pub async fn not_found(
    ctx: &JobContext,
    settings: &ClusterSettings,
    job_id: &str,
    run: Uuid,
    machine_id: Uuid,
    device: &str,
    message: &str,
    listing: Listing,
) -> Result<Verdict, JobError> {
    let gap = gap(settings);
    let (now, first): (DateTime<Utc>, Option<DateTime<Utc>>) =
        sqlx::query_as(sqlx::AssertSqlSafe(STREAK.as_str()))
            .bind(machine_id)
            .bind(device)
            .fetch_optional(&ctx.pool)
            .await?
            .unwrap_or((Utc::now(), None));
    let Some(first) = first else {
        let mut tx = ctx.pool.begin().await?;
        record(
            &mut tx,
            vec![
                NewEvent::new(MachineNotFound {
                    run,
                    machine_id,
                    provider_id: device.to_string(),
                    message: crate::text::bounded(message, 1000),
                })
                .caused_by(job_id),
            ],
        )
        .await?;
        tx.commit().await?;
        return Ok(Verdict::NotYet {
            after: gap.to_std().unwrap_or_default(),
            why: "a first \"not found\": one absence proves nothing yet".into(),
        });
    };
    if now - first < gap {
        return Ok(Verdict::NotYet {
            after: (gap - (now - first)).to_std().unwrap_or_default(),
            why: format!("\"not found\" since {first}, not yet confirmed a gap later"),
        });
    }
    if listing == Listing::Ask {
        match ctx.provider.machines().await {
            Err(e) => {
                return Ok(Verdict::NotYet {
                    after: gap.to_std().unwrap_or_default(),
                    why: format!(
                        "\"not found\" twice, and the listing that would confirm it could not be read: {e}"
                    ),
                });
            }
            Ok(listed) if listed.iter().any(|m| m.id == device) => {
                // Listed: a sighting, which ends the streak of absences.
                seen(ctx, device, None).await?;
                return Ok(Verdict::NotYet {
                    after: gap.to_std().unwrap_or_default(),
                    why: "\"not found\" by id, yet the provider's listing shows it".into(),
                });
            }
            Ok(_) => {}
        }
    }
    Ok(Verdict::Gone {
        evidence: format!(
            "not listed, and the provider answered \"not found\" for it at {first} and at {now}"
        ),
    })
}

/// Notes a sighting of `device` (the provider read it, or listed it): a
/// later "not found" starts a new streak.
pub async fn seen(ctx: &JobContext, device: &str, status: Option<&str>) -> Result<(), JobError> {
    sqlx::query(
        "insert into shepherd.machine_status (provider_id, status, seen_at)
         values ($1, $2, now())
         on conflict (provider_id) do update
             set status = coalesce(excluded.status, shepherd.machine_status.status),
                 seen_at = excluded.seen_at",
    )
    .bind(device)
    .bind(status)
    .execute(&ctx.pool)
    .await?;
    Ok(())
}
