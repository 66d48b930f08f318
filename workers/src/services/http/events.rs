//! `/events`: the whole log, newest first, filtered by stream (one, or all
//! of a kind: `reservation/`) and by type, a page at a time; each event
//! links the job that recorded it and the ids it names.

use maud::html;
use serde::Deserialize;

use super::*;

const PAGE_SIZE: i64 = 100;
/// The kinds of stream, for the filter's choices.
const STREAM_KINDS: [&str; 8] = [
    "reconcile/",
    "reservation/",
    "device/",
    "ssh_key/",
    "operator/controls",
    "operator/settings",
    "operator/views",
    "operator/jobs",
];

#[derive(Debug, Default, Deserialize)]
pub(super) struct EventFilter {
    stream: Option<String>,
    #[serde(rename = "type")]
    event_type: Option<String>,
    before: Option<i64>,
}

pub(super) async fn events_page(
    State(state): State<HttpState>,
    Query(filter): Query<EventFilter>,
) -> Result<Html<String>, Failure> {
    let stream = filter
        .stream
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty());
    if stream.is_some_and(|s| s.len() > 200) {
        return Err(Failure::BadRequest(
            "a stream name is at most 200 characters".into(),
        ));
    }
    let event_type = filter.event_type.as_deref().filter(|t| !t.is_empty());
    if let Some(t) = event_type
        && !Event::TYPE_NAMES.contains(&t)
    {
        return Err(Failure::BadRequest(format!(
            "type {t:?} is not an event type: {}",
            Event::TYPE_NAMES.join(", ")
        )));
    }
    let rows = store::read_filtered(
        &state.pool,
        stream,
        event_type,
        filter.before,
        PAGE_SIZE + 1,
    )
    .await
    .map_err(|e| store_failure("events", e))?;
    let more = rows.len() as i64 > PAGE_SIZE;
    let rows: Vec<EventRow> = rows
        .into_iter()
        .take(PAGE_SIZE as usize)
        .map(EventRow::from)
        .collect();
    let older = rows.last().map(|e| e.position).filter(|_| more);
    let link = |before: i64| {
        let mut q = vec![format!("before={before}")];
        if let Some(s) = stream {
            q.push(format!("stream={}", percent(s)));
        }
        if let Some(t) = event_type {
            q.push(format!("type={t}"));
        }
        format!("/events?{}", q.join("&"))
    };
    let mut types = Event::TYPE_NAMES.to_vec();
    types.sort_unstable();
    let body = html! {
        h1 { a href="/" { "shepherd" } " · events" }
        form method="get" action="/events" {
            "Stream "
            input name="stream" aria-label="Stream" list="stream-kinds" value=[stream] placeholder="any, or e.g. reservation/ or device/<id>";
            datalist id="stream-kinds" { @for k in STREAM_KINDS { option value=(k) {} } }
            " type "
            select name="type" {
                option value="" { "any" }
                @for t in &types {
                    option value=(t) selected[event_type == Some(*t)] { (t) }
                }
            }
            " "
            button type="submit" { "Show" }
        }
        @if rows.is_empty() {
            p.muted { "No events match." }
        } @else {
            p.muted { "Newest first." }
            (event_table(&rows, true))
        }
        p {
            @if filter.before.is_some() { a href="/events" { "← newest" } " " }
            @if let Some(p) = older { a href=(link(p)) { "older →" } }
        }
    };
    Ok(layout("shepherd · events", false, body))
}
