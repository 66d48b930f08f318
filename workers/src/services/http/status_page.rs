//! The status page's body: alarms, the fleet, the last pass, the pools
//! (a provider with pools), penalties, the queue, the workers, the newest
//! machines and the recent events.

use maud::{Markup, html};
use shepherd::fleet::LivenessState;
use shepherd::fleet::cost::money;

use super::*;

/// Machines listed on the status page; `/machines` has them all.
pub(super) const STATUS_MACHINES: usize = 50;

pub(super) fn status_page(
    o: &Overview,
    machines: &[ManagedMachine],
    events: &[EventRow],
    viewer: &Viewer,
    done: &Done,
    voice: &Voice,
) -> Markup {
    html! {
        h1 { "shepherd" }
        (liveness(o))
        (done.banner_now(o.paused.is_some(), o.deletions_paused.is_some()))
        p.muted.as-of { "As of " (Time(o.now).to_string()) "; this page updates itself every 5 s while you are not filling in a form or selecting text." }
        (alarms(o, &voice.words))
        @match viewer {
            Viewer::Operator(who) => (action_forms(o, who, voice)),
            Viewer::Anonymous => {
                h2 { "Actions" }
                p.muted { a href="/login" { "Log in to act" } " (pause, resume, a pass, clear a penalty, pool counts, the limit, deletions)." }
            }
            Viewer::ReadOnly => {}
        }
        (fleet(o, &voice.words))
        (last_reconcile(o))
        (pools(o))
        (leaving(o))
        (penalties(o, voice))
        (queue(o))
        (workers(o))
        (machine_list(o, machines, voice))
        h2 { "Recent events " span.muted { "(newest first; passes are summed up above)" } }
        @if events.is_empty() {
            p.muted { "The log is empty." }
        } @else {
            (event_table(events, true))
        }
    }
}

/// The page's first line: is anything working? Red within two periods of
/// the last sign of life.
fn liveness(o: &Overview) -> Markup {
    let l = o.liveness();
    let secs = |s: f64| human_duration(chrono::TimeDelta::seconds(s.max(0.0) as i64));
    let last_pass = match l.last_pass_seconds {
        Some(s) => format!("{} ago", secs(s)),
        None => "never".to_string(),
    };
    html! {
        @match l.state {
            LivenessState::Working => p.alive.ok role="status" {
                strong { "Working: " }
                (l.processes) " worker process" @if l.processes != 1 { "es" }
                " heard from within " (secs(l.window_seconds))
                "; the last successful pass " (last_pass)
                " (passes every " (secs(l.tick_seconds)) ")."
            },
            LivenessState::NoWorker => div.alarm.alive role="alert" {
                strong { "NO WORKER RUNNING: " }
                @match l.last_heard_seconds {
                    Some(s) => { "the last was heard from " (secs(s)) " ago" },
                    None => { "none heard from in the last 10 minutes" },
                }
                " (a worker silent for " (secs(l.window_seconds)) " is dead). Nothing is \
                 created, assimilated or deleted, and jobs wait in the queue, until one starts \
                 (shepherd worker)."
            },
            LivenessState::NoPass => div.alarm.alive role="alert" {
                strong { "NO PASS: " }
                (l.processes) " worker process" @if l.processes != 1 { "es are" } @else { " is" }
                " running, but the last successful pass was " (last_pass)
                " (passes come every " (secs(l.tick_seconds)) "): no scheduler is running \
                 (shepherd scheduler, or a worker with --scheduler), or every pass is refused \
                 (see below)."
            },
        }
    }
}

fn alarms(o: &Overview, words: &Words) -> Markup {
    let discrepancy = o
        .last_reconcile
        .as_ref()
        .and_then(|r| r.discrepancy.as_ref());
    // Unknown servers on places of pools alone hold those pools; anything
    // else stops the whole pass.
    let whole_pass_refused = o
        .last_reconcile
        .as_ref()
        .is_some_and(|r| r.refused.is_some());
    let over = o
        .max_machines
        .filter(|l| *l > 0)
        .map(|limit| (o.managed + o.in_flight(), limit))
        .filter(|(used, limit)| *used > *limit as i64);
    html! {
        @if let Some(d) = discrepancy {
            div.alarm.discrepancy {
                strong { "DISCREPANCY:" }
                @if whole_pass_refused {
                    " the provider and shepherd disagree about which machines exist. The last \
                     reconcile refused to do any work, and passes keep refusing while this lasts."
                } @else {
                    " servers nothing proves ours stand on places of pools. Those pools are held \
                     (no creation, no deletion: see the deletions held back) until each is \
                     explained; the other pools go on."
                }
                ul {
                    @if !d.unknown_devices.is_empty() {
                        li { "Unknown " (words.machines) " (ours by name, managed by nobody): "
                             (field_value(Some(Kind::Device), &serde_json::json!(d.unknown_devices))) }
                    }
                    @if !d.missing_devices.is_empty() {
                        li { "Missing " (words.machines) " (managed, gone from the provider): "
                             (field_value(Some(Kind::Device), &serde_json::json!(d.missing_devices))) }
                    }
                }
            }
        }
        @if let Some((used, limit)) = over {
            div.alarm {
                strong { "OVER THE LIMIT:" }
                " " (used) " machines managed or in flight against a limit of " (limit)
                ". Nothing is admitted until the fleet is back under it (the limit was lowered, \
                 or machines were added by hand)."
            }
        }
        @if let Some(oldest) = o.unresolved.first() {
            div.warn {
                strong { (o.unresolved.len()) " creation(s) with an unknown outcome" }
                ", the oldest for " (human_duration(chrono::TimeDelta::seconds(oldest.seconds as i64)))
                "; each holds its slot until a look at the provider settles it:"
                @for u in &o.unresolved { " " (link(Kind::Reservation, u.reservation_id)) }
            }
        }
        @if let Some(p) = &o.paused {
            div.warn {
                strong { "Creations are paused" }
                " by " (p.by) " since " (ago(p.since, o.now)) ": " (p.reason)
            }
        }
        @if let Some(p) = &o.deletions_paused {
            div.warn {
                strong { "Deletions are paused" }
                " by " (p.by) " since " (ago(p.since, o.now)) ": " (p.reason)
                " (surplus stays, failed machines are not replaced)"
            }
        }
        @if let Some(r) = &o.last_reconcile {
            @for s in &r.surplus {
                div.warn {
                    strong { "Surplus in pool " (s.pool) ": " }
                    (s.machines) " machines of ours for a count of " (s.count)
                    @if !s.doubled.is_empty() { " (two on " (s.doubled.join(", ")) ")" }
                    ". The extra ones are deleted within the guards (failed first, then not \
                     ready, then newest; protected never)."
                }
            }
            @for h in &r.held {
                div.warn {
                    strong { "Deletions held back in pool " (h.pool) " (" (h.guard) "): " }
                    (h.message)
                }
            }
        }
    }
}

fn fleet(o: &Overview, words: &Words) -> Markup {
    html! {
        h2 { "Fleet" }
        table.facts {
            tr { th { "Managed machines" } td { (o.managed) } }
            tr { th { "Machine limit" }
                @match o.max_machines {
                    Some(limit) => td { (limit) },
                    None => td.muted { "no settings recorded yet" },
                }
            }
            tr { th { "In flight" } td { (o.in_flight()) " " span.muted {
                "(pending creations: " (o.pending_creations)
                ", " (words.machines) " awaiting assimilation: " (o.unassimilated_devices) ")" } } }
            @if let Some(oldest) = o.unresolved.first() {
                tr { th { "Unresolved creations" } td {
                    strong { (o.unresolved.len()) } " " span.muted {
                        "(outcome unknown, settled by looking; oldest " (format!("{:.0} s", oldest.seconds))
                        ": " (oldest.last_error.as_deref().unwrap_or("")) ")" } } }
            }
            tr { th { "Creations" }
                @if o.paused.is_some() { td { strong { "paused" } } }
                @else if o.spend_cap.as_ref().is_some_and(|c| c.held.is_some()) { td { strong { "held: spend cap" } } }
                @else { td.ok { "running" } }
            }
            @if let Some(c) = &o.spend_cap {
                @let currency = c.currency.as_deref().unwrap_or("");
                tr { th { "Spend cap" } td {
                    (money(c.cap, currency)) " per hour; the fleet costs " (money(c.spent, currency))
                    " " span.muted { "(" (format!("{:.0}", 100.0 * c.spent / c.cap)) " %, machines and creations in flight by our records)" }
                    @if let Some(held) = &c.held { br; strong { (held) } }
                } }
            }
            @if !o.desired.is_empty() || !o.leaving.is_empty() {
                tr { th { "Deletions" }
                    @if o.deletions_paused.is_some() { td { strong { "paused" } } } @else { td.ok { "running" } }
                }
                tr { th { "Leaving" } td { (o.leaving.len()) } }
            }
            @if o.protected > 0 {
                tr { th { "Protected" } td { (o.protected) " " span.muted { "(never deleted by shepherd)" } } }
            }
            tr { th { "Penalised " (words.units) } td { (o.penalised.len()) } }
            tr { th { "Last successful reconcile" }
                @match o.last_successful_reconcile {
                    Some(at) => td { (ago(at, o.now)) },
                    None => td.muted { "never" },
                }
            }
            tr { th { "Events in the log" } td { (o.events) } }
        }
    }
}

fn last_reconcile(o: &Overview) -> Markup {
    html! {
        h2 { "Last reconcile" }
        @match &o.last_reconcile {
            None => p.muted { "No pass has run yet." },
            Some(r) => table.facts {
                tr { th { "Run" } td.id { (r.run) } }
                tr { th { "Started" } td { (ago(r.started_at, o.now)) } }
                @if let Some(reason) = &r.refused {
                    tr { th { "Outcome" } td { strong { "refused:" } " " (reason) } }
                }
                @match &r.finished {
                    Some(done) => tr { th { "Finished" } td {
                        (done.managed) " managed, " (done.in_flight) " in flight, "
                        (done.enqueued) " creations enqueued"
                        @if done.at_limit { "; at the limit" }
                    } },
                    None if r.refused.is_none() => tr { th { "Outcome" } td { "still running" } },
                    None => {},
                }
            },
        }
    }
}

/// The pools: as declared (the cluster's desired state, with who changed
/// each last), and as the last listing saw them: what stands (and how much
/// of it failed to deploy, replaced within the guards), and whether the
/// provider has stock to fill the rest.
fn pools(o: &Overview) -> Markup {
    html! {
        @if !o.desired.is_empty() {
            h2 { "Pools " span.muted { "(as declared)" } }
            table.pools {
                thead { tr {
                    th { "Pool" } th { "Plan" } th { "Site" } th { "Count" } th { "OS" } th { "Changed" }
                } }
                tbody {
                    @for p in &o.desired {
                        tr {
                            td { (p.name) @if p.removed { " " span.muted { "(removed, draining)" } } }
                            td { (p.plan) }
                            td { (p.site) }
                            td.n { (p.count) }
                            td { (p.operating_system) }
                            td { (Time(p.updated_at).to_string()) " by " (p.updated_by) ": " (p.reason) }
                        }
                    }
                }
            }
        }
        (surveyed_pools(o))
    }
}

fn surveyed_pools(o: &Overview) -> Markup {
    let Some(seen) = &o.pools else {
        return html! {};
    };
    html! {
        h2 { "Pools " span.muted { "(as the last pass saw them, " (ago(seen.surveyed_at, o.now)) ")" } }
        @if let Some(l) = &seen.listing {
            p.muted.listing { "Listed " (crate::commands::operate::listing_words(l)) "." }
        }
        @for f in seen.fleet_cost() {
            p.cost {
                strong { "Cost: " (money(f.per_hour, &f.currency)) " per hour" }
                ", about " (money(f.per_month(), &f.currency)) " a month at hourly rates (an estimate)"
                @if f.wasted_per_hour > 0.0 { "; " strong { (money(f.wasted_per_hour, &f.currency)) " per hour" } " on surplus and failed machines" }
                "."
            }
        }
        @let unpriced = seen.unpriced();
        @if !unpriced.is_empty() {
            p.warn { "No price for pool(s) " (unpriced.join(", ")) ": the provider gave none with their stock, so the cost above leaves them out." }
        }
        table.pools {
            thead { tr {
                th { "Pool" } th { "Plan" } th { "Site" } th { "Machines" } th { "Places" }
                th { "Failed" } th { "Stock" } th { "Held back" } th { "Cost per hour" }
            } }
            tbody {
                @for p in &seen.pools {
                    @let r = &p.report;
                    tr {
                        td { (r.name) @if r.removed { " " span.muted { "(removed)" } } }
                        td { (r.plan) }
                        td { (r.site) }
                        td.n {
                            (r.taken)
                            @if r.machines > r.taken { " " strong { "+" (r.machines - r.taken) " surplus" } }
                            @if r.dormant > 0 { " " strong.dormant { "(" (r.dormant) " off, in rescue or of unknown status: kept)" } }
                        }
                        td.n { (r.count) }
                        @if r.failed > 0 {
                            td.n { strong { (r.failed) } }
                        } @else {
                            td.n { "0" }
                        }
                        @match r.stock {
                            None => td.muted { "not read (a pass at the limit does not)" },
                            Some(stock) if !stock.offered => td { strong { "not offered at this site" } },
                            Some(stock) if !stock.in_stock => td { strong { "none in stock" } },
                            Some(stock) => @match stock.count {
                                Some(n) => td.ok { (n) " in stock" },
                                None => td.ok { "in stock" },
                            },
                        }
                        @match p.held_until {
                            Some(until) => td { "out of stock until " (Time(until).to_string()) },
                            None => td.muted { "no" },
                        }
                        @match shepherd::fleet::cost::pool_cost(r) {
                            Some(c) => td.n {
                                (money(c.per_hour, &c.currency))
                                @if c.wasted_per_hour > 0.0 { " " strong { "(" (money(c.wasted_per_hour, &c.currency)) " wasted)" } }
                                br; span.muted { (money(c.server_per_hour, &c.currency)) " a server" }
                            },
                            None if r.stock.is_none() => td.muted { "not read" },
                            None => td { strong { "no price given" } },
                        }
                    }
                }
            }
        }
    }
}

/// Machines leaving: why, for how long, and whether they wait for their
/// leave hook.
fn leaving(o: &Overview) -> Markup {
    if o.leaving.is_empty() {
        return html! {};
    }
    html! {
        h2 { "Leaving (" (o.leaving.len()) ")" }
        table {
            thead { tr { th { "Machine" } th { "Pool" } th { "Why" } th { "For" } th { "State" } } }
            tbody {
                @for l in &o.leaving {
                    tr {
                        td { (device_id(&l.device)) @if let Some(h) = &l.hostname { " " span.muted { (h) } } }
                        td { (l.pool.as_deref().unwrap_or("")) }
                        td { (l.cause) ": " (l.message) " " span.muted { "(" (l.requested_by) ")" } }
                        td { (human_duration(chrono::TimeDelta::seconds(l.seconds as i64))) }
                        @match (&l.last_error, l.cleared) {
                            (Some(e), _) => td { strong { "unknown: " } (e) },
                            (None, true) => td { "deleting" },
                            (None, false) => td { "waiting for its leave hook" },
                        }
                    }
                }
            }
        }
    }
}

fn penalties(o: &Overview, voice: &Voice) -> Markup {
    html! {
        h2 { "Penalised " (voice.words.units) }
        @if o.penalised.is_empty() {
            p.muted { "None." }
        } @else {
            table {
                thead { tr { th { (capital(voice.words.unit)) } th { "Time left" } th { "Until" } th { "Failures" } th { "Cause" } } }
                tbody {
                    @for p in &o.penalised {
                        tr {
                            td {
                                (link(Kind::Reservation, p.reservation_id))
                                @if let Some(label) = voice.label(p.reservation_id) { " " span.label { (label) } }
                            }
                            td { (human_duration(chrono::TimeDelta::seconds(p.seconds_left))) }
                            td { (Time(p.until).to_string()) }
                            td.n { (p.failures) }
                            td {
                                (p.cause)
                                @if let Some(scope) = &p.scope {
                                    " " span.muted { "(holds back every place drawing on " (scope) ")" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn queue(o: &Overview) -> Markup {
    html! {
        h2 { "Queue " a.muted href="/jobs" { "(all jobs)" } }
        p.muted { "By the queue's own statuses (a claimed job stays Queued until it ends); " a href="/jobs" { "/jobs" } " says waiting, running, retrying, done, failed or cancelled." }
        @if o.queue.is_empty() {
            p.muted { "No jobs." }
        } @else {
            table {
                thead { tr { th { "Kind" } th { "State" } th { "Jobs" } th { "Oldest" } } }
                tbody {
                    @for q in &o.queue {
                        tr {
                            td { (q.kind) }
                            td { a href={ "/jobs?kind=" (q.kind) "&state=" (q.state) } { (q.state) } }
                            td.n { (q.jobs) }
                            td { @if let Some(s) = q.oldest_seconds {
                                // Every job of the row scheduled ahead (a
                                // successor's backoff): when the first is due.
                                @if s < 0.0 {
                                    "due in " (human_duration(chrono::TimeDelta::seconds(-s as i64)))
                                } @else {
                                    (human_duration(chrono::TimeDelta::seconds(s as i64)))
                                }
                            } }
                        }
                    }
                }
            }
        }
    }
}

fn workers(o: &Overview) -> Markup {
    // Dead past its missed heartbeats, as the cluster's settings say.
    let (live, gone): (Vec<_>, Vec<_>) = o.processes().into_iter().partition(|p| p.live);
    html! {
        h2 { "Workers" }
        @if live.is_empty() {
            p.muted { "None running." }
        } @else {
            (process_table(&live, o.now))
        }
        @if !gone.is_empty() {
            p.muted { "Silent past their missed heartbeats (their jobs are handed to live workers):" }
            (process_table(&gone, o.now))
        }
    }
}

fn process_table(rows: &[shepherd::fleet::ProcessRow], now: DateTime<Utc>) -> Markup {
    html! {
        table.workers {
            thead { tr { th { "Process (host:pid:start)" } th { "Release" } th { "Started" } th { "Queues" } th { "Last heard from" } th { "Clock" } } }
            tbody {
                @for p in rows {
                    tr {
                        td.id { (p.name) }
                        td { (p.version.as_deref().unwrap_or("not recorded")) }
                        td { @match p.started_at { Some(at) => (ago(at, now)), None => span.muted { "not recorded" } } }
                        td { (p.queues.join(", ")) }
                        td { (human_duration(chrono::TimeDelta::seconds(p.seconds_since_seen as i64))) " ago" }
                        td { @match p.clock_offset_ms {
                            None => span.muted { "not recorded" },
                            Some(ms) if ms.abs() <= shepherd::fleet::CLOCK_OFF_MS => "in step with the database",
                            Some(ms) => strong { (format!("{:.1} s {} the database", ms.unsigned_abs() as f64 / 1000.0, if ms > 0 { "ahead of" } else { "behind" })) },
                        } }
                    }
                }
            }
        }
    }
}

fn machine_list(o: &Overview, machines: &[ManagedMachine], voice: &Voice) -> Markup {
    let words = &voice.words;
    let total = o.managed.max(0) as usize;
    html! {
        h2 { "Managed machines (" (total) ") " a.muted href="/machines" { "(all, searchable)" } }
        @if machines.is_empty() {
            p.muted { "None." }
        } @else {
            @if total > STATUS_MACHINES {
                p.muted { "The " (STATUS_MACHINES) " assimilated last; " a href="/machines" { "all " (total) } "." }
            }
            table {
                thead { tr { th { "Machine" } th { (capital(words.machine)) } th { (capital(words.unit)) } th { "Hostname" } th { "Assimilated" } } }
                tbody {
                    @for m in machines {
                        tr {
                            td.id { (m.machine_id) }
                            td { (device_id(&m.provider_id)) }
                            td { @if let Some(r) = m.reservation_id { (unit_link(r, voice)) } }
                            td { (m.hostname.as_deref().unwrap_or("")) }
                            td { (Time(m.assimilated_at).to_string()) }
                        }
                    }
                }
            }
        }
    }
}
