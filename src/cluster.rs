//! The cluster's settings: one value each, held in Postgres, read by every
//! worker, command and SQL function.
//!
//! The limit, chunk size, creation and API rates, penalty policy and
//! assimilate mode belong to the cluster, not to a process: two workers
//! started with different flags must not admit against different limits.
//! The settings are a view (`shepherd.cluster_settings`) folded from
//! `settings_changed` events, so every change says who made it and why.
//!
//! The first worker of a new cluster records its flags as the settings. A
//! process started later with a flag that disagrees adopts the cluster's
//! value and warns, naming the command that changes it; it never admits
//! against its own value. Changes go through `shepherd settings set` or the
//! SQL function `shepherd.change_setting()`, which both validate in one
//! place (the SQL function).

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;
use sqlx::{PgConnection, PgPool};

use std::time::Duration;

use crate::config::{
    Lifecycle, PenaltyPolicy, ProvisionerConfig, Rate, Rescue, format_duration, parse_duration,
};
use crate::events::event::SettingsChanged;
use crate::events::{NewEvent, StoreError, record};

/// Managed machines plus creations in flight never exceed this; 0 means no
/// limit (the seed's convention), which only this type interprets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct MachineLimit(pub u64);

impl MachineLimit {
    pub const NONE: MachineLimit = MachineLimit(0);

    pub fn is_limited(&self) -> bool {
        self.0 > 0
    }

    /// How many more machines fit beside `used`; `None` without a limit.
    pub fn room(&self, used: u64) -> Option<u64> {
        self.is_limited().then(|| self.0.saturating_sub(used))
    }

    pub fn is_reached(&self, used: u64) -> bool {
        self.room(used) == Some(0)
    }
}

impl fmt::Display for MachineLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_limited() {
            write!(f, "{}", self.0)
        } else {
            f.write_str("no limit")
        }
    }
}

/// The settings that belong to the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterSettings {
    pub max_machines: MachineLimit,
    pub chunk_size: u64,
    pub assimilate: bool,
    pub device_creation_rate: Rate,
    pub api_rate: Rate,
    pub penalty: PenaltyPolicy,
    /// How long an unknown creation holds its unit before a look that
    /// finds nothing is trusted.
    pub settle_window: Duration,
    /// Every worker's heartbeat, and the API attempt a rescue must outlast:
    /// the cluster's, so that no worker hands a creation to a second run
    /// while the first may still be sending.
    pub rescue: Rescue,
    /// The Latitude.sh key's budgets per minute, shared by every process.
    pub latitude_reads_per_minute: u32,
    pub latitude_writes_per_minute: u32,
    /// How pools shed and replace machines, and the guards on it.
    pub lifecycle: Lifecycle,
}

/// Every setting's name, as stored, as `shepherd settings set` takes it, and
/// (with dashes) as the worker's flag.
pub const KEYS: &[&str] = &[
    "max_machines",
    "chunk_size",
    "assimilate",
    "device_creation_rate",
    "api_rate",
    "penalty",
    "penalty_factor",
    "penalty_max",
    "settle_window",
    "heartbeat",
    "missed_heartbeats",
    "api_timeout",
    "latitude_reads_per_minute",
    "latitude_writes_per_minute",
    "deletion_budget",
    "deletion_period",
    "max_unhealthy",
    "ready_deadline",
    "leave_hook",
    "leave_timeout",
    "leave_deadline",
    "failed_skip_leave",
];

impl ClusterSettings {
    /// The settings a process's flags propose.
    pub fn proposed_by(config: &ProvisionerConfig) -> ClusterSettings {
        ClusterSettings {
            max_machines: MachineLimit(config.max_machines),
            chunk_size: config.chunk_size,
            assimilate: config.assimilate,
            device_creation_rate: config.device_creation_rate,
            api_rate: config.api_rate,
            penalty: config.penalty,
            settle_window: config.settle_window,
            rescue: config.rescue,
            latitude_reads_per_minute: config.latitude_reads_per_minute,
            latitude_writes_per_minute: config.latitude_writes_per_minute,
            lifecycle: config.lifecycle.clone(),
        }
    }

    /// The stored form: one JSON value per key.
    pub fn to_map(&self) -> BTreeMap<String, Value> {
        let mut m = BTreeMap::new();
        m.insert("max_machines".into(), Value::from(self.max_machines.0));
        m.insert("chunk_size".into(), Value::from(self.chunk_size));
        m.insert("assimilate".into(), Value::from(self.assimilate));
        m.insert(
            "device_creation_rate".into(),
            Value::from(self.device_creation_rate.to_string()),
        );
        m.insert("api_rate".into(), Value::from(self.api_rate.to_string()));
        m.insert(
            "penalty".into(),
            Value::from(format_duration(self.penalty.initial)),
        );
        m.insert("penalty_factor".into(), Value::from(self.penalty.factor));
        m.insert(
            "penalty_max".into(),
            Value::from(format_duration(self.penalty.max)),
        );
        m.insert(
            "settle_window".into(),
            Value::from(format_duration(self.settle_window)),
        );
        m.insert(
            "heartbeat".into(),
            Value::from(format_duration(self.rescue.heartbeat)),
        );
        m.insert(
            "missed_heartbeats".into(),
            Value::from(self.rescue.missed_heartbeats),
        );
        m.insert(
            "api_timeout".into(),
            Value::from(format_duration(self.rescue.api_timeout)),
        );
        m.insert(
            "latitude_reads_per_minute".into(),
            Value::from(self.latitude_reads_per_minute),
        );
        m.insert(
            "latitude_writes_per_minute".into(),
            Value::from(self.latitude_writes_per_minute),
        );
        let l = &self.lifecycle;
        m.insert("deletion_budget".into(), Value::from(l.budget_text()));
        m.insert(
            "deletion_period".into(),
            Value::from(format_duration(l.budget_period)),
        );
        m.insert(
            "max_unhealthy".into(),
            Value::from(format!("{}%", l.max_unhealthy_percent)),
        );
        m.insert(
            "ready_deadline".into(),
            Value::from(format_duration(l.ready_deadline)),
        );
        m.insert("leave_hook".into(), Value::from(l.leave_hook.to_string()));
        m.insert(
            "leave_timeout".into(),
            Value::from(format_duration(l.leave_timeout)),
        );
        m.insert(
            "leave_deadline".into(),
            Value::from(l.leave_deadline.as_str()),
        );
        m.insert("failed_skip_leave".into(), Value::from(l.failed_skip_leave));
        m
    }

    /// Reads the stored form; a key missing from it (a setting newer than
    /// the cluster) keeps `fallback`'s value.
    pub fn from_map(
        map: &BTreeMap<String, Value>,
        fallback: &ClusterSettings,
    ) -> Result<ClusterSettings, String> {
        let mut s = fallback.clone();
        for (key, value) in map {
            let bad = || format!("cluster setting {key} has an unusable value {value}");
            let text = || value.as_str().ok_or_else(bad);
            match key.as_str() {
                "max_machines" => s.max_machines = MachineLimit(value.as_u64().ok_or_else(bad)?),
                "chunk_size" => s.chunk_size = value.as_u64().filter(|&n| n > 0).ok_or_else(bad)?,
                "assimilate" => s.assimilate = value.as_bool().ok_or_else(bad)?,
                "device_creation_rate" => s.device_creation_rate = text()?.parse()?,
                "api_rate" => s.api_rate = Rate::parse_or_interval(text()?)?,
                "penalty" => s.penalty.initial = parse_duration(text()?)?,
                "penalty_factor" => {
                    s.penalty.factor = value.as_f64().filter(|f| *f >= 1.0).ok_or_else(bad)?
                }
                "penalty_max" => s.penalty.max = parse_duration(text()?)?,
                "settle_window" => s.settle_window = parse_duration(text()?)?,
                "heartbeat" => s.rescue.heartbeat = parse_duration(text()?)?,
                "missed_heartbeats" => {
                    s.rescue.missed_heartbeats = count(value).ok_or_else(bad)?;
                }
                "api_timeout" => s.rescue.api_timeout = parse_duration(text()?)?,
                "latitude_reads_per_minute" => {
                    s.latitude_reads_per_minute = count(value).ok_or_else(bad)?;
                }
                "latitude_writes_per_minute" => {
                    s.latitude_writes_per_minute = count(value).ok_or_else(bad)?;
                }
                "deletion_budget" => {
                    (s.lifecycle.budget_percent, s.lifecycle.budget_min) =
                        Lifecycle::parse_budget(text()?)?;
                }
                "deletion_period" => s.lifecycle.budget_period = parse_duration(text()?)?,
                "max_unhealthy" => {
                    s.lifecycle.max_unhealthy_percent = Lifecycle::parse_percent(text()?)?;
                }
                "ready_deadline" => s.lifecycle.ready_deadline = parse_duration(text()?)?,
                "leave_hook" => s.lifecycle.leave_hook = text()?.parse()?,
                "leave_timeout" => s.lifecycle.leave_timeout = parse_duration(text()?)?,
                "leave_deadline" => s.lifecycle.leave_deadline = text()?.parse()?,
                "failed_skip_leave" => {
                    s.lifecycle.failed_skip_leave = value.as_bool().ok_or_else(bad)?;
                }
                // A setting a newer release knows: kept in the table, unused here.
                _ => {}
            }
        }
        s.penalty.max = s.penalty.max.max(s.penalty.initial);
        Ok(s)
    }
}

/// A stored count of at least 1.
fn count(value: &Value) -> Option<u32> {
    value
        .as_u64()
        .filter(|n| *n >= 1)
        .and_then(|n| u32::try_from(n).ok())
}

/// The stored settings, by key (empty before the first worker started).
pub async fn stored(conn: &mut PgConnection) -> Result<BTreeMap<String, Value>, sqlx::Error> {
    let rows: Vec<(String, Value)> =
        sqlx::query_as("select key, value from shepherd.cluster_settings")
            .fetch_all(&mut *conn)
            .await?;
    Ok(rows.into_iter().collect())
}

/// The cluster's settings now. Before any worker recorded them, `fallback`
/// (the caller's own flags) stands in, and `recorded` says so.
pub async fn current(pool: &PgPool, fallback: &ClusterSettings) -> Result<Current, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let map = stored(&mut conn).await?;
    let settings =
        ClusterSettings::from_map(&map, fallback).map_err(|e| sqlx::Error::Protocol(e.clone()))?;
    Ok(Current {
        settings,
        recorded: !map.is_empty(),
    })
}

#[derive(Debug, Clone, PartialEq)]
pub struct Current {
    pub settings: ClusterSettings,
    /// False before the first worker recorded the cluster's settings.
    pub recorded: bool,
}

/// A flag this process was given that the cluster overrides.
#[derive(Debug, Clone, PartialEq)]
pub struct Disagreement {
    pub key: &'static str,
    pub flag: Value,
    pub cluster: Value,
}

impl fmt::Display for Disagreement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "--{} {} differs from the cluster's {}; this process uses the cluster's value \
             (change it for every worker with: shepherd settings set {} {} --reason \"...\")",
            self.key.replace('_', "-"),
            plain(&self.flag),
            plain(&self.cluster),
            self.key,
            plain(&self.flag)
        )
    }
}

fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// What a starting process settled on.
#[derive(Debug, Clone, PartialEq)]
pub struct Established {
    pub settings: ClusterSettings,
    /// This process recorded the cluster's first settings.
    pub first: bool,
    /// Flags given explicitly that the cluster overrides.
    pub disagreements: Vec<Disagreement>,
}

/// Records `proposed` as the cluster's settings if it has none (and any key
/// a newer release added), else adopts the cluster's. `explicit` names the
/// settings the operator set by flag or environment: only those are
/// reported as disagreeing.
pub async fn establish(
    pool: &PgPool,
    proposed: &ClusterSettings,
    explicit: &[String],
    by: &str,
) -> Result<Established, StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("select pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('operator/settings'::text, 0::int8))")
        .execute(&mut *tx)
        .await?;
    let map = stored(&mut tx).await?;
    let wanted = proposed.to_map();
    let missing: BTreeMap<String, Value> = wanted
        .iter()
        .filter(|(k, _)| !map.contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let first = map.is_empty();
    if !missing.is_empty() {
        let reason = if first {
            "the cluster's first settings, from the flags of the first process to start"
        } else {
            "settings this release adds, from the flags of the first process to know them"
        };
        record(
            &mut tx,
            vec![NewEvent::new(SettingsChanged {
                by: by.to_string(),
                reason: reason.to_string(),
                settings: missing,
            })],
        )
        .await?;
    }
    let map = stored(&mut tx).await?;
    tx.commit().await?;
    let settings = ClusterSettings::from_map(&map, proposed).map_err(StoreError::Invalid)?;
    let mut disagreements = Vec::new();
    let adopted = settings.to_map();
    for key in KEYS {
        if explicit.iter().any(|e| e == key) && wanted.get(*key) != adopted.get(*key) {
            disagreements.push(Disagreement {
                key,
                flag: wanted[*key].clone(),
                cluster: adopted[*key].clone(),
            });
        }
    }
    Ok(Established {
        settings,
        first,
        disagreements,
    })
}

/// The setting that names the provider a cluster provisions.
pub const PROVIDER_KEY: &str = "provider";
/// The setting that names the project (at the provider) it provisions.
pub const PROJECT_KEY: &str = "project";
/// The setting that names the hostname prefix of its machines.
pub const PREFIX_KEY: &str = "device_prefix";

/// What a cluster provisions, and how its machines are named: fixed when
/// its first worker starts. Unit ids, witnesses and hostnames all derive
/// from these, so two processes that disagreed would not recognise each
/// other's machines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub provider: String,
    pub project: String,
    pub device_prefix: String,
}

/// Records `proposed` as the cluster's identity where it has none yet (the
/// first worker's, or the first of a release that knows a key), and
/// refuses a worker started for another provider or project: one
/// cluster's passes, views and sinbin speak of one provider's machines and
/// units, and a worker cannot adopt credentials it does not have. A prefix
/// that differs is the cluster's (returned, with the difference said).
/// None is a setting `change_setting()` takes: a cluster changes them by
/// starting anew.
pub async fn establish_identity(
    pool: &PgPool,
    proposed: &Identity,
    by: &str,
) -> Result<(Identity, Option<String>), StoreError> {
    let mut tx = pool.begin().await?;
    sqlx::query("select pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('operator/settings'::text, 0::int8))")
        .execute(&mut *tx)
        .await?;
    let map = stored(&mut tx).await?;
    let recorded = |key: &str| map.get(key).and_then(Value::as_str).map(str::to_string);
    if let Some(provider) = recorded(PROVIDER_KEY)
        && provider != proposed.provider
    {
        return Err(StoreError::Invalid(format!(
            "this cluster provisions {provider}, and this worker was started with --provider \
             {}: start it with --provider {provider} (SHEPHERD_PROVIDER), or give the other \
             provider a database of its own",
            proposed.provider
        )));
    }
    if let Some(project) = recorded(PROJECT_KEY)
        && project != proposed.project
    {
        return Err(StoreError::Invalid(format!(
            "this cluster provisions project {project}, and this worker was started for project \
             {}: start it with the cluster's project, or give the other project a database of its own",
            proposed.project
        )));
    }
    let mut missing = BTreeMap::new();
    for (key, value) in [
        (PROVIDER_KEY, &proposed.provider),
        (PROJECT_KEY, &proposed.project),
        (PREFIX_KEY, &proposed.device_prefix),
    ] {
        if recorded(key).is_none() {
            missing.insert(key.to_string(), Value::from(value.as_str()));
        }
    }
    if !missing.is_empty() {
        record(
            &mut tx,
            vec![NewEvent::new(SettingsChanged {
                by: by.to_string(),
                reason: "what the cluster provisions, from the first worker to start".into(),
                settings: missing,
            })],
        )
        .await?;
    }
    tx.commit().await?;
    let prefix = recorded(PREFIX_KEY).unwrap_or_else(|| proposed.device_prefix.clone());
    let differs = (prefix != proposed.device_prefix).then(|| {
        format!(
            "--device-prefix {} differs from the cluster's {prefix}; this process uses the \
             cluster's (the prefix is fixed when a cluster starts)",
            proposed.device_prefix
        )
    });
    Ok((
        Identity {
            provider: proposed.provider.clone(),
            project: proposed.project.clone(),
            device_prefix: prefix,
        },
        differs,
    ))
}

/// Changes one setting through `shepherd.change_setting()`, which validates
/// it and records who and why. The error names what was wrong.
pub async fn change(
    pool: &PgPool,
    key: &str,
    value: &str,
    reason: &str,
    by: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("select shepherd.change_setting($1, $2, $3, $4)")
        .bind(key)
        .bind(value)
        .bind(reason)
        .bind(by)
        .execute(pool)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_knows_what_zero_means() {
        assert_eq!(MachineLimit(0).room(1000), None);
        assert!(!MachineLimit(0).is_reached(u64::MAX));
        assert_eq!(MachineLimit(5).room(3), Some(2));
        assert!(MachineLimit(5).is_reached(7));
        assert_eq!(MachineLimit(0).to_string(), "no limit");
    }

    #[test]
    fn settings_survive_their_stored_form() {
        let s = ClusterSettings {
            max_machines: MachineLimit(7),
            chunk_size: 3,
            assimilate: true,
            device_creation_rate: "250ms,2".parse().unwrap(),
            api_rate: "100ms,1".parse().unwrap(),
            penalty: PenaltyPolicy {
                initial: Duration::from_secs(60),
                factor: 2.5,
                max: Duration::from_secs(3600),
            },
            settle_window: Duration::from_secs(90),
            rescue: Rescue {
                heartbeat: Duration::from_secs(2),
                missed_heartbeats: 7,
                api_timeout: Duration::from_millis(1500),
            },
            latitude_reads_per_minute: 600,
            latitude_writes_per_minute: 200,
            lifecycle: Lifecycle {
                budget_percent: 25,
                budget_min: 3,
                budget_period: Duration::from_secs(90),
                max_unhealthy_percent: 50,
                ready_deadline: Duration::from_secs(600),
                leave_hook: crate::config::LeaveHook::Http("http://127.0.0.1:9/leave".into()),
                leave_timeout: Duration::from_secs(30),
                leave_deadline: crate::config::LeaveDeadline::GiveUp,
                failed_skip_leave: false,
            },
        };
        let back = ClusterSettings::from_map(
            &s.to_map(),
            &ClusterSettings::proposed_by(&Default::default()),
        )
        .unwrap();
        assert_eq!(back, s);
    }
}
