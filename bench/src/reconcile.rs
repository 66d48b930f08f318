//! Scenario 4: one reconcile pass over a large project. Half of the
//! reservations carry a managed device; the pass lists devices and
//! reservations and enqueues one chunk. Each pass runs in a fresh process
//! (`bench reconcile-once`) so its peak memory is its own.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use serde::{Deserialize, Serialize};
use shepherd::config::ProvisionerConfig;
use shepherd::events::event::MachineAssimilated;
use shepherd::events::{NewEvent, record};
use shepherd::jobs::JobContext;
use shepherd::metal::{ClientConfig, ClientMetrics, MetalClient};
use shepherd::secret::ApiToken;
use shepherd_fakes::metal::FakeConfig;

use super::{PUBLIC_KEY, Server, Stage, Stats, TOKEN};

#[derive(Debug, Args)]
pub struct ReconcileBench {
    #[command(flatten)]
    pub server: Server,
    /// Reservations per point (half of them managed)
    #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000")]
    pub sizes: Vec<usize>,
    #[arg(long, default_value_t = 3)]
    pub repetitions: usize,
    /// Page size of the listings (shepherd's default, and the spec's
    /// largest, is 1000)
    #[arg(long, default_value_t = shepherd::metal::client::PER_PAGE_DEFAULT)]
    pub per_page: u32,
}

#[derive(Debug, Args)]
pub struct LatencyBench {
    #[command(flatten)]
    pub server: Server,
    /// Reservations per point (half of them managed)
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub sizes: Vec<usize>,
    #[arg(long, default_value_t = 3)]
    pub repetitions: usize,
    /// Repetitions of the seed's model (sequential pages of 10: slow)
    #[arg(long, default_value_t = 1)]
    pub seed_repetitions: usize,
    /// The fake's latency: this plus a uniform 0..=jitter
    #[arg(long, default_value_t = 140)]
    pub latency_ms: u64,
    #[arg(long, default_value_t = 20)]
    pub jitter_ms: u64,
}

#[derive(Debug, Args)]
pub struct ReconcileOnce {
    #[command(flatten)]
    db: shepherd_workers::commands::database::DatabaseArgs,
    #[command(flatten)]
    metal: shepherd_workers::settings::MetalArgs,
}

/// What a pass reports to the benchmark, as one JSON line on stdout.
#[derive(Debug, Serialize, Deserialize)]
struct Measured {
    seconds: f64,
    rss_before: u64,
    peak: u64,
    managed: u64,
    enqueued: usize,
}

pub async fn once(args: ReconcileOnce) -> anyhow::Result<()> {
    let pool = args.db.connect(4).await?;
    // The cluster's pacer, as in a worker.
    let metal = args.metal.client(Some(&pool), ClientMetrics::default())?;
    let config = Arc::new(ProvisionerConfig {
        max_machines: 0,
        ..ProvisionerConfig::default()
    });
    shepherd::cluster::establish(
        &pool,
        &shepherd::cluster::ClusterSettings::proposed_by(&config),
        &[],
        "bench",
    )
    .await?;
    let ctx = JobContext::new(pool, metal, config, PUBLIC_KEY.into());
    let (rss_before, _) = super::memory();
    let started = Instant::now();
    let outcome = shepherd::jobs::reconcile::reconcile(&ctx, "bench-reconcile").await?;
    let seconds = started.elapsed().as_secs_f64();
    let (_, peak) = super::memory();
    anyhow::ensure!(
        outcome.refused.is_none() && !outcome.skipped,
        "the pass did no work: {outcome:?}"
    );
    let m = Measured {
        seconds,
        rss_before,
        peak,
        managed: outcome.managed,
        enqueued: outcome.enqueued.len(),
    };
    println!("{}", serde_json::to_string(&m)?);
    Ok(())
}

struct Point {
    seconds: f64,
    /// The two listings alone, timed afterwards from this process.
    list_devices: f64,
    list_reservations: f64,
    peak_mb: f64,
    before_mb: f64,
    calls: u64,
    list_calls: u64,
}

/// A stage whose fake holds `size` reservations, half of them carrying a
/// device shepherd manages (recorded in the log); returns it with the
/// number managed.
async fn prepare(server: &Server, size: usize) -> anyhow::Result<(Stage, usize)> {
    let stage = Stage::new(
        server,
        "reconcile",
        FakeConfig {
            reservations: size,
            ..FakeConfig::default()
        },
    )
    .await?;
    // Half the reservations get a device that shepherd manages.
    let managed: Vec<_> = stage.fake.reservations().into_iter().step_by(2).collect();
    let mut events = Vec::with_capacity(managed.len());
    for r in &managed {
        let hostname = format!("shepherd-{}", &r.id.to_string()[..18]);
        let device = stage.fake.add_foreign_device(r.id, &hostname, vec![]);
        events.push(NewEvent::new(MachineAssimilated {
            machine_id: uuid::Uuid::new_v4(),
            provider: "metal".into(),
            provider_id: device.to_string(),
            reservation: Some(r.id),
            hostname: Some(hostname),
        }));
    }
    let mut tx = stage.pool.begin().await?;
    let mut events = events.into_iter().peekable();
    while events.peek().is_some() {
        record(&mut tx, events.by_ref().take(1000).collect()).await?;
    }
    tx.commit().await?;
    sqlx::query("analyze").execute(&stage.pool).await?;
    Ok((stage, managed.len()))
}

/// One pass in a fresh `bench reconcile-once` process, with `flags`.
async fn pass_in_process(
    stage: &Stage,
    flags: &[&str],
    managed: usize,
) -> anyhow::Result<Measured> {
    let mut args = vec!["bench", "reconcile-once"];
    args.extend_from_slice(flags);
    let mut command = stage.command(&args)?;
    let out = tokio::task::spawn_blocking(move || command.output()).await??;
    anyhow::ensure!(
        out.status.success(),
        "the pass failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8_lossy(&out.stdout);
    let m: Measured = serde_json::from_str(line.lines().last().unwrap_or_default())
        .with_context(|| format!("unexpected output from the pass: {line}"))?;
    anyhow::ensure!(
        m.managed == managed as u64,
        "the pass saw {} managed machines of {managed}",
        m.managed,
    );
    Ok(m)
}

async fn point(server: &Server, size: usize, per_page: u32) -> anyhow::Result<Point> {
    let (stage, managed) = prepare(server, size).await?;
    let calls_before = stage.fake.total_calls();
    let lists_before = stage.list_calls();
    let per_page_n = per_page;
    let per_page = per_page.to_string();
    let m = pass_in_process(
        &stage,
        &["--api-rate", "0s", "--per-page", &per_page],
        managed,
    )
    .await?;
    let calls = stage.fake.total_calls() - calls_before;
    let list_calls = stage.list_calls() - lists_before;
    let mut config = ClientConfig::new(
        stage.fake.base_url(),
        stage.fake.project_id(),
        ApiToken::new(TOKEN),
    );
    config.api_rate = shepherd::config::Rate::UNLIMITED;
    config.per_page = per_page_n;
    let client = MetalClient::new(config, ClientMetrics::default())?;
    let t = Instant::now();
    client.list_devices().await?;
    let list_devices = t.elapsed().as_secs_f64();
    let t = Instant::now();
    client.list_reservations(&["facility", "device"]).await?;
    let list_reservations = t.elapsed().as_secs_f64();
    let p = Point {
        list_devices,
        list_reservations,
        seconds: m.seconds,
        peak_mb: m.peak as f64 / 1_048_576.0,
        before_mb: m.rss_before as f64 / 1_048_576.0,
        calls,
        list_calls,
    };
    stage.finish().await?;
    Ok(p)
}

pub async fn run(args: ReconcileBench) -> anyhow::Result<()> {
    println!(
        "\n## Scenario 4: one reconcile pass (half the reservations managed, zero-latency fake, {} per page, {} repetitions)",
        args.per_page, args.repetitions
    );
    let mut points: Vec<Vec<Point>> = args.sizes.iter().map(|_| vec![]).collect();
    for rep in 0..args.repetitions.max(1) {
        let order: Vec<usize> = if rep % 2 == 0 {
            (0..args.sizes.len()).collect()
        } else {
            (0..args.sizes.len()).rev().collect()
        };
        for i in order {
            let p = point(&args.server, args.sizes[i], args.per_page).await?;
            println!(
                "  rep {rep}: {:>6} reservations: {:.3} s, peak {:.1} MB, {} API calls",
                args.sizes[i], p.seconds, p.peak_mb, p.calls
            );
            points[i].push(p);
        }
    }
    println!(
        "| reservations | managed | wall time, s | peak RSS, MB | RSS before the pass, MB | API calls | of which list pages | listing devices alone, s | listing reservations alone, s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (i, size) in args.sizes.iter().enumerate() {
        let ps = &points[i];
        let t = Stats::of(ps.iter().map(|p| p.seconds));
        let m = Stats::of(ps.iter().map(|p| p.peak_mb));
        let b = Stats::of(ps.iter().map(|p| p.before_mb));
        let c = Stats::of(ps.iter().map(|p| p.calls as f64));
        let l = Stats::of(ps.iter().map(|p| p.list_calls as f64));
        let ld = Stats::of(ps.iter().map(|p| p.list_devices));
        let lr = Stats::of(ps.iter().map(|p| p.list_reservations));
        println!(
            "| {size} | {} | {t:.3} | {m:.1} | {b:.1} | {c:.0} | {l:.0} | {ld:.3} | {lr:.3} |",
            size.div_ceil(2)
        );
    }
    if let (Some(first), Some(last)) = (points.first(), points.last()) {
        let t0 = Stats::of(first.iter().map(|p| p.seconds)).median;
        let t1 = Stats::of(last.iter().map(|p| p.seconds)).median;
        let n0 = args.sizes[0] as f64;
        let n1 = args.sizes[args.sizes.len() - 1] as f64;
        println!(
            "growth of the wall time from {n0} to {n1} reservations: {:.1}x for {:.0}x the size (goal at 10,000: <= 1 s, <= 100 MB)",
            t1 / t0,
            n1 / n0
        );
    }
    Ok(())
}

/// The seed's listing as a model: devices, then reservations (with
/// facility and device included), each page after the last, at the API's
/// default page size of 10 (packngo left `per_page` unset), no pacing. The
/// seed also decoded with its own client; this uses shepherd's, so only
/// the shape of the traffic is the seed's.
async fn seed_model(stage: &Stage) -> anyhow::Result<f64> {
    let mut config = ClientConfig::new(
        stage.fake.base_url(),
        stage.fake.project_id(),
        ApiToken::new(TOKEN),
    );
    config.api_rate = shepherd::config::Rate::UNLIMITED;
    config.per_page = 10;
    // One call on the wire at a time: pages strictly one after another.
    config.parallelism = 1;
    let client = MetalClient::new(config, ClientMetrics::default())?;
    let t = Instant::now();
    client.list_devices().await?;
    client.list_reservations(&["facility", "device"]).await?;
    Ok(t.elapsed().as_secs_f64())
}

/// Scenario 7: one pass at real latency with shepherd's default settings,
/// beside the seed's listing in the same run.
pub async fn latency(args: LatencyBench) -> anyhow::Result<()> {
    println!(
        "\n## Scenario 7: one pass at real latency ({}..={} ms per call, half managed, shepherd's defaults; {} repetitions, the seed model {})",
        args.latency_ms,
        args.latency_ms + args.jitter_ms,
        args.repetitions,
        args.seed_repetitions
    );
    let faults =
        shepherd_fakes::metal::Faults::none().with_latency(args.latency_ms, args.jitter_ms);
    let mut ours: Vec<Vec<f64>> = args.sizes.iter().map(|_| vec![]).collect();
    let mut calls: Vec<Vec<f64>> = args.sizes.iter().map(|_| vec![]).collect();
    let mut seed: Vec<Vec<f64>> = args.sizes.iter().map(|_| vec![]).collect();
    for (i, &size) in args.sizes.iter().enumerate() {
        let (stage, managed) = prepare(&args.server, size).await?;
        stage.fake.set_faults(faults.clone());
        for rep in 0..args.repetitions.max(args.seed_repetitions) {
            // Alternate which side goes first.
            for side in if rep % 2 == 0 { [0, 1] } else { [1, 0] } {
                if side == 0 && rep < args.repetitions {
                    let before = stage.fake.total_calls();
                    let m = pass_in_process(&stage, &[], managed).await?;
                    println!(
                        "  {size:>6} reservations, rep {rep}: shepherd {:.3} s",
                        m.seconds
                    );
                    ours[i].push(m.seconds);
                    calls[i].push((stage.fake.total_calls() - before) as f64);
                } else if side == 1 && rep < args.seed_repetitions {
                    let s = seed_model(&stage).await?;
                    println!("  {size:>6} reservations, rep {rep}: seed model {s:.1} s");
                    seed[i].push(s);
                }
            }
        }
        stage.finish().await?;
    }
    println!(
        "| reservations | shepherd pass, s | API calls | seed model (listing only), s | seed / shepherd |"
    );
    println!("|---|---|---|---|---|");
    for (i, size) in args.sizes.iter().enumerate() {
        let o = Stats::of(ours[i].iter().copied());
        let c = Stats::of(calls[i].iter().copied());
        if seed[i].is_empty() {
            println!("| {size} | {o:.3} | {c:.0} | not timed | |");
            continue;
        }
        let s = Stats::of(seed[i].iter().copied());
        println!(
            "| {size} | {o:.3} | {c:.0} | {s:.1} | **{:.0}x** |",
            s.median / o.median
        );
    }
    if args.sizes.len() > 1 && seed.iter().all(|s| !s.is_empty()) {
        let grow = |v: &[Vec<f64>]| {
            Stats::of(v[v.len() - 1].iter().copied()).median
                / Stats::of(v[0].iter().copied()).median
        };
        println!(
            "growth from {} to {} reservations: shepherd {:.1}x, seed model {:.1}x (goal at 10,000: <= 2 s and >= 5x faster than the seed model)",
            args.sizes[0],
            args.sizes[args.sizes.len() - 1],
            grow(&ours),
            grow(&seed)
        );
    }
    Ok(())
}
