//! The seam between the jobs and a bare-metal provider. Above it, jobs,
//! events and views speak of machines (by the provider's id, as text) and
//! units of capacity (what holds at most one machine and what the sinbin
//! penalises); below it, each provider speaks its own API: Metal's
//! hardware reservations and devices (`metal::provider`), and next
//! Latitude.sh's pools and servers (docs/providers.md).
//!
//! What a provider must get right is what the jobs rely on: a create
//! carries a witness of its request, so that a create whose outcome was not
//! seen is settled by looking (`find_created`), never by sending it again
//! blindly; and every failure says what the caller should do
//! (`ErrorClass`).

use futures::future::BoxFuture;
use uuid::Uuid;

use crate::config::Rate;
use crate::limiter::Limiter;

mod class;
pub mod discipline;
pub mod pool;

pub use class::ErrorClass;
pub use discipline::Fence;
pub use pool::Pool;

/// A machine as a listing shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    /// The provider's id.
    pub id: String,
    pub hostname: Option<String>,
    /// The unit it stands on, where the provider says.
    pub unit: Option<Uuid>,
    /// The request its witness names, if it carries one of shepherd's.
    pub witness: Option<String>,
    /// What the provider's word for its state means for its lifecycle.
    pub condition: Condition,
    /// When the provider made it, where it says.
    pub created_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The provider's own word for its state (Metal `active`, Latitude
    /// `on`, `deploying`, `failed_deployment`, ...), shown beside it.
    pub status: Option<String>,
    /// How the provider bills it, where it says (Latitude's
    /// `plan.billing`); `None`: unknown, or a Metal reservation, paid for.
    pub billing: Option<Billing>,
}

/// How a server is billed. Latitude.sh: `hourly`, `monthly`, `yearly`;
/// billing only moves up (hourly → monthly → yearly).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Billing {
    Hourly,
    Monthly,
    Yearly,
}

impl Billing {
    /// The provider's word, any case; `None` for one never seen.
    pub fn from_word(word: &str) -> Option<Billing> {
        match word.to_ascii_lowercase().as_str() {
            "hourly" => Some(Billing::Hourly),
            "monthly" => Some(Billing::Monthly),
            "yearly" | "annual" | "annually" => Some(Billing::Yearly),
            _ => None,
        }
    }

    /// When a term paid in advance that began at `start` ends, if the
    /// billing is by term; hourly is not.
    pub fn term_end(
        self,
        start: chrono::DateTime<chrono::Utc>,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        self.term_end_after(start, 1)
    }

    /// The end of the `terms`-th term from `start`, counted from `start`.
    pub fn term_end_after(
        self,
        start: chrono::DateTime<chrono::Utc>,
        terms: u32,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        let months: u32 = match self {
            Billing::Hourly => return None,
            Billing::Monthly => 1,
            Billing::Yearly => 12,
        };
        start.checked_add_months(chrono::Months::new(months.checked_mul(terms)?))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Billing::Hourly => "hourly",
            Billing::Monthly => "monthly",
            Billing::Yearly => "yearly",
        }
    }
}

/// What a provider's word for a machine's state means for shepherd, over
/// the provider's whole vocabulary (docs/pools.md has the table). Only
/// positive evidence moves a machine towards deletion: `Failed` is a
/// failure the provider names; `Deploying` may become "never ready" past
/// the deadline, and only for a machine that was never ready since our own
/// creation; `Dormant` is a machine that may be perfectly healthy (powered
/// off, in rescue, erasing for a reinstall, a status the provider cannot
/// tell, a word never seen before): reported, never deleted for it.
///
/// Ordered as surplus gives machines up: a failed one first, a dormant one
/// (someone may be at work on it) last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// The provider says its deployment failed (Latitude `failed_*`,
    /// Metal `failed`).
    Failed,
    /// A deployment or reinstall under way (Latitude `deploying`,
    /// `queued`, `starting_deploy`, ...; Metal `queued`, `provisioning`,
    /// `reinstalling`).
    Deploying,
    /// Deployed and running (Latitude `on`, Metal `active`).
    Ready,
    /// Anything else, or no word at all.
    Dormant,
}

impl Machine {
    pub fn failed(&self) -> bool {
        self.condition == Condition::Failed
    }

    pub fn ready(&self) -> bool {
        self.condition == Condition::Ready
    }
}

/// A unit of capacity as a listing shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    pub id: Uuid,
    /// A machine stands on it.
    pub taken: bool,
    /// The provider would accept a create on it now.
    pub provisionable: bool,
    /// The stock it draws on, where units share one (Latitude: a plan at a
    /// site). A creation refused for want of stock penalises the scope, so
    /// a pass takes none of the units that draw on it until the penalty
    /// ends.
    pub scope: Option<String>,
    /// The pool it is a place of, where the provider has pools: a pass
    /// takes no more of a pool's units than the pool lacks.
    pub pool: Option<String>,
    /// What a create on it needs to know, as the listing showed it (Metal:
    /// the plan and where the hardware is), carried to the creation's
    /// first attempt so that it need not read the unit again.
    pub hint: Option<serde_json::Value>,
}

/// The units of capacity shepherd may provision, and how each pool of them
/// stands (empty for a provider without pools).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inventory {
    pub units: Vec<Unit>,
    pub pools: Vec<PoolReport>,
}

/// How one pool an operator declared stands at the provider, as a pass saw
/// it: recorded with the pass (`pools_surveyed`), shown on the status page
/// and in `/metrics`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PoolReport {
    pub name: String,
    pub plan: String,
    pub site: String,
    /// The stock its places draw on (`Unit::scope`), as a penalty names it.
    pub scope: String,
    /// Places declared.
    pub count: u32,
    /// Places a machine of ours stands on.
    pub taken: u32,
    /// Of those, machines whose deployment failed.
    pub failed: u32,
    /// Machines of the pool on any of its places: more than `taken` when
    /// some stand beyond its count or two stand on one place (surplus).
    #[serde(default)]
    pub machines: u32,
    /// The pool was removed and drains.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
    /// Machines of the pool neither running, deploying nor failed (off,
    /// in rescue, a status the provider cannot tell, a word never seen):
    /// kept, never replaced for it, and reported.
    #[serde(default)]
    pub dormant: u32,
    /// The stock, when the pass read it (a pass at the limit does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stock: Option<PoolStock>,
    /// One server's price, read with the stock (absent before 2026-12-06,
    /// when the stock was not read, or when the provider gave none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
}

/// What the provider says one server of a plan at a site costs, in one
/// currency (an account is billed in one; figures are never mixed).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Price {
    /// ISO 4217, e.g. `USD`.
    pub currency: String,
    /// Per hour, as hourly billing charges it.
    pub hour: f64,
    /// Per month and per year, where the provider gives them (monthly and
    /// yearly billing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub month: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub year: Option<f64>,
}

/// Hours in a month as a monthly figure is estimated from an hourly price
/// (365 × 24 / 12).
pub const HOURS_PER_MONTH: f64 = 730.0;

/// The provider's stock of a pool's plan at its site.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PoolStock {
    /// The site offers the plan at all.
    pub offered: bool,
    pub in_stock: bool,
    /// Machines in stock, when the provider says how many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
}

/// A machine a create made, or found after an unseen outcome.
#[derive(Debug, Clone)]
pub struct Created {
    pub machine: Machine,
    /// Found by its witness rather than returned by the create.
    pub recovered: bool,
}

/// What assimilation needs to know of one machine.
#[derive(Debug, Clone)]
pub struct MachineFacts {
    pub unit: Option<Uuid>,
    pub hostname: Option<String>,
    /// The request its witness names, if it carries one of shepherd's.
    pub witness: Option<String>,
    /// Why the machine is not shepherd's to manage (another project), if so.
    pub foreign: Option<String>,
    /// Why the answer proves nothing of this machine either way, if so: it
    /// names another server, or no project. Nothing is decided on it.
    pub unproven: Option<String>,
    /// What its state means (`Condition`), read now.
    pub condition: Condition,
    /// The provider's own word for its state.
    pub status: Option<String>,
}

impl MachineFacts {
    /// Its deployment failed.
    pub fn failed(&self) -> bool {
        self.condition == Condition::Failed
    }
}

/// What a delete found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deleted {
    /// The provider answered "not found" (on the first attempt, or after
    /// one whose answer was not seen) rather than accepting the delete: one
    /// absence, which proves nothing until it is confirmed
    /// (`jobs::gone`).
    pub not_found: bool,
}

/// What failed, beyond its class.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    Other,
    /// The provider does not know the machine or the unit.
    NotFound,
    /// The provider has none of the unit's kind in stock; `scope` is the
    /// stock the unit draws on (`Unit::scope`).
    OutOfStock {
        scope: Option<String>,
    },
    /// Another party's machine stands on the unit.
    RaceLost {
        other: Option<String>,
    },
    /// The create named an SSH key the provider no longer has.
    SshKeyRefused,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ProviderError {
    pub class: ErrorClass,
    pub failure: Failure,
    pub message: String,
}

impl ProviderError {
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        ProviderError {
            class,
            failure: Failure::Other,
            message: message.into(),
        }
    }

    pub fn not_found(&self) -> bool {
        self.failure == Failure::NotFound
    }
}

/// What one pass read: its machines, and its units when asked for.
pub struct Survey {
    pub machines: Result<Vec<Machine>, ProviderError>,
    pub units: Option<Result<Inventory, ProviderError>>,
    /// What the machines' listing asked for and cost, where the provider
    /// says.
    pub listing: Option<ListingCost>,
}

/// What a pass's listing of machines asked for and what it cost: shown
/// beside the pools (`status`, the page), so an operator sees that a
/// pass's reads follow the cluster's machines, not the whole project.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ListingCost {
    /// What was listed, in words ("servers whose hostname starts with
    /// shepherd-", "every server of the project").
    pub scope: String,
    /// Reads the listing took (pages, re-readings included).
    pub reads: u32,
    /// Machines the pages held.
    pub machines: u64,
}

pub type ProviderResult<'a, T> = BoxFuture<'a, Result<T, ProviderError>>;

/// One provider, as the jobs use it.
pub trait Provider: Send + Sync + 'static {
    /// Its name in `managed_machines.provider` and on every assimilation.
    fn name(&self) -> &'static str;

    /// Every machine of the project.
    fn machines(&self) -> ProviderResult<'_, Vec<Machine>>;

    /// Every unit of capacity shepherd may provision.
    fn units(&self) -> ProviderResult<'_, Inventory>;

    /// How each pool stands by these machines alone, its stock not read
    /// (a provider without pools: none). A pass records it even when it
    /// lists no units, so a full pool's failed machines still show.
    fn pools(&self, _machines: &[Machine]) -> Vec<PoolReport> {
        vec![]
    }

    /// The machines and, when `with_units`, the units, as one pass reads
    /// them. By default both listings run side by side so their round trips
    /// overlap; a provider whose units are derived from its machines lists
    /// them once.
    fn survey(&self, with_units: bool) -> BoxFuture<'_, Survey> {
        Box::pin(async move {
            let (machines, units) = futures::future::join(self.machines(), async {
                if with_units {
                    Some(self.units().await)
                } else {
                    None
                }
            })
            .await;
            Survey {
                machines,
                units,
                listing: None,
            }
        })
    }

    /// The pass found a machine the provider has that its listing left
    /// out: a listing that narrows by a filter stops trusting it.
    fn listing_omitted(&self, _id: &str) {}

    /// Whether the provider knows the unit (a manual creation's check).
    fn unit_exists(&self, unit: Uuid) -> ProviderResult<'_, bool>;

    /// One unit as a listing would show it (a manual creation's check), or
    /// `None` if the provider does not know it. By default from the whole
    /// listing.
    fn unit(&self, unit: Uuid) -> ProviderResult<'_, Option<Unit>> {
        Box::pin(async move {
            let inventory = self.units().await?;
            Ok(inventory.units.into_iter().find(|u| u.id == unit))
        })
    }

    /// The unit an operator names by its label (Latitude: `web/3`).
    fn unit_by_label(&self, _label: &str) -> Option<Uuid> {
        None
    }

    /// A name an operator reads for the unit (Latitude: `web/3`), where its
    /// id is not one (Metal's reservation ids are the API's own).
    fn unit_label(&self, _unit: Uuid) -> Option<String> {
        None
    }

    /// The hostname a creation for `unit` gets.
    fn hostname(&self, unit: Uuid, request: Uuid) -> String;

    /// The witness a creation carries, as the `device_created` event
    /// records it.
    fn witness(&self, request: Uuid) -> String;

    /// Creates a machine on `unit` carrying the witness of `request`. Waits
    /// for `creations`' turn, then asks `fence` right before the create is
    /// sent (nothing is sent if it refuses). An answer that was not seen is
    /// `Ambiguous`: the create is never sent again by this call, and the
    /// caller settles it by looking (`find_created`). `first`: the unit's
    /// hint (`Unit::hint`) when nothing can have been sent for `request`
    /// before, so that the create may go out without reading the unit.
    #[allow(clippy::too_many_arguments)]
    fn create<'a>(
        &'a self,
        unit: Uuid,
        request: Uuid,
        ssh_key: &'a str,
        creations: &'a Limiter,
        fence: &'a dyn Fence,
        first: Option<&'a serde_json::Value>,
    ) -> ProviderResult<'a, Created>;

    /// Whether the provider itself refuses a second machine on a unit
    /// (Metal: one device per hardware reservation). Where it does not
    /// (Latitude accepts two creates with one hostname), a creation whose
    /// outcome is unknown holds its unit until a look after the cluster's
    /// settle window finds nothing: listings there can lag behind creates.
    fn one_machine_per_unit(&self) -> bool {
        false
    }

    /// The stock `unit` draws on, where units share one (`Unit::scope`).
    fn unit_scope(&self, _unit: Uuid) -> Option<String> {
        None
    }

    /// The pool and place of `unit`, where the provider has pools (any
    /// place a machine may stand on, past places of a shrunk or removed
    /// pool included).
    fn unit_place(&self, _unit: Uuid) -> Option<(String, u32)> {
        None
    }

    /// Every place of `pool` a machine may stand on (past places of a
    /// shrunk pool included), where the provider has pools.
    fn pool_units(&self, _pool: &str) -> Vec<Uuid> {
        vec![]
    }

    /// Deletes a machine. `fence` is asked right before each request
    /// leaves. Deleting is safe to repeat; an outcome not seen after the
    /// retries is `Ambiguous`, settled by looking the machine up.
    fn delete<'a>(&'a self, id: &'a str, fence: &'a dyn Fence) -> ProviderResult<'a, Deleted>;

    /// The machine a creation of `request` made on `unit`, if there is one
    /// (`RaceLost` when another party's stands there).
    fn find_created(&self, unit: Uuid, request: Uuid) -> ProviderResult<'_, Option<Created>>;

    /// What assimilation needs to know of a machine.
    fn machine(&self, id: &str) -> ProviderResult<'_, MachineFacts>;

    /// The id of the project's key with this public key, made if missing.
    fn ensure_ssh_key<'a>(
        &'a self,
        label: &'a str,
        public_key: &'a str,
    ) -> ProviderResult<'a, String>;

    /// Adopts the cluster's API budget.
    fn set_api_rate(&self, rate: Rate);

    /// Adopts the cluster's pools (a provider without pools has none).
    fn set_pools(&self, _pools: &[pool::Declared]) {}
}
