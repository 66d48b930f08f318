//! Request bodies as the fake reads them. Every field is optional so that the
//! fake, not serde, decides which omissions are errors and says so in the
//! API's words; unknown fields are ignored as the real API ignores them.

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct CreateDevice {
    pub hostname: Option<String>,
    pub plan: Option<String>,
    pub operating_system: Option<String>,
    pub metro: Option<String>,
    pub facility: Option<OneOrMany>,
    pub hardware_reservation_id: Option<String>,
    pub project_ssh_keys: Option<Vec<String>>,
    pub user_ssh_keys: Option<Vec<String>>,
    pub no_ssh_keys: Option<bool>,
    /// packngo sends `null` for no tags, and packet-python 1.44's
    /// `create_device` an empty object, which the real API took as none.
    #[serde(deserialize_with = "tags")]
    pub tags: Option<Vec<String>>,
    pub description: Option<String>,
    pub userdata: Option<String>,
    pub billing_cycle: Option<String>,
    pub locked: Option<bool>,
    pub always_pxe: Option<bool>,
}

/// Tags as the API took them from its own clients: a list, `null`, or an
/// empty object (no tags). Anything else is refused as before.
fn tags<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Tags {
        List(Vec<String>),
        Empty(std::collections::BTreeMap<String, serde::de::IgnoredAny>),
    }
    match Option::<Tags>::deserialize(d)? {
        None => Ok(None),
        Some(Tags::List(list)) => Ok(Some(list)),
        Some(Tags::Empty(map)) if map.is_empty() => Ok(Some(vec![])),
        Some(Tags::Empty(_)) => Err(serde::de::Error::custom(
            "invalid type: map, expected a sequence",
        )),
    }
}

/// The deprecated `facility` input takes one code or a list in order of
/// preference.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(one) => vec![one],
            OneOrMany::Many(many) => many,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct UpdateDevice {
    pub hostname: Option<String>,
    pub description: Option<String>,
    pub userdata: Option<String>,
    pub tags: Option<Vec<String>>,
    pub billing_cycle: Option<String>,
    pub locked: Option<bool>,
    pub always_pxe: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct DeviceAction {
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct SshKey {
    pub label: Option<String>,
    pub key: Option<String>,
    pub tags: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct MoveReservation {
    pub project_id: Option<String>,
}
