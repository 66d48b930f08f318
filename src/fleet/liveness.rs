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

/// The process a queue worker belongs to: `kind@host:pid:start#generation`.
fn process_of(worker: &str) -> &str {
    let rest = worker.split_once('@').map_or(worker, |(_, r)| r);
    rest.rsplit_once('#').map_or(rest, |(p, _)| p)
}

/// A worker process, with the queue workers it runs: what the console and
/// `shepherd status` list.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessRow {
    /// `host:pid:start`.
    pub name: String,
    /// From the process's own record; `None` for a process of a release
    /// that did not record itself.
    pub version: Option<String>,
    pub started_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Its clock less the database's at start, in milliseconds.
    pub clock_offset_ms: Option<i64>,
    /// Its queues, by name.
    pub queues: Vec<String>,
    /// Since its queue workers were last heard from (the most recent).
    pub seconds_since_seen: f64,
    /// Heard from within the cluster's missed heartbeats.
    pub live: bool,
}

impl Overview {
    /// The queue workers grouped by their process, most recently heard
    /// from first.
    pub fn processes(&self) -> Vec<ProcessRow> {
        let window = self.liveness().window_seconds;
        let mut by_name: std::collections::BTreeMap<&str, ProcessRow> = Default::default();
        for w in &self.workers {
            let name = process_of(&w.name);
            let row = by_name.entry(name).or_insert_with(|| {
                let recorded = self.process_records.iter().find(|p| p.name == name);
                ProcessRow {
                    name: name.to_string(),
                    version: recorded.map(|p| p.version.clone()),
                    started_at: recorded.map(|p| p.started_at),
                    clock_offset_ms: recorded.and_then(|p| p.clock_offset_ms),
                    queues: vec![],
                    seconds_since_seen: f64::INFINITY,
                    live: false,
                }
            });
            if !row.queues.contains(&w.queue) {
                row.queues.push(w.queue.clone());
            }
            row.seconds_since_seen = row.seconds_since_seen.min(w.seconds_since_seen);
            row.live = row.seconds_since_seen <= window;
        }
        let mut rows: Vec<ProcessRow> = by_name.into_values().collect();
        rows.sort_by(|a, b| a.seconds_since_seen.total_cmp(&b.seconds_since_seen));
        rows
    }
}

/// What a process recorded of itself at start.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ProcessRecord {
    pub name: String,
    pub version: String,
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// Its clock less the database's at start, in milliseconds (`None`:
    /// a release that did not measure it).
    pub clock_offset_ms: Option<i64>,
}

/// This process as the fleet names it: `host:pid:start`, `start` drawn at
/// random once per process. Host and pid alone are not unique: two pid-1
/// containers on host networking, or hosts without `/etc/hostname` (all
/// `localhost`), shared one name, and a process then handed back the
/// claims of a live one as its predecessor's.
pub fn process_name() -> String {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .ok()
            .filter(|h| !h.is_empty() && !h.contains([':', '@', '#']))
            .unwrap_or_else(|| "localhost".into());
        let start = uuid::Uuid::new_v4().simple().to_string();
        format!("{host}:{}:{}", std::process::id(), &start[..8])
    })
    .clone()
}

/// A clock more than this far off the database's is said at start and in
/// `shepherd status`.
pub const CLOCK_OFF_MS: i64 = 5_000;

/// This process's clock less the database's, in milliseconds: the
/// database's clock read between two of ours, against their midpoint.
pub async fn clock_offset_ms(pool: &sqlx::PgPool) -> Result<i64, sqlx::Error> {
    let before = chrono::Utc::now();
    let db: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("select pg_catalog.clock_timestamp()")
            .fetch_one(pool)
            .await?;
    let after = chrono::Utc::now();
    let ours = before + (after - before) / 2;
    Ok((ours - db).num_milliseconds())
}

/// Records this process (`host:pid:start`), the release it runs and how far
/// its clock is off the database's, and drops the rows of processes silent
/// for a day.
pub async fn record_process(
    pool: &sqlx::PgPool,
    name: &str,
    version: &str,
    clock_offset_ms: Option<i64>,
) -> Result<(), sqlx::Error> {
    let mut parts = name.splitn(3, ':');
    let host = parts.next().unwrap_or(name);
    let pid = parts.next().unwrap_or("0");
    let mut tx = pool.begin().await?;
    sqlx::query(
        "delete from shepherd.processes p
         where p.started_at < now() - interval '1 day'
           and not exists (select 1 from apalis.workers w
                           where w.id like '%@' || p.name || '#%'
                             and w.last_seen > now() - interval '1 day')",
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "insert into shepherd.processes (name, host, pid, version, started_at, clock_offset_ms)
         values ($1, $2, $3, $4, now(), $5)
         on conflict (name) do update set host = excluded.host, pid = excluded.pid,
             version = excluded.version, started_at = excluded.started_at,
             clock_offset_ms = excluded.clock_offset_ms",
    )
    .bind(crate::text::bounded(name, 299))
    .bind(crate::text::bounded(host, 254))
    .bind(pid.parse::<i32>().unwrap_or(0))
    .bind(crate::text::bounded(version, 99))
    .bind(clock_offset_ms)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}
