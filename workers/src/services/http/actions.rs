//! Operator actions on the pages: pause and resume creations, enqueue a
//! pass, clear a penalty, release a machine, retry or cancel a job. Off
//! unless the process was given an operator credential
//! (`--operator-token-file`); the pages stay read-only without it. Each
//! action goes through the same SQL function or queue call as the CLI, so
//! it is checked and recorded the same way, with who: `console:<name>`.
//! Who may act is `sessions.rs`'s to say.

use axum::Extension;
use axum::http::HeaderMap;
use axum::http::header::{HOST, LOCATION, REFERER};
use maud::html;
use serde::Deserialize;

use super::edges::Source;
use super::fleet_actions::{fleet_action, fleet_forms};
use super::*;
use shepherd::jobs::manage::{self, JobActionError};
use shepherd::jobs::{ReconcileArgs, queue};

#[derive(Debug, Default, Deserialize)]
pub(super) struct ActionForm {
    #[serde(default)]
    pub(super) reason: Option<String>,
    #[serde(default)]
    reservation: Option<String>,
    #[serde(default)]
    pub(super) machine: Option<String>,
    #[serde(default)]
    job: Option<String>,
    /// A pool's name, its new count, and `yes` to confirm deletions.
    #[serde(default)]
    pub(super) pool: Option<String>,
    #[serde(default)]
    pub(super) count: Option<String>,
    #[serde(default)]
    pub(super) confirm: Option<String>,
    /// A setting's new value (the machine limit).
    #[serde(default)]
    pub(super) value: Option<String>,
}

pub(super) async fn act(
    State(state): State<HttpState>,
    Path(action): Path<String>,
    Extension(source): Extension<Source>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let back = came_from(&headers);
    match act_on(&state, &action, &headers, &source, &body).await {
        Ok(done) => done,
        // A refusal is a page that says why, with the way back to the form.
        Err(failure) => failure.page(back.as_deref()),
    }
}

/// The page of this site the request's form was on (its `Referer`),
/// without a `done=` banner of an earlier action.
fn came_from(headers: &HeaderMap) -> Option<String> {
    let referer = headers.get(REFERER)?.to_str().ok()?;
    let host = headers.get(HOST)?.to_str().ok()?;
    let rest = referer.split_once("://")?.1;
    let path = rest.strip_prefix(host)?;
    if !path.starts_with('/') || path.starts_with("//") {
        return None;
    }
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let kept: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("done="))
        .collect();
    Some(if kept.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", kept.join("&"))
    })
}

async fn act_on(
    state: &HttpState,
    action: &str,
    headers: &HeaderMap,
    source: &Source,
    body: &[u8],
) -> Result<Response, Failure> {
    let by = operator(state, headers, source).await?;
    // A form, or nothing at all (`curl -X POST` for a pass).
    let form: ActionForm = if body.is_empty() {
        ActionForm::default()
    } else {
        serde_urlencoded::from_bytes(body)
            .map_err(|e| Failure::BadRequest(format!("the form does not read: {e}")))?
    };
    if let Some(acted) = fleet_action(state, action, &form, &by).await {
        let acted = acted?;
        tracing::info!(action, by, "console action");
        return see_other(&acted.back, action);
    }
    let reason = form.reason.unwrap_or_default();
    let pool = &state.pool;
    let mut back = "/".to_string();
    let done = match action {
        "pause" | "resume" => {
            let sql = if action == "pause" {
                "select shepherd.pause_creations($1, $2)"
            } else {
                "select shepherd.resume_creations($1, $2)"
            };
            let changed: Result<bool, sqlx::Error> = sqlx::query_scalar(sql)
                .bind(&reason)
                .bind(&by)
                .fetch_one(pool)
                .await;
            match changed {
                // As the CLI says it: nothing was recorded.
                Ok(false) => {
                    return Err(Failure::Conflict(format!(
                        "creations are already {}; nothing was recorded",
                        if action == "pause" {
                            "paused"
                        } else {
                            "running"
                        }
                    )));
                }
                other => other.map(drop),
            }
        }
        "clear-penalty" => {
            let reservation: Uuid = form
                .reservation
                .as_deref()
                .and_then(|r| r.parse().ok())
                .ok_or_else(|| Failure::BadRequest("which reservation? (a UUID)".into()))?;
            let cleared: Result<bool, sqlx::Error> =
                sqlx::query_scalar("select shepherd.clear_penalty($1, $2, $3)")
                    .bind(reservation)
                    .bind(&reason)
                    .bind(&by)
                    .fetch_one(pool)
                    .await;
            match cleared {
                // As the CLI says it: nothing was recorded.
                Ok(false) => {
                    return Err(Failure::NotFound(format!(
                        "{reservation} has no penalty in force; nothing was cleared"
                    )));
                }
                other => other.map(drop),
            }
        }
        "release" => {
            let machine = form
                .machine
                .filter(|m| !m.trim().is_empty())
                .ok_or_else(|| {
                    Failure::BadRequest("which machine? (its id or device id)".into())
                })?;
            back = "/machines".into();
            // The same judgement as `shepherd machines release`: only a
            // machine the provider no longer has is released, else the next
            // pass adopts it again under a new id and the log lies.
            let device: Option<String> = sqlx::query_scalar(
                "select provider_id from shepherd.managed_machines
                 where machine_id::text = $1 or provider_id = $1",
            )
            .bind(machine.trim())
            .fetch_optional(pool)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "reading the machine to release");
                Failure::Unavailable
            })?;
            let Some(device) = device else {
                return Err(Failure::NotFound(format!(
                    "no managed machine has id or device {}",
                    machine.trim()
                )));
            };
            let Some(provider) = &state.provider else {
                return Err(Failure::Conflict(
                    "this process does not speak to the provider; release the machine from a \
                     worker's page or with shepherd machines release"
                        .into(),
                ));
            };
            match provider.machine(&device).await {
                Err(e) if e.not_found() => {}
                Ok(facts) if facts.foreign.is_some() => {}
                Ok(_) => {
                    return Err(Failure::Conflict(format!(
                        "machine {device} still exists at the provider; only a machine the \
                         provider no longer has is released (to delete it: shepherd machines \
                         deprovision {device} --reason ...)"
                    )));
                }
                Err(e) => {
                    return Err(Failure::Conflict(format!(
                        "the provider could not be asked about {device}: {e}; nothing was released"
                    )));
                }
            }
            // With a pass to look again, so that the discrepancy the missing
            // machine raised clears now rather than at the next tick.
            async {
                let mut tx = pool.begin().await?;
                sqlx::query(
                    "select shepherd.release_machine($1, $2, $3, p_provider_says_gone => true)",
                )
                .bind(machine.trim())
                .bind(&reason)
                .bind(&by)
                .execute(&mut *tx)
                .await?;
                queue::push_reconcile(
                    &mut tx,
                    &ReconcileArgs {
                        requested_by: format!("{by} (after a release)"),
                    },
                    None,
                )
                .await?;
                tx.commit().await
            }
            .await
        }
        "retry-jobs" | "cancel-jobs" => {
            // Several jobs, one reason: each judged on its own, as one
            // would be; the answer says what was done and what was refused.
            let pairs: Vec<(String, String)> = serde_urlencoded::from_bytes(body)
                .map_err(|e| Failure::BadRequest(format!("the form does not read: {e}")))?;
            let jobs: Vec<String> = pairs
                .into_iter()
                .filter(|(k, v)| k == "jobs" && !v.is_empty())
                .map(|(_, v)| v)
                .collect();
            if jobs.is_empty() {
                return Err(Failure::BadRequest("which jobs? tick at least one".into()));
            }
            if jobs.len() > 100 {
                return Err(Failure::BadRequest(format!(
                    "{} jobs at once: at most 100",
                    jobs.len()
                )));
            }
            if reason.trim().is_empty() {
                return Err(Failure::BadRequest(
                    "say why: the log records the reason with who acted".into(),
                ));
            }
            let retry = action == "retry-jobs";
            let mut done = vec![];
            let mut refused = vec![];
            for job in &jobs {
                let acted = if retry {
                    manage::retry(pool, job, &by, &reason).await
                } else {
                    manage::cancel(pool, job, &by, &reason).await
                };
                match acted {
                    Ok(()) => done.push(job.clone()),
                    Err(JobActionError::Store(e)) => return Err(store_failure("job action", e)),
                    Err(e) => refused.push((job.clone(), e.to_string())),
                }
            }
            tracing::info!(
                action,
                by,
                done = done.len(),
                refused = refused.len(),
                "console action"
            );
            let verb = if retry { "retried" } else { "cancelled" };
            let page = layout(
                "shepherd · jobs",
                false,
                html! {
                    h1 { a href="/" { "shepherd" } " · " a href="/jobs" { "jobs" } }
                    p { (done.len()) " of " (jobs.len()) " " (verb) ", by " (by) ": " (reason) }
                    @if !done.is_empty() {
                        ul.done { @for j in &done { li { a href={ "/jobs/" (j) } { (j) } } } }
                    }
                    @if !refused.is_empty() {
                        h2 { "Refused" }
                        ul.refused { @for (j, why) in &refused { li { a href={ "/jobs/" (j) } { (j) } ": " (why) } } }
                    }
                },
            );
            let status = if done.is_empty() {
                StatusCode::CONFLICT
            } else {
                StatusCode::OK
            };
            return Ok((status, page).into_response());
        }
        "retry-job" | "cancel-job" => {
            let job = form
                .job
                .filter(|j| !j.is_empty())
                .ok_or_else(|| Failure::BadRequest("which job? (its id)".into()))?;
            if reason.trim().is_empty() {
                return Err(Failure::BadRequest(
                    "say why: the log records the reason with who acted".into(),
                ));
            }
            let acted = if action == "retry-job" {
                manage::retry(pool, &job, &by, &reason).await
            } else {
                manage::cancel(pool, &job, &by, &reason).await
            };
            match acted {
                Ok(()) => {}
                Err(e @ JobActionError::NotFound(_)) => {
                    return Err(Failure::NotFound(e.to_string()));
                }
                Err(JobActionError::Refused(why)) => return Err(Failure::Conflict(why)),
                Err(JobActionError::Store(e)) => return Err(store_failure("job action", e)),
            }
            back = format!("/jobs/{job}");
            Ok(())
        }
        "reconcile" => {
            async {
                let mut tx = pool.begin().await?;
                queue::push_reconcile(
                    &mut tx,
                    &ReconcileArgs {
                        requested_by: by.clone(),
                    },
                    None,
                )
                .await?;
                tx.commit().await
            }
            .await
        }
        other => {
            return Err(Failure::NotFound(format!(
                "no action {other:?}: the actions are pause, resume, reconcile, clear-penalty, \
                 release, retry-job, cancel-job, retry-jobs, cancel-jobs, pool-count, limit, \
                 deprovision, protect, unprotect, pause-deletions and resume-deletions"
            )));
        }
    };
    match done {
        Ok(()) => {
            tracing::info!(action, by, "console action");
            see_other(&back, action)
        }
        Err(e) => Err(database_failure("action", e)),
    }
}

/// Back to the page, which says what was done (a fixed text per action,
/// never text from the address).
fn see_other(back: &str, action: &str) -> Result<Response, Failure> {
    let back = format!("{back}?done={action}");
    let back = axum::http::HeaderValue::from_str(&back)
        .map_err(|_| Failure::BadRequest("that job id is not a job id".into()))?;
    Ok((StatusCode::SEE_OTHER, [(LOCATION, back)]).into_response())
}

/// What a page says after an action succeeded: `?done=<action>`, mapped
/// to fixed words, so a crafted address can only show one of these.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Done {
    pub(super) done: Option<String>,
}

impl Done {
    /// The banner, said of the present: an action undone since (the page
    /// reloads itself every 5 s with its address) says so, rather than
    /// what is no longer true.
    pub(super) fn banner_now(&self, paused_now: bool, deletions_paused_now: bool) -> maud::Markup {
        let undone = match self.done.as_deref() {
            Some("pause-deletions") if !deletions_paused_now => {
                Some("deletions were paused from here, and are running again since.")
            }
            Some("resume-deletions") if deletions_paused_now => {
                Some("deletions were resumed from here, and are paused again since.")
            }
            Some("pause") if !paused_now => {
                Some("creations were paused from here, and are running again since.")
            }
            Some("resume") if paused_now => {
                Some("creations were resumed from here, and are paused again since.")
            }
            _ => None,
        };
        match undone {
            Some(words) => html! { p.done.undone role="status" { "Done, and undone: " (words) } },
            None => self.banner(),
        }
    }

    pub(super) fn banner(&self) -> maud::Markup {
        let words = match self.done.as_deref() {
            Some("pause") => "Creations are paused.",
            Some("resume") => "Creations are running again.",
            Some("reconcile") => "A reconcile pass is queued.",
            Some("clear-penalty") => "The penalty is cleared.",
            Some("release") => "The machine is released; a pass is queued to look again.",
            Some("retry-job") => "The job is queued to run again.",
            Some("cancel-job") => "The job is cancelled.",
            Some("pool-count") => {
                "The pool's count is changed for every worker; the next pass creates or deletes to match."
            }
            Some("limit") => "The machine limit is changed for every worker.",
            Some("deprovision") => {
                "The machine is leaving: its deletion job checks the request again, then deletes it."
            }
            Some("protect") => "The machine is protected: shepherd does not delete it.",
            Some("unprotect") => "The machine is no longer protected.",
            Some("pause-deletions") => "Deletions are paused; creations and passes go on.",
            Some("resume-deletions") => "Deletions are running again.",
            _ => return html! {},
        };
        html! { p.done role="status" { "Done: " (words) } }
    }
}

/// The actions' forms on the status page, for the operator logged in.
pub(super) fn action_forms(o: &Overview, who: &str, voice: &Voice) -> maud::Markup {
    html! {
        h2 { "Actions" }
        p.muted { "Logged in as " strong { (who) } ". " (logout_form()) }
        @if o.paused.is_some() {
            form.inline method="post" action="/actions/resume" {
                input name="reason" aria-label="Reason (recorded with the action)" placeholder="why resume" maxlength="1000" required;
                " " button type="submit" { "Resume creations" }
            }
        } @else {
            form.inline method="post" action="/actions/pause" {
                input name="reason" aria-label="Reason (recorded with the action)" placeholder="why pause" maxlength="1000" required;
                " " button type="submit" { "Pause creations" }
            }
        }
        form.inline method="post" action="/actions/reconcile" {
            button type="submit" { "Enqueue a reconcile pass" }
        }
        (fleet_forms(o))
        @for p in &o.penalised {
            form.inline method="post" action="/actions/clear-penalty" {
                input type="hidden" name="reservation" value=(p.reservation_id);
                input name="reason" aria-label="Reason (recorded with the action)" placeholder="why clear" maxlength="1000" required;
                " " button type="submit" { "Clear the penalty of " (voice.label(p.reservation_id).unwrap_or_else(|| p.reservation_id.to_string())) }
            }
        }
    }
}
