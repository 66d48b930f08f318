//! Typed models of the parts of the Metal API that shepherd uses.
//!
//! Field names follow the spec (`components.schemas` in the official
//! OpenAPI document). Unknown fields are ignored and every field the spec does
//! not require is optional, so an answer that grows or omits an attribute does
//! not break a reconcile. Embedded objects may come back as `{"href": ...}`
//! only when they were not `include`d; [`Embedded`] keeps both shapes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use uuid::Uuid;

/// An object the API may send in full or as a bare link.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Embedded<T> {
    Full(T),
    Link(Href),
}

// An object holding nothing but `href` is a link, even when every field of
// `T` is optional and it would decode as an empty `T`: an untagged enum
// would pick `Full` and lose the id the link carries.
//
// The object is kept as raw text and read at most twice: as a bare link,
// which fails at its first other key, then as `T`. A listing of 10,000
// reservations embeds as many objects, so building a `Value` tree for each
// (the obvious way) was most of the pass's decoding time.
impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for Embedded<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct LinkOnly {
            href: String,
        }
        let raw = Box::<serde_json::value::RawValue>::deserialize(d)?;
        if let Ok(LinkOnly { href }) = serde_json::from_str(raw.get()) {
            return Ok(Embedded::Link(Href { href }));
        }
        serde_json::from_str(raw.get())
            .map(Embedded::Full)
            .map_err(serde::de::Error::custom)
    }
}

impl<T> Embedded<T> {
    pub fn full(&self) -> Option<&T> {
        match self {
            Embedded::Full(t) => Some(t),
            Embedded::Link(_) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Href {
    pub href: String,
}

impl Href {
    /// The last path segment of a link, which is the object's id.
    pub fn id(&self) -> Option<Uuid> {
        self.href.rsplit('/').next().and_then(|s| s.parse().ok())
    }
}

/// Pagination metadata. The client loops on page numbers and uses only
/// `current_page`/`last_page`; the links are kept for completeness.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    #[serde(default)]
    pub first: Option<Href>,
    #[serde(default)]
    pub last: Option<Href>,
    #[serde(default)]
    pub next: Option<Href>,
    #[serde(default)]
    pub previous: Option<Href>,
    #[serde(default, rename = "self")]
    pub self_: Option<Href>,
    #[serde(default)]
    pub total: Option<u64>,
    #[serde(default)]
    pub current_page: Option<u64>,
    #[serde(default)]
    pub last_page: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metro {
    #[serde(default)]
    pub id: Option<Uuid>,
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub country: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facility {
    #[serde(default)]
    pub id: Option<Uuid>,
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub metro: Option<Metro>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    #[serde(default)]
    pub id: Option<Uuid>,
    #[serde(default)]
    pub slug: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub class: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Project {
    #[serde(default)]
    pub id: Option<Uuid>,
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatingSystem {
    #[serde(default)]
    pub slug: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

/// Device states from the spec. A state this build does not know is kept as
/// `Unknown` rather than failing the whole listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceState {
    Queued,
    Provisioning,
    Deprovisioning,
    Reinstalling,
    Active,
    Inactive,
    Failed,
    PoweringOn,
    PoweringOff,
    Deleted,
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub id: Uuid,
    #[serde(default)]
    pub short_id: Option<String>,
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub state: Option<DeviceState>,
    /// packngo-era servers send `null` for no tags.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub tags: Vec<String>,
    #[serde(default)]
    pub plan: Option<Embedded<Plan>>,
    #[serde(default)]
    pub facility: Option<Embedded<Facility>>,
    #[serde(default)]
    pub metro: Option<Embedded<Metro>>,
    #[serde(default)]
    pub operating_system: Option<Embedded<OperatingSystem>>,
    #[serde(default)]
    pub hardware_reservation: Option<Embedded<ReservationLink>>,
    #[serde(default)]
    pub project: Option<Embedded<Project>>,
    #[serde(default)]
    pub created_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub href: Option<String>,
}

impl Device {
    pub fn project_id(&self) -> Option<Uuid> {
        match self.project.as_ref()? {
            Embedded::Full(p) => p.id,
            Embedded::Link(h) => h.id(),
        }
    }

    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.iter().any(|t| t == tag)
    }

    pub fn reservation_id(&self) -> Option<Uuid> {
        match self.hardware_reservation.as_ref()? {
            Embedded::Full(r) => r.id,
            Embedded::Link(h) => h.id(),
        }
    }
}

/// A reservation as embedded in a device: usually just a link.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationLink {
    #[serde(default)]
    pub id: Option<Uuid>,
    #[serde(default)]
    pub href: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HardwareReservation {
    pub id: Uuid,
    #[serde(default)]
    pub short_id: Option<String>,
    #[serde(default)]
    pub provisionable: bool,
    #[serde(default)]
    pub spare: bool,
    #[serde(default)]
    pub need_of_service: bool,
    #[serde(default)]
    pub device: Option<Embedded<Device>>,
    #[serde(default)]
    pub plan: Option<Embedded<Plan>>,
    #[serde(default)]
    pub facility: Option<Embedded<Facility>>,
    #[serde(default)]
    pub project: Option<Embedded<Project>>,
    #[serde(default)]
    pub created_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub termination_time: Option<DateTime<Utc>>,
    #[serde(default)]
    pub href: Option<String>,
}

impl HardwareReservation {
    pub fn plan_slug(&self) -> Option<&str> {
        self.plan.as_ref()?.full()?.slug.as_deref()
    }

    pub fn facility(&self) -> Option<&Facility> {
        self.facility.as_ref()?.full()
    }

    /// Reservations expose their metro only inside the facility: the spec's
    /// `HardwareReservation` has no `metro` of its own (spec/metal/README.md).
    pub fn metro_code(&self) -> Option<&str> {
        self.facility()?.metro.as_ref()?.code.as_deref()
    }

    /// The id of the device on the reservation, whether embedded or linked.
    pub fn device_id(&self) -> Option<Uuid> {
        match self.device.as_ref()? {
            Embedded::Full(d) => Some(d.id),
            Embedded::Link(h) => h.id(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshKey {
    pub id: Uuid,
    #[serde(default)]
    pub label: String,
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub fingerprint: Option<String>,
    #[serde(default)]
    pub created_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub updated_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub href: Option<String>,
}

/// The body of `POST /projects/{id}/devices` for a reserved machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceCreateRequest {
    pub hostname: String,
    pub plan: String,
    pub operating_system: String,
    /// The spec requires a metro or (deprecated) a facility beside the
    /// reservation; the client fills it from the reservation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metro: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub facility: Option<String>,
    pub hardware_reservation_id: Uuid,
    pub project_ssh_keys: Vec<Uuid>,
    pub tags: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceUpdateRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locked: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceAction {
    Reboot,
    PowerOn,
    PowerOff,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshKeyInput {
    pub label: String,
    pub key: String,
}

/// One page of a listing, as the API sends it; `T` is the item type and the
/// collection key differs per endpoint.
#[derive(Debug, Deserialize)]
pub(crate) struct ReservationPage {
    pub hardware_reservations: Vec<HardwareReservation>,
    #[serde(default)]
    pub meta: Option<Meta>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct DevicePage {
    pub devices: Vec<Device>,
    #[serde(default)]
    pub meta: Option<Meta>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct SshKeyList {
    pub ssh_keys: Vec<SshKey>,
}

/// The API's error body: `{"error": ".."}` or `{"errors": [..]}`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ErrorBody {
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub errors: Vec<String>,
}

impl ErrorBody {
    pub fn messages(self) -> Vec<String> {
        self.error.into_iter().chain(self.errors).collect()
    }
}

fn null_as_empty<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_with_linked_device_and_unknown_fields_decodes() {
        let r: HardwareReservation = serde_json::from_value(serde_json::json!({
            "id": "2b0f6b1c-0d3a-4e8a-9a4b-1d2c3e4f5a6b",
            "provisionable": false,
            "device": {"href": "/metal/v1/devices/7c9e6679-7425-40de-944b-e07fc1f90ae7"},
            "plan": {"slug": "m3.small.x86", "pricing": {"hour": 1.5}},
            "facility": {"code": "da11", "metro": {"code": "da"}},
            "something_new": [1, 2, 3]
        }))
        .unwrap();
        assert_eq!(
            r.device_id(),
            Some("7c9e6679-7425-40de-944b-e07fc1f90ae7".parse().unwrap())
        );
        assert_eq!(r.plan_slug(), Some("m3.small.x86"));
        assert_eq!(r.metro_code(), Some("da"));
    }

    #[test]
    fn a_bare_link_keeps_its_id() {
        let d: Device = serde_json::from_value(serde_json::json!({
            "id": "7c9e6679-7425-40de-944b-e07fc1f90ae7",
            "hardware_reservation": {"href": "/metal/v1/hardware-reservations/2b0f6b1c-0d3a-4e8a-9a4b-1d2c3e4f5a6b"},
            "project": {"href": "/metal/v1/projects/0d9f6c3a-5b1e-4c7d-8a2f-3e4b5c6d7e8f"}
        }))
        .unwrap();
        assert_eq!(
            d.reservation_id(),
            Some("2b0f6b1c-0d3a-4e8a-9a4b-1d2c3e4f5a6b".parse().unwrap())
        );
        assert_eq!(
            d.project_id(),
            Some("0d9f6c3a-5b1e-4c7d-8a2f-3e4b5c6d7e8f".parse().unwrap())
        );
    }

    #[test]
    fn device_with_null_tags_and_unknown_state_decodes() {
        let d: Device = serde_json::from_value(serde_json::json!({
            "id": "7c9e6679-7425-40de-944b-e07fc1f90ae7",
            "tags": null,
            "state": "teleporting"
        }))
        .unwrap();
        assert!(d.tags.is_empty());
        assert_eq!(d.state, Some(DeviceState::Unknown));
    }

    #[test]
    fn error_body_in_both_shapes() {
        let a: ErrorBody = serde_json::from_str(r#"{"error":"one"}"#).unwrap();
        let b: ErrorBody = serde_json::from_str(r#"{"errors":["two","three"]}"#).unwrap();
        assert_eq!(a.messages(), vec!["one"]);
        assert_eq!(b.messages(), vec!["two", "three"]);
    }
}
