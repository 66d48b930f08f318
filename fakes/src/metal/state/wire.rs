//! The fake's wire shapes: the JSON it answers with, written from its own
//! state (never from the client's model types), and the snapshots tests
//! read.

use super::*;

impl World {
    // ----- JSON -----

    /// The project, as `GET /projects/{id}` answers (the spec's `Project`).
    pub fn project_json(&self) -> Value {
        let id = self.project_id;
        json!({
            "id": id,
            "name": "shepherd",
            "href": project_href(id),
            "created_at": "2024-01-01T00:00:00Z",
            "updated_at": "2024-01-01T00:00:00Z",
            "backend_transfer_enabled": false,
            "customdata": {},
            "devices": self.devices.values()
                .filter(|d| d.project_id == id)
                .map(|d| json!({ "href": device_href(d.id) }))
                .collect::<Vec<_>>(),
            "invitations": [],
            "max_devices": {},
            "members": [{ "href": format!("{API_PREFIX}/users/{}", self.user_id) }],
            "memberships": [],
            "network_status": {},
            "ssh_keys": [],
            "volumes": [],
            "type": "default",
        })
    }

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

/// The real API shows the first eight hex digits of the id.
pub(super) fn short_id(id: Uuid) -> String {
    id.simple().to_string()[..8].to_owned()
}

pub(super) fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

pub(super) fn project_href(id: Uuid) -> String {
    format!("{API_PREFIX}/projects/{id}")
}

pub(super) fn device_href(id: Uuid) -> String {
    format!("{API_PREFIX}/devices/{id}")
}

pub(super) fn reservation_href(id: Uuid) -> String {
    format!("{API_PREFIX}/hardware-reservations/{id}")
}

pub(super) fn key_href(id: Uuid) -> String {
    format!("{API_PREFIX}/ssh-keys/{id}")
}

/// Sixteen colon-separated byte pairs, like an MD5 key fingerprint. The
/// hash is FNV-1a (128 bit): stable across runs and Rust releases, which
/// `std`'s hasher does not promise, and no cryptography is needed to tell
/// test keys apart.
pub(super) fn fingerprint(key: &str) -> String {
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
