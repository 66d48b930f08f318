//! `/charts`: what an operator would rather look at than read. Creations
//! and failures over time (from the event log), the queue's depth over
//! time (from the job rows' due and done times) and this process's API
//! latency (its last hour, a minute at a time). Drawn as inline SVG on the
//! server: no script, and maud escapes every label.

use maud::{Markup, html};
use serde::Deserialize;

use super::*;
use shepherd::jobs::{
    ASSIMILATE_QUEUE, CREATE_DEVICE_QUEUE, DELETE_MACHINE_QUEUE, RECONCILE_QUEUE,
};

/// The windows a chart can show: name, bucket width in seconds, buckets.
const WINDOWS: [(&str, i64, i64); 3] = [("1h", 120, 30), ("24h", 1800, 48), ("7d", 3 * 3600, 56)];

#[derive(Debug, Default, Deserialize)]
pub(super) struct ChartQuery {
    window: Option<String>,
}

/// One series of a bar chart: a name, a colour, a value per bucket.
struct Series<'a> {
    name: &'a str,
    colour: &'a str,
    values: Vec<f64>,
}

pub(super) async fn charts_page(
    State(state): State<HttpState>,
    Query(query): Query<ChartQuery>,
) -> Result<Html<String>, Failure> {
    let wanted = query.window.as_deref().unwrap_or("1h");
    let Some(&(window, step, buckets)) = WINDOWS.iter().find(|(name, ..)| *name == wanted) else {
        return Err(Failure::BadRequest(format!(
            "window {wanted:?} is not one of 1h, 24h, 7d"
        )));
    };
    let now: DateTime<Utc> = sqlx::query_scalar("select now()")
        .fetch_one(&state.pool)
        .await
        .map_err(|e| database_failure("charts", e))?;
    let start = now - chrono::TimeDelta::seconds(step * buckets);
    let bucket_of = |at: DateTime<Utc>| ((at - start).num_seconds() / step) as usize;

    // Creations and failures: the events that end or fail an attempt.
    let rows: Vec<(DateTime<Utc>, String)> = sqlx::query_as(
        "select recorded_at, event_type from shepherd.events
         where event_type in ('device_created', 'creation_attempt_failed',
                              'creation_given_up', 'race_lost', 'creation_unresolved')
           and recorded_at >= $1",
    )
    .bind(start)
    .fetch_all(&state.pool)
    .await
    .map_err(|e| database_failure("charts", e))?;
    let n = buckets as usize;
    let (mut created, mut failed, mut ended) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    for (at, kind) in rows {
        let i = bucket_of(at).min(n - 1);
        match kind.as_str() {
            "device_created" => created[i] += 1.0,
            "creation_given_up" | "race_lost" => ended[i] += 1.0,
            _ => failed[i] += 1.0,
        }
    }

    // Queue depth at the end of each bucket: jobs due by then and not done.
    let depth: Vec<(i32, String, i64)> = sqlx::query_as(
        "select b.i, j.job_type, count(*)
         from generate_series(0, $3 - 1) as b(i)
         join apalis.jobs j
           on j.job_type = any($4)
          and j.run_at <= $1 + (b.i + 1) * $2 * interval '1 second'
          and (j.done_at is null or j.done_at > $1 + (b.i + 1) * $2 * interval '1 second')
         where j.done_at is null or j.done_at > $1
         group by 1, 2",
    )
    .bind(start)
    .bind(step as f64)
    .bind(buckets as i32)
    .bind([RECONCILE_QUEUE, CREATE_DEVICE_QUEUE, ASSIMILATE_QUEUE].map(str::to_string))
    .fetch_all(&state.pool)
    .await
    .map_err(|e| database_failure("charts", e))?;
    let mut queue = [RECONCILE_QUEUE, CREATE_DEVICE_QUEUE, ASSIMILATE_QUEUE].map(|_| vec![0.0; n]);
    for (i, kind, count) in depth {
        let k = match kind.as_str() {
            RECONCILE_QUEUE => 0,
            CREATE_DEVICE_QUEUE => 1,
            _ => 2,
        };
        if let Some(slot) = queue[k].get_mut(i as usize) {
            *slot = count as f64;
        }
    }

    // Jobs that ended, by outcome in the jobs pages' words (a creation that
    // gave up is a failure though the queue filed it Done), per bar, and
    // by kind over the window.
    // The failure test is the jobs pages' own, a fixed text.
    let finished: Vec<(i32, String, String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "select ((extract(epoch from done_at - $1) / $2)::int) as i, job_type,
                case when status = 'Killed' then 'cancelled'
                     when status = 'Failed' then 'failed'
                     when {} then 'failed'
                     else 'done' end as outcome,
                count(*)
         from apalis.jobs
         where done_at >= $1 and job_type = any($3)
           and (status in ('Done', 'Killed') or (status = 'Failed' and attempts >= max_attempts))
         group by 1, 2, 3",
        super::jobs::failed_outcome_sql()
    )))
    .bind(start)
    .bind(step as f64)
    .bind(
        [
            RECONCILE_QUEUE,
            CREATE_DEVICE_QUEUE,
            ASSIMILATE_QUEUE,
            DELETE_MACHINE_QUEUE,
        ]
        .map(str::to_string),
    )
    .fetch_all(&state.pool)
    .await
    .map_err(|e| database_failure("charts", e))?;
    let (mut done, mut broke, mut cancelled) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    let mut by_kind: std::collections::BTreeMap<String, [i64; 3]> = Default::default();
    for (i, kind, outcome, count) in finished {
        let i = (i.max(0) as usize).min(n - 1);
        let k = match outcome.as_str() {
            "done" => 0,
            "failed" => 1,
            _ => 2,
        };
        [&mut done, &mut broke, &mut cancelled][k][i] += count as f64;
        by_kind.entry(kind).or_default()[k] += count;
    }

    // This process's API latency, its last hour only.
    let minutes = state.client_metrics.latency.minutes();
    let latest = now.timestamp() / 60;
    let (mut mean, mut max) = (vec![0.0; 60], vec![0.0; 60]);
    for m in &minutes {
        let age = latest - m.minute;
        if (0..60).contains(&age) {
            let i = 59 - age as usize;
            mean[i] = m.total_seconds / m.calls as f64 * 1000.0;
            max[i] = m.max_seconds * 1000.0;
        }
    }
    let calls: u64 = minutes.iter().map(|m| m.calls).sum();

    let [reconcile, create, assimilate] = queue;
    let body = html! {
        h1 { a href="/" { "shepherd" } " · charts" }
        p {
            "Window: "
            @for (name, ..) in WINDOWS {
                @if name == window { strong { (name) } } @else { a href={ "/charts?window=" (name) } { (name) } }
                " "
            }
            span.muted { "(bars of " (human_duration(chrono::TimeDelta::seconds(step))) ", up to " (Time(now).to_string()) ")" }
        }
        h2 { "Creations and failures" }
        (bar_chart("creations", start, step, &[
            Series { name: "devices created", colour: "#2a7", values: created },
            Series { name: "attempts failed or unknown", colour: "#e90", values: failed },
            Series { name: "creations given up", colour: "#c33", values: ended },
        ], ""))
        h2 { "Jobs finished " span.muted { "(by outcome, as /jobs words it)" } }
        (bar_chart("finished", start, step, &[
            Series { name: "done", colour: "#2a7", values: done },
            Series { name: "failed", colour: "#c33", values: broke },
            Series { name: "cancelled", colour: "#999", values: cancelled },
        ], ""))
        @if !by_kind.is_empty() {
            table.facts.by-kind {
                thead { tr { th { "Kind" } th { "done" } th { "failed" } th { "cancelled" } th { "a minute, on average" } } }
                tbody {
                    @for (kind, [d, f, c]) in &by_kind {
                        tr {
                            td { a href={ "/jobs?kind=" (kind) } { (kind) } }
                            td.n { (d) }
                            td.n { a href={ "/jobs?kind=" (kind) "&state=failed" } { (f) } }
                            td.n { (c) }
                            td.n { (format!("{:.2}", (d + f + c) as f64 / (step * buckets) as f64 * 60.0)) }
                        }
                    }
                }
            }
        }
        h2 { "Queue depth " span.muted { "(jobs due and not finished, at the end of each bar)" } }
        (bar_chart("queue", start, step, &[
            Series { name: RECONCILE_QUEUE, colour: "#68c", values: reconcile },
            Series { name: CREATE_DEVICE_QUEUE, colour: "#2a7", values: create },
            Series { name: ASSIMILATE_QUEUE, colour: "#a6c", values: assimilate },
        ], ""))
        h2 { "API latency " span.muted { "(this process, the last hour by minute; calls: " (calls) ")" } }
        (bar_chart("latency", now - chrono::TimeDelta::minutes(60), 60, &[
            Series { name: "mean", colour: "#68c", values: mean },
            Series { name: "slowest", colour: "#c33", values: max },
        ], " ms"))
    };
    Ok(layout("shepherd · charts", true, body))
}

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 140.0;

/// Grouped bars, one group per bucket, with the largest value on the axis
/// and each bar's value and time in its tooltip (`<title>`).
fn bar_chart(
    class: &str,
    start: DateTime<Utc>,
    step: i64,
    series: &[Series<'_>],
    unit: &str,
) -> Markup {
    let buckets = series.first().map_or(0, |s| s.values.len()).max(1);
    let top = series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .fold(0.0_f64, f64::max);
    let scale = if top > 0.0 { (HEIGHT - 4.0) / top } else { 0.0 };
    let group = WIDTH / buckets as f64;
    let bar = (group - 2.0).max(1.0) / series.len().max(1) as f64;
    let label = |v: f64| {
        if v.fract() == 0.0 {
            format!("{v}{unit}")
        } else {
            format!("{v:.1}{unit}")
        }
    };
    html! {
        div.plot {
            p.legend {
                @for s in series {
                    span style={ "color:" (s.colour) } { "■ " } (s.name) "  "
                }
                span.muted { "· top of the axis: " (label(top)) }
            }
            svg class={ "chart " (class) } width="100%" viewBox={ "0 0 " (WIDTH) " " (HEIGHT + 16.0) }
                preserveAspectRatio="none" role="img" {
                line x1="0" y1=(HEIGHT) x2=(WIDTH) y2=(HEIGHT) stroke="#ccc" {}
                @for (k, s) in series.iter().enumerate() {
                    @for (i, v) in s.values.iter().enumerate() {
                        @if *v > 0.0 {
                            @let at = start + chrono::TimeDelta::seconds(step * i as i64);
                            rect x=(format!("{:.1}", i as f64 * group + 1.0 + k as f64 * bar))
                                y=(format!("{:.1}", HEIGHT - v * scale))
                                width=(format!("{:.1}", bar))
                                height=(format!("{:.1}", v * scale))
                                fill=(s.colour) {
                                title { (label(*v)) " " (s.name) " from " (Time(at).to_string()) }
                            }
                        }
                    }
                }
                text x="0" y=(HEIGHT + 13.0) font-size="11" fill="#777" { (Time(start).to_string()) }
                text x=(WIDTH) y=(HEIGHT + 13.0) font-size="11" fill="#777" text-anchor="end" { "now" }
            }
        }
    }
}
