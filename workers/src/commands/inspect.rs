//! Read-only views for people and scripts: `machines`, `sinbin`, `events`
//! and `views rebuild`.

use std::time::Duration;

use chrono::Utc;
use clap::{Args, Subcommand};
use shepherd::events::store::Follower;
use shepherd::events::views;

use crate::commands::database::DatabaseArgs;
use crate::table::{Table, human_duration, print_event};

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct MachinesArgs {
    #[command(subcommand)]
    command: Option<MachinesCommand>,
    #[command(flatten)]
    list: ListArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum MachinesCommand {
    /// Record that a machine the provider no longer has is no longer managed
    Release(Box<crate::commands::operate::ReleaseArgs>),
    /// Delete one machine at the provider, through the deletion job (on
    /// Metal its reservation becomes free and, with room under the limit,
    /// is provisioned again; in a Latitude.sh pool its place is filled
    /// again)
    Deprovision(crate::commands::operate::MachineActionArgs),
    /// Keep a machine from ever being deleted by shepherd (scale-in
    /// protection)
    Protect(crate::commands::operate::MachineActionArgs),
    /// Let shepherd delete a machine again
    Unprotect(crate::commands::operate::MachineActionArgs),
    /// Let a leaving machine go (the `ack` leave hook's answer)
    Ack(crate::commands::operate::AckArgs),
}

pub async fn machines(args: MachinesArgs) -> anyhow::Result<()> {
    use crate::commands::operate;
    match args.command {
        Some(MachinesCommand::Release(release)) => return operate::release(*release).await,
        Some(MachinesCommand::Deprovision(a)) => return operate::deprovision(a).await,
        Some(MachinesCommand::Protect(a)) => return operate::protect(a, true).await,
        Some(MachinesCommand::Unprotect(a)) => return operate::protect(a, false).await,
        Some(MachinesCommand::Ack(a)) => return operate::ack(a).await,
        None => {}
    }
    let args = args.list;
    let pool = args.db.connect(2).await?;
    let mut conn = pool.acquire().await?;
    let state = views::read_live(&mut conn).await?;
    // Protection as it decides: carried over from a device's earlier life.
    let protected = shepherd::fleet::protected_devices(&mut conn).await?;
    let mut machines: Vec<_> = state
        .machines
        .into_values()
        .map(|mut m| {
            m.protected = protected.contains(&m.provider_id);
            m
        })
        .collect();
    machines.sort_by_key(|m| (m.assimilated_at, m.machine_id));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&machines)?);
        return Ok(());
    }
    let leaving: std::collections::HashMap<uuid::Uuid, String> = state
        .pending_deletions
        .values()
        .map(|d| (d.machine_id, d.cause.clone()))
        .collect();
    let mut t = Table::new(&[
        "MACHINE",
        "DEVICE",
        "UNIT",
        "HOSTNAME",
        "ASSIMILATED",
        "STATE",
    ]);
    for m in &machines {
        let mut state = vec![];
        if m.protected {
            state.push("protected".to_string());
        }
        if let Some(cause) = leaving.get(&m.machine_id) {
            state.push(format!("leaving ({cause})"));
        }
        t.row(vec![
            m.machine_id.to_string(),
            m.provider_id.clone(),
            m.reservation_id.map(|r| r.to_string()).unwrap_or_default(),
            m.hostname.clone().unwrap_or_default(),
            m.assimilated_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            state.join(", "),
        ]);
    }
    print!("{}", t.render());
    println!("{} managed machines", machines.len());
    Ok(())
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct SinbinArgs {
    #[command(subcommand)]
    command: Option<crate::commands::operate::SinbinCommand>,
    #[command(flatten)]
    list: ListArgs,
    /// Also list expired penalties (kept for their failure counts)
    #[arg(long)]
    all: bool,
}

pub async fn sinbin(args: SinbinArgs) -> anyhow::Result<()> {
    if let Some(crate::commands::operate::SinbinCommand::Clear(clear)) = args.command {
        return crate::commands::operate::sinbin_clear(clear).await;
    }
    let pool = args.list.db.connect(2).await?;
    let mut conn = pool.acquire().await?;
    let now: chrono::DateTime<Utc> = sqlx::query_scalar("select now()")
        .fetch_one(&mut *conn)
        .await?;
    let state = views::read_live(&mut conn).await?;
    let mut rows: Vec<_> = state
        .sinbin
        .into_values()
        .filter(|p| args.all || p.is_active(now))
        .collect();
    rows.sort_by_key(|p| std::cmp::Reverse(p.until));
    if args.list.json {
        let json: Vec<_> = rows
            .iter()
            .map(|p| {
                serde_json::json!({
                    "reservation_id": p.reservation_id,
                    "until": p.until,
                    "cause": p.cause,
                    "failures": p.failures,
                    "penalised": p.is_active(now),
                    "seconds_left": (p.until - now).num_seconds().max(0),
                    "scope": p.scope,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    let mut t = Table::new(&["RESERVATION", "TIME LEFT", "FAILURES", "CAUSE"]);
    for p in &rows {
        t.row(vec![
            p.reservation_id.to_string(),
            if p.is_active(now) {
                human_duration(p.until - now)
            } else {
                "expired".into()
            },
            p.failures.to_string(),
            match &p.scope {
                Some(scope) => format!("{} (holds back {scope})", p.cause),
                None => p.cause.clone(),
            },
        ]);
    }
    print!("{}", t.render());
    println!(
        "{} penalised",
        rows.iter().filter(|p| p.is_active(now)).count()
    );
    Ok(())
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    #[command(flatten)]
    list: ListArgs,
    /// Only this stream, e.g. `reservation/<id>` or `device/<id>`
    #[arg(long)]
    stream: Option<String>,
    /// How many of the latest events to show first
    #[arg(long, default_value_t = 50)]
    last: i64,
    /// Keep printing events as they are committed
    #[arg(long)]
    follow: bool,
}

pub async fn events(args: EventsArgs) -> anyhow::Result<()> {
    let pool = args.list.db.connect(2).await?;
    if !args.follow {
        // A listing is by position: cheap, and exact once writers are done.
        let mut events = match &args.stream {
            Some(s) => shepherd::events::store::read_stream(&pool, s).await?,
            None => shepherd::events::store::read_recent(&pool, args.last.max(0)).await?,
        };
        let keep = args.last.max(0) as usize;
        if events.len() > keep {
            events.drain(..events.len() - keep);
        }
        for e in &events {
            print_event(e, args.list.json)?;
        }
        return Ok(());
    }
    // Following reads the feed in commit-safe order from the start, so the
    // backlog and what follows it meet exactly: nothing skipped, nothing twice.
    let mut follower = match &args.stream {
        Some(s) => Follower::from_start().stream(s.clone()),
        None => Follower::from_start(),
    };
    let mut backlog = Vec::new();
    loop {
        let batch = follower.poll(&pool).await?;
        if batch.is_empty() {
            break;
        }
        backlog.extend(batch);
        let keep = args.last.max(0) as usize;
        if backlog.len() > keep {
            backlog.drain(..backlog.len() - keep);
        }
    }
    for e in &backlog {
        print_event(e, args.list.json)?;
    }
    let stop = crate::services::shutdown::signalled();
    tokio::pin!(stop);
    loop {
        let batch = follower.poll(&pool).await?;
        for e in &batch {
            print_event(e, args.list.json)?;
        }
        if batch.is_empty() {
            tokio::select! {
                _ = &mut stop => return Ok(()),
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum ViewsCommand {
    /// Replay the whole log into fresh views and report any difference from
    /// the live ones
    Rebuild(RebuildArgs),
}

#[derive(Debug, Args)]
pub struct RebuildArgs {
    #[command(flatten)]
    list: ListArgs,
    /// Replace the live views with the rebuilt ones
    #[arg(long)]
    replace: bool,
}

pub async fn views(command: ViewsCommand) -> anyhow::Result<()> {
    let ViewsCommand::Rebuild(args) = command;
    let pool = args.list.db.connect(2).await?;
    let started = std::time::Instant::now();
    let by = super::cli_user();
    let report = views::rebuild_by(&pool, args.replace.then_some(by.as_str())).await?;
    if args.list.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "replayed {} events in {:.2?}: {} machines, {} sinbin rows, {} pending creations, {} unassimilated devices",
            report.events,
            started.elapsed(),
            report.machines,
            report.penalties,
            report.pending_creations,
            report.unassimilated_devices
        );
        if report.differences.is_empty() {
            println!("rebuilt views equal the live views");
        } else {
            println!("{} differences:", report.differences.len());
            for d in &report.differences {
                println!("  {d}");
            }
            if report.replaced {
                println!("live views replaced by the rebuilt ones");
            }
        }
    }
    if !report.differences.is_empty() && !report.replaced {
        // A script checking consistency wants a non-zero exit.
        std::process::exit(3);
    }
    Ok(())
}
