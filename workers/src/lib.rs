//! shepherd's processes: the CLI's subcommands, the queue runtime that binds
//! the domain's job handlers to apalis, the scheduler, and the operator
//! surfaces. The binary (`main.rs`) only parses flags and reports errors.

pub mod bench;
pub mod database;
pub mod demo;
pub mod enqueue;
pub mod fake_metal;
pub mod http;
pub mod inspect;
pub mod logging;
pub mod operate;
pub mod runtime;
pub mod scheduler;
pub mod settings;
pub mod shutdown;
pub mod sweeper;
pub mod table;
pub mod worker;
