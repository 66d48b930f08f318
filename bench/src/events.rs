//! Scenario 5, `shepherd-bench events`: the event log's costs:
//! appends per second (single-event transactions that update a view, with 1
//! and 4 writers), and replaying the views from a large log next to a plain
//! sequential read of the same table. It creates and drops its own database.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{TimeDelta, Utc};
use clap::Args;
use futures::TryStreamExt;
use shepherd::events::event::ReservationPenalised;
use shepherd::events::{NewEvent, record, views};
use sqlx::PgPool;
use uuid::Uuid;

use super::Stats;

#[derive(Debug, Args)]
pub struct EventsBench {
    #[command(flatten)]
    pub server: super::Server,
    /// Events in the log for the rebuild measurement
    #[arg(long, default_value_t = 1_000_000)]
    pub events: u64,
    /// How long each append measurement runs
    #[arg(long, default_value = "10s", value_parser = shepherd::config::parse_duration)]
    pub seconds: Duration,
    /// Repetitions of the rebuild and scan (alternating; the median is reported)
    #[arg(long, default_value_t = 3)]
    pub repetitions: usize,
}

async fn appends(pool: &PgPool, writers: usize, for_how_long: Duration) -> anyhow::Result<f64> {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + for_how_long;
    let reservations: Arc<Vec<Uuid>> = Arc::new((0..10_000).map(|_| Uuid::new_v4()).collect());
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (pool, done, reservations) = (pool.clone(), done.clone(), reservations.clone());
            tokio::spawn(async move {
                let mut i = w;
                while Instant::now() < deadline {
                    let event = ReservationPenalised {
                        reservation: reservations[i % reservations.len()],
                        until: Utc::now() + TimeDelta::hours(1),
                        cause: "bench".into(),
                        class: None,
                        scope: None,
                    };
                    let mut tx = pool.begin().await?;
                    record(&mut tx, vec![NewEvent::new(event)]).await?;
                    tx.commit().await?;
                    done.fetch_add(1, Ordering::Relaxed);
                    i += writers;
                }
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    let started = Instant::now();
    for t in tasks {
        t.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// Loads `n` events of a realistic mix (request, creation, assimilation,
/// penalty) in bulk, straight into the table, then builds the live views
/// from them so a rebuild has something to compare with.
async fn load(pool: &PgPool, n: u64) -> anyhow::Result<()> {
    let cycles = (n / 4) as i64;
    sqlx::query(
        "insert into shepherd.events (event_id, stream, event_type, schema_version, body)
         select gen_random_uuid(), 'reservation/' || r, t, 1, b
         from (select gen_random_uuid() r, gen_random_uuid() d, gen_random_uuid() m, i
               from generate_series(1, $1) i) s,
         lateral (values
           (1, 'creation_requested', jsonb_build_object('reservation', r, 'request', gen_random_uuid(), 'manual', false)),
           (2, 'device_created', jsonb_build_object('reservation', r, 'device', d, 'hostname', 'h', 'witness', 'w', 'recovered', false)),
           (3, 'machine_assimilated', jsonb_build_object('machine_id', m, 'provider', 'equinix', 'provider_id', d::text, 'reservation', r, 'hostname', 'h')),
           (4, 'reservation_penalised', jsonb_build_object('reservation', r, 'until', now() + interval '1 hour', 'cause', 'c', 'class', null))
         ) v(k, t, b)
         order by i, k",
    )
    .bind(cycles)
    .execute(pool)
    .await?;
    sqlx::query("analyze shepherd.events").execute(pool).await?;
    let report = views::rebuild(pool, true).await?;
    anyhow::ensure!(report.replaced, "the live views were not built");
    Ok(())
}

async fn plain_scan(pool: &PgPool) -> anyhow::Result<(Duration, u64)> {
    let started = Instant::now();
    let mut conn = pool.acquire().await?;
    let mut rows = sqlx::query(
        "select position, event_type, schema_version, body, recorded_at
         from shepherd.events order by position",
    )
    .fetch(&mut *conn);
    let mut n = 0u64;
    while rows.try_next().await?.is_some() {
        n += 1;
    }
    Ok((started.elapsed(), n))
}

async fn replay(pool: &PgPool) -> anyhow::Result<(Duration, u64)> {
    let started = Instant::now();
    let mut conn = pool.acquire().await?;
    let (_, n) = views::fold_log(&mut conn).await?;
    Ok((started.elapsed(), n))
}

pub async fn run(args: EventsBench) -> anyhow::Result<()> {
    let url = args.server.database("events");
    shepherd::db::recreate_database(&url).await?;
    let pool = shepherd::db::connect(&url, 8).await?;
    shepherd::db::migrate(&pool).await?;
    println!("\n## Scenario 5: the event log");
    println!("== appends (single-event transactions, each updating the sinbin view)");
    for writers in [1, 4] {
        let rate = appends(&pool, writers, args.seconds).await?;
        println!(
            "{writers} writer(s): {rate:.0} appends/s over {:?}",
            args.seconds
        );
    }
    sqlx::raw_sql(
        "alter table shepherd.events disable trigger events_no_truncate;
         truncate shepherd.events;
         alter table shepherd.events enable trigger events_no_truncate;
         delete from shepherd.sinbin;",
    )
    .execute(&pool)
    .await?;
    println!("== loading {} events", args.events);
    let started = Instant::now();
    load(&pool, args.events).await?;
    println!("loaded in {:.1?}", started.elapsed());
    let (mut scans, mut replays) = (vec![], vec![]);
    for _ in 0..args.repetitions.max(1) {
        let (d, n) = plain_scan(&pool).await?;
        scans.push(d);
        let (r, m) = replay(&pool).await?;
        replays.push(r);
        anyhow::ensure!(n == m, "scan saw {n} rows, replay {m}");
    }
    let started = Instant::now();
    let report = views::rebuild(&pool, false).await?;
    let full = started.elapsed();
    let s = Stats::of(scans.iter().map(Duration::as_secs_f64));
    let r = Stats::of(replays.iter().map(Duration::as_secs_f64));
    println!(
        "== rebuild from {} events ({} repetitions, alternating)",
        report.events, args.repetitions
    );
    println!("plain sequential read to the client, s: {s}");
    println!("replay into the views (decode + apply), s: {r}");
    println!(
        "ratio replay / scan: {:.2} (goal <= 3)",
        r.median / s.median
    );
    println!(
        "full `views rebuild` (replay + read live + compare, one snapshot): {full:.2?}, {} differences",
        report.differences.len()
    );
    pool.close().await;
    Ok(())
}
