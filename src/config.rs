//! Parsing of the settings the seed expressed as strings: durations such as
//! `5s` and rates such as `5s,1` (one event per five seconds, bursts of one).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Parses `250ms`, `5s`, `1m`, `2h` (or a bare number of seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (try 500ms, 5s, 1m or 1h)"))?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "{text:?} has unknown unit {other:?} (use ms, s, m or h)"
            ));
        }
    };
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(format!("{text:?} is not a usable duration"));
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
            .map_err(|_| format!("rate {s:?}: the burst {burst:?} is not a whole number"))?;
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
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        for bad in ["", "5x", "-1s", "s", "1.2.3s"] {
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
