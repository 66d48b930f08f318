//! The cluster's pools: its desired state where the provider has no
//! reservations ("keep 12 of plan X in site Y"). Held in Postgres as a view
//! (`shepherd.pools`) folded from audited events (`pool_declared`,
//! `pool_changed`, `pool_removed`, each with who and why), like the
//! settings: every worker, command, SQL function and page reads the same
//! pools, and they change for everyone at once.
//!
//! The rules live in one place, the SQL functions `shepherd.set_pool()` and
//! `shepherd.remove_pool()`, which the commands, the console and psql all
//! call: names that hostnames cannot confuse, a count of 0 or a removal
//! only with a recorded confirmation, and a pool's plan, site and OS fixed
//! while it has machines (declare a new pool and remove the old one, which
//! drains as the new one fills: no pool is ever half one thing and half
//! another).

use std::fmt;

use sqlx::{PgConnection, PgPool};

use crate::events::StoreError;
pub use crate::events::views::PoolRow;
use crate::provider::Pool;
use crate::provider::pool::Declared;

impl PoolRow {
    /// The pool as a provider takes it.
    pub fn declared(&self) -> Declared {
        Declared {
            pool: self.pool(),
            places_ever: self.places_ever,
            removed: self.removed,
        }
    }
}

/// Every pool the cluster ever declared, removed ones included, by name.
pub async fn read(conn: &mut PgConnection) -> Result<Vec<PoolRow>, sqlx::Error> {
    Ok(crate::events::views::read_pools(conn, None)
        .await?
        .into_values()
        .collect())
}

/// The pools as a provider takes them.
pub async fn declared(db: &PgPool) -> Result<Vec<Declared>, sqlx::Error> {
    let mut conn = db.acquire().await?;
    Ok(read(&mut conn)
        .await?
        .iter()
        .map(PoolRow::declared)
        .collect())
}

/// What a change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Declared,
    Changed,
    Unchanged,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Change::Declared => "declared",
            Change::Changed => "changed",
            Change::Unchanged => "unchanged",
        })
    }
}

/// Declares or changes a pool through `shepherd.set_pool()`. A count of 0
/// needs `confirm`; the error names what was refused.
pub async fn set(
    conn: &mut PgConnection,
    pool: &Pool,
    reason: &str,
    by: &str,
    confirm: bool,
) -> Result<Change, sqlx::Error> {
    let done: String =
        sqlx::query_scalar("select shepherd.set_pool($1, $2, $3, $4, $5, $6, $7, $8, $9)")
            .bind(&pool.name)
            .bind(&pool.plan)
            .bind(&pool.site)
            .bind(i32::try_from(pool.count).unwrap_or(i32::MAX))
            .bind(&pool.operating_system)
            .bind(&pool.ssh_keys)
            .bind(reason)
            .bind(by)
            .bind(confirm)
            .fetch_one(&mut *conn)
            .await?;
    Ok(match done.as_str() {
        "declared" => Change::Declared,
        "changed" => Change::Changed,
        _ => Change::Unchanged,
    })
}

/// Removes a pool through `shepherd.remove_pool()` (its machines are then
/// deleted as it drains, so it needs `confirm`). False if there was none.
pub async fn remove(
    conn: &mut PgConnection,
    name: &str,
    reason: &str,
    by: &str,
    confirm: bool,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("select shepherd.remove_pool($1, $2, $3, $4)")
        .bind(name)
        .bind(reason)
        .bind(by)
        .bind(confirm)
        .fetch_one(&mut *conn)
        .await
}

/// What a starting process settled on.
#[derive(Debug, Clone, PartialEq)]
pub struct Established {
    /// This process declared the cluster's first pools, from its flags.
    pub first: bool,
    pub pools: Vec<Declared>,
    /// Pools given by flag that differ from the cluster's, in words.
    pub differences: Vec<String>,
}

/// The first process of a cluster with no pools yet declares its flags'
/// pools; a later one adopts the cluster's and says which of its flags
/// differ (the cluster's pools change with `shepherd pools set|apply`,
/// never with a process's flags).
pub async fn establish(db: &PgPool, flags: &[Pool], by: &str) -> Result<Established, StoreError> {
    let mut tx = db.begin().await?;
    // The flags' pools' locks first, in order, then the pools': the order
    // set_pool() takes them in, so an operator's concurrent change waits
    // instead of deadlocking with this.
    let mut names: Vec<&str> = flags.iter().map(|p| p.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        sqlx::query(
            "select pg_catalog.pg_advisory_xact_lock(
                 pg_catalog.hashtextextended(('pool/' || $1)::text, 0::int8))",
        )
        .bind(name)
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query("select pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended('operator/pools'::text, 0::int8))")
        .execute(&mut *tx)
        .await?;
    let ever: bool = sqlx::query_scalar(
        "select exists(select 1 from shepherd.events
                       where event_type in ('pool_declared', 'pool_changed', 'pool_removed'))",
    )
    .fetch_one(&mut *tx)
    .await?;
    let first = !ever && !flags.is_empty();
    if first {
        // Through declare_pool(), which a worker's role may run: it
        // declares a pool the cluster never had, and changes none.
        for p in flags {
            sqlx::query("select shepherd.declare_pool($1, $2, $3, $4, $5, $6, $7, $8)")
                .bind(&p.name)
                .bind(&p.plan)
                .bind(&p.site)
                .bind(i32::try_from(p.count).unwrap_or(i32::MAX))
                .bind(&p.operating_system)
                .bind(&p.ssh_keys)
                .bind("the cluster's first pools, from the flags of the first process to start")
                .bind(by)
                .execute(&mut *tx)
                .await?;
        }
    }
    let rows = read(&mut tx).await?;
    tx.commit().await?;
    let mut differences = Vec::new();
    if !first {
        for p in flags {
            match rows.iter().find(|r| r.name == p.name && !r.removed) {
                None => differences.push(format!(
                    "--pool {}: the cluster has no such pool; this process keeps the cluster's \
                     (declare it with: shepherd pools set {} plan={},site={},count={},os={} --reason \"...\")",
                    p.name, p.name, p.plan, p.site, p.count, p.operating_system
                )),
                Some(r) if r.pool() != *p => differences.push(format!(
                    "--pool {}: differs from the cluster's (plan={}, site={}, count={}, os={}); this \
                     process uses the cluster's (change it with: shepherd pools set ... --reason \"...\")",
                    p.name, r.plan, r.site, r.count, r.operating_system
                )),
                Some(_) => {}
            }
        }
    }
    Ok(Established {
        first,
        pools: rows.iter().map(PoolRow::declared).collect(),
        differences,
    })
}

/// What stands on each pool now, by our records: machines (by their
/// hostnames), machines leaving, and creations in flight (by their places).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Occupancy {
    pub machines: u32,
    pub leaving: u32,
    pub creating: u32,
}

impl Occupancy {
    /// Everything of the pool that is billed or about to be: machines
    /// standing (leaving ones too) and creations in flight.
    pub fn billed(&self) -> u32 {
        self.machines + self.creating
    }
}

/// Each pool's [`Occupancy`], the hostnames read with the cluster's
/// `prefix`.
pub async fn occupancy(
    conn: &mut PgConnection,
    prefix: &str,
    rows: &[PoolRow],
) -> Result<std::collections::BTreeMap<String, Occupancy>, sqlx::Error> {
    Ok(standing(conn, prefix, rows).await?.0)
}

/// [`occupancy`], and how many machines of ours (managed, or made and not
/// yet assimilated) no pool's hostnames name.
pub async fn standing(
    conn: &mut PgConnection,
    prefix: &str,
    rows: &[PoolRow],
) -> Result<(std::collections::BTreeMap<String, Occupancy>, u32), sqlx::Error> {
    let pools: Vec<Pool> = rows.iter().map(PoolRow::pool).collect();
    let machines: Vec<(Option<String>, bool)> = sqlx::query_as(
        "select m.hostname, exists(select 1 from shepherd.pending_deletions d
                                   where d.machine_id = m.machine_id)
         from shepherd.managed_machines m
         union all
         select hostname, false from shepherd.unassimilated_devices",
    )
    .fetch_all(&mut *conn)
    .await?;
    let places: Vec<Option<String>> =
        sqlx::query_scalar("select place from shepherd.pending_creations")
            .fetch_all(&mut *conn)
            .await?;
    let mut out: std::collections::BTreeMap<String, Occupancy> = rows
        .iter()
        .map(|r| (r.name.clone(), Occupancy::default()))
        .collect();
    let mut strays = 0;
    for (hostname, leaving) in machines {
        let Some(named) = hostname
            .as_deref()
            .and_then(|h| crate::latitude::pools::parse(prefix, &pools, h))
        else {
            strays += 1;
            continue;
        };
        match out.get_mut(&named.pool.name) {
            Some(o) => {
                o.machines += 1;
                o.leaving += u32::from(leaving);
            }
            None => strays += 1,
        }
    }
    for place in places.into_iter().flatten() {
        if let Some(o) = place
            .split_once('/')
            .and_then(|(name, _)| out.get_mut(name))
        {
            o.creating += 1;
        }
    }
    Ok((out, strays))
}
