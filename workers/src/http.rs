//! What every worker serves on its metrics port, in the spirit of Monogon's
//! "webug": a status page a person can read without JavaScript, each
//! reservation's and device's history, Prometheus metrics and the health
//! probes. Read-only: nothing here writes to the database or calls the API.
//!
//! The provisioner's figures are read from the database at each request, so
//! every worker's page and endpoint tell the same cluster-wide story; only
//! the API client's metrics are this process's own.

use std::fmt::{self, Display, Formatter};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use chrono::{DateTime, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::{Registry, Unit};
use serde_json::Value;
use shepherd::events::StoreError;
use shepherd::events::event::{Event, ReservationCounts};
use shepherd::events::store::{self, StoredEvent};
use shepherd::events::views::{self, ManagedMachine};
use shepherd::fleet::{self, Overview};
use shepherd::metal::ClientMetrics;
use sqlx::PgPool;
use tokio::net::TcpListener;
use uuid::Uuid;

use crate::runtime::Stop;
use crate::table::human_duration;

/// What `prometheus_client::encoding::text::encode` writes.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Orchestrators probe often and give up quickly; a hung database must read
/// as "not ready" well before their own timeout.
const READY_TIMEOUT: Duration = Duration::from_secs(2);
const RECENT_EVENTS: i64 = 20;

#[derive(Clone)]
pub struct HttpState {
    pub pool: PgPool,
    pub client_metrics: ClientMetrics,
}

/// Serves until `stop` resolves. Binds nothing itself: the caller passes the
/// listener (so tests can bind port 0).
pub async fn serve(listener: TcpListener, state: HttpState, stop: Stop) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving the status page and metrics");
    }
    axum::serve(listener, router(state))
        .with_graceful_shutdown(stop.wait())
        .await
}

fn router(state: HttpState) -> Router {
    Router::new()
        .route("/", get(status_page))
        .route("/reservation/{id}", get(reservation_page))
        .route("/device/{id}", get(device_page))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

// ---- failures ----

/// Why a request got no page.
enum Failure {
    /// The database did not answer. The cause goes to the log, not to
    /// whoever can reach the metrics port.
    Unavailable,
    Internal(String),
    BadRequest(String),
    NotFound(String),
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        match self {
            Failure::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "the database is unavailable; see this worker's log\n",
            )
                .into_response(),
            Failure::Internal(message) => {
                (StatusCode::INTERNAL_SERVER_ERROR, format!("{message}\n")).into_response()
            }
            Failure::BadRequest(message) => (
                StatusCode::BAD_REQUEST,
                Html(Layout::new("bad request", Message(&message)).to_string()),
            )
                .into_response(),
            Failure::NotFound(message) => (
                StatusCode::NOT_FOUND,
                Html(Layout::new("not found", Message(&message)).to_string()),
            )
                .into_response(),
        }
    }
}

fn database_failure(what: &str, error: sqlx::Error) -> Failure {
    tracing::warn!(%error, "{what}: the database did not answer");
    Failure::Unavailable
}

fn store_failure(what: &str, error: StoreError) -> Failure {
    match error {
        StoreError::Database(e) => database_failure(what, e),
        corrupt @ (StoreError::Corrupt { .. } | StoreError::Invalid(_)) => {
            tracing::warn!(error = %corrupt, "{what}: the event log does not decode");
            Failure::Internal(corrupt.to_string())
        }
    }
}

// ---- probes ----

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(state): State<HttpState>) -> (StatusCode, &'static str) {
    let check = sqlx::query("select 1").execute(&state.pool);
    let reason = match tokio::time::timeout(READY_TIMEOUT, check).await {
        Ok(Ok(_)) => return (StatusCode::OK, "ready"),
        Err(_) => "not ready: the database did not answer within 2 s",
        Ok(Err(sqlx::Error::PoolClosed)) => "not ready: shutting down",
        Ok(Err(sqlx::Error::PoolTimedOut)) => "not ready: no database connection is free",
        Ok(Err(sqlx::Error::Io(_) | sqlx::Error::Tls(_))) => "not ready: cannot reach the database",
        Ok(Err(_)) => "not ready: the database check failed",
    };
    // Probes repeat every few seconds; the workers log the outage already.
    tracing::debug!(reason, "readiness check failed");
    (StatusCode::SERVICE_UNAVAILABLE, reason)
}

// ---- metrics ----

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabel {
    class: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    kind: String,
    state: String,
}

/// Outcomes counted over the whole log.
#[derive(sqlx::FromRow)]
struct Outcomes {
    created: i64,
    recovered: i64,
    given_up: i64,
    race_lost: i64,
    attempt_failed: i64,
    refused: i64,
    discrepancies: i64,
    assimilated: i64,
    skipped: i64,
    rejected: i64,
}

/// The provisioner's figures at one scrape.
struct Figures {
    overview: Overview,
    listed: Option<ReservationCounts>,
    outcomes: Outcomes,
}

impl Figures {
    async fn read(pool: &PgPool) -> Result<Figures, sqlx::Error> {
        let overview = fleet::overview(pool).await?;
        let listed: Option<(i32, Value)> = sqlx::query_as(
            "select schema_version, body from shepherd.events
             where event_type = 'reservations_listed' order by position desc limit 1",
        )
        .fetch_optional(pool)
        .await?;
        // Decoded like any reader would, so an older body is upcast and a
        // newer one this build cannot read is left out rather than misread.
        let listed = listed.and_then(|(version, body)| {
            match Event::decode("reservations_listed", version, body) {
                Ok(Event::ReservationsListed(e)) => Some(e.counts),
                _ => None,
            }
        });
        // events_type_idx keeps this to the counted types' rows.
        let outcomes = sqlx::query_as(
            "select
               count(*) filter (where event_type = 'device_created'
                                  and not coalesce((body->>'recovered')::bool, false)) as created,
               count(*) filter (where event_type = 'device_created'
                                  and coalesce((body->>'recovered')::bool, false)) as recovered,
               count(*) filter (where event_type = 'creation_given_up') as given_up,
               count(*) filter (where event_type = 'race_lost') as race_lost,
               count(*) filter (where event_type = 'creation_attempt_failed') as attempt_failed,
               count(*) filter (where event_type = 'creation_refused') as refused,
               count(*) filter (where event_type = 'discrepancy_found') as discrepancies,
               count(*) filter (where event_type = 'machine_assimilated') as assimilated,
               count(*) filter (where event_type = 'assimilation_skipped') as skipped,
               count(*) filter (where event_type = 'assimilation_rejected') as rejected
             from shepherd.events
             where event_type in ('device_created', 'creation_given_up', 'race_lost',
                                  'creation_attempt_failed', 'creation_refused',
                                  'discrepancy_found', 'machine_assimilated',
                                  'assimilation_skipped', 'assimilation_rejected')",
        )
        .fetch_one(pool)
        .await?;
        Ok(Figures {
            overview,
            listed,
            outcomes,
        })
    }

    fn register(self, registry: &mut Registry) {
        let Figures {
            overview: o,
            listed,
            outcomes: n,
        } = self;

        if let Some(c) = listed {
            let reservations = Family::<ClassLabel, Gauge<u64, AtomicU64>>::default();
            for (class, value) in [
                ("total", c.total),
                ("available", c.available),
                ("in_use", c.in_use),
                ("not_provisionable", c.not_provisionable),
                ("penalised", c.penalised),
                ("in_flight", c.in_flight),
            ] {
                reservations.get_or_create(&ClassLabel { class }).set(value);
            }
            registry.register(
                "shepherd_reservations",
                "Hardware reservations by class, as the last reconcile listed them",
                reservations,
            );
        }

        registry.register(
            "shepherd_machines_managed",
            "Machines shepherd manages",
            ConstGauge::new(o.managed),
        );
        registry.register(
            "shepherd_machines_in_flight",
            "Pending creations plus created devices not yet assimilated",
            ConstGauge::new(o.in_flight()),
        );
        if let Some(limit) = o.max_machines {
            registry.register(
                "shepherd_machines_limit",
                "The cluster's max_machines (0: no limit)",
                ConstGauge::new(limit),
            );
        }
        registry.register(
            "shepherd_unresolved_creations",
            "Creations whose outcome is unknown, held in flight until a look settles them",
            ConstGauge::new(o.unresolved.len() as i64),
        );
        registry.register(
            "shepherd_oldest_unresolved_creation_seconds",
            "Age of the oldest unresolved creation (0 when none)",
            ConstGauge::<f64>::new(o.unresolved.first().map_or(0.0, |u| u.seconds)),
        );
        registry.register(
            "shepherd_sinbin_reservations",
            "Reservations under an active penalty",
            ConstGauge::new(o.penalised.len() as i64),
        );
        registry.register(
            "shepherd_creations_paused",
            "1 while an operator has paused new creations",
            ConstGauge::new(i64::from(o.paused.is_some())),
        );

        let creations = Family::<OutcomeLabel, Counter>::default();
        for (outcome, events) in [
            ("created", n.created),
            ("recovered", n.recovered),
            ("given_up", n.given_up),
            ("race_lost", n.race_lost),
            ("attempt_failed", n.attempt_failed),
            ("refused", n.refused),
        ] {
            creations
                .get_or_create(&OutcomeLabel { outcome })
                .inc_by(count(events));
        }
        registry.register(
            "shepherd_creations",
            "Device creations by outcome, over the whole event log",
            creations,
        );
        registry.register(
            "shepherd_discrepancies",
            "Reconcile passes that found provider and shepherd disagreeing",
            ConstCounter::new(count(n.discrepancies)),
        );
        let assimilations = Family::<OutcomeLabel, Counter>::default();
        for (outcome, events) in [
            ("assimilated", n.assimilated),
            ("skipped", n.skipped),
            ("rejected", n.rejected),
        ] {
            assimilations
                .get_or_create(&OutcomeLabel { outcome })
                .inc_by(count(events));
        }
        registry.register(
            "shepherd_assimilations",
            "Assimilations by outcome, over the whole event log",
            assimilations,
        );

        let jobs = Family::<QueueLabels, Gauge>::default();
        let oldest = Family::<QueueLabels, Gauge<f64, AtomicU64>>::default();
        for row in &o.queue {
            let labels = QueueLabels {
                kind: row.kind.clone(),
                state: row.state.clone(),
            };
            jobs.get_or_create(&labels).set(row.jobs);
            if let Some(seconds) = row.oldest_seconds {
                oldest.get_or_create(&labels).set(seconds);
            }
        }
        registry.register("shepherd_jobs", "Jobs on the queue by kind and state", jobs);
        registry.register_with_unit(
            "shepherd_job_oldest_age",
            "Age of the oldest job of each kind and state, by its run time",
            Unit::Seconds,
            oldest,
        );
        if let Some(at) = o.last_successful_reconcile {
            registry.register_with_unit(
                "shepherd_last_successful_reconcile_age",
                "Time since the last reconcile pass that was not refused finished",
                Unit::Seconds,
                ConstGauge::new(seconds_between(at, o.now)),
            );
        }
    }
}

/// SQL's `count(*)` is a bigint, but never a negative one.
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or_default()
}

fn seconds_between(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).num_milliseconds() as f64 / 1000.0
}

async fn metrics(State(state): State<HttpState>) -> Result<Response, Failure> {
    let figures = Figures::read(&state.pool)
        .await
        .map_err(|e| database_failure("metrics", e))?;
    // A fresh registry per scrape: the provisioner's figures are read, not
    // accumulated, and a family left from an earlier scrape would go stale.
    let mut registry = Registry::default();
    state.client_metrics.register(&mut registry);
    figures.register(&mut registry);
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, &registry)
        .map_err(|e| Failure::Internal(format!("cannot encode the metrics: {e}")))?;
    Ok(([(CONTENT_TYPE, OPENMETRICS)], body).into_response())
}

// ---- pages ----

async fn status_page(State(state): State<HttpState>) -> Result<Html<String>, Failure> {
    const WHAT: &str = "status page";
    let overview = fleet::overview(&state.pool)
        .await
        .map_err(|e| database_failure(WHAT, e))?;
    let views = {
        let mut conn = state
            .pool
            .acquire()
            .await
            .map_err(|e| database_failure(WHAT, e))?;
        views::read_live(&mut conn)
            .await
            .map_err(|e| database_failure(WHAT, e))?
    };
    let mut machines: Vec<ManagedMachine> = views.machines.into_values().collect();
    machines.sort_by_key(|m| (m.assimilated_at, m.machine_id));
    let mut events = store::read_recent(&state.pool, RECENT_EVENTS)
        .await
        .map_err(|e| store_failure(WHAT, e))?;
    // What just happened belongs at the top.
    events.reverse();
    let rows: Vec<EventRow> = events.into_iter().map(EventRow::from).collect();
    let page = StatusPage {
        overview: &overview,
        machines: &machines,
        events: &rows,
    };
    Ok(Html(Layout::new("shepherd", page).refreshing().to_string()))
}

fn parse_id(kind: Kind, raw: &str) -> Result<Uuid, Failure> {
    raw.parse().map_err(|_| {
        Failure::BadRequest(format!(
            "“{raw}” is not a {kind} id: expected a UUID such as 6f1c2d3e-4a5b-4c6d-8e9f-0a1b2c3d4e5f."
        ))
    })
}

async fn reservation_page(
    State(state): State<HttpState>,
    Path(raw): Path<String>,
) -> Result<Html<String>, Failure> {
    let id = parse_id(Kind::Reservation, &raw)?;
    let events = store::read_stream(&state.pool, &format!("reservation/{id}"))
        .await
        .map_err(|e| store_failure("reservation history", e))?;
    history(
        Kind::Reservation,
        id,
        events.into_iter().map(EventRow::from).collect(),
    )
}

async fn device_page(
    State(state): State<HttpState>,
    Path(raw): Path<String>,
) -> Result<Html<String>, Failure> {
    let id = parse_id(Kind::Device, &raw)?;
    let rows: Vec<(i64, DateTime<Utc>, String, Value)> = sqlx::query_as(
        "select event_position, recorded_at, event_type, body from shepherd.device_history($1)",
    )
    .bind(id)
    .fetch_all(&state.pool)
    .await
    .map_err(|e| database_failure("device history", e))?;
    let rows = rows
        .into_iter()
        .map(|(position, recorded_at, event_type, body)| EventRow {
            position,
            recorded_at,
            event_type,
            stream: None,
            body,
        })
        .collect();
    history(Kind::Device, id, rows)
}

fn history(kind: Kind, id: Uuid, rows: Vec<EventRow>) -> Result<Html<String>, Failure> {
    if rows.is_empty() {
        // The discrepancy banner links devices nobody manages; say why they
        // have no history rather than leave the operator at a bare 404.
        let hint = match kind {
            Kind::Device => " A device a reconcile found unknown has none until it is adopted.",
            Kind::Reservation => "",
        };
        return Err(Failure::NotFound(format!(
            "No events for {kind} {id}: shepherd has recorded nothing about it.{hint}"
        )));
    }
    let page = HistoryPage {
        kind,
        id,
        rows: &rows,
    };
    Ok(Html(
        Layout::new(&format!("shepherd · {kind} {id}"), page).to_string(),
    ))
}

// ---- rendering ----

const STYLE: &str = "
body { font: 14px/1.45 system-ui, sans-serif; color: #222; max-width: 88em; margin: 1em auto; padding: 0 1em; }
h1 { font-size: 1.5em; margin: 0 0 .1em; }
h2 { font-size: 1.1em; margin: 1.8em 0 .4em; padding-bottom: .2em; border-bottom: 1px solid #ddd; }
a { color: #0645ad; text-decoration: none; }
a:hover { text-decoration: underline; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: .25em .7em .25em 0; border-bottom: 1px solid #eee; }
thead th { font-weight: 600; color: #555; border-bottom: 1px solid #ccc; }
table.facts { width: auto; }
table.facts th { font-weight: normal; color: #555; padding-right: 2em; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.id, .body, td.n { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
.body .k { color: #777; }
.muted { color: #777; }
.alarm { background: #c00; color: #fff; padding: .8em 1em; margin: 1em 0; font-size: 1.15em; }
.alarm a { color: #fff; text-decoration: underline; }
.alarm ul { margin: .3em 0 0; }
.warn { background: #fff4d6; border: 1px solid #e5c56b; padding: .6em 1em; margin: 1em 0; }
.ok { color: #161; }
";

/// HTML-escapes text for element content and quoted attribute values.
struct Esc<'a>(&'a str);

impl Display for Esc<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(i) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..i])?;
            f.write_str(match rest.as_bytes()[i] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[i + 1..];
        }
        f.write_str(rest)
    }
}

struct Layout<'a, B> {
    title: &'a str,
    refresh: bool,
    body: B,
}

impl<'a, B: Display> Layout<'a, B> {
    fn new(title: &'a str, body: B) -> Self {
        Layout {
            title,
            refresh: false,
            body,
        }
    }

    fn refreshing(mut self) -> Self {
        self.refresh = true;
        self
    }
}

impl<B: Display> Display for Layout<'_, B> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        )?;
        if self.refresh {
            f.write_str("<meta http-equiv=\"refresh\" content=\"5\">\n")?;
        }
        write!(
            f,
            "<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{}</body>\n</html>\n",
            Esc(self.title),
            self.body
        )
    }
}

struct Message<'a>(&'a str);

impl Display for Message<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "<h1><a href=\"/\">shepherd</a></h1>\n<p>{}</p>\n",
            Esc(self.0)
        )
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Reservation,
    Device,
}

impl Display for Kind {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Reservation => "reservation",
            Kind::Device => "device",
        })
    }
}

/// An id linking to its history page.
struct Link(Kind, Uuid);

impl Display for Link {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let Link(kind, id) = self;
        write!(f, "<a class=\"id\" href=\"/{kind}/{id}\">{id}</a>")
    }
}

/// A device id as the views keep it (a string, per provider): linked when
/// it is one of Metal's UUIDs.
struct DeviceId<'a>(&'a str);

impl Display for DeviceId<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self.0.parse() {
            Ok(id) => Link(Kind::Device, id).fmt(f),
            Err(_) => write!(f, "<span class=\"id\">{}</span>", Esc(self.0)),
        }
    }
}

/// A stream name, linked when it is a reservation's or a device's.
struct StreamName<'a>(&'a str);

impl Display for StreamName<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let link = self.0.split_once('/').and_then(|(kind, id)| {
            let kind = match kind {
                "reservation" => Kind::Reservation,
                "device" => Kind::Device,
                _ => return None,
            };
            Some(Link(kind, id.parse().ok()?))
        });
        match link {
            Some(link) => write!(f, "{}/{link}", link.0),
            None => write!(f, "<span class=\"id\">{}</span>", Esc(self.0)),
        }
    }
}

struct Time(DateTime<Utc>);

impl Display for Time {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.format("%Y-%m-%d %H:%M:%S UTC"))
    }
}

/// A time with how long ago it was, by the database's clock.
struct Ago(DateTime<Utc>, DateTime<Utc>);

impl Display for Ago {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let Ago(at, now) = *self;
        write!(
            f,
            "{} <span class=\"muted\">({} ago)</span>",
            Time(at),
            human_duration(now - at)
        )
    }
}

/// One event as the tables show it.
struct EventRow {
    position: i64,
    recorded_at: DateTime<Utc>,
    event_type: String,
    /// `None` where the source does not say (the device history).
    stream: Option<String>,
    body: Value,
}

impl From<StoredEvent> for EventRow {
    fn from(e: StoredEvent) -> Self {
        EventRow {
            position: e.position,
            recorded_at: e.recorded_at,
            event_type: e.event.type_name().to_string(),
            body: e.event.body(),
            stream: Some(e.stream),
        }
    }
}

/// The fields that hold ids, by what they identify.
fn id_kind(field: &str) -> Option<Kind> {
    match field {
        "reservation" | "reservations" => Some(Kind::Reservation),
        "device" | "other_device" | "unknown_devices" | "missing_devices" | "provider_id" => {
            Some(Kind::Device)
        }
        _ => None,
    }
}

/// An event body as `field=value` pairs, ids linked.
struct Body<'a>(&'a Value);

impl Display for Body<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let Value::Object(fields) = self.0 else {
            return Esc(&self.0.to_string()).fmt(f);
        };
        for (i, (field, value)) in fields.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "<span class=\"k\">{}</span>=", Esc(field))?;
            field_value(f, id_kind(field), value)?;
        }
        Ok(())
    }
}

fn field_value(f: &mut Formatter<'_>, kind: Option<Kind>, value: &Value) -> fmt::Result {
    match (kind, value) {
        (Some(kind), Value::String(s)) => match s.parse() {
            Ok(id) => Link(kind, id).fmt(f),
            Err(_) => Esc(s).fmt(f),
        },
        (Some(_), Value::Array(items)) => {
            f.write_str("[")?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                field_value(f, kind, item)?;
            }
            f.write_str("]")
        }
        (_, Value::String(s)) => Esc(s).fmt(f),
        (_, Value::Object(_)) => write!(f, "{{{}}}", Body(value)),
        (_, other) => Esc(&other.to_string()).fmt(f),
    }
}

struct EventTable<'a> {
    rows: &'a [EventRow],
    /// Off where the page is about one stream already.
    with_stream: bool,
}

impl Display for EventTable<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let with_stream = self.with_stream;
        f.write_str("<table>\n<thead><tr><th>#</th><th>Recorded</th><th>Event</th>")?;
        if with_stream {
            f.write_str("<th>Stream</th>")?;
        }
        f.write_str("<th>Details</th></tr></thead>\n<tbody>\n")?;
        for e in self.rows {
            write!(
                f,
                "<tr><td class=\"n\">{}</td><td>{}</td><td>{}</td>",
                e.position,
                Time(e.recorded_at),
                Esc(&e.event_type)
            )?;
            if with_stream {
                match &e.stream {
                    Some(s) => write!(f, "<td>{}</td>", StreamName(s))?,
                    None => f.write_str("<td></td>")?,
                }
            }
            writeln!(f, "<td class=\"body\">{}</td></tr>", Body(&e.body))?;
        }
        f.write_str("</tbody>\n</table>\n")
    }
}

struct HistoryPage<'a> {
    kind: Kind,
    id: Uuid,
    rows: &'a [EventRow],
}

impl Display for HistoryPage<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "<h1><a href=\"/\">shepherd</a> · {} <span class=\"id\">{}</span></h1>",
            self.kind, self.id
        )?;
        writeln!(
            f,
            "<p class=\"muted\">{} events, oldest first.</p>",
            self.rows.len()
        )?;
        EventTable {
            rows: self.rows,
            with_stream: false,
        }
        .fmt(f)
    }
}

struct StatusPage<'a> {
    overview: &'a Overview,
    machines: &'a [ManagedMachine],
    events: &'a [EventRow],
}

impl Display for StatusPage<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let o = self.overview;
        writeln!(
            f,
            "<h1>shepherd</h1>\n<p class=\"muted\">As of {}; this page refreshes every 5 s.</p>",
            Time(o.now)
        )?;
        self.alarms(f)?;
        self.fleet(f)?;
        self.last_reconcile(f)?;
        self.penalties(f)?;
        self.queue(f)?;
        self.workers(f)?;
        self.machines(f)?;
        writeln!(
            f,
            "<h2>Recent events <span class=\"muted\">(newest first)</span></h2>"
        )?;
        if self.events.is_empty() {
            f.write_str("<p class=\"muted\">The log is empty.</p>\n")
        } else {
            EventTable {
                rows: self.events,
                with_stream: true,
            }
            .fmt(f)
        }
    }
}

impl StatusPage<'_> {
    fn alarms(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let o = self.overview;
        if let Some(d) = o
            .last_reconcile
            .as_ref()
            .and_then(|r| r.discrepancy.as_ref())
        {
            f.write_str(
                "<div class=\"alarm\"><strong>DISCREPANCY:</strong> the provider and shepherd \
                 disagree about which machines exist. The last reconcile refused to do any \
                 work, and passes keep refusing while this lasts.\n<ul>\n",
            )?;
            if !d.unknown_devices.is_empty() {
                f.write_str("<li>Unknown devices (ours by name, managed by nobody): ")?;
                field_value(f, Some(Kind::Device), &serde_json::json!(d.unknown_devices))?;
                f.write_str("</li>\n")?;
            }
            if !d.missing_devices.is_empty() {
                f.write_str("<li>Missing devices (managed, gone from the provider): ")?;
                field_value(f, Some(Kind::Device), &serde_json::json!(d.missing_devices))?;
                f.write_str("</li>\n")?;
            }
            f.write_str("</ul></div>\n")?;
        }
        if let Some(p) = &o.paused {
            writeln!(
                f,
                "<div class=\"warn\"><strong>Creations are paused</strong> by {} since {}: {}</div>",
                Esc(&p.by),
                Ago(p.since, o.now),
                Esc(&p.reason)
            )?;
        }
        Ok(())
    }

    fn fleet(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let o = self.overview;
        f.write_str("<h2>Fleet</h2>\n<table class=\"facts\">\n")?;
        writeln!(
            f,
            "<tr><th>Managed machines</th><td>{}</td></tr>",
            o.managed
        )?;
        match o.max_machines {
            Some(limit) => writeln!(f, "<tr><th>Machine limit</th><td>{limit}</td></tr>")?,
            None => writeln!(
                f,
                "<tr><th>Machine limit</th><td class=\"muted\">no settings recorded yet</td></tr>"
            )?,
        }
        writeln!(
            f,
            "<tr><th>In flight</th><td>{} <span class=\"muted\">(pending creations: {}, \
             devices awaiting assimilation: {})</span></td></tr>",
            o.in_flight(),
            o.pending_creations,
            o.unassimilated_devices
        )?;
        if let Some(oldest) = o.unresolved.first() {
            writeln!(
                f,
                "<tr><th>Unresolved creations</th><td><strong>{}</strong> \
                 <span class=\"muted\">(outcome unknown, settled by looking; oldest {}: {})</span></td></tr>",
                o.unresolved.len(),
                Esc(&format!("{:.0} s", oldest.seconds)),
                Esc(oldest.last_error.as_deref().unwrap_or(""))
            )?;
        }
        match &o.paused {
            Some(_) => writeln!(
                f,
                "<tr><th>Creations</th><td><strong>paused</strong></td></tr>"
            )?,
            None => writeln!(
                f,
                "<tr><th>Creations</th><td class=\"ok\">running</td></tr>"
            )?,
        }
        writeln!(
            f,
            "<tr><th>Penalised reservations</th><td>{}</td></tr>",
            o.penalised.len()
        )?;
        match o.last_successful_reconcile {
            Some(at) => writeln!(
                f,
                "<tr><th>Last successful reconcile</th><td>{}</td></tr>",
                Ago(at, o.now)
            )?,
            None => writeln!(
                f,
                "<tr><th>Last successful reconcile</th><td class=\"muted\">never</td></tr>"
            )?,
        }
        writeln!(
            f,
            "<tr><th>Events in the log</th><td>{}</td></tr>",
            o.events
        )?;
        f.write_str("</table>\n")
    }

    fn last_reconcile(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let o = self.overview;
        f.write_str("<h2>Last reconcile</h2>\n")?;
        let Some(r) = &o.last_reconcile else {
            return f.write_str("<p class=\"muted\">No pass has run yet.</p>\n");
        };
        writeln!(
            f,
            "<table class=\"facts\">\n<tr><th>Run</th><td class=\"id\">{}</td></tr>\n\
             <tr><th>Started</th><td>{}</td></tr>",
            r.run,
            Ago(r.started_at, o.now)
        )?;
        if let Some(reason) = &r.refused {
            writeln!(
                f,
                "<tr><th>Outcome</th><td><strong>refused:</strong> {}</td></tr>",
                Esc(reason)
            )?;
        }
        match &r.finished {
            Some(done) => writeln!(
                f,
                "<tr><th>Finished</th><td>{} managed, {} in flight, {} creations enqueued{}</td></tr>",
                done.managed,
                done.in_flight,
                done.enqueued,
                if done.at_limit { "; at the limit" } else { "" }
            )?,
            None if r.refused.is_none() => {
                writeln!(f, "<tr><th>Outcome</th><td>still running</td></tr>")?
            }
            None => {}
        }
        f.write_str("</table>\n")
    }

    fn penalties(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let o = self.overview;
        f.write_str("<h2>Penalised reservations</h2>\n")?;
        if o.penalised.is_empty() {
            return f.write_str("<p class=\"muted\">None.</p>\n");
        }
        f.write_str(
            "<table>\n<thead><tr><th>Reservation</th><th>Time left</th><th>Until</th>\
             <th>Failures</th><th>Cause</th></tr></thead>\n<tbody>\n",
        )?;
        for p in &o.penalised {
            writeln!(
                f,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                Link(Kind::Reservation, p.reservation_id),
                human_duration(chrono::TimeDelta::seconds(p.seconds_left)),
                Time(p.until),
                p.failures,
                Esc(&p.cause)
            )?;
        }
        f.write_str("</tbody>\n</table>\n")
    }

    fn queue(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let o = self.overview;
        f.write_str("<h2>Queue</h2>\n")?;
        if o.queue.is_empty() {
            return f.write_str("<p class=\"muted\">No jobs.</p>\n");
        }
        f.write_str(
            "<table>\n<thead><tr><th>Kind</th><th>State</th><th>Jobs</th>\
             <th>Oldest</th></tr></thead>\n<tbody>\n",
        )?;
        for q in &o.queue {
            write!(
                f,
                "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>",
                Esc(&q.kind),
                Esc(&q.state),
                q.jobs
            )?;
            if let Some(s) = q.oldest_seconds {
                f.write_str(&human_duration(chrono::TimeDelta::seconds(s as i64)))?;
            }
            f.write_str("</td></tr>\n")?;
        }
        f.write_str("</tbody>\n</table>\n")
    }

    fn workers(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let o = self.overview;
        f.write_str("<h2>Workers seen in the last 10 minutes</h2>\n")?;
        if o.workers.is_empty() {
            return f.write_str("<p class=\"muted\">None.</p>\n");
        }
        f.write_str(
            "<table>\n<thead><tr><th>Worker</th><th>Queue</th><th>Last seen</th></tr></thead>\n<tbody>\n",
        )?;
        for w in &o.workers {
            writeln!(
                f,
                "<tr><td class=\"id\">{}</td><td>{}</td><td>{} ago</td></tr>",
                Esc(&w.name),
                Esc(&w.queue),
                human_duration(chrono::TimeDelta::seconds(w.seconds_since_seen as i64))
            )?;
        }
        f.write_str("</tbody>\n</table>\n")
    }

    fn machines(&self, f: &mut Formatter<'_>) -> fmt::Result {
        writeln!(f, "<h2>Managed machines ({})</h2>", self.machines.len())?;
        if self.machines.is_empty() {
            return f.write_str("<p class=\"muted\">None.</p>\n");
        }
        f.write_str(
            "<table>\n<thead><tr><th>Machine</th><th>Device</th><th>Reservation</th>\
             <th>Hostname</th><th>Assimilated</th></tr></thead>\n<tbody>\n",
        )?;
        for m in self.machines {
            write!(
                f,
                "<tr><td class=\"id\">{}</td><td>{}</td><td>",
                m.machine_id,
                DeviceId(&m.provider_id)
            )?;
            if let Some(r) = m.reservation_id {
                Link(Kind::Reservation, r).fmt(f)?;
            }
            writeln!(
                f,
                "</td><td>{}</td><td>{}</td></tr>",
                Esc(m.hostname.as_deref().unwrap_or("")),
                Time(m.assimilated_at)
            )?;
        }
        f.write_str("</tbody>\n</table>\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            Esc(r#"<a href="x">Tom & 'Jerry'</a>"#).to_string(),
            "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;"
        );
        assert_eq!(Esc("plain").to_string(), "plain");
    }

    #[test]
    fn links_ids_in_bodies_and_escapes_the_rest() {
        let device = Uuid::new_v4();
        let body = serde_json::json!({
            "device": device,
            "unknown_devices": [device],
            "reason": "<b>",
            "run": "not-a-link",
        });
        let html = Body(&body).to_string();
        assert_eq!(
            html.matches(&format!("href=\"/device/{device}\"")).count(),
            2
        );
        assert!(html.contains("&lt;b&gt;"));
        assert!(!html.contains("<b>"));
    }
}
