//! `shepherd-bench`: measures shepherd on this machine. It starts the
//! fake in-process, `shepherd` worker processes from the binary beside it
//! (build both: `scripts/bench` does), and its own helper processes.

use std::process::ExitCode;

use clap::Parser;
use shepherd_bench::BenchCommand;
use shepherd_workers::logging;

#[derive(Debug, Parser)]
#[command(
    name = "shepherd-bench",
    version,
    about = "Measure shepherd on this machine (creates and drops its own databases)"
)]
struct Cli {
    #[command(flatten)]
    logging: logging::LoggingArgs,

    #[command(subcommand)]
    command: BenchCommand,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Its bulk statements are slow by design.
    if let Err(e) = logging::init(&cli.logging, "info,sqlx=error") {
        eprintln!("shepherd-bench: {e}");
        return ExitCode::from(2);
    }
    let result = tokio::runtime::Runtime::new()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(shepherd_bench::run(cli.command)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shepherd-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
