//! The spend cap as admission applies it: the cluster setting `spend_cap`
//! (per hour, in the currency the provider prices in) holds back every
//! creation that would take what the fleet costs past it, on every path
//! that admits one (a pass, the CLI, a job pushed from SQL). What the fleet
//! costs is counted under the capacity lock from our own records (machines
//! standing, leaving ones too, and creations in flight, by pool) at the
//! prices the last pass read with the stock. A pool without a price, or
//! prices in two currencies, hold creation back: never a guess.

use std::collections::BTreeMap;

use sqlx::PgConnection;

use crate::events::Event;
use crate::provider::{PoolReport, Price};

/// The setting's name, as `shepherd settings set` takes it.
pub const SPEND_CAP: &str = "spend_cap";

/// Why the cap holds a creation back.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub enum Held {
    /// It would take the fleet past the cap.
    OverCap {
        cap: f64,
        currency: String,
        spent: f64,
        price: f64,
        pool: String,
    },
    /// Its pool (or a pool with machines) has no price to count.
    NoPrice { pool: String },
    /// Prices in more than one currency: nothing to compare the cap with.
    Currencies,
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Held::OverCap {
                cap,
                currency,
                spent,
                price,
                pool,
            } => write!(
                f,
                "held: spend cap: the fleet costs {spent:.2} {currency}/h, and one more server of \
                 pool {pool} at {price:.2} {currency}/h would take it past the cap of {cap:.2} \
                 {currency}/h (shepherd settings set spend_cap ... to raise or lift it)"
            ),
            Held::NoPrice { pool } => write!(
                f,
                "held: spend cap: pool {pool} has no price (the provider gave none with its \
                 stock, or no pass has read it yet); under a spend cap nothing is created \
                 without one"
            ),
            Held::Currencies => f.write_str(
                "held: spend cap: the pools are priced in more than one currency, so the cap \
                 cannot be compared with them",
            ),
        }
    }
}

/// The cap and what the fleet costs now, read under the capacity lock.
#[derive(Debug, Clone)]
pub struct Guard {
    cap: f64,
    /// Per pool, a server's price.
    prices: BTreeMap<String, Price>,
    /// What the fleet costs per hour, counted so far.
    spent: f64,
    /// Why nothing can be admitted at all, if so.
    blocked: Option<Held>,
    /// The pools that lack machines now (what a pass would create for).
    lacking: Vec<String>,
}

/// The cap in force: a positive number; `none` or no setting: none.
pub async fn cap(conn: &mut PgConnection) -> Result<Option<f64>, sqlx::Error> {
    let value: Option<serde_json::Value> =
        sqlx::query_scalar("select value from shepherd.cluster_settings where key = $1")
            .bind(SPEND_CAP)
            .fetch_optional(&mut *conn)
            .await?;
    Ok(value.and_then(|v| v.as_f64()).filter(|c| *c > 0.0))
}

/// The pools as the last pass surveyed them (with their prices).
pub async fn last_survey(conn: &mut PgConnection) -> Result<Vec<PoolReport>, sqlx::Error> {
    let row: Option<(i32, serde_json::Value)> = sqlx::query_as(
        "select schema_version, body from shepherd.events
         where event_type = 'pools_surveyed' order by position desc limit 1",
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(match row {
        Some((version, body)) => match Event::decode("pools_surveyed", version, body) {
            Ok(Event::PoolsSurveyed(e)) => e.pools,
            _ => vec![],
        },
        None => vec![],
    })
}

/// How many of the latest surveys the last known prices are looked for in:
/// a pass that did not read the stock (one at the limit, one that found a
/// discrepancy) records none, and a removed pool's are no longer read; a
/// price older than this many passes is no price.
const SURVEYS_LOOKED_AT: i64 = 500;

/// Each pool's last known price, by pool, with the plan and site it was
/// read for (a price read before the pool changed plan or site is not its
/// price).
pub async fn last_prices(
    conn: &mut PgConnection,
) -> Result<BTreeMap<String, (String, String, Price)>, sqlx::Error> {
    let rows: Vec<(String, String, String, serde_json::Value)> = sqlx::query_as(
        "select distinct on (p->>'name') p->>'name', p->>'plan', p->>'site', p->'price'
         from (select position, body from shepherd.events
               where event_type = 'pools_surveyed'
               order by position desc limit $1) e,
              jsonb_array_elements(e.body->'pools') p
         where jsonb_typeof(p->'price') = 'object'
           and p->>'name' is not null and p->>'plan' is not null and p->>'site' is not null
         order by p->>'name', e.position desc",
    )
    .bind(SURVEYS_LOOKED_AT)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(name, plan, site, price)| {
            let price: Price = serde_json::from_value(price).ok()?;
            (price.hour > 0.0 && price.hour.is_finite()).then_some((name, (plan, site, price)))
        })
        .collect())
}

impl Guard {
    /// `None` when no cap is set.
    pub async fn read(conn: &mut PgConnection) -> Result<Option<Guard>, sqlx::Error> {
        let Some(cap) = cap(conn).await? else {
            return Ok(None);
        };
        let prefix: Option<String> = sqlx::query_scalar(
            "select value #>> '{}' from shepherd.cluster_settings where key = 'device_prefix'",
        )
        .fetch_optional(&mut *conn)
        .await?;
        let prefix =
            prefix.unwrap_or_else(|| crate::config::ProvisionerConfig::default().device_prefix);
        let rows = crate::pools::read(conn).await?;
        // A pool's price only if it was read for the plan and site the pool
        // has now.
        let prices: BTreeMap<String, Price> = last_prices(conn)
            .await?
            .into_iter()
            .filter(|(name, (plan, site, _))| {
                rows.iter().any(|r| {
                    &r.name == name && &r.plan == plan && r.site.eq_ignore_ascii_case(site)
                })
            })
            .map(|(name, (_, _, price))| (name, price))
            .collect();
        let (standing, strays) = crate::pools::standing(conn, &prefix, &rows).await?;
        let lacking = rows
            .iter()
            .filter(|r| !r.removed)
            .filter(|r| standing.get(&r.name).map_or(0, |o| o.billed()) < r.count)
            .map(|r| r.name.clone())
            .collect();
        let mut guard = Guard {
            cap,
            prices,
            spent: 0.0,
            blocked: None,
            lacking,
        };
        let currencies: std::collections::BTreeSet<&str> =
            guard.prices.values().map(|p| p.currency.as_str()).collect();
        if currencies.len() > 1 {
            guard.blocked = Some(Held::Currencies);
        }
        // Machines of ours no pool's hostnames name (adopted ones, say)
        // cost money too, at no price shepherd knows.
        if strays > 0 {
            guard.blocked.get_or_insert(Held::NoPrice {
                pool: format!("({strays} machine(s) of ours in no pool)"),
            });
        }
        for (pool, o) in &standing {
            if o.billed() == 0 {
                continue;
            }
            match guard.prices.get(pool) {
                Some(p) => guard.spent += f64::from(o.billed()) * p.hour,
                None => {
                    guard
                        .blocked
                        .get_or_insert(Held::NoPrice { pool: pool.clone() });
                }
            }
        }
        Ok(Some(guard))
    }

    /// Admits one more server of `pool` if the cap allows it, counting it.
    pub fn admit(&mut self, pool: Option<&str>) -> Result<(), Held> {
        if let Some(held) = &self.blocked {
            return Err(held.clone());
        }
        let Some(pool) = pool else {
            return Err(Held::NoPrice {
                pool: "(a unit of no pool)".into(),
            });
        };
        let Some(price) = self.prices.get(pool) else {
            return Err(Held::NoPrice { pool: pool.into() });
        };
        // A cent's tolerance: prices are decimals, the sums floats.
        if self.spent + price.hour > self.cap + 0.005 {
            return Err(Held::OverCap {
                cap: self.cap,
                currency: price.currency.clone(),
                spent: self.spent,
                price: price.hour,
                pool: pool.into(),
            });
        }
        self.spent += price.hour;
        Ok(())
    }
}

/// The cap as the console, `status`, `pools list` and `/metrics` show it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CapState {
    pub cap: f64,
    /// The currency the pools are priced in (`None` before any price).
    pub currency: Option<String>,
    /// What the fleet costs per hour now, by our records.
    pub spent: f64,
    /// Why creations are held, when every pool that lacks machines is
    /// held back by the cap; `None` when one could still be created, or
    /// none lacks any.
    pub held: Option<String>,
}

impl CapState {
    /// `None` when no cap is set.
    pub async fn read(conn: &mut PgConnection) -> Result<Option<CapState>, sqlx::Error> {
        let Some(guard) = Guard::read(conn).await? else {
            return Ok(None);
        };
        let verdicts: Vec<Result<(), Held>> = guard
            .lacking
            .iter()
            .map(|pool| guard.clone().admit(Some(pool)))
            .collect();
        let held = if !verdicts.is_empty() && verdicts.iter().all(Result::is_err) {
            verdicts
                .into_iter()
                .find_map(Result::err)
                .map(|h| h.to_string())
        } else {
            None
        };
        let currency = guard.prices.values().next().map(|p| p.currency.clone());
        Ok(Some(CapState {
            cap: guard.cap,
            currency,
            spent: guard.spent,
            held,
        }))
    }
}
