//! Pools: what an operator asks of Latitude.sh, which has no reservations.
//! A pool is "keep `count` servers of `plan` in `site`", bounded by the
//! plan's stock in that site and by the cluster's limit.
//!
//! A server belongs to a place in a pool by its hostname, the only mark a
//! create carries: `<prefix><pool>-<index>-<8 hex of the creation's
//! request>`. The hostname is unique per creation (the witness), so looking
//! it up after an unseen answer finds this creation's server and no other,
//! and a pool's servers are recognised in a listing without tags. A place
//! (`index` below the pool's count) is a unit of capacity: it holds at most
//! one server, and the sinbin penalises it.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use uuid::Uuid;

use super::model::{Phase, Server, Stock};

/// Latitude refuses longer hostnames (its Terraform provider checks the
/// same bound).
pub const HOSTNAME_MAX: usize = 32;
/// Hex digits of the request in a hostname: 32 bits. Only creations for
/// the same place must differ, and a place sees few.
pub const REQUEST_DIGITS: usize = 8;
/// Places per pool: indexes of up to three digits.
pub const COUNT_MAX: u32 = 1000;

pub use crate::provider::pool::Pool;

/// Checks pools against each other and the hostname prefix.
pub fn validate(pools: &[Pool], prefix: &str) -> Result<(), String> {
    let mut names = HashSet::new();
    for p in pools {
        if p.name.is_empty()
            || !p
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            || p.name.starts_with('-')
            || p.name.ends_with('-')
        {
            return Err(format!(
                "pool name {:?}: lowercase letters, digits and inner '-' only (it is part of \
                 every hostname)",
                p.name
            ));
        }
        if p.count > COUNT_MAX {
            return Err(format!(
                "pool {:?}: count {} is over {COUNT_MAX}",
                p.name, p.count
            ));
        }
        let digits = p.count.saturating_sub(1).max(1).to_string().len();
        let longest = prefix.len() + p.name.len() + 1 + digits + 1 + REQUEST_DIGITS;
        if longest > HOSTNAME_MAX {
            return Err(format!(
                "pool {:?}: its hostnames would be {longest} characters, over Latitude's \
                 {HOSTNAME_MAX}; shorten the pool's name or the prefix {prefix:?}",
                p.name
            ));
        }
        if !names.insert(p.name.as_str()) {
            return Err(format!("pool {:?} is declared twice", p.name));
        }
    }
    // One pool's hostnames must not read as another's (`web` and `web-2`).
    for a in pools {
        for b in pools {
            if a.name != b.name && b.name.starts_with(&format!("{}-", a.name)) {
                return Err(format!(
                    "pools {:?} and {:?}: one name followed by '-' begins the other, so their \
                     hostnames could be mistaken; rename one",
                    a.name, b.name
                ));
            }
        }
    }
    Ok(())
}

/// The part of a creation's request its hostname carries: its witness.
pub fn witness(request: Uuid) -> String {
    request.simple().to_string()[..REQUEST_DIGITS].to_string()
}

/// The hostname of one creation for place `index` of a pool.
pub fn hostname(prefix: &str, pool: &str, index: u32, request: Uuid) -> String {
    format!("{prefix}{pool}-{index}-{}", witness(request))
}

/// What a hostname of ours names: the pool, the place and the witness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named<'p> {
    pub pool: &'p Pool,
    pub index: u32,
    pub witness: String,
}

/// The pool, place and witness a hostname of ours names, if it is one:
/// exactly `<prefix><pool>-<index>-<8 lowercase hex>`, for a declared pool.
pub fn parse<'p>(prefix: &str, pools: &'p [Pool], hostname: &str) -> Option<Named<'p>> {
    let rest = hostname.strip_prefix(prefix)?;
    let (rest, request) = rest.rsplit_once('-')?;
    let (name, index) = rest.rsplit_once('-')?;
    let is_request = request.len() == REQUEST_DIGITS
        && request
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
    let index_ok = !index.is_empty()
        && index.len() <= 3
        && index.chars().all(|c| c.is_ascii_digit())
        && (index == "0" || !index.starts_with('0'));
    if !is_request || !index_ok {
        return None;
    }
    let pool = pools.iter().find(|p| p.name == name)?;
    Some(Named {
        pool,
        index: index.parse().ok()?,
        witness: request.to_string(),
    })
}

/// The pool a hostname of ours names, if any.
pub fn pool_of<'p>(prefix: &str, pools: &'p [Pool], hostname: &str) -> Option<&'p Pool> {
    parse(prefix, pools, hostname).map(|n| n.pool)
}

/// Why a pool gets fewer creations than it lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Shortfall {
    /// The plan does not exist in the site.
    NotInSite,
    /// The site has none of the plan in stock now (or fewer than needed).
    OutOfStock,
    /// The cluster's limit leaves no room.
    AtLimit,
    /// The pool is in the sinbin.
    Penalised,
}

/// One pool as a pass would see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolPlan {
    pub pool: String,
    pub want: u32,
    /// Servers of the pool that are on or on their way.
    pub have: u32,
    /// Servers of the pool whose deployment failed: not counted in `have`.
    pub failed: u32,
    /// Creations admitted and not yet seen as servers.
    pub in_flight: u32,
    pub stock: Stock,
    /// Creations a pass would admit now.
    pub create: u32,
    /// Lacking after `create`, and why.
    pub short: Option<(u32, Shortfall)>,
}

/// What a pass would do for each pool: count its servers (by hostname,
/// and only where plan and site still match the pool), subtract what is in
/// flight, and admit what stock and the cluster's `room` allow. Room is
/// shared one creation at a time across pools in turn, so one large pool
/// cannot starve the others at the limit.
pub fn plan(
    prefix: &str,
    pools: &[Pool],
    servers: &[Server],
    stock: &BTreeMap<(String, String), Stock>,
    in_flight: &HashMap<String, u32>,
    penalised: &HashSet<String>,
    room: u64,
) -> Vec<PoolPlan> {
    let mut plans: Vec<PoolPlan> = pools
        .iter()
        .map(|p| {
            let mine = servers.iter().filter(|s| {
                s.hostname()
                    .and_then(|h| pool_of(prefix, pools, h))
                    .is_some_and(|owner| owner.name == p.name)
                    && s.plan_slug() == Some(p.plan.as_str())
                    && s.site()
                        .is_some_and(|site| site.eq_ignore_ascii_case(&p.site))
            });
            let (mut have, mut failed) = (0, 0);
            for s in mine {
                match s.phase() {
                    Phase::Failed => failed += 1,
                    Phase::Ready | Phase::Underway => have += 1,
                }
            }
            PoolPlan {
                pool: p.name.clone(),
                want: p.count,
                have,
                failed,
                in_flight: in_flight.get(&p.name).copied().unwrap_or(0),
                stock: stock
                    .get(&(p.plan.clone(), p.site.clone()))
                    .copied()
                    .unwrap_or(Stock::Unavailable),
                create: 0,
                short: None,
            }
        })
        .collect();
    // What each pool lacks, and what its stock and the sinbin allow.
    let mut open: Vec<(u32, Option<Shortfall>)> = plans
        .iter()
        .map(|p| {
            let lacking = p.want.saturating_sub(p.have + p.in_flight);
            if lacking == 0 {
                return (0, None);
            }
            if penalised.contains(&p.pool) {
                return (0, Some(Shortfall::Penalised));
            }
            match p.stock {
                Stock::Unavailable => (0, Some(Shortfall::NotInSite)),
                Stock::Empty => (0, Some(Shortfall::OutOfStock)),
                Stock::Some(Some(n)) if n < lacking => (n, Some(Shortfall::OutOfStock)),
                Stock::Some(_) => (lacking, None),
            }
        })
        .collect();
    let mut room = room;
    loop {
        let mut gave = false;
        for (plan, (allowed, _)) in plans.iter_mut().zip(open.iter_mut()) {
            if *allowed > 0 && room > 0 {
                plan.create += 1;
                *allowed -= 1;
                room -= 1;
                gave = true;
            }
        }
        if !gave {
            break;
        }
    }
    for (plan, (allowed, why)) in plans.iter_mut().zip(open) {
        let lacking = plan
            .want
            .saturating_sub(plan.have + plan.in_flight + plan.create);
        if lacking > 0 {
            let why = if allowed > 0 {
                Shortfall::AtLimit
            } else {
                why.unwrap_or(Shortfall::AtLimit)
            };
            plan.short = Some((lacking, why));
        }
    }
    plans
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str, count: u32) -> Pool {
        format!("name={name},plan=c2-small-x86,site=SAO2,count={count},os=ubuntu_24_04_x64_lts")
            .parse()
            .unwrap()
    }

    fn server(hostname: &str, plan: &str, site: &str, status: &str) -> Server {
        serde_json::from_value(serde_json::json!({
            "id": format!("sv_{hostname}"),
            "type": "servers",
            "attributes": {
                "hostname": hostname,
                "status": status,
                "plan": {"slug": plan},
                "region": {"site": {"slug": site}},
            }
        }))
        .unwrap()
    }

    fn stock(n: Option<u32>) -> BTreeMap<(String, String), Stock> {
        let s = match n {
            Some(0) => Stock::Empty,
            n => Stock::Some(n),
        };
        BTreeMap::from([(("c2-small-x86".into(), "SAO2".into()), s)])
    }

    #[test]
    fn a_pool_reads_from_its_flag_and_says_what_is_wrong() {
        let p: Pool =
            "name=web, plan=c2-small-x86, site=SAO2, count=3, os=ubuntu, ssh_keys=ssh_a+ssh_b"
                .parse()
                .unwrap();
        assert_eq!(p.count, 3);
        assert_eq!(p.ssh_keys, vec!["ssh_a", "ssh_b"]);
        for (bad, says) in [
            ("name=web,plan=p,site=s,os=o", "count= is missing"),
            ("name=web,plan=p,site=s,count=-1,os=o", "not a whole number"),
            (
                "name=web,plan=p,site=s,count=1,os=o,colour=red",
                "unknown key",
            ),
            ("name=web,name=db,plan=p,site=s,count=1,os=o", "given twice"),
            ("web", "not key=value"),
        ] {
            let e = bad.parse::<Pool>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn pools_that_hostnames_could_confuse_are_refused() {
        assert!(validate(&[pool("web", 1), pool("db", 1)], "shepherd-").is_ok());
        let e = validate(&[pool("web", 1), pool("web-2", 1)], "shepherd-").unwrap_err();
        assert!(e.contains("mistaken"), "{e}");
        let e = validate(&[pool("web", 1), pool("web", 2)], "shepherd-").unwrap_err();
        assert!(e.contains("twice"), "{e}");
        let e = validate(&[pool("Web", 1)], "shepherd-").unwrap_err();
        assert!(e.contains("lowercase"), "{e}");
        let e = validate(&[pool("a-long-pool-name", 1)], "shepherd-").unwrap_err();
        assert!(e.contains("over Latitude's 32"), "{e}");
    }

    #[test]
    fn a_hostname_names_its_pool_and_nothing_else() {
        let pools = [pool("web", 1), pool("db", 1)];
        let request = Uuid::new_v4();
        let h = hostname("shepherd-", "web", 7, request);
        assert!(h.len() <= HOSTNAME_MAX, "{h}");
        let named = parse("shepherd-", &pools, &h).unwrap();
        assert_eq!((named.pool.name.as_str(), named.index), ("web", 7));
        assert_eq!(named.witness, witness(request));
        assert!(request.simple().to_string().starts_with(&named.witness));
        assert_ne!(h, hostname("shepherd-", "web", 7, Uuid::new_v4()));
        for other in [
            "shepherd-web",
            "shepherd-web-1-xyz",
            "shepherd-web-01234567",
            "shepherd-web-01-01234567",
            "shepherd-cache-1-01234567",
            "shepherd-web-1-0123456A",
            "someone-web-1-01234567",
        ] {
            assert!(pool_of("shepherd-", &pools, other).is_none(), "{other}");
        }
    }

    #[test]
    fn a_pool_counts_its_own_servers_where_they_belong() {
        let pools = [pool("web", 4)];
        let h = |n: u8| format!("shepherd-web-{n}-{n:08x}");
        let servers = [
            server(&h(1), "c2-small-x86", "SAO2", "on"),
            server(&h(2), "c2-small-x86", "SAO2", "deploying"),
            server(&h(3), "c2-small-x86", "SAO2", "failed_deployment"),
            // Ours by name, but the pool's plan changed since: not counted.
            server(&h(4), "c3-large-x86", "SAO2", "on"),
            // Someone else's.
            server("db-1", "c2-small-x86", "SAO2", "on"),
        ];
        let plans = plan(
            "shepherd-",
            &pools,
            &servers,
            &stock(Some(10)),
            &HashMap::new(),
            &HashSet::new(),
            100,
        );
        let p = &plans[0];
        assert_eq!((p.have, p.failed, p.create), (2, 1, 2));
        assert_eq!(p.short, None);
    }

    #[test]
    fn stock_in_flight_and_the_limit_bound_the_creations() {
        let pools = [pool("web", 5), pool("db", 5)];
        let none = HashSet::new();
        // Stock of 2: two creations, three short for stock.
        let plans = plan(
            "shepherd-",
            &pools[..1],
            &[],
            &stock(Some(2)),
            &HashMap::new(),
            &none,
            100,
        );
        assert_eq!(plans[0].create, 2);
        assert_eq!(plans[0].short, Some((3, Shortfall::OutOfStock)));
        // In stock without a count: not bounded by it.
        let plans = plan(
            "shepherd-",
            &pools[..1],
            &[],
            &stock(None),
            &HashMap::new(),
            &none,
            100,
        );
        assert_eq!(plans[0].create, 5);
        // None in stock.
        let plans = plan(
            "shepherd-",
            &pools[..1],
            &[],
            &stock(Some(0)),
            &HashMap::new(),
            &none,
            100,
        );
        assert_eq!(plans[0].short, Some((5, Shortfall::OutOfStock)));
        // Three in flight count against the pool.
        let flying = HashMap::from([("web".to_string(), 3)]);
        let plans = plan(
            "shepherd-",
            &pools[..1],
            &[],
            &stock(None),
            &flying,
            &none,
            100,
        );
        assert_eq!(plans[0].create, 2);
        // Room for 5 across two pools of 5: shared in turn, 3 and 2.
        let plans = plan(
            "shepherd-",
            &pools,
            &[],
            &stock(None),
            &HashMap::new(),
            &none,
            5,
        );
        assert_eq!((plans[0].create, plans[1].create), (3, 2));
        assert_eq!(plans[0].short, Some((2, Shortfall::AtLimit)));
        assert_eq!(plans[1].short, Some((3, Shortfall::AtLimit)));
        // A penalised pool gets nothing, and its room goes to the other.
        let sinbin = HashSet::from(["web".to_string()]);
        let plans = plan(
            "shepherd-",
            &pools,
            &[],
            &stock(None),
            &HashMap::new(),
            &sinbin,
            5,
        );
        assert_eq!((plans[0].create, plans[1].create), (0, 5));
        assert_eq!(plans[0].short, Some((5, Shortfall::Penalised)));
        // A site without the plan.
        let elsewhere: Pool = "name=web,plan=c2-small-x86,site=NYC,count=1,os=o"
            .parse()
            .unwrap();
        let plans = plan(
            "shepherd-",
            &[elsewhere],
            &[],
            &stock(None),
            &HashMap::new(),
            &none,
            5,
        );
        assert_eq!(plans[0].short, Some((1, Shortfall::NotInSite)));
    }
}
