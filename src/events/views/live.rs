//! The live path: an append loads the view rows its events touch, folds the
//! events into them with `apply()`, and writes back what changed, in the
//! appending transaction.

use std::collections::BTreeMap;

use sqlx::{PgConnection, Row};

use super::tables::*;
use super::{
    Keys, ManagedMachine, Penalty, PendingCreation, PendingDeletion, UnassimilatedDevice,
    ViewState, apply,
};
use crate::events::stored::{StoreError, StoredEvent};

/// Applies the events to the rows they touch, as an append read them
/// (`rows_read`, under the append's locks), and writes back the changes.
pub(crate) async fn apply_loaded(
    conn: &mut PgConnection,
    keys: &Keys,
    events: &[StoredEvent],
    mut before: ViewState,
) -> Result<(), StoreError> {
    if keys.is_empty() || events.is_empty() {
        return Ok(());
    }
    if keys.controls {
        before.paused = read_pause(&mut *conn).await?;
        before.deletions_paused = read_deletions_pause(&mut *conn).await?;
    }
    if keys.settings {
        before.settings = read_settings(&mut *conn).await?;
    }
    if !keys.pools.is_empty() {
        before.pools = read_pools(&mut *conn, Some(&keys.pools)).await?;
    }
    let mut after = before.clone();
    for e in events {
        apply(&mut after, &e.event, e.recorded_at);
    }
    write_changes(conn, &before, &after).await?;
    Ok(())
}

/// The rows of the five keyed views an append read, each view a JSON array
/// (`shepherd.append_reading`; `shepherd.view_rows` says why one function
/// reads them). Whole rows (`*`): the write-back upserts whole rows, and a
/// column left out of a list here decoded as empty and was written back
/// so (a protected machine lost its readiness: tests/event_log.rs).
pub(crate) fn rows_read(row: &sqlx::postgres::PgRow) -> Result<ViewState, sqlx::Error> {
    fn rows<T: serde::de::DeserializeOwned>(
        row: &sqlx::postgres::PgRow,
        column: &str,
    ) -> Result<Vec<T>, sqlx::Error> {
        let value: serde_json::Value = row.try_get(column)?;
        serde_json::from_value(value).map_err(|e| sqlx::Error::Decode(Box::new(e)))
    }
    let mut state = ViewState::default();
    for m in rows::<ManagedMachine>(row, "machines")? {
        state.machines.insert(m.provider_id.clone(), m);
    }
    for p in rows::<Penalty>(row, "sinbin")? {
        state.sinbin.insert(p.reservation_id, p);
    }
    for p in rows::<PendingCreation>(row, "pending")? {
        state.pending_creations.insert(p.reservation_id, p);
    }
    for d in rows::<UnassimilatedDevice>(row, "unassimilated")? {
        state.unassimilated.insert(d.device_id.clone(), d);
    }
    for d in rows::<PendingDeletion>(row, "deletions")? {
        state.pending_deletions.insert(d.machine_id, d);
    }
    Ok(state)
}

/// Keys present before and gone after, and keys new or changed.
pub(super) fn diff<'a, K: Ord, V: PartialEq>(
    before: &'a BTreeMap<K, V>,
    after: &'a BTreeMap<K, V>,
) -> (Vec<&'a K>, Vec<&'a V>) {
    let removed = before.keys().filter(|k| !after.contains_key(k)).collect();
    let upserted = after
        .iter()
        .filter(|(k, v)| before.get(k) != Some(v))
        .map(|(_, v)| v)
        .collect();
    (removed, upserted)
}

pub(super) async fn write_changes(
    conn: &mut PgConnection,
    before: &ViewState,
    after: &ViewState,
) -> Result<(), sqlx::Error> {
    // A row gone by one key from the pending creations or the unassimilated
    // devices rides with the next upsert of machines or devices (`Deletes`):
    // a creation and an assimilation each move a machine between two views.
    let mut carried = Deletes::default();
    let (pending_gone, pending_changed) = diff(&before.pending_creations, &after.pending_creations);
    carry_or_delete(
        conn,
        &mut carried,
        [
            "delete from shepherd.pending_creations where reservation_id = ",
            "delete from shepherd.pending_creations where reservation_id = $1",
            "delete from shepherd.pending_creations where reservation_id = any($1)",
        ],
        pending_gone.into_iter().copied().collect::<Vec<_>>(),
    )
    .await?;
    let (devices_gone, devices_changed) = diff(&before.unassimilated, &after.unassimilated);
    carry_or_delete(
        conn,
        &mut carried,
        [
            "delete from shepherd.unassimilated_devices where device_id = ",
            "delete from shepherd.unassimilated_devices where device_id = $1",
            "delete from shepherd.unassimilated_devices where device_id = any($1)",
        ],
        devices_gone.into_iter().cloned().collect::<Vec<_>>(),
    )
    .await?;
    if before.paused != after.paused {
        write_pause(conn, after.paused.as_ref()).await?;
    }
    if before.deletions_paused != after.deletions_paused {
        write_control(conn, "deletions", after.deletions_paused.as_ref()).await?;
    }
    let (gone, changed) = diff(&before.pending_deletions, &after.pending_deletions);
    delete_keys(
        conn,
        "delete from shepherd.pending_deletions where machine_id = $1",
        "delete from shepherd.pending_deletions where machine_id = any($1)",
        gone.into_iter().copied().collect::<Vec<_>>(),
    )
    .await?;
    insert_deletions(conn, changed.into_iter()).await?;
    let changed = after
        .settings
        .iter()
        .filter(|(k, v)| before.settings.get(*k) != Some(*v));
    write_settings(conn, changed).await?;
    let (gone, changed) = diff(&before.pools, &after.pools);
    delete_keys(
        conn,
        "delete from shepherd.pools where name = $1",
        "delete from shepherd.pools where name = any($1)",
        gone.into_iter().cloned().collect::<Vec<_>>(),
    )
    .await?;
    insert_pools(conn, changed.into_iter()).await?;
    let (gone, changed) = diff(&before.machines, &after.machines);
    delete_keys(
        conn,
        "delete from shepherd.managed_machines where provider_id = $1",
        "delete from shepherd.managed_machines where provider_id = any($1)",
        gone.into_iter().cloned().collect::<Vec<_>>(),
    )
    .await?;
    insert_machines(conn, changed.into_iter(), &mut carried).await?;

    let (gone, changed) = diff(&before.sinbin, &after.sinbin);
    delete_keys(
        conn,
        "delete from shepherd.sinbin where reservation_id = $1",
        "delete from shepherd.sinbin where reservation_id = any($1)",
        gone.into_iter().copied().collect::<Vec<_>>(),
    )
    .await?;
    insert_penalties(conn, changed.into_iter()).await?;
    insert_pending(conn, pending_changed.into_iter()).await?;
    insert_unassimilated(conn, devices_changed.into_iter(), &mut carried).await?;
    carried.run(conn).await?;
    Ok(())
}

/// One key gone is carried into the next upsert (`carry`, the delete up to
/// its key); more go now (`one` and `many` as for [`delete_keys`]).
async fn carry_or_delete<K>(
    conn: &mut PgConnection,
    carried: &mut Deletes,
    [carry, one, many]: [&'static str; 3],
    mut keys: Vec<K>,
) -> Result<(), sqlx::Error>
where
    K: Into<Key> + for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send,
    Vec<K>: for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send,
{
    if keys.len() == 1 {
        let key = keys.pop().expect("one key");
        carried.push(carry, key.into());
        return Ok(());
    }
    delete_keys(conn, one, many, keys).await
}

/// Deletes the view rows whose key is one of `keys`. One key, as nearly
/// every append has, goes as `= $1`: for `= any($1)` Postgres's custom plan
/// of a short array always looks cheaper than its generic plan, so that
/// statement was planned afresh at every call (issue 31).
async fn delete_keys<K>(
    conn: &mut PgConnection,
    one: &'static str,
    many: &'static str,
    mut keys: Vec<K>,
) -> Result<(), sqlx::Error>
where
    K: for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send,
    Vec<K>: for<'q> sqlx::Encode<'q, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send,
{
    match keys.len() {
        0 => {}
        1 => {
            let key = keys.pop().expect("one key");
            sqlx::query(one).bind(key).execute(&mut *conn).await?;
        }
        _ => {
            sqlx::query(many).bind(keys).execute(&mut *conn).await?;
        }
    }
    Ok(())
}
