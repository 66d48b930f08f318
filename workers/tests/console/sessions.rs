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
    // Over TLS the cookie is a `__Host-` one: Secure, this host, every path.
    let session = set
        .iter()
        .find(|c| c.starts_with("__Host-shepherd_session="))
        .unwrap_or_else(|| panic!("no __Host- session cookie: {set:?}"));
    for flag in [
        "HttpOnly",
        "SameSite=Strict",
        "Secure",
        "Path=/;",
        "Max-Age=",
    ] {
        assert!(session.contains(flag), "{flag} missing: {session}");
    }
    assert!(!session.contains("Domain"), "{session}");
    assert!(
        set.iter().all(|c| !c.contains(CREDENTIAL)),
        "the credential is in a cookie: {set:?}"
    );
    let id = session
        .split(';')
        .next()
        .unwrap()
        .trim_start_matches("__Host-shepherd_session=")
        .to_string();
    // Over TLS, a session under the plain name (one a sibling site could
    // have planted) is not read.
    let r = post_form(
        &http,
        format!("{}/actions/pause", a.base),
        &[
            ("x-forwarded-proto", "https"),
            ("cookie", &format!("shepherd_session={id}")),
        ],
        &[("reason", "planted")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    // The rest speaks plain HTTP, where the cookie has its plain name.
    let cookie = format!("shepherd_session={id}");
    let stored: i64 = sqlx::query_scalar(
        "select count(*) from shepherd.console_sessions where id_hash = $1 or who <> 'alice'",
    )
    .bind(&id)
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

/// A source that keeps guessing is refused on its own, on every worker,
/// for log-ins and bearer credentials alike; an operator elsewhere still
/// logs in with the right credential; and each wrong guess is recorded with
/// where it came from and which door it tried.
#[sqlx::test(migrations = false)]
async fn a_stranger_guessing_locks_out_only_themself(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    const RIGHT: &str = "the-right-operator-credential";
    let http = no_redirects();
    let a = Server::start_behind_proxy(pool.clone(), Some(RIGHT)).await;
    let b = Server::start_behind_proxy(pool.clone(), Some(RIGHT)).await;
    let mallory = [("x-forwarded-for", "203.0.113.7")];
    let mut statuses = vec![];
    for i in 0..8 {
        let server = if i % 2 == 0 { &a } else { &b };
        let r = post_form(
            &http,
            format!("{}/login", server.base),
            &mallory,
            &[("who", "mallory"), ("token", &format!("guess-{i}"))],
        )
        .await;
        statuses.push(r.status().as_u16());
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            let wait: u64 = r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .expect("a 429 says when to come back");
            assert!((1..=300).contains(&wait), "Retry-After {wait}");
        }
    }
    assert_eq!(&statuses[..5], &[401; 5], "{statuses:?}");
    assert!(statuses[5..].iter().all(|s| *s == 429), "{statuses:?}");
    // Held: even the right credential from there, and a bearer one too.
    let r = post_form(
        &http,
        format!("{}/login", a.base),
        &mallory,
        &[("who", "mallory"), ("token", RIGHT)],
    )
    .await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let r = http
        .post(format!("{}/actions/reconcile", b.base))
        .header("x-forwarded-for", "203.0.113.7")
        .header("authorization", format!("Bearer {RIGHT}"))
        .header("x-shepherd-operator", "mallory")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);

    // Alice, elsewhere, logs in; a script elsewhere acts with the bearer.
    let r = post_form(
        &http,
        format!("{}/login", a.base),
        &[("x-forwarded-for", "198.51.100.1")],
        &[("who", "alice"), ("token", RIGHT)],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let r = http
        .post(format!("{}/actions/reconcile", b.base))
        .header("x-forwarded-for", "198.51.100.2")
        .header("authorization", format!("Bearer {RIGHT}"))
        .header("x-shepherd-operator", "deploy-bot")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);

    // A wrong bearer credential is counted like a wrong log-in.
    let r = http
        .post(format!("{}/actions/reconcile", a.base))
        .header("x-forwarded-for", "192.0.2.9")
        .header("authorization", "Bearer nope")
        .header("x-shepherd-operator", "eve")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);

    let recorded: Vec<(String, String, String, i64)> = sqlx::query_as(
        "select who, source, door, count(*) from shepherd.console_login_failures
         group by 1, 2, 3 order by 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        recorded,
        vec![
            ("eve".into(), "192.0.2.9".into(), "bearer".into(), 1),
            ("mallory".into(), "203.0.113.7".into(), "log-in".into(), 5),
        ]
    );
    let sessions: Vec<String> = sqlx::query_scalar("select who from shepherd.console_sessions")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(sessions, ["alice"]);
    a.stop().await;
    b.stop().await;
}

/// Guesses sent all at once from one source are taken one at a time (the
/// rest told to come back): no more than the allowance is ever compared.
#[sqlx::test(migrations = false)]
async fn a_burst_of_parallel_guesses_gets_no_more_than_the_allowance(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let a = Server::start_behind_proxy(pool.clone(), Some("the-right-operator-credential")).await;
    let http = no_redirects();
    let guesses = (0..20).map(|i| {
        let http = http.clone();
        let url = format!("{}/login", a.base);
        async move {
            post_form(
                &http,
                url,
                &[("x-forwarded-for", "203.0.113.50")],
                &[("who", "mallory"), ("token", &format!("guess-{i}"))],
            )
            .await
            .status()
            .as_u16()
        }
    });
    let statuses = futures::future::join_all(guesses).await;
    // Compared (401) at most the allowance; every other one held (429):
    // over it, or while another check from the address was under way.
    let compared = statuses.iter().filter(|s| **s == 401).count();
    assert!((1..=5).contains(&compared), "{statuses:?}");
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        20 - compared,
        "{statuses:?}"
    );
    let recorded: i64 = sqlx::query_scalar("select count(*) from shepherd.console_login_failures")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(recorded, compared as i64);
    // And they keep counting: sent one by one, the rest of the allowance
    // is compared and then the address is held.
    let mut later = vec![];
    for i in 0..6 {
        let r = post_form(
            &http,
            format!("{}/login", a.base),
            &[("x-forwarded-for", "203.0.113.50")],
            &[("who", "mallory"), ("token", &format!("later-{i}"))],
        )
        .await;
        later.push(r.status().as_u16());
    }
    assert_eq!(
        later.iter().filter(|s| **s == 401).count(),
        5 - compared,
        "{later:?}"
    );
    assert_eq!(*later.last().unwrap(), 429, "{later:?}");
    a.stop().await;
}

/// Guesses from many addresses at once hold every address that guessed,
/// but not one that has not: the operator with the right credential from
/// a clean address still gets in.
#[sqlx::test(migrations = false)]
async fn a_spread_out_guessing_holds_the_guessers_not_the_operators(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    const RIGHT: &str = "the-right-operator-credential";
    let a = Server::start_behind_proxy(pool.clone(), Some(RIGHT)).await;
    let http = no_redirects();
    for i in 1..=31 {
        let from = format!("10.9.0.{i}");
        let r = post_form(
            &http,
            format!("{}/login", a.base),
            &[("x-forwarded-for", &from)],
            &[("who", "botnet"), ("token", "guess")],
        )
        .await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "guess {i}");
    }
    let r = post_form(
        &http,
        format!("{}/login", a.base),
        &[("x-forwarded-for", "10.9.0.1")],
        &[("who", "botnet"), ("token", RIGHT)],
    )
    .await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let r = post_form(
        &http,
        format!("{}/login", a.base),
        &[("x-forwarded-for", "198.51.100.1")],
        &[("who", "alice"), ("token", RIGHT)],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    a.stop().await;
}

/// Without a trusted proxy, what a client says in `X-Forwarded-For` is not
/// believed: a guesser cannot make itself a new source per guess.
#[sqlx::test(migrations = false)]
async fn a_claimed_address_is_not_believed_without_a_trusted_proxy(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let a = Server::start_with(pool.clone(), Some("the-right-operator-credential")).await;
    let http = no_redirects();
    let mut statuses = vec![];
    for i in 0..7 {
        let from = format!("10.8.0.{i}");
        let r = post_form(
            &http,
            format!("{}/login", a.base),
            &[("x-forwarded-for", &from)],
            &[("who", "mallory"), ("token", "guess")],
        )
        .await;
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [401, 401, 401, 401, 401, 429, 429]);
    let sources: Vec<String> =
        sqlx::query_scalar("select distinct source from shepherd.console_login_failures")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(sources, ["127.0.0.1"]);
    a.stop().await;
}

/// A session is the credential's: a worker given a new credential refuses
/// the sessions made with the old one, and `shepherd console logout-all`
/// ends every session on every worker.
#[sqlx::test(migrations = false)]
async fn rotating_the_credential_or_logging_everyone_out_ends_sessions(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    const OLD: &str = "the-old-operator-credential";
    const NEW: &str = "the-new-operator-credential";
    let http = no_redirects();
    let old = Server::start_with(pool.clone(), Some(OLD)).await;
    let login = |base: String, token: &'static str, who: &'static str| {
        let http = http.clone();
        async move {
            let r = post_form(
                &http,
                format!("{base}/login"),
                &[],
                &[("who", who), ("token", token)],
            )
            .await;
            assert_eq!(r.status(), StatusCode::SEE_OTHER);
            r.headers()
                .get_all("set-cookie")
                .iter()
                .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string())
                .find(|c| c.starts_with("shepherd_session="))
                .expect("a session cookie")
        }
    };
    let alice = login(old.base.clone(), OLD, "alice").await;
    let rotated = Server::start_with(pool.clone(), Some(NEW)).await;
    let act = |base: String, cookie: String| {
        let http = http.clone();
        async move {
            post_form(
                &http,
                format!("{base}/actions/reconcile"),
                &[("cookie", &cookie)],
                &[],
            )
            .await
            .status()
        }
    };
    assert_eq!(
        act(old.base.clone(), alice.clone()).await,
        StatusCode::SEE_OTHER
    );
    assert_eq!(
        act(rotated.base.clone(), alice.clone()).await,
        StatusCode::UNAUTHORIZED,
        "a session of the old credential acted where the credential changed"
    );
    let page = http
        .get(format!("{}/", rotated.base))
        .header("cookie", &alice)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!page.contains("Logged in as"), "{page}");

    let bob = login(rotated.base.clone(), NEW, "bob").await;
    assert_eq!(
        act(rotated.base.clone(), bob.clone()).await,
        StatusCode::SEE_OTHER
    );
    let url = database_url(&pool).await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["console", "sessions"])
        .env("DATABASE_URL", &url)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        listed.contains("alice") && listed.contains("bob"),
        "{listed}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["console", "logout-all"])
        .env("DATABASE_URL", &url)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("ended 2 console sessions"),
        "{out:?}"
    );
    assert_eq!(
        act(rotated.base.clone(), bob).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(act(old.base.clone(), alice).await, StatusCode::UNAUTHORIZED);
    old.stop().await;
    rotated.stop().await;
}

/// A name that cannot be recorded as typed (a NUL, a newline) is recorded
/// cleaned: the guess is counted like any other, never a free one.
#[sqlx::test(migrations = false)]
async fn a_name_that_cannot_be_recorded_still_counts_the_guess(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let a = Server::start_with(pool.clone(), Some("the-right-operator-credential")).await;
    let http = no_redirects();
    let mut statuses = vec![];
    for i in 0..6 {
        let r = post_form(
            &http,
            format!("{}/login", a.base),
            &[],
            &[("who", "mal\0lory\n"), ("token", &format!("guess-{i}"))],
        )
        .await;
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [401, 401, 401, 401, 401, 429]);
    let names: Vec<String> =
        sqlx::query_scalar("select distinct who from shepherd.console_login_failures")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(names, ["mal?lory?"]);
    a.stop().await;
}
