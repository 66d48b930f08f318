//! The discipline every provider's client shares: how failures are retried
//! (the seed's exponential backoff), how call starts are spaced (a
//! [`Pacer`]: in one process, or cluster-wide in Postgres), and the fence a
//! create asks right before it leaves.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use backoff::ExponentialBackoff;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::config::Rate;

/// Exponential backoff for transient failures. Defaults are cenkalti/backoff's,
/// which the seed used: 500 ms, x1.5, ±50 %, at most 60 s apart, 15 min in all.
#[derive(Debug, Clone, PartialEq)]
pub struct RetrySettings {
    pub initial_interval: Duration,
    pub multiplier: f64,
    pub randomization_factor: f64,
    pub max_interval: Duration,
    pub max_elapsed: Duration,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            initial_interval: Duration::from_millis(500),
            multiplier: 1.5,
            randomization_factor: 0.5,
            max_interval: Duration::from_secs(60),
            max_elapsed: Duration::from_secs(15 * 60),
        }
    }
}

impl RetrySettings {
    pub fn backoff(&self) -> ExponentialBackoff {
        backoff::ExponentialBackoffBuilder::new()
            .with_initial_interval(self.initial_interval)
            .with_multiplier(self.multiplier)
            .with_randomization_factor(self.randomization_factor)
            .with_max_interval(self.max_interval)
            .with_max_elapsed_time(Some(self.max_elapsed))
            .build()
    }
}

/// Resolves when the call may start; an `Err` (say, the pacer's database is
/// unreachable) fails the attempt as transient.
pub type PacerFuture<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;

/// Spaces the starts of API calls. The in-process pacer serves one process;
/// a cluster-wide one keeps its clock in Postgres.
pub trait Pacer: Send + Sync + 'static {
    /// Resolves when the caller may start its call. Dropping the future gives
    /// up the wait.
    fn wait_turn(&self) -> PacerFuture<'_>;

    /// Adopts a new budget (the cluster's `api_rate` changed). A pacer that
    /// cannot change keeps its own.
    fn set_rate(&self, _rate: Rate) {}

    /// How long after its turn a caller may still start its call. A caller
    /// held up longer (by something of its own after the turn) takes another
    /// turn: starts bunched behind a hold-up are how a limit lets a burst
    /// through.
    fn slack(&self) -> Duration {
        Duration::MAX
    }

    /// The provider asked for no calls for `wait` (a 429's `Retry-After`):
    /// no turn is given before it has passed, to any caller sharing this
    /// pacer. Best effort: a pacer that cannot record it lets the caller's
    /// own hold stand alone.
    fn hold(&self, _wait: Duration) -> PacerFuture<'_> {
        Box::pin(async { Ok(()) })
    }
}

/// A token bucket within one process: `burst` starts at once, then one per
/// `interval / burst`, first come first served.
#[derive(Debug)]
pub struct LocalPacer {
    rate: std::sync::Mutex<Rate>,
    /// The start the next caller is given when the bucket is empty; lags
    /// behind the clock by up to `burst - 1` spacings when it is not. `None`:
    /// nothing asked yet, the bucket is full.
    next: Mutex<Option<Instant>>,
}

impl LocalPacer {
    pub fn new(rate: Rate) -> Self {
        LocalPacer {
            rate: std::sync::Mutex::new(rate),
            next: Mutex::new(None),
        }
    }

    fn rate(&self) -> Rate {
        *self.rate.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Pacer for LocalPacer {
    fn wait_turn(&self) -> PacerFuture<'_> {
        Box::pin(async move {
            let rate = self.rate();
            let turn = {
                let mut next = self.next.lock().await;
                let now = Instant::now();
                if rate.is_unlimited() && next.is_none_or(|n| n <= now) {
                    return Ok(());
                }
                let spacing = rate.spacing();
                let credit = spacing * rate.burst.saturating_sub(1);
                let full = now.checked_sub(credit).unwrap_or(now);
                let turn = next.map_or(full, |n| n.max(full));
                *next = Some(turn + spacing);
                turn
            };
            tokio::time::sleep_until(turn).await;
            Ok(())
        })
    }

    fn set_rate(&self, rate: Rate) {
        *self.rate.lock().unwrap_or_else(|e| e.into_inner()) = rate;
    }

    fn slack(&self) -> Duration {
        self.rate().lateness()
    }

    fn hold(&self, wait: Duration) -> PacerFuture<'_> {
        Box::pin(async move {
            let mut next = self.next.lock().await;
            let until = Instant::now() + wait.min(MAX_PROVIDER_WAIT);
            *next = Some(next.map_or(until, |n| n.max(until)));
            Ok(())
        })
    }
}

/// The longest a provider may make the cluster wait (a 429's
/// `Retry-After`, a hold recorded from one): a wait beyond it is a provider
/// bug or an attack, and the whole cluster would stop on it.
pub const MAX_PROVIDER_WAIT: Duration = Duration::from_secs(15 * 60);

/// A wait a provider asked for, in seconds, made safe to keep: `None` when
/// it is no number of seconds (NaN, infinite, negative), and at most
/// [`MAX_PROVIDER_WAIT`] (`Duration::from_secs_f64` panics past its range).
pub fn provider_wait(secs: f64) -> Option<Duration> {
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Some(Duration::from_secs_f64(
        secs.min(MAX_PROVIDER_WAIT.as_secs_f64()),
    ))
}

/// Whether `base_url` may carry the API's credential: `https://`, or
/// `http://` to this machine only (a fake in a test or the demo), where
/// the credential never crosses a network; `http://` anywhere only when
/// the operator allowed it (`plain_http`: a fake in another container).
pub fn credential_url_allowed(base_url: &str, plain_http: bool) -> Result<(), String> {
    let Ok(url) = reqwest::Url::parse(base_url) else {
        return Err(format!("the API URL {base_url:?} is not a URL"));
    };
    match url.scheme() {
        "https" => Ok(()),
        "http" => {
            let host = url.host_str().unwrap_or_default();
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let loopback = host.eq_ignore_ascii_case("localhost")
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            if loopback || plain_http {
                Ok(())
            } else {
                Err(format!(
                    "the API URL {base_url:?} is plain http to another machine: the credential would \
                     cross the network in the clear (https://; http:// to this machine, or with the \
                     allow-plain-http setting, is for a fake)"
                ))
            }
        }
        _ => Err(format!("the API URL {base_url:?} is not an http(s) URL")),
    }
}

/// A transport error without its URL's query or any header: the kind and
/// the innermost cause are what an operator needs.
pub fn describe_transport_error(e: &reqwest::Error) -> String {
    let kind = if e.is_connect() {
        "connection failed"
    } else if e.is_timeout() {
        "timed out"
    } else if e.is_body() || e.is_decode() {
        "connection broke while reading the answer"
    } else if e.is_request() {
        "request failed"
    } else {
        "transport error"
    };
    let mut source: &dyn std::error::Error = e;
    while let Some(inner) = source.source() {
        source = inner;
    }
    format!("{kind}: {source}")
}

/// Asked right before a create (or a delete) leaves, after its turn under
/// every budget: whether the caller may still send it. A creation holds its
/// unit's lock while it may send; the wait for a turn can outlast that lock
/// (a database restart drops it), so the question is asked last. `Err`
/// says why not, and nothing is sent.
pub trait Fence: Send + Sync {
    fn check(&self) -> futures::future::BoxFuture<'_, Result<(), String>>;
}

/// A fence that always lets the call go (a caller with nothing to guard:
/// a test, a one-shot command).
#[derive(Debug, Clone, Copy, Default)]
pub struct Open;

impl Fence for Open {
    fn check(&self) -> futures::future::BoxFuture<'_, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
}
