//! shepherd's domain: the providers' API clients (Metal, and Latitude.sh
//! not yet wired to the jobs), the event log and its views, and the job
//! handlers. Process concerns (flags, signals,
//! listeners) live in the `workers` package.

pub mod cluster;
pub mod config;
pub mod db;
pub mod events;
pub mod fleet;
pub mod jobs;
pub mod latitude;
pub mod limiter;
pub mod metal;
pub mod provider;
pub mod secret;
