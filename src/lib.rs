//! shepherd's domain: the provider seam (`provider`) with the providers
//! behind it (`metal`, `latitude`), the event log and its views, and the job
//! handlers. Process concerns (flags, signals, listeners) live in the
//! `workers` package; the fake providers in `fakes`.

pub mod cluster;
pub mod config;
pub mod db;
pub mod events;
pub mod fleet;
pub mod jobs;
pub mod latitude;
pub mod limiter;
pub mod metal;
pub mod pools;
pub mod provider;
pub mod secret;
pub mod text;
