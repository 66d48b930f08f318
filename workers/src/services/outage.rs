//! A process that loses its database says so once, with the server's own
//! reason, and then quietly until the server answers again. Its four queue
//! workers (and its scheduler's ticks and sweeps) each fail and retry while
//! it is gone; said each time, with
//! the pool's "timed out while waiting for an open connection", that was a
//! dozen errors a minute that named neither the cause (a full server, a
//! role at its limit, a server down) nor the next step. Meanwhile no queue
//! fetches a job: the queues and the jobs share one pool, so a queue that
//! cannot fetch is a process that could not have finished the job.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::PgPool;

use super::runtime::Stop;

/// How often a process that lost its database asks whether it is back.
const RECHECK: Duration = Duration::from_secs(5);

#[derive(Clone, Default, Debug)]
pub struct Outage {
    down: Arc<AtomicBool>,
    /// One failure at a time asks the server: the four queues fail
    /// together, and each question is a connection beyond the formula.
    asking: Arc<AtomicBool>,
}

impl Outage {
    /// `what` failed with `error`. When the server refuses or does not
    /// answer, the first failure of an outage is said at ERROR with the
    /// reason, and a watch says when the server answers again; the rest of
    /// the outage's failures are said at DEBUG. A failure while the server
    /// answers is said at ERROR every time: it is not an outage.
    pub async fn failed(&self, pool: &PgPool, stop: &Stop, what: &str, error: &str) {
        if self.down.load(Ordering::SeqCst) || self.asking.swap(true, Ordering::SeqCst) {
            tracing::debug!(what, error, "failed while the database is unavailable");
            return;
        }
        let cause = tokio::select! {
            cause = shepherd::db::diagnose(pool) => cause,
            () = stop.clone().wait() => None,
        };
        self.asking.store(false, Ordering::SeqCst);
        let Some(cause) = cause else {
            tracing::error!(
                what,
                error,
                "failed, though the database takes connections; trying again"
            );
            return;
        };
        self.down.store(true, Ordering::SeqCst);
        tracing::error!(
            what,
            error,
            cause = %cause,
            "the database cannot be used: this process can open no connection to it, so its queues fetch no job; trying again every few seconds"
        );
        let (down, pool, stop) = (self.down.clone(), pool.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = tokio::time::sleep(RECHECK) => {}
                    () = stop.clone().wait() => return,
                }
                if shepherd::db::diagnose(&pool).await.is_none() {
                    down.store(false, Ordering::SeqCst);
                    tracing::info!("the database takes connections again");
                    return;
                }
            }
        });
    }
}
