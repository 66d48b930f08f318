//! The views built from the log: managed machines, the sinbin, and what is
//! in flight (pending creations, devices not yet assimilated).
//!
//! One pure [`apply`] folds an event into a [`ViewState`]. The live path
//! loads the rows an event touches, applies it, and writes back what
//! changed, in the appending transaction. The rebuild folds the whole log
//! into an empty state. Both use the same function, so they cannot drift.

use std::collections::BTreeMap;

use chrono::{DateTime, SubsecRound, Utc};
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::event::Event;
use super::store::{StoreError, StoredEvent};
pub use crate::config::PenaltyPolicy;

pub const PROVIDER_EQUINIX: &str = "equinix";

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ManagedMachine {
    pub machine_id: Uuid,
    pub provider: String,
    pub provider_id: String,
    pub reservation_id: Option<Uuid>,
    pub hostname: Option<String>,
    pub assimilated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Penalty {
    pub reservation_id: Uuid,
    pub until: DateTime<Utc>,
    pub cause: String,
    pub failures: i32,
}

impl Penalty {
    /// The seed's sinbin: penalised while now <= until.
    pub fn is_active(&self, now: DateTime<Utc>) -> bool {
        now <= self.until
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PendingCreation {
    pub reservation_id: Uuid,
    /// The request that owns it (the witness is derived from it).
    pub request: Option<String>,
    pub enqueued_at: DateTime<Utc>,
    /// Since when its outcome is unknown, if it is.
    pub unresolved_since: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
}

/// One cluster setting as the view holds it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Setting {
    pub value: serde_json::Value,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UnassimilatedDevice {
    pub device_id: Uuid,
    pub reservation_id: Option<Uuid>,
    pub hostname: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// Creations are paused, by whom and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Pause {
    pub by: String,
    pub reason: String,
    pub since: DateTime<Utc>,
}

/// All the views, or the part of them one event touches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ViewState {
    /// `Some` while creations are paused.
    pub paused: Option<Pause>,
    /// By provider id (unique per provider; shepherd has one provider).
    pub machines: BTreeMap<String, ManagedMachine>,
    pub sinbin: BTreeMap<Uuid, Penalty>,
    pub pending_creations: BTreeMap<Uuid, PendingCreation>,
    pub unassimilated: BTreeMap<Uuid, UnassimilatedDevice>,
    pub settings: BTreeMap<String, Setting>,
}

/// Folds one event into the views. `at` is the event's recorded time, so
/// replaying the log gives the same timestamps the live path wrote.
pub fn apply(state: &mut ViewState, event: &Event, at: DateTime<Utc>) {
    match event {
        Event::CreationRequested(e) => {
            state.pending_creations.insert(
                e.reservation,
                PendingCreation {
                    reservation_id: e.reservation,
                    request: Some(e.request.to_string()),
                    enqueued_at: at,
                    unresolved_since: None,
                    last_error: None,
                },
            );
        }
        Event::DeviceCreated(e) => {
            state.pending_creations.remove(&e.reservation);
            // Success resets the growing penalty.
            state.sinbin.remove(&e.reservation);
            if !state.machines.contains_key(&e.device.to_string()) {
                state.unassimilated.insert(
                    e.device,
                    UnassimilatedDevice {
                        device_id: e.device,
                        reservation_id: Some(e.reservation),
                        hostname: Some(e.hostname.clone()),
                        created_at: at,
                    },
                );
            }
        }
        Event::CreationUnresolved(e) => {
            if let Some(p) = state.pending_creations.get_mut(&e.reservation)
                && p.request.as_deref() == Some(e.request.to_string().as_str())
            {
                p.unresolved_since.get_or_insert(at);
                p.last_error = Some(e.message.clone());
            }
        }
        Event::MachineReleased(e) => {
            state.machines.remove(&e.provider_id);
        }
        Event::SettingsChanged(e) => {
            for (key, value) in &e.settings {
                state.settings.insert(
                    key.clone(),
                    Setting {
                        value: value.clone(),
                        updated_at: at,
                    },
                );
            }
        }
        Event::CreationGivenUp(e) => {
            state.pending_creations.remove(&e.reservation);
        }
        Event::RaceLost(e) => {
            state.pending_creations.remove(&e.reservation);
        }
        Event::ReservationPenalised(e) => {
            // The table keeps microseconds; the view must equal it.
            let until = e.until.trunc_subsecs(6);
            let penalty = state
                .sinbin
                .entry(e.reservation)
                .or_insert_with(|| Penalty {
                    reservation_id: e.reservation,
                    until,
                    cause: e.cause.clone(),
                    failures: 0,
                });
            // The seed's sinbin keeps the later deadline.
            penalty.until = penalty.until.max(until);
            penalty.cause = e.cause.clone();
            penalty.failures += 1;
        }
        Event::PenaltyCleared(e) => {
            state.sinbin.remove(&e.reservation);
        }
        Event::MachineAssimilated(e) => {
            if let Ok(device) = e.provider_id.parse::<Uuid>() {
                state.unassimilated.remove(&device);
            }
            if let Some(r) = e.reservation {
                state.pending_creations.remove(&r);
            }
            state
                .machines
                .entry(e.provider_id.clone())
                .or_insert_with(|| ManagedMachine {
                    machine_id: e.machine_id,
                    provider: e.provider.clone(),
                    provider_id: e.provider_id.clone(),
                    reservation_id: e.reservation,
                    hostname: e.hostname.clone(),
                    assimilated_at: at,
                });
        }
        Event::AdoptionRequested(e) => {
            if !state.machines.contains_key(&e.device.to_string()) {
                state
                    .unassimilated
                    .entry(e.device)
                    .or_insert(UnassimilatedDevice {
                        device_id: e.device,
                        reservation_id: e.reservation,
                        hostname: None,
                        created_at: at,
                    });
            }
        }
        Event::AssimilationSkipped(e) => {
            state.unassimilated.remove(&e.device);
        }
        Event::AssimilationRejected(e) => {
            state.unassimilated.remove(&e.device);
        }
        Event::CreationsPaused(e) => {
            state.paused = Some(Pause {
                by: e.by.clone(),
                reason: e.reason.clone(),
                since: at,
            });
        }
        Event::CreationsResumed(_) => state.paused = None,
        Event::ReconcileStarted(_)
        | Event::ReservationsListed(_)
        | Event::DiscrepancyFound(_)
        | Event::ReconcileRefused(_)
        | Event::CreationsEnqueued(_)
        | Event::ReconcileFinished(_)
        | Event::ReconcileCoalesced(_)
        | Event::CreationResumed(_)
        | Event::AssimilationResumed(_)
        | Event::CreationAttemptFailed(_)
        | Event::CreationRefused(_)
        | Event::SshKeyEnsured(_)
        | Event::Unknown { .. } => {}
    }
}

/// The rows a batch of events can touch.
#[derive(Debug, Clone, Default)]
pub(crate) struct Keys {
    reservations: Vec<Uuid>,
    devices: Vec<Uuid>,
    controls: bool,
    settings: bool,
}

impl Keys {
    pub(crate) fn of<'a>(events: impl Iterator<Item = &'a Event>) -> Keys {
        let mut k = Keys::default();
        for event in events {
            match event {
                Event::CreationRequested(e) => k.reservations.push(e.reservation),
                Event::DeviceCreated(e) => {
                    k.reservations.push(e.reservation);
                    k.devices.push(e.device);
                }
                Event::CreationGivenUp(e) => k.reservations.push(e.reservation),
                Event::CreationUnresolved(e) => k.reservations.push(e.reservation),
                Event::MachineReleased(e) => {
                    if let Ok(d) = e.provider_id.parse() {
                        k.devices.push(d);
                    }
                }
                Event::SettingsChanged(_) => k.settings = true,
                Event::RaceLost(e) => k.reservations.push(e.reservation),
                Event::ReservationPenalised(e) => k.reservations.push(e.reservation),
                Event::PenaltyCleared(e) => k.reservations.push(e.reservation),
                Event::MachineAssimilated(e) => {
                    k.reservations.extend(e.reservation);
                    if let Ok(d) = e.provider_id.parse() {
                        k.devices.push(d);
                    }
                }
                Event::AdoptionRequested(e) => k.devices.push(e.device),
                Event::AssimilationSkipped(e) => k.devices.push(e.device),
                Event::AssimilationRejected(e) => k.devices.push(e.device),
                Event::CreationsPaused(_) | Event::CreationsResumed(_) => k.controls = true,
                _ => {}
            }
        }
        k.reservations.sort();
        k.reservations.dedup();
        k.devices.sort();
        k.devices.dedup();
        k
    }

    fn is_empty(&self) -> bool {
        self.reservations.is_empty() && self.devices.is_empty() && !self.controls && !self.settings
    }

    /// Serialises writers per reservation and device, in a fixed order so two
    /// writers cannot deadlock. Transaction-scoped: released at commit.
    pub(crate) async fn lock(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        if self.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = self
            .reservations
            .iter()
            .map(|r| format!("reservation/{r}"))
            .chain(self.devices.iter().map(|d| format!("device/{d}")))
            .chain(self.controls.then(|| "operator/controls".to_string()))
            .chain(self.settings.then(|| "operator/settings".to_string()))
            .collect();
        sqlx::query(
            "select pg_advisory_xact_lock(hashtextextended(k, 0))
             from (select unnest($1::text[]) as k order by 1) keys",
        )
        .bind(&names)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}

/// Loads the touched rows, applies the events, writes back the changes.
pub(crate) async fn apply_live(
    conn: &mut PgConnection,
    keys: &Keys,
    events: &[StoredEvent],
) -> Result<(), StoreError> {
    if keys.is_empty() || events.is_empty() {
        return Ok(());
    }
    let device_ids: Vec<String> = keys.devices.iter().map(Uuid::to_string).collect();
    let before = load(
        conn,
        &keys.reservations,
        &keys.devices,
        &device_ids,
        keys.controls,
        keys.settings,
    )
    .await?;
    let mut after = before.clone();
    for e in events {
        apply(&mut after, &e.event, e.recorded_at);
    }
    write_changes(conn, &before, &after).await?;
    Ok(())
}

async fn load(
    conn: &mut PgConnection,
    reservations: &[Uuid],
    devices: &[Uuid],
    device_ids: &[String],
    controls: bool,
    settings: bool,
) -> Result<ViewState, sqlx::Error> {
    let mut state = ViewState::default();
    if controls {
        state.paused = read_pause(&mut *conn).await?;
    }
    if settings {
        state.settings = read_settings(&mut *conn).await?;
    }
    // A machine can be keyed by its device, or found through its reservation.
    // Two branches, not an OR: each uses its own index whatever the
    // statistics say (an OR was planned as a scan of every machine).
    for row in sqlx::query(
        "select machine_id, provider, provider_id, reservation_id, hostname, assimilated_at
         from shepherd.managed_machines
         where provider = $1 and provider_id = any($2)
         union
         select machine_id, provider, provider_id, reservation_id, hostname, assimilated_at
         from shepherd.managed_machines
         where reservation_id = any($3) and provider = $1",
    )
    .bind(PROVIDER_EQUINIX)
    .bind(device_ids)
    .bind(reservations)
    .fetch_all(&mut *conn)
    .await?
    {
        let m = machine_from_row(&row);
        state.machines.insert(m.provider_id.clone(), m);
    }
    for row in sqlx::query(
        "select reservation_id, until, cause, failures from shepherd.sinbin
         where reservation_id = any($1)",
    )
    .bind(reservations)
    .fetch_all(&mut *conn)
    .await?
    {
        let p = penalty_from_row(&row);
        state.sinbin.insert(p.reservation_id, p);
    }
    for row in sqlx::query(
        "select reservation_id, request, enqueued_at, unresolved_since, last_error
         from shepherd.pending_creations where reservation_id = any($1)",
    )
    .bind(reservations)
    .fetch_all(&mut *conn)
    .await?
    {
        let p = pending_from_row(&row);
        state.pending_creations.insert(p.reservation_id, p);
    }
    for row in sqlx::query(
        "select device_id, reservation_id, hostname, created_at from shepherd.unassimilated_devices
         where device_id = any($1)",
    )
    .bind(devices)
    .fetch_all(&mut *conn)
    .await?
    {
        let d = unassimilated_from_row(&row);
        state.unassimilated.insert(d.device_id, d);
    }
    Ok(state)
}

/// Keys present before and gone after, and keys new or changed.
fn diff<'a, K: Ord, V: PartialEq>(
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

async fn write_pause(conn: &mut PgConnection, pause: Option<&Pause>) -> Result<(), sqlx::Error> {
    match pause {
        Some(p) => {
            sqlx::query(
                "insert into shepherd.controls (name, paused, by, reason, since)
                 values ('creations', true, $1, $2, $3)
                 on conflict (name) do update set paused = true, by = excluded.by,
                   reason = excluded.reason, since = excluded.since",
            )
            .bind(&p.by)
            .bind(&p.reason)
            .bind(p.since)
            .execute(&mut *conn)
            .await?;
        }
        None => {
            sqlx::query("delete from shepherd.controls where name = 'creations'")
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(())
}

async fn read_settings(conn: &mut PgConnection) -> Result<BTreeMap<String, Setting>, sqlx::Error> {
    let rows: Vec<(String, serde_json::Value, DateTime<Utc>)> =
        sqlx::query_as("select key, value, updated_at from shepherd.cluster_settings")
            .fetch_all(&mut *conn)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(key, value, updated_at)| (key, Setting { value, updated_at }))
        .collect())
}

async fn write_settings<'a>(
    conn: &mut PgConnection,
    rows: impl Iterator<Item = (&'a String, &'a Setting)>,
) -> Result<(), sqlx::Error> {
    for (key, s) in rows {
        sqlx::query(
            "insert into shepherd.cluster_settings (key, value, updated_at) values ($1, $2, $3)
             on conflict (key) do update set value = excluded.value, updated_at = excluded.updated_at",
        )
        .bind(key)
        .bind(&s.value)
        .bind(s.updated_at)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Whether creations are paused, and by whom.
pub async fn read_pause(conn: &mut PgConnection) -> Result<Option<Pause>, sqlx::Error> {
    let row: Option<(String, String, DateTime<Utc>)> = sqlx::query_as(
        "select by, reason, since from shepherd.controls where name = 'creations' and paused",
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|(by, reason, since)| Pause { by, reason, since }))
}

async fn write_changes(
    conn: &mut PgConnection,
    before: &ViewState,
    after: &ViewState,
) -> Result<(), sqlx::Error> {
    if before.paused != after.paused {
        write_pause(conn, after.paused.as_ref()).await?;
    }
    let changed = after
        .settings
        .iter()
        .filter(|(k, v)| before.settings.get(*k) != Some(*v));
    write_settings(conn, changed).await?;
    let (gone, changed) = diff(&before.machines, &after.machines);
    if !gone.is_empty() {
        sqlx::query(
            "delete from shepherd.managed_machines where provider = $1 and provider_id = any($2)",
        )
        .bind(PROVIDER_EQUINIX)
        .bind(gone.into_iter().cloned().collect::<Vec<_>>())
        .execute(&mut *conn)
        .await?;
    }
    insert_machines(conn, changed.into_iter()).await?;

    let (gone, changed) = diff(&before.sinbin, &after.sinbin);
    if !gone.is_empty() {
        sqlx::query("delete from shepherd.sinbin where reservation_id = any($1)")
            .bind(gone.into_iter().copied().collect::<Vec<_>>())
            .execute(&mut *conn)
            .await?;
    }
    insert_penalties(conn, changed.into_iter()).await?;

    let (gone, changed) = diff(&before.pending_creations, &after.pending_creations);
    if !gone.is_empty() {
        sqlx::query("delete from shepherd.pending_creations where reservation_id = any($1)")
            .bind(gone.into_iter().copied().collect::<Vec<_>>())
            .execute(&mut *conn)
            .await?;
    }
    insert_pending(conn, changed.into_iter()).await?;

    let (gone, changed) = diff(&before.unassimilated, &after.unassimilated);
    if !gone.is_empty() {
        sqlx::query("delete from shepherd.unassimilated_devices where device_id = any($1)")
            .bind(gone.into_iter().copied().collect::<Vec<_>>())
            .execute(&mut *conn)
            .await?;
    }
    insert_unassimilated(conn, changed.into_iter()).await?;
    Ok(())
}

// The inserts below upsert by primary key and serve both the live path and
// the bulk load of a rebuild (one statement per table, arrays unnested).

async fn insert_machines<'a>(
    conn: &mut PgConnection,
    rows: impl Iterator<Item = &'a ManagedMachine>,
) -> Result<(), sqlx::Error> {
    let rows: Vec<_> = rows.collect();
    if rows.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "insert into shepherd.managed_machines (machine_id, provider, provider_id, reservation_id, hostname, assimilated_at)
         select * from unnest($1::uuid[], $2::text[], $3::text[], $4::uuid[], $5::text[], $6::timestamptz[])
         on conflict (machine_id) do update set provider = excluded.provider,
           provider_id = excluded.provider_id, reservation_id = excluded.reservation_id,
           hostname = excluded.hostname, assimilated_at = excluded.assimilated_at",
    )
    .bind(rows.iter().map(|m| m.machine_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|m| m.provider.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|m| m.provider_id.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|m| m.reservation_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|m| m.hostname.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|m| m.assimilated_at).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn insert_penalties<'a>(
    conn: &mut PgConnection,
    rows: impl Iterator<Item = &'a Penalty>,
) -> Result<(), sqlx::Error> {
    let rows: Vec<_> = rows.collect();
    if rows.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "insert into shepherd.sinbin (reservation_id, until, cause, failures)
         select * from unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::int[])
         on conflict (reservation_id) do update set until = excluded.until,
           cause = excluded.cause, failures = excluded.failures",
    )
    .bind(rows.iter().map(|p| p.reservation_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|p| p.until).collect::<Vec<_>>())
    .bind(rows.iter().map(|p| p.cause.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|p| p.failures).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn insert_pending<'a>(
    conn: &mut PgConnection,
    rows: impl Iterator<Item = &'a PendingCreation>,
) -> Result<(), sqlx::Error> {
    let rows: Vec<_> = rows.collect();
    if rows.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "insert into shepherd.pending_creations
           (reservation_id, request, enqueued_at, unresolved_since, last_error)
         select * from unnest($1::uuid[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::text[])
         on conflict (reservation_id) do update set request = excluded.request,
           enqueued_at = excluded.enqueued_at, unresolved_since = excluded.unresolved_since,
           last_error = excluded.last_error",
    )
    .bind(rows.iter().map(|p| p.reservation_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|p| p.request.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|p| p.enqueued_at).collect::<Vec<_>>())
    .bind(rows.iter().map(|p| p.unresolved_since).collect::<Vec<_>>())
    .bind(rows.iter().map(|p| p.last_error.clone()).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn insert_unassimilated<'a>(
    conn: &mut PgConnection,
    rows: impl Iterator<Item = &'a UnassimilatedDevice>,
) -> Result<(), sqlx::Error> {
    let rows: Vec<_> = rows.collect();
    if rows.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "insert into shepherd.unassimilated_devices (device_id, reservation_id, hostname, created_at)
         select * from unnest($1::uuid[], $2::uuid[], $3::text[], $4::timestamptz[])
         on conflict (device_id) do update set reservation_id = excluded.reservation_id,
           hostname = excluded.hostname, created_at = excluded.created_at",
    )
    .bind(rows.iter().map(|d| d.device_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|d| d.reservation_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|d| d.hostname.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|d| d.created_at).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

fn machine_from_row(row: &sqlx::postgres::PgRow) -> ManagedMachine {
    ManagedMachine {
        machine_id: row.get("machine_id"),
        provider: row.get("provider"),
        provider_id: row.get("provider_id"),
        reservation_id: row.get("reservation_id"),
        hostname: row.get("hostname"),
        assimilated_at: row.get("assimilated_at"),
    }
}

fn penalty_from_row(row: &sqlx::postgres::PgRow) -> Penalty {
    Penalty {
        reservation_id: row.get("reservation_id"),
        until: row.get("until"),
        cause: row.get("cause"),
        failures: row.get("failures"),
    }
}

fn pending_from_row(row: &sqlx::postgres::PgRow) -> PendingCreation {
    PendingCreation {
        reservation_id: row.get("reservation_id"),
        request: row.get("request"),
        enqueued_at: row.get("enqueued_at"),
        unresolved_since: row.get("unresolved_since"),
        last_error: row.get("last_error"),
    }
}

fn unassimilated_from_row(row: &sqlx::postgres::PgRow) -> UnassimilatedDevice {
    UnassimilatedDevice {
        device_id: row.get("device_id"),
        reservation_id: row.get("reservation_id"),
        hostname: row.get("hostname"),
        created_at: row.get("created_at"),
    }
}

/// Reads all four live views.
pub async fn read_live(conn: &mut PgConnection) -> Result<ViewState, sqlx::Error> {
    read_tables(conn).await
}

async fn read_tables(conn: &mut PgConnection) -> Result<ViewState, sqlx::Error> {
    let mut state = ViewState {
        paused: read_pause(&mut *conn).await?,
        settings: read_settings(&mut *conn).await?,
        ..ViewState::default()
    };
    for row in sqlx::query("select * from shepherd.managed_machines")
        .fetch_all(&mut *conn)
        .await?
    {
        let m = machine_from_row(&row);
        state.machines.insert(m.provider_id.clone(), m);
    }
    for row in sqlx::query("select * from shepherd.sinbin")
        .fetch_all(&mut *conn)
        .await?
    {
        let p = penalty_from_row(&row);
        state.sinbin.insert(p.reservation_id, p);
    }
    for row in sqlx::query("select * from shepherd.pending_creations")
        .fetch_all(&mut *conn)
        .await?
    {
        let p = pending_from_row(&row);
        state.pending_creations.insert(p.reservation_id, p);
    }
    for row in sqlx::query("select * from shepherd.unassimilated_devices")
        .fetch_all(&mut *conn)
        .await?
    {
        let d = unassimilated_from_row(&row);
        state.unassimilated.insert(d.device_id, d);
    }
    Ok(state)
}

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

fn describe_diff<K: Ord + std::fmt::Debug, V: PartialEq + std::fmt::Debug>(
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
    if replace {
        let mut tx = pool.begin().await?;
        sqlx::query(
            "lock table shepherd.managed_machines, shepherd.sinbin, shepherd.pending_creations,
             shepherd.unassimilated_devices, shepherd.controls, shepherd.cluster_settings
             in exclusive mode",
        )
        .execute(&mut *tx)
        .await?;
        // Fold again under the lock: events committed since the check are in.
        let (rebuilt, _) = fold_log(&mut tx).await?;
        sqlx::raw_sql(
            "delete from shepherd.managed_machines; delete from shepherd.sinbin;
             delete from shepherd.pending_creations; delete from shepherd.unassimilated_devices;
             delete from shepherd.cluster_settings",
        )
        .execute(&mut *tx)
        .await?;
        write_pause(&mut tx, rebuilt.paused.as_ref()).await?;
        write_settings(&mut tx, rebuilt.settings.iter()).await?;
        insert_machines(&mut tx, rebuilt.machines.values()).await?;
        insert_penalties(&mut tx, rebuilt.sinbin.values()).await?;
        insert_pending(&mut tx, rebuilt.pending_creations.values()).await?;
        insert_unassimilated(&mut tx, rebuilt.unassimilated.values()).await?;
        tx.commit().await?;
        report.replaced = true;
    }
    Ok(report)
}

/// The sinbin row of a reservation, penalised or not.
pub async fn penalty(
    conn: &mut PgConnection,
    reservation: Uuid,
) -> Result<Option<Penalty>, sqlx::Error> {
    let row = sqlx::query(
        "select reservation_id, until, cause, failures from shepherd.sinbin where reservation_id = $1",
    )
    .bind(reservation)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.as_ref().map(penalty_from_row))
}

/// Whether a reservation is penalised now (by the database's clock, which
/// every process shares).
pub async fn is_penalised(conn: &mut PgConnection, reservation: Uuid) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "select exists(select 1 from shepherd.sinbin where reservation_id = $1 and now() <= until)",
    )
    .bind(reservation)
    .fetch_one(&mut *conn)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_default_penalty_is_the_seeds_hour() {
        let p = PenaltyPolicy::default();
        assert_eq!(p.duration(0), Duration::from_secs(3600));
        assert_eq!(p.duration(5), Duration::from_secs(3600));
    }

    #[test]
    fn a_growing_penalty_grows_and_stops_at_its_maximum() {
        let p = PenaltyPolicy {
            initial: Duration::from_secs(60),
            factor: 2.0,
            max: Duration::from_secs(600),
        };
        assert_eq!(p.duration(0), Duration::from_secs(60));
        assert_eq!(p.duration(1), Duration::from_secs(120));
        assert_eq!(p.duration(3), Duration::from_secs(480));
        assert_eq!(p.duration(4), Duration::from_secs(600));
        assert_eq!(p.duration(40), Duration::from_secs(600));
    }
}
