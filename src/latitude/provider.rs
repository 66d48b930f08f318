//! Latitude.sh behind the provider seam. A unit of capacity is a place in a
//! pool (`web` place 3), named by a UUID derived from the project, the pool
//! and the place, so that every process names it alike; a machine is a
//! server; the witness is the hostname, which carries the pool, the place
//! and the first digits of the creation's request.
//!
//! A place is taken when a server of ours names it, whatever its status; it
//! is provisionable while the plan is in stock in the pool's site (a pass
//! lists the servers once and reads the stock once per plan and site). A
//! create refused for want of stock penalises the plan at the site, so the
//! pool's other places wait with it. A create waits for the creation
//! limiter and sends one POST; a create whose answer was not seen is
//! settled by the job looking the hostname up after the settle window
//! (`find_created`), never by sending it again. A pass lists only the
//! servers whose hostname carries the cluster's prefix.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use futures::future::BoxFuture;

use uuid::Uuid;

use super::client::{CreateServer, LatitudeClient, LatitudeError, Servers};
use super::model::{Server, Stock};
use super::pools::{self, Pool};
use crate::config::Rate;
use crate::limiter::Limiter;
use crate::provider::ErrorClass;
use crate::provider::discipline::Pacer;
use crate::provider::pool::Declared;
use crate::provider::{
    Created, Deleted, Failure, Fence, Inventory, ListingCost, Machine, MachineFacts, PoolReport,
    PoolStock, Provider, ProviderError, ProviderResult, Survey, Unit,
};

/// The name machines of this provider carry in the views.
pub const NAME: &str = "latitude";

/// Where shepherd's unit ids for Latitude places are derived from.
const UNIT_NAMESPACE: Uuid = Uuid::from_u128(0x5e3a_77c2_1b0d_4f7e_9a61_3c2e_8d4b_0f19);

#[derive(Debug, Clone)]
pub struct LatitudeProvider {
    client: LatitudeClient,
    prefix: String,
    /// The cluster's pools, replaced whenever a job reads them anew.
    places: Arc<RwLock<Arc<Places>>>,
    /// Set once a pass found a server of ours that the prefix-filtered
    /// listing left out: from then on this process lists the whole project.
    whole_project: Arc<AtomicBool>,
}

/// The pools and their places, as one snapshot.
#[derive(Debug, Default)]
struct Places {
    /// Every pool the cluster declared, removed ones included (their
    /// machines may still stand while they drain).
    pools: Vec<Declared>,
    /// Unit id → (pool, place), for every place a machine may stand on.
    units: BTreeMap<Uuid, (usize, u32)>,
}

impl Places {
    fn of(project: &str, pools: Vec<Declared>) -> Places {
        let mut units = BTreeMap::new();
        for (i, d) in pools.iter().enumerate() {
            for index in 0..d.places_known() {
                units.insert(unit_id(project, &d.pool.name, index), (i, index));
            }
        }
        Places { pools, units }
    }

    fn all(&self) -> Vec<Pool> {
        self.pools.iter().map(|d| d.pool.clone()).collect()
    }
}

impl LatitudeProvider {
    /// A provider for these pools (a process's flags, or the cluster's).
    pub fn new(client: LatitudeClient, pools: Vec<Pool>, prefix: String) -> Result<Self, String> {
        pools::validate(&pools, &prefix)?;
        let declared = pools.into_iter().map(Declared::new).collect();
        let places = Places::of(client.project(), declared);
        Ok(LatitudeProvider {
            client,
            prefix,
            places: Arc::new(RwLock::new(Arc::new(places))),
            whole_project: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The servers that can be this cluster's, and what reading them cost.
    /// Every hostname shepherd gives starts with the prefix, so a listing
    /// filtered by it holds every server a pass must see, at a cost that
    /// follows the cluster's servers, not the project's (a project of
    /// 10,000 is 100 pages a pass unfiltered, more than a minute's reads).
    /// The client checks the filter's match on its side too: an API that
    /// ignored the filter costs pages, not a wrong answer.
    async fn listing(&self) -> Result<(Vec<Machine>, ListingCost), ProviderError> {
        let narrowed = !self.prefix.is_empty() && !self.whole_project.load(Ordering::Relaxed);
        let which = if narrowed {
            Servers::HostnamePrefix(&self.prefix)
        } else {
            Servers::All
        };
        let (servers, report) = self.client.list_servers_reported(which).await?;
        if report.filter_ignored {
            tracing::warn!(
                prefix = %self.prefix,
                read = report.read,
                kept = report.kept,
                "the API did not apply the hostname prefix filter; the listing was filtered here"
            );
        }
        let machines = servers.iter().map(|s| self.as_machine(s)).collect();
        let scope = if narrowed {
            format!("servers whose hostname starts with {}", self.prefix)
        } else {
            "every server of the project".to_string()
        };
        Ok((
            machines,
            ListingCost {
                scope,
                reads: report.pages,
                machines: report.kept,
            },
        ))
    }

    pub fn client(&self) -> &LatitudeClient {
        &self.client
    }

    fn snapshot(&self) -> Arc<Places> {
        self.places
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The unit id of place `index` of `pool`, as every process derives it.
    pub fn place_unit(&self, pool: &str, index: u32) -> Uuid {
        unit_id(self.client.project(), pool, index)
    }

    /// The pool and place of a unit, among every place a machine may stand
    /// on.
    fn place(&self, unit: Uuid) -> Result<(Pool, u32), ProviderError> {
        let places = self.snapshot();
        let (pool, index) = places.units.get(&unit).ok_or_else(|| ProviderError {
            class: ErrorClass::Permanent,
            failure: Failure::NotFound,
            message: format!("{unit} is not a place in any pool of the cluster"),
        })?;
        Ok((places.pools[*pool].pool.clone(), *index))
    }

    fn as_machine(&self, s: &Server) -> Machine {
        let places = self.snapshot();
        let pools = places.all();
        // A place beyond any the pool ever had is none of ours: a server
        // named for it is a stranger (reported, stopping nothing), never
        // an unknown on a place that would hold the pool.
        let named = s
            .hostname()
            .and_then(|h| pools::parse(&self.prefix, &pools, h))
            .filter(|n| {
                places
                    .pools
                    .iter()
                    .any(|d| d.pool.name == n.pool.name && n.index < d.places_known())
            });
        // What the API says of a server goes into events, views and pages:
        // each string cut and cleaned here, once (Postgres refuses a NUL,
        // and one in a status word stopped every pass).
        Machine {
            id: crate::text::bounded(&s.id, 64),
            hostname: s.hostname().map(|h| crate::text::bounded(h, 64)),
            unit: named
                .as_ref()
                .map(|n| self.place_unit(&n.pool.name, n.index)),
            witness: named.map(|n| n.witness),
            condition: s.condition(),
            created_at: s.created_at(),
            status: s
                .attributes
                .status
                .as_deref()
                .map(crate::text::bounded_word),
            billing: s
                .attributes
                .plan
                .as_ref()
                .and_then(|p| p.billing.as_deref())
                .and_then(crate::provider::Billing::from_word),
        }
    }
}

/// The stock a pool's places draw on: its plan at its site. Pools that
/// share both share it.
pub fn scope(pool: &Pool) -> String {
    format!("{}@{}", pool.plan, pool.site)
}

/// The unit id of place `index` of `pool` in `project`, as every process
/// derives it.
pub fn unit_id(project: &str, pool: &str, index: u32) -> Uuid {
    Uuid::new_v5(
        &UNIT_NAMESPACE,
        format!("latitude/{project}/{pool}/{index}").as_bytes(),
    )
}

impl From<LatitudeError> for ProviderError {
    fn from(e: LatitudeError) -> Self {
        let failure = match &e {
            LatitudeError::NotFound { .. } => Failure::NotFound,
            LatitudeError::Refused {
                status: 422,
                detail,
                ..
            } if detail.to_ascii_lowercase().contains("ssh") => Failure::SshKeyRefused,
            _ => Failure::Other,
        };
        ProviderError {
            class: e.class(),
            failure,
            // The provider's words go into events, logs and pages: cut,
            // and without the control characters an event cannot hold.
            message: crate::text::bounded(&e.to_string(), crate::text::MAX_MESSAGE),
        }
    }
}

impl Provider for LatitudeProvider {
    fn name(&self) -> &'static str {
        NAME
    }

    fn machines(&self) -> ProviderResult<'_, Vec<Machine>> {
        Box::pin(async move { Ok(self.listing().await?.0) })
    }

    fn listing_omitted(&self, id: &str) {
        if !self.whole_project.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                server = %id,
                prefix = %self.prefix,
                "a server of ours exists that the prefix-filtered listing left out; this process lists the whole project from now on"
            );
        }
    }

    fn units(&self) -> ProviderResult<'_, Inventory> {
        Box::pin(async move {
            let machines = self.machines().await?;
            self.inventory(&machines).await
        })
    }

    /// A place is taken when a server of ours names it, so one listing of
    /// the servers answers both questions: read twice, it would cost a pass
    /// twice the reads of a 60-a-minute budget, and the two readings could
    /// disagree.
    fn survey(&self, with_units: bool) -> BoxFuture<'_, Survey> {
        Box::pin(async move {
            let (machines, listing) = match self.listing().await {
                Ok((machines, cost)) => (Ok(machines), Some(cost)),
                Err(e) => (Err(e), None),
            };
            let units = match (&machines, with_units) {
                (_, false) => None,
                (Ok(machines), true) => Some(self.inventory(machines).await),
                (Err(e), true) => Some(Err(e.clone())),
            };
            Survey {
                machines,
                units,
                listing,
            }
        })
    }

    fn pools(&self, machines: &[Machine]) -> Vec<PoolReport> {
        self.pool_reports(machines)
    }

    /// A place of a pool as declared now: one a creation may take.
    fn unit_exists(&self, unit: Uuid) -> ProviderResult<'_, bool> {
        let places = self.snapshot();
        let current = places.units.get(&unit).is_some_and(|(pool, index)| {
            let d = &places.pools[*pool];
            !d.removed && *index < d.pool.count
        });
        Box::pin(async move { Ok(current) })
    }

    fn set_pools(&self, pools: &[Declared]) {
        let unchanged = self.snapshot().pools == pools;
        if !unchanged {
            let places = Places::of(self.client.project(), pools.to_vec());
            *self
                .places
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(places);
        }
    }

    fn unit_label(&self, unit: Uuid) -> Option<String> {
        let (pool, index) = self.place(unit).ok()?;
        Some(format!("{}/{index}", pool.name))
    }

    fn hostname(&self, unit: Uuid, request: Uuid) -> String {
        match self.place(unit) {
            Ok((pool, index)) => pools::hostname(&self.prefix, &pool.name, index, request),
            Err(_) => format!("{}{}", self.prefix, pools::witness(request)),
        }
    }

    fn witness(&self, request: Uuid) -> String {
        pools::witness(request)
    }

    fn create<'a>(
        &'a self,
        unit: Uuid,
        request: Uuid,
        ssh_key: &'a str,
        creations: &'a Limiter,
        fence: &'a dyn Fence,
        // A place's create reads nothing first: there is nothing to skip.
        _first: Option<&'a serde_json::Value>,
    ) -> ProviderResult<'a, Created> {
        Box::pin(async move {
            let (pool, index) = self.place(unit)?;
            creations
                .wait_turn()
                .await
                .map_err(|reason| ProviderError::new(ErrorClass::Transient, reason))?;
            let mut ssh_keys = pool.ssh_keys.clone();
            if !ssh_key.is_empty() && !ssh_keys.iter().any(|k| k == ssh_key) {
                ssh_keys.push(ssh_key.to_string());
            }
            let req = CreateServer {
                plan: pool.plan.clone(),
                site: pool.site.clone(),
                operating_system: pool.operating_system.clone(),
                hostname: pools::hostname(&self.prefix, &pool.name, index, request),
                ssh_keys,
            };
            let created = self
                .client
                .create_server_fenced(&req, || fence.check())
                .await
                .map_err(|e| {
                    let out_of_stock = matches!(e, LatitudeError::OutOfStock { .. });
                    let mut e = ProviderError::from(e);
                    if out_of_stock {
                        e.failure = Failure::OutOfStock {
                            scope: Some(scope(&pool)),
                        };
                    }
                    e
                })?;
            Ok(Created {
                machine: self.as_machine(&created.server),
                recovered: created.recovered,
            })
        })
    }

    fn unit_by_label(&self, label: &str) -> Option<Uuid> {
        let (pool, index) = label.split_once('/')?;
        let index: u32 = index.parse().ok()?;
        let unit = self.place_unit(pool, index);
        self.snapshot().units.contains_key(&unit).then_some(unit)
    }

    fn unit_place(&self, unit: Uuid) -> Option<(String, u32)> {
        let (pool, index) = self.place(unit).ok()?;
        Some((pool.name, index))
    }

    fn pool_units(&self, pool: &str) -> Vec<Uuid> {
        let places = self.snapshot();
        places
            .pools
            .iter()
            .filter(|d| d.pool.name == pool)
            .flat_map(|d| (0..d.places_known()).map(|i| self.place_unit(&d.pool.name, i)))
            .collect()
    }

    fn delete<'a>(&'a self, id: &'a str, fence: &'a dyn Fence) -> ProviderResult<'a, Deleted> {
        Box::pin(async move {
            let not_found = self
                .client
                .delete_server_fenced(id, || fence.check())
                .await?;
            Ok(Deleted { not_found })
        })
    }

    fn unit_scope(&self, unit: Uuid) -> Option<String> {
        self.place(unit).ok().map(|(pool, _)| scope(&pool))
    }

    fn find_created(&self, unit: Uuid, request: Uuid) -> ProviderResult<'_, Option<Created>> {
        Box::pin(async move {
            let (pool, index) = self.place(unit)?;
            let hostname = pools::hostname(&self.prefix, &pool.name, index, request);
            Ok(self
                .client
                .find_by_hostname(&hostname)
                .await?
                .map(|server| Created {
                    machine: self.as_machine(&server),
                    recovered: true,
                }))
        })
    }

    fn machine(&self, id: &str) -> ProviderResult<'_, MachineFacts> {
        self.facts(id.to_string())
    }

    fn ensure_ssh_key<'a>(
        &'a self,
        label: &'a str,
        public_key: &'a str,
    ) -> ProviderResult<'a, String> {
        Box::pin(async move { Ok(self.client.ensure_ssh_key(label, public_key).await?) })
    }

    /// Latitude's budgets are the provider's own (the client's window
    /// limiters), not the cluster's `api_rate`.
    fn set_api_rate(&self, _rate: Rate) {}
}

impl LatitudeProvider {
    /// The places of every pool against the servers listed, and the stock
    /// of each plan at each site, read once per plan and site.
    async fn inventory(&self, machines: &[Machine]) -> Result<Inventory, ProviderError> {
        let places = self.snapshot();
        let taken: HashSet<Uuid> = machines.iter().filter_map(|m| m.unit).collect();
        let live: Vec<&Pool> = places
            .pools
            .iter()
            .filter(|d| !d.removed)
            .map(|d| &d.pool)
            .collect();
        let mut stock: BTreeMap<(&str, &str), (Stock, Option<crate::provider::Price>)> =
            BTreeMap::new();
        for p in &live {
            if let std::collections::btree_map::Entry::Vacant(slot) =
                stock.entry((p.plan.as_str(), p.site.as_str()))
            {
                slot.insert(self.client.offer(&p.plan, &p.site).await?);
            }
        }
        let mut inventory = Inventory {
            units: vec![],
            pools: self.pool_reports(machines),
        };
        for report in inventory.pools.iter_mut() {
            let Some(p) = live.iter().find(|p| p.name == report.name) else {
                continue;
            };
            let (level, price) = stock[&(p.plan.as_str(), p.site.as_str())].clone();
            report.price = price;
            let in_stock = matches!(level, Stock::Some(_));
            report.stock = Some(PoolStock {
                offered: level != Stock::Unavailable,
                in_stock,
                count: match level {
                    Stock::Some(n) => n,
                    Stock::Empty => Some(0),
                    Stock::Unavailable => None,
                },
            });
            for index in 0..p.count {
                let id = self.place_unit(&p.name, index);
                inventory.units.push(Unit {
                    id,
                    taken: taken.contains(&id),
                    provisionable: in_stock,
                    scope: Some(scope(p)),
                    pool: Some(p.name.clone()),
                    hint: None,
                });
            }
        }
        Ok(inventory)
    }

    /// Each pool's places against the servers listed, stock not read: the
    /// pools declared now, and removed ones while machines of theirs stand.
    fn pool_reports(&self, machines: &[Machine]) -> Vec<PoolReport> {
        let places = self.snapshot();
        let mut reports: Vec<PoolReport> = places
            .pools
            .iter()
            .map(|d| PoolReport {
                price: None,
                name: d.pool.name.clone(),
                plan: d.pool.plan.clone(),
                site: d.pool.site.clone(),
                scope: scope(&d.pool),
                count: d.pool.count,
                taken: 0,
                failed: 0,
                stock: None,
                machines: 0,
                removed: d.removed,
                dormant: 0,
            })
            .collect();
        // Places, not servers: a current place counts once whatever stands
        // on it; every machine counts in `machines`.
        let mut seen = HashSet::new();
        for m in machines {
            let Some(unit) = m.unit else { continue };
            if let Some((pool, index)) = places.units.get(&unit) {
                let report = &mut reports[*pool];
                report.machines += 1;
                report.dormant += u32::from(m.condition == crate::provider::Condition::Dormant);
                if *index < report.count && seen.insert(unit) {
                    report.taken += 1;
                    report.failed += u32::from(m.failed());
                }
            }
        }
        reports.retain(|r| !r.removed || r.machines > 0);
        reports
    }

    fn facts(&self, id: String) -> ProviderResult<'_, MachineFacts> {
        Box::pin(async move {
            let server = self.client.get_server(&id).await?;
            let project = server.attributes.project.as_ref();
            // A body about another server (a cache keyed wrongly), or one
            // that names no project, says nothing of this one.
            let unproven = if server.id != id {
                Some(format!(
                    "the provider's answer for {} is about server {}",
                    crate::text::bounded_word(&id),
                    crate::text::bounded_word(&server.id)
                ))
            } else if project.is_none_or(|p| p.id.is_none() && p.slug.is_none()) {
                Some("the provider's answer names no project".to_string())
            } else {
                None
            };
            let ours = project.is_none_or(|p| {
                [p.id.as_deref(), p.slug.as_deref()]
                    .into_iter()
                    .flatten()
                    .any(|p| p == self.client.project())
            });
            let machine = self.as_machine(&server);
            Ok(MachineFacts {
                condition: machine.condition,
                status: machine.status,
                unit: machine.unit,
                hostname: machine.hostname,
                witness: machine.witness,
                unproven,
                foreign: (!ours).then(|| {
                    format!(
                        "the server belongs to project {}, not to shepherd's",
                        project
                            .and_then(|p| p.id.clone().or(p.slug.clone()))
                            .unwrap_or_default()
                    )
                }),
            })
        })
    }
}
