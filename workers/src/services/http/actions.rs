//! Operator actions on the pages: pause and resume creations, enqueue a
//! pass, clear a penalty, release a machine, retry or cancel a job. Off unless the process was given an operator
//! credential (`--operator-token-file`); the pages stay read-only without
//! it. Each action goes through the same SQL function or queue call as the
//! CLI, so it is checked and recorded the same way, with who: `console:<name>`.
//!
//! A browser logs in once (`/login`): the credential is kept in an
//! HttpOnly, SameSite=Strict cookie, which a cross-site form never sends;
//! a request that says where it comes from (`Origin`) must come from this
//! host. Scripts send `Authorization: Bearer <credential>` and name
//! themselves in `X-Shepherd-Operator`.

use axum::Form;
use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE, HOST, LOCATION, ORIGIN, SET_COOKIE};
use maud::html;
use serde::Deserialize;

use super::*;
use shepherd::jobs::manage::{self, JobActionError};
use shepherd::jobs::{ReconcileArgs, queue};

const TOKEN_COOKIE: &str = "shepherd_operator";
const WHO_COOKIE: &str = "shepherd_who";

fn off() -> Failure {
    Failure::Forbidden(
        "actions are off: start this worker or scheduler with --operator-token-file \
         (SHEPHERD_OPERATOR_TOKEN_FILE) to allow them"
            .into(),
    )
}

/// Compares without stopping at the first difference.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A browser's request from another site is refused whatever it carries.
fn same_origin(headers: &HeaderMap) -> Result<(), Failure> {
    let Some(origin) = headers.get(ORIGIN).and_then(|v| v.to_str().ok()) else {
        return Ok(());
    };
    let host = headers
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let from = origin.split_once("://").map_or(origin, |(_, rest)| rest);
    if from == host {
        Ok(())
    } else {
        Err(Failure::Forbidden(format!(
            "a request from {origin} may not act on {host}"
        )))
    }
}

/// An operator's name: what `console:<name>` records.
fn valid_name(who: &str) -> bool {
    !who.is_empty()
        && who.len() <= 64
        && who
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'))
}

/// Who is acting, if the request carries the credential.
fn operator(state: &HttpState, headers: &HeaderMap) -> Result<String, Failure> {
    let Some(token) = &state.operator_token else {
        return Err(off());
    };
    same_origin(headers)?;
    let bearer = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let given = bearer.or_else(|| cookie(headers, TOKEN_COOKIE));
    if !given.is_some_and(|g| same_secret(g, token.expose())) {
        return Err(Failure::Unauthorized(
            "log in first (/login), or send Authorization: Bearer <credential>".into(),
        ));
    }
    let who = headers
        .get("x-shepherd-operator")
        .and_then(|v| v.to_str().ok())
        .or_else(|| cookie(headers, WHO_COOKIE))
        .unwrap_or("");
    if !valid_name(who) {
        return Err(Failure::BadRequest(
            "name yourself: the log records who acted (letters, digits, . _ - @)".into(),
        ));
    }
    Ok(format!("console:{who}"))
}

pub(super) async fn login_page(State(state): State<HttpState>) -> Result<Html<String>, Failure> {
    if state.operator_token.is_none() {
        return Err(off());
    }
    Ok(layout(
        "shepherd · log in",
        false,
        html! {
            h1 { a href="/" { "shepherd" } " · log in to act" }
            form method="post" action="/login" {
                p { label { "Your name (recorded with every action) " input name="who" required; } }
                p { label { "Operator credential " input type="password" name="token" required; } }
                button type="submit" { "Log in" }
            }
        },
    ))
}

#[derive(Deserialize)]
pub(super) struct Login {
    who: String,
    token: String,
}

pub(super) async fn login(
    State(state): State<HttpState>,
    headers: HeaderMap,
    Form(login): Form<Login>,
) -> Result<Response, Failure> {
    let Some(token) = &state.operator_token else {
        return Err(off());
    };
    same_origin(&headers)?;
    if !same_secret(&login.token, token.expose()) {
        tracing::warn!(who = %login.who, "console log-in refused: wrong credential");
        return Err(Failure::Unauthorized("wrong credential".into()));
    }
    if !valid_name(&login.who) {
        return Err(Failure::BadRequest(
            "a name of letters, digits, . _ - or @, up to 64".into(),
        ));
    }
    let mut response = (StatusCode::SEE_OTHER, [(LOCATION, "/")]).into_response();
    for cookie in [
        format!(
            "{TOKEN_COOKIE}={}; HttpOnly; SameSite=Strict; Path=/",
            token.expose()
        ),
        format!("{WHO_COOKIE}={}; SameSite=Strict; Path=/", login.who),
    ] {
        let value = axum::http::HeaderValue::from_str(&cookie).map_err(|_| {
            Failure::BadRequest("the credential is not a valid cookie value".into())
        })?;
        response.headers_mut().append(SET_COOKIE, value);
    }
    Ok(response)
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct ActionForm {
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    reservation: Option<String>,
    #[serde(default)]
    machine: Option<String>,
    #[serde(default)]
    job: Option<String>,
}

pub(super) async fn act(
    State(state): State<HttpState>,
    Path(action): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, Failure> {
    let by = operator(&state, &headers)?;
    // A form, or nothing at all (`curl -X POST` for a pass).
    let form: ActionForm = if body.is_empty() {
        ActionForm::default()
    } else {
        serde_urlencoded::from_bytes(&body)
            .map_err(|e| Failure::BadRequest(format!("the form does not read: {e}")))?
    };
    let reason = form.reason.unwrap_or_default();
    let pool = &state.pool;
    let mut back = "/".to_string();
    let done = match action.as_str() {
        "pause" => sqlx::query("select shepherd.pause_creations($1, $2)")
            .bind(&reason)
            .bind(&by)
            .execute(pool)
            .await
            .map(drop),
        "resume" => sqlx::query("select shepherd.resume_creations($1, $2)")
            .bind(&reason)
            .bind(&by)
            .execute(pool)
            .await
            .map(drop),
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
            sqlx::query("select shepherd.release_machine($1, $2, $3)")
                .bind(machine.trim())
                .bind(&reason)
                .bind(&by)
                .execute(pool)
                .await
                .map(drop)
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
                 release, retry-job and cancel-job"
            )));
        }
    };
    match done {
        Ok(()) => {
            tracing::info!(action, by, "console action");
            let back = axum::http::HeaderValue::from_str(&back)
                .map_err(|_| Failure::BadRequest("that job id is not a job id".into()))?;
            Ok((StatusCode::SEE_OTHER, [(LOCATION, back)]).into_response())
        }
        // The SQL functions refuse bad input with a message for the operator.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("22023") => {
            Err(Failure::BadRequest(e.message().to_string()))
        }
        Err(e) => Err(database_failure("action", e)),
    }
}

/// The actions' forms on the status page, where actions are on.
pub(super) fn action_forms(o: &Overview) -> maud::Markup {
    html! {
        h2 { "Actions " a.muted href="/login" { "(log in)" } }
        @if o.paused.is_some() {
            form.inline method="post" action="/actions/resume" {
                input name="reason" placeholder="why resume" maxlength="1000" required;
                " " button type="submit" { "Resume creations" }
            }
        } @else {
            form.inline method="post" action="/actions/pause" {
                input name="reason" placeholder="why pause" maxlength="1000" required;
                " " button type="submit" { "Pause creations" }
            }
        }
        form.inline method="post" action="/actions/reconcile" {
            button type="submit" { "Enqueue a reconcile pass" }
        }
        @for p in &o.penalised {
            form.inline method="post" action="/actions/clear-penalty" {
                input type="hidden" name="reservation" value=(p.reservation_id);
                input name="reason" placeholder="why clear" maxlength="1000" required;
                " " button type="submit" { "Clear the penalty of " (p.reservation_id) }
            }
        }
    }
}
