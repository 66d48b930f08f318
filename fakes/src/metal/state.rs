//! The fake's world: reservations, devices and SSH keys, the rules the real
//! API enforces on them, and their JSON.
//!
//! Everything here is synchronous and runs under one lock, so two requests
//! racing for a reservation are decided here and nowhere else.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, TimeDelta, TimeZone, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use uuid::Uuid;

use super::catalog::{self, Facility, Plan};
use super::input;
use super::reply::ApiError;
use super::{API_PREFIX, DeviceSnapshot, FakeConfig, ReservationSnapshot, SshKeySnapshot};

const MAX_TAG_CHARS: usize = 80;
const NO_KEYS: &str = "must have at least one SSH key or explicitly send no_ssh_keys option";
const NOT_PROVISIONABLE: &str = "Server is not provisionable";

pub(super) struct Reservation {
    id: Uuid,
    short_id: String,
    created_at: DateTime<Utc>,
    project_id: Uuid,
    plan: &'static Plan,
    facility: &'static Facility,
    spare: bool,
    need_of_service: bool,
    switch_uuid: String,
    device: Option<Uuid>,
    /// Set when a device leaves: the disks are being wiped.
    wiping: Option<Wipe>,
    /// The listing's cache still says provisionable, whatever the truth.
    stale: bool,
}

#[derive(Clone, Copy)]
struct Wipe {
    since: Instant,
    lasts: Duration,
}

impl Wipe {
    fn done(self, now: Instant) -> bool {
        now.saturating_duration_since(self.since) >= self.lasts
    }
}

impl Reservation {
    /// The truth, as the single GET and a create see it.
    fn provisionable(&self, now: Instant) -> bool {
        !self.need_of_service
            && !self.stale
            && self.device.is_none()
            && self.wiping.is_none_or(|wipe| wipe.done(now))
    }

    /// What the listing says.
    fn listed_provisionable(&self, now: Instant) -> bool {
        self.stale || self.provisionable(now)
    }

    fn href(&self) -> String {
        reservation_href(self.id)
    }
}

struct Device {
    id: Uuid,
    project_id: Uuid,
    hostname: String,
    description: Option<String>,
    userdata: Option<String>,
    tags: Vec<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    /// When the lifecycle clock started.
    born: Instant,
    plan: &'static Plan,
    facility: &'static Facility,
    operating_system: String,
    reservation: Option<Uuid>,
    ssh_keys: Vec<Uuid>,
    billing_cycle: String,
    locked: bool,
    always_pxe: bool,
    powered_off: bool,
    failed: bool,
    created_by_other: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyOwner {
    Project(Uuid),
    /// The token's user: `/ssh-keys` rather than `/projects/{id}/ssh-keys`.
    User,
}

pub(super) struct SshKey {
    id: Uuid,
    owner: KeyOwner,
    label: String,
    key: String,
    fingerprint: String,
    tags: Vec<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

/// How much of a reservation's neighbours to embed.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Embed {
    pub device: bool,
    pub facility: bool,
}

/// Filters of the reservation listing.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ReservationFilter<'a> {
    pub provisionable_only: bool,
    pub state: Option<&'a str>,
}

/// Filters of the device listing.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct DeviceFilter<'a> {
    pub hostname: Option<&'a str>,
    pub tag: Option<&'a str>,
}

pub(super) struct World {
    project_id: Uuid,
    user_id: Uuid,
    provisioning_delay: Duration,
    active_delay: Duration,
    wipe_delay: Duration,
    /// Seeded, so that a sequence of calls yields the same ids every run.
    rng: StdRng,
    /// In creation order, which is the listing's order.
    reservations: Vec<Reservation>,
    devices: HashMap<Uuid, Device>,
    /// In creation order, which is the listing's order.
    keys: Vec<SshKey>,
}

impl World {
    pub fn new(config: &FakeConfig) -> Self {
        let mut world = World {
            project_id: config.project_id,
            user_id: catalog::named_id("user", "fake"),
            provisioning_delay: config.provisioning_delay,
            active_delay: config.active_delay,
            wipe_delay: config.wipe_delay,
            rng: StdRng::seed_from_u64(config.seed),
            reservations: Vec::with_capacity(config.reservations),
            devices: HashMap::new(),
            keys: Vec::new(),
        };
        // A fixed epoch keeps `created_at` as reproducible as the ids.
        let epoch = Utc
            .with_ymd_and_hms(2025, 1, 6, 9, 0, 0)
            .single()
            .unwrap_or_default();
        for index in 0..config.reservations {
            let nth = index + 1;
            let id = world.new_id();
            let switch: u32 = world.rng.random();
            let minutes = i64::from(u32::try_from(index).unwrap_or(u32::MAX));
            world.reservations.push(Reservation {
                id,
                short_id: short_id(id),
                created_at: epoch
                    .checked_add_signed(TimeDelta::minutes(minutes))
                    .unwrap_or(epoch),
                project_id: config.project_id,
                // Metro alternates fastest and plan next, so every run of
                // four covers all combinations.
                facility: &catalog::FACILITIES[index % catalog::FACILITIES.len()],
                plan: &catalog::PLANS[(index / catalog::FACILITIES.len()) % catalog::PLANS.len()],
                spare: every(config.spare_every, nth),
                need_of_service: every(config.not_provisionable_every, nth),
                switch_uuid: format!("{switch:08x}"),
                device: None,
                wiping: None,
                stale: false,
            });
        }
        world
    }

    fn new_id(&mut self) -> Uuid {
        uuid::Builder::from_random_bytes(self.rng.random()).into_uuid()
    }

    /// The fake knows one project: the configured one.
    pub fn project_known(&self, id: Uuid) -> bool {
        id == self.project_id
    }

    // ----- reservations -----

    pub fn reservation(&self, id: Uuid) -> Option<&Reservation> {
        self.reservations.iter().find(|r| r.id == id)
    }

    fn reservation_mut(&mut self, id: Uuid) -> Option<&mut Reservation> {
        self.reservations.iter_mut().find(|r| r.id == id)
    }

    pub fn project_reservations(
        &self,
        project: Uuid,
        filter: ReservationFilter<'_>,
        now: Instant,
    ) -> Vec<&Reservation> {
        self.reservations
            .iter()
            .filter(|r| r.project_id == project)
            .filter(|r| !filter.provisionable_only || r.listed_provisionable(now))
            .filter(|r| match filter.state {
                Some("spare") => r.spare,
                Some("need_of_service") => r.need_of_service,
                Some("active") => !r.spare && !r.need_of_service,
                _ => true,
            })
            .collect()
    }

    pub fn move_reservation(
        &mut self,
        id: Uuid,
        body: input::MoveReservation,
    ) -> Result<(), ApiError> {
        let target = body
            .project_id
            .as_deref()
            .map(str::parse::<Uuid>)
            .ok_or_else(|| ApiError::unprocessable("project_id is required"))?
            .map_err(|_| ApiError::unprocessable("project_id must be a UUID"))?;
        let reservation = self.reservation_mut(id).ok_or_else(ApiError::not_found)?;
        if reservation.device.is_some() {
            return Err(ApiError::unprocessable(
                "Cannot move a hardware reservation that has a device",
            ));
        }
        reservation.project_id = target;
        Ok(())
    }

    pub fn mark_stale(&mut self, id: Uuid) {
        if let Some(reservation) = self.reservation_mut(id) {
            reservation.stale = true;
        }
    }

    /// Another party provisions the reservation, if it is free of devices.
    pub fn steal(&mut self, reservation: Uuid, now: Instant) {
        let Some(r) = self.reservation(reservation) else {
            return;
        };
        if r.device.is_some() {
            return;
        }
        let hostname = format!("other-{}", r.short_id);
        self.put_foreign_device(reservation, &hostname, vec!["other-party".to_owned()], now);
    }

    /// Puts a device by someone else on a reservation, taking it from any
    /// device already there. `None` when the reservation does not exist.
    pub fn put_foreign_device(
        &mut self,
        reservation: Uuid,
        hostname: &str,
        tags: Vec<String>,
        now: Instant,
    ) -> Option<Uuid> {
        let (project_id, plan, facility, previous) = {
            let r = self.reservation(reservation)?;
            (r.project_id, r.plan, r.facility, r.device)
        };
        if let Some(previous) = previous.and_then(|id| self.devices.get_mut(&id)) {
            previous.reservation = None;
        }
        let id = self.new_id();
        let stamp = Utc::now();
        self.devices.insert(
            id,
            Device {
                id,
                project_id,
                hostname: hostname.to_owned(),
                description: None,
                userdata: None,
                tags,
                created_at: stamp,
                updated_at: stamp,
                born: now,
                plan,
                facility,
                operating_system: catalog::DEFAULT_OS.to_owned(),
                reservation: Some(reservation),
                ssh_keys: Vec::new(),
                billing_cycle: "hourly".to_owned(),
                locked: false,
                always_pxe: false,
                powered_off: false,
                failed: false,
                created_by_other: true,
            },
        );
        if let Some(r) = self.reservation_mut(reservation) {
            r.device = Some(id);
        }
        Some(id)
    }

    // ----- devices -----

    pub fn device_exists(&self, id: Uuid) -> bool {
        self.devices.contains_key(&id)
    }

    /// The project's devices, by hostname and then id.
    pub fn project_devices(&self, project: Uuid, filter: DeviceFilter<'_>) -> Vec<Uuid> {
        let mut devices: Vec<&Device> = self
            .devices
            .values()
            .filter(|d| d.project_id == project)
            .filter(|d| filter.hostname.is_none_or(|h| d.hostname == h))
            .filter(|d| filter.tag.is_none_or(|t| d.tags.iter().any(|x| x == t)))
            .collect();
        devices.sort_by(|a, b| a.hostname.cmp(&b.hostname).then(a.id.cmp(&b.id)));
        devices.into_iter().map(|d| d.id).collect()
    }

    pub fn create_device(
        &mut self,
        project: Uuid,
        body: input::CreateDevice,
        steal: bool,
        now: Instant,
    ) -> Result<Uuid, ApiError> {
        let plan_slug = required(body.plan.as_deref(), "plan")?;
        let os = required(body.operating_system.as_deref(), "operating_system")?.to_owned();
        let metro = body
            .metro
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty());
        let facilities = body
            .facility
            .map(input::OneOrMany::into_vec)
            .unwrap_or_default();
        if metro.is_none() && facilities.is_empty() {
            return Err(ApiError::unprocessable(
                "Either metro or facility must be provided",
            ));
        }
        if let Some(hostname) = &body.hostname {
            check_hostname(hostname)?;
        }
        let tags = body.tags.unwrap_or_default();
        check_tags(&tags)?;

        let reservation =
            match body
                .hardware_reservation_id
                .as_deref()
                .map(str::trim)
                .filter(|s| !s.is_empty())
            {
                None => None,
                Some("next-available") => {
                    return Err(ApiError::unprocessable(
                        "next-available is not supported by this fake",
                    ));
                }
                Some(raw) => Some(raw.parse::<Uuid>().map_err(|_| {
                    ApiError::unprocessable("hardware_reservation_id must be a UUID")
                })?),
            };
        let (plan, facility) = match reservation {
            Some(id) => {
                let not_ours = || {
                    ApiError::unprocessable(format!(
                        "Hardware reservation {id} was not found in this project"
                    ))
                };
                if self.reservation(id).is_none_or(|r| r.project_id != project) {
                    return Err(not_ours());
                }
                if steal {
                    self.steal(id, now);
                }
                let r = self.reservation(id).ok_or_else(not_ours)?;
                if !r.provisionable(now) {
                    return Err(ApiError::unprocessable(NOT_PROVISIONABLE));
                }
                if !r.plan.slug.eq_ignore_ascii_case(plan_slug) {
                    return Err(ApiError::unprocessable(format!(
                        "Plan {plan_slug} does not match the hardware reservation's plan {}",
                        r.plan.slug
                    )));
                }
                let metro_ok = metro.is_none_or(|m| r.facility.metro.matches(m));
                let facility_ok =
                    facilities.is_empty() || facilities.iter().any(|f| r.facility.matches(f));
                if !metro_ok || !facility_ok {
                    return Err(ApiError::unprocessable(format!(
                        "The hardware reservation is in facility {} of metro {}, not where the \
                         device was asked to be",
                        r.facility.code, r.facility.metro.code
                    )));
                }
                (r.plan, r.facility)
            }
            None => {
                let plan = catalog::plan(plan_slug).ok_or_else(|| {
                    ApiError::unprocessable(format!("Plan {plan_slug} was not found"))
                })?;
                let facility = match metro {
                    Some(m) => catalog::facility_in_metro(m),
                    None => facilities.iter().find_map(|f| catalog::facility(f)),
                }
                .ok_or_else(|| {
                    ApiError::unprocessable("No capacity in the requested metro or facility")
                })?;
                (plan, facility)
            }
        };
        let ssh_keys = self.keys_for_device(
            project,
            body.project_ssh_keys.unwrap_or_default(),
            body.user_ssh_keys.unwrap_or_default(),
            body.no_ssh_keys.unwrap_or(false),
        )?;

        let id = self.new_id();
        let stamp = Utc::now();
        self.devices.insert(
            id,
            Device {
                id,
                project_id: project,
                hostname: body
                    .hostname
                    .unwrap_or_else(|| format!("device-{}", short_id(id))),
                description: body.description,
                userdata: body.userdata,
                tags,
                created_at: stamp,
                updated_at: stamp,
                born: now,
                plan,
                facility,
                operating_system: os,
                reservation,
                ssh_keys,
                billing_cycle: body.billing_cycle.unwrap_or_else(|| "hourly".to_owned()),
                locked: body.locked.unwrap_or(false),
                always_pxe: body.always_pxe.unwrap_or(false),
                powered_off: false,
                failed: false,
                created_by_other: false,
            },
        );
        if let Some(r) = reservation.and_then(|r| self.reservation_mut(r)) {
            r.device = Some(id);
        }
        Ok(id)
    }

    /// The keys a new device gets. Like the real API, naming no keys at all
    /// means every key the project and its members have.
    fn keys_for_device(
        &self,
        project: Uuid,
        project_keys: Vec<String>,
        user_ids: Vec<String>,
        no_keys: bool,
    ) -> Result<Vec<Uuid>, ApiError> {
        let mut chosen = Vec::new();
        for raw in &project_keys {
            let key = raw
                .parse::<Uuid>()
                .ok()
                .and_then(|id| self.keys.iter().find(|k| k.id == id))
                .filter(|k| k.owner == KeyOwner::Project(project))
                .ok_or_else(|| {
                    ApiError::unprocessable(format!("SSH key {raw} was not found in this project"))
                })?;
            chosen.push(key.id);
        }
        for raw in &user_ids {
            if raw.parse::<Uuid>().is_err() {
                return Err(ApiError::unprocessable(format!(
                    "user_ssh_keys: {raw} is not a UUID"
                )));
            }
        }
        if !user_ids.is_empty() {
            chosen.extend(self.keys_of(KeyOwner::User).map(|k| k.id));
        }
        if no_keys {
            return Ok(Vec::new());
        }
        if project_keys.is_empty() && user_ids.is_empty() {
            chosen.extend(
                self.keys
                    .iter()
                    .filter(|k| {
                        matches!(k.owner, KeyOwner::User) || k.owner == KeyOwner::Project(project)
                    })
                    .map(|k| k.id),
            );
            if chosen.is_empty() {
                return Err(ApiError::unprocessable(NO_KEYS));
            }
        }
        Ok(chosen)
    }

    pub fn update_device(&mut self, id: Uuid, body: input::UpdateDevice) -> Result<(), ApiError> {
        if let Some(hostname) = &body.hostname {
            check_hostname(hostname)?;
        }
        if let Some(tags) = &body.tags {
            check_tags(tags)?;
        }
        let device = self.devices.get_mut(&id).ok_or_else(ApiError::not_found)?;
        if let Some(hostname) = body.hostname {
            device.hostname = hostname;
        }
        if let Some(tags) = body.tags {
            device.tags = tags;
        }
        if body.description.is_some() {
            device.description = body.description;
        }
        if body.userdata.is_some() {
            device.userdata = body.userdata;
        }
        if let Some(cycle) = body.billing_cycle {
            device.billing_cycle = cycle;
        }
        if let Some(locked) = body.locked {
            device.locked = locked;
        }
        if let Some(always_pxe) = body.always_pxe {
            device.always_pxe = always_pxe;
        }
        device.updated_at = Utc::now();
        Ok(())
    }

    pub fn delete_device(&mut self, id: Uuid, now: Instant) -> Result<(), ApiError> {
        let device = self.devices.get(&id).ok_or_else(ApiError::not_found)?;
        if device.locked {
            return Err(ApiError::unprocessable(
                "Device is locked and cannot be deleted",
            ));
        }
        self.remove_device(id, now);
        Ok(())
    }

    /// Removes a device and starts wiping its reservation. `false` when
    /// there was no such device.
    pub fn remove_device(&mut self, id: Uuid, now: Instant) -> bool {
        let Some(device) = self.devices.remove(&id) else {
            return false;
        };
        let wipe = Wipe {
            since: now,
            lasts: self.wipe_delay,
        };
        if let Some(r) = device.reservation.and_then(|r| self.reservation_mut(r))
            && r.device == Some(id)
        {
            r.device = None;
            r.wiping = Some(wipe);
        }
        true
    }

    pub fn fail_device(&mut self, id: Uuid) -> bool {
        match self.devices.get_mut(&id) {
            Some(device) => {
                device.failed = true;
                true
            }
            None => false,
        }
    }

    pub fn perform_action(
        &mut self,
        id: Uuid,
        body: input::DeviceAction,
        now: Instant,
    ) -> Result<(), ApiError> {
        let state = {
            let device = self.devices.get(&id).ok_or_else(ApiError::not_found)?;
            self.device_state(device, now)
        };
        let kind = body
            .kind
            .ok_or_else(|| ApiError::unprocessable("type is required"))?;
        let power_off = match kind.as_str() {
            "power_off" => Some(true),
            "power_on" | "reboot" => Some(false),
            "rescue" | "reinstall" => None,
            other => {
                return Err(ApiError::unprocessable(format!(
                    "{other} is not a valid action type"
                )));
            }
        };
        if !matches!(state, "active" | "inactive") {
            return Err(ApiError::unprocessable(format!(
                "Device cannot {kind} while {state}"
            )));
        }
        if let (Some(off), Some(device)) = (power_off, self.devices.get_mut(&id)) {
            device.powered_off = off;
            device.updated_at = Utc::now();
        }
        Ok(())
    }

    fn device_state(&self, device: &Device, now: Instant) -> &'static str {
        let age = now.saturating_duration_since(device.born);
        if device.failed {
            "failed"
        } else if age < self.provisioning_delay {
            "queued"
        } else if age < self.provisioning_delay.saturating_add(self.active_delay) {
            "provisioning"
        } else if device.powered_off {
            "inactive"
        } else {
            "active"
        }
    }

    // ----- SSH keys -----

    pub fn owner_of_project(&self, project: Uuid) -> Option<KeyOwner> {
        self.project_known(project)
            .then_some(KeyOwner::Project(project))
    }

    fn keys_of(&self, owner: KeyOwner) -> impl Iterator<Item = &SshKey> {
        self.keys.iter().filter(move |k| k.owner == owner)
    }

    pub fn key(&self, id: Uuid) -> Option<&SshKey> {
        self.keys.iter().find(|k| k.id == id)
    }

    pub fn create_key(&mut self, owner: KeyOwner, body: input::SshKey) -> Result<Uuid, ApiError> {
        let label = required(body.label.as_deref(), "label")?.to_owned();
        let key = required(body.key.as_deref(), "key")?.to_owned();
        let id = self.new_id();
        let stamp = Utc::now();
        self.keys.push(SshKey {
            id,
            owner,
            label,
            fingerprint: fingerprint(&key),
            key,
            tags: body.tags.unwrap_or_default(),
            created_at: stamp,
            updated_at: stamp,
        });
        Ok(id)
    }

    pub fn update_key(&mut self, id: Uuid, body: input::SshKey) -> Result<(), ApiError> {
        let label = body
            .label
            .as_deref()
            .map(|l| required(Some(l), "label"))
            .transpose()?;
        let key_text = body
            .key
            .as_deref()
            .map(|k| required(Some(k), "key"))
            .transpose()?;
        let key = self
            .keys
            .iter_mut()
            .find(|k| k.id == id)
            .ok_or_else(ApiError::not_found)?;
        if let Some(label) = label {
            key.label = label.to_owned();
        }
        if let Some(text) = key_text {
            key.key = text.to_owned();
            key.fingerprint = fingerprint(text);
        }
        if let Some(tags) = body.tags {
            key.tags = tags;
        }
        key.updated_at = Utc::now();
        Ok(())
    }

    pub fn delete_key(&mut self, id: Uuid) -> Result<(), ApiError> {
        let before = self.keys.len();
        self.keys.retain(|k| k.id != id);
        if self.keys.len() == before {
            return Err(ApiError::not_found());
        }
        Ok(())
    }

    // ----- JSON -----

    /// `listing` selects the listing's (possibly stale) view of
    /// `provisionable` over the truth.
    ///
    /// A free reservation has no `device` key at all: the real API is said
    /// to send `null`, but the spec's `Device` is not nullable, and a reader
    /// that tolerates a missing key tolerates both.
    pub fn reservation_json(
        &self,
        r: &Reservation,
        embed: Embed,
        listing: bool,
        now: Instant,
    ) -> Value {
        let provisionable = if listing {
            r.listed_provisionable(now)
        } else {
            r.provisionable(now)
        };
        let mut value = json!({
            "id": r.id,
            "short_id": r.short_id,
            "href": r.href(),
            "created_at": timestamp(r.created_at),
            "provisionable": provisionable,
            "spare": r.spare,
            "need_of_service": r.need_of_service,
            "plan": r.plan.json(),
            "facility": if embed.facility { r.facility.json() } else { r.facility.href() },
            "project": { "href": project_href(r.project_id) },
            "switch_uuid": r.switch_uuid,
        });
        if let Some(d) = r.device.filter(|id| self.devices.contains_key(id)) {
            value["device"] = if embed.device {
                self.device_json(d, now)
            } else {
                json!({ "href": device_href(d) })
            };
        }
        value
    }

    /// `Value::Null` for an unknown id.
    pub fn device_json(&self, id: Uuid, now: Instant) -> Value {
        let Some(d) = self.devices.get(&id) else {
            return Value::Null;
        };
        let ssh_keys: Vec<Value> = d
            .ssh_keys
            .iter()
            .map(|k| json!({ "href": key_href(*k) }))
            .collect();
        let mut value = json!({
            "id": d.id,
            "short_id": short_id(d.id),
            "href": device_href(d.id),
            "hostname": d.hostname,
            "state": self.device_state(d, now),
            "tags": d.tags,
            "created_at": timestamp(d.created_at),
            "updated_at": timestamp(d.updated_at),
            "plan": d.plan.json(),
            "facility": d.facility.json(),
            "metro": d.facility.metro.json(),
            "operating_system": catalog::operating_system_json(&d.operating_system),
            "project": { "href": project_href(d.project_id) },
            "ssh_keys": ssh_keys,
            "billing_cycle": d.billing_cycle,
            "locked": d.locked,
            "always_pxe": d.always_pxe,
        });
        if let Some(r) = d.reservation {
            value["hardware_reservation"] = json!({ "href": reservation_href(r) });
        }
        if let Some(description) = &d.description {
            value["description"] = json!(description);
        }
        if let Some(userdata) = &d.userdata {
            value["userdata"] = json!(userdata);
        }
        value
    }

    pub fn keys_json(&self, owner: KeyOwner) -> Value {
        let keys: Vec<Value> = self.keys_of(owner).map(|k| self.key_json(k)).collect();
        json!({ "ssh_keys": keys })
    }

    pub fn key_json(&self, k: &SshKey) -> Value {
        let entity = match k.owner {
            KeyOwner::Project(project) => project_href(project),
            KeyOwner::User => format!("{API_PREFIX}/users/{}", self.user_id),
        };
        json!({
            "id": k.id,
            "label": k.label,
            "key": k.key,
            "fingerprint": k.fingerprint,
            "href": key_href(k.id),
            "created_at": timestamp(k.created_at),
            "updated_at": timestamp(k.updated_at),
            "entity": { "href": entity },
            "tags": k.tags,
        })
    }

    // ----- snapshots -----

    pub fn reservation_snapshots(&self, now: Instant) -> Vec<ReservationSnapshot> {
        self.reservations
            .iter()
            .map(|r| ReservationSnapshot {
                id: r.id,
                provisionable: r.provisionable(now),
                device: r.device,
                plan: r.plan.slug.to_owned(),
                metro: r.facility.metro.code.to_owned(),
                taken_by_other: r
                    .device
                    .and_then(|d| self.devices.get(&d))
                    .is_some_and(|d| d.created_by_other),
                project_id: r.project_id,
                spare: r.spare,
                need_of_service: r.need_of_service,
            })
            .collect()
    }

    /// Every device of every project, by hostname and then id.
    pub fn device_snapshots(&self, now: Instant) -> Vec<DeviceSnapshot> {
        let mut devices: Vec<&Device> = self.devices.values().collect();
        devices.sort_by(|a, b| a.hostname.cmp(&b.hostname).then(a.id.cmp(&b.id)));
        devices
            .into_iter()
            .map(|d| DeviceSnapshot {
                id: d.id,
                hostname: d.hostname.clone(),
                reservation: d.reservation,
                tags: d.tags.clone(),
                state: self.device_state(d, now).to_owned(),
                created_by_other: d.created_by_other,
            })
            .collect()
    }

    pub fn key_snapshots(&self) -> Vec<SshKeySnapshot> {
        self.keys
            .iter()
            .map(|k| SshKeySnapshot {
                id: k.id,
                label: k.label.clone(),
                key: k.key.clone(),
            })
            .collect()
    }
}

/// Whether `nth` (1-based) is a multiple of `every`; `every == 0` is never.
fn every(n: usize, nth: usize) -> bool {
    n != 0 && nth.is_multiple_of(n)
}

fn required<'a>(value: Option<&'a str>, field: &str) -> Result<&'a str, ApiError> {
    value
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| ApiError::unprocessable(format!("{field} can't be blank")))
}

fn check_hostname(hostname: &str) -> Result<(), ApiError> {
    if hostname.trim().is_empty() {
        return Err(ApiError::unprocessable("hostname can't be blank"));
    }
    if hostname.contains('_') {
        return Err(ApiError::unprocessable(format!(
            "hostname {hostname:?} is invalid: underscores are not allowed"
        )));
    }
    Ok(())
}

fn check_tags(tags: &[String]) -> Result<(), ApiError> {
    match tags.iter().find(|t| t.chars().count() > MAX_TAG_CHARS) {
        Some(tag) => Err(ApiError::unprocessable(format!(
            "tag {tag:?} is too long (maximum is {MAX_TAG_CHARS} characters)"
        ))),
        None => Ok(()),
    }
}

/// The real API shows the first eight hex digits of the id.
fn short_id(id: Uuid) -> String {
    id.simple().to_string()[..8].to_owned()
}

fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn project_href(id: Uuid) -> String {
    format!("{API_PREFIX}/projects/{id}")
}

fn device_href(id: Uuid) -> String {
    format!("{API_PREFIX}/devices/{id}")
}

fn reservation_href(id: Uuid) -> String {
    format!("{API_PREFIX}/hardware-reservations/{id}")
}

fn key_href(id: Uuid) -> String {
    format!("{API_PREFIX}/ssh-keys/{id}")
}

/// Sixteen colon-separated byte pairs, like an MD5 key fingerprint. The
/// hash is FNV-1a (128 bit): stable across runs and Rust releases, which
/// `std`'s hasher does not promise, and no cryptography is needed to tell
/// test keys apart.
fn fingerprint(key: &str) -> String {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let hash = key
        .trim()
        .bytes()
        .fold(OFFSET, |h, b| (h ^ u128::from(b)).wrapping_mul(PRIME));
    hash.to_be_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_is_stable_and_shaped_like_md5() {
        let a = fingerprint("ssh-ed25519 AAAA test");
        assert_eq!(a, fingerprint("ssh-ed25519 AAAA test"));
        assert_ne!(a, fingerprint("ssh-ed25519 AAAB test"));
        assert_eq!(a.split(':').count(), 16);
    }

    #[test]
    fn generation_is_deterministic_and_spread() {
        let config = FakeConfig {
            reservations: 8,
            not_provisionable_every: 4,
            spare_every: 3,
            ..FakeConfig::default()
        };
        let now = Instant::now();
        let a = World::new(&config).reservation_snapshots(now);
        let b = World::new(&config).reservation_snapshots(now);
        assert_eq!(a, b);
        let combos: std::collections::HashSet<_> = a
            .iter()
            .map(|r| (r.plan.clone(), r.metro.clone()))
            .collect();
        assert_eq!(combos.len(), 4);
        let unprovisionable: Vec<bool> = a.iter().map(|r| !r.provisionable).collect();
        assert_eq!(
            unprovisionable,
            [false, false, false, true, false, false, false, true]
        );
        assert!(a[2].spare && a[5].spare && !a[0].spare);
        let other_seed = World::new(&FakeConfig { seed: 2, ..config }).reservation_snapshots(now);
        assert_ne!(a[0].id, other_seed[0].id);
    }

    #[test]
    fn states_and_wipes_follow_the_clock() {
        let config = FakeConfig {
            provisioning_delay: Duration::from_secs(10),
            active_delay: Duration::from_secs(20),
            wipe_delay: Duration::from_secs(60),
            ..FakeConfig::default()
        };
        let mut world = World::new(&config);
        let reservation = world.reservations[0].id;
        let born = Instant::now();
        let device = world
            .put_foreign_device(reservation, "a", Vec::new(), born)
            .unwrap();
        let state_at = |world: &World, secs| {
            world.device_snapshots(born + Duration::from_secs(secs))[0]
                .state
                .clone()
        };
        assert_eq!(state_at(&world, 0), "queued");
        assert_eq!(state_at(&world, 9), "queued");
        assert_eq!(state_at(&world, 10), "provisioning");
        assert_eq!(state_at(&world, 29), "provisioning");
        assert_eq!(state_at(&world, 30), "active");

        let gone = born + Duration::from_secs(100);
        assert!(world.remove_device(device, gone));
        let provisionable = |world: &World, secs| {
            world.reservation_snapshots(gone + Duration::from_secs(secs))[0].provisionable
        };
        assert!(!provisionable(&world, 0));
        assert!(!provisionable(&world, 59));
        assert!(provisionable(&world, 60));
    }
}
