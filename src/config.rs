//! Typed settings with the seed's defaults, and parsing of the ones the seed
//! wrote as strings: durations such as `5s` and rates such as `5s,1` (one
//! event per five seconds, bursts of one). Flags and environment variables
//! are mapped onto these in the `workers` package.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Parses `250ms`, `5s`, `1m`, `2h`, `7d`, their sums such as `1m30s` or
/// `1h 15m`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let hint = || format!("{text:?} is not a duration (try 500ms, 5s, 1m30s or 1h)");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(hint());
    }
    let mut seconds = 0.0;
    let mut first = true;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        let value: f64 = number.parse().map_err(|_| hint())?;
        let letters = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(letters);
        let factor = match unit.trim() {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            // A bare number is seconds, but only alone: `1m30` is a slip.
            "" if first && next.is_empty() => 1.0,
            "" => return Err(hint()),
            other => {
                return Err(format!(
                    "{text:?} has unknown unit {other:?} (use ms, s, m, h or d)"
                ));
            }
        };
        seconds += value * factor;
        first = false;
        rest = next.trim_start();
    }
    // A year bounds every duration shepherd takes, and keeps the arithmetic
    // on timestamps far from overflowing.
    if !seconds.is_finite() || !(0.0..=365.0 * 86400.0).contains(&seconds) {
        return Err(format!(
            "{text:?} is not a usable duration (at most a year)"
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Writes a duration the way [`parse_duration`] reads it.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(3_600_000) && ms > 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// `interval,burst`: at most `burst` events per `interval`, as the seed's
/// `flagLimiter` read them (`5s,1`). An interval of zero means no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub interval: Duration,
    pub burst: u32,
}

impl Rate {
    pub const UNLIMITED: Rate = Rate {
        interval: Duration::ZERO,
        burst: 1,
    };

    pub fn is_unlimited(&self) -> bool {
        self.interval.is_zero()
    }

    /// Time between two events at the sustained rate.
    pub fn spacing(&self) -> Duration {
        self.interval / self.burst.max(1)
    }

    /// How late a caller may start after its turn: a quarter spacing of
    /// scheduling jitter, plus the credit of a burst (a turn may lie in the
    /// past by up to `burst - 1` spacings). Later than that, the caller was
    /// held up, and starting anyway would bunch it with the next one.
    pub fn lateness(&self) -> Duration {
        if self.is_unlimited() {
            return Duration::MAX;
        }
        let spacing = self.spacing();
        (spacing / 4).max(Duration::from_millis(2)) + spacing * self.burst.saturating_sub(1)
    }
}

impl Rate {
    /// A rate, or a bare interval meaning a burst of 1: how `api_rate` was
    /// written before it became a budget (`2s`), so old settings still read.
    pub fn parse_or_interval(s: &str) -> Result<Rate, String> {
        if s.contains(',') {
            s.parse()
        } else {
            Ok(Rate {
                interval: parse_duration(s)?,
                burst: 1,
            })
        }
    }
}

impl FromStr for Rate {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (interval, burst) = s
            .split_once(',')
            .ok_or_else(|| format!("{s:?} is not a rate: write INTERVAL,BURST such as 5s,1"))?;
        let interval = parse_duration(interval).map_err(|e| format!("rate {s:?}: {e}"))?;
        let burst: u32 = burst
            .trim()
            .parse()
            .ok()
            .filter(|b| *b < 1_000_000)
            .ok_or_else(|| {
                format!("rate {s:?}: the burst {burst:?} is not a whole number below a million")
            })?;
        if burst == 0 {
            return Err(format!("rate {s:?}: the burst must be at least 1"));
        }
        Ok(Rate { interval, burst })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}", format_duration(self.interval), self.burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_grace_is_half_the_windows_margin_over_an_attempt_and_at_most_a_second() {
        let rescue = |heartbeat: u64, missed: u32, api: u64| Rescue {
            heartbeat: Duration::from_secs(heartbeat),
            missed_heartbeats: missed,
            api_timeout: Duration::from_secs(api),
        };
        // 60 s window, 35 s for an attempt and a heartbeat: capped.
        assert_eq!(rescue(5, 12, 30).fence_grace(), Duration::from_secs(1));
        // 36 s window: a margin of 1 s, half of it.
        assert_eq!(rescue(4, 9, 31).fence_grace(), Duration::from_millis(500));
        // No margin (refused for creates anyway): always renew.
        assert_eq!(rescue(5, 6, 30).fence_grace(), Duration::ZERO);
        assert_eq!(rescue(5, 6, 40).fence_grace(), Duration::ZERO);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1h 15m").unwrap(), Duration::from_secs(4500));
        assert_eq!(
            parse_duration("2s500ms").unwrap(),
            Duration::from_millis(2500)
        );
        for bad in ["", "5x", "-1s", "s", "1.2.3s", "1m30", "1m-2s", "m5"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rates_as_the_seed_wrote_them() {
        let r: Rate = "5s,1".parse().unwrap();
        assert_eq!(r.interval, Duration::from_secs(5));
        assert_eq!(r.burst, 1);
        assert_eq!(r.to_string(), "5s,1");
        assert_eq!(
            "1m,2".parse::<Rate>().unwrap().spacing(),
            Duration::from_secs(30)
        );
        for bad in ["5x,1", "5s", "5s,0", "5s,-1", ",1"] {
            let err = bad.parse::<Rate>().unwrap_err();
            assert!(err.contains(bad), "{err}");
        }
    }
}

/// A setting that cannot be used, named so the operator knows which one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{setting}: {message}")]
pub struct ConfigError {
    pub setting: &'static str,
    pub message: String,
}

impl ConfigError {
    pub fn new(setting: &'static str, message: impl Into<String>) -> Self {
        ConfigError {
            setting,
            message: message.into(),
        }
    }
}

/// The cluster-wide API budget: a bucket of 20 calls refilled at one per
/// 100 ms. A pass's listings (a few dozen pages at 10,000 reservations) fit
/// in the bucket and run at the network's speed; the sustained 10 calls/s
/// stays well below what a provider tolerates, and a 429 holds the whole
/// cluster for as long as the provider asks. (The seed declared a 2 s
/// metronome and never applied it.)
pub const API_RATE_DEFAULT: Rate = Rate {
    interval: Duration::from_secs(2),
    burst: 20,
};

/// Retry policy of one job kind. Retries are persisted: a failed attempt
/// records its failure and enqueues a successor that runs after the backoff,
/// so a crash does not lose the delay (apalis retries a failed job at once).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JobRetry {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub factor: f64,
    pub max_backoff: Duration,
    /// One attempt's budget, waits for limiters included.
    pub timeout: Duration,
}

impl JobRetry {
    /// The delay before attempt `next` (2 for the first retry).
    pub fn backoff(&self, next: u32) -> Duration {
        let exp = next.saturating_sub(2) as i32;
        let secs = self.initial_backoff.as_secs_f64() * self.factor.max(1.0).powi(exp);
        Duration::from_secs_f64(secs.min(self.max_backoff.as_secs_f64()))
    }
}

pub const CREATE_RETRY_DEFAULT: JobRetry = JobRetry {
    max_attempts: 5,
    initial_backoff: Duration::from_secs(30),
    factor: 2.0,
    max_backoff: Duration::from_secs(600),
    // Long enough to wait out the creation limiter behind a full chunk
    // (20 x 5 s) and a slow create.
    timeout: Duration::from_secs(600),
};

pub const ASSIMILATE_RETRY_DEFAULT: JobRetry = JobRetry {
    max_attempts: 10,
    initial_backoff: Duration::from_secs(5),
    factor: 2.0,
    max_backoff: Duration::from_secs(300),
    timeout: Duration::from_secs(120),
};

/// The provisioner's settings; defaults are the seed's flags.
#[derive(Debug, Clone, PartialEq)]
pub struct ProvisionerConfig {
    /// Hostname prefix of the devices shepherd manages.
    pub device_prefix: String,
    /// OS slug new devices are created with.
    pub os: String,
    /// Managed machines plus creations in flight never exceed this; 0 = no limit.
    pub max_machines: u64,
    /// How many reservations one pass may take.
    pub chunk_size: u64,
    /// Adopt unknown prefixed devices instead of refusing to work.
    pub assimilate: bool,
    /// How often the scheduler enqueues a pass.
    pub reconcile_rate: Rate,
    /// Cluster-wide rate of device creations.
    pub device_creation_rate: Rate,
    /// Label of the project SSH key put on every device.
    pub ssh_key_label: String,
    pub penalty: PenaltyPolicy,
    /// Cluster-wide budget of API call starts (INTERVAL,BURST).
    pub api_rate: Rate,
    pub create_retry: JobRetry,
    pub assimilate_retry: JobRetry,
    /// How long after a create whose answer was not seen a look that finds
    /// nothing is trusted (see [`SETTLE_WINDOW_DEFAULT`]).
    pub settle_window: Duration,
    /// How a worker stays known to be alive, and how long one API attempt
    /// may take: together they decide when a second run of a creation may
    /// start (see [`Rescue`]).
    pub rescue: Rescue,
    /// The Latitude.sh key's budgets per minute, cluster-wide.
    pub latitude_reads_per_minute: u32,
    pub latitude_writes_per_minute: u32,
    /// How pools shed and replace machines.
    pub lifecycle: Lifecycle,
    /// The key an HTTP leave hook's requests are signed with (read from a
    /// file by each worker; never in the database, the events or a log).
    pub leave_hook_secret: Option<crate::secret::ApiToken>,
}

/// How a pool sheds surplus and replaces what failed, and the guards on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifecycle {
    /// A pool may lose the larger of this share of its count and
    /// `budget_min` machines per `budget_period` (`deletion_budget`,
    /// `deletion_period`).
    pub budget_percent: u32,
    pub budget_min: u32,
    pub budget_period: Duration,
    /// No machine of a pool is replaced while more than this share of it
    /// looks unhealthy (`max_unhealthy`).
    pub max_unhealthy_percent: u32,
    /// A machine not ready this long after it was made is replaced.
    pub ready_deadline: Duration,
    /// What a leaving machine waits for before its delete is sent.
    pub leave_hook: LeaveHook,
    /// How long it waits.
    pub leave_timeout: Duration,
    /// What happens when the wait ends unanswered.
    pub leave_deadline: LeaveDeadline,
    /// A machine whose deployment failed runs no workload: it does not wait.
    pub failed_skip_leave: bool,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            budget_percent: 10,
            budget_min: 2,
            budget_period: Duration::from_secs(300),
            max_unhealthy_percent: 40,
            // Latitude's own tools wait 30 minutes for a deployment.
            ready_deadline: Duration::from_secs(1800),
            leave_hook: LeaveHook::None,
            leave_timeout: Duration::from_secs(600),
            leave_deadline: LeaveDeadline::Proceed,
            failed_skip_leave: true,
        }
    }
}

impl Lifecycle {
    /// `deletion_budget` as written: `10%,2`.
    pub fn budget_text(&self) -> String {
        format!("{}%,{}", self.budget_percent, self.budget_min)
    }

    pub fn parse_budget(text: &str) -> Result<(u32, u32), String> {
        let bad = || format!("deletion_budget is PERCENT%,COUNT such as 10%,2, not {text:?}");
        let (pct, min) = text.split_once(',').ok_or_else(bad)?;
        let pct: u32 = pct
            .trim()
            .strip_suffix('%')
            .ok_or_else(bad)?
            .parse()
            .map_err(|_| bad())?;
        let min: u32 = min.trim().parse().map_err(|_| bad())?;
        if pct > 100 {
            return Err(bad());
        }
        Ok((pct, min))
    }

    pub fn parse_percent(text: &str) -> Result<u32, String> {
        text.trim()
            .strip_suffix('%')
            .and_then(|p| p.parse().ok())
            .filter(|p| *p <= 100)
            .ok_or_else(|| format!("{text:?} is not a percentage such as 40%"))
    }
}

/// What a leaving machine waits for before its delete is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaveHook {
    /// Nothing: the delete goes at once.
    None,
    /// An acknowledgement through the CLI or SQL (`shepherd machines ack`,
    /// `shepherd.acknowledge_leave()`), as a lifecycle hook's completion.
    Ack,
    /// An HTTP endpoint POSTed the machine; a 2xx answer lets it go.
    Http(String),
}

impl std::fmt::Display for LeaveHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaveHook::None => f.write_str("none"),
            LeaveHook::Ack => f.write_str("ack"),
            LeaveHook::Http(url) => f.write_str(url),
        }
    }
}

/// Why a leave hook's URL with credentials or a query is refused.
pub const LEAVE_HOOK_SECRET_IN_URL: &str = "leave_hook: a URL with credentials (user:password@) \
     or a query (?token=...) would publish them: the setting is recorded in the event log and \
     shown on the console's pages. Give the hook a plain URL and authenticate its requests with \
     the signature of --leave-hook-secret-file";

impl FromStr for LeaveHook {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "none" => Ok(LeaveHook::None),
            "ack" => Ok(LeaveHook::Ack),
            url if url.starts_with("http://") || url.starts_with("https://") => {
                // The URL is a setting: recorded in `settings_changed`, kept
                // in `cluster_settings` and shown on pages a reader sees. A
                // token in it would be published with it; the hook's
                // requests are signed with `--leave-hook-secret-file`.
                let parsed = reqwest::Url::parse(url)
                    .map_err(|e| format!("leave_hook {url:?} is no URL: {e}"))?;
                if !parsed.username().is_empty()
                    || parsed.password().is_some()
                    || parsed.query().is_some()
                    || parsed.fragment().is_some()
                {
                    return Err(LEAVE_HOOK_SECRET_IN_URL.into());
                }
                Ok(LeaveHook::Http(url.to_string()))
            }
            other => Err(format!(
                "leave_hook is none, ack, or an http(s) URL to POST to, not {other:?}"
            )),
        }
    }
}

/// What happens when a leave hook did not answer by its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaveDeadline {
    /// The delete is sent anyway.
    Proceed,
    /// The deletion ends; the machine stays.
    GiveUp,
}

impl LeaveDeadline {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaveDeadline::Proceed => "proceed",
            LeaveDeadline::GiveUp => "give_up",
        }
    }
}

impl FromStr for LeaveDeadline {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "proceed" => Ok(LeaveDeadline::Proceed),
            "give_up" => Ok(LeaveDeadline::GiveUp),
            other => Err(format!(
                "leave_deadline is proceed or give_up, not {other:?}"
            )),
        }
    }
}

/// How long a creation whose outcome was not seen holds its unit before a
/// look that finds nothing is trusted. Latitude.sh answers through
/// Cloudflare, whose default wait for an origin's answer is 100 s (a 524
/// after it), and a server an accepted create made can stay out of the
/// listings for a while behind its queue. Five minutes is three of those
/// waits with room for the listing to catch up; a unit waiting longer costs
/// a slower refill, while one trusted too early costs a second server,
/// billed by the hour.
pub const SETTLE_WINDOW_DEFAULT: Duration = Duration::from_secs(300);

/// When a worker is presumed dead and its jobs are handed to others: after
/// `missed_heartbeats` heartbeats of `heartbeat` without a word. A second
/// run of a creation may start then, so every worker must use the same
/// values (the cluster's), and one API attempt plus a heartbeat must end
/// inside that window: a POST on the wire when a database restart dropped
/// its unit's lock has then ended before the second run can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rescue {
    pub heartbeat: Duration,
    pub missed_heartbeats: u32,
    /// One API attempt's budget, of the cluster's provider.
    pub api_timeout: Duration,
}

impl Default for Rescue {
    fn default() -> Self {
        Rescue {
            heartbeat: Duration::from_secs(5),
            missed_heartbeats: 12,
            api_timeout: Duration::from_secs(30),
        }
    }
}

impl Rescue {
    /// After how long without a heartbeat a worker's jobs go to others.
    pub fn window(&self) -> Duration {
        self.heartbeat * self.missed_heartbeats
    }

    /// Refuses values that cannot work: no heartbeat, no missed heartbeat,
    /// no time for an API attempt.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.heartbeat.is_zero() {
            return Err(ConfigError::new(
                "heartbeat (--heartbeat)",
                "must be more than 0s: a worker that never beats is presumed dead at once",
            ));
        }
        if self.missed_heartbeats == 0 {
            return Err(ConfigError::new(
                "missed heartbeats (--missed-heartbeats)",
                "must be at least 1: with 0 a live worker's jobs are handed to others at once",
            ));
        }
        if self.api_timeout.is_zero() {
            return Err(ConfigError::new(
                "API attempt timeout (--api-timeout, --latitude-api-timeout)",
                "must be more than 0s",
            ));
        }
        Ok(())
    }

    /// How much of a unit's lease a creation's fence may find already spent
    /// and still let the create go without renewing it: half the margin the
    /// window keeps over one API attempt and a heartbeat, at most a second.
    /// A lease taken or renewed that recently still outlasts the attempt by
    /// half that margin, and the fence's statement writes nothing.
    pub fn fence_grace(&self) -> Duration {
        self.window()
            .saturating_sub(self.api_timeout + self.heartbeat)
            .div_f64(2.0)
            .min(Duration::from_secs(1))
    }

    /// Refuses values with which a second run of a creation could start
    /// while the first one's create is still on the wire: what matters on a
    /// provider that does not itself refuse a second machine on a unit.
    pub fn validate_for_creates(&self) -> Result<(), ConfigError> {
        self.validate()?;
        if self.api_timeout + self.heartbeat >= self.window() {
            return Err(ConfigError::new(
                "API attempt timeout (--api-timeout, --latitude-api-timeout)",
                format!(
                    "{} plus one heartbeat ({}) must be shorter than the rescue window \
                     (heartbeat × missed heartbeats = {}): otherwise a create still on the wire \
                     after a database restart could meet a second run of its creation; lower the \
                     API timeout or raise --missed-heartbeats",
                    format_duration(self.api_timeout),
                    format_duration(self.heartbeat),
                    format_duration(self.window()),
                ),
            ));
        }
        Ok(())
    }
}

impl Default for ProvisionerConfig {
    fn default() -> Self {
        ProvisionerConfig {
            device_prefix: "shepherd-".into(),
            os: "ubuntu_20_04".into(),
            max_machines: 50,
            chunk_size: 20,
            assimilate: false,
            reconcile_rate: Rate {
                interval: Duration::from_secs(60),
                burst: 1,
            },
            device_creation_rate: Rate {
                interval: Duration::from_secs(5),
                burst: 1,
            },
            ssh_key_label: "shepherd".into(),
            penalty: Default::default(),
            api_rate: API_RATE_DEFAULT,
            create_retry: CREATE_RETRY_DEFAULT,
            assimilate_retry: ASSIMILATE_RETRY_DEFAULT,
            settle_window: SETTLE_WINDOW_DEFAULT,
            rescue: Rescue::default(),
            latitude_reads_per_minute: 60,
            latitude_writes_per_minute: 20,
            lifecycle: Lifecycle::default(),
            leave_hook_secret: None,
        }
    }
}

impl ProvisionerConfig {
    /// Refuses settings the seed refused (placeholders) and ones that
    /// cannot work, before anything touches the API or the database.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (setting, value) in [
            ("device prefix (--device-prefix)", &self.device_prefix),
            ("SSH key label (--ssh-key-label)", &self.ssh_key_label),
        ] {
            if value.contains("FIXME") {
                return Err(ConfigError::new(
                    setting,
                    format!("{value:?} still contains FIXME; set a real value"),
                ));
            }
            if value.trim().is_empty() {
                return Err(ConfigError::new(setting, "must not be empty"));
            }
        }
        if self.device_prefix.contains('_') {
            return Err(ConfigError::new(
                "device prefix (--device-prefix)",
                "hostnames may not contain underscores",
            ));
        }
        if self.os.trim().is_empty() {
            return Err(ConfigError::new("os (--os)", "must not be empty"));
        }
        if self.chunk_size == 0 {
            return Err(ConfigError::new(
                "chunk size (--chunk-size)",
                "must be at least 1",
            ));
        }
        self.rescue.validate()?;
        if self.latitude_reads_per_minute == 0 || self.latitude_writes_per_minute == 0 {
            return Err(ConfigError::new(
                "Latitude budgets (--latitude-reads-per-minute, --latitude-writes-per-minute)",
                "must be at least 1",
            ));
        }
        for (setting, retry) in [
            ("create retry attempts", &self.create_retry),
            ("assimilate retry attempts", &self.assimilate_retry),
        ] {
            if retry.max_attempts == 0 {
                return Err(ConfigError::new(setting, "must be at least 1"));
            }
        }
        Ok(())
    }

    /// Hostname of the device for a reservation: prefix plus the first 18
    /// characters of the reservation id, as the seed did.
    pub fn hostname(&self, reservation: uuid::Uuid) -> String {
        let id = reservation.to_string();
        format!("{}{}", self.device_prefix, &id[..18])
    }
}

/// How long a failed reservation is penalised: a fixed hour by default (the
/// seed's), or growing with each consecutive failure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PenaltyPolicy {
    pub initial: std::time::Duration,
    /// 1.0 keeps every penalty at `initial`.
    pub factor: f64,
    pub max: std::time::Duration,
}

impl Default for PenaltyPolicy {
    fn default() -> Self {
        PenaltyPolicy {
            initial: std::time::Duration::from_secs(3600),
            factor: 1.0,
            // Reached only when the penalty grows (factor above 1).
            max: std::time::Duration::from_secs(24 * 3600),
        }
    }
}

impl PenaltyPolicy {
    /// The penalty for a reservation that already failed `failures` times
    /// in a row (0 for its first failure).
    pub fn duration(&self, failures: u32) -> std::time::Duration {
        let grown = self.initial.as_secs_f64() * self.factor.max(1.0).powi(failures as i32);
        std::time::Duration::from_secs_f64(
            grown.min(self.max.as_secs_f64().max(self.initial.as_secs_f64())),
        )
    }
}
