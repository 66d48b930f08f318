//! A pool: what an operator declares of a provider without reservations,
//! "keep `count` machines of `plan` in `site`". The cluster's pools are its
//! desired state, held in Postgres (`crate::pools`); a provider with pools
//! turns them into units of capacity (Latitude.sh: a place per machine).

use std::collections::HashMap;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool {
    /// Short, in hostnames: lowercase letters, digits and `-`.
    pub name: String,
    pub plan: String,
    pub site: String,
    pub count: u32,
    pub operating_system: String,
    /// Ids of the project's SSH keys to put on each server.
    pub ssh_keys: Vec<String>,
}

impl FromStr for Pool {
    type Err = String;

    /// `name=web,plan=c2-small-x86,site=SAO2,count=3,os=ubuntu_24_04_x64_lts`
    /// with optional `ssh_keys=ssh_a+ssh_b`.
    fn from_str(s: &str) -> Result<Pool, String> {
        let mut fields: HashMap<&str, &str> = HashMap::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("pool {s:?}: {part:?} is not key=value"))?;
            if fields.insert(k.trim(), v.trim()).is_some() {
                return Err(format!("pool {s:?}: {k} given twice"));
            }
        }
        let mut take = |key: &str| {
            fields
                .remove(key)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("pool {s:?}: {key}= is missing"))
        };
        let pool = Pool {
            name: take("name")?.to_string(),
            plan: take("plan")?.to_string(),
            // The API's sites are upper-case (`DAL`); one typed `dal` is
            // the same site.
            site: take("site")?.to_ascii_uppercase(),
            count: take("count")?
                .parse()
                .map_err(|_| format!("pool {s:?}: count= is not a whole number"))?,
            operating_system: take("os")?.to_string(),
            ssh_keys: fields
                .remove("ssh_keys")
                .map(|k| {
                    k.split('+')
                        .filter(|k| !k.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
        };
        if let Some(extra) = fields.keys().next() {
            return Err(format!(
                "pool {s:?}: unknown key {extra:?} (name, plan, site, count, os, ssh_keys)"
            ));
        }
        Ok(pool)
    }
}

/// A pool as the cluster holds it: what is declared, the most places it
/// ever had (machines may stand on them while it drains), and whether it
/// was removed (then its count is 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    pub pool: Pool,
    pub places_ever: u32,
    pub removed: bool,
}

impl Declared {
    /// A pool as a process's flags declare it, before the cluster has any.
    pub fn new(pool: Pool) -> Self {
        Declared {
            places_ever: pool.count,
            pool,
            removed: false,
        }
    }

    /// Every place a machine of it may stand on: its current places and
    /// those it had before it shrank.
    pub fn places_known(&self) -> u32 {
        self.places_ever.max(self.pool.count)
    }
}
