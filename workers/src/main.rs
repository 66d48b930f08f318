//! `shepherd`: the one binary operators run. Each subcommand lives in its own
//! module; this file only parses flags, sets up logging and maps failures to
//! a one-line message and a non-zero exit.

use shepherd_workers::commands::{
    console, cost, database, demo, enqueue, fake_latitude, fake_metal, inspect, operate, pools,
    scheduler, worker,
};
use shepherd_workers::{logging, settings};

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "shepherd",
    version,
    about = "Turns a bare-metal provider's capacity (Latitude.sh pools, Equinix Metal hardware \
             reservations) into managed machines, kept as the cluster's pools declare",
    propagate_version = true
)]
struct Cli {
    #[command(flatten)]
    logging: logging::LoggingArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a whole cluster against a fake provider (Metal, or Latitude.sh with
    /// --provider latitude) and show it working
    Demo(demo::DemoArgs),
    /// Run workers for every job kind (and optionally the scheduler)
    Worker(Box<worker::WorkerArgs>),
    /// Enqueue one Reconcile per period, cluster-wide
    Scheduler(scheduler::SchedulerArgs),
    /// Exit 0 if this host's worker or scheduler is ready (for container
    /// healthchecks), else 1
    Healthcheck(scheduler::HealthcheckArgs),
    /// Enqueue a manual job
    #[command(subcommand)]
    Enqueue(enqueue::EnqueueCommand),
    /// How the fleet stands: managed vs limit, in flight, sinbin, queue, last pass, workers
    Status(operate::StatusArgs),
    /// What the next reconcile would do, without doing it
    Plan(Box<operate::PlanArgs>),
    /// The events of one unit (reservation, pool place) or machine, in order
    #[command(subcommand)]
    History(operate::HistoryOf),
    /// Retry or cancel one job
    #[command(subcommand)]
    Job(operate::JobCommand),
    /// Stop new creations (or, with --deletions, deletions) cluster-wide;
    /// reconciles go on reporting
    Pause(operate::PauseArgs),
    /// Let new creations (or, with --deletions, deletions) start again
    Resume(operate::ResumeArgs),
    /// Create the database if needed and apply the schema
    Migrate(database::DatabaseArgs),
    /// List the machines shepherd manages; release, deprovision, protect one, or let it leave
    Machines(inspect::MachinesArgs),
    /// Show or change the cluster's settings (limit, rates, penalties, ...)
    #[command(subcommand)]
    Settings(operate::SettingsCommand),
    /// List penalised units (reservations, pool places) with cause and time left, or clear them
    Sinbin(inspect::SinbinArgs),
    /// Show the event log, optionally one stream, optionally following it
    Events(inspect::EventsArgs),
    /// Check or rebuild the views from the event log
    #[command(subcommand)]
    Views(inspect::ViewsCommand),
    /// The cluster's pools (Latitude.sh): list, set, remove, apply a file, plan
    #[command(subcommand)]
    Pools(pools::PoolsCommand),
    /// Machine-hours and cost per pool and day, from the event log
    Cost(cost::CostArgs),
    /// The console's sessions: list them, or end them all
    #[command(subcommand)]
    Console(console::ConsoleCommand),
    /// Serve a fake Equinix Metal API from memory, with fault injection
    FakeMetal(fake_metal::FakeMetalArgs),
    /// Serve a fake Latitude.sh API from memory (stock, rate limits), with
    /// fault injection
    FakeLatitude(fake_latitude::FakeLatitudeArgs),
}

/// A reader that goes away (`shepherd status | head -1`) ends the command
/// quietly, as Unix tools do: `println!` panics on a closed pipe, and that
/// one panic is turned into a clean exit. Any other panic is reported as
/// usual.
fn exit_quietly_when_the_reader_goes_away() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        report(info);
    }));
}

fn main() -> ExitCode {
    exit_quietly_when_the_reader_goes_away();
    let matches = Cli::command().get_matches();
    settings::note_explicit(&matches);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let default_log = match cli.command {
        // Postgres notices ("already exists, skipping") are noise to operators.
        Command::Demo(_) => "warn,sqlx::postgres::notice=error",
        _ => "info,sqlx::postgres::notice=error",
    };
    if let Err(e) = logging::init(&cli.logging, default_log) {
        eprintln!("shepherd: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("shepherd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Demo(args) => {
                let url = args.database_url.clone();
                let summary = demo::run(args, worker::stop_on_signal()).await?;
                demo::print_summary(&summary, &url);
                Ok(())
            }
            Command::Worker(args) => worker::worker(*args).await,
            Command::Scheduler(args) => scheduler::scheduler(args).await,
            Command::Healthcheck(args) => scheduler::healthcheck(args).await,
            Command::Enqueue(command) => enqueue::enqueue(command).await,
            Command::Status(args) => operate::status(args).await,
            Command::Console(command) => console::console(command).await,
            Command::Cost(args) => cost::cost(args).await,
            Command::Plan(args) => operate::plan(*args).await,
            Command::History(of) => operate::history(of).await,
            Command::Job(command) => operate::job(command).await,
            Command::Pools(command) => pools::run(command).await,
            Command::Pause(args) => operate::pause(args).await,
            Command::Resume(args) => operate::resume(args).await,
            Command::Migrate(args) => database::migrate(args).await,
            Command::Machines(args) => inspect::machines(args).await,
            Command::Settings(command) => operate::settings(command).await,
            Command::Sinbin(args) => inspect::sinbin(args).await,
            Command::Events(args) => inspect::events(args).await,
            Command::Views(command) => inspect::views(command).await,
            Command::FakeMetal(args) => fake_metal::run(args).await,
            Command::FakeLatitude(args) => fake_latitude::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("shepherd: {}", describe(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, skipping a cause whose text the
/// message before it already carries (many errors print their source too).
/// A table that does not exist means a database never migrated, whatever
/// command met it: that is said, with the next step.
fn describe(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    let unmigrated = e.chain().any(|c| {
        let database = c
            .downcast_ref::<sqlx::Error>()
            .and_then(|e| e.as_database_error())
            .or_else(|| match c.downcast_ref::<shepherd::db::DbError>() {
                Some(shepherd::db::DbError::Query(e)) => e.as_database_error(),
                _ => None,
            });
        database.and_then(|d| d.code()).as_deref() == Some("42P01")
    });
    if unmigrated && !out.contains("shepherd migrate") {
        out.push_str(
            " (the database has no shepherd schema, or an older one: run `shepherd migrate` first)",
        );
    }
    out
}
