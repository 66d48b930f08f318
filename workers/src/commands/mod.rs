//! One-shot commands: each runs, prints, and exits with a status.

pub mod console;
pub mod cost;
pub mod database;
pub mod demo;
pub mod enqueue;
pub mod fake_latitude;
pub mod fake_metal;
pub mod inspect;
pub mod operate;
pub mod plan;
pub mod pools;
pub mod scheduler;
pub mod status;
pub mod worker;

/// Who runs a command, for what the log records (`cli:<name>`): `$USER`,
/// else `$LOGNAME` (cron and some containers set only one), else the uid.
pub fn cli_user() -> String {
    let name = ["USER", "LOGNAME"]
        .iter()
        .filter_map(|k| std::env::var(k).ok())
        .map(|v| v.trim().to_string())
        .find(|v| !v.is_empty());
    let name = name.unwrap_or_else(|| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self")
            .map(|m| format!("uid-{}", m.uid()))
            .unwrap_or_else(|_| "unknown".into())
    });
    format!("cli:{name}")
}
