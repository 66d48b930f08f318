//! shepherd's domain: the Metal API client and its fake, the event log and
//! its views, and the job handlers. Process concerns (flags, signals,
//! listeners) live in the `workers` package.

pub mod cluster;
pub mod config;
pub mod db;
pub mod events;
pub mod fleet;
pub mod jobs;
pub mod limiter;
pub mod metal;
pub mod secret;
