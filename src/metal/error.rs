//! What went wrong with a Metal API call, phrased as what the caller should do.
//!
//! Messages name the operation and the status, never the token or headers:
//! error text ends up in logs and events.

use std::time::Duration;

use uuid::Uuid;

use super::Operation;

pub use crate::provider::ErrorClass;

#[derive(Debug, thiserror::Error)]
pub enum MetalError {
    #[error("{op}: not found (404)")]
    NotFound { op: Operation },

    #[error("{op}: not authorised ({status}): check the API token and project")]
    Unauthorized { op: Operation, status: u16 },

    #[error("{op}: rejected as invalid ({status}): {}", messages.join("; "))]
    Invalid {
        op: Operation,
        status: u16,
        messages: Vec<String>,
    },

    #[error("{op}: rate limited (429){}", retry_after.map(|d| format!(", retry after {d:?}")).unwrap_or_default())]
    RateLimited {
        op: Operation,
        retry_after: Option<Duration>,
    },

    #[error("{op}: transient failure: {reason}")]
    Transient { op: Operation, reason: String },

    #[error("{op}: outcome unknown after {attempts} attempts: {reason}")]
    Ambiguous {
        op: Operation,
        attempts: u32,
        reason: String,
    },

    #[error("reservation {reservation} was taken by another party (device {device:?})")]
    RaceLost {
        reservation: Uuid,
        device: Option<Uuid>,
    },

    #[error("reservation {reservation} is not provisionable")]
    NotProvisionable { reservation: Uuid },

    #[error("{op}: undecodable answer (status {status}): {detail}; body starts: {excerpt:?}")]
    Undecodable {
        op: Operation,
        status: u16,
        detail: String,
        excerpt: String,
    },

    #[error("{op}: deadline exceeded")]
    DeadlineExceeded { op: Operation },

    /// Not sent: the caller's fence refused right before the request left.
    #[error("{op}: not sent: {reason}")]
    NotSent { op: Operation, reason: String },

    #[error("refused: {0}")]
    Refused(String),
}

impl MetalError {
    pub fn class(&self) -> ErrorClass {
        match self {
            MetalError::Transient { .. } | MetalError::NotSent { .. } => ErrorClass::Transient,
            MetalError::RateLimited { .. } => ErrorClass::RateLimited,
            MetalError::RaceLost { .. } => ErrorClass::RaceLost,
            MetalError::Ambiguous { .. } => ErrorClass::Ambiguous,
            MetalError::DeadlineExceeded { .. } => ErrorClass::Cancelled,
            // A garbled answer from a proxy or an overloaded server is worth
            // another try; the retry budget bounds the cost if it is not.
            MetalError::Undecodable { status, .. } if *status >= 500 => ErrorClass::Transient,
            MetalError::NotFound { .. }
            | MetalError::Unauthorized { .. }
            | MetalError::Invalid { .. }
            | MetalError::NotProvisionable { .. }
            | MetalError::Undecodable { .. }
            | MetalError::Refused(_) => ErrorClass::Permanent,
        }
    }

    /// Worth another attempt inside this call. A fence's refusal is not:
    /// what it guards (the unit's lock, the owner) is gone for this run,
    /// and only a new run, with a lock of its own, may send.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, MetalError::NotSent { .. })
            && matches!(
                self.class(),
                ErrorClass::Transient | ErrorClass::RateLimited
            )
    }
}

/// Classifies a non-success HTTP status. 400, 401, 403, 404, 409 and 422 are
/// final; 429 and 5xx are worth another attempt.
pub(crate) fn from_status(
    op: Operation,
    status: u16,
    messages: Vec<String>,
    retry_after: Option<Duration>,
) -> MetalError {
    match status {
        401 | 403 => MetalError::Unauthorized { op, status },
        404 => MetalError::NotFound { op },
        429 => MetalError::RateLimited { op, retry_after },
        500..=599 => MetalError::Transient {
            op,
            reason: if messages.is_empty() {
                format!("server error {status}")
            } else {
                format!("server error {status}: {}", messages.join("; "))
            },
        },
        _ => MetalError::Invalid {
            op,
            status,
            messages,
        },
    }
}

/// A short, printable start of a body for error text: enough to recognise a
/// proxy's HTML page, never a whole megabyte.
pub(crate) fn excerpt(body: &[u8]) -> String {
    const MAX: usize = 200;
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX)]);
    let mut s: String = text
        .chars()
        .filter(|c| !c.is_control() || *c == ' ')
        .collect();
    if body.len() > MAX {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_names_are_the_stored_ones() {
        for class in [
            ErrorClass::Transient,
            ErrorClass::RateLimited,
            ErrorClass::Permanent,
            ErrorClass::RaceLost,
            ErrorClass::Ambiguous,
            ErrorClass::Cancelled,
        ] {
            assert_eq!(
                serde_json::to_value(class).unwrap(),
                serde_json::Value::from(class.as_str())
            );
        }
    }

    #[test]
    fn permanent_statuses_are_never_retryable() {
        for status in [400, 401, 403, 404, 409, 422] {
            let e = from_status(Operation::CreateDevice, status, vec![], None);
            assert!(!e.is_retryable(), "{status} must not be retried");
        }
        for status in [429, 500, 502, 503, 504] {
            let e = from_status(Operation::CreateDevice, status, vec![], None);
            assert!(e.is_retryable(), "{status} must be retried");
        }
    }

    #[test]
    fn excerpt_is_bounded() {
        let body = vec![b'x'; 10_000];
        assert!(excerpt(&body).chars().count() <= 201);
    }
}
