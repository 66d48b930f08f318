//! What the log hands back: an event as stored, and what can go wrong with
//! the log. Apart from `store`, so that the views can name them without
//! depending on the module that calls them.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::event::Event;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("event {position} ({event_type} v{version}) does not decode: {source}")]
    Corrupt {
        position: i64,
        event_type: String,
        version: i32,
        source: serde_json::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub position: i64,
    pub event_id: Uuid,
    pub stream: String,
    pub event: Event,
    pub job_id: Option<String>,
    pub recorded_at: DateTime<Utc>,
    pub tx_id: i64,
}
