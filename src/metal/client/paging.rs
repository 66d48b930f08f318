//! Listings fetched page by page, with the checks that keep a short or
//! inconsistent listing from passing for a whole one.

use std::collections::HashSet;

use reqwest::Method;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::*;

impl MetalClient {
    /// Fetches every page of a listing, page by page, each page with its own
    /// retries. It never follows `meta.next`: whether that href carries the
    /// `/metal/v1` prefix was never settled.
    pub(super) async fn list_pages<P: DeserializeOwned + HasMeta>(
        &self,
        op: Operation,
        path: &str,
        include: &[&str],
    ) -> Result<Vec<P>, MetalError> {
        let mut pages = Vec::new();
        let mut page = 1u64;
        loop {
            let mut query = include_query(include);
            query.push(("page", page.to_string()));
            query.push(("per_page", self.inner.per_page.to_string()));
            let p: P = self
                .json(Call {
                    op,
                    method: Method::GET,
                    path: path.to_string(),
                    query,
                    body: None,
                })
                .await?;
            let last_page = p.meta().and_then(|m| m.last_page);
            let empty = p.is_empty();
            pages.push(p);
            match last_page {
                Some(last) if page < last && !empty => {}
                _ => break,
            }
            page += 1;
            if page > MAX_PAGES {
                return Err(MetalError::Undecodable {
                    op,
                    status: 200,
                    detail: format!("more than {MAX_PAGES} pages"),
                    excerpt: String::new(),
                });
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

/// Joins pages, dropping an item seen on an earlier page (the list can shift
/// while it is paged), and refuses a listing whose pages contradict its own
/// `meta`: a short listing would make present machines look missing.
pub(super) fn collect_pages<T>(
    op: Operation,
    pages: impl Iterator<Item = (Vec<T>, Option<Meta>)>,
    id: impl Fn(&T) -> Uuid,
) -> Result<Vec<T>, MetalError> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut claimed_total = None;
    let mut pages_read = 0u64;
    let mut last_page = None;
    for (items, meta) in pages {
        pages_read += 1;
        if let Some(m) = &meta {
            claimed_total = m.total.or(claimed_total);
            last_page = m.last_page.or(last_page);
        }
        for item in items {
            if seen.insert(id(&item)) {
                out.push(item);
            }
        }
    }
    if let (Some(last), Some(total)) = (last_page, claimed_total)
        && pages_read < last
        && (out.len() as u64) < total
    {
        return Err(MetalError::Transient {
            op,
            reason: format!(
                "inconsistent pagination: page {} of {last} was empty, {} of {total} items read",
                pages_read,
                out.len()
            ),
        });
    }
    Ok(out)
}

pub(super) fn include_query(include: &[&str]) -> Vec<(&'static str, String)> {
    if include.is_empty() {
        vec![]
    } else {
        vec![("include", include.join(","))]
    }
}
