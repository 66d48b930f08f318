//! The pieces the pages are made of, as maud templates (which escape every
//! value they are given): the layout, links to ids in event bodies, times,
//! and the event tables.

use maud::{DOCTYPE, Markup, PreEscaped, html};

use super::*;

pub(super) const STYLE: &str = "
body { font: 14px/1.45 system-ui, sans-serif; color: #222; max-width: 88em; margin: 1em auto; padding: 0 1em; }
h1 { font-size: 1.5em; margin: 0 0 .1em; }
h2 { font-size: 1.1em; margin: 1.8em 0 .4em; padding-bottom: .2em; border-bottom: 1px solid #ddd; }
a { color: #0645ad; text-decoration: none; }
a:hover { text-decoration: underline; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: .25em .7em .25em 0; border-bottom: 1px solid #eee; overflow-wrap: anywhere; }
thead th { font-weight: 600; color: #555; border-bottom: 1px solid #ccc; }
nav.top { margin: 0 0 .8em; padding-bottom: .4em; border-bottom: 1px solid #ddd; }
nav.top a { margin-right: 1em; }
table.facts { width: auto; }
table.facts th { font-weight: normal; color: #555; padding-right: 2em; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.id, .body, td.n { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
.body .k { color: #666; }
.muted { color: #666; }
.alarm { background: #c00; color: #fff; padding: .8em 1em; margin: 1em 0; font-size: 1.15em; }
.alarm a { color: #fff; text-decoration: underline; }
.alarm ul { margin: .3em 0 0; }
.warn { background: #fff4d6; border: 1px solid #e5c56b; padding: .6em 1em; margin: 1em 0; }
.ok { color: #161; }
.said { font-size: 1.1em; }
.done { background: #e6f4ea; border: 1px solid #7bb98a; padding: .5em 1em; margin: .8em 0; }
form.inline { display: inline-block; margin: 0 1em .5em 0; }
button.danger { color: #a00; }
@media (max-width: 700px) {
  table { display: block; overflow-x: auto; }
  body { padding: 0 .5em; }
  table.stack, table.stack tbody, table.stack tr, table.stack td { display: block; width: auto; overflow: visible; }
  table.stack thead { position: absolute; width: 1px; height: 1px; overflow: hidden; clip-path: inset(50%); }
  table.stack tr { padding: .5em 0; border-bottom: 1px solid #ccc; }
  table.stack td { border: none; padding: .1em 0; text-align: left; }
  table.stack td:empty { display: none; }
  table.stack td[data-label]::before { content: attr(data-label) ': '; color: #555; font-family: system-ui, sans-serif; }
  form.inline { display: block; }
}
@media (prefers-color-scheme: dark) {
  body { background: #121212; color: #e4e4e4; }
  a { color: #8ab4f8; }
  h2, nav.top { border-color: #444; }
  th, td { border-color: #333; }
  thead th, table.facts th { color: #bbb; border-color: #555; }
  table.stack td[data-label]::before { color: #bbb; }
  .muted, .body .k { color: #aaa; }
  .warn { background: #3a3000; border-color: #8a7a2a; }
  .done { background: #12351d; border-color: #3d7a4d; }
  .ok { color: #7c7; }
  input, button { background: #222; color: #e4e4e4; border: 1px solid #555; }
  button.danger { color: #f88; }
}
";

/// Brings the page up to date every 5 s in place: the page is fetched
/// again and its content swapped in, so the scroll position stays; not
/// while the operator is in the middle of a form (a field with focus, text
/// typed, a box ticked) or has text selected (an id to copy). A failed
/// fetch leaves the page as it was. Without scripts a
/// `<meta http-equiv=refresh>` reloads it instead.
const RELOAD: &str = "setInterval(function () {
  var busy = document.activeElement && document.activeElement.form;
  document.querySelectorAll('input[type=text], input[type=password], input[type=search], input:not([type])')
    .forEach(function (field) { if (field.value) { busy = true; } });
  document.querySelectorAll('input[type=checkbox]')
    .forEach(function (box) { if (box.checked) { busy = true; } });
  var selection = window.getSelection && window.getSelection().toString();
  if (busy || selection || document.hidden) { return; }
  fetch(location.href, { headers: { 'Accept': 'text/html' } })
    .then(function (r) { return r.ok ? r.text() : null; })
    .then(function (html) {
      if (!html) { return; }
      var fresh = new DOMParser().parseFromString(html, 'text/html');
      var x = window.scrollX, y = window.scrollY;
      document.body.innerHTML = fresh.body.innerHTML;
      window.scrollTo(x, y);
    })
    .catch(function () {});
}, 5000);";

/// A whole page: `body` inside the shared head and style. `refresh`
/// reloads it every 5 s (the status page) while no form is being filled.
pub(super) fn layout(title: &str, refresh: bool, body: Markup) -> Html<String> {
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if refresh {
                    noscript { meta http-equiv="refresh" content="5"; }
                    script { (PreEscaped(RELOAD)) }
                }
                title { (title) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                nav.top {
                    a href="/" { "Overview" }
                    a href="/jobs" { "Jobs" }
                    a href="/machines" { "Machines" }
                    a href="/events" { "Events" }
                    a href="/charts" { "Charts" }
                }
                (body)
            }
        }
    };
    Html(neutral_marks(page.into_string()))
}

/// The page with every invisible mark that reorders or hides text on screen
/// (bidirectional controls such as U+202E, zero-width characters) shown as
/// `[U+202E]`: a reason, a name or a provider's text holding one cannot
/// make what a page shows read otherwise than what it holds. The pages'
/// own text has none.
pub(super) fn neutral_marks(page: String) -> String {
    let hidden = |c: char| {
        matches!(
            c,
            '\u{061c}'
                | '\u{200b}'..='\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{feff}'
        )
    };
    if !page.contains(hidden) {
        return page;
    }
    let mut shown = String::with_capacity(page.len() + 16);
    for c in page.chars() {
        if hidden(c) {
            shown.push_str(&format!("[U+{:04X}]", c as u32));
        } else {
            shown.push(c);
        }
    }
    shown
}

/// A page that only says something (an error's explanation).
pub(super) fn message(title: &str, text: &str) -> Html<String> {
    message_back(title, text, None)
}

/// The same, with a link back to the page an action's form was on.
pub(super) fn message_back(title: &str, text: &str, back: Option<&str>) -> Html<String> {
    layout(
        title,
        false,
        html! {
            h1 { a href="/" { "shepherd" } " · " (title) }
            p.said role="alert" { (text) }
            @if let Some(back) = back {
                p { a.back href=(back) { "Back to the page you came from" } }
            }
        },
    )
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Kind {
    Reservation,
    Device,
}

impl Display for Kind {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Reservation => "reservation",
            Kind::Device => "device",
        })
    }
}

/// An id linking to its history page.
pub(super) fn link(kind: Kind, id: impl Display) -> Markup {
    html! { a.id href={ "/" (kind) "/" (id) } { (id) } }
}

/// A unit linking to its history page: by its readable name where the
/// provider has one (a Latitude place, `web/3`), else by its id.
pub(super) fn unit_link(unit: Uuid, voice: &Voice) -> Markup {
    match voice.label(unit) {
        Some(label) => html! { a.id href={ "/reservation/" (unit) } title=(unit) { (label) } },
        None => link(Kind::Reservation, unit),
    }
}

/// Whether `raw` is a machine id a page may name in a path: any provider's
/// (a Metal UUID, a Latitude `sv_...`), never a path of its own.
pub(super) fn machine_id_ok(raw: &str) -> bool {
    !raw.is_empty()
        && raw.len() <= 100
        && raw
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

/// A machine id as the views keep it (the provider's, as text), linked to
/// its history.
pub(super) fn device_id(raw: &str) -> Markup {
    if machine_id_ok(raw) {
        link(Kind::Device, raw)
    } else {
        html! { span.id { (raw) } }
    }
}

/// A stream name, linked when it is a reservation's or a device's.
pub(super) fn stream_name(name: &str) -> Markup {
    let linked = name.split_once('/').and_then(|(kind, id)| match kind {
        "reservation" => id.parse::<Uuid>().ok().map(|_| (Kind::Reservation, id)),
        "device" if machine_id_ok(id) => Some((Kind::Device, id)),
        _ => None,
    });
    match linked {
        Some((kind, id)) => html! { (kind) "/" (link(kind, id)) },
        None => html! { span.id { (name) } },
    }
}

pub(super) struct Time(pub(super) DateTime<Utc>);

impl Display for Time {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.format("%Y-%m-%d %H:%M:%S UTC"))
    }
}

/// A time with how long ago it was, by the database's clock.
pub(super) fn ago(at: DateTime<Utc>, now: DateTime<Utc>) -> Markup {
    html! { (Time(at).to_string()) " " span.muted { "(" (human_duration(now - at)) " ago)" } }
}

/// One event as the tables show it.
pub(super) struct EventRow {
    pub(super) position: i64,
    pub(super) recorded_at: DateTime<Utc>,
    pub(super) event_type: String,
    /// `None` where the source does not say (the device history).
    pub(super) stream: Option<String>,
    pub(super) body: Value,
    /// The job whose run recorded it, where one did.
    pub(super) job_id: Option<String>,
}

impl From<StoredEvent> for EventRow {
    fn from(e: StoredEvent) -> Self {
        EventRow {
            position: e.position,
            recorded_at: e.recorded_at,
            event_type: e.event.type_name().to_string(),
            body: e.event.body(),
            stream: Some(e.stream),
            job_id: e.job_id,
        }
    }
}

/// The fields that hold ids, by what they identify.
pub(super) fn id_kind(field: &str) -> Option<Kind> {
    match field {
        "reservation" | "reservations" => Some(Kind::Reservation),
        "device" | "other_device" | "unknown_devices" | "missing_devices" | "provider_id" => {
            Some(Kind::Device)
        }
        _ => None,
    }
}

/// An event body as `field=value` pairs, ids linked.
pub(super) fn body(value: &Value) -> Markup {
    let Value::Object(fields) = value else {
        return html! { (value.to_string()) };
    };
    html! {
        @for (i, (field, v)) in fields.iter().enumerate() {
            @if i > 0 { " " }
            span.k { (field) } "="
            @match (field.as_str(), v) {
                // A job named by an operator's retry or cancel.
                ("job", Value::String(job)) => a.id href={ "/jobs/" (job) } { (job) },
                _ => (field_value(id_kind(field), v)),
            }
        }
    }
}

pub(super) fn field_value(kind: Option<Kind>, value: &Value) -> Markup {
    match (kind, value) {
        (Some(Kind::Reservation), Value::String(s)) => match s.parse::<Uuid>() {
            Ok(id) => link(Kind::Reservation, id),
            Err(_) => html! { (s) },
        },
        (Some(Kind::Device), Value::String(s)) => device_id(s),
        (Some(_), Value::Array(items)) => html! {
            "["
            @for (i, item) in items.iter().enumerate() {
                @if i > 0 { ", " }
                (field_value(kind, item))
            }
            "]"
        },
        (_, Value::String(s)) => html! { (s) },
        (_, Value::Object(_)) => html! { "{" (body(value)) "}" },
        (_, other) => html! { (other.to_string()) },
    }
}

/// The events of `rows`; the stream column is left out where the page is
/// about one stream already.
pub(super) fn event_table(rows: &[EventRow], with_stream: bool) -> Markup {
    html! {
        table.events {
            thead { tr {
                th { "#" } th { "Recorded" } th { "Event" }
                @if with_stream { th { "Stream" } }
                th { "Details" }
            } }
            tbody {
                @for e in rows {
                    tr {
                        td.n { (e.position) }
                        td { (Time(e.recorded_at).to_string()) }
                        td {
                            (e.event_type)
                            @if let Some(job) = &e.job_id {
                                " " a.muted href={ "/jobs/" (job) } { "(job)" }
                            }
                        }
                        @if with_stream {
                            td { @if let Some(s) = &e.stream { (stream_name(s)) } }
                        }
                        td.body { (body(&e.body)) }
                    }
                }
            }
        }
    }
}

/// One reservation's or device's events.
pub(super) fn history_page(kind: Kind, id: &str, label: Option<&str>, rows: &[EventRow]) -> Markup {
    html! {
        h1 {
            a href="/" { "shepherd" } " · " (kind) " " span.id { (id) }
            @if let Some(label) = label { " " span.label { "(" (label) ")" } }
        }
        p.muted { (rows.len()) " events, oldest first." }
        (event_table(rows, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_by_the_templates() {
        let page = message("t", r#"<a href="x">Tom & 'Jerry'</a>"#).0;
        assert!(
            page.contains("&lt;a href=&quot;x&quot;&gt;Tom &amp; 'Jerry'&lt;/a&gt;"),
            "{page}"
        );
        assert!(!page.contains("<a href=\"x\">"));
    }

    #[test]
    fn links_ids_in_bodies_and_escapes_the_rest() {
        let device = Uuid::new_v4();
        let value = serde_json::json!({
            "device": device,
            "unknown_devices": [device],
            "reason": "<b>",
            "run": "not-a-link",
        });
        let html = body(&value).into_string();
        assert_eq!(
            html.matches(&format!("href=\"/device/{device}\"")).count(),
            2
        );
        assert!(html.contains("&lt;b&gt;"));
        assert!(!html.contains("<b>"));
    }
}
