//! The fixed world the fake's reservations live in: two metros with one
//! facility each, two plans and a few operating systems.

use serde_json::{Value, json};
use uuid::Uuid;

/// Namespace for the fake's name-derived ids, so that a plan or facility has
/// the same id in every run and every process.
const NAMESPACE: Uuid = Uuid::from_u128(0x5d4e_1f3a_9c2b_4e6f_8a1d_0b7c_3e5f_9a21);

pub(super) fn named_id(kind: &str, name: &str) -> Uuid {
    Uuid::new_v5(&NAMESPACE, format!("{kind}/{name}").as_bytes())
}

pub(super) struct Metro {
    pub code: &'static str,
    pub name: &'static str,
    pub country: &'static str,
}

pub(super) struct Facility {
    pub code: &'static str,
    pub name: &'static str,
    pub metro: &'static Metro,
}

pub(super) struct Plan {
    pub slug: &'static str,
    pub name: &'static str,
}

struct OperatingSystem {
    slug: &'static str,
    name: &'static str,
    distro: &'static str,
    version: &'static str,
}

const DALLAS: Metro = Metro {
    code: "da",
    name: "Dallas",
    country: "US",
};

const AMSTERDAM: Metro = Metro {
    code: "am",
    name: "Amsterdam",
    country: "NL",
};

pub(super) static FACILITIES: [Facility; 2] = [
    Facility {
        code: "da11",
        name: "Dallas DA11",
        metro: &DALLAS,
    },
    Facility {
        code: "am6",
        name: "Amsterdam AM6",
        metro: &AMSTERDAM,
    },
];

pub(super) static PLANS: [Plan; 2] = [
    Plan {
        slug: "m3.small.x86",
        name: "m3.small.x86",
    },
    Plan {
        slug: "c3.medium.x86",
        name: "c3.medium.x86",
    },
];

static OPERATING_SYSTEMS: [OperatingSystem; 5] = [
    OperatingSystem {
        slug: "ubuntu_22_04",
        name: "Ubuntu 22.04 LTS",
        distro: "ubuntu",
        version: "22.04",
    },
    OperatingSystem {
        slug: "ubuntu_24_04",
        name: "Ubuntu 24.04 LTS",
        distro: "ubuntu",
        version: "24.04",
    },
    OperatingSystem {
        slug: "debian_12",
        name: "Debian 12",
        distro: "debian",
        version: "12",
    },
    OperatingSystem {
        slug: "rocky_9",
        name: "Rocky Linux 9",
        distro: "rocky",
        version: "9",
    },
    OperatingSystem {
        slug: "flatcar_stable",
        name: "Flatcar Container Linux (Stable)",
        distro: "flatcar",
        version: "stable",
    },
];

/// The operating system a device is created with when nobody says which,
/// e.g. a device put on a reservation by another party.
pub(super) const DEFAULT_OS: &str = "ubuntu_22_04";

pub(super) fn plan(slug: &str) -> Option<&'static Plan> {
    PLANS.iter().find(|p| p.slug.eq_ignore_ascii_case(slug))
}

/// A facility by its code, or the first one for `any`.
pub(super) fn facility(code: &str) -> Option<&'static Facility> {
    if code.eq_ignore_ascii_case("any") {
        return FACILITIES.first();
    }
    FACILITIES
        .iter()
        .find(|f| f.code.eq_ignore_ascii_case(code))
}

/// The first facility in a metro given by code or id, or the first one for
/// `any`.
pub(super) fn facility_in_metro(metro: &str) -> Option<&'static Facility> {
    FACILITIES.iter().find(|f| f.metro.matches(metro))
}

impl Metro {
    /// Whether a `metro` input names this metro: by code, by id or `any`.
    pub fn matches(&self, input: &str) -> bool {
        input.eq_ignore_ascii_case("any")
            || input.eq_ignore_ascii_case(self.code)
            || input.parse::<Uuid>().is_ok_and(|id| id == self.id())
    }

    pub fn id(&self) -> Uuid {
        named_id("metro", self.code)
    }

    pub fn json(&self) -> Value {
        json!({
            "id": self.id(),
            "code": self.code,
            "name": self.name,
            "country": self.country,
        })
    }
}

impl Facility {
    /// Whether a `facility` input names this facility: by code or `any`.
    pub fn matches(&self, input: &str) -> bool {
        input.eq_ignore_ascii_case("any") || input.eq_ignore_ascii_case(self.code)
    }

    pub fn id(&self) -> Uuid {
        named_id("facility", self.code)
    }

    pub fn href(&self) -> Value {
        json!({ "href": format!("{}/facilities/{}", super::API_PREFIX, self.id()) })
    }

    pub fn json(&self) -> Value {
        json!({
            "id": self.id(),
            "code": self.code,
            "name": self.name,
            "metro": self.metro.json(),
        })
    }
}

impl Plan {
    pub fn id(&self) -> Uuid {
        named_id("plan", self.slug)
    }

    pub fn json(&self) -> Value {
        json!({
            "id": self.id(),
            "slug": self.slug,
            "name": self.name,
            "class": self.slug,
            "line": "baremetal",
            "type": "standard",
        })
    }
}

/// An operating system by slug. Slugs the catalogue does not know are
/// accepted and described from the slug itself, since the fake has no reason
/// to be stricter than shepherd's configuration.
pub(super) fn operating_system_json(slug: &str) -> Value {
    match OPERATING_SYSTEMS.iter().find(|os| os.slug == slug) {
        Some(os) => json!({
            "id": named_id("operating-system", os.slug),
            "slug": os.slug,
            "name": os.name,
            "distro": os.distro,
            "version": os.version,
        }),
        None => {
            let (distro, version) = slug.split_once('_').unwrap_or((slug, ""));
            json!({
                "id": named_id("operating-system", slug),
                "slug": slug,
                "name": slug,
                "distro": distro,
                "version": version.replace('_', "."),
            })
        }
    }
}
