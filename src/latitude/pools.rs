//! Pools on Latitude.sh, which has no reservations: a pool is "keep
//! `count` servers of `plan` in `site`" (the spec is `provider::pool`);
//! here are its flag's checks and the hostname that is its witness.
//!
//! A server belongs to a place in a pool by its hostname, the only mark a
//! create carries: `<prefix><pool>-<index>-<8 hex of the creation's
//! request>`. The hostname is unique per creation (the witness), so looking
//! it up after an unseen answer finds this creation's server and no other,
//! and a pool's servers are recognised in a listing without tags. A place
//! (`index` below the pool's count) is a unit of capacity: it holds at most
//! one server, and the sinbin penalises it.

use std::collections::HashSet;

use uuid::Uuid;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str, count: u32) -> Pool {
        format!("name={name},plan=c2-small-x86,site=SAO2,count={count},os=ubuntu_24_04_x64_lts")
            .parse()
            .unwrap()
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
}
