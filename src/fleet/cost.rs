//! What the fleet costs, from the prices the last pass read with the stock
//! (`PoolReport::price`): per pool and for the fleet, per hour and per
//! month, and the part of it that buys nothing (surplus and failed
//! machines). Figures are kept per currency and never added across two.

use serde::Serialize;

use super::PoolsSeen;
use crate::provider::{HOURS_PER_MONTH, PoolReport};

/// One pool's cost as the last pass saw it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolCost {
    pub pool: String,
    pub currency: String,
    /// One server, per hour.
    pub server_per_hour: f64,
    /// Every machine of the pool standing (surplus and failed included).
    pub per_hour: f64,
    /// Of that, surplus and failed machines: paid for, serving nothing.
    pub wasted_per_hour: f64,
}

impl PoolCost {
    /// An estimate: hourly billing over an average month.
    pub fn per_month(&self) -> f64 {
        self.per_hour * HOURS_PER_MONTH
    }
}

/// The fleet's cost in one currency.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetCost {
    pub currency: String,
    pub per_hour: f64,
    pub wasted_per_hour: f64,
}

impl FleetCost {
    pub fn per_month(&self) -> f64 {
        self.per_hour * HOURS_PER_MONTH
    }
}

/// A pool's cost, when the provider gave its price.
pub fn pool_cost(r: &PoolReport) -> Option<PoolCost> {
    let price = r.price.as_ref()?;
    let surplus = r.machines.saturating_sub(r.taken);
    let wasted = surplus + r.failed.min(r.taken);
    Some(PoolCost {
        pool: r.name.clone(),
        currency: price.currency.clone(),
        server_per_hour: price.hour,
        per_hour: f64::from(r.machines.max(r.taken)) * price.hour,
        wasted_per_hour: f64::from(wasted) * price.hour,
    })
}

impl PoolsSeen {
    pub fn costs(&self) -> Vec<PoolCost> {
        self.pools
            .iter()
            .filter_map(|p| pool_cost(&p.report))
            .collect()
    }

    /// The fleet's cost per currency (one, as an account is billed in one).
    pub fn fleet_cost(&self) -> Vec<FleetCost> {
        let mut out: Vec<FleetCost> = vec![];
        for c in self.costs() {
            match out.iter_mut().find(|f| f.currency == c.currency) {
                Some(f) => {
                    f.per_hour += c.per_hour;
                    f.wasted_per_hour += c.wasted_per_hour;
                }
                None => out.push(FleetCost {
                    currency: c.currency,
                    per_hour: c.per_hour,
                    wasted_per_hour: c.wasted_per_hour,
                }),
            }
        }
        out
    }

    /// Pools with machines whose price the provider did not give.
    pub fn unpriced(&self) -> Vec<&str> {
        self.pools
            .iter()
            .filter(|p| p.report.price.is_none() && p.report.machines.max(p.report.taken) > 0)
            .map(|p| p.report.name.as_str())
            .collect()
    }
}

/// What creating (`delta` > 0) or deleting (< 0) servers of `plan` at
/// `site` does to the bill, as Infracost says it of a plan: "+3 ×
/// c2-small-x86 @ DAL at 0.33 USD/h: +0.99 USD/h, +722.70 USD/month".
pub fn change_words(
    plan: &str,
    site: &str,
    delta: i64,
    price: Option<&crate::provider::Price>,
) -> String {
    match price {
        Some(p) => {
            let hour = delta as f64 * p.hour;
            format!(
                "{delta:+} × {plan} @ {site} at {:.2} {cur}/h: {hour:+.2} {cur}/h, {:+.2} {cur}/month (at hourly rates, an estimate)",
                p.hour,
                hour * HOURS_PER_MONTH,
                cur = p.currency
            )
        }
        None => format!(
            "{delta:+} × {plan} @ {site}: no price read for it yet (a pass reads it with the stock)"
        ),
    }
}

/// An amount with its currency, to the cent.
pub fn money(amount: f64, currency: &str) -> String {
    format!("{amount:.2} {currency}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Price;

    fn report(
        name: &str,
        taken: u32,
        machines: u32,
        failed: u32,
        price: Option<f64>,
    ) -> PoolReport {
        PoolReport {
            name: name.into(),
            plan: "c2-small-x86".into(),
            site: "DAL".into(),
            scope: "c2-small-x86@DAL".into(),
            count: taken,
            taken,
            failed,
            machines,
            removed: false,
            dormant: 0,
            stock: None,
            price: price.map(|hour| Price {
                currency: "USD".into(),
                hour,
                month: None,
                year: None,
            }),
        }
    }

    #[test]
    fn a_pool_costs_its_machines_and_wastes_its_surplus_and_failed() {
        let c = pool_cost(&report("web", 4, 6, 1, Some(0.5))).unwrap();
        assert_eq!((c.per_hour, c.wasted_per_hour), (3.0, 1.5));
        assert_eq!(c.per_month(), 3.0 * 730.0);
        assert_eq!(pool_cost(&report("db", 2, 2, 0, None)), None);
    }

    #[test]
    fn the_fleet_adds_its_pools_and_names_the_unpriced() {
        let seen = PoolsSeen {
            surveyed_at: chrono::Utc::now(),
            listing: None,
            pools: [
                report("web", 4, 4, 0, Some(0.33)),
                report("db", 2, 3, 0, Some(1.0)),
                report("gpu", 1, 1, 0, None),
            ]
            .into_iter()
            .map(|report| super::super::PoolState {
                report,
                held_until: None,
            })
            .collect(),
        };
        let fleet = seen.fleet_cost();
        assert_eq!(fleet.len(), 1);
        assert!((fleet[0].per_hour - 4.32).abs() < 1e-9, "{fleet:?}");
        assert!((fleet[0].wasted_per_hour - 1.0).abs() < 1e-9, "{fleet:?}");
        assert_eq!(seen.unpriced(), ["gpu"]);
        assert_eq!(money(4.32, "USD"), "4.32 USD");
        let price = crate::provider::Price {
            currency: "USD".into(),
            hour: 0.33,
            month: None,
            year: None,
        };
        assert_eq!(
            change_words("c2-small-x86", "DAL", 3, Some(&price)),
            "+3 × c2-small-x86 @ DAL at 0.33 USD/h: +0.99 USD/h, +722.70 USD/month (at hourly rates, an estimate)"
        );
        assert!(
            change_words("c2", "DAL", -2, Some(&price)).contains("-0.66 USD/h, -481.80 USD/month")
        );
        assert!(change_words("c2", "DAL", 1, None).contains("no price"));
    }
}
