//! The ledger: machine-hours and cost per pool and day, folded from the
//! log (`shepherd.machine_hours`: each machine from when shepherd recorded
//! it to when it recorded it gone) at the price in force at each moment
//! (the price changes the passes' surveys recorded). Exact to the second of
//! what shepherd saw; the provider bills whole hours, so its invoice can be
//! a little higher.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, TimeDelta, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::provider::Price;

/// One pool's day.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LedgerRow {
    pub day: NaiveDate,
    pub pool: String,
    pub machine_hours: f64,
    /// The priced hours' cost, in `currency`.
    pub cost: f64,
    pub currency: Option<String>,
    /// Hours before any price of the pool was read.
    pub unpriced_hours: f64,
}

/// A machine's time as ours: its pool, start and end (none: running).
type Span = (Option<String>, DateTime<Utc>, Option<DateTime<Utc>>);
/// A pool's prices, each from when a pass read it (none: no price given).
type PriceHistory = BTreeMap<String, Vec<(DateTime<Utc>, Option<Price>)>>;

/// What a pool is named in the ledger when a machine is of none.
pub const NO_POOL: &str = "(no pool)";

/// The ledger over `[since, until)`, for one pool or all.
pub async fn ledger(
    db: &PgPool,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    pool: Option<&str>,
) -> Result<Vec<LedgerRow>, sqlx::Error> {
    let spans: Vec<Span> = sqlx::query_as(
        "select pool, started_at, ended_at from shepherd.machine_hours
         where started_at < $2 and coalesce(ended_at, $2) > $1
           and ($3::text is null or pool = $3)",
    )
    .bind(since)
    .bind(until)
    .bind(pool)
    .fetch_all(db)
    .await?;
    // Each pool's price changes, oldest first (a survey that repeats the
    // last price is no change, and one without prices, a pass that did not
    // read the stock, changes none).
    let changes: Vec<(DateTime<Utc>, String, Option<serde_json::Value>)> = sqlx::query_as(
        "select recorded_at, name, price from (
             select e.recorded_at, e.position, p->>'name' as name, p->'price' as price,
                    lag(p->'price') over (partition by p->>'name' order by e.position) as before,
                    row_number() over (partition by p->>'name' order by e.position) as n
             from shepherd.events e, jsonb_array_elements(e.body->'pools') p
             where e.event_type = 'pools_surveyed' and e.recorded_at < $1
               and jsonb_typeof(p->'price') = 'object') x
         where n = 1 or price is distinct from before
         order by position",
    )
    .bind(until)
    .fetch_all(db)
    .await?;
    let mut prices: PriceHistory = BTreeMap::new();
    for (at, name, price) in changes {
        let price = price.and_then(|p| serde_json::from_value::<Price>(p).ok());
        prices.entry(name).or_default().push((at, price));
    }
    let mut rows: BTreeMap<(NaiveDate, String), LedgerRow> = BTreeMap::new();
    for (pool, started, ended) in spans {
        let pool = pool.unwrap_or_else(|| NO_POOL.to_string());
        let history = prices.get(&pool).map(Vec::as_slice).unwrap_or(&[]);
        let mut at = started.max(since);
        let end = ended.unwrap_or(until).min(until);
        while at < end {
            // The slice runs to the next midnight or price change.
            let midnight = (at.date_naive() + TimeDelta::days(1))
                .and_hms_opt(0, 0, 0)
                .expect("midnight exists")
                .and_utc();
            let next_change = history
                .iter()
                .map(|(t, _)| *t)
                .find(|t| *t > at)
                .unwrap_or(end);
            let stop = end.min(midnight).min(next_change);
            let hours = (stop - at).num_milliseconds() as f64 / 3_600_000.0;
            let price = history
                .iter()
                .rev()
                .find(|(t, _)| *t <= at)
                .and_then(|(_, p)| p.as_ref());
            let row = rows
                .entry((at.date_naive(), pool.clone()))
                .or_insert_with(|| LedgerRow {
                    day: at.date_naive(),
                    pool: pool.clone(),
                    machine_hours: 0.0,
                    cost: 0.0,
                    currency: None,
                    unpriced_hours: 0.0,
                });
            row.machine_hours += hours;
            match price {
                Some(p) => {
                    row.cost += hours * p.hour;
                    row.currency.get_or_insert_with(|| p.currency.clone());
                }
                None => row.unpriced_hours += hours,
            }
            at = stop;
        }
    }
    Ok(rows.into_values().collect())
}
