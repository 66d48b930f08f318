//! Everything that speaks the Equinix Metal API: the typed models, the client
//! with its call discipline (the shared part is the seam's,
//! `provider::discipline`), and Metal behind the seam (`provider.rs`). Its
//! fake lives in the `fakes` package.

pub mod client;
pub mod discipline;
pub mod error;
pub mod model;
pub mod operation;
pub mod provider;

pub use client::{ClientConfig, CreateDevice, CreateHint, CreatedDevice, MetalClient, Witness};
pub use discipline::{ClientMetrics, LatencyLog, LatencyMinute, LocalPacer, Pacer, RetrySettings};
pub use error::{ErrorClass, MetalError};
pub use operation::Operation;
