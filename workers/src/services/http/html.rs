//! The HTML the pages are made of: escaping, the layout, links to ids in
//! event bodies, and the event tables.

use super::*;

pub(super) const STYLE: &str = "
body { font: 14px/1.45 system-ui, sans-serif; color: #222; max-width: 88em; margin: 1em auto; padding: 0 1em; }
h1 { font-size: 1.5em; margin: 0 0 .1em; }
h2 { font-size: 1.1em; margin: 1.8em 0 .4em; padding-bottom: .2em; border-bottom: 1px solid #ddd; }
a { color: #0645ad; text-decoration: none; }
a:hover { text-decoration: underline; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: .25em .7em .25em 0; border-bottom: 1px solid #eee; }
thead th { font-weight: 600; color: #555; border-bottom: 1px solid #ccc; }
table.facts { width: auto; }
table.facts th { font-weight: normal; color: #555; padding-right: 2em; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.id, .body, td.n { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
.body .k { color: #777; }
.muted { color: #777; }
.alarm { background: #c00; color: #fff; padding: .8em 1em; margin: 1em 0; font-size: 1.15em; }
.alarm a { color: #fff; text-decoration: underline; }
.alarm ul { margin: .3em 0 0; }
.warn { background: #fff4d6; border: 1px solid #e5c56b; padding: .6em 1em; margin: 1em 0; }
.ok { color: #161; }
";

/// HTML-escapes text for element content and quoted attribute values.
pub(super) struct Esc<'a>(pub(super) &'a str);

impl Display for Esc<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(i) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..i])?;
            f.write_str(match rest.as_bytes()[i] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[i + 1..];
        }
        f.write_str(rest)
    }
}

pub(super) struct Layout<'a, B> {
    pub(super) title: &'a str,
    pub(super) refresh: bool,
    pub(super) body: B,
}

impl<'a, B: Display> Layout<'a, B> {
    pub(super) fn new(title: &'a str, body: B) -> Self {
        Layout {
            title,
            refresh: false,
            body,
        }
    }

    pub(super) fn refreshing(mut self) -> Self {
        self.refresh = true;
        self
    }
}

impl<B: Display> Display for Layout<'_, B> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        )?;
        if self.refresh {
            f.write_str("<meta http-equiv=\"refresh\" content=\"5\">\n")?;
        }
        write!(
            f,
            "<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{}</body>\n</html>\n",
            Esc(self.title),
            self.body
        )
    }
}

pub(super) struct Message<'a>(pub(super) &'a str);

impl Display for Message<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "<h1><a href=\"/\">shepherd</a></h1>\n<p>{}</p>\n",
            Esc(self.0)
        )
    }
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
pub(super) struct Link(pub(super) Kind, pub(super) Uuid);

impl Display for Link {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let Link(kind, id) = self;
        write!(f, "<a class=\"id\" href=\"/{kind}/{id}\">{id}</a>")
    }
}

/// A device id as the views keep it (a string, per provider): linked when
/// it is one of Metal's UUIDs.
pub(super) struct DeviceId<'a>(pub(super) &'a str);

impl Display for DeviceId<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self.0.parse() {
            Ok(id) => Link(Kind::Device, id).fmt(f),
            Err(_) => write!(f, "<span class=\"id\">{}</span>", Esc(self.0)),
        }
    }
}

/// A stream name, linked when it is a reservation's or a device's.
pub(super) struct StreamName<'a>(pub(super) &'a str);

impl Display for StreamName<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let link = self.0.split_once('/').and_then(|(kind, id)| {
            let kind = match kind {
                "reservation" => Kind::Reservation,
                "device" => Kind::Device,
                _ => return None,
            };
            Some(Link(kind, id.parse().ok()?))
        });
        match link {
            Some(link) => write!(f, "{}/{link}", link.0),
            None => write!(f, "<span class=\"id\">{}</span>", Esc(self.0)),
        }
    }
}

pub(super) struct Time(pub(super) DateTime<Utc>);

impl Display for Time {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.format("%Y-%m-%d %H:%M:%S UTC"))
    }
}

/// A time with how long ago it was, by the database's clock.
pub(super) struct Ago(pub(super) DateTime<Utc>, pub(super) DateTime<Utc>);

impl Display for Ago {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let Ago(at, now) = *self;
        write!(
            f,
            "{} <span class=\"muted\">({} ago)</span>",
            Time(at),
            human_duration(now - at)
        )
    }
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
pub(super) struct Body<'a>(pub(super) &'a Value);

impl Display for Body<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let Value::Object(fields) = self.0 else {
            return Esc(&self.0.to_string()).fmt(f);
        };
        for (i, (field, value)) in fields.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "<span class=\"k\">{}</span>=", Esc(field))?;
            field_value(f, id_kind(field), value)?;
        }
        Ok(())
    }
}

pub(super) fn field_value(f: &mut Formatter<'_>, kind: Option<Kind>, value: &Value) -> fmt::Result {
    match (kind, value) {
        (Some(kind), Value::String(s)) => match s.parse() {
            Ok(id) => Link(kind, id).fmt(f),
            Err(_) => Esc(s).fmt(f),
        },
        (Some(_), Value::Array(items)) => {
            f.write_str("[")?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                field_value(f, kind, item)?;
            }
            f.write_str("]")
        }
        (_, Value::String(s)) => Esc(s).fmt(f),
        (_, Value::Object(_)) => write!(f, "{{{}}}", Body(value)),
        (_, other) => Esc(&other.to_string()).fmt(f),
    }
}

pub(super) struct EventTable<'a> {
    pub(super) rows: &'a [EventRow],
    /// Off where the page is about one stream already.
    pub(super) with_stream: bool,
}

impl Display for EventTable<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let with_stream = self.with_stream;
        f.write_str("<table>\n<thead><tr><th>#</th><th>Recorded</th><th>Event</th>")?;
        if with_stream {
            f.write_str("<th>Stream</th>")?;
        }
        f.write_str("<th>Details</th></tr></thead>\n<tbody>\n")?;
        for e in self.rows {
            write!(
                f,
                "<tr><td class=\"n\">{}</td><td>{}</td><td>{}",
                e.position,
                Time(e.recorded_at),
                Esc(&e.event_type)
            )?;
            if let Some(job) = &e.job_id {
                write!(
                    f,
                    " <a class=\"muted\" href=\"/jobs/{}\">(job)</a>",
                    Esc(job)
                )?;
            }
            f.write_str("</td>")?;
            if with_stream {
                match &e.stream {
                    Some(s) => write!(f, "<td>{}</td>", StreamName(s))?,
                    None => f.write_str("<td></td>")?,
                }
            }
            writeln!(f, "<td class=\"body\">{}</td></tr>", Body(&e.body))?;
        }
        f.write_str("</tbody>\n</table>\n")
    }
}

pub(super) struct HistoryPage<'a> {
    pub(super) kind: Kind,
    pub(super) id: Uuid,
    pub(super) rows: &'a [EventRow],
}

impl Display for HistoryPage<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "<h1><a href=\"/\">shepherd</a> · {} <span class=\"id\">{}</span></h1>",
            self.kind, self.id
        )?;
        writeln!(
            f,
            "<p class=\"muted\">{} events, oldest first.</p>",
            self.rows.len()
        )?;
        EventTable {
            rows: self.rows,
            with_stream: false,
        }
        .fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            Esc(r#"<a href="x">Tom & 'Jerry'</a>"#).to_string(),
            "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt;"
        );
        assert_eq!(Esc("plain").to_string(), "plain");
    }

    #[test]
    fn links_ids_in_bodies_and_escapes_the_rest() {
        let device = Uuid::new_v4();
        let body = serde_json::json!({
            "device": device,
            "unknown_devices": [device],
            "reason": "<b>",
            "run": "not-a-link",
        });
        let html = Body(&body).to_string();
        assert_eq!(
            html.matches(&format!("href=\"/device/{device}\"")).count(),
            2
        );
        assert!(html.contains("&lt;b&gt;"));
        assert!(!html.contains("<b>"));
    }
}
