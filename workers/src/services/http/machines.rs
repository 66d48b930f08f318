//! `/machines`: the managed machines, paged and searchable by hostname,
//! device, reservation or place (`web/3`), for fleets too large for the
//! status page.

use maud::html;
use serde::Deserialize;

use super::*;

const PAGE_SIZE: i64 = 100;

#[derive(Debug, Default, Deserialize)]
pub(super) struct MachineQuery {
    /// A piece of a hostname, device id or reservation id.
    q: Option<String>,
    page: Option<i64>,
    /// What an action just did (`Done`).
    done: Option<String>,
}

#[derive(sqlx::FromRow)]
struct Row {
    machine_id: Uuid,
    provider_id: String,
    reservation_id: Option<Uuid>,
    hostname: Option<String>,
    assimilated_at: DateTime<Utc>,
    /// The provider's word for it at the last pass that listed it.
    status: Option<String>,
    seen_at: Option<DateTime<Utc>>,
    /// The latest pass that compared the listing with the managed machines
    /// found this one missing: its last sighting is no longer its state.
    missing: bool,
}

pub(super) async fn machines_page(
    State(state): State<HttpState>,
    headers: axum::http::HeaderMap,
    Query(query): Query<MachineQuery>,
) -> Result<Html<String>, Failure> {
    let number = query.page.unwrap_or(1);
    if number < 1 {
        return Err(Failure::BadRequest(format!(
            "page {number} is not a page: pages start at 1"
        )));
    }
    let q = query
        .q
        .as_deref()
        .map(str::trim)
        .filter(|q| !q.is_empty())
        .map(str::to_string);
    // A substring match, the pattern's own wildcards taken literally.
    let pattern = q.as_ref().map(|q| {
        let escaped = q
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        format!("%{escaped}%")
    });
    // A place as operators name it (`web/3`) finds the machine on it: its
    // unit's id is derived from the cluster's project and the place.
    let place = match q.as_deref().and_then(|q| q.split_once('/')) {
        Some((name, index)) => match index.parse::<u32>() {
            Ok(index) => crate::settings::Recorded::read(&state.pool)
                .await
                .ok()
                .filter(|r| r.provider.as_deref() == Some("latitude"))
                .and_then(|r| r.project)
                .map(|project| shepherd::latitude::provider::unit_id(&project, name, index)),
            Err(_) => None,
        },
        None => None,
    };
    let (total, rows): (i64, Vec<Row>) = {
        let total: i64 = sqlx::query_scalar(
            "select count(*) from shepherd.managed_machines
             where $1::text is null or hostname ilike $1 or provider_id ilike $1
                   or reservation_id::text ilike $1 or reservation_id = $2",
        )
        .bind(&pattern)
        .bind(place)
        .fetch_one(&state.pool)
        .await
        .map_err(|e| database_failure("machines", e))?;
        let rows = sqlx::query_as(
            "with last as (select event_type, body from shepherd.events
                           where event_type in ('discrepancy_found', 'reconcile_finished')
                           order by position desc limit 1)
             select m.machine_id, m.provider_id, m.reservation_id, m.hostname, m.assimilated_at,
                    s.status, s.seen_at,
                    coalesce((select event_type = 'discrepancy_found'
                                     and body->'missing_devices' ? m.provider_id from last),
                             false) as missing
             from shepherd.managed_machines m
             left join shepherd.machine_status s on s.provider_id = m.provider_id
             where $1::text is null or m.hostname ilike $1 or m.provider_id ilike $1
                   or m.reservation_id::text ilike $1 or m.reservation_id = $4
             order by m.assimilated_at desc, m.machine_id
             limit $2 offset $3",
        )
        .bind(&pattern)
        .bind(PAGE_SIZE)
        .bind((number - 1) * PAGE_SIZE)
        .bind(place)
        .fetch_all(&state.pool)
        .await
        .map_err(|e| database_failure("machines", e))?;
        (total, rows)
    };
    let pages = ((total + PAGE_SIZE - 1) / PAGE_SIZE).max(1);
    let actions = viewer(&state, &headers).await.may_act();
    let voice = state.voice();
    let words = &voice.words;
    let link = |page: i64| match &q {
        Some(q) => format!("/machines?page={page}&q={}", percent(q)),
        None => format!("/machines?page={page}"),
    };
    let body = html! {
        h1 { a href="/" { "shepherd" } " · machines" }
        (Done { done: query.done.clone() }.banner())
        form method="get" action="/machines" {
            input type="search" name="q" aria-label="Search machines" value=[q.as_deref()] placeholder={ "hostname, " (words.machine) " or " (words.unit) };
            " "
            button type="submit" { "Search" }
        }
        p.muted { (total) " machine(s)" @if q.is_some() { " matching" } "; page " (number) " of " (pages) "." }
        @if !rows.is_empty() {
            table {
                thead { tr {
                    th { "Machine" } th { (capital(words.machine)) } th { (capital(words.unit)) } th { "Hostname" } th { "Status (last pass)" } th { "Assimilated" }
                    @if actions { th { "Release" } }
                } }
                tbody {
                    @for m in &rows {
                        tr {
                            td.id { (m.machine_id) }
                            td { @if super::html::machine_id_ok(&m.provider_id) {
                                a.id href={ "/device/" (m.provider_id) } { (m.provider_id) }
                            } @else {
                                span.id { (m.provider_id) }
                            } }
                            td { @if let Some(r) = m.reservation_id { (unit_link(r, &voice)) } }
                            td { (m.hostname.as_deref().unwrap_or("")) }
                            td {
                                @match (&m.status, m.seen_at) {
                                    _ if m.missing => {
                                        strong { "missing at the provider" }
                                        @if let Some(at) = m.seen_at { " " span.muted { "(last listed " (ago(at, Utc::now())) ")" } }
                                    }
                                    (Some(status), Some(at)) => { (status) " " span.muted { (ago(at, Utc::now())) } }
                                    (None, Some(at)) => { span.muted { "listed " (ago(at, Utc::now())) } }
                                    _ => { span.muted { "not listed yet" } }
                                }
                            }
                            td { (Time(m.assimilated_at).to_string()) }
                            @if actions {
                                td {
                                    // Releasing says the device is gone: shepherd stops
                                    // managing it and passes stop reporting it missing.
                                    form.inline method="post" action="/actions/release" {
                                        input type="hidden" name="machine" value=(m.machine_id);
                                        input name="reason" aria-label="Reason (recorded with the action)" placeholder="why release" maxlength="1000" required;
                                        " " button type="submit" { "Release" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        p {
            @if number > 1 { a href=(link(number - 1)) { "← previous" } " " }
            @if number < pages { a href=(link(number + 1)) { "next →" } }
        }
    };
    Ok(layout("shepherd · machines", false, body))
}

/// Percent-encodes a query value (letters, digits and `-._~` stay).
pub(super) fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
