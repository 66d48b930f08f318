//! Call discipline: how many calls may be in flight, how far apart they
//! start, how long one attempt may take, and how failures are retried.
//!
//! The seed declared `api_rate` but never applied it, and retried 4xx answers
//! for fifteen minutes. Here every attempt passes the same gate: a semaphore
//! bounds calls in flight, a [`Pacer`] spaces their starts, and only errors
//! whose [`ErrorClass`](super::error::ErrorClass) says so are retried, with
//! the seed's exponential backoff parameters.

use std::future::Future;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::time::Duration;

use backoff::backoff::Backoff;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::Operation;
use super::error::MetalError;
use crate::config::Rate;

/// The seed's `equinix_parallelism` default.
pub const PARALLELISM_DEFAULT: usize = 3;
pub use crate::config::API_RATE_DEFAULT;
/// Long enough for a slow listing page, short enough that a hung connection
/// does not hold one of the few in-flight slots for minutes.
pub const ATTEMPT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

pub use crate::provider::discipline::{LocalPacer, Pacer, PacerFuture, RetrySettings};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub endpoint: &'static str,
    /// The HTTP status, or `timeout` / `error` when none came back.
    pub status: String,
}

/// The API client's Prometheus metrics.
#[derive(Debug, Clone)]
pub struct ClientMetrics {
    /// The provider the client speaks to: every series carries it as its
    /// `provider` label (`shepherd_provider_*`), so one set of alerts serves
    /// every provider.
    pub provider: &'static str,
    pub request_duration: Family<RequestLabels, Histogram>,
    pub in_flight: Gauge<i64, AtomicI64>,
    pub waiting: Gauge<i64, AtomicI64>,
    /// Answers that asked the cluster to slow down (429, or a rate-limit
    /// budget reported spent).
    pub throttled: Counter,
    /// When the last hold the provider asked for ends, as a Unix time.
    pub held_until: Gauge<f64, AtomicU64>,
    /// The last hour of latencies, a minute at a time (the console's chart).
    pub latency: LatencyLog,
}

/// Request latency per minute over the last hour, for a chart: a histogram
/// says how latency is spread since the process started, not how it moved.
#[derive(Debug, Clone, Default)]
pub struct LatencyLog(std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<LatencyMinute>>>);

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyMinute {
    /// Unix time of the minute's start, in minutes.
    pub minute: i64,
    pub calls: u64,
    pub total_seconds: f64,
    pub max_seconds: f64,
}

impl LatencyLog {
    const MINUTES: usize = 60;

    pub fn record(&self, at: std::time::SystemTime, seconds: f64) {
        let minute = at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64 / 60);
        let mut log = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match log.back_mut() {
            Some(last) if last.minute == minute => {
                last.calls += 1;
                last.total_seconds += seconds;
                last.max_seconds = last.max_seconds.max(seconds);
            }
            _ => {
                log.push_back(LatencyMinute {
                    minute,
                    calls: 1,
                    total_seconds: seconds,
                    max_seconds: seconds,
                });
                while log.len() > Self::MINUTES {
                    log.pop_front();
                }
            }
        }
    }

    /// The minutes with calls, oldest first.
    pub fn minutes(&self) -> Vec<LatencyMinute> {
        let log = self.0.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().copied().collect()
    }
}

impl Default for ClientMetrics {
    fn default() -> Self {
        ClientMetrics::for_provider(crate::metal::provider::NAME)
    }
}

impl ClientMetrics {
    /// Metrics for a client of `provider` (`metal`, `latitude`).
    pub fn for_provider(provider: &'static str) -> Self {
        ClientMetrics {
            provider,
            // 5 ms to ~40 s: from a local fake to a slow listing page.
            request_duration: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 2.0, 14))
            }),
            in_flight: Gauge::default(),
            waiting: Gauge::default(),
            throttled: Counter::default(),
            held_until: Gauge::default(),
            latency: LatencyLog::default(),
        }
    }

    /// One attempt's answer (its HTTP status, or `timeout` / `error`) and
    /// how long it took: for the histogram and the console's chart.
    pub fn observe(&self, endpoint: &'static str, status: String, seconds: f64) {
        self.request_duration
            .get_or_create(&RequestLabels { endpoint, status })
            .observe(seconds);
        self.latency.record(std::time::SystemTime::now(), seconds);
    }

    pub fn register(&self, registry: &mut Registry) {
        let registry = registry.sub_registry_with_label((
            std::borrow::Cow::Borrowed("provider"),
            std::borrow::Cow::Borrowed(self.provider),
        ));
        registry.register(
            "shepherd_provider_request_duration_seconds",
            "Latency of the provider's API requests by endpoint and status",
            self.request_duration.clone(),
        );
        registry.register(
            "shepherd_provider_calls_in_flight",
            "The provider's API calls currently being sent or awaited",
            self.in_flight.clone(),
        );
        registry.register(
            "shepherd_provider_calls_waiting",
            "The provider's API calls waiting for a slot or for their turn",
            self.waiting.clone(),
        );
        registry.register(
            "shepherd_provider_throttled",
            "Answers that asked shepherd to slow down (429 or a spent rate-limit budget); each holds every call of the cluster",
            self.throttled.clone(),
        );
        registry.register(
            "shepherd_provider_hold_until_timestamp_seconds",
            "Unix time at which the last hold the provider asked for ends (0: none yet)",
            self.held_until.clone(),
        );
    }
}

/// The gate every attempt passes.
pub(crate) struct Gate {
    slots: Arc<Semaphore>,
    pacer: Arc<dyn Pacer>,
    /// The end of the last hold this process was asked for: checked after
    /// every turn, so a caller that got its turn from a pacer that had not
    /// yet heard of the hold still waits.
    held_until: std::sync::Mutex<Option<Instant>>,
    pub(crate) metrics: ClientMetrics,
}

/// Held while an attempt is on the wire; releases its slot and gauges on drop,
/// so a cancelled call gives everything back.
pub(crate) struct Admission {
    _permit: OwnedSemaphorePermit,
    in_flight: Gauge<i64, AtomicI64>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.in_flight.dec();
    }
}

/// One more on a gauge while held: a call cancelled while it waits or
/// talks gives it back. Both providers' clients count with it.
pub(crate) struct Counted(Gauge<i64, AtomicI64>);

impl Counted {
    pub(crate) fn new(gauge: &Gauge<i64, AtomicI64>) -> Self {
        gauge.inc();
        Counted(gauge.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Gate {
    pub(crate) fn set_rate(&self, rate: Rate) {
        self.pacer.set_rate(rate);
    }

    /// The provider asked for a pause of `wait`: every caller of this
    /// process waits it out, and the pacer tells the rest of the cluster.
    pub(crate) async fn hold(&self, op: Operation, wait: Duration) {
        let wait = wait.min(crate::provider::discipline::MAX_PROVIDER_WAIT);
        let until = Instant::now() + wait;
        {
            let mut held = self.held_until.lock().unwrap_or_else(|e| e.into_inner());
            *held = Some(held.map_or(until, |h| h.max(until)));
        }
        self.metrics.throttled.inc();
        let unix_until = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| (d + wait).as_secs_f64());
        self.metrics.held_until.set(unix_until);
        tracing::warn!(
            op = op.id(),
            wait_ms = wait.as_millis() as u64,
            "the provider asked to slow down; holding every call"
        );
        if let Err(e) = self.pacer.hold(wait).await {
            tracing::warn!(error = %e, "could not share the hold with the cluster");
        }
    }

    fn hold_remaining(&self) -> Option<Instant> {
        let held = *self.held_until.lock().unwrap_or_else(|e| e.into_inner());
        held.filter(|h| *h > Instant::now())
    }

    pub(crate) fn new(parallelism: usize, pacer: Arc<dyn Pacer>, metrics: ClientMetrics) -> Self {
        Gate {
            slots: Arc::new(Semaphore::new(parallelism.max(1))),
            pacer,
            held_until: std::sync::Mutex::new(None),
            metrics,
        }
    }

    /// Waits for a slot, then for a turn. The slot is taken first so that a
    /// turn is never spent by a caller that then waits for a slot: starts stay
    /// at least one interval apart.
    pub(crate) async fn admit(&self, op: Operation) -> Result<Admission, MetalError> {
        let waiting = Counted::new(&self.metrics.waiting);
        let permit = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        loop {
            self.pacer
                .wait_turn()
                .await
                .map_err(|reason| MetalError::Transient { op, reason })?;
            match self.hold_remaining() {
                // The turn fell inside a hold: wait it out and take another,
                // so the calls after a hold are spaced by the pacer again.
                Some(until) => tokio::time::sleep_until(until).await,
                None => break,
            }
        }
        drop(waiting);
        self.metrics.in_flight.inc();
        Ok(Admission {
            _permit: permit,
            in_flight: self.metrics.in_flight.clone(),
        })
    }
}

/// Runs `attempt` until it succeeds, fails permanently, or the backoff budget
/// is spent. A rate-limited answer waits at least as long as the server asked.
pub(crate) async fn retry<T, F, Fut>(
    settings: &RetrySettings,
    what: &str,
    mut attempt: F,
) -> Result<T, MetalError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, MetalError>>,
{
    let mut backoff = settings.backoff();
    let started = Instant::now();
    let mut n = 0u32;
    loop {
        n += 1;
        let err = match attempt(n).await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_retryable() => e,
            Err(e) => return Err(e),
        };
        let Some(mut wait) = backoff.next_backoff() else {
            tracing::warn!(what, attempts = n, error = %err, "giving up after retries");
            return Err(err);
        };
        if let MetalError::RateLimited {
            retry_after: Some(asked),
            ..
        } = &err
        {
            wait = wait.max(*asked);
        }
        if started.elapsed() + wait > settings.max_elapsed {
            tracing::warn!(what, attempts = n, error = %err, "giving up: the next wait would pass the retry budget");
            return Err(err);
        }
        tracing::info!(what, attempt = n, wait_ms = wait.as_millis() as u64, error = %err, "retrying");
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn the_latency_log_sums_each_minute_and_keeps_the_last_hour() {
        let log = LatencyLog::default();
        let at = |minute: u64, second: u64| UNIX_EPOCH + Duration::from_secs(minute * 60 + second);
        log.record(at(1000, 5), 0.1);
        log.record(at(1000, 50), 0.3);
        log.record(at(1001, 0), 0.2);
        let minutes = log.minutes();
        assert_eq!(minutes.len(), 2);
        assert_eq!(minutes[0].minute, 1000);
        assert_eq!(minutes[0].calls, 2);
        assert!((minutes[0].total_seconds - 0.4).abs() < 1e-9);
        assert_eq!(minutes[0].max_seconds, 0.3);
        for m in 1002..1100 {
            log.record(at(m, 0), 0.01);
        }
        let minutes = log.minutes();
        assert_eq!(minutes.len(), 60);
        assert_eq!(minutes[0].minute, 1040);
        assert_eq!(minutes[59].minute, 1099);
    }
}
