//! The scheduler: one Reconcile per period, however many copies run.
//!
//! Each copy computes the current period from the database's clock and
//! pushes that period's Reconcile with the period as its idempotency key; the
//! queue keeps keys unique, so the first push wins and the others are no-ops.
//! (apalis-cron would fire in every process.)

use std::time::Duration;

use shepherd::config::Rate;
use shepherd::jobs::{ReconcileArgs, queue};
use sqlx::PgPool;

use crate::services::runtime::Stop;

/// What one tick did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tick {
    Enqueued,
    /// Another scheduler enqueued this period's pass already.
    AlreadyEnqueued,
}

pub async fn run_once(pool: &PgPool, period: Duration) -> Result<(Tick, Duration), sqlx::Error> {
    let period_ms = period.as_millis().max(1) as i64;
    let (index, until_next_ms): (i64, i64) = sqlx::query_as(
        "select (extract(epoch from now()) * 1000)::bigint / $1,
                $1 - (extract(epoch from now()) * 1000)::bigint % $1",
    )
    .bind(period_ms)
    .fetch_one(pool)
    .await?;
    let key = format!("tick/{period_ms}ms/{index}");
    let mut tx = pool.begin().await?;
    let pushed = queue::push_reconcile(
        &mut tx,
        &ReconcileArgs {
            requested_by: "scheduler".into(),
        },
        Some(&key),
    )
    .await?;
    tx.commit().await?;
    let tick = if pushed.is_some() {
        Tick::Enqueued
    } else {
        Tick::AlreadyEnqueued
    };
    Ok((tick, Duration::from_millis(until_next_ms.max(1) as u64)))
}

/// Deletes finished jobs older than `retention`; returns how many.
pub async fn prune(pool: &PgPool, retention: Duration) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("select shepherd.prune_jobs(make_interval(secs => $1))")
        .bind(retention.as_secs_f64())
        .fetch_one(pool)
        .await
}

/// A tick that fails while the database is gone is said once for the
/// outage (`outage`), not every 2 s.
pub async fn run(
    pool: PgPool,
    rate: Rate,
    retention: Duration,
    stop: Stop,
    outage: super::outage::Outage,
) {
    let period = if rate.is_unlimited() {
        Duration::from_secs(1)
    } else {
        rate.spacing()
    };
    tracing::info!(?period, "scheduler running");
    loop {
        let wait = match run_once(&pool, period).await {
            Ok((tick, next)) => {
                if tick == Tick::Enqueued {
                    tracing::info!("reconcile enqueued for this period");
                    // One scheduler per period prunes: the one whose tick won.
                    match prune(&pool, retention).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(jobs = n, "pruned finished jobs"),
                        Err(e) => tracing::warn!(error = %e, "pruning finished jobs failed"),
                    }
                }
                next
            }
            Err(e) => {
                outage
                    .failed(&pool, &stop, "scheduler tick", &e.to_string())
                    .await;
                Duration::from_secs(2)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.clone().wait() => break,
        }
    }
    tracing::info!("scheduler stopped");
}
