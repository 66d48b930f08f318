//! Everything that speaks the Latitude.sh API: typed answers, a client with
//! the provider's discipline, and the provider behind the seam
//! (`provider.rs`; docs/providers.md).
//!
//! What differs from Metal and shapes the client:
//!
//! - no tags and no idempotency key on create: a create's witness is its
//!   hostname, and an outcome that was not seen is settled by looking the
//!   hostname up, never by sending the create again;
//! - reads and writes have separate budgets (60 and 20 per minute per key),
//!   so the client paces them with two pacers, and a 429's
//!   `errors[0].meta.retry_after` holds the budget it was counted against;
//! - pages without a total: the listing stops at a short page;
//! - no reservations: capacity is what an operator declares as pools
//!   (`pools.rs`: keep N of a plan in a site), bounded by stock.

pub mod client;
pub mod error;
pub mod model;
pub mod pools;
pub mod provider;

pub use client::{
    Budgets, CreateServer, Created, LatitudeClient, LatitudeConfig, LatitudeError, ListingReport,
    Servers,
};
pub use model::{Server, Stock};
pub use pools::Pool;
