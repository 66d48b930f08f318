//! Cluster-wide rate limits kept in Postgres.
//!
//! Each limiter is one row holding the next free slot. Taking a slot is one
//! atomic UPDATE that moves the row forward by the spacing, so however many
//! processes ask at once, the slots they get are at least one spacing apart
//! (a burst lets the row lag behind the clock by up to `burst - 1` spacings).
//! The database's clock is the one every process shares, so the wait is
//! computed there. A slot taken by a caller that then dies is simply unused:
//! the limit errs on the slow side, never the fast one.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::config::Rate;
use crate::provider::discipline::{Pacer, PacerFuture};

#[derive(Debug, Clone)]
pub struct Limiter {
    pool: PgPool,
    name: &'static str,
    /// Shared by clones; follows the cluster's setting (`set_rate`).
    rate: Arc<std::sync::Mutex<Rate>>,
}

/// Limiter names: one row each in `shepherd.limiters`.
pub const DEVICE_CREATION: &str = "device_creation";
pub const METAL_API: &str = "metal_api";
pub const LATITUDE_READS: &str = "latitude_reads";
pub const LATITUDE_WRITES: &str = "latitude_writes";

impl Limiter {
    pub fn new(pool: PgPool, name: &'static str, rate: Rate) -> Self {
        Limiter {
            pool,
            name,
            rate: Arc::new(std::sync::Mutex::new(rate)),
        }
    }

    pub fn rate(&self) -> Rate {
        *self.rate.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adopts a new rate for every clone of this limiter.
    pub fn set_rate(&self, rate: Rate) {
        let mut current = self.rate.lock().unwrap_or_else(|e| e.into_inner());
        if *current != rate {
            tracing::info!(limiter = self.name, from = %*current, to = %rate, "rate changed");
            *current = rate;
        }
    }

    /// Reserves the next slot; returns its start as a Unix time in seconds.
    pub async fn reserve(&self) -> Result<f64, sqlx::Error> {
        let rate = self.rate();
        let spacing = rate.spacing().as_secs_f64();
        let slack = spacing * f64::from(rate.burst.saturating_sub(1));
        sqlx::query_scalar(
            "insert into shepherd.limiters as l (name, next_at)
             values ($1, clock_timestamp() - make_interval(secs => $3) + make_interval(secs => $2))
             on conflict (name) do update
               set next_at = greatest(l.next_at, clock_timestamp() - make_interval(secs => $3))
                             + make_interval(secs => $2)
             returning extract(epoch from next_at - make_interval(secs => $2))::float8",
        )
        .bind(self.name)
        .bind(spacing)
        .bind(slack)
        .fetch_one(&self.pool)
        .await
    }

    /// Waits for a slot and returns how long it waited. A slot this caller
    /// reaches too late (the answer was slow, or the process was not
    /// scheduled) is given up and another taken: late slots bunched together
    /// are how a limiter lets a burst through. The cost is a slot left unused,
    /// never one used twice. Slots are compared with this host's clock, so
    /// hosts must keep their clocks within a fraction of the spacing (NTP).
    /// Dropping the future gives up the wait.
    pub async fn acquire(&self) -> Result<Duration, sqlx::Error> {
        let rate = self.rate();
        let started = std::time::Instant::now();
        if rate.is_unlimited() {
            // No budget, but a hold the provider asked for still applies.
            while let Some(left) = self.hold_left().await? {
                tokio::time::sleep(left).await;
            }
            return Ok(started.elapsed());
        }
        let lateness = rate.lateness().as_secs_f64();
        loop {
            let slot = self.reserve().await?;
            let wait = slot - unix_now();
            if wait > 0.0 {
                let wait = crate::provider::discipline::provider_wait(wait)
                    .unwrap_or(crate::provider::discipline::MAX_PROVIDER_WAIT);
                tokio::time::sleep(wait).await;
                // A hold recorded while this caller slept (another process
                // got a 429) moved every later slot past it; this one too.
                if self.held().await? {
                    continue;
                }
            }
            if unix_now() - slot <= lateness {
                return Ok(started.elapsed());
            }
            tracing::debug!(
                limiter = self.name,
                late_ms = (unix_now() - slot) * 1000.0,
                "slot missed; taking another"
            );
        }
    }
}

impl Limiter {
    /// Whether a hold the provider asked for is still running.
    async fn held(&self) -> Result<bool, sqlx::Error> {
        Ok(self.hold_left().await?.is_some())
    }

    /// What is left of a running hold.
    pub(crate) async fn hold_left(&self) -> Result<Option<Duration>, sqlx::Error> {
        let left: Option<f64> = sqlx::query_scalar(
            "select extract(epoch from held_until - clock_timestamp())::float8
             from shepherd.limiters where name = $1 and held_until > clock_timestamp()",
        )
        .bind(self.name)
        .fetch_optional(&self.pool)
        .await?
        .flatten();
        // A row edited by hand, or written before holds were bounded, is
        // read within the bound too.
        Ok(left
            .filter(|s| *s > 0.0)
            .and_then(crate::provider::discipline::provider_wait))
    }

    /// No slot starts before `wait` from now, for any process: the
    /// provider asked the whole key to slow down. Counted and kept on the
    /// limiter's row (`holds`, `held_until`) for operators.
    pub async fn hold(&self, wait: Duration) -> Result<(), sqlx::Error> {
        sqlx::query(
            "insert into shepherd.limiters as l (name, next_at, held_until, holds)
             values ($1, clock_timestamp() + make_interval(secs => $2),
                     clock_timestamp() + make_interval(secs => $2), 1)
             on conflict (name) do update
               set next_at = greatest(l.next_at, excluded.next_at),
                   held_until = greatest(l.held_until, excluded.held_until),
                   holds = l.holds + 1",
        )
        .bind(self.name)
        .bind(
            wait.min(crate::provider::discipline::MAX_PROVIDER_WAIT)
                .as_secs_f64(),
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// A limiter paces API calls: the cluster-wide budget of calls
/// (`api_rate`) and, before every POST, device creations. One mechanism for
/// both.
impl Pacer for Limiter {
    fn wait_turn(&self) -> PacerFuture<'_> {
        Box::pin(async move {
            let waited = self
                .acquire()
                .await
                .map_err(|e| format!("the {} limiter's database is unreachable: {e}", self.name))?;
            if !waited.is_zero() {
                tracing::debug!(
                    limiter = self.name,
                    waited_ms = waited.as_millis() as u64,
                    "waited for a slot"
                );
            }
            Ok(())
        })
    }

    fn set_rate(&self, rate: Rate) {
        Limiter::set_rate(self, rate);
    }

    fn slack(&self) -> Duration {
        self.rate().lateness()
    }

    fn hold(&self, wait: Duration) -> PacerFuture<'_> {
        Box::pin(async move {
            Limiter::hold(self, wait)
                .await
                .map_err(|e| format!("the {} limiter's database is unreachable: {e}", self.name))
        })
    }
}

/// At most `calls` call starts in any window of `per`, cluster-wide: the
/// budget of a provider that counts calls per key per minute (Latitude.sh:
/// 60 reads, 20 writes). A token bucket of the same rate lets up to twice
/// that through one sliding window (a full bucket, then its refill); this
/// keeps the last slots handed out and gives the next one a window after
/// the one `calls - 1` places back. The window is widened a little for
/// clocks and the network, and a slot reached late is given up, so the
/// provider never counts more than `calls` in a window it measures. Holds
/// (a 429's `retry_after`) are shared with [`Limiter`]'s row of the same
/// name.
#[derive(Debug, Clone)]
pub struct WindowLimiter {
    row: Limiter,
    calls: u32,
    per: Duration,
}

/// How late a slot may be used: the widening of the window covers it.
const WINDOW_LATENESS: Duration = Duration::from_millis(100);

impl WindowLimiter {
    pub fn new(pool: PgPool, name: &'static str, calls: u32, per: Duration) -> Self {
        WindowLimiter {
            row: Limiter::new(pool, name, Rate::UNLIMITED),
            calls: calls.max(1),
            per,
        }
    }

    /// The window slots are spaced by: the provider's, plus 2 % and 250 ms.
    pub fn window(&self) -> Duration {
        self.per + self.per / 50 + Duration::from_millis(250)
    }

    /// Reserves the next slot; returns its start as a Unix time in seconds.
    pub async fn reserve(&self) -> Result<f64, sqlx::Error> {
        sqlx::query_scalar("select shepherd.take_window_slot($1, $2, $3)")
            .bind(self.row.name)
            .bind(self.calls as i32)
            .bind(self.window().as_secs_f64())
            .fetch_one(&self.row.pool)
            .await
    }

    /// Waits for a slot and returns how long it waited.
    pub async fn acquire(&self) -> Result<Duration, sqlx::Error> {
        let started = std::time::Instant::now();
        loop {
            let slot = self.reserve().await?;
            let wait = slot - unix_now();
            if wait > 0.0 {
                tokio::time::sleep(Duration::from_secs_f64(wait)).await;
                if self.row.held().await? {
                    continue;
                }
            }
            if unix_now() - slot <= WINDOW_LATENESS.as_secs_f64() {
                return Ok(started.elapsed());
            }
        }
    }
}

impl Pacer for WindowLimiter {
    fn wait_turn(&self) -> PacerFuture<'_> {
        Box::pin(async move {
            self.acquire().await.map(drop).map_err(|e| {
                format!(
                    "the {} limiter's database is unreachable: {e}",
                    self.row.name
                )
            })
        })
    }

    fn hold(&self, wait: Duration) -> PacerFuture<'_> {
        Box::pin(async move {
            self.row.hold(wait).await.map_err(|e| {
                format!(
                    "the {} limiter's database is unreachable: {e}",
                    self.row.name
                )
            })
        })
    }
}
