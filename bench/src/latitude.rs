//! Scenario 9: Latitude.sh pools filled by three worker processes against
//! the fake at the key's real budgets (60 reads and 20 writes a minute,
//! counted by the fake over a sliding minute), with shepherd's own
//! creation rate out of the way: what bounds the run is the provider's
//! write budget, and the figure is the time against that bound, and the
//! calls per machine, reads and writes apart.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use shepherd_fakes::latitude::{FakeConfig, FakeLatitude};

use crate::{Server, Stage};

pub(crate) const KEY: &str = "bench-latitude-key";

/// Opens the deletion guard's budget, so that the key's budget is what
/// bounds a change (the default, 10 % or 2 a pool per 5 minutes, would
/// make a scenario a matter of hours).
pub(crate) fn open_deletion_budget(stage: &Stage, env: &[(&str, &str)]) -> anyhow::Result<()> {
    stage.run_command(
        env,
        &[
            "settings",
            "set",
            "deletion_budget",
            "100%,1000",
            "--reason",
            "bench",
        ],
    )
}

/// The fake Latitude.sh at the key's real budgets, deploying in 2 s.
pub(crate) async fn fake_at_budgets() -> anyhow::Result<FakeLatitude> {
    FakeLatitude::start(
        FakeConfig {
            token: KEY.into(),
            deploy_delay: Duration::from_secs(2),
            ..FakeConfig::default()
        },
        "127.0.0.1:0".parse().expect("a literal address"),
    )
    .await
    .context("cannot start the fake Latitude API")
}

#[derive(Debug, Args)]
pub struct LatitudeBench {
    #[command(flatten)]
    pub server: Server,
    /// Places to fill, in two pools (DAL and ASH)
    #[arg(long, default_value_t = 38)]
    pub machines: usize,
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
}

pub async fn run(args: LatitudeBench) -> anyhow::Result<()> {
    let n = args.machines.max(2);
    let (web, batch) = (n / 2 + n % 2, n / 2);
    println!(
        "\n## Scenario 9: Latitude.sh, {n} machines in two pools, {} worker processes, the key's budgets (60 reads, 20 writes a minute)",
        args.workers
    );
    let fake = fake_at_budgets().await?;
    let mut stage = Stage::new(&args.server, "latitude", Default::default()).await?;
    let pools = format!(
        "name=web,plan=c2-small-x86,site=DAL,count={web},os=ubuntu_24_04_x64_lts;\
         name=batch,plan=c2-small-x86,site=ASH,count={batch},os=ubuntu_24_04_x64_lts"
    );
    let (url, project) = (fake.base_url(), fake.project().to_string());
    let env = [
        ("SHEPHERD_PROVIDER", "latitude"),
        ("LATITUDE_API_URL", url.as_str()),
        ("LATITUDE_PROJECT", project.as_str()),
        ("LATITUDE_API_KEY", KEY),
        ("SHEPHERD_LATITUDE_POOLS", pools.as_str()),
    ];
    let max = n.to_string();
    let started = Instant::now();
    for i in 0..args.workers.max(1) {
        let mut worker = vec![
            "worker",
            "--metrics-listen",
            "127.0.0.1:0",
            "--skip-migrations",
            "--max-machines",
            &max,
            "--chunk-size",
            "20",
            "--reconcile-rate",
            "10s,1",
            "--device-creation-rate",
            "0s,1",
            "--db-connections",
            "24",
        ];
        if i == 0 {
            worker.push("--scheduler");
        }
        stage.spawn_with_env(&worker, &env)?;
    }
    stage
        .wait_for(
            "select count(*) from shepherd.managed_machines",
            n as i64,
            Duration::from_secs(600),
        )
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    let log = fake.request_log();
    let reads = log.iter().filter(|r| r.method == "GET").count();
    let writes = log.len() - reads;
    let throttled = log.iter().filter(|r| r.status == 429).count();
    let servers = fake.servers().len();
    anyhow::ensure!(
        servers == n,
        "{servers} servers for {n} places: the run was not correct"
    );
    // The writes a window allows, and the windows the run's writes needed
    // beyond the first: the least time any client could take.
    let windows = (writes.saturating_sub(1) / 20) as f64;
    let bound = windows * 60.0;
    println!(
        "| machines | wall time, s | bound, s | wall / bound | reads | writes | reads per machine | writes per machine | 429s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {n} | {seconds:.1} | {bound:.0} | {} | {reads} | {writes} | {:.2} | {:.2} | {throttled} |",
        if bound > 0.0 {
            format!("{:.3}", seconds / bound)
        } else {
            "-".into()
        },
        reads as f64 / n as f64,
        writes as f64 / n as f64,
    );
    println!(
        "(the bound: the writes beyond the first 20 wait a minute each 20, with the key's sliding minute; the workers widen it by 2 % and 250 ms)"
    );
    stage.finish().await?;
    fake.shutdown().await;
    Ok(())
}

/// Scenario 10: a pool change converged at the key's real budgets. A pool
/// is filled, the key's minute is let run out, then one `pools apply`
/// lowers it and declares a second pool: deletions and creations share the
/// 20 writes a minute, and the figure is the time from the apply until the
/// fake holds exactly the new pools, against the least time those writes
/// allow.
#[derive(Debug, Args)]
pub struct ConvergeBench {
    #[command(flatten)]
    pub server: Server,
    /// The first pool's count before the change
    #[arg(long, default_value_t = 20)]
    pub from: usize,
    /// The first pool's count after it
    #[arg(long, default_value_t = 8)]
    pub to: usize,
    /// The count of the pool the change declares
    #[arg(long, default_value_t = 12)]
    pub new_pool: usize,
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
}

pub async fn converge(args: ConvergeBench) -> anyhow::Result<()> {
    let (from, to, new) = (args.from.max(1), args.to.min(args.from), args.new_pool);
    println!(
        "\n## Scenario 10: a pool change at the key's budgets: web {from} → {to} and db 0 → {new} in one `pools apply`, {} worker processes",
        args.workers
    );
    let fake = fake_at_budgets().await?;
    let mut stage = Stage::new(&args.server, "converge", Default::default()).await?;
    let os = "ubuntu_24_04_x64_lts";
    let pools = format!("name=web,plan=c2-small-x86,site=DAL,count={from},os={os}");
    let (url, project) = (fake.base_url(), fake.project().to_string());
    let env = [
        ("SHEPHERD_PROVIDER", "latitude"),
        ("LATITUDE_API_URL", url.as_str()),
        ("LATITUDE_PROJECT", project.as_str()),
        ("LATITUDE_API_KEY", KEY),
        ("SHEPHERD_LATITUDE_POOLS", pools.as_str()),
    ];
    let max = (from.max(to + new) + 5).to_string();
    for i in 0..args.workers.max(1) {
        let mut worker = vec![
            "worker",
            "--metrics-listen",
            "127.0.0.1:0",
            "--skip-migrations",
            "--max-machines",
            &max,
            "--chunk-size",
            "20",
            "--reconcile-rate",
            "10s,1",
            "--device-creation-rate",
            "0s,1",
            "--db-connections",
            "24",
        ];
        if i == 0 {
            worker.push("--scheduler");
        }
        stage.spawn_with_env(&worker, &env)?;
    }
    stage
        .wait_for(
            "select count(*) from shepherd.managed_machines",
            from as i64,
            Duration::from_secs(600),
        )
        .await?;
    // The fill's writes leave the key's minute; the guard's budget is
    // opened so that the key's is what bounds the change (the default,
    // 10 % or 2 a pool per 5 minutes, would make it a matter of hours).
    tokio::time::sleep(Duration::from_secs(61)).await;
    open_deletion_budget(&stage, &env)?;
    let file = std::env::temp_dir().join(format!("shepherd-bench-pools-{}", std::process::id()));
    std::fs::write(
        &file,
        format!(
            "name=web,plan=c2-small-x86,site=DAL,count={to},os={os}\n\
             name=db,plan=c2-small-x86,site=ASH,count={new},os={os}\n"
        ),
    )?;
    let file_arg = file.display().to_string();
    let started = Instant::now();
    stage.run_command(
        &env,
        &[
            "pools",
            "apply",
            &file_arg,
            "--confirm-delete",
            "--reason",
            "bench",
        ],
    )?;
    let _ = std::fs::remove_file(&file);
    let count = |pool: &str| {
        fake.servers()
            .iter()
            .filter(|s| s.hostname.starts_with(&format!("shepherd-{pool}-")))
            .count()
    };
    loop {
        let busy = stage
            .count(
                "select (select count(*) from shepherd.in_flight)
                      + (select count(*) from shepherd.leaving)",
            )
            .await?;
        if busy == 0 && count("web") == to && count("db") == new {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(900),
            "not converged after 15 minutes: web {}, db {}",
            count("web"),
            count("db")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let log: Vec<_> = fake
        .request_log()
        .into_iter()
        .filter(|r| r.started >= started)
        .collect();
    let reads = log.iter().filter(|r| r.method == "GET").count();
    let deletes = log.iter().filter(|r| r.method == "DELETE").count();
    let writes = log.len() - reads;
    let throttled = log.iter().filter(|r| r.status == 429).count();
    let deleted = from - to;
    anyhow::ensure!(
        deletes == deleted,
        "{deletes} deletes for a surplus of {deleted}: the run was not correct"
    );
    let windows = (writes.saturating_sub(1) / 20) as f64;
    let bound = windows * 60.0;
    println!(
        "| change | wall time, s | bound, s | wall / bound | writes (deletes + creates) | reads | 429s |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| web {from} → {to}, db 0 → {new} | {seconds:.1} | {bound:.0} | {} | {writes} ({deletes} + {}) | {reads} | {throttled} |",
        if bound > 0.0 {
            format!("{:.3}", seconds / bound)
        } else {
            "-".into()
        },
        writes - deletes,
    );
    println!(
        "(the bound: the writes beyond the first 20 wait a minute each 20; a pass every 10 s decides the change, so up to 10 s pass before the first write)"
    );
    stage.finish().await?;
    fake.shutdown().await;
    Ok(())
}

/// Scenario 11: a pool filled at the key's real budgets with the release
/// binary's defaults, in an empty project and beside thousands of other
/// servers, side by side in one run; then the reads a whole pool costs at
/// rest, and how soon a server taken away or failed is noticed.
#[derive(Debug, Args)]
pub struct BudgetBench {
    #[command(flatten)]
    pub server: Server,
    /// The pool to fill
    #[arg(long, default_value_t = 40)]
    pub machines: usize,
    /// Other servers in the project (the second run; the first has none)
    #[arg(long, default_value_t = 10_000)]
    pub others: usize,
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// How long the pool is watched at rest
    #[arg(long, default_value = "120s", value_parser = shepherd::config::parse_duration)]
    pub rest: Duration,
}

/// What one project size measured.
struct BudgetRun {
    others: usize,
    fill: f64,
    bound: f64,
    reads: usize,
    writes: usize,
    throttled: usize,
    rest_reads_per_minute: f64,
    vanished_noticed: f64,
    failed_noticed: f64,
    full_listing_bound: f64,
}

pub async fn budget(args: BudgetBench) -> anyhow::Result<()> {
    let n = args.machines.max(1);
    println!(
        "\n## Scenario 11: a pool of {n} at the key's budgets with the defaults, in an empty project and beside {} other servers, {} worker processes",
        args.others, args.workers
    );
    let mut runs = vec![];
    for others in [0, args.others] {
        runs.push(budget_once(&args, n, others).await?);
    }
    println!(
        "| other servers | fill, s | bound, s | fill / bound | reads | writes | 429s | reads a minute at rest | a failed server noticed after, s | a server taken away, s | a full listing's least time, s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &runs {
        println!(
            "| {} | {:.1} | {:.0} | {:.3} | {} | {} | {} | {:.1} ({:.0} % of 60) | {:.1} | {:.1} | {:.0} |",
            r.others,
            r.fill,
            r.bound,
            r.fill / r.bound,
            r.reads,
            r.writes,
            r.throttled,
            r.rest_reads_per_minute,
            r.rest_reads_per_minute / 60.0 * 100.0,
            r.failed_noticed,
            r.vanished_noticed,
            r.full_listing_bound,
        );
    }
    if let [empty, crowded] = &runs[..] {
        println!(
            "(fill beside {} against the empty project: {:.3}; the bound: the writes beyond the first 20 wait a minute each 20; noticed: by the next pass, one a minute by default; a full listing's least time: its pages at 60 reads a minute)",
            crowded.others,
            crowded.fill / empty.fill
        );
    }
    Ok(())
}

async fn budget_once(args: &BudgetBench, n: usize, others: usize) -> anyhow::Result<BudgetRun> {
    let fake = fake_at_budgets().await?;
    let project = fake.project().to_string();
    for i in 0..others {
        // Other teams' servers in the same project, on the same plans.
        let site = ["DAL", "ASH", "SAO"][i % 3];
        fake.add_foreign_server(
            &project,
            "c2-small-x86",
            site,
            &format!("team-{}-{i}", i % 7),
        );
    }
    let mut stage = Stage::new(&args.server, "budget", Default::default()).await?;
    let pools = format!("name=web,plan=c2-small-x86,site=DAL,count={n},os=ubuntu_24_04_x64_lts");
    let url = fake.base_url();
    let env = [
        ("SHEPHERD_PROVIDER", "latitude"),
        ("LATITUDE_API_URL", url.as_str()),
        ("LATITUDE_PROJECT", project.as_str()),
        ("LATITUDE_API_KEY", KEY),
        ("SHEPHERD_LATITUDE_POOLS", pools.as_str()),
    ];
    let max = (n + 10).to_string();
    let started = Instant::now();
    for i in 0..args.workers.max(1) {
        // The defaults, but for the limit (a pool above the default 50 is
        // allowed) and a settle window short enough to watch a server
        // vanish within the run (5 min by default; it does not touch a
        // fill whose answers are all seen).
        let mut worker = vec![
            "worker",
            "--metrics-listen",
            "127.0.0.1:0",
            "--skip-migrations",
            "--max-machines",
            &max,
            "--settle-window",
            "20s",
            "--db-connections",
            "24",
        ];
        if i == 0 {
            worker.push("--scheduler");
        }
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
    let log = fake.request_log();
    let reads = log.iter().filter(|r| r.method == "GET").count();
    let writes = log.len() - reads;
    let throttled = log.iter().filter(|r| r.status == 429).count();
    let ours = fake
        .servers()
        .into_iter()
        .filter(|s| s.hostname.starts_with("shepherd-"))
        .collect::<Vec<_>>();
    anyhow::ensure!(
        ours.len() == n && fake.duplicate_hostnames() == 0,
        "{} servers for {n} places: the run was not correct",
        ours.len()
    );
    let windows = (writes.saturating_sub(1) / 20).max(1) as f64;
    let bound = windows * 60.0;

    // At rest: the pool whole, the scheduler's passes only.
    let rest_from = Instant::now();
    tokio::time::sleep(args.rest).await;
    let rest_reads = fake
        .request_log()
        .iter()
        .filter(|r| r.method == "GET" && r.started >= rest_from)
        .count();
    let rest_reads_per_minute = rest_reads as f64 / args.rest.as_secs_f64() * 60.0;

    // One server fails, and once its replacement is decided another is
    // taken away: one at a time, since a pass that finds a machine missing
    // does no other work until it is confirmed lost. Noticed: when a pass
    // asks for the failed one's deletion, and records the other as not
    // found.
    let (failed, gone) = (ours[0].id.clone(), ours[1].id.clone());
    let noticed = |sql: &'static str, id: String| {
        let pool = stage.pool.clone();
        async move {
            let hit = Instant::now();
            loop {
                let n: i64 = sqlx::query_scalar(sql).bind(&id).fetch_one(&pool).await?;
                if n > 0 {
                    return anyhow::Ok(hit.elapsed().as_secs_f64());
                }
                anyhow::ensure!(
                    hit.elapsed() < Duration::from_secs(600),
                    "not noticed in 10 minutes"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    anyhow::ensure!(fake.fail_server(&failed), "no server {failed} to fail");
    let failed_noticed = noticed(
        "select count(*) from shepherd.events where event_type = 'deletion_requested'
           and body->>'provider_id' = $1",
        failed,
    )
    .await?;
    anyhow::ensure!(fake.reclaim(&gone), "no server {gone} to take away");
    let vanished_noticed = noticed(
        "select count(*) from shepherd.events where event_type = 'machine_not_found'
           and body->>'provider_id' = $1",
        gone,
    )
    .await?;
    let full_listing_bound = (n + others).div_ceil(100) as f64;
    stage.finish().await?;
    fake.shutdown().await;
    Ok(BudgetRun {
        others,
        fill,
        bound,
        reads,
        writes,
        throttled,
        rest_reads_per_minute,
        vanished_noticed,
        failed_noticed,
        full_listing_bound,
    })
}
