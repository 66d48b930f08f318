//! `/jobs` and `/jobs/{id}`: the queue as an operator reads it before
//! opening psql. Written as maud templates, which escape every value they
//! are given; the older pages still use the hand-written `html.rs`.

use maud::{Markup, html};
use serde::Deserialize;

use super::outcome::{outcome_now, outcome_words};
use super::*;
use shepherd::jobs::{
    ASSIMILATE_QUEUE, CREATE_DEVICE_QUEUE, DELETE_MACHINE_QUEUE, RECONCILE_QUEUE,
};

const KINDS: [&str; 4] = [
    RECONCILE_QUEUE,
    CREATE_DEVICE_QUEUE,
    ASSIMILATE_QUEUE,
    DELETE_MACHINE_QUEUE,
];

/// The console's one vocabulary for where a job stands, the same in the
/// filter, the list and a job's page. The queue's own statuses do not say
/// it: a claimed job stays `Queued`, a cancelled one is `Killed`, and a
/// creation that gave up ends `Done` (its handler decided, and recorded
/// why), where an operator reads a failure.
const STATES: [&str; 6] = [
    "waiting",
    "running",
    "retrying",
    "done",
    "failed",
    "cancelled",
];

/// Outcomes that end a job's work without what it was for: failures,
/// however the queue filed them.
const FAILED_OUTCOMES: [&str; 5] = ["GivenUp", "RaceLost", "Refused", "Rejected", "Failed"];

/// The SQL condition that a row's outcome is one of [`FAILED_OUTCOMES`]:
/// the one test `/jobs`, a job's page and `/charts` share.
pub(super) fn failed_outcome_sql() -> String {
    format!(
        "coalesce(last_result->>'Ok', '') ~ '^({})\\y'",
        FAILED_OUTCOMES.join("|")
    )
}

/// The queue's own statuses, as `shepherd.queue_depth` names them.
const QUEUE_STATUSES: [&str; 6] = ["Pending", "Queued", "Running", "Done", "Failed", "Killed"];

/// Each state of [`STATES`] (or of [`QUEUE_STATUSES`]) as a condition on
/// an `apalis.jobs` row; only these fixed texts reach the query.
fn state_condition(state: &str) -> String {
    if let Some(raw) = QUEUE_STATUSES.iter().find(|s| **s == state) {
        return format!("status = '{raw}'");
    }
    let failed_outcome = failed_outcome_sql();
    match state {
        "waiting" => "(status = 'Pending' or (status = 'Queued' and lock_by is null))".into(),
        "running" => "(status in ('Queued', 'Running') and lock_by is not null)".into(),
        "retrying" => "(status = 'Failed' and attempts < max_attempts)".into(),
        "done" => format!("(status = 'Done' and not {failed_outcome})"),
        "failed" => format!(
            "((status = 'Failed' and attempts >= max_attempts) or (status = 'Done' and {failed_outcome}))"
        ),
        _ => "status = 'Killed'".into(),
    }
}

/// A row's state in [`STATES`]' words.
fn job_state(
    status: &str,
    claimed: bool,
    attempts: i32,
    max: i32,
    result: Option<&Value>,
) -> &'static str {
    match status {
        "Pending" => "waiting",
        "Queued" | "Running" if claimed => "running",
        "Queued" | "Running" => "waiting",
        "Failed" if attempts < max => "retrying",
        "Failed" => "failed",
        "Killed" => "cancelled",
        _ if outcome_failed(result) => "failed",
        _ => "done",
    }
}

fn outcome_text(result: Option<&Value>) -> Option<&str> {
    result?.get("Ok")?.as_str()
}

fn outcome_failed(result: Option<&Value>) -> bool {
    outcome_text(result).is_some_and(|t| {
        FAILED_OUTCOMES
            .iter()
            .any(|w| t.starts_with(w) && !t[w.len()..].starts_with(char::is_alphanumeric))
    })
}

const PAGE_SIZE: i64 = 50;

fn page(title: &str, body: Markup) -> Html<String> {
    layout(title, false, body)
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct JobFilter {
    kind: Option<String>,
    state: Option<String>,
    /// As typed: a page that is not a number is a page that says so.
    page: Option<String>,
    /// A job id, or text its arguments hold: a reservation, a place
    /// (`web/3`), a machine or a device id, a request.
    q: Option<String>,
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

impl JobRow {
    /// Where the job stands, in [`STATES`]' words.
    fn state(&self) -> &'static str {
        job_state(
            &self.status,
            self.lock_by.is_some(),
            self.attempts,
            self.max_attempts,
            self.last_result.as_ref(),
        )
    }
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
    headers: axum::http::HeaderMap,
    Query(filter): Query<JobFilter>,
) -> Result<Html<String>, Failure> {
    let may_act = viewer(&state, &headers).await.may_act();
    let kind = one_of("kind", filter.kind.as_deref(), &KINDS)?;
    // The queue's own statuses still filter (the overview's queue table and
    // shepherd.queue_depth speak them), as they are.
    let all: Vec<&str> = STATES
        .iter()
        .chain(QUEUE_STATUSES.iter())
        .copied()
        .collect();
    let status = one_of("state", filter.state.as_deref(), &all)?;
    let condition = status
        .as_deref()
        .map_or_else(|| "true".to_string(), state_condition);
    let number = match filter.page.as_deref().filter(|p| !p.is_empty()) {
        None => 1,
        Some(p) => p.parse::<i64>().map_err(|_| {
            Failure::BadRequest(format!(
                "page {p:?} is not a page: pages are numbers from 1"
            ))
        })?,
    };
    if number < 1 {
        return Err(Failure::BadRequest(format!(
            "page {number} is not a page: pages start at 1"
        )));
    }
    let q = filter
        .q
        .as_deref()
        .map(str::trim)
        .filter(|q| !q.is_empty())
        .map(str::to_string);
    // A substring of the arguments, the search's own wildcards taken
    // literally; a place is searched as the unit id it names.
    let pattern = q.as_ref().map(|q| {
        let term = state
            .provider
            .as_ref()
            .and_then(|p| p.unit_by_label(q))
            .map_or_else(|| q.clone(), |unit| unit.to_string());
        let escaped = term
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_");
        format!("%{escaped}%")
    });
    // The condition is one of ours, never the request's text.
    let rows: Vec<JobRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "select id, job_type, status, attempts, max_attempts, run_at, done_at, lock_by, last_result
         from apalis.jobs
         where job_type = any($1) and ($2::text is null or job_type = $2)
           and {condition}
           and ($5::text is null or id = $6
                or shepherd.job_args(job)::text ilike $5)
         order by run_at desc, id desc
         limit $3 offset $4"
    )))
    .bind(KINDS.map(str::to_string).to_vec())
    .bind(&kind)
    .bind(PAGE_SIZE + 1)
    .bind((number - 1) * PAGE_SIZE)
    .bind(&pattern)
    .bind(&q)
    .fetch_all(&state.pool)
    .await
    .map_err(|e| database_failure("jobs", e))?;
    let more = rows.len() as i64 > PAGE_SIZE;
    let rows = &rows[..rows.len().min(PAGE_SIZE as usize)];
    let search = q.clone();
    let link = |page: i64| {
        let mut q = vec![format!("page={page}")];
        if let Some(k) = &kind {
            q.push(format!("kind={k}"));
        }
        if let Some(s) = &status {
            q.push(format!("state={s}"));
        }
        if let Some(text) = &search {
            q.push(format!("q={}", super::machines::percent(text)));
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
            input type="search" name="q" aria-label="Search jobs" value=[q.as_deref()] placeholder="job, reservation, place, machine";
            " "
            button type="submit" { "Show" }
        }
        @if rows.is_empty() {
            p.muted { "No jobs match." }
        } @else {
            // Ticked jobs are retried or cancelled together, with one
            // reason; each is judged on its own.
            @if may_act {
                form #bulk method="post" action="/actions/retry-jobs" {}
                p {
                    input name="reason" form="bulk" aria-label="Reason (recorded with the action)" placeholder="why, for every ticked job" maxlength="1000" required;
                    " " button type="submit" form="bulk" { "Retry the ticked" }
                    " " button type="submit" form="bulk" formaction="/actions/cancel-jobs" { "Cancel the ticked" }
                }
            }
            table.stack {
                thead { tr {
                    @if may_act { th { span.muted { "✓" } } }
                    th { "Job" } th { "Kind" } th { "State" } th { "Runs" }
                    th { "Run at" } th { "Done" } th { "Worker" } th { "Outcome" }
                } }
                tbody {
                    @for j in rows {
                        tr {
                            @if may_act {
                                td data-label="Tick" { input type="checkbox" name="jobs" value=(j.id) form="bulk" aria-label={ "Tick job " (j.id) }; }
                            }
                            td.id data-label="Job" { a href={ "/jobs/" (j.id) } { (j.id) } }
                            td data-label="Kind" { (j.job_type) }
                            td data-label="State" { (j.state()) }
                            td.n data-label="Runs" { (j.attempts) }
                            td data-label="Run at" { (Time(j.run_at).to_string()) }
                            td data-label="Done" { @if let Some(d) = j.done_at { (Time(d).to_string()) } }
                            td.id data-label="Worker" { @if let Some(w) = &j.lock_by { (w) } }
                            td data-label="Outcome" { (outcome_now(&j.status, j.lock_by.is_some(), j.last_result.as_ref())) }
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
    // The list is live, as the overview is (in place, every 5 s).
    Ok(layout("shepherd · jobs", true, body))
}

/// A result cut to a table cell's worth.
/// One attempt of a creation or deletion: a job row of its request.
#[derive(sqlx::FromRow)]
struct AttemptRow {
    #[sqlx(flatten)]
    job: JobRow,
    attempt: Option<i64>,
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

/// One run of a job, as its worker recorded it (`shepherd.job_runs`).
#[derive(sqlx::FromRow)]
struct RunRow {
    run: i32,
    worker: Option<String>,
    started_at: DateTime<Utc>,
    ended_at: DateTime<Utc>,
    outcome: String,
    result: Option<String>,
}

impl RunRow {
    /// How the run ended, in words.
    fn words(&self) -> String {
        let said = self.result.clone().unwrap_or_default();
        match self.outcome.as_str() {
            "ok" => outcome_words(Some(&serde_json::json!({ "Ok": said }))),
            "failed" => outcome_words(Some(&serde_json::json!({ "Err": said }))),
            _ => format!("dropped: {said}"),
        }
    }
}

pub(super) async fn job_page(
    State(state): State<HttpState>,
    headers: axum::http::HeaderMap,
    Path(id): Path<String>,
    Query(done): Query<Done>,
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
    let args: Option<Value> = serde_json::from_slice(&job.job).ok();
    let arguments = match &args {
        Some(v) => serde_json::to_string_pretty(v).unwrap_or_default(),
        None => String::from_utf8_lossy(&job.job).into_owned(),
    };
    let result = job
        .last_result
        .as_ref()
        .map(|r| serde_json::to_string_pretty(r).unwrap_or_default());
    // A creation or deletion runs as one job per attempt, under one
    // request: its attempts are those jobs, each with its own outcome,
    // however many times the queue ran each row.
    let request = args
        .as_ref()
        .and_then(|a| a.get("request"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let attempt = args
        .as_ref()
        .and_then(|a| a.get("attempt"))
        .and_then(Value::as_u64);
    let history: Vec<AttemptRow> = match &request {
        Some(request)
            if job.job_type == CREATE_DEVICE_QUEUE || job.job_type == DELETE_MACHINE_QUEUE =>
        {
            sqlx::query_as(
                "select id, job_type, status, attempts, max_attempts, run_at, done_at, lock_by,
                        last_result,
                        case when jsonb_typeof(shepherd.job_args(job)->'attempt') = 'number'
                             then least((shepherd.job_args(job)->>'attempt')::numeric, 1000000)::bigint
                        end as attempt
                 from apalis.jobs
                 where job_type = $1 and shepherd.job_args(job)->>'request' = $2
                 order by attempt nulls first, run_at, id",
            )
            .bind(&job.job_type)
            .bind(request)
            .fetch_all(&state.pool)
            .await
            .map_err(|e| database_failure("job attempts", e))?
        }
        _ => vec![],
    };
    let runs: Vec<RunRow> = sqlx::query_as(
        "select run, worker, started_at, ended_at, outcome, result
         from shepherd.job_runs where job_id = $1 order by run",
    )
    .bind(&job.id)
    .fetch_all(&state.pool)
    .await
    .map_err(|e| database_failure("job runs", e))?;
    let voice = state.voice();
    let unit = args
        .as_ref()
        .and_then(|a| a.get("reservation"))
        .and_then(Value::as_str)
        .and_then(|r| r.parse::<Uuid>().ok());
    let running = job.lock_by.is_some() && matches!(job.status.as_str(), "Queued" | "Running");
    // A creation that ended without a machine is not run again as a job;
    // its unit's real remedies are offered instead.
    let remedy = match unit {
        Some(unit)
            if may_act
                && job.job_type == shepherd::jobs::CREATE_DEVICE_QUEUE
                && job.status == "Done"
                && outcome_failed(job.last_result.as_ref()) =>
        {
            let penalised: bool = sqlx::query_scalar(
                "select exists (select 1 from shepherd.sinbin
                                where reservation_id = $1 and until > now())",
            )
            .bind(unit)
            .fetch_one(&state.pool)
            .await
            .map_err(|e| database_failure("job", e))?;
            Some(Remedy { unit, penalised })
        }
        _ => None,
    };
    let unrecorded = i64::from(job.attempts) - runs.len() as i64;
    let body = html! {
        h1 { a href="/" { "shepherd" } " · " a href="/jobs" { "jobs" } " · " span.id { (job.id) } }
        (done.banner())
        table.facts {
            tr { th { "Kind" } td { a href={ "/jobs?kind=" (job.job_type) } { (job.job_type) } } }
            tr { th { "State" } td { (job_state(&job.status, job.lock_by.is_some(), job.attempts, job.max_attempts, job.last_result.as_ref())) " " span.muted { "(queue: " (job.status) ")" } } }
            @if job.last_result.is_some() {
                tr { th { "Outcome" } td { (outcome_now(&job.status, job.lock_by.is_some(), job.last_result.as_ref())) } }
            }
            @if let Some(n) = attempt {
                tr { th { "Attempt" } td { (n) " of this " (if job.job_type == DELETE_MACHINE_QUEUE { "deletion" } else { "creation" }) " (each attempt is a job of its own; below)" } }
            }
            @if let Some(unit) = unit {
                tr { th { (capital(voice.words.unit)) } td { (unit_link(unit, &voice)) } }
            }
            tr { th { "Runs of this job" } td { (job.attempts) " " span.muted { "(a run that fails on the database or is cut short by a shutdown is run again, up to " (job.max_attempts) " times; a creation's or deletion's own retries are jobs of their own)" } } }
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
            @if let Some(remedy) = &remedy {
                (remedy_forms(remedy, &voice))
            }
        }
        @if history.len() > 1 || (history.len() == 1 && history[0].job.id != job.id) {
            h2 { "Every attempt of this " (if job.job_type == DELETE_MACHINE_QUEUE { "deletion" } else { "creation" }) }
            table.attempts {
                thead { tr { th { "Attempt" } th { "Job" } th { "State" } th { "Run at" } th { "Done" } th { "Outcome" } } }
                tbody {
                    @for a in &history {
                        tr {
                            td.n { @if let Some(n) = a.attempt { (n) } }
                            td.id {
                                @if a.job.id == job.id { (a.job.id) " (this one)" }
                                @else { a href={ "/jobs/" (a.job.id) } { (a.job.id) } }
                            }
                            td { (a.job.state()) }
                            td { (Time(a.job.run_at).to_string()) }
                            td { @if let Some(d) = a.job.done_at { (Time(d).to_string()) } }
                            td { (outcome_words(a.job.last_result.as_ref())) }
                        }
                    }
                }
            }
        }
        h2 { "Every run of this job" }
        @if runs.is_empty() && job.attempts == 0 && !running {
            p.muted { "Not run yet." }
        } @else {
            table.runs {
                thead { tr { th { "Run" } th { "Worker" } th { "Started" } th { "Took" } th { "Outcome" } } }
                tbody {
                    @for r in &runs {
                        tr {
                            td.n { (r.run) }
                            td.id { (r.worker.as_deref().unwrap_or("")) }
                            td { (Time(r.started_at).to_string()) }
                            td { (format!("{:.1} s", (r.ended_at - r.started_at).num_milliseconds() as f64 / 1000.0)) }
                            td { (r.words()) }
                        }
                    }
                    @if unrecorded > 0 {
                        tr { td.n { "…" } td {} td {} td {} td.muted { (unrecorded) " run(s) the queue counted left no record: a worker stopped mid-run (the queue handed the job on), or could not write it" } }
                    }
                    @if running {
                        tr { td.n { (job.attempts + 1) } td.id { (job.lock_by.as_deref().unwrap_or("")) } td { @if let Some(at) = job.lock_at { (Time(at).to_string()) } } td {} td { "running" } }
                    }
                }
            }
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

/// The unit of a creation that ended without a machine, and whether a
/// penalty keeps passes from creating there.
struct Remedy {
    unit: Uuid,
    penalised: bool,
}

/// What gets a machine onto the unit of a given-up creation: its penalty
/// cleared (if one is in force), and a pass, which creates on a free unit.
fn remedy_forms(r: &Remedy, voice: &Voice) -> Markup {
    let label = voice.label(r.unit).unwrap_or_else(|| r.unit.to_string());
    html! {
        h2 { "Remedies" }
        p.muted { "This creation ended without a machine, and a creation is not run again as a job. "
            @if r.penalised { "Clear the penalty of " (label) " and enqueue a pass: the pass creates there." }
            @else { "Enqueue a pass: it creates on " (label) " if the place is still free." } }
        @if r.penalised {
            form.inline method="post" action="/actions/clear-penalty" {
                input type="hidden" name="reservation" value=(r.unit);
                input name="reason" aria-label="Reason (recorded with the action)" placeholder="why clear" maxlength="1000" required;
                " " button type="submit" { "Clear the penalty of " (label) }
            }
        }
        form.inline method="post" action="/actions/reconcile" {
            button type="submit" { "Enqueue a reconcile pass" }
        }
    }
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
