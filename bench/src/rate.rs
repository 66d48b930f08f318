//! Scenario 3: provisioning against the creation limiter. The bound is what
//! the limiter allows: N creations need at least (N - 1) spacings between
//! the first and the last. Measured at the fake, where the provider would
//! see them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use shepherd::metal::Operation;
use shepherd_fakes::metal::{FakeConfig, Faults};

use super::{Server, Stage, Stats};

const SPACING: Duration = Duration::from_millis(100);
const LATENCY_MS: u64 = 150;
const WORKERS: usize = 3;

#[derive(Debug, Args)]
pub struct RateBench {
    #[command(flatten)]
    pub server: Server,
    #[arg(long, default_value_t = 300)]
    pub reservations: usize,
    #[arg(long, default_value_t = 3)]
    pub repetitions: usize,
    /// Directory for the timeline (rate-limit.csv, rate-limit.svg)
    #[arg(long)]
    pub out: Option<PathBuf>,
}

struct Run {
    /// Seconds after the first creation at which each creation was sent.
    sent: Vec<f64>,
    /// From the workers' start until every machine was managed.
    total: f64,
}

impl Run {
    fn span(&self) -> f64 {
        self.sent.last().copied().unwrap_or(0.0)
    }

    /// The smallest time between two consecutive creations.
    fn min_gap(&self) -> f64 {
        self.sent
            .windows(2)
            .map(|w| w[1] - w[0])
            .fold(f64::INFINITY, f64::min)
    }
}

async fn once(server: &Server, n: usize) -> anyhow::Result<Run> {
    let mut stage = Stage::new(
        server,
        "rate_limit",
        FakeConfig {
            reservations: n,
            faults: Faults::none().with_latency(LATENCY_MS, 0),
            ..FakeConfig::default()
        },
    )
    .await?;
    let chunk = n.to_string();
    let rate = format!("{}ms,1", SPACING.as_millis());
    let started = Instant::now();
    for _ in 0..WORKERS {
        stage.spawn_worker(&[
            "--scheduler",
            "--max-machines",
            "0",
            "--chunk-size",
            &chunk,
            "--reconcile-rate",
            "1s,1",
            "--device-creation-rate",
            &rate,
            "--poll-interval",
            "200ms",
        ])?;
    }
    stage
        .wait_for(
            "select count(*) from shepherd.managed_machines",
            n as i64,
            Duration::from_secs(600),
        )
        .await?;
    let total = started.elapsed().as_secs_f64();
    let mut stamps: Vec<Instant> = stage
        .fake
        .request_log()
        .into_iter()
        .filter(|r| r.op == Operation::CreateDevice && r.status == 201)
        .map(|r| r.started)
        .collect();
    stamps.sort();
    anyhow::ensure!(
        stamps.len() == n,
        "{} creations answered 201 for {n} reservations",
        stamps.len()
    );
    let first = stamps[0];
    let sent = stamps
        .iter()
        .map(|t| t.duration_since(first).as_secs_f64())
        .collect();
    stage.finish().await?;
    Ok(Run { sent, total })
}

pub async fn run(args: RateBench) -> anyhow::Result<()> {
    let n = args.reservations;
    let bound = SPACING.as_secs_f64() * (n as f64 - 1.0);
    println!(
        "\n## Scenario 3: against the creation limiter ({n} reservations, {LATENCY_MS} ms per call, one creation per {} ms, {WORKERS} worker processes, {} repetitions)",
        SPACING.as_millis(),
        args.repetitions
    );
    let mut runs = vec![];
    for rep in 0..args.repetitions.max(1) {
        let r = once(&args.server, n).await?;
        println!(
            "  rep {rep}: first to last creation {:.2} s, ratio {:.3}, smallest gap {:.1} ms, all managed {:.1} s after start",
            r.span(),
            r.span() / bound,
            r.min_gap() * 1000.0,
            r.total
        );
        runs.push(r);
    }
    let spans = Stats::of(runs.iter().map(Run::span));
    let ratios = Stats::of(runs.iter().map(|r| r.span() / bound));
    let gaps = Stats::of(runs.iter().map(|r| r.min_gap() * 1000.0));
    let totals = Stats::of(runs.iter().map(|r| r.total));
    println!("| measure | median (min, max) |");
    println!("|---|---|");
    println!("| bound: (N - 1) x spacing, s | {bound:.2} |");
    println!("| first to last creation, s | {spans:.2} |");
    println!("| ratio to the bound (>= 1.0 required, goal <= 1.05) | {ratios:.3} |");
    println!("| smallest gap between two creations, ms | {gaps:.1} |");
    println!("| workers' start to all managed, s | {totals:.1} |");
    if let Some(dir) = &args.out {
        let median = runs
            .iter()
            .min_by(|a, b| {
                (a.span() - spans.median)
                    .abs()
                    .total_cmp(&(b.span() - spans.median).abs())
            })
            .expect("at least one run");
        std::fs::create_dir_all(dir)?;
        write_timeline(dir, median, n)?;
        println!(
            "timeline of the median run: {}, {}",
            dir.join("rate-limit.csv").display(),
            dir.join("rate-limit.svg").display()
        );
    }
    Ok(())
}

/// Creations the limiter allows by `t` seconds after the first.
fn bound_at(t: f64) -> usize {
    (t / SPACING.as_secs_f64() + 1e-9).floor() as usize + 1
}

fn write_timeline(dir: &Path, run: &Run, n: usize) -> anyhow::Result<()> {
    let mut csv = String::from("seconds,machines,bound\n");
    for (i, t) in run.sent.iter().enumerate() {
        writeln!(csv, "{t:.4},{},{}", i + 1, bound_at(*t).min(n))?;
    }
    std::fs::write(dir.join("rate-limit.csv"), csv)?;
    std::fs::write(dir.join("rate-limit.svg"), svg(run, n))?;
    Ok(())
}

/// A plain SVG line chart: creations sent over time, and the limiter's bound.
fn svg(run: &Run, n: usize) -> String {
    let (w, h, left, right, top, bottom) = (760.0, 420.0, 60.0, 20.0, 30.0, 50.0);
    let max_t = run.span().max(SPACING.as_secs_f64() * (n as f64 - 1.0)) * 1.02;
    let x = |t: f64| left + t / max_t * (w - left - right);
    let y = |m: f64| h - bottom - m / n as f64 * (h - top - bottom);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="18" font-size="14">Creations sent over time ({n} reservations, one per {} ms, 3 workers, 150 ms per call)</text>"#,
        SPACING.as_millis()
    );
    // Axes and ticks.
    let _ = writeln!(
        s,
        r#"<path d="M{left},{top} V{} H{}" stroke="black" fill="none"/>"#,
        h - bottom,
        w - right
    );
    let step_t = if max_t > 20.0 { 5.0 } else { 1.0 };
    let mut t = 0.0;
    while t <= max_t {
        let _ = writeln!(
            s,
            r#"<line x1="{0:.1}" y1="{1}" x2="{0:.1}" y2="{2}" stroke="black"/><text x="{0:.1}" y="{3}" text-anchor="middle">{t:.0}</text>"#,
            x(t),
            h - bottom,
            h - bottom + 5.0,
            h - bottom + 18.0
        );
        t += step_t;
    }
    let step_m = (n / 6).max(1);
    for m in (0..=n).step_by(step_m) {
        let _ = writeln!(
            s,
            r#"<line x1="{0}" y1="{1:.1}" x2="{2}" y2="{1:.1}" stroke="black"/><text x="{3}" y="{4:.1}" text-anchor="end">{m}</text>"#,
            left - 5.0,
            y(m as f64),
            left,
            left - 8.0,
            y(m as f64) + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">seconds after the first creation</text>"#,
        (left + w - right) / 2.0,
        h - 12.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">machines</text>"#,
        (top + h - bottom) / 2.0,
        (top + h - bottom) / 2.0
    );
    // The bound: one creation per spacing from the first.
    let end = SPACING.as_secs_f64() * (n as f64 - 1.0);
    let _ = writeln!(
        s,
        r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#c33" stroke-width="2" stroke-dasharray="6 4"/>"##,
        x(0.0),
        y(1.0),
        x(end),
        y(n as f64)
    );
    // Measured: a step up at each creation.
    let mut d = format!("M{:.1},{:.1}", x(0.0), y(0.0));
    for (i, t) in run.sent.iter().enumerate() {
        let _ = write!(d, " H{:.1} V{:.1}", x(*t), y((i + 1) as f64));
    }
    let _ = writeln!(
        s,
        r##"<path d="{d}" stroke="#236" stroke-width="1.5" fill="none"/>"##
    );
    let _ = writeln!(
        s,
        r##"<line x1="{0}" y1="44" x2="{1}" y2="44" stroke="#236" stroke-width="2"/><text x="{2}" y="48">measured (createDevice at the fake)</text>"##,
        left + 10.0,
        left + 40.0,
        left + 46.0
    );
    let _ = writeln!(
        s,
        r##"<line x1="{0}" y1="62" x2="{1}" y2="62" stroke="#c33" stroke-width="2" stroke-dasharray="6 4"/><text x="{2}" y="66">bound set by the limiter</text>"##,
        left + 10.0,
        left + 40.0,
        left + 46.0
    );
    s.push_str("</svg>\n");
    s
}
