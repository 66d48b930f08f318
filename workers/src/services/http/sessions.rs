//! Who may act on the console: a browser's session or a script's bearer
//! credential.
//!
//! A browser logs in once (`/login`) and gets a session: a random id in an
//! HttpOnly, SameSite=Strict cookie (`__Host-` and Secure behind a proxy
//! that says the request came over TLS), which a cross-site form never
//! sends; the credential itself never leaves the login form. Sessions live
//! in Postgres (`shepherd.console_sessions`, by the id's SHA-256, with the
//! credential's fingerprint), so every worker's page accepts them, and a
//! log-out, the expiry or a new credential ends them everywhere. Every
//! credential check, form or bearer, is counted and throttled per source
//! (`credential.rs`). A request that says where it comes from (`Origin`)
//! must come from this host. Scripts send `Authorization: Bearer
//! <credential>` and name themselves in `X-Shepherd-Operator`.

use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, COOKIE, HOST, LOCATION, ORIGIN, SET_COOKIE};
use axum::{Extension, Form};
use maud::html;
use serde::Deserialize;

use super::credential::{self, Door};
use super::edges::Source;
use super::*;

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

pub(super) fn off() -> Failure {
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
pub(super) async fn operator(
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
            who,
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
        &login.who,
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
