//! Listings fetched page by page, with the checks that keep a short or
//! inconsistent listing from passing for a whole one.

use std::collections::HashSet;

use reqwest::Method;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::*;

/// How many times a listing that changed while it was read is read again
/// before the pass gives up on it (and its job retries later).
const LISTING_READS: u32 = 3;

impl MetalClient {
    /// Every item of a listing. The first page says how many pages there
    /// are; the rest are fetched at once, each page with its own retries,
    /// as many on the wire as the gate allows, so a listing takes about two
    /// round trips whatever its length. Pages are asked at a fixed size in
    /// the API's own order; a listing whose pages disagree with each other
    /// (it changed while it was read, or an item slipped between pages) is
    /// read again, and fails as transient if it keeps changing. It never
    /// follows `meta.next`: whether that href carries the `/metal/v1` prefix
    /// was never settled.
    pub(super) async fn list_all<P, T>(
        &self,
        op: Operation,
        path: &str,
        include: &[&str],
        split: impl Fn(P) -> (Vec<T>, Option<Meta>),
        id: impl Fn(&T) -> Uuid,
    ) -> Result<Vec<T>, MetalError>
    where
        P: DeserializeOwned + HasMeta,
    {
        let mut read = 0;
        loop {
            read += 1;
            let pages = self.list_pages::<P>(op, path, include).await?;
            match collect_pages(op, pages.into_iter().map(&split), &id) {
                Err(MetalError::Transient { reason, .. }) if read < LISTING_READS => {
                    tracing::info!(op = op.id(), read, %reason, "listing changed while read; reading it again");
                }
                other => return other,
            }
        }
    }

    /// The pages of one reading of a listing, in order.
    async fn list_pages<P: DeserializeOwned + HasMeta>(
        &self,
        op: Operation,
        path: &str,
        include: &[&str],
    ) -> Result<Vec<P>, MetalError> {
        let page = |number: u64| {
            let mut query = include_query(include);
            query.push(("page", number.to_string()));
            query.push(("per_page", self.inner.per_page.to_string()));
            self.json::<P>(Call {
                op,
                method: Method::GET,
                path: path.to_string(),
                query,
                body: None,
            })
        };
        let first = page(1).await?;
        let last = match first.meta().and_then(|m| m.last_page) {
            Some(last) if !first.is_empty() => last,
            _ => return Ok(vec![first]),
        };
        if last > MAX_PAGES {
            return Err(MetalError::Undecodable {
                op,
                status: 200,
                detail: format!("a listing of {last} pages (more than {MAX_PAGES})"),
                excerpt: String::new(),
            });
        }
        // The gate bounds how many are on the wire; the rest wait their turn.
        let rest = futures::future::join_all((2..=last).map(page)).await;
        let mut pages = Vec::with_capacity(rest.len() + 1);
        pages.push(first);
        for (number, result) in (2..).zip(rest) {
            match result {
                Ok(p) => pages.push(p),
                // A page the first one promised that is gone: the listing
                // shrank while it was read.
                Err(MetalError::NotFound { .. }) => {
                    return Err(MetalError::Transient {
                        op,
                        reason: format!("inconsistent pagination: page {number} of {last} is gone"),
                    });
                }
                Err(e) => return Err(e),
            }
        }
        Ok(pages)
    }
}
/// Page types that carry pagination metadata.
pub(super) trait HasMeta {
    fn meta(&self) -> Option<&Meta>;
    fn is_empty(&self) -> bool;
}

impl HasMeta for ReservationPage {
    fn meta(&self) -> Option<&Meta> {
        self.meta.as_ref()
    }
    fn is_empty(&self) -> bool {
        self.hardware_reservations.is_empty()
    }
}

impl HasMeta for DevicePage {
    fn meta(&self) -> Option<&Meta> {
        self.meta.as_ref()
    }
    fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }
}

/// Joins pages, dropping an item seen on an earlier page, and refuses a
/// listing whose pages contradict each other or their own `meta`: a short
/// listing would make present machines look missing. The checks: every
/// page states the same total and page count; no page before the last is
/// empty; the items read are as many as the total says.
pub(super) fn collect_pages<T>(
    op: Operation,
    pages: impl Iterator<Item = (Vec<T>, Option<Meta>)>,
    id: impl Fn(&T) -> Uuid,
) -> Result<Vec<T>, MetalError> {
    let inconsistent = |reason: String| MetalError::Transient {
        op,
        reason: format!("inconsistent pagination: {reason}"),
    };
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut claimed: Option<(Option<u64>, Option<u64>)> = None;
    let mut pages_read = 0u64;
    let mut empty_at = None;
    for (items, meta) in pages {
        pages_read += 1;
        let this = meta
            .as_ref()
            .map_or((None, None), |m| (m.total, m.last_page));
        match claimed {
            None => claimed = Some(this),
            Some(first) if first != this && this != (None, None) => {
                return Err(inconsistent(format!(
                    "page {pages_read} says {} items on {} pages, page 1 said {} on {}",
                    shown(this.0),
                    shown(this.1),
                    shown(first.0),
                    shown(first.1)
                )));
            }
            Some(_) => {}
        }
        if items.is_empty() && empty_at.is_none() {
            empty_at = Some(pages_read);
        }
        out.reserve(items.len());
        for item in items {
            if seen.insert(id(&item)) {
                out.push(item);
            }
        }
    }
    let (total, last_page) = claimed.unwrap_or((None, None));
    if let (Some(empty), Some(last)) = (empty_at, last_page)
        && empty < last
    {
        return Err(inconsistent(format!(
            "page {empty} of {last} was empty, {} of {} items read",
            out.len(),
            shown(total)
        )));
    }
    if let Some(total) = total
        && (out.len() as u64) < total
        && pages_read >= last_page.unwrap_or(1)
    {
        return Err(inconsistent(format!(
            "{} of {total} items read on {pages_read} pages",
            out.len()
        )));
    }
    Ok(out)
}

fn shown(n: Option<u64>) -> String {
    n.map_or_else(|| "?".to_string(), |n| n.to_string())
}

pub(super) fn include_query(include: &[&str]) -> Vec<(&'static str, String)> {
    if include.is_empty() {
        vec![]
    } else {
        vec![("include", include.join(","))]
    }
}
