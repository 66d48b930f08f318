//! The view tables' SQL: reading rows, upserting them (for the live path
//! and the bulk load of a rebuild alike), and the small reads other modules
//! need (the pause, a reservation's penalty).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::*;

/// Writes the pause of `control` (`creations` or `deletions`).
pub(super) async fn write_control(
    conn: &mut PgConnection,
    control: &str,
    pause: Option<&Pause>,
) -> Result<(), sqlx::Error> {
    match pause {
        Some(p) => {
            sqlx::query(
                "insert into shepherd.controls (name, paused, by, reason, since)
                 values ($1, true, $2, $3, $4)
                 on conflict (name) do update set paused = true, by = excluded.by,
                   reason = excluded.reason, since = excluded.since",
            )
            .bind(control)
            .bind(&p.by)
            .bind(&p.reason)
            .bind(p.since)
            .execute(&mut *conn)
            .await?;
        }
        None => {
            sqlx::query("delete from shepherd.controls where name = $1")
                .bind(control)
                .execute(&mut *conn)
                .await?;
        }
    }
    Ok(())
}

pub(super) async fn write_pause(
    conn: &mut PgConnection,
    pause: Option<&Pause>,
) -> Result<(), sqlx::Error> {
    write_control(conn, "creations", pause).await
}

/// Whether deletions are paused, and by whom.
pub async fn read_deletions_pause(conn: &mut PgConnection) -> Result<Option<Pause>, sqlx::Error> {
    read_control(conn, "deletions").await
}

async fn read_control(
    conn: &mut PgConnection,
    control: &str,
) -> Result<Option<Pause>, sqlx::Error> {
    let row: Option<(String, String, DateTime<Utc>)> = sqlx::query_as(
        "select by, reason, since from shepherd.controls where name = $1 and paused",
    )
    .bind(control)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|(by, reason, since)| Pause { by, reason, since }))
}

pub(super) async fn read_settings(
    conn: &mut PgConnection,
) -> Result<BTreeMap<String, Setting>, sqlx::Error> {
    let rows: Vec<(String, serde_json::Value, DateTime<Utc>)> =
        sqlx::query_as("select key, value, updated_at from shepherd.cluster_settings")
            .fetch_all(&mut *conn)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(key, value, updated_at)| (key, Setting { value, updated_at }))
        .collect())
}

pub(super) async fn write_settings<'a>(
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

/// The pools (all of them, or those named), by name.
pub async fn read_pools(
    conn: &mut PgConnection,
    names: Option<&[String]>,
) -> Result<BTreeMap<String, PoolRow>, sqlx::Error> {
    let rows = sqlx::query(
        "select name, plan, site, count, operating_system, ssh_keys, places_ever, removed,
                updated_at, updated_by, reason
         from shepherd.pools where $1::text[] is null or name = any($1)",
    )
    .bind(names)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .iter()
        .map(|row| {
            let p = PoolRow {
                name: row.get("name"),
                plan: row.get("plan"),
                site: row.get("site"),
                count: row.get::<i32, _>("count").max(0) as u32,
                operating_system: row.get("operating_system"),
                ssh_keys: row.get("ssh_keys"),
                places_ever: row.get::<i32, _>("places_ever").max(0) as u32,
                removed: row.get("removed"),
                updated_at: row.get("updated_at"),
                updated_by: row.get("updated_by"),
                reason: row.get("reason"),
            };
            (p.name.clone(), p)
        })
        .collect())
}

pub(super) async fn insert_pools<'a>(
    conn: &mut PgConnection,
    rows: impl Iterator<Item = &'a PoolRow>,
) -> Result<(), sqlx::Error> {
    for p in rows {
        sqlx::query(
            "insert into shepherd.pools (name, plan, site, count, operating_system, ssh_keys,
                                         places_ever, removed, updated_at, updated_by, reason)
             values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
             on conflict (name) do update set plan = excluded.plan, site = excluded.site,
               count = excluded.count, operating_system = excluded.operating_system,
               ssh_keys = excluded.ssh_keys, places_ever = excluded.places_ever,
               removed = excluded.removed, updated_at = excluded.updated_at,
               updated_by = excluded.updated_by, reason = excluded.reason",
        )
        .bind(&p.name)
        .bind(&p.plan)
        .bind(&p.site)
        .bind(p.count as i32)
        .bind(&p.operating_system)
        .bind(&p.ssh_keys)
        .bind(p.places_ever as i32)
        .bind(p.removed)
        .bind(p.updated_at)
        .bind(&p.updated_by)
        .bind(&p.reason)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Whether creations are paused, and by whom.
pub async fn read_pause(conn: &mut PgConnection) -> Result<Option<Pause>, sqlx::Error> {
    read_control(conn, "creations").await
}

// The inserts below upsert by primary key and serve both the live path and
// the bulk load of a rebuild (one statement per table, arrays unnested).

/// A view row to delete, by its one key.
pub(super) enum Key {
    Uuid(Uuid),
    Text(String),
}

impl From<Uuid> for Key {
    fn from(key: Uuid) -> Key {
        Key::Uuid(key)
    }
}

impl From<String> for Key {
    fn from(key: String) -> Key {
        Key::Text(key)
    }
}

/// Deletes of view rows by one key each, carried into the statement of the
/// next upsert as its common table expressions: an append that moves a
/// machine from one view to another (a creation's `device_created`, an
/// assimilation) writes both in one round trip (issue 31). The view tables
/// have no triggers and no keys between them, so the order of their writes
/// within one statement does not matter.
#[derive(Default)]
pub(super) struct Deletes {
    parts: Vec<(&'static str, Key)>,
}

impl Deletes {
    /// `delete` is the statement up to its key's placeholder, e.g.
    /// `delete from shepherd.pending_creations where reservation_id = `.
    pub(super) fn push(&mut self, delete: &'static str, key: Key) {
        self.parts.push((delete, key));
    }

    /// The `with` clause, numbering its keys from `$first`.
    fn prefix(&self, first: usize) -> String {
        if self.parts.is_empty() {
            return String::new();
        }
        let ctes: Vec<String> = self
            .parts
            .iter()
            .enumerate()
            .map(|(i, (delete, _))| format!("gone_{i} as ({delete}${})", first + i))
            .collect();
        format!("with {} ", ctes.join(", "))
    }

    fn bind<'q>(
        self,
        mut query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        for (_, key) in self.parts {
            query = match key {
                Key::Uuid(u) => query.bind(u),
                Key::Text(t) => query.bind(t),
            };
        }
        query
    }

    /// Runs what no upsert took, in one statement.
    pub(super) async fn run(self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        if self.parts.is_empty() {
            return Ok(());
        }
        let sql = format!("{}select 1", self.prefix(1));
        self.bind(sqlx::query(sqlx::AssertSqlSafe(sql)))
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

/// Upserts managed machines, with the `carried` deletes in front when
/// there is a row to write.
pub(super) async fn insert_machines<'a>(
    conn: &mut PgConnection,
    rows: impl Iterator<Item = &'a ManagedMachine>,
    carried: &mut Deletes,
) -> Result<(), sqlx::Error> {
    let rows: Vec<_> = rows.collect();
    if rows.is_empty() {
        return Ok(());
    }
    let carried = std::mem::take(carried);
    let sql = format!(
        "{}insert into shepherd.managed_machines (machine_id, provider, provider_id, reservation_id, hostname, assimilated_at, protected, ready_at)
         select * from unnest($1::uuid[], $2::text[], $3::text[], $4::uuid[], $5::text[], $6::timestamptz[], $7::bool[], $8::timestamptz[])
         on conflict (machine_id) do update set provider = excluded.provider,
           provider_id = excluded.provider_id, reservation_id = excluded.reservation_id,
           hostname = excluded.hostname, assimilated_at = excluded.assimilated_at,
           protected = excluded.protected, ready_at = excluded.ready_at",
        carried.prefix(9)
    );
    let query = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(rows.iter().map(|m| m.machine_id).collect::<Vec<_>>())
        .bind(rows.iter().map(|m| m.provider.clone()).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|m| m.provider_id.clone())
                .collect::<Vec<_>>(),
        )
        .bind(rows.iter().map(|m| m.reservation_id).collect::<Vec<_>>())
        .bind(rows.iter().map(|m| m.hostname.clone()).collect::<Vec<_>>())
        .bind(rows.iter().map(|m| m.assimilated_at).collect::<Vec<_>>())
        .bind(rows.iter().map(|m| m.protected).collect::<Vec<_>>())
        .bind(rows.iter().map(|m| m.ready_at).collect::<Vec<_>>());
    carried.bind(query).execute(&mut *conn).await?;
    Ok(())
}

pub(super) async fn insert_penalties<'a>(
    conn: &mut PgConnection,
    rows: impl Iterator<Item = &'a Penalty>,
) -> Result<(), sqlx::Error> {
    let rows: Vec<_> = rows.collect();
    if rows.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "insert into shepherd.sinbin (reservation_id, until, cause, failures, scope)
         select * from unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::int[], $5::text[])
         on conflict (reservation_id) do update set until = excluded.until,
           cause = excluded.cause, failures = excluded.failures, scope = excluded.scope",
    )
    .bind(rows.iter().map(|p| p.reservation_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|p| p.until).collect::<Vec<_>>())
    .bind(rows.iter().map(|p| p.cause.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|p| p.failures).collect::<Vec<_>>())
    .bind(rows.iter().map(|p| p.scope.clone()).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

pub(super) async fn insert_pending<'a>(
    conn: &mut PgConnection,
    rows: impl Iterator<Item = &'a PendingCreation>,
) -> Result<(), sqlx::Error> {
    let rows: Vec<_> = rows.collect();
    if rows.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "insert into shepherd.pending_creations
           (reservation_id, request, enqueued_at, unresolved_since, last_error, place)
         select * from unnest($1::uuid[], $2::text[], $3::timestamptz[], $4::timestamptz[], $5::text[], $6::text[])
         on conflict (reservation_id) do update set request = excluded.request,
           enqueued_at = excluded.enqueued_at, unresolved_since = excluded.unresolved_since,
           last_error = excluded.last_error, place = excluded.place",
    )
    .bind(rows.iter().map(|p| p.reservation_id).collect::<Vec<_>>())
    .bind(rows.iter().map(|p| p.request.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|p| p.enqueued_at).collect::<Vec<_>>())
    .bind(rows.iter().map(|p| p.unresolved_since).collect::<Vec<_>>())
    .bind(rows.iter().map(|p| p.last_error.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|p| p.place.clone()).collect::<Vec<_>>())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Upserts unassimilated devices, with the `carried` deletes in front when
/// there is a row to write.
pub(super) async fn insert_unassimilated<'a>(
    conn: &mut PgConnection,
    rows: impl Iterator<Item = &'a UnassimilatedDevice>,
    carried: &mut Deletes,
) -> Result<(), sqlx::Error> {
    let rows: Vec<_> = rows.collect();
    if rows.is_empty() {
        return Ok(());
    }
    let carried = std::mem::take(carried);
    let sql = format!(
        "{}insert into shepherd.unassimilated_devices (device_id, reservation_id, hostname, created_at)
         select * from unnest($1::text[], $2::uuid[], $3::text[], $4::timestamptz[])
         on conflict (device_id) do update set reservation_id = excluded.reservation_id,
           hostname = excluded.hostname, created_at = excluded.created_at",
        carried.prefix(5)
    );
    let query = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(rows.iter().map(|d| d.device_id.clone()).collect::<Vec<_>>())
        .bind(rows.iter().map(|d| d.reservation_id).collect::<Vec<_>>())
        .bind(rows.iter().map(|d| d.hostname.clone()).collect::<Vec<_>>())
        .bind(rows.iter().map(|d| d.created_at).collect::<Vec<_>>());
    carried.bind(query).execute(&mut *conn).await?;
    Ok(())
}

pub(super) fn machine_from_row(row: &sqlx::postgres::PgRow) -> ManagedMachine {
    ManagedMachine {
        machine_id: row.get("machine_id"),
        provider: row.get("provider"),
        provider_id: row.get("provider_id"),
        reservation_id: row.get("reservation_id"),
        hostname: row.get("hostname"),
        assimilated_at: row.get("assimilated_at"),
        protected: row.get("protected"),
        ready_at: row.get("ready_at"),
    }
}

pub(super) async fn insert_deletions<'a>(
    conn: &mut PgConnection,
    rows: impl Iterator<Item = &'a PendingDeletion>,
) -> Result<(), sqlx::Error> {
    for d in rows {
        sqlx::query(
            "insert into shepherd.pending_deletions (machine_id, provider_id, reservation_id, pool,
                 request, cause, message, requested_by, requested_at, cleared_at,
                 unresolved_since, last_error, asked_at)
             values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
             on conflict (machine_id) do update set provider_id = excluded.provider_id,
               reservation_id = excluded.reservation_id, pool = excluded.pool,
               request = excluded.request, cause = excluded.cause, message = excluded.message,
               requested_by = excluded.requested_by, requested_at = excluded.requested_at,
               cleared_at = excluded.cleared_at, unresolved_since = excluded.unresolved_since,
               last_error = excluded.last_error, asked_at = excluded.asked_at",
        )
        .bind(d.machine_id)
        .bind(&d.provider_id)
        .bind(d.reservation_id)
        .bind(&d.pool)
        .bind(&d.request)
        .bind(&d.cause)
        .bind(&d.message)
        .bind(&d.requested_by)
        .bind(d.requested_at)
        .bind(d.cleared_at)
        .bind(d.unresolved_since)
        .bind(&d.last_error)
        .bind(d.asked_at)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

pub(super) fn deletion_from_row(row: &sqlx::postgres::PgRow) -> PendingDeletion {
    PendingDeletion {
        machine_id: row.get("machine_id"),
        provider_id: row.get("provider_id"),
        reservation_id: row.get("reservation_id"),
        pool: row.get("pool"),
        request: row.get("request"),
        cause: row.get("cause"),
        message: row.get("message"),
        requested_by: row.get("requested_by"),
        requested_at: row.get("requested_at"),
        cleared_at: row.get("cleared_at"),
        asked_at: row.get("asked_at"),
        unresolved_since: row.get("unresolved_since"),
        last_error: row.get("last_error"),
    }
}

/// The deletions of these devices (by provider id), by machine id.
pub(super) async fn read_deletions(
    conn: &mut PgConnection,
    devices: Option<&[String]>,
) -> Result<BTreeMap<Uuid, PendingDeletion>, sqlx::Error> {
    let rows = sqlx::query(
        "select * from shepherd.pending_deletions where $1::text[] is null or provider_id = any($1)",
    )
    .bind(devices)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .iter()
        .map(|row| {
            let d = deletion_from_row(row);
            (d.machine_id, d)
        })
        .collect())
}

pub(super) fn penalty_from_row(row: &sqlx::postgres::PgRow) -> Penalty {
    Penalty {
        reservation_id: row.get("reservation_id"),
        until: row.get("until"),
        cause: row.get("cause"),
        failures: row.get("failures"),
        scope: row.get("scope"),
    }
}

pub(super) fn pending_from_row(row: &sqlx::postgres::PgRow) -> PendingCreation {
    PendingCreation {
        reservation_id: row.get("reservation_id"),
        request: row.get("request"),
        enqueued_at: row.get("enqueued_at"),
        unresolved_since: row.get("unresolved_since"),
        last_error: row.get("last_error"),
        place: row.get("place"),
    }
}

pub(super) fn unassimilated_from_row(row: &sqlx::postgres::PgRow) -> UnassimilatedDevice {
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

pub(super) async fn read_tables(conn: &mut PgConnection) -> Result<ViewState, sqlx::Error> {
    let mut state = ViewState {
        paused: read_pause(&mut *conn).await?,
        deletions_paused: read_deletions_pause(&mut *conn).await?,
        settings: read_settings(&mut *conn).await?,
        pools: read_pools(&mut *conn, None).await?,
        pending_deletions: read_deletions(&mut *conn, None).await?,
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
        state.unassimilated.insert(d.device_id.clone(), d);
    }
    Ok(state)
}

/// The sinbin row of a reservation, penalised or not.
pub async fn penalty(
    conn: &mut PgConnection,
    reservation: Uuid,
) -> Result<Option<Penalty>, sqlx::Error> {
    let row = sqlx::query(
        "select reservation_id, until, cause, failures, scope from shepherd.sinbin where reservation_id = $1",
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
