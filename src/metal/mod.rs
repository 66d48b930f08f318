//! Everything that speaks the Equinix Metal API: the typed models, the client
//! with its call discipline, and the fake server used by tests and the demo.

pub mod client;
pub mod discipline;
pub mod error;
pub mod model;
pub mod operation;
pub mod provider;

pub use client::{ClientConfig, CreateDevice, CreatedDevice, MetalClient, Witness};
pub use discipline::{ClientMetrics, LatencyLog, LatencyMinute, LocalPacer, Pacer, RetrySettings};
pub use error::{ErrorClass, MetalError};
pub use operation::Operation;
