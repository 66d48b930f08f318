//! Scenario 12: many default worker processes and a scheduler on one
//! Postgres, one Latitude.sh pool filled and then lowered at the key's
//! real budgets (60 reads and 20 writes a minute, counted by the fake).
//! What it reports is what an operator running workers for availability
//! needs to know: the most connections the cluster held at once (this
//! cluster's, and every client's on the server), the connection errors
//! the processes logged, and the fill's time against the key's write
//! bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use crate::latitude::{KEY, fake_at_budgets, open_deletion_budget};
use crate::{Server, Stage};
use clap::Args;

/// What the processes' logs say when Postgres or their pools could not
/// give them a connection.
const CONNECTION_ERRORS: &[&str] = &[
    "pool timed out",
    "too many clients",
    "remaining connection slots",
    "no connection left",
];

#[derive(Debug, Args)]
pub struct FleetBench {
    #[command(flatten)]
    pub server: Server,
    /// Worker processes, each with the release binary's defaults
    #[arg(long, default_value_t = 20)]
    pub workers: usize,
    /// The pool's count to fill
    #[arg(long, default_value_t = 40)]
    pub machines: usize,
    /// The count it is lowered to once full
    #[arg(long, default_value_t = 20)]
    pub lower_to: usize,
    /// Run the cluster through this pgbouncer (1.21 or later), started in
    /// transaction mode as docs/operations.md configures it, the processes
    /// polling (`--no-listen`)
    #[arg(long)]
    pub pgbouncer: Option<std::path::PathBuf>,
    /// The server connections that pgbouncer may open (`default_pool_size`)
    #[arg(long, default_value_t = 20)]
    pub pgbouncer_connections: u32,
}

pub async fn run(args: FleetBench) -> anyhow::Result<()> {
    let (n, low) = (args.machines.max(1), args.lower_to.min(args.machines));
    println!(
        "\n## Scenario 12: {} default workers and a scheduler on one Postgres, a Latitude.sh pool filled to {n} and lowered to {low} at the key's budgets",
        args.workers
    );
    let fake = fake_at_budgets().await?;
    // Stock for the whole pool at its site (the fake's default is 50).
    anyhow::ensure!(
        fake.set_stock("c2-small-x86", "DAL", n as u32),
        "the fake has no c2-small-x86 at DAL"
    );
    let mut stage = Stage::new(&args.server, "fleet", Default::default()).await?;
    let max_connections: String = sqlx::query_scalar("select current_setting('max_connections')")
        .fetch_one(&stage.pool)
        .await?;
    let os = "ubuntu_24_04_x64_lts";
    let pools = format!("name=web,plan=c2-small-x86,site=DAL,count={n},os={os}");
    let (url, project) = (fake.base_url(), fake.project().to_string());
    // Behind the pooler, the schema is the stage's (migrated directly), and
    // every process and command connects through it.
    let bouncer = match &args.pgbouncer {
        Some(bin) => {
            let server = shepherd::db::check_url(&stage.url)?;
            let upstream = shepherd_fakes::pgbouncer::Upstream {
                host: server.get_host().to_string(),
                port: server.get_port(),
                user: server.get_username().to_string(),
                server_connections: args.pgbouncer_connections,
            };
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let dir = stage.dir().to_path_buf();
            Some(
                shepherd_fakes::pgbouncer::Bouncer::start(bin, &dir, port, &upstream)
                    .map_err(anyhow::Error::msg)?,
            )
        }
        None => None,
    };
    let through = match &bouncer {
        Some(b) => b.url(&stage.url).map_err(anyhow::Error::msg)?,
        None => stage.url.clone(),
    };
    if let Some(b) = &bouncer {
        println!(
            "through pgbouncer in transaction mode (port {}, at most {} server connections), the processes polling",
            b.port(),
            args.pgbouncer_connections
        );
    }
    let pooled: &[&str] = if bouncer.is_some() {
        &["--console-statement-timeout", "0"]
    } else {
        &[]
    };
    let env = [
        ("DATABASE_URL", through.as_str()),
        ("SHEPHERD_PROVIDER", "latitude"),
        ("LATITUDE_API_URL", url.as_str()),
        ("LATITUDE_PROJECT", project.as_str()),
        ("LATITUDE_API_KEY", KEY),
        ("SHEPHERD_LATITUDE_POOLS", pools.as_str()),
        ("SHEPHERD_LOG", "info"),
    ];
    // Connections sampled every 100 ms: this cluster's (its processes name
    // themselves shepherd*) and every client backend on the server.
    // The bench's own two pools (its stage's and this sampler's) carry
    // another application_name, so "ours" is the cluster's processes only;
    // at the cluster's peak, its split between the listeners', the pools' and
    // the pages' pools is kept.
    let (ours, server_wide) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicI64::new(0)));
    let split = Arc::new(std::sync::Mutex::new((0i64, 0i64, 0i64)));
    // Samples that failed: a peak read from fewer samples than it seems is
    // said, not hidden.
    let missed = Arc::new(AtomicI64::new(0));
    let sampler = {
        let (ours, server_wide, split) = (ours.clone(), server_wide.clone(), split.clone());
        let missed = missed.clone();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect_with(
                (*stage.pool.connect_options())
                    .clone()
                    .application_name("bench"),
            )
            .await?;
        tokio::spawn(async move {
            loop {
                // The cluster's: every backend on its database but the
                // bench's own (behind a pooler, the pooler's server
                // connections carry whichever client's name they last ran).
                let row: Result<(i64, i64, i64, i64, i64), _> = sqlx::query_as(
                    "select count(*) filter (where datname = current_database()
                                               and application_name <> 'bench'),
                            count(*) filter (where backend_type = 'client backend'),
                            count(*) filter (where datname = current_database()
                                               and application_name = 'shepherd-listen'),
                            count(*) filter (where datname = current_database()
                                               and application_name = 'shepherd'),
                            count(*) filter (where datname = current_database()
                                               and application_name = 'shepherd-console')
                     from pg_stat_activity",
                )
                .fetch_one(&pool)
                .await;
                match row {
                    Ok((o, s, q, j, p)) => {
                        if o > ours.fetch_max(o, Ordering::Relaxed) {
                            *split.lock().expect("the split's lock") = (q, j, p);
                        }
                        server_wide.fetch_max(s, Ordering::Relaxed);
                    }
                    Err(_) => {
                        missed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let max = (n + 5).to_string();
    let started = Instant::now();
    let mut scheduler = vec![
        "scheduler",
        "--metrics-listen",
        "127.0.0.1:0",
        "--skip-migrations",
    ];
    scheduler.extend_from_slice(pooled);
    stage.spawn_with_env(&scheduler, &env)?;
    let mut worker = vec![
        "worker",
        "--metrics-listen",
        "127.0.0.1:0",
        "--skip-migrations",
        "--max-machines",
        &max,
    ];
    worker.extend_from_slice(pooled);
    if bouncer.is_some() {
        worker.push("--no-listen");
    }
    for _ in 0..args.workers.max(1) {
        stage.spawn_with_env(&worker, &env)?;
    }
    stage
        .wait_for(
            "select count(*) from shepherd.managed_machines",
            n as i64,
            Duration::from_secs(900),
        )
        .await?;
    let fill = started.elapsed().as_secs_f64();
    let fill_log = fake.request_log();
    let creates = fill_log
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/servers") && r.status < 300)
        .count();
    // The key's bound over every write of the fill (the creates and the
    // SSH key): the first 20 at once, then 20 a minute.
    let fill_writes = fill_log.iter().filter(|r| r.method != "GET").count();
    let fill_bound = (fill_writes.saturating_sub(1) / 20) as f64 * 60.0;
    let peak_fill = (
        ours.load(Ordering::Relaxed),
        server_wide.load(Ordering::Relaxed),
    );

    open_deletion_budget(&stage, &env)?;
    let lowered = Instant::now();
    let count = format!("count={low}");
    let mut set = vec!["pools", "set", "web", &count, "--reason", "bench"];
    // Emptying a pool deletes every machine of it: the CLI asks for that
    // to be said.
    if low == 0 {
        set.push("--confirm-delete");
    }
    stage.run_command(&env, &set)?;
    loop {
        let busy = stage
            .count(
                "select (select count(*) from shepherd.in_flight)
                      + (select count(*) from shepherd.leaving)",
            )
            .await?;
        if busy == 0 && fake.servers().len() == low {
            break;
        }
        anyhow::ensure!(
            lowered.elapsed() < Duration::from_secs(900),
            "not lowered after 15 minutes: {} servers",
            fake.servers().len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lower = lowered.elapsed().as_secs_f64();
    sampler.abort();
    let errors = stage.log_lines_matching(CONNECTION_ERRORS)?;
    let log = fake.request_log();
    let deletes = log.iter().filter(|r| r.method == "DELETE").count();
    let throttled = log.iter().filter(|r| r.status == 429).count();
    anyhow::ensure!(
        creates == n && deletes == n - low,
        "{creates} creates and {deletes} deletes for a pool of {n} lowered to {low}: the run was not correct"
    );
    println!("max_connections = {max_connections}");
    println!(
        "| phase | wall time, s | key's bound, s | wall / bound | peak connections: cluster (server) | 429s |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| fill 0 → {n} ({creates} creates, {fill_writes} writes) | {fill:.1} | {fill_bound:.0} | {} | {} ({}) | |",
        ratio(fill, fill_bound),
        peak_fill.0,
        peak_fill.1
    );
    // The key's bound over the lowering's writes: 20 deletes a minute from
    // the start. None is free at once: the fill's last minute of writes
    // still fills the key's window when the lowering begins.
    let lower_bound = deletes as f64 / 20.0 * 60.0;
    println!(
        "| lower {n} → {low} ({deletes} deletes) | {lower:.1} | {lower_bound:.0} | {} | {} ({}) | {throttled} |",
        ratio(lower, lower_bound),
        ours.load(Ordering::Relaxed),
        server_wide.load(Ordering::Relaxed)
    );
    let (q, j, p) = *split.lock().expect("the split's lock");
    println!(
        "at the cluster's peak: {q} listening, {j} the pools' (queues and jobs), {p} the pages'; connection errors logged by the processes: {errors}; samples of pg_stat_activity that failed: {}",
        missed.load(Ordering::Relaxed)
    );
    // The pooler goes before the stage drops its database: it holds server
    // connections to it.
    drop(bouncer);
    stage.finish().await?;
    fake.shutdown().await;
    Ok(())
}

fn ratio(wall: f64, bound: f64) -> String {
    if bound > 0.0 {
        format!("{:.3}", wall / bound)
    } else {
        "-".into()
    }
}
