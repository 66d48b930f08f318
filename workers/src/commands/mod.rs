//! One-shot commands: each runs, prints, and exits with a status.

pub mod console;
pub mod database;
pub mod demo;
pub mod enqueue;
pub mod fake_latitude;
pub mod fake_metal;
pub mod inspect;
pub mod operate;
pub mod pools;
pub mod worker;
