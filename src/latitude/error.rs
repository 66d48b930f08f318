//! What a Latitude.sh call can end in, and what the caller should do about
//! each (`ErrorClass`).

use std::time::Duration;

use crate::provider::ErrorClass;

#[derive(Debug, thiserror::Error)]
pub enum LatitudeError {
    #[error("{call}: not found (404)")]
    NotFound { call: &'static str },
    #[error("{call}: not authorised ({status}): check the API key and project")]
    Unauthorized { call: &'static str, status: u16 },
    #[error("{call}: no stock of the plan in the site (422 SERVERS_OUT_OF_STOCK): {detail}")]
    OutOfStock { call: &'static str, detail: String },
    #[error("{call}: refused ({status}{}): {detail}", code.as_deref().map(|c| format!(" {c}")).unwrap_or_default())]
    Refused {
        call: &'static str,
        status: u16,
        code: Option<String>,
        detail: String,
    },
    #[error("{call}: rate limited (429){}", retry_after.map(|d| format!(", retry after {d:?}")).unwrap_or_default())]
    RateLimited {
        call: &'static str,
        retry_after: Option<Duration>,
    },
    #[error("{call}: transient failure: {reason}")]
    Transient { call: &'static str, reason: String },
    /// No connection could be opened: nothing was sent.
    #[error("{call}: {reason}")]
    ConnectFailed { call: &'static str, reason: String },
    /// Not sent: the caller's fence refused right before the request left.
    #[error("{call}: not sent: {reason}")]
    NotSent { call: &'static str, reason: String },
    /// A create whose answer was not seen: the server may exist.
    #[error("{call}: outcome unknown: {reason}")]
    Ambiguous { call: &'static str, reason: String },
    /// An id that is not of the shape the API gives (`sv_…`: letters,
    /// digits, `_` and `-`): it never enters a path, and nothing is sent.
    #[error(
        "{call}: {id:?} is not a server id (letters, digits, _ and -, at most 64): nothing was sent"
    )]
    BadId { call: &'static str, id: String },
    #[error("{call}: undecodable answer (status {status}): {detail}")]
    Undecodable {
        call: &'static str,
        status: u16,
        detail: String,
    },
}

impl LatitudeError {
    pub fn class(&self) -> ErrorClass {
        match self {
            LatitudeError::Transient { .. }
            | LatitudeError::NotSent { .. }
            | LatitudeError::ConnectFailed { .. } => ErrorClass::Transient,
            LatitudeError::RateLimited { .. } => ErrorClass::RateLimited,
            LatitudeError::Ambiguous { .. } => ErrorClass::Ambiguous,
            LatitudeError::Undecodable { status, .. } if *status >= 500 => ErrorClass::Transient,
            _ => ErrorClass::Permanent,
        }
    }

    pub(super) fn is_retryable(&self) -> bool {
        matches!(
            self.class(),
            ErrorClass::Transient | ErrorClass::RateLimited
        )
    }
}
