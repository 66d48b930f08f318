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

    /// Log filter, e.g. `info` or `shepherd=debug,info`
    #[arg(long, global = true, env = "SHEPHERD_LOG", default_value = "info")]
    pub log: String,
}

pub fn init(args: &LoggingArgs) -> Result<(), String> {
    let filter = EnvFilter::try_new(&args.log)
        .map_err(|e| format!("--log {:?} is not a valid log filter: {e}", args.log))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match args.log_format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    result.map_err(|e| format!("cannot set up logging: {e}"))
}
