//! What a caller should do about a failed provider call, whichever the
//! provider: the retry loops and the job handlers decide on this, never on a
//! provider's status codes.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// Try again later; the same request may well succeed.
    Transient,
    /// The server asked us to slow down.
    RateLimited,
    /// The request itself is wrong or refused; repeating it cannot help.
    Permanent,
    /// Someone else took the reservation.
    RaceLost,
    /// A create may or may not have happened.
    Ambiguous,
    /// The call was stopped by its deadline.
    Cancelled,
}

impl ErrorClass {
    /// The name as stored in events (`transient`, `race_lost`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::RateLimited => "rate_limited",
            ErrorClass::Permanent => "permanent",
            ErrorClass::RaceLost => "race_lost",
            ErrorClass::Ambiguous => "ambiguous",
            ErrorClass::Cancelled => "cancelled",
        }
    }
}
