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

mod devices;
mod wire;

use wire::*;

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
    /// Creates refused because the reservation already held a device the
    /// client itself had made: Metal's refusal hides a duplicate attempt,
    /// so the fake counts them for tests to see.
    pub duplicate_creates: u64,
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
            duplicate_creates: 0,
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
