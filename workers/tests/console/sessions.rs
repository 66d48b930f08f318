//! Console sessions: held in Postgres for the whole cluster, never the
//! credential in a cookie, ended everywhere, and throttled log-ins.

use super::*;

/// Logging in starts a session that any worker's page accepts: the cookie
/// holds a random id, never the credential; the page says who is logged in
/// and shows the forms only to them; logging out on one worker ends the
/// session on every worker, and so does its expiry.
#[sqlx::test(migrations = false)]
async fn a_session_is_the_clusters_and_ends_everywhere(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    const CREDENTIAL: &str = "s3cret-operator-credential";
    let http = no_redirects();
    let a = Server::start_with(pool.clone(), Some(CREDENTIAL)).await;
    let b = Server::start_with(pool.clone(), Some(CREDENTIAL)).await;
    // Anonymous: an invitation to log in, and no form.
    let (_, _, page) = a.get("/").await;
    assert!(page.contains("Log in to act"), "{page}");
    assert!(
        !page.contains("/actions/pause"),
        "a form for nobody: {page}"
    );

    let r = post_form(
        &http,
        format!("{}/login", a.base),
        &[("x-forwarded-proto", "https")],
        &[("who", "alice"), ("token", CREDENTIAL)],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let set: Vec<String> = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let session = set
        .iter()
        .find(|c| c.starts_with("shepherd_session="))
        .unwrap_or_else(|| panic!("no session cookie: {set:?}"));
    for flag in ["HttpOnly", "SameSite=Strict", "Secure", "Max-Age="] {
        assert!(session.contains(flag), "{flag} missing: {session}");
    }
    assert!(
        set.iter().all(|c| !c.contains(CREDENTIAL)),
        "the credential is in a cookie: {set:?}"
    );
    let cookie = session.split(';').next().unwrap().to_string();
    let stored: i64 = sqlx::query_scalar(
        "select count(*) from shepherd.console_sessions where id_hash = $1 or who <> 'alice'",
    )
    .bind(cookie.trim_start_matches("shepherd_session="))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(stored, 0, "the session id is stored as it is, not hashed");

    // The other worker knows the session: it says who, shows the forms,
    // and records the action under that name.
    let page = http
        .get(format!("{}/", b.base))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Logged in as"), "{page}");
    assert!(page.contains("alice"), "{page}");
    assert!(page.contains("/actions/pause"), "{page}");
    let r = post_form(
        &http,
        format!("{}/actions/pause", b.base),
        &[("cookie", &cookie)],
        &[("reason", "maintenance")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let by: String = recorded_by(&pool, "creations_paused").await;
    assert_eq!(by, "console:alice");

    // Logged out on the first worker: the second refuses the cookie.
    let r = post_form(
        &http,
        format!("{}/logout", a.base),
        &[("cookie", &cookie)],
        &[],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(r.headers().get_all("set-cookie").iter().any(|v| {
        v.to_str()
            .unwrap()
            .starts_with("shepherd_session=; Path=/; Max-Age=0")
    }));
    let r = post_form(
        &http,
        format!("{}/actions/resume", b.base),
        &[("cookie", &cookie)],
        &[("reason", "done")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.text().await.unwrap().contains("ended or expired"));

    // A fresh session, expired: refused by every worker too.
    let r = post_form(
        &http,
        format!("{}/login", b.base),
        &[],
        &[("who", "bob"), ("token", CREDENTIAL)],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let set: Vec<String> = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    let bob = set
        .iter()
        .find(|c| c.starts_with("shepherd_session="))
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert!(
        !set.iter().any(|c| c.contains("Secure")),
        "Secure over plain HTTP: {set:?}"
    );
    sqlx::query(
        "update shepherd.console_sessions set expires_at = now() - interval '1 second'
         where who = 'bob'",
    )
    .execute(&pool)
    .await
    .unwrap();
    for server in [&a, &b] {
        let r = post_form(
            &http,
            format!("{}/actions/resume", server.base),
            &[("cookie", &bob)],
            &[("reason", "done")],
        )
        .await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
    let resumed: i64 = count_events(&pool, "creations_resumed").await;
    assert_eq!(resumed, 0, "an ended session acted");
    a.stop().await;
    b.stop().await;
}

/// A burst of wrong log-ins is throttled across the cluster and recorded:
/// after ten in a minute every log-in is 429, even with the right
/// credential, whichever worker it reaches.
#[sqlx::test(migrations = false)]
async fn a_burst_of_wrong_log_ins_is_throttled_and_recorded(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let http = no_redirects();
    let a = Server::start_with(pool.clone(), Some("right")).await;
    let b = Server::start_with(pool.clone(), Some("right")).await;
    let mut statuses = vec![];
    for i in 0..40 {
        let server = if i % 2 == 0 { &a } else { &b };
        let r = post_form(
            &http,
            format!("{}/login", server.base),
            &[],
            &[("who", "mallory"), ("token", &format!("guess-{i}"))],
        )
        .await;
        statuses.push(r.status().as_u16());
    }
    assert_eq!(&statuses[..10], &[401; 10], "{statuses:?}");
    assert!(statuses[10..].iter().all(|s| *s == 429), "{statuses:?}");
    let r = post_form(
        &http,
        format!("{}/login", a.base),
        &[],
        &[("who", "alice"), ("token", "right")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.headers().get("retry-after").and_then(|v| v.to_str().ok()),
        Some("60")
    );
    let recorded: i64 = sqlx::query_scalar(
        "select count(*) from shepherd.console_login_failures where who = 'mallory'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(recorded, 10);
    let sessions: i64 = sqlx::query_scalar("select count(*) from shepherd.console_sessions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(sessions, 0);
    a.stop().await;
    b.stop().await;
}
