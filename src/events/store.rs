//! Appending to the log and reading it back.
//!
//! Appends run inside the caller's transaction, so a job's events, its view
//! changes and the jobs it enqueues commit together or not at all. Readers
//! that follow the log order it by `(tx_id, position)` and only read rows
//! whose transaction id is below the reader's snapshot `xmin`: every
//! transaction below that horizon has finished, so no row can still appear
//! behind the cursor. (Following by position alone skips rows that commit
//! late; that lost about 15 % of events with four writers.)

use serde_json::Value;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::event::Event;
pub use super::stored::{StoreError, StoredEvent};
use super::views;

/// An event about to be appended.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// Chosen by the writer; a retried append with the same id is stored once.
    pub event_id: Uuid,
    pub event: Event,
    pub job_id: Option<String>,
}

impl NewEvent {
    pub fn new(event: impl Into<Event>) -> Self {
        NewEvent {
            event_id: Uuid::new_v4(),
            event: event.into(),
            job_id: None,
        }
    }

    pub fn caused_by(mut self, job_id: impl Into<String>) -> Self {
        self.job_id = Some(job_id.into());
        self
    }

    /// A deterministic id, for appends that must be stored once however
    /// often the caller runs (e.g. derived from a job id and a step).
    pub fn with_id(mut self, event_id: Uuid) -> Self {
        self.event_id = event_id;
        self
    }
}

/// Appends events and applies them to the views, in the caller's
/// transaction. Returns the events actually stored (a retried event id is
/// skipped, and not applied twice).
///
/// The per-key locks are taken before the insert so that, for any one
/// reservation or device, log order equals the order the views saw: a
/// rebuild by position then reproduces the live views exactly. The locks,
/// the insert and the read of the view rows the events touch go in one call
/// (`shepherd.append_reading`, issue 31): a volatile function takes a fresh
/// snapshot for each query, so the read sees what the locks' last holders
/// committed, as a statement of its own after them did. The insert is the
/// transaction's first write, which keeps a stream's order in the feed.
pub async fn record(
    conn: &mut PgConnection,
    events: Vec<NewEvent>,
) -> Result<Vec<StoredEvent>, StoreError> {
    if events.is_empty() {
        return Ok(vec![]);
    }
    let keys = views::Keys::of(events.iter().map(|e| &e.event));
    if keys.is_empty() {
        return append(conn, events).await;
    }
    let columns = Columns::of(&events);
    let row = columns
        .bind(sqlx::query(
            "select * from shepherd.append_reading($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        ))
        .bind(keys.lock_names())
        .bind(keys.devices())
        .bind(keys.reservations())
        .fetch_one(&mut *conn)
        .await?;
    let positions: Option<Vec<i64>> = row.try_get("positions")?;
    let ids: Option<Vec<Uuid>> = row.try_get("event_ids")?;
    let recorded: Option<Vec<chrono::DateTime<chrono::Utc>>> = row.try_get("recorded_ats")?;
    let tx_ids: Option<Vec<i64>> = row.try_get("tx_ids")?;
    let stored = stored_of(
        events,
        positions
            .unwrap_or_default()
            .into_iter()
            .zip(ids.unwrap_or_default())
            .zip(recorded.unwrap_or_default())
            .zip(tx_ids.unwrap_or_default())
            .map(|(((position, id), at), tx)| (position, id, at, tx)),
    );
    views::apply_loaded(conn, &keys, &stored, views::rows_read(&row)?).await?;
    Ok(stored)
}

/// Inserts events without touching the views: for events no view keeps
/// (`record` sends those here), and for callers that update the views
/// themselves (the rebuild tests); jobs use [`record`].
pub async fn append(
    conn: &mut PgConnection,
    events: Vec<NewEvent>,
) -> Result<Vec<StoredEvent>, StoreError> {
    let columns = Columns::of(&events);
    let rows = columns
        .bind(sqlx::query(
            "insert into shepherd.events (event_id, stream, event_type, schema_version, body, job_id)
             select * from unnest($1::uuid[], $2::text[], $3::text[], $4::int[], $5::jsonb[], $6::text[])
             on conflict (event_id) do nothing
             returning position, event_id, recorded_at, tx_id::text::bigint as tx_id",
        ))
        .fetch_all(&mut *conn)
        .await?;
    Ok(stored_of(
        events,
        rows.iter().map(|row| {
            (
                row.get("position"),
                row.get("event_id"),
                row.get("recorded_at"),
                row.get("tx_id"),
            )
        }),
    ))
}

/// The events to insert, one array a column.
struct Columns {
    ids: Vec<Uuid>,
    streams: Vec<String>,
    types: Vec<String>,
    versions: Vec<i32>,
    bodies: Vec<Value>,
    jobs: Vec<Option<String>>,
}

impl Columns {
    fn of(events: &[NewEvent]) -> Columns {
        let mut c = Columns {
            ids: Vec::with_capacity(events.len()),
            streams: Vec::with_capacity(events.len()),
            types: Vec::with_capacity(events.len()),
            versions: Vec::with_capacity(events.len()),
            bodies: Vec::with_capacity(events.len()),
            jobs: Vec::with_capacity(events.len()),
        };
        for e in events {
            c.ids.push(e.event_id);
            c.streams.push(e.event.stream().name());
            c.types.push(e.event.type_name().to_string());
            c.versions.push(e.event.schema_version());
            c.bodies.push(e.event.body());
            c.jobs.push(e.job_id.clone());
        }
        c
    }

    /// `query` with the six columns bound as `$1` to `$6`.
    fn bind<'q>(
        &'q self,
        query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        query
            .bind(&self.ids)
            .bind(&self.streams)
            .bind(&self.types)
            .bind(&self.versions)
            .bind(&self.bodies)
            .bind(&self.jobs)
    }
}

/// The events the insert stored, given what it returned of each (its
/// position, id, time and transaction), in log order.
fn stored_of(
    events: Vec<NewEvent>,
    inserted: impl Iterator<Item = (i64, Uuid, chrono::DateTime<chrono::Utc>, i64)>,
) -> Vec<StoredEvent> {
    let mut by_id: std::collections::HashMap<Uuid, NewEvent> =
        events.into_iter().map(|e| (e.event_id, e)).collect();
    let mut stored: Vec<StoredEvent> = inserted
        .filter_map(|(position, id, recorded_at, tx_id)| {
            let e = by_id.remove(&id)?;
            Some(StoredEvent {
                position,
                event_id: id,
                stream: e.event.stream().name(),
                event: e.event,
                job_id: e.job_id,
                recorded_at,
                tx_id,
            })
        })
        .collect();
    stored.sort_by_key(|e| e.position);
    stored
}

macro_rules! columns {
    () => {
        "position, event_id, stream, event_type, schema_version, body, job_id, \
         recorded_at, tx_id::text::bigint as tx_id"
    };
}

fn decode_row(row: &sqlx::postgres::PgRow) -> Result<StoredEvent, StoreError> {
    let position: i64 = row.get("position");
    let event_type: String = row.get("event_type");
    let version: i32 = row.get("schema_version");
    let body: Value = row.get("body");
    let event =
        Event::decode(&event_type, version, body).map_err(|source| StoreError::Corrupt {
            position,
            event_type: event_type.clone(),
            version,
            source,
        })?;
    Ok(StoredEvent {
        position,
        event_id: row.get("event_id"),
        stream: row.get("stream"),
        event,
        job_id: row.get("job_id"),
        recorded_at: row.get("recorded_at"),
        tx_id: row.get("tx_id"),
    })
}

/// One stream's events in the order they were written.
pub async fn read_stream(pool: &PgPool, stream: &str) -> Result<Vec<StoredEvent>, StoreError> {
    let rows = sqlx::query(concat!(
        "select ",
        columns!(),
        " from shepherd.events where stream = $1 order by position"
    ))
    .bind(stream)
    .fetch_all(pool)
    .await?;
    rows.iter().map(decode_row).collect()
}

/// The events one job's runs recorded, and operators' retries and
/// cancels of it, in order.
pub async fn read_by_job(pool: &PgPool, job_id: &str) -> Result<Vec<StoredEvent>, StoreError> {
    let rows = sqlx::query(concat!(
        "select ",
        columns!(),
        " from shepherd.events where job_id = $1
           or (event_type in ('job_retried', 'job_cancelled') and body->>'job' = $1)
         order by position"
    ))
    .bind(job_id)
    .fetch_all(pool)
    .await?;
    rows.iter().map(decode_row).collect()
}

/// A device's own stream plus the creation event (on its reservation's
/// stream) that made it, in order.
pub async fn read_device_history(
    pool: &PgPool,
    device: &str,
) -> Result<Vec<StoredEvent>, StoreError> {
    let rows = sqlx::query(concat!(
        "select ",
        columns!(),
        " from shepherd.events where stream = 'device/' || $1::text
           or (event_type = 'device_created' and body->>'device' = $1::text)
         order by position"
    ))
    .bind(device)
    .fetch_all(pool)
    .await?;
    rows.iter().map(decode_row).collect()
}

/// The last `limit` events not of the `skipped` types, oldest first.
pub async fn read_recent_except(
    pool: &PgPool,
    limit: i64,
    skipped: &[&str],
) -> Result<Vec<StoredEvent>, StoreError> {
    let skipped: Vec<String> = skipped.iter().map(|s| s.to_string()).collect();
    let rows = sqlx::query(concat!(
        "select * from (select ",
        columns!(),
        " from shepherd.events where event_type <> all($2)
          order by position desc limit $1) e order by position"
    ))
    .bind(limit)
    .bind(&skipped)
    .fetch_all(pool)
    .await?;
    rows.iter().map(decode_row).collect()
}

/// Up to `limit` events before `before` (a position; the newest when
/// `None`), newest first, of one stream (or every stream starting with a
/// prefix that ends in `/`, e.g. `reservation/`) and one type, where given.
pub async fn read_filtered(
    pool: &PgPool,
    stream: Option<&str>,
    event_type: Option<&str>,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<StoredEvent>, StoreError> {
    let (exact, prefix) = match stream {
        Some(s) if s.ends_with('/') => (
            None,
            Some(
                s.replace('\\', "\\\\")
                    .replace('%', "\\%")
                    .replace('_', "\\_")
                    + "%",
            ),
        ),
        Some(s) => (Some(s), None),
        None => (None, None),
    };
    let rows = sqlx::query(concat!(
        "select ",
        columns!(),
        " from shepherd.events
          where ($1::text is null or stream = $1) and ($2::text is null or stream like $2)
            and ($3::text is null or event_type = $3) and ($4::bigint is null or position < $4)
          order by position desc limit $5"
    ))
    .bind(exact)
    .bind(prefix)
    .bind(event_type)
    .bind(before)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter().map(decode_row).collect()
}

/// The last `limit` events, oldest first.
pub async fn read_recent(pool: &PgPool, limit: i64) -> Result<Vec<StoredEvent>, StoreError> {
    let rows = sqlx::query(concat!(
        "select * from (select ",
        columns!(),
        " from shepherd.events order by position desc limit $1) e order by position"
    ))
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.iter().map(decode_row).collect()
}

/// A position in the feed: the last `(tx_id, position)` a follower saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    pub tx_id: i64,
    pub position: i64,
}

/// Reads the log in commit-safe order, never skipping a late commit.
#[derive(Debug, Clone)]
pub struct Follower {
    cursor: Cursor,
    stream: Option<String>,
    batch: i64,
}

impl Follower {
    /// From the start of the log.
    pub fn from_start() -> Self {
        Follower {
            cursor: Cursor::default(),
            stream: None,
            batch: 1000,
        }
    }

    pub fn from_cursor(cursor: Cursor) -> Self {
        Follower {
            cursor,
            ..Follower::from_start()
        }
    }

    /// Only one stream's events.
    pub fn stream(mut self, stream: impl Into<String>) -> Self {
        self.stream = Some(stream.into());
        self
    }

    pub fn cursor(&self) -> Cursor {
        self.cursor
    }

    /// The next events that are safe to hand out; empty when caught up.
    pub async fn poll(&mut self, pool: &PgPool) -> Result<Vec<StoredEvent>, StoreError> {
        let rows = sqlx::query(concat!(
            "select ",
            columns!(),
            " from shepherd.events
             where (tx_id, position) > ($1::bigint::text::xid8, $2)
               and tx_id < pg_snapshot_xmin(pg_current_snapshot())
               and ($3::text is null or stream = $3)
             order by tx_id, position
             limit $4"
        ))
        .bind(self.cursor.tx_id)
        .bind(self.cursor.position)
        .bind(&self.stream)
        .bind(self.batch)
        .fetch_all(pool)
        .await?;
        let events = rows.iter().map(decode_row).collect::<Result<Vec<_>, _>>()?;
        if let Some(last) = events.last() {
            self.cursor = Cursor {
                tx_id: last.tx_id,
                position: last.position,
            };
        }
        Ok(events)
    }
}
