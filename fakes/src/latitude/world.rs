//! The fake's state (servers, stock, keys, tags) and the JSON it answers
//! with, written from its own representation, never from a client's types.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use rand::Rng;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::{Value, json};

use super::{FakeConfig, PlanStock, ServerSnapshot};

pub(super) struct Server {
    pub id: String,
    /// The project (id) it belongs to: the fake's own, or another team's.
    pub project: String,
    pub hostname: String,
    pub plan: String,
    pub site: String,
    pub os: String,
    pub label: String,
    pub ipv4: String,
    pub tags: Vec<String>,
    pub created: Instant,
    pub created_at: DateTime<Utc>,
    pub failed: bool,
    /// A status set from outside (`set_status`): the owner powered it
    /// off, put it in rescue, the provider cannot tell; it wins over the
    /// deployment's course.
    pub status: Option<String>,
    pub by_other: bool,
    /// Out of every read until then (a create answered by a gateway's
    /// timeout whose server the origin made).
    pub hidden_until: Option<Instant>,
    /// Listings show it from then on (they lag behind creates).
    pub listed_from: Instant,
    /// `hourly`, `monthly` or `yearly` (`plan.billing`); only moves up.
    pub billing: String,
}

/// A deleted server the listings still show, as it last was, until
/// `listed_until` (they lag behind deletes too).
pub(super) struct Gone {
    pub server: Server,
    pub listed_until: Instant,
}

/// The real service's bad days that are not one request's fault: listings
/// that lag, and plan answers without counts. Settable while it runs
/// (`PUT /_fake/weather`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Weather {
    /// How long a new server stays out of listings, and a deleted one in
    /// them.
    pub listing_lag_ms: u64,
    /// Whether plan answers count the stock per site (`in_stock_count`), as
    /// newer answers do; older ones only name the sites.
    pub plan_counts: bool,
    /// How the server listing takes the hostname operators
    /// (`filter[hostname][prefix]` and the like): the API's filter
    /// semantics are not documented, so a client must survive both an API
    /// that ignores them and one that reads them as an exact match.
    pub hostname_operators: HostnameOperators,
    /// Whether plan answers carry their prices (`pricing`); without them a
    /// client knows no price.
    pub plan_prices: bool,
}

/// See [`Weather::hostname_operators`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostnameOperators {
    /// As the SDK describes them.
    #[default]
    Honoured,
    /// Left out of the filtering: every server is listed.
    Ignored,
    /// Each operator's value matched as the whole hostname.
    Exact,
}

impl Default for Weather {
    fn default() -> Self {
        Weather {
            listing_lag_ms: 0,
            plan_counts: true,
            hostname_operators: HostnameOperators::Honoured,
            plan_prices: true,
        }
    }
}

pub(super) struct SshKey {
    pub id: String,
    pub name: String,
    pub public_key: String,
    pub created_at: DateTime<Utc>,
}

pub(super) struct Tag {
    pub id: String,
    pub name: String,
    pub description: Option<String>,
    pub color: String,
}

pub(super) struct World {
    pub project: String,
    pub project_slug: String,
    pub plans: Vec<PlanStock>,
    /// In creation order: listings page through it in that order.
    pub servers: Vec<Server>,
    /// Deleted servers listings still show.
    pub gone: Vec<Gone>,
    pub keys: Vec<SshKey>,
    pub tags: Vec<Tag>,
    pub weather: Weather,
    /// Creates that carried a hostname a live server already had: Latitude
    /// accepts them, and each is a second server for one name.
    pub duplicate_hostnames: u64,
    /// The team's (and the key's) id, as answers embed it.
    pub team: String,
    deploy_delay: Duration,
    rng: StdRng,
}

const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A failed create, as the API would name it.
pub(super) struct Refusal {
    pub status: u16,
    pub code: &'static str,
    pub title: &'static str,
    pub detail: String,
    pub pointer: Option<&'static str>,
}

impl Refusal {
    fn validation(detail: impl Into<String>, pointer: &'static str) -> Self {
        Refusal {
            status: 422,
            code: "VALIDATION_ERROR",
            title: "Validation Error",
            detail: detail.into(),
            pointer: Some(pointer),
        }
    }
}

/// What `create-server` asks for.
pub(super) struct NewServer {
    pub project: String,
    pub plan: String,
    pub site: String,
    pub os: String,
    pub hostname: String,
    pub ssh_keys: Vec<String>,
}

impl World {
    pub fn new(config: &FakeConfig) -> World {
        World {
            project: config.project.clone(),
            project_slug: config.project_slug.clone(),
            plans: config.plans.clone(),
            servers: vec![],
            gone: vec![],
            keys: vec![],
            tags: vec![],
            weather: config.weather.clone(),
            duplicate_hostnames: 0,
            team: "team_fake000000001".into(),
            deploy_delay: config.deploy_delay,
            rng: StdRng::seed_from_u64(config.seed),
        }
    }

    /// `prefix` and 13 characters, like `sv_ZWr75Zbjr5A91`.
    fn new_id(&mut self, prefix: &str) -> String {
        let tail: String = (0..13)
            .map(|_| ALPHABET[self.rng.random_range(0..ALPHABET.len())] as char)
            .collect();
        format!("{prefix}{tail}")
    }

    pub fn is_project(&self, name: &str) -> bool {
        name == self.project || name == self.project_slug
    }

    pub fn stock(&self, plan: &str, site: &str) -> Option<u32> {
        self.plans
            .iter()
            .find(|p| p.slug == plan)?
            .sites
            .get(site)
            .copied()
    }

    pub fn set_stock(&mut self, plan: &str, site: &str, count: u32) -> bool {
        match self.plans.iter_mut().find(|p| p.slug == plan) {
            Some(p) => {
                p.sites.insert(site.to_string(), count);
                true
            }
            None => false,
        }
    }

    fn stock_mut(&mut self, plan: &str, site: &str) -> Option<&mut u32> {
        self.plans
            .iter_mut()
            .find(|p| p.slug == plan)?
            .sites
            .get_mut(site)
    }

    pub fn status<'s>(&self, s: &'s Server, now: Instant) -> &'s str {
        if let Some(set) = &s.status {
            set
        } else if s.failed {
            "failed_deployment"
        } else if now.duration_since(s.created) < self.deploy_delay {
            "deploying"
        } else {
            "on"
        }
    }

    /// Creates a server, taking a unit of stock, or says why not in the
    /// API's terms. Checks in the order the API is seen to: the body, the
    /// project, the plan and site, the keys, then stock.
    pub fn create(&mut self, new: NewServer, now: Instant) -> Result<usize, Refusal> {
        if !self.is_project(&new.project) {
            return Err(Refusal::validation(
                format!("Project {} not found", new.project),
                "/data/attributes/project",
            ));
        }
        if self.stock(&new.plan, &new.site).is_none() {
            return Err(Refusal::validation(
                format!("Plan {} is not available in site {}", new.plan, new.site),
                "/data/attributes/plan",
            ));
        }
        let missing: Vec<&String> = new
            .ssh_keys
            .iter()
            .filter(|k| !self.keys.iter().any(|key| &key.id == *k))
            .collect();
        if !missing.is_empty() {
            return Err(Refusal::validation(
                format!(
                    "The following SSH Keys were not found in project '{}': {missing:?}",
                    self.project
                ),
                "/data/attributes/ssh_keys",
            ));
        }
        let stock = self.stock_mut(&new.plan, &new.site).expect("checked above");
        if *stock == 0 {
            return Err(Refusal {
                status: 422,
                code: "SERVERS_OUT_OF_STOCK",
                title: "Out of stock",
                detail: "No stock availability for the selected plan and site".into(),
                pointer: None,
            });
        }
        *stock -= 1;
        if self.servers.iter().any(|s| s.hostname == new.hostname) {
            self.duplicate_hostnames += 1;
        }
        Ok(self.add(new, now, false))
    }

    fn add(&mut self, new: NewServer, now: Instant, by_other: bool) -> usize {
        let id = self.new_id("sv_");
        let lag = Duration::from_millis(self.weather.listing_lag_ms);
        let n = self.servers.len();
        let label = format!("{:02}BS{n:06}", n % 100);
        let ipv4 = format!(
            "10.{}.{}.{}",
            (n >> 16) & 255,
            (n >> 8) & 255,
            (n & 255).max(1)
        );
        let project = if self.is_project(&new.project) {
            self.project.clone()
        } else {
            new.project
        };
        self.servers.push(Server {
            id,
            project,
            hostname: new.hostname,
            plan: new.plan,
            site: new.site,
            os: new.os,
            label,
            ipv4,
            tags: vec![],
            created: now,
            created_at: Utc::now(),
            failed: false,
            status: None,
            by_other,
            hidden_until: None,
            listed_from: now + lag,
            billing: "hourly".into(),
        });
        self.servers.len() - 1
    }

    /// A server of another project of the team (the fake's key sees the
    /// whole team), taking no stock of the fake's plans.
    pub fn add_foreign(&mut self, project: &str, plan: &str, site: &str, hostname: &str) -> String {
        let i = self.add(
            NewServer {
                project: project.into(),
                plan: plan.into(),
                site: site.into(),
                os: "ubuntu_24_04_x64_lts".into(),
                hostname: hostname.into(),
                ssh_keys: vec![],
            },
            Instant::now(),
            true,
        );
        self.servers[i].listed_from = Instant::now();
        self.servers[i].id.clone()
    }

    /// Whether reads show the server now (a hidden one shows nowhere).
    pub fn readable(&self, s: &Server, now: Instant) -> bool {
        s.hidden_until.is_none_or(|until| now >= until)
    }

    /// Whether listings show the server now.
    pub fn listed(&self, s: &Server, now: Instant) -> bool {
        self.readable(s, now) && now >= s.listed_from
    }

    /// What a listing shows, in creation order: live servers it has caught
    /// up with, and deleted ones it has not.
    pub fn listing(&self, now: Instant) -> Vec<&Server> {
        let mut out: Vec<&Server> = self
            .servers
            .iter()
            .filter(|s| self.listed(s, now))
            .chain(
                self.gone
                    .iter()
                    .filter(|g| now < g.listed_until)
                    .map(|g| &g.server),
            )
            .collect();
        out.sort_by_key(|s| s.created);
        out
    }

    /// Another party creates a server of `plan` in `site`, if stock allows.
    pub fn other_party_creates(&mut self, plan: &str, site: &str, now: Instant) {
        let Some(stock) = self.stock_mut(plan, site) else {
            return;
        };
        if *stock == 0 {
            return;
        }
        *stock -= 1;
        let n = self.servers.len();
        self.add(
            NewServer {
                project: self.project.clone(),
                plan: plan.into(),
                site: site.into(),
                os: "ubuntu_24_04_x64_lts".into(),
                hostname: format!("someone-else-{n}"),
                ssh_keys: vec![],
            },
            now,
            true,
        );
    }

    pub fn find(&self, id: &str) -> Option<usize> {
        self.servers.iter().position(|s| s.id == id)
    }

    /// Deletes a server; its unit goes back to the site's stock, and the
    /// listings show it for as long as they lag.
    pub fn delete(&mut self, index: usize) {
        let s = self.servers.remove(index);
        if let Some(stock) = self.stock_mut(&s.plan, &s.site) {
            *stock += 1;
        }
        let lag = Duration::from_millis(self.weather.listing_lag_ms);
        let now = Instant::now();
        self.gone.retain(|g| now < g.listed_until);
        if !lag.is_zero() {
            self.gone.push(Gone {
                server: s,
                listed_until: now + lag,
            });
        }
    }

    pub fn add_key(&mut self, name: String, public_key: String) -> usize {
        let id = self.new_id("ssh_");
        self.keys.push(SshKey {
            id,
            name,
            public_key,
            created_at: Utc::now(),
        });
        self.keys.len() - 1
    }

    pub fn add_tag(&mut self, name: String, description: Option<String>, color: String) -> usize {
        let id = self.new_id("tag_");
        self.tags.push(Tag {
            id,
            name,
            description,
            color,
        });
        self.tags.len() - 1
    }

    pub fn snapshot(&self, now: Instant) -> Vec<ServerSnapshot> {
        self.servers
            .iter()
            .map(|s| ServerSnapshot {
                id: s.id.clone(),
                project: s.project.clone(),
                hostname: s.hostname.clone(),
                plan: s.plan.clone(),
                site: s.site.clone(),
                status: self.status(s, now).into(),
                tags: s.tags.clone(),
                created_by_other: s.by_other,
                failed: s.failed,
            })
            .collect()
    }

    // ----- JSON -----

    fn project_json(&self, id: &str) -> Value {
        let slug = if id == self.project {
            self.project_slug.clone()
        } else {
            id.trim_start_matches("proj_").to_lowercase()
        };
        json!({
            "id": id,
            "name": slug,
            "slug": slug,
            "provisioning_type": "on_demand",
            "billing_type": "Normal",
            "billing_method": "Normal",
            "environment": "Production",
        })
    }

    fn team_json(&self) -> Value {
        json!({
            "id": self.team,
            "name": "Fake Team",
            "slug": "fake-team",
            "description": null,
            "address": null,
            "status": "verified",
            "currency": {"id": "cur_usd", "code": "USD", "name": "United States Dollar"},
        })
    }

    fn user_json(&self) -> Value {
        json!({
            "id": "user_fake000000001",
            "first_name": "Fake",
            "last_name": "Operator",
            "email": "operator@example.invalid",
            "role": {"id": "role_owner", "name": "owner"},
        })
    }

    fn tag_json(&self, id: &str) -> Option<Value> {
        let t = self.tags.iter().find(|t| t.id == id)?;
        Some(json!({
            "id": t.id, "name": t.name, "description": t.description, "color": t.color,
        }))
    }

    /// `server_data`. `full` is a GET's answer; a create answers with the
    /// subset the real API was recorded sending.
    pub fn server_json(&self, s: &Server, now: Instant, full: bool) -> Value {
        let plan = json!({
            "id": format!("plan_{}", s.plan.replace('-', "")),
            "name": s.plan.replace('-', "."),
            "slug": s.plan,
            "billing": s.billing,
        });
        let specs = json!({
            "cpu": "Intel Xeon E-2186G CPU @ 3.80GHz (6 cores)",
            "disk": "500 GB SSD",
            "ram": "32 GB",
            "nic": "2 X 10 Gbit/s",
        });
        let mut attributes = json!({
            "hostname": s.hostname,
            "label": s.label,
            "role": "Bare Metal",
            "status": self.status(s, now),
            "primary_ipv4": s.ipv4,
            "specs": specs,
            "plan": plan,
        });
        if full {
            let tags: Vec<Value> = s.tags.iter().filter_map(|t| self.tag_json(t)).collect();
            let country = self
                .plans
                .iter()
                .find(|p| p.slug == s.plan)
                .map_or("Unknown", |p| p.country.as_str());
            let extra = json!({
                "site": s.site,
                "created_at": s.created_at.to_rfc3339_opts(SecondsFormat::Secs, false),
                "scheduled_deletion_at": null,
                "locked": false,
                "rescue_allowed": true,
                "ipmi_status": "Normal",
                "primary_ipv6": null,
                "price": null,
                "tags": tags,
                "operating_system": {
                    "name": "Ubuntu", "slug": s.os, "version": "24.04",
                    "features": {"raid": true, "ssh_keys": true, "user_data": true},
                    "distro": {"name": "ubuntu", "slug": "ubuntu", "series": "noble"},
                },
                "region": {
                    "city": s.site, "country": country,
                    "site": {"id": format!("loc_{}", s.site), "name": s.site, "slug": s.site,
                             "facility": s.site, "rack_id": format!("{}-R01", s.site)},
                },
                "project": self.project_json(&s.project),
                "team": self.team_json(),
                "interfaces": [{"role": "external", "name": "eno1", "mac_address": null, "description": "public"}],
            });
            if let (Some(a), Some(e)) = (attributes.as_object_mut(), extra.as_object()) {
                a.extend(e.clone());
            }
        }
        json!({ "id": s.id, "type": "servers", "attributes": attributes })
    }

    pub fn plan_json(&self, p: &PlanStock) -> Value {
        let in_stock: Vec<&String> = p
            .sites
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(s, _)| s)
            .collect();
        let counts: BTreeMap<&String, u32> = p
            .sites
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(s, n)| (s, *n))
            .collect();
        let total: u32 = p.sites.values().sum();
        let level = match total {
            0 => "unavailable",
            1..=4 => "low",
            5..=19 => "medium",
            _ => "high",
        };
        json!({
            "id": format!("plan_{}", p.slug.replace('-', "")),
            "type": "plans",
            "attributes": {
                "slug": p.slug,
                "name": p.slug.replace('-', "."),
                "features": ["ssh", "raid", "user_data"],
                "specs": {
                    "cpu": {"type": "Intel Xeon E-2186G", "clock": 3.8, "cores": 6, "count": 1},
                    "memory": {"total": 32},
                    "drives": [{"count": 2, "size": "500 GB", "type": "SSD"}],
                    "nics": [{"count": 2, "type": "10 Gbps"}],
                },
                "regions": [{
                    "name": p.country,
                    "deploys_instantly": ["ubuntu_24_04_x64_lts"],
                    "locations": if self.weather.plan_counts {
                        json!({
                            "available": p.sites.keys().collect::<Vec<_>>(),
                            "in_stock": in_stock,
                            "in_stock_count": counts,
                        })
                    } else {
                        json!({
                            "available": p.sites.keys().collect::<Vec<_>>(),
                            "in_stock": in_stock,
                        })
                    },
                    "stock_level": level,
                    "pricing": if self.weather.plan_prices { list_price(&p.slug) } else { Value::Null },
                }],
            }
        })
    }

    pub fn key_json(&self, k: &SshKey) -> Value {
        let at = k.created_at.to_rfc3339_opts(SecondsFormat::Secs, false);
        json!({
            "id": k.id,
            "type": "ssh_keys",
            "attributes": {
                "name": k.name,
                "public_key": k.public_key,
                "fingerprint": fingerprint(&k.public_key),
                "tags": [],
                "project": self.project_json(&self.project),
                "user": self.user_json(),
                "created_at": at,
                "updated_at": at,
            }
        })
    }

    pub fn tag_data_json(&self, t: &Tag) -> Value {
        json!({
            "id": t.id,
            "type": "tags",
            "attributes": {
                "name": t.name,
                "slug": t.name.to_lowercase().replace(' ', "-"),
                "description": t.description,
                "color": t.color,
                "team": self.team_json(),
            }
        })
    }
}

/// The fingerprint the API computes: the MD5 of the key's decoded body, as
/// colon-separated hex (OpenSSH's old form). A key whose body does not
/// decode gets the MD5 of its text.
fn fingerprint(key: &str) -> String {
    use base64::Engine;
    use md5::Digest;
    let body = key.split_whitespace().nth(1).unwrap_or(key);
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap_or_else(|_| key.as_bytes().to_vec());
    md5::Md5::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// What the fake charges for a server of `slug`, in USD (hour, month,
/// year): a plan it knows by its own figure, any other by its size class,
/// so that every plan it sells has a price. Made-up figures of the real
/// service's order; the month is 600 hours' worth and the year ten months'.
pub fn list_price(slug: &str) -> Value {
    let hour = match slug {
        "c2-small-x86" => 0.33,
        "c2-medium-x86" => 0.62,
        "c3-large-x86" => 1.28,
        "s3-large-x86" => 1.71,
        s if s.contains("small") => 0.40,
        s if s.contains("large") => 1.50,
        _ => 0.80,
    };
    let month = (hour * 600.0_f64).round();
    json!({"USD": {"hour": hour, "month": month, "year": month * 10.0}})
}
