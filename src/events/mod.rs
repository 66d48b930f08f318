//! The event log and the views built from it.
//!
//! `event` defines what can happen, `store` appends and reads the log,
//! `views` folds it into the tables the rest of shepherd reads.

pub mod event;
pub mod store;
pub mod stored;
pub mod views;

pub use event::{Event, Stream};
pub use store::{Cursor, Follower, NewEvent, StoreError, StoredEvent, record};
