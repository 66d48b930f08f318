//! The rebuild: fold the whole log into a fresh state, compare it with the
//! live tables in one snapshot, and optionally replace them.

use std::collections::BTreeMap;

use sqlx::{PgConnection, PgPool, Row};

use super::tables::*;
use super::{ViewState, apply};
use crate::events::event::Event;
use crate::events::stored::StoreError;

/// Folds the whole log, in position order, into a fresh state.
pub async fn fold_log(conn: &mut PgConnection) -> Result<(ViewState, u64), StoreError> {
    use futures::TryStreamExt;
    let mut state = ViewState::default();
    let mut count = 0u64;
    let mut rows = sqlx::query(
        "select position, event_type, schema_version, body, recorded_at
         from shepherd.events order by position",
    )
    .fetch(&mut *conn);
    while let Some(row) = rows.try_next().await? {
        let position: i64 = row.get("position");
        let event_type: String = row.get("event_type");
        let version: i32 = row.get("schema_version");
        let event = Event::decode(&event_type, version, row.get("body")).map_err(|source| {
            StoreError::Corrupt {
                position,
                event_type: event_type.clone(),
                version,
                source,
            }
        })?;
        apply(&mut state, &event, row.get("recorded_at"));
        count += 1;
    }
    Ok((state, count))
}

/// How the rebuilt views differ from the live ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RebuildReport {
    pub events: u64,
    pub machines: usize,
    pub penalties: usize,
    pub pending_creations: usize,
    pub unassimilated_devices: usize,
    /// One line per differing row; empty when rebuilt == live.
    pub differences: Vec<String>,
    pub replaced: bool,
}

pub(super) fn describe_diff<K: Ord + std::fmt::Debug, V: PartialEq + std::fmt::Debug>(
    table: &str,
    live: &BTreeMap<K, V>,
    rebuilt: &BTreeMap<K, V>,
    out: &mut Vec<String>,
) {
    for (k, v) in live {
        match rebuilt.get(k) {
            None => out.push(format!("{table} {k:?}: live only: {v:?}")),
            Some(r) if r != v => out.push(format!("{table} {k:?}: live {v:?}, rebuilt {r:?}")),
            _ => {}
        }
    }
    for (k, v) in rebuilt {
        if !live.contains_key(k) {
            out.push(format!("{table} {k:?}: rebuilt only: {v:?}"));
        }
    }
}

pub fn differences(live: &ViewState, rebuilt: &ViewState) -> Vec<String> {
    let mut out = Vec::new();
    describe_diff(
        "cluster_settings",
        &live.settings,
        &rebuilt.settings,
        &mut out,
    );
    if live.paused != rebuilt.paused {
        out.push(format!(
            "controls: live {:?}, rebuilt {:?}",
            live.paused, rebuilt.paused
        ));
    }
    if live.deletions_paused != rebuilt.deletions_paused {
        out.push(format!(
            "controls (deletions): live {:?}, rebuilt {:?}",
            live.deletions_paused, rebuilt.deletions_paused
        ));
    }
    describe_diff(
        "pending_deletions",
        &live.pending_deletions,
        &rebuilt.pending_deletions,
        &mut out,
    );
    describe_diff("pools", &live.pools, &rebuilt.pools, &mut out);
    describe_diff(
        "managed_machines",
        &live.machines,
        &rebuilt.machines,
        &mut out,
    );
    describe_diff("sinbin", &live.sinbin, &rebuilt.sinbin, &mut out);
    describe_diff(
        "pending_creations",
        &live.pending_creations,
        &rebuilt.pending_creations,
        &mut out,
    );
    describe_diff(
        "unassimilated_devices",
        &live.unassimilated,
        &rebuilt.unassimilated,
        &mut out,
    );
    out
}

/// Replays the log and compares with the live views in one REPEATABLE READ
/// snapshot (under READ COMMITTED a check taken while writers run sees
/// events and views from different moments and reports false differences).
/// With `replace`, the live views are then overwritten with the rebuilt ones
/// under an exclusive lock, so no writer applies an event in between.
pub async fn rebuild(pool: &PgPool, replace: bool) -> Result<RebuildReport, StoreError> {
    rebuild_by(pool, replace.then_some("library call")).await
}

/// [`rebuild`]; with `replace_by`, the live views are replaced and the
/// replacement is recorded (`views_replaced`, with who) in the same
/// transaction.
pub async fn rebuild_by(
    pool: &PgPool,
    replace_by: Option<&str>,
) -> Result<RebuildReport, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("set transaction isolation level repeatable read read only")
        .execute(&mut *tx)
        .await?;
    let (rebuilt, events) = fold_log(&mut tx).await?;
    let live = read_live(&mut tx).await?;
    tx.commit().await?;
    let mut report = RebuildReport {
        events,
        machines: rebuilt.machines.len(),
        penalties: rebuilt.sinbin.len(),
        pending_creations: rebuilt.pending_creations.len(),
        unassimilated_devices: rebuilt.unassimilated.len(),
        differences: differences(&live, &rebuilt),
        replaced: false,
    };
    if let Some(by) = replace_by {
        let mut tx = pool.begin().await?;
        sqlx::query(
            "lock table shepherd.managed_machines, shepherd.sinbin, shepherd.pending_creations,
             shepherd.unassimilated_devices, shepherd.controls, shepherd.cluster_settings,
             shepherd.pools, shepherd.pending_deletions in exclusive mode",
        )
        .execute(&mut *tx)
        .await?;
        // Fold again under the lock: events committed since the check are in.
        let (rebuilt, _) = fold_log(&mut tx).await?;
        sqlx::raw_sql(
            "delete from shepherd.managed_machines; delete from shepherd.sinbin;
             delete from shepherd.pending_creations; delete from shepherd.unassimilated_devices;
             delete from shepherd.cluster_settings; delete from shepherd.pools;
             delete from shepherd.pending_deletions",
        )
        .execute(&mut *tx)
        .await?;
        write_pause(&mut tx, rebuilt.paused.as_ref()).await?;
        write_control(&mut tx, "deletions", rebuilt.deletions_paused.as_ref()).await?;
        insert_deletions(&mut tx, rebuilt.pending_deletions.values()).await?;
        write_settings(&mut tx, rebuilt.settings.iter()).await?;
        insert_pools(&mut tx, rebuilt.pools.values()).await?;
        insert_machines(&mut tx, rebuilt.machines.values(), &mut Deletes::default()).await?;
        insert_penalties(&mut tx, rebuilt.sinbin.values()).await?;
        insert_pending(&mut tx, rebuilt.pending_creations.values()).await?;
        insert_unassimilated(
            &mut tx,
            rebuilt.unassimilated.values(),
            &mut Deletes::default(),
        )
        .await?;
        crate::events::store::append(
            &mut tx,
            vec![crate::events::NewEvent::new(
                crate::events::event::ViewsReplaced {
                    by: by.to_string(),
                    differences: report.differences.len() as u64,
                },
            )],
        )
        .await?;
        tx.commit().await?;
        report.replaced = true;
    }
    Ok(report)
}
