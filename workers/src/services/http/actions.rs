//! Operator actions on the pages: pause and resume creations, enqueue a
//! pass, clear a penalty, release a machine, retry or cancel a job. Off unless the process was given an operator
//! credential (`--operator-token-file`); the pages stay read-only without
//! it. Each action goes through the same SQL function or queue call as the
//! CLI, so it is checked and recorded the same way, with who: `console:<name>`.
//!
//! A browser logs in once (`/login`) and gets a session: a random id in an
//! HttpOnly, SameSite=Strict cookie (Secure behind a proxy that says the
//! request came over TLS), which a cross-site form never sends; the
//! credential itself never leaves the login form. Sessions live in Postgres
//! (`shepherd.console_sessions`, by the id's SHA-256), so every worker's
//! page accepts them and a log-out or the expiry ends them everywhere.
//! Every credential check, form or bearer, is counted and throttled per
//! source (`credential.rs`); a session ends when the credential changes. A request
//! that says where it comes from (`Origin`) must come from this host.
//! Scripts send `Authorization: Bearer <credential>` and name themselves
//! in `X-Shepherd-Operator`.

use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE, HOST, LOCATION, ORIGIN, REFERER, SET_COOKIE};
use axum::{Extension, Form};
use maud::html;
use serde::Deserialize;

use super::credential::{self, Door};
use super::edges::Source;
use super::*;
use shepherd::jobs::manage::{self, JobActionError};
use shepherd::jobs::{ReconcileArgs, queue};

/// The session cookie over plain HTTP (a console on loopback or a private
/// network).
const SESSION_COOKIE: &str = "shepherd_session";
/// The session cookie over TLS: the `__Host-` prefix makes the browser
/// keep it only if it is Secure, for this host alone and every path, so a
/// sibling site cannot plant one.
const SECURE_SESSION_COOKIE: &str = "__Host-shepherd_session";
/// Cookies of builds that kept the credential itself in the browser: a
/// log-in or log-out clears them.
const OLD_COOKIES: [&str; 2] = ["shepherd_operator", "shepherd_who"];
/// How long a session lasts: an on-call shift.
const SESSION_HOURS: i64 = 12;

/// Who is looking at a page, for what the page offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Viewer {
    /// Actions are off on this process.
    ReadOnly,
    /// Actions are on; nobody is logged in.
    Anonymous,
    /// Logged in, with a live session.
    Operator(String),
}

impl Viewer {
    pub(super) fn may_act(&self) -> bool {
        matches!(self, Viewer::Operator(_))
    }
}

/// The viewer a request's cookies make: an operator only with a session
/// that has neither ended nor expired.
pub(super) async fn viewer(state: &HttpState, headers: &HeaderMap) -> Viewer {
    if state.operator_token.is_none() {
        return Viewer::ReadOnly;
    }
    let Some(id) = session_cookie(headers) else {
        return Viewer::Anonymous;
    };
    match session(state, id).await {
        Ok(Some(who)) => Viewer::Operator(who),
        Ok(None) => Viewer::Anonymous,
        Err(e) => {
            tracing::warn!(error = %e, "reading a console session");
            Viewer::Anonymous
        }
    }
}

/// The operator a session id stands for: a session neither ended nor
/// expired, made with the credential this process holds now.
async fn session(state: &HttpState, id: &str) -> Result<Option<String>, sqlx::Error> {
    let Some(token) = &state.operator_token else {
        return Ok(None);
    };
    sqlx::query_scalar(
        "select who from shepherd.console_sessions
         where id_hash = encode(sha256(convert_to($1, 'UTF8')), 'hex')
           and credential = $2
           and ended_at is null and now() < expires_at",
    )
    .bind(id)
    .bind(credential::fingerprint(token.expose()))
    .fetch_optional(&state.pool)
    .await
}

/// The request's session id, from the cookie its scheme allows: over TLS
/// only the `__Host-` one.
fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    cookie(headers, session_cookie_name(headers))
}

fn session_cookie_name(headers: &HeaderMap) -> &'static str {
    if over_tls(headers) {
        SECURE_SESSION_COOKIE
    } else {
        SESSION_COOKIE
    }
}

/// Whether the browser reached us over TLS (this server speaks plain
/// HTTP; a proxy in front says so in `X-Forwarded-Proto`).
fn over_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.trim().eq_ignore_ascii_case("https"))
}

fn off() -> Failure {
    Failure::Forbidden(
        "actions are off: start this worker or scheduler with --operator-token-file \
         (SHEPHERD_OPERATOR_TOKEN_FILE) to allow them"
            .into(),
    )
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

/// Who is acting: a script with the credential that names itself, or a
/// browser with a live session.
async fn operator(
    state: &HttpState,
    headers: &HeaderMap,
    source: &Source,
) -> Result<String, Failure> {
    let Some(token) = &state.operator_token else {
        return Err(off());
    };
    same_origin(headers)?;
    let bearer = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if let Some(given) = bearer {
        let who = headers
            .get("x-shepherd-operator")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        credential::check(
            &state.pool,
            &source.0,
            Door::Bearer,
            &truncated(who),
            given,
            token.expose(),
        )
        .await?;
        if !valid_name(who) {
            return Err(Failure::BadRequest(
                "name yourself in X-Shepherd-Operator: the log records who acted (letters, \
                 digits, . _ - @, up to 64)"
                    .into(),
            ));
        }
        return Ok(format!("console:{who}"));
    }
    let Some(id) = session_cookie(headers) else {
        return Err(Failure::Unauthorized(
            "log in first (/login), or send Authorization: Bearer <credential>".into(),
        ));
    };
    match session(state, id).await {
        Ok(Some(who)) => Ok(format!("console:{who}")),
        Ok(None) => Err(Failure::Unauthorized(
            "your session has ended or expired: log in again (/login)".into(),
        )),
        Err(e) => Err(database_failure("reading a console session", e)),
    }
}

pub(super) async fn login_page(
    State(state): State<HttpState>,
    headers: HeaderMap,
) -> Result<Html<String>, Failure> {
    if state.operator_token.is_none() {
        return Err(off());
    }
    let viewer = viewer(&state, &headers).await;
    Ok(layout(
        "shepherd · log in",
        false,
        html! {
            h1 { a href="/" { "shepherd" } " · log in to act" }
            @if let Viewer::Operator(who) = &viewer {
                p { "Logged in as " strong { (who) } ". " }
                (logout_form())
            } @else {
                form method="post" action="/login" {
                    p { label { "Your name (recorded with every action) " input name="who" maxlength="64" required autocomplete="username"; } }
                    p { label { "Operator credential " input type="password" name="token" required autocomplete="current-password"; } }
                    button type="submit" { "Log in" }
                }
            }
        },
    ))
}

/// The log-out button.
pub(super) fn logout_form() -> maud::Markup {
    html! {
        form.inline method="post" action="/logout" {
            button type="submit" { "Log out" }
        }
    }
}

#[derive(Deserialize)]
pub(super) struct Login {
    who: String,
    token: String,
}

pub(super) async fn login(
    State(state): State<HttpState>,
    Extension(source): Extension<Source>,
    headers: HeaderMap,
    Form(login): Form<Login>,
) -> Result<Response, Failure> {
    let Some(token) = &state.operator_token else {
        return Err(off());
    };
    same_origin(&headers)?;
    let pool = &state.pool;
    credential::check(
        pool,
        &source.0,
        Door::LogIn,
        &truncated(&login.who),
        &login.token,
        token.expose(),
    )
    .await?;
    if !valid_name(&login.who) {
        return Err(Failure::BadRequest(
            "a name of letters, digits, . _ - or @, up to 64".into(),
        ));
    }
    // Sessions and failures past any use go with the next log-in, so the
    // tables stay the size of a few shifts.
    sqlx::query(
        "with s as (delete from shepherd.console_sessions
                    where coalesce(ended_at, expires_at) < now() - interval '7 days')
         delete from shepherd.console_login_failures where at < now() - interval '7 days'",
    )
    .execute(pool)
    .await
    .map_err(|e| database_failure("pruning old console sessions", e))?;
    // 244 random bits, from the OS's generator through uuid's v4.
    let id = format!("{}{}", Uuid::new_v4().simple(), Uuid::new_v4().simple());
    sqlx::query(
        "insert into shepherd.console_sessions (id_hash, who, expires_at, credential)
         values (encode(sha256(convert_to($1, 'UTF8')), 'hex'), $2,
                 now() + make_interval(hours => $3), $4)",
    )
    .bind(&id)
    .bind(&login.who)
    .bind(SESSION_HOURS as i32)
    .bind(credential::fingerprint(token.expose()))
    .execute(pool)
    .await
    .map_err(|e| database_failure("starting a console session", e))?;
    tracing::info!(who = %login.who, source = %source.0, "console log-in");
    let mut response = (StatusCode::SEE_OTHER, [(LOCATION, "/")]).into_response();
    let mut cookies = vec![format!(
        "{}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{}",
        session_cookie_name(&headers),
        SESSION_HOURS * 3600,
        if over_tls(&headers) { "; Secure" } else { "" }
    )];
    cookies.extend(
        OLD_COOKIES
            .iter()
            .map(|c| format!("{c}=; Path=/; Max-Age=0")),
    );
    set_cookies(&mut response, &cookies)?;
    Ok(response)
}

/// Ends the request's session everywhere and forgets its cookie.
pub(super) async fn logout(
    State(state): State<HttpState>,
    headers: HeaderMap,
) -> Result<Response, Failure> {
    if state.operator_token.is_none() {
        return Err(off());
    }
    same_origin(&headers)?;
    if let Some(id) = session_cookie(&headers) {
        let ended: Option<String> = sqlx::query_scalar(
            "update shepherd.console_sessions set ended_at = now()
             where id_hash = encode(sha256(convert_to($1, 'UTF8')), 'hex') and ended_at is null
             returning who",
        )
        .bind(id)
        .fetch_optional(&state.pool)
        .await
        .map_err(|e| database_failure("ending a console session", e))?;
        if let Some(who) = ended {
            tracing::info!(%who, "console log-out");
        }
    }
    let mut response = (StatusCode::SEE_OTHER, [(LOCATION, "/")]).into_response();
    let name = session_cookie_name(&headers);
    let secure = if over_tls(&headers) { "; Secure" } else { "" };
    let cookies: Vec<String> = std::iter::once(format!("{name}=; Path=/; Max-Age=0{secure}"))
        .chain(OLD_COOKIES.map(|c| format!("{c}=; Path=/; Max-Age=0")))
        .collect();
    set_cookies(&mut response, &cookies)?;
    Ok(response)
}

fn set_cookies(response: &mut Response, cookies: &[String]) -> Result<(), Failure> {
    for cookie in cookies {
        let value = axum::http::HeaderValue::from_str(cookie)
            .map_err(|_| Failure::BadRequest("that name is not a valid cookie value".into()))?;
        response.headers_mut().append(SET_COOKIE, value);
    }
    Ok(())
}

/// A name as typed, cut to what the record keeps.
fn truncated(who: &str) -> String {
    who.chars().take(64).collect()
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
                 release, retry-job, cancel-job, retry-jobs and cancel-jobs"
            )));
        }
    };
    match done {
        Ok(()) => {
            tracing::info!(action, by, "console action");
            // The page says what was done (a fixed text per action, never
            // text from the address).
            let back = format!("{back}?done={action}");
            let back = axum::http::HeaderValue::from_str(&back)
                .map_err(|_| Failure::BadRequest("that job id is not a job id".into()))?;
            Ok((StatusCode::SEE_OTHER, [(LOCATION, back)]).into_response())
        }
        Err(e) => Err(database_failure("action", e)),
    }
}

/// What a page says after an action succeeded: `?done=<action>`, mapped
/// to fixed words, so a crafted address can only show one of these.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Done {
    pub(super) done: Option<String>,
}

impl Done {
    pub(super) fn banner(&self) -> maud::Markup {
        let words = match self.done.as_deref() {
            Some("pause") => "Creations are paused.",
            Some("resume") => "Creations are running again.",
            Some("reconcile") => "A reconcile pass is queued.",
            Some("clear-penalty") => "The penalty is cleared.",
            Some("release") => "The machine is released; a pass is queued to look again.",
            Some("retry-job") => "The job is queued to run again.",
            Some("cancel-job") => "The job is cancelled.",
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
        @for p in &o.penalised {
            form.inline method="post" action="/actions/clear-penalty" {
                input type="hidden" name="reservation" value=(p.reservation_id);
                input name="reason" aria-label="Reason (recorded with the action)" placeholder="why clear" maxlength="1000" required;
                " " button type="submit" { "Clear the penalty of " (voice.label(p.reservation_id).unwrap_or_else(|| p.reservation_id.to_string())) }
            }
        }
    }
}
