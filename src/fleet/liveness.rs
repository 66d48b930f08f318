//! Is anything working? The first line of the overview, of `shepherd
//! status` and of the alerts, from the workers' heartbeats and the passes.

use serde::Serialize;

use super::Overview;
use crate::config::Rescue;

/// Is anything working? The first thing an operator asks of a console.
#[derive(Debug, Clone, Serialize)]
pub struct Liveness {
    pub state: LivenessState,
    /// Worker processes heard from within their missed heartbeats.
    pub processes: usize,
    /// Since any worker was last heard from; `None`: none ever was (in the
    /// last 10 minutes).
    pub last_heard_seconds: Option<f64>,
    /// Heartbeat × missed heartbeats: a worker silent longer is dead (its
    /// jobs go to live ones).
    pub window_seconds: f64,
    /// The period a pass is expected within: the scheduler's, as its passes
    /// were spaced, 60 s before it has run two.
    pub tick_seconds: f64,
    /// Since the last pass that was not refused finished.
    pub last_pass_seconds: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LivenessState {
    /// Workers heard from, and a pass within two periods.
    Working,
    /// No worker heard from within its missed heartbeats.
    NoWorker,
    /// Workers, but no successful pass for two periods (no scheduler, or
    /// every pass refused).
    NoPass,
}

impl Overview {
    /// Whether anything works, from the workers' heartbeats and the passes:
    /// red within two periods of the last sign of life, not ten minutes.
    pub fn liveness(&self) -> Liveness {
        // The cluster's rescue window, as its settings give it (the
        // defaults' before any worker recorded them).
        let defaults = Rescue::default();
        let rescue = Rescue {
            heartbeat: self
                .settings
                .get("heartbeat")
                .and_then(|v| v.as_str())
                .and_then(|t| crate::config::parse_duration(t).ok())
                .unwrap_or(defaults.heartbeat),
            missed_heartbeats: self
                .settings
                .get("missed_heartbeats")
                .and_then(|v| v.as_u64())
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(defaults.missed_heartbeats),
            ..defaults
        };
        let window_seconds = rescue.window().as_secs_f64().max(1.0);
        let alive: std::collections::BTreeSet<&str> = self
            .workers
            .iter()
            .filter(|w| w.seconds_since_seen <= window_seconds)
            .map(|w| process_of(&w.name))
            .collect();
        let last_heard_seconds = self
            .workers
            .iter()
            .map(|w| w.seconds_since_seen)
            .min_by(f64::total_cmp);
        let tick_seconds = self.tick_seconds.unwrap_or(60.0).clamp(5.0, 3600.0);
        let last_pass_seconds = self
            .last_successful_reconcile
            .map(|at| (self.now - at).num_milliseconds() as f64 / 1000.0);
        // Paused, passes are refused on purpose: the pause says so.
        let state = if alive.is_empty() {
            LivenessState::NoWorker
        } else if self.paused.is_none() && last_pass_seconds.is_none_or(|s| s > 2.0 * tick_seconds)
        {
            LivenessState::NoPass
        } else {
            LivenessState::Working
        };
        Liveness {
            state,
            processes: alive.len(),
            last_heard_seconds,
            window_seconds,
            tick_seconds,
            last_pass_seconds,
        }
    }
}

/// The process a queue worker belongs to: `kind@host:pid#generation`.
fn process_of(worker: &str) -> &str {
    let rest = worker.split_once('@').map_or(worker, |(_, r)| r);
    rest.rsplit_once('#').map_or(rest, |(p, _)| p)
}
