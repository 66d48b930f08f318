//! Typed reading of the parts of Latitude.sh's answers shepherd uses.
//!
//! Every attribute is optional and unknown ones are ignored: the document
//! requires none of them, and the real API omits many (a create's answer
//! carries a handful). Statuses are kept as the open string they are.

use serde::{Deserialize, Deserializer, Serialize};

/// `{"data": ..}`, the envelope of every answer.
#[derive(Debug, Deserialize)]
pub struct Envelope<T> {
    pub data: T,
}

/// A page of a listing: its items, and the total when `stats[total]=count`
/// was asked for (`{"meta": {"stats": {"total": {"count": N}}}}`).
#[derive(Debug, Deserialize)]
pub struct Page<T> {
    pub data: Vec<T>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub meta: PageMeta,
}

#[derive(Debug, Default, Deserialize)]
pub struct PageMeta {
    #[serde(default)]
    pub stats: Option<PageStats>,
}

#[derive(Debug, Default, Deserialize)]
pub struct PageStats {
    #[serde(default)]
    pub total: Option<PageTotal>,
}

#[derive(Debug, Default, Deserialize)]
pub struct PageTotal {
    #[serde(default)]
    pub count: Option<u64>,
}

impl<T> Page<T> {
    pub fn total(&self) -> Option<u64> {
        self.meta.stats.as_ref()?.total.as_ref()?.count
    }
}

/// A JSON:API resource: id, type, attributes.
#[derive(Debug, Clone, Deserialize)]
#[serde(bound(deserialize = "A: Deserialize<'de> + Default"))]
pub struct Resource<A> {
    pub id: String,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default = "missing", deserialize_with = "null_as_default")]
    pub attributes: A,
}

fn missing<A: Default>() -> A {
    A::default()
}

fn null_as_default<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(
    d: D,
) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Slugged {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub slug: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    /// A server's plan only: `hourly`, `monthly` or `yearly`.
    #[serde(default)]
    pub billing: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Region {
    #[serde(default)]
    pub site: Option<Slugged>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ServerAttributes {
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub site: Option<String>,
    #[serde(default)]
    pub plan: Option<Slugged>,
    #[serde(default)]
    pub region: Option<Region>,
    #[serde(default)]
    pub project: Option<Slugged>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub tags: Vec<Slugged>,
    #[serde(default)]
    pub created_at: Option<String>,
}

pub type Server = Resource<ServerAttributes>;

/// What a server's open status string means for its lifecycle
/// (`provider::Condition`). The document lists `on`, `off`, `unknown`,
/// `disk_erasing`, `deploying`, `failed_deployment` and `rescue_mode`; the
/// Python SDK adds `configuring_bios`, `entering_rescue_mode` and
/// `exiting_rescue_mode`, and says provisioning slugs (`queued`,
/// `starting_deploy`, `commissioning`) come through as they are.
pub fn condition(status: Option<&str>) -> crate::provider::Condition {
    use crate::provider::Condition;
    match status {
        Some("on") => Condition::Ready,
        Some(s) if s.starts_with("failed") => Condition::Failed,
        Some(
            "deploying" | "queued" | "starting_deploy" | "commissioning" | "configuring_bios"
            | "provisioning",
        ) => Condition::Deploying,
        // off, unknown, rescue_mode and its ways in and out, disk_erasing,
        // and any word not known here: no evidence of a failure.
        _ => Condition::Dormant,
    }
}

impl Server {
    pub fn hostname(&self) -> Option<&str> {
        self.attributes.hostname.as_deref()
    }

    pub fn condition(&self) -> crate::provider::Condition {
        condition(self.attributes.status.as_deref())
    }

    /// When the API says it was made.
    pub fn created_at(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        let at = self.attributes.created_at.as_deref()?;
        chrono::DateTime::parse_from_rfc3339(at)
            .ok()
            .map(|t| t.with_timezone(&chrono::Utc))
    }

    pub fn plan_slug(&self) -> Option<&str> {
        self.attributes.plan.as_ref()?.slug.as_deref()
    }

    /// The site slug, from `site` or, in answers that only embed the
    /// region, from `region.site.slug`.
    pub fn site(&self) -> Option<&str> {
        self.attributes.site.as_deref().or_else(|| {
            self.attributes
                .region
                .as_ref()?
                .site
                .as_ref()?
                .slug
                .as_deref()
        })
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Locations {
    #[serde(default, deserialize_with = "null_as_default")]
    pub available: Vec<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub in_stock: Vec<String>,
    /// Newer answers only: units per site, sites with stock only.
    #[serde(default)]
    pub in_stock_count: Option<std::collections::BTreeMap<String, u32>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct PlanRegion {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub locations: Option<Locations>,
    #[serde(default)]
    pub stock_level: Option<String>,
    /// `{USD|BRL: {hour, month, year}}`, each figure nullable; read as
    /// it comes and judged by [`Plan::price`].
    #[serde(default)]
    pub pricing: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct PlanAttributes {
    #[serde(default)]
    pub slug: Option<String>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub regions: Vec<PlanRegion>,
}

pub type Plan = Resource<PlanAttributes>;

pub use crate::provider::Price;

/// How much of a plan a site has, as far as the answer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Stock {
    /// The plan does not exist in the site.
    Unavailable,
    /// None in stock now.
    Empty,
    /// In stock; the count when the answer gives one.
    Some(Option<u32>),
}

/// The most an hour of one server may cost before the figure is taken for
/// nonsense rather than a price (a decimal point lost, a field confused).
const MAX_PRICE_PER_HOUR: f64 = 10_000.0;

impl Plan {
    /// The plan's price at `site`: the pricing of the region (a country)
    /// that offers the site, in `currency` when the answer has it, else in
    /// its only currency. `None` when the answer gives no hourly price that
    /// is a finite figure from 0 to 10,000, or only several other
    /// currencies: never a guess.
    pub fn price(&self, site: &str, currency: &str) -> Option<Price> {
        let region = self.attributes.regions.iter().find(|r| {
            r.locations
                .as_ref()
                .is_some_and(|l| l.available.iter().any(|s| s.eq_ignore_ascii_case(site)))
        })?;
        let pricing = region.pricing.as_ref()?.as_object()?;
        let (code, figures) = match pricing.get_key_value(currency) {
            Some(found) => found,
            None if pricing.len() == 1 => pricing.iter().next()?,
            None => return None,
        };
        let code_ok = code.len() == 3 && code.bytes().all(|b| b.is_ascii_uppercase());
        let figure = |name: &str| {
            figures
                .get(name)
                .and_then(serde_json::Value::as_f64)
                .filter(|f| f.is_finite() && (0.0..=MAX_PRICE_PER_HOUR * 24.0 * 366.0).contains(f))
        };
        // A 0 is no price: a plan not sold by the hour would read as free.
        let hour = figure("hour").filter(|h| *h > 0.0 && *h <= MAX_PRICE_PER_HOUR)?;
        code_ok.then(|| Price {
            currency: code.clone(),
            hour,
            month: figure("month"),
            year: figure("year"),
        })
    }

    pub fn stock(&self, site: &str) -> Stock {
        let Some(locations) = self
            .attributes
            .regions
            .iter()
            .filter_map(|r| r.locations.as_ref())
            .find(|l| l.available.iter().any(|s| s.eq_ignore_ascii_case(site)))
        else {
            return Stock::Unavailable;
        };
        let count = locations.in_stock_count.as_ref().and_then(|c| {
            c.iter()
                .find(|(s, _)| s.eq_ignore_ascii_case(site))
                .map(|(_, n)| *n)
        });
        match count {
            Some(0) => Stock::Empty,
            Some(n) => Stock::Some(Some(n)),
            None if locations
                .in_stock
                .iter()
                .any(|s| s.eq_ignore_ascii_case(site)) =>
            {
                Stock::Some(None)
            }
            None => Stock::Empty,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct KeyAttributes {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub public_key: Option<String>,
}

pub type SshKey = Resource<KeyAttributes>;

/// One error of `{"errors": [..]}`. Both shapes the API sends read here:
/// the full JSON:API object (`code`, `status`, `title`, `detail`, `meta`)
/// and the short one (`code`, `message`). `status` comes as a string, a
/// symbolic one (`"locked"`) or a number.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ApiError {
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub status: Option<serde_json::Value>,
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub detail: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub meta: Option<ErrorMeta>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ErrorMeta {
    /// Seconds, on a 429.
    #[serde(default)]
    pub retry_after: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ErrorBody {
    #[serde(default, deserialize_with = "null_as_default")]
    pub errors: Vec<ApiError>,
}

impl ApiError {
    /// The code, upper-cased (`not_found` and `NOT_FOUND` both occur).
    pub fn code(&self) -> Option<String> {
        self.code.as_deref().map(str::to_ascii_uppercase)
    }

    /// What a person should read: detail, else message, else title.
    pub fn text(&self) -> Option<&str> {
        self.detail
            .as_deref()
            .or(self.message.as_deref())
            .or(self.title.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Condition;

    #[test]
    fn both_error_shapes_read() {
        let full: ErrorBody = serde_json::from_str(
            r#"{"errors":[{"code":"not_found","status":"404","title":"Error","detail":"Specified Record Not Found","meta":{}}]}"#,
        )
        .unwrap();
        assert_eq!(full.errors[0].code().as_deref(), Some("NOT_FOUND"));
        assert_eq!(full.errors[0].text(), Some("Specified Record Not Found"));
        let short: ErrorBody = serde_json::from_str(
            r#"{"errors":[{"code":"VALIDATION_ERROR","message":"Project ID is required"}]}"#,
        )
        .unwrap();
        assert_eq!(short.errors[0].text(), Some("Project ID is required"));
        let limited: ErrorBody = serde_json::from_str(
            r#"{"errors":[{"code":"RATE_LIMIT_EXCEEDED","status":429,"meta":{"retry_after":60}}]}"#,
        )
        .unwrap();
        assert_eq!(
            limited.errors[0].meta.as_ref().unwrap().retry_after,
            Some(60.0)
        );
        let locked: ErrorBody = serde_json::from_str(
            r#"{"errors":[{"code":"SERVER_LOCKED_ERROR","status":"locked"}]}"#,
        )
        .unwrap();
        assert_eq!(
            locked.errors[0].code().as_deref(),
            Some("SERVER_LOCKED_ERROR")
        );
    }

    #[test]
    fn servers_tolerate_missing_null_and_unknown_fields() {
        let s: Server = serde_json::from_str(
            r#"{"id":"sv_1","type":"servers","attributes":{"hostname":"h","status":"starting_deploy",
                "tags":null,"region":{"site":{"slug":"SAO"}},"brand_new_field":{"x":1}}}"#,
        )
        .unwrap();
        assert_eq!(s.site(), Some("SAO"));
        assert_eq!(s.condition(), Condition::Deploying);
        let bare: Server = serde_json::from_str(r#"{"id":"sv_2","attributes":null}"#).unwrap();
        assert_eq!(bare.hostname(), None);
        assert_eq!(bare.condition(), Condition::Dormant);
    }

    #[test]
    fn every_documented_status_has_a_meaning_and_only_failures_are_failures() {
        use Condition::*;
        for (status, condition) in [
            ("on", Ready),
            ("failed_deployment", Failed),
            ("failed_disk_erasing", Failed),
            ("deploying", Deploying),
            ("queued", Deploying),
            ("starting_deploy", Deploying),
            ("commissioning", Deploying),
            ("configuring_bios", Deploying),
            // Healthy machines, or no evidence either way: never a reason
            // to delete.
            ("off", Dormant),
            ("unknown", Dormant),
            ("rescue_mode", Dormant),
            ("entering_rescue_mode", Dormant),
            ("exiting_rescue_mode", Dormant),
            ("disk_erasing", Dormant),
            ("a_word_never_documented", Dormant),
            ("", Dormant),
        ] {
            let s: Server = serde_json::from_value(
                serde_json::json!({"id": "sv", "attributes": {"status": status}}),
            )
            .unwrap();
            assert_eq!(s.condition(), condition, "{status}");
        }
    }

    #[test]
    fn a_price_is_the_sites_region_in_the_currency_asked_or_none() {
        let plan: Plan = serde_json::from_str(
            r#"{"id":"plan_1","type":"plans","attributes":{"slug":"c2","regions":[
                {"name":"United States","locations":{"available":["DAL"]},
                 "pricing":{"USD":{"hour":0.33,"month":199,"year":2149},"BRL":{"hour":1.8}}},
                {"name":"Brazil","locations":{"available":["SAO"]},"pricing":{"BRL":{"hour":1.7,"month":null}}},
                {"name":"Chile","locations":{"available":["SCL"]},"pricing":{"USD":{"hour":"0.5"}}},
                {"name":"Mexico","locations":{"available":["MEX"]},"pricing":{"USD":{"hour":1e9}}},
                {"name":"Peru","locations":{"available":["LIM"]},"pricing":{"USD":{"hour":0}}},
                {"name":"Japan","locations":{"available":["TYO"]},"pricing":{"usd":{"hour":0.4}}},
                {"name":"Germany","locations":{"available":["FRA"]}}]}}"#,
        )
        .unwrap();
        let dal = plan.price("DAL", "USD").unwrap();
        assert_eq!((dal.currency.as_str(), dal.hour), ("USD", 0.33));
        assert_eq!((dal.month, dal.year), (Some(199.0), Some(2149.0)));
        assert_eq!(plan.price("dal", "BRL").unwrap().hour, 1.8);
        // Its only currency, when the one asked for is not there.
        let sao = plan.price("SAO", "USD").unwrap();
        assert_eq!(
            (sao.currency.as_str(), sao.hour, sao.month),
            ("BRL", 1.7, None)
        );
        // A string, an absurd figure, a currency that is no code, none at
        // all, a site not offered: no price.
        for site in ["SCL", "MEX", "LIM", "TYO", "FRA", "LAX"] {
            assert_eq!(plan.price(site, "USD"), None, "{site}");
        }
    }

    #[test]
    fn stock_reads_counts_or_lists() {
        let plan: Plan = serde_json::from_str(
            r#"{"id":"plan_1","type":"plans","attributes":{"slug":"c2","regions":[
                {"name":"United States","locations":{"available":["DAL","ASH","CHI"],"in_stock":["DAL","ASH"],"in_stock_count":{"DAL":3}}},
                {"name":"Brazil","locations":{"available":["SAO"],"in_stock":["SAO"]}}]}}"#,
        )
        .unwrap();
        assert_eq!(plan.stock("DAL"), Stock::Some(Some(3)));
        assert_eq!(plan.stock("ASH"), Stock::Some(None));
        assert_eq!(plan.stock("CHI"), Stock::Empty);
        assert_eq!(plan.stock("SAO"), Stock::Some(None));
        assert_eq!(plan.stock("FRA"), Stock::Unavailable);
    }
}
