//! shepherd's processes. `commands/` holds the one-shot subcommands (the
//! demo, enqueue, inspection and operator commands, and `worker`, which
//! starts the services); `services/` what a worker runs until it stops (the
//! job runtime, the scheduler, the sweep, the status page and metrics).
//! `settings` maps flags onto the domain's typed settings. The binary
//! (`main.rs`) only parses flags and reports errors.

pub mod commands;
pub mod logging;
pub mod services;
pub mod settings;
pub mod table;
