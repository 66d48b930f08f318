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
use axum::extract::{Path, Query, State};
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
use shepherd::events::views::ManagedMachine;
use shepherd::fleet::{self, Overview};
use shepherd::metal::ClientMetrics;
use sqlx::PgPool;
use tokio::net::TcpListener;
use uuid::Uuid;

use crate::commands::operate::Words;
use crate::services::runtime::Stop;
use crate::table::human_duration;

/// What `prometheus_client::encoding::text::encode` writes.
pub(super) const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Orchestrators probe often and give up quickly; a hung database must read
/// as "not ready" well before their own timeout.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(2);
pub(super) const RECENT_EVENTS: i64 = 20;

#[derive(Clone)]
pub struct HttpState {
    /// The pages' own pool.
    pub pool: PgPool,
    /// The pool this process's queue and jobs share (the scheduler's
    /// queue), for the connection figures of `/metrics`.
    pub work_pool: Option<PgPool>,
    pub client_metrics: ClientMetrics,
    /// This process's job run times (empty where no jobs run).
    pub job_metrics: crate::services::runtime::JobMetrics,
    /// The credential that turns the pages' actions on; `None`: read-only.
    pub operator_token: Option<shepherd::secret::ApiToken>,
    /// The provider this process speaks to, for names an operator reads
    /// (a Latitude place as `web/3`); `None` where none is configured.
    pub provider: Option<std::sync::Arc<dyn shepherd::provider::Provider>>,
    /// The names the pages answer and the proxies trusted to say who asked.
    pub edges: Edges,
    /// The cluster's provider as recorded, for a process that speaks to
    /// none (the scheduler): its pages use that provider's words.
    pub cluster_provider: Option<String>,
}

impl HttpState {
    /// The unit's readable name, where the provider has one.
    pub(super) fn unit_label(&self, unit: Uuid) -> Option<String> {
        self.provider.as_ref()?.unit_label(unit)
    }

    /// How the pages speak of units and machines: in the words of the
    /// provider this process speaks to (reservations and devices on Metal,
    /// places and servers on Latitude.sh), with a unit's readable name.
    pub(super) fn voice(&self) -> Voice<'_> {
        Voice {
            words: Words::named(
                self.provider
                    .as_ref()
                    .map(|p| p.name())
                    .or(self.cluster_provider.as_deref())
                    .unwrap_or(""),
            ),
            state: self,
        }
    }
}

pub(super) struct Voice<'a> {
    pub(super) words: Words,
    state: &'a HttpState,
}

impl Voice<'_> {
    pub(super) fn label(&self, unit: Uuid) -> Option<String> {
        self.state.unit_label(unit)
    }
}

/// `word` with a capital first letter, for a heading.
pub(super) fn capital(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// Serves until `stop` resolves. Binds nothing itself: the caller passes the
/// listener (so tests can bind port 0).
pub async fn serve(listener: TcpListener, state: HttpState, stop: Stop) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving the status page and metrics");
    }
    // The peer's address, for throttling credential checks per source.
    let app = router(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(stop.wait())
        .await
}

pub(super) fn router(state: HttpState) -> Router {
    Router::new()
        .route("/", get(front_page))
        .route("/reservation/{id}", get(reservation_page))
        .route("/device/{id}", get(device_page))
        .route("/jobs", get(jobs_page))
        .route("/login", get(login_page).post(login))
        .route("/logout", axum::routing::post(logout))
        .route("/actions/{action}", axum::routing::post(act))
        .route("/machines", get(machines_page))
        .route("/jobs/{id}", get(job_page))
        .route("/charts", get(charts_page))
        .route("/events", get(events_page))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(no_page)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::middleware::from_fn(address_limit))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            edges::edges,
        ))
        .with_state(state)
}

/// The longest address a page answers: a search, a filter and a page
/// number fit many times over. (hyper itself refuses one over 64 KiB before
/// any of this runs, with an empty 414.)
const LONGEST_ADDRESS: usize = 8 * 1024;

async fn address_limit(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let length = request
        .uri()
        .path_and_query()
        .map_or(0, |p| p.as_str().len());
    if length > LONGEST_ADDRESS {
        return (
            StatusCode::URI_TOO_LONG,
            message(
                "address too long",
                &format!(
                    "this address has {length} characters; the pages take at most {LONGEST_ADDRESS}"
                ),
            ),
        )
            .into_response();
    }
    next.run(request).await
}

/// A page, not an empty body, for an address nothing serves.
async fn no_page(uri: axum::http::Uri) -> Failure {
    Failure::NotFound(format!(
        "nothing is served at {}; the pages are /, /jobs, /machines, /events and /charts",
        uri.path()
    ))
}

async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        message(
            "method not allowed",
            &format!("{} does not take {method}", uri.path()),
        ),
    )
        .into_response()
}

// ---- failures ----

/// Why a request got no page.
pub(super) enum Failure {
    /// The database did not answer. The cause goes to the log, not to
    /// whoever can reach the metrics port.
    Unavailable,
    Internal(String),
    BadRequest(String),
    NotFound(String),
    Unauthorized(String),
    Forbidden(String),
    /// The action does not fit the thing's state; the text says why.
    Conflict(String),
    /// Too many wrong credentials from this source; try again after the
    /// seconds given.
    TooManyRequests(String, u64),
}

impl Failure {
    /// The status, the page's title and what it says.
    fn parts(self) -> (StatusCode, &'static str, String) {
        match self {
            Failure::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "the database is unavailable",
                "the database is unavailable; see this worker's log".into(),
            ),
            Failure::Internal(text) => (StatusCode::INTERNAL_SERVER_ERROR, "internal error", text),
            Failure::BadRequest(text) => (StatusCode::BAD_REQUEST, "bad request", text),
            Failure::NotFound(text) => (StatusCode::NOT_FOUND, "not found", text),
            Failure::Unauthorized(text) => (StatusCode::UNAUTHORIZED, "not logged in", text),
            Failure::Forbidden(text) => (StatusCode::FORBIDDEN, "forbidden", text),
            Failure::Conflict(text) => (StatusCode::CONFLICT, "refused", text),
            Failure::TooManyRequests(text, _) => (
                StatusCode::TOO_MANY_REQUESTS,
                "too many wrong credentials",
                text,
            ),
        }
    }

    /// The page, with a link back to `back` (a path of this site) where an
    /// operator came from a form.
    pub(super) fn page(self, back: Option<&str>) -> Response {
        let retry_after = match &self {
            Failure::TooManyRequests(_, wait) => Some(*wait),
            _ => None,
        };
        let (status, title, text) = self.parts();
        let mut response = (status, message_back(title, &text, back)).into_response();
        if let Some(wait) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, wait.into());
        }
        response
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        self.page(None)
    }
}

pub(super) fn database_failure(what: &str, error: sqlx::Error) -> Failure {
    // The SQL functions and the event log's checks refuse bad input
    // (`shepherd.require`) with a message for the operator: a refusal, not
    // an outage.
    if let sqlx::Error::Database(e) = &error {
        match e.code().as_deref() {
            Some("22023") => return Failure::BadRequest(e.message().to_string()),
            // The SQL functions' "already": a machine leaving already.
            Some("23505") if e.constraint().is_none() => {
                return Failure::Conflict(shepherd::text::bounded(e.message(), 500));
            }
            // The pages' database role may not do this: a deployment
            // whose console connects as a role that may not operate.
            Some("42501") => {
                tracing::warn!(%error, "{what}: refused by the database's roles");
                return Failure::Forbidden(format!(
                    "the database refused this console's role: {} (give the console an \
                     operator's role with --console-database-url; docs/security.md)",
                    shepherd::text::bounded(e.message(), 500)
                ));
            }
            _ => {}
        }
    }
    tracing::warn!(%error, "{what}: the database did not answer");
    Failure::Unavailable
}

pub(super) fn store_failure(what: &str, error: StoreError) -> Failure {
    match error {
        StoreError::Database(e) => database_failure(what, e),
        corrupt @ (StoreError::Corrupt { .. } | StoreError::Invalid(_)) => {
            tracing::warn!(error = %corrupt, "{what}: the event log does not decode");
            Failure::Internal(corrupt.to_string())
        }
    }
}

// ---- probes ----

pub(super) async fn healthz() -> &'static str {
    "ok"
}

pub(super) async fn readyz(State(state): State<HttpState>) -> (StatusCode, &'static str) {
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

mod actions;
mod charts;
mod credential;
mod edges;
mod events;
mod fleet_actions;
mod html;
mod jobs;
mod machines;
mod metrics;
mod outcome;
mod pages;
mod sessions;
mod status_page;

use actions::*;
use charts::*;
pub use credential::too_weak;
pub use edges::Edges;
use events::*;
use html::*;
use jobs::*;
use machines::*;
use metrics::*;
use pages::*;
use sessions::*;
use status_page::*;
