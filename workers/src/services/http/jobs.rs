//! `/jobs` and `/jobs/{id}`: the queue as an operator reads it before
//! opening psql. Written as maud templates, which escape every value they
//! are given; the older pages still use the hand-written `html.rs`.

use maud::{Markup, html};
use serde::Deserialize;

use super::*;
use shepherd::jobs::{ASSIMILATE_QUEUE, CREATE_DEVICE_QUEUE, RECONCILE_QUEUE};

const KINDS: [&str; 3] = [RECONCILE_QUEUE, CREATE_DEVICE_QUEUE, ASSIMILATE_QUEUE];
const STATES: [&str; 6] = ["Pending", "Queued", "Running", "Done", "Failed", "Killed"];
const PAGE_SIZE: i64 = 50;

fn page(title: &str, body: Markup) -> Html<String> {
    layout(title, false, body)
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct JobFilter {
    kind: Option<String>,
    state: Option<String>,
    page: Option<i64>,
}

#[derive(sqlx::FromRow)]
struct JobRow {
    id: String,
    job_type: String,
    status: String,
    attempts: i32,
    max_attempts: i32,
    run_at: DateTime<Utc>,
    done_at: Option<DateTime<Utc>>,
    lock_by: Option<String>,
    last_result: Option<Value>,
}

/// One of `allowed`, or a 400 naming them.
fn one_of(what: &str, value: Option<&str>, allowed: &[&str]) -> Result<Option<String>, Failure> {
    match value.filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) if allowed.contains(&v) => Ok(Some(v.to_string())),
        Some(v) => Err(Failure::BadRequest(format!(
            "{what} {v:?} is not one of {}",
            allowed.join(", ")
        ))),
    }
}

pub(super) async fn jobs_page(
    State(state): State<HttpState>,
    Query(filter): Query<JobFilter>,
) -> Result<Html<String>, Failure> {
    let kind = one_of("kind", filter.kind.as_deref(), &KINDS)?;
    let status = one_of("state", filter.state.as_deref(), &STATES)?;
    let number = filter.page.unwrap_or(1);
    if number < 1 {
        return Err(Failure::BadRequest(format!(
            "page {number} is not a page: pages start at 1"
        )));
    }
    let rows: Vec<JobRow> = sqlx::query_as(
        "select id, job_type, status, attempts, max_attempts, run_at, done_at, lock_by, last_result
         from apalis.jobs
         where job_type = any($1) and ($2::text is null or job_type = $2)
           and ($3::text is null or status = $3)
         order by run_at desc, id desc
         limit $4 offset $5",
    )
    .bind(KINDS.map(str::to_string).to_vec())
    .bind(&kind)
    .bind(&status)
    .bind(PAGE_SIZE + 1)
    .bind((number - 1) * PAGE_SIZE)
    .fetch_all(&state.pool)
    .await
    .map_err(|e| database_failure("jobs", e))?;
    let more = rows.len() as i64 > PAGE_SIZE;
    let rows = &rows[..rows.len().min(PAGE_SIZE as usize)];
    let link = |page: i64| {
        let mut q = vec![format!("page={page}")];
        if let Some(k) = &kind {
            q.push(format!("kind={k}"));
        }
        if let Some(s) = &status {
            q.push(format!("state={s}"));
        }
        format!("/jobs?{}", q.join("&"))
    };
    let body = html! {
        h1 { a href="/" { "shepherd" } " · jobs" }
        form method="get" action="/jobs" {
            "Kind "
            select name="kind" aria-label="Kind" {
                option value="" { "any" }
                @for k in KINDS {
                    option value=(k) selected[kind.as_deref() == Some(k)] { (k) }
                }
            }
            " state "
            select name="state" aria-label="State" {
                option value="" { "any" }
                @for s in STATES {
                    option value=(s) selected[status.as_deref() == Some(s)] { (s) }
                }
            }
            " "
            button type="submit" { "Show" }
        }
        @if rows.is_empty() {
            p.muted { "No jobs match." }
        } @else {
            table {
                thead { tr {
                    th { "Job" } th { "Kind" } th { "State" } th { "Attempts" }
                    th { "Run at" } th { "Done" } th { "Worker" } th { "Last result" }
                } }
                tbody {
                    @for j in rows {
                        tr {
                            td.id { a href={ "/jobs/" (j.id) } { (j.id) } }
                            td { (j.job_type) }
                            td { (shown_state(&j.status, j.lock_by.is_some())) }
                            td.n { (j.attempts) "/" (j.max_attempts) }
                            td { (Time(j.run_at).to_string()) }
                            td { @if let Some(d) = j.done_at { (Time(d).to_string()) } }
                            td.id { @if let Some(w) = &j.lock_by { (w) } }
                            td.body { @if let Some(r) = &j.last_result { (short(r)) } }
                        }
                    }
                }
            }
        }
        p {
            @if number > 1 { a href=(link(number - 1)) { "← newer" } " " }
            @if more { a href=(link(number + 1)) { "older →" } }
        }
    };
    Ok(page("shepherd · jobs", body))
}

/// A job's state as a person reads it. Workers claim jobs without apalis's
/// separate `Running` step (one transaction less per job), so a job a worker
/// is running stays `Queued` with its claimer set.
fn shown_state(status: &str, claimed: bool) -> String {
    if status == "Queued" && claimed {
        "Running (claimed)".into()
    } else {
        status.to_string()
    }
}

/// A result cut to a table cell's worth.
fn short(v: &Value) -> String {
    let text = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if text.chars().count() > 120 {
        let cut: String = text.chars().take(119).collect();
        format!("{cut}…")
    } else {
        text
    }
}

#[derive(sqlx::FromRow)]
struct JobDetail {
    id: String,
    job_type: String,
    job: Vec<u8>,
    status: String,
    attempts: i32,
    max_attempts: i32,
    run_at: DateTime<Utc>,
    lock_at: Option<DateTime<Utc>>,
    lock_by: Option<String>,
    done_at: Option<DateTime<Utc>>,
    last_result: Option<Value>,
}

pub(super) async fn job_page(
    State(state): State<HttpState>,
    headers: axum::http::HeaderMap,
    Path(id): Path<String>,
) -> Result<Html<String>, Failure> {
    let may_act = viewer(&state, &headers).await.may_act();
    let job: Option<JobDetail> = sqlx::query_as(
        "select id, job_type, job, status, attempts, max_attempts, run_at, lock_at, lock_by,
                done_at, last_result
         from apalis.jobs where id = $1 and job_type = any($2)",
    )
    .bind(&id)
    .bind(KINDS.map(str::to_string).to_vec())
    .fetch_optional(&state.pool)
    .await
    .map_err(|e| database_failure("job", e))?;
    let Some(job) = job else {
        return Err(Failure::NotFound(format!(
            "no shepherd job {id} in the queue (finished jobs are pruned after the retention)"
        )));
    };
    let events = store::read_by_job(&state.pool, &job.id)
        .await
        .map_err(|e| store_failure("job", e))?;
    let rows: Vec<EventRow> = events.into_iter().map(EventRow::from).collect();
    // The arguments as stored: JSON, shown pretty; bytes that are not JSON
    // (a row written by hand) are shown as text.
    let arguments = match serde_json::from_slice::<Value>(&job.job) {
        Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_default(),
        Err(_) => String::from_utf8_lossy(&job.job).into_owned(),
    };
    let result = job
        .last_result
        .as_ref()
        .map(|r| serde_json::to_string_pretty(r).unwrap_or_default());
    let body = html! {
        h1 { a href="/" { "shepherd" } " · " a href="/jobs" { "jobs" } " · " span.id { (job.id) } }
        table.facts {
            tr { th { "Kind" } td { a href={ "/jobs?kind=" (job.job_type) } { (job.job_type) } } }
            tr { th { "State" } td { (shown_state(&job.status, job.lock_by.is_some())) } }
            tr { th { "Attempts" } td { (job.attempts) " of " (job.max_attempts) } }
            tr { th { "Run at" } td { (Time(job.run_at).to_string()) } }
            @if let Some(at) = job.lock_at {
                tr { th { "Claimed" } td { (Time(at).to_string()) " by " span.id { (job.lock_by.as_deref().unwrap_or("?")) } } }
            }
            @if let Some(at) = job.done_at {
                tr { th { "Done" } td { (Time(at).to_string()) } }
            }
        }
        @if may_act {
            (job_actions(&job))
        }
        h2 { "Arguments" }
        pre.body { (arguments) }
        h2 { "Last result" }
        @match &result {
            Some(r) => pre.body { (r) },
            None => p.muted { "None yet." },
        }
        h2 { "Events this job recorded" }
        @if rows.is_empty() {
            p.muted { "None." }
        } @else {
            (event_table(&rows, true))
        }
    };
    Ok(page(&format!("shepherd · job {}", job.id), body))
}

/// Retry for a job that ended without success, cancel for one waiting for
/// a worker; the server judges again (`shepherd::jobs::manage`), as the
/// state may have moved since the page was drawn.
fn job_actions(job: &JobDetail) -> Markup {
    let ended =
        job.status == "Killed" || (job.status == "Failed" && job.attempts >= job.max_attempts);
    let waiting = job.lock_by.is_none()
        && (job.status == "Pending" || (job.status == "Failed" && job.attempts < job.max_attempts));
    html! {
        @if ended || waiting {
            h2 { "Actions " a.muted href="/login" { "(log in)" } }
        }
        @if ended {
            form.inline method="post" action="/actions/retry-job" {
                input type="hidden" name="job" value=(job.id);
                input name="reason" aria-label="Reason (recorded with the action)" placeholder="why run it again" maxlength="1000" required;
                " " button type="submit" { "Retry this job" }
            }
        }
        @if waiting {
            form.inline method="post" action="/actions/cancel-job" {
                input type="hidden" name="job" value=(job.id);
                input name="reason" aria-label="Reason (recorded with the action)" placeholder="why cancel" maxlength="1000" required;
                " " button type="submit" { "Cancel this job" }
            }
        }
    }
}
