//! The status page's body: alarms, the fleet, the last pass, penalties,
//! the queue, the workers and the machines.

use super::*;
use shepherd::fleet::WorkerRow;

pub(super) struct StatusPage<'a> {
    pub(super) overview: &'a Overview,
    pub(super) machines: &'a [ManagedMachine],
    pub(super) events: &'a [EventRow],
}

impl Display for StatusPage<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let o = self.overview;
        writeln!(
            f,
            "<h1>shepherd</h1>\n<p class=\"muted\">As of {}; this page refreshes every 5 s.</p>",
            Time(o.now)
        )?;
        self.alarms(f)?;
        self.fleet(f)?;
        self.last_reconcile(f)?;
        self.penalties(f)?;
        self.queue(f)?;
        self.workers(f)?;
        self.machines(f)?;
        writeln!(
            f,
            "<h2>Recent events <span class=\"muted\">(newest first; passes are summed up above)</span></h2>"
        )?;
        if self.events.is_empty() {
            f.write_str("<p class=\"muted\">The log is empty.</p>\n")
        } else {
            EventTable {
                rows: self.events,
                with_stream: true,
            }
            .fmt(f)
        }
    }
}

impl StatusPage<'_> {
    pub(super) fn alarms(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let o = self.overview;
        if let Some(d) = o
            .last_reconcile
            .as_ref()
            .and_then(|r| r.discrepancy.as_ref())
        {
            f.write_str(
                "<div class=\"alarm\"><strong>DISCREPANCY:</strong> the provider and shepherd \
                 disagree about which machines exist. The last reconcile refused to do any \
                 work, and passes keep refusing while this lasts.\n<ul>\n",
            )?;
            if !d.unknown_devices.is_empty() {
                f.write_str("<li>Unknown devices (ours by name, managed by nobody): ")?;
                field_value(f, Some(Kind::Device), &serde_json::json!(d.unknown_devices))?;
                f.write_str("</li>\n")?;
            }
            if !d.missing_devices.is_empty() {
                f.write_str("<li>Missing devices (managed, gone from the provider): ")?;
                field_value(f, Some(Kind::Device), &serde_json::json!(d.missing_devices))?;
                f.write_str("</li>\n")?;
            }
            f.write_str("</ul></div>\n")?;
        }
        if let Some(limit) = o.max_machines.filter(|l| *l > 0) {
            let used = o.managed + o.in_flight();
            if used > limit as i64 {
                writeln!(
                    f,
                    "<div class=\"alarm\"><strong>OVER THE LIMIT:</strong> {used} machines managed \
                     or in flight against a limit of {limit}. Nothing is admitted until the fleet \
                     is back under it (the limit was lowered, or machines were added by hand).</div>"
                )?;
            }
        }
        let stalled = match o.last_successful_reconcile {
            Some(at) => (o.now - at).num_seconds() > STALLED_AFTER_SECONDS,
            None => false,
        };
        if stalled && o.paused.is_none() {
            writeln!(
                f,
                "<div class=\"alarm\"><strong>NO SUCCESSFUL PASS</strong> since {}: no scheduler or \
                 worker is running passes, or every pass is refused (a listing failing, a \
                 discrepancy).</div>",
                Ago(o.last_successful_reconcile.unwrap_or(o.now), o.now)
            )?;
        }
        if let Some(oldest) = o.unresolved.first() {
            write!(
                f,
                "<div class=\"warn\"><strong>{} creation(s) with an unknown outcome</strong>, \
                 the oldest for {}; each holds its slot until a look at the provider settles it:",
                o.unresolved.len(),
                human_duration(chrono::TimeDelta::seconds(oldest.seconds as i64))
            )?;
            for u in &o.unresolved {
                write!(f, " {}", Link(Kind::Reservation, u.reservation_id))?;
            }
            f.write_str("</div>\n")?;
        }
        if let Some(p) = &o.paused {
            writeln!(
                f,
                "<div class=\"warn\"><strong>Creations are paused</strong> by {} since {}: {}</div>",
                Esc(&p.by),
                Ago(p.since, o.now),
                Esc(&p.reason)
            )?;
        }
        Ok(())
    }

    pub(super) fn fleet(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let o = self.overview;
        f.write_str("<h2>Fleet</h2>\n<table class=\"facts\">\n")?;
        writeln!(
            f,
            "<tr><th>Managed machines</th><td>{}</td></tr>",
            o.managed
        )?;
        match o.max_machines {
            Some(limit) => writeln!(f, "<tr><th>Machine limit</th><td>{limit}</td></tr>")?,
            None => writeln!(
                f,
                "<tr><th>Machine limit</th><td class=\"muted\">no settings recorded yet</td></tr>"
            )?,
        }
        writeln!(
            f,
            "<tr><th>In flight</th><td>{} <span class=\"muted\">(pending creations: {}, \
             devices awaiting assimilation: {})</span></td></tr>",
            o.in_flight(),
            o.pending_creations,
            o.unassimilated_devices
        )?;
        if let Some(oldest) = o.unresolved.first() {
            writeln!(
                f,
                "<tr><th>Unresolved creations</th><td><strong>{}</strong> \
                 <span class=\"muted\">(outcome unknown, settled by looking; oldest {}: {})</span></td></tr>",
                o.unresolved.len(),
                Esc(&format!("{:.0} s", oldest.seconds)),
                Esc(oldest.last_error.as_deref().unwrap_or(""))
            )?;
        }
        match &o.paused {
            Some(_) => writeln!(
                f,
                "<tr><th>Creations</th><td><strong>paused</strong></td></tr>"
            )?,
            None => writeln!(
                f,
                "<tr><th>Creations</th><td class=\"ok\">running</td></tr>"
            )?,
        }
        writeln!(
            f,
            "<tr><th>Penalised reservations</th><td>{}</td></tr>",
            o.penalised.len()
        )?;
        match o.last_successful_reconcile {
            Some(at) => writeln!(
                f,
                "<tr><th>Last successful reconcile</th><td>{}</td></tr>",
                Ago(at, o.now)
            )?,
            None => writeln!(
                f,
                "<tr><th>Last successful reconcile</th><td class=\"muted\">never</td></tr>"
            )?,
        }
        writeln!(
            f,
            "<tr><th>Events in the log</th><td>{}</td></tr>",
            o.events
        )?;
        f.write_str("</table>\n")
    }

    pub(super) fn last_reconcile(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let o = self.overview;
        f.write_str("<h2>Last reconcile</h2>\n")?;
        let Some(r) = &o.last_reconcile else {
            return f.write_str("<p class=\"muted\">No pass has run yet.</p>\n");
        };
        writeln!(
            f,
            "<table class=\"facts\">\n<tr><th>Run</th><td class=\"id\">{}</td></tr>\n\
             <tr><th>Started</th><td>{}</td></tr>",
            r.run,
            Ago(r.started_at, o.now)
        )?;
        if let Some(reason) = &r.refused {
            writeln!(
                f,
                "<tr><th>Outcome</th><td><strong>refused:</strong> {}</td></tr>",
                Esc(reason)
            )?;
        }
        match &r.finished {
            Some(done) => writeln!(
                f,
                "<tr><th>Finished</th><td>{} managed, {} in flight, {} creations enqueued{}</td></tr>",
                done.managed,
                done.in_flight,
                done.enqueued,
                if done.at_limit { "; at the limit" } else { "" }
            )?,
            None if r.refused.is_none() => {
                writeln!(f, "<tr><th>Outcome</th><td>still running</td></tr>")?
            }
            None => {}
        }
        f.write_str("</table>\n")
    }

    pub(super) fn penalties(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let o = self.overview;
        f.write_str("<h2>Penalised reservations</h2>\n")?;
        if o.penalised.is_empty() {
            return f.write_str("<p class=\"muted\">None.</p>\n");
        }
        f.write_str(
            "<table>\n<thead><tr><th>Reservation</th><th>Time left</th><th>Until</th>\
             <th>Failures</th><th>Cause</th></tr></thead>\n<tbody>\n",
        )?;
        for p in &o.penalised {
            writeln!(
                f,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                Link(Kind::Reservation, p.reservation_id),
                human_duration(chrono::TimeDelta::seconds(p.seconds_left)),
                Time(p.until),
                p.failures,
                Esc(&p.cause)
            )?;
        }
        f.write_str("</tbody>\n</table>\n")
    }

    pub(super) fn queue(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let o = self.overview;
        f.write_str("<h2>Queue <a class=\"muted\" href=\"/jobs\">(all jobs)</a></h2>\n")?;
        if o.queue.is_empty() {
            return f.write_str("<p class=\"muted\">No jobs.</p>\n");
        }
        f.write_str(
            "<table>\n<thead><tr><th>Kind</th><th>State</th><th>Jobs</th>\
             <th>Oldest</th></tr></thead>\n<tbody>\n",
        )?;
        for q in &o.queue {
            write!(
                f,
                "<tr><td>{kind}</td><td><a href=\"/jobs?kind={kind}&amp;state={state}\">{state}</a></td>\
                 <td class=\"n\">{}</td><td>",
                q.jobs,
                kind = Esc(&q.kind),
                state = Esc(&q.state),
            )?;
            if let Some(s) = q.oldest_seconds {
                f.write_str(&human_duration(chrono::TimeDelta::seconds(s as i64)))?;
            }
            f.write_str("</td></tr>\n")?;
        }
        f.write_str("</tbody>\n</table>\n")
    }

    pub(super) fn workers(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let o = self.overview;
        f.write_str("<h2>Workers</h2>\n")?;
        let (live, gone): (Vec<_>, Vec<_>) = o.workers.iter().partition(|w| is_live(w, &o.workers));
        if live.is_empty() {
            f.write_str("<p class=\"muted\">None running.</p>\n")?;
        } else {
            worker_table(f, &live)?;
        }
        if !gone.is_empty() {
            f.write_str(
                "<p class=\"muted\">Silent for over a minute, or replaced by a later \
                 generation of the same process (their jobs are handed to live workers):</p>\n",
            )?;
            worker_table(f, &gone)?;
        }
        Ok(())
    }

    pub(super) fn machines(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let total = self.overview.managed.max(0) as usize;
        writeln!(
            f,
            "<h2>Managed machines ({total}) <a class=\"muted\" href=\"/machines\">(all, searchable)</a></h2>"
        )?;
        if self.machines.is_empty() {
            return f.write_str("<p class=\"muted\">None.</p>\n");
        }
        if total > STATUS_MACHINES {
            writeln!(
                f,
                "<p class=\"muted\">The {STATUS_MACHINES} assimilated last; \
                 <a href=\"/machines\">all {total}</a>.</p>"
            )?;
        }
        f.write_str(
            "<table>\n<thead><tr><th>Machine</th><th>Device</th><th>Reservation</th>\
             <th>Hostname</th><th>Assimilated</th></tr></thead>\n<tbody>\n",
        )?;
        for m in self.machines {
            write!(
                f,
                "<tr><td class=\"id\">{}</td><td>{}</td><td>",
                m.machine_id,
                DeviceId(&m.provider_id)
            )?;
            if let Some(r) = m.reservation_id {
                Link(Kind::Reservation, r).fmt(f)?;
            }
            writeln!(
                f,
                "</td><td>{}</td><td>{}</td></tr>",
                Esc(m.hostname.as_deref().unwrap_or("")),
                Time(m.assimilated_at)
            )?;
        }
        f.write_str("</tbody>\n</table>\n")
    }
}

/// Machines listed on the status page; `/machines` has them all.
pub(super) const STATUS_MACHINES: usize = 50;

/// Passes older than this without a successful one raise the alarm: ten
/// periods at the default reconcile rate of one a minute.
const STALLED_AFTER_SECONDS: i64 = 600;

/// Silent this long, a worker is presumed gone (the default rescue window,
/// 5 s heartbeats times 12).
const GONE_AFTER_SECONDS: f64 = 60.0;

/// A worker is live if it was seen recently and no later generation of the
/// same process and queue (`kind@host-pid#generation`) replaced it.
fn is_live(w: &WorkerRow, all: &[WorkerRow]) -> bool {
    if w.seconds_since_seen > GONE_AFTER_SECONDS {
        return false;
    }
    let Some((base, generation)) = w.name.rsplit_once('#') else {
        return true;
    };
    let generation: u32 = generation.parse().unwrap_or(0);
    !all.iter().any(|other| {
        other
            .name
            .rsplit_once('#')
            .is_some_and(|(b, g)| b == base && g.parse::<u32>().unwrap_or(0) > generation)
    })
}

fn worker_table(f: &mut Formatter<'_>, rows: &[&WorkerRow]) -> fmt::Result {
    f.write_str(
        "<table>\n<thead><tr><th>Worker</th><th>Queue</th><th>Last seen</th></tr></thead>\n<tbody>\n",
    )?;
    for w in rows {
        writeln!(
            f,
            "<tr><td class=\"id\">{}</td><td>{}</td><td>{} ago</td></tr>",
            Esc(&w.name),
            Esc(&w.queue),
            human_duration(chrono::TimeDelta::seconds(w.seconds_since_seen as i64))
        )?;
    }
    f.write_str("</tbody>\n</table>\n")
}
