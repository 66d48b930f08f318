//! The sweep as a service: every worker runs it now and then, so work in
//! flight that lost its job is resumed whoever is alive. One sweep runs at a
//! time across the cluster (`shepherd::jobs::sweep`).

use std::time::Duration;

use shepherd::jobs::sweep;
use sqlx::PgPool;

use crate::services::outage::Outage;
use crate::services::runtime::Stop;

/// A sweep that fails while the database is gone is said once for the
/// outage (`outage`), not at every interval.
pub async fn run(pool: PgPool, interval: Duration, stop: Stop, outage: Outage) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.clone().wait() => break,
        }
        match sweep::run_once(&pool).await {
            Ok(out) if out.skipped => {}
            Ok(out) => {
                if !out.creations_resumed.is_empty() || !out.assimilations_resumed.is_empty() {
                    tracing::info!(
                        creations = out.creations_resumed.len(),
                        assimilations = out.assimilations_resumed.len(),
                        "sweep resumed work in flight"
                    );
                }
            }
            Err(e) => outage.failed(&pool, &stop, "sweep", &e.to_string()).await,
        }
    }
}
