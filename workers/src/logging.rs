//! Log set-up: human-readable by default, JSON for log pipelines.

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Args)]
pub struct LoggingArgs {
    /// Log format
    #[arg(
        long,
        global = true,
        env = "SHEPHERD_LOG_FORMAT",
        default_value = "human"
    )]
    pub log_format: LogFormat,

    /// Log filter, e.g. `debug` or `shepherd=debug,info` [default: info;
    /// warn for the demo, whose progress is on stdout]
    #[arg(long, global = true, env = "SHEPHERD_LOG")]
    pub log: Option<String>,
}

pub fn init(args: &LoggingArgs, default: &str) -> Result<(), String> {
    let wanted = args.log.as_deref().unwrap_or(default);
    let filter = EnvFilter::try_new(wanted)
        .map_err(|e| format!("--log {wanted:?} is not a valid log filter: {e}"))?;
    // Colour only for a person at a terminal: a log file or a pipe gets
    // plain text, and NO_COLOR (no-color.org) turns it off everywhere.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let result = match args.log_format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    result.map_err(|e| format!("cannot set up logging: {e}"))
}
