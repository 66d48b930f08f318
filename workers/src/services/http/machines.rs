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
    /// Scale-in protection: shepherd does not delete it.
    protected: bool,
    /// A deletion is pending: it is leaving.
    leaving: bool,
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
        let rows = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "with last as (select event_type, body from shepherd.events
                           where event_type in ('discrepancy_found', 'reconcile_finished')
                           order by position desc limit 1)
             select m.machine_id, m.provider_id, m.reservation_id, m.hostname, m.assimilated_at,
                    s.status, s.seen_at,
                    coalesce((select event_type = 'discrepancy_found'
                                     and body->'missing_devices' ? m.provider_id from last),
                             false) as missing,
                    {protected} as protected,
                    exists (select 1 from shepherd.pending_deletions d
                            where d.machine_id = m.machine_id) as leaving
             from shepherd.managed_machines m
             left join shepherd.machine_status s on s.provider_id = m.provider_id
             where $1::text is null or m.hostname ilike $1 or m.provider_id ilike $1
                   or m.reservation_id::text ilike $1 or m.reservation_id = $4
             order by m.assimilated_at desc, m.machine_id
             limit $2 offset $3",
            protected = shepherd::fleet::PROTECTED
        )))
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
        @if actions {
            p.muted { "Deprovision deletes the machine through its deletion job, which checks the request again first; a protected machine is never deleted by shepherd; release stops managing a machine the provider no longer has." }
        }
        form method="get" action="/machines" {
            input type="search" name="q" aria-label="Search machines" value=[q.as_deref()] placeholder={ "hostname, " (words.machine) " or " (words.unit) };
            " "
            button type="submit" { "Search" }
        }
        p.muted.count { (total) " machine(s)" @if q.is_some() { " matching" } "; page " (number) " of " (pages) "." }
        @if !rows.is_empty() {
            table.stack {
                thead { tr {
                    th { "Machine" } th { (capital(words.machine)) } th { (capital(words.unit)) } th { "Hostname" } th { "Status (last pass)" } th { "Assimilated" }
                    @if actions { th { "Act (one reason, then a button)" } }
                } }
                tbody {
                    @for m in &rows {
                        tr {
                            td.id data-label="Machine" { (m.machine_id) }
                            td data-label=(capital(words.machine)) { @if super::html::machine_id_ok(&m.provider_id) {
                                a.id href={ "/device/" (m.provider_id) } { (m.provider_id) }
                            } @else {
                                span.id { (m.provider_id) }
                            } }
                            td data-label=(capital(words.unit)) { @if let Some(r) = m.reservation_id { (unit_link(r, &voice)) } }
                            td data-label="Hostname" {
                                (m.hostname.as_deref().unwrap_or(""))
                                @if m.protected { " " strong.protected { "protected" } }
                                @if m.leaving { " " strong.leaving { "leaving" } }
                            }
                            td data-label="Status" {
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
                            td data-label="Assimilated" { (Time(m.assimilated_at).to_string()) }
                            @if actions {
                                // Releasing says the device is gone: shepherd stops
                                // managing it and passes stop reporting it missing.
                                td data-label="Act" { (super::fleet_actions::machine_forms(m.machine_id, m.protected)) }
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
