//! The console's pages for operators: jobs, machines, the actions behind
//! the operator credential, error pages; sessions in `console/sessions.rs`,
//! and the walks through it in a real browser in `console/browser.rs`.

mod web;

use reqwest::StatusCode;
use sqlx::PgPool;
use std::time::Duration;
use web::browser::Browser;
use web::*;

#[path = "console/browser.rs"]
mod browser;
#[path = "console/edges.rs"]
mod edges;
#[path = "console/fleet.rs"]
mod fleet;
#[path = "console/jobs.rs"]
mod jobs;
#[path = "console/overview.rs"]
mod overview;
#[path = "console/sessions.rs"]
mod sessions;

/// Machines beyond what the status page shows are on `/machines`, paged and
/// searchable (a search's wildcards taken literally, every value escaped).
#[sqlx::test(migrations = false)]
async fn machines_are_paged_and_searchable(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let mut events = vec![];
    for n in 0..130 {
        events.push(shepherd::events::NewEvent::new(
            shepherd::events::event::MachineAssimilated {
                machine_id: uuid::Uuid::new_v4(),
                provider: "metal".into(),
                provider_id: uuid::Uuid::new_v4().to_string(),
                reservation: Some(uuid::Uuid::new_v4()),
                hostname: Some(format!("shepherd-{n:03}")),
            },
        ));
    }
    let mut tx = pool.begin().await.unwrap();
    shepherd::events::record(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();
    // The last one assimilated, in a later transaction.
    let mut tx = pool.begin().await.unwrap();
    shepherd::events::record(
        &mut tx,
        vec![shepherd::events::NewEvent::new(
            shepherd::events::event::MachineAssimilated {
                machine_id: uuid::Uuid::new_v4(),
                provider: "metal".into(),
                provider_id: uuid::Uuid::new_v4().to_string(),
                reservation: None,
                hostname: Some("odd_<name>%".into()),
            },
        )],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let server = Server::start(pool.clone()).await;
    let (_, _, front) = server.get("/").await;
    assert!(front.contains("<h2>Managed machines (131)"), "{front}");
    let listed =
        &front[front.find("<h2>Managed machines").unwrap()..front.find("Recent events").unwrap()];
    assert_eq!(
        listed.matches("<tr><td class=\"id\">").count(),
        50,
        "{listed}"
    );
    // The newest first: the odd one was assimilated last.
    let first_row = &listed[listed.find("<tbody>").unwrap()..];
    let first_row = &first_row[..first_row.find("</tr>").unwrap()];
    assert!(first_row.contains("odd_&lt;name&gt;%"), "{first_row}");
    let (status, _, first) = server.get("/machines").await;
    assert_eq!(status, StatusCode::OK);
    assert!(first.contains("131 machine(s); page 1 of 2."), "{first}");
    assert!(first.contains("href=\"/machines?page=2\""));
    let (_, _, second) = server.get("/machines?page=2").await;
    assert!(second.contains("page 2 of 2."));
    let (_, _, found) = server.get("/machines?q=shepherd-12").await;
    // shepherd-120 to shepherd-129 (shepherd-012 does not match).
    assert!(found.contains("10 machine(s) matching"), "{found}");
    // `_` and `%` are not wildcards in a search; markup is escaped.
    let (_, _, odd) = server.get("/machines?q=%25").await;
    assert!(odd.contains("1 machine(s) matching"), "{odd}");
    assert!(
        odd.contains("odd_&lt;name&gt;%") && !odd.contains("<name>"),
        "{odd}"
    );
    let (status, _, _) = server.get("/machines?page=0").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    server.stop().await;
}

/// Actions are off without a credential; with one, each needs it (a cookie
/// from the log-in, or a Bearer header), refuses another site's request,
/// goes through the SQL functions' own checks, and is recorded with who.
#[sqlx::test(migrations = false)]
async fn actions_need_the_credential_and_record_who(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let http = no_redirects();
    let read_only = Server::start(pool.clone()).await;
    let r = post_form(
        &http,
        format!("{}/actions/pause", read_only.base),
        &[],
        &[("reason", "x")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let (_, _, page) = read_only.get("/").await;
    assert!(
        !page.contains("Actions"),
        "read-only pages offer no actions"
    );
    read_only.stop().await;

    let server = Server::start_with(pool.clone(), Some("s3cret-operator")).await;
    let events = |kind: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "select count(*) from shepherd.events where event_type = $1",
            )
            .bind(kind)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    // No credential, a wrong one: refused, nothing recorded.
    let r = post_form(
        &http,
        format!("{}/actions/pause", server.base),
        &[],
        &[("reason", "x")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = post_form(
        &http,
        format!("{}/login", server.base),
        &[],
        &[("who", "alice"), ("token", "guess")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(events("creations_paused").await, 0);
    // Logged in: the cookies act, and say who.
    let r = post_form(
        &http,
        format!("{}/login", server.base),
        &[],
        &[("who", "alice"), ("token", "s3cret-operator")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let cookies: Vec<String> = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string())
        .collect();
    assert!(
        r.headers()
            .get_all("set-cookie")
            .iter()
            .any(|v| v.to_str().unwrap().contains("HttpOnly; SameSite=Strict"))
    );
    let cookie = cookies.join("; ");
    // A reason over the limit is refused with why, and records nothing.
    let long = "x".repeat(1001);
    let r = post_form(
        &http,
        format!("{}/actions/pause", server.base),
        &[("cookie", &cookie)],
        &[("reason", long.as_str())],
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let said = r.text().await.unwrap();
    assert!(said.contains("at most 1000 characters"), "{said}");
    assert_eq!(events("creations_paused").await, 0);
    // Clearing a penalty that is not there says so.
    let r = post_form(
        &http,
        format!("{}/actions/clear-penalty", server.base),
        &[("cookie", &cookie)],
        &[
            ("reservation", &uuid::Uuid::new_v4().to_string()),
            ("reason", "tidy"),
        ],
    )
    .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let said = r.text().await.unwrap();
    assert!(said.contains("no penalty in force"), "{said}");
    assert_eq!(events("penalty_cleared").await, 0);
    let r = post_form(
        &http,
        format!("{}/actions/pause", server.base),
        &[("cookie", &cookie)],
        &[("reason", "maintenance window")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        r.headers().get("location").and_then(|v| v.to_str().ok()),
        Some("/?done=pause")
    );
    // Paused already: a refusal that says so, not a silent success.
    let r = post_form(
        &http,
        format!("{}/actions/pause", server.base),
        &[("cookie", &cookie)],
        &[("reason", "again")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert!(r.text().await.unwrap().contains("already paused"));
    let by: String = recorded_by(&pool, "creations_paused").await;
    assert_eq!(by, "console:alice");
    // Another site's form, even with the cookies: refused.
    let r = post_form(
        &http,
        format!("{}/actions/resume", server.base),
        &[("cookie", &cookie), ("origin", "http://evil.example")],
        &[("reason", "x")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // A script: Bearer and its name.
    let r = post_form(
        &http,
        format!("{}/actions/resume", server.base),
        &[
            ("authorization", "Bearer s3cret-operator"),
            ("x-shepherd-operator", "deploy-bot"),
        ],
        &[("reason", "window over")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let by: String = recorded_by(&pool, "creations_resumed").await;
    assert_eq!(by, "console:deploy-bot");
    // The SQL functions' checks hold: a pause needs a reason.
    let r = post_form(
        &http,
        format!("{}/actions/pause", server.base),
        &[("cookie", &cookie)],
        &[("reason", "")],
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("reason"));
    // A pass asked for from the page says who asked.
    let r = http
        .post(format!("{}/actions/reconcile", server.base))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let asked: String = sqlx::query_scalar(
        "select convert_from(job, 'UTF8')::jsonb->>'requested_by' from apalis.jobs where job_type = 'reconcile'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(asked, "console:alice");
    // A job action is judged by the server: a waiting pass is not retried
    // (409, and why), an unknown job is 404, and the reason is required.
    let pass: String =
        sqlx::query_scalar("select id from apalis.jobs where job_type = 'reconcile'")
            .fetch_one(&pool)
            .await
            .unwrap();
    for (action, job, reason, status, says) in [
        (
            "retry-job",
            pass.as_str(),
            "now",
            StatusCode::CONFLICT,
            "only a failed or killed job",
        ),
        (
            "cancel-job",
            "01JA0000000000000000000000",
            "x",
            StatusCode::NOT_FOUND,
            "no shepherd job",
        ),
        (
            "cancel-job",
            pass.as_str(),
            "",
            StatusCode::BAD_REQUEST,
            "say why",
        ),
    ] {
        let r = post_form(
            &http,
            format!("{}/actions/{action}", server.base),
            &[("cookie", &cookie)],
            &[("job", job), ("reason", reason)],
        )
        .await;
        assert_eq!(r.status(), status, "{action} {job}");
        let text = r.text().await.unwrap();
        assert!(text.contains(says), "{action}: {text}");
    }
    assert_eq!(
        events("job_retried").await + events("job_cancelled").await,
        0
    );
    let r = http
        .post(format!("{}/actions/teleport", server.base))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    server.stop().await;
}

const METAL_TOKEN: &str = "console-metal-token";

/// A fake Metal and the provider that speaks to it, as a worker's page has.
async fn metal_provider() -> (
    shepherd_fakes::metal::FakeMetal,
    std::sync::Arc<dyn shepherd::provider::Provider>,
) {
    let fake = shepherd_fakes::metal::FakeMetal::start(
        shepherd_fakes::metal::FakeConfig {
            token: METAL_TOKEN.into(),
            reservations: 2,
            ..Default::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let client = shepherd::metal::MetalClient::new(
        shepherd::metal::ClientConfig::new(
            fake.base_url(),
            fake.project_id(),
            shepherd::secret::ApiToken::new(METAL_TOKEN),
        ),
        shepherd::metal::ClientMetrics::default(),
    )
    .unwrap();
    let provider = shepherd::metal::provider::MetalProvider::new(
        client,
        "shepherd-".into(),
        "ubuntu_20_04".into(),
    );
    (fake, std::sync::Arc::new(provider))
}

/// A device made at the fake Metal through the client and recorded as a
/// managed machine: one the provider still has.
async fn live_machine(
    pool: &PgPool,
    fake: &shepherd_fakes::metal::FakeMetal,
) -> (shepherd::metal::MetalClient, uuid::Uuid) {
    let client = shepherd::metal::MetalClient::new(
        shepherd::metal::ClientConfig::new(
            fake.base_url(),
            fake.project_id(),
            shepherd::secret::ApiToken::new(METAL_TOKEN),
        ),
        shepherd::metal::ClientMetrics::default(),
    )
    .unwrap();
    let reservation = fake.reservations()[0].id;
    let key = client
        .ensure_ssh_key("console", "ssh-ed25519 AAAA console")
        .await
        .unwrap();
    let made = client
        .create_device(&shepherd::metal::CreateDevice {
            reservation,
            hostname: "shepherd-console".into(),
            operating_system: "ubuntu_20_04".into(),
            ssh_keys: vec![key],
            witness: shepherd::metal::Witness::new("console"),
            first: None,
        })
        .await
        .unwrap();
    append(
        pool,
        vec![assimilated(made.device.id, reservation, "shepherd-console")],
    )
    .await;
    (client, made.device.id)
}

/// Release from the console is judged as `shepherd machines release` is:
/// a machine the provider still has is refused (409, and why), since the
/// next pass would adopt it again under a new id; once it is gone at the
/// provider, the release is recorded with who.
#[sqlx::test(migrations = false)]
async fn a_release_from_the_console_asks_the_provider(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let (fake, provider) = metal_provider().await;
    let (client, made) = live_machine(&pool, &fake).await;
    let device = made.to_string();
    let server = Server::start_full(pool.clone(), Some("s3cret-operator"), Some(provider)).await;
    let http = no_redirects();
    let release = |machine: String| {
        let (http, url) = (http.clone(), format!("{}/actions/release", server.base));
        async move {
            post_form(
                &http,
                url,
                &[
                    ("authorization", "Bearer s3cret-operator"),
                    ("x-shepherd-operator", "bot"),
                ],
                &[("machine", &machine), ("reason", "gone?")],
            )
            .await
        }
    };
    let r = release(device.clone()).await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let said = r.text().await.unwrap();
    assert!(said.contains("still exists at the provider"), "{said}");
    let r = release("no-such-machine".into()).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let released: i64 = count_events(&pool, "machine_released").await;
    assert_eq!(released, 0);
    client.delete_device(made).await.unwrap();
    let r = release(device.clone()).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let by: String = recorded_by(&pool, "machine_released").await;
    assert_eq!(by, "console:bot");
    // A pass is queued to look again, so the discrepancy clears now; the
    // refusals queued none.
    let passes: Vec<String> = sqlx::query_scalar(
        "select convert_from(job, 'UTF8')::jsonb->>'requested_by' from apalis.jobs
         where job_type = 'reconcile'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(passes, vec!["console:bot (after a release)".to_string()]);
    server.stop().await;
}

/// Every page has the navigation; an address nothing serves and a method
/// a page does not take answer with a page that says so, not an empty
/// body; inputs carry labels.
#[sqlx::test(migrations = false)]
async fn every_answer_is_a_page_with_a_way_back(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let server = Server::start_with(pool.clone(), Some("credential")).await;
    for path in ["/", "/jobs", "/machines", "/events", "/charts", "/login"] {
        let (status, _, page) = server.get(path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert!(
            page.contains(r#"<nav class="top">"#) && page.contains(r#"href="/machines""#),
            "{path} has no navigation"
        );
        assert!(page.contains("prefers-color-scheme: dark"), "{path}");
    }
    let (status, _, page) = server.get("/no/such/page").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        page.contains("nothing is served at /no/such/page"),
        "{page}"
    );
    assert!(page.contains(r#"<nav class="top">"#), "{page}");
    let r = reqwest::Client::new()
        .delete(format!("{}/jobs", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    let page = r.text().await.unwrap();
    assert!(page.contains("/jobs does not take DELETE"), "{page}");
    let (_, _, page) = server.get("/machines").await;
    assert!(page.contains(r#"aria-label="Search machines""#), "{page}");
    // An address longer than any page takes: a page that says so.
    let (status, _, page) = server.get(&format!("/jobs?q={}", "x".repeat(9_000))).await;
    assert_eq!(status, StatusCode::URI_TOO_LONG);
    assert!(
        page.contains("the pages take at most 8192") && page.contains(r#"<nav class="top">"#),
        "{page}"
    );
    // A database gone away: a page too, and it says which part failed.
    pool.close().await;
    let (status, _, page) = server.get("/jobs").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        page.contains("the database is unavailable") && page.contains(r#"<nav class="top">"#),
        "{page}"
    );
    server.stop().await;
}

/// On a Latitude.sh cluster a machine is found by its place as operators
/// name it (`web/3`), and another place finds nothing.
#[sqlx::test(migrations = false)]
async fn machines_are_found_by_their_place(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    shepherd::cluster::establish_identity(
        &pool,
        &shepherd::cluster::Identity {
            provider: "latitude".into(),
            project: "proj_places".into(),
            device_prefix: "shepherd-".into(),
        },
        "test",
    )
    .await
    .unwrap();
    let unit = shepherd::latitude::provider::unit_id("proj_places", "web", 3);
    append(
        &pool,
        vec![
            shepherd::events::event::MachineAssimilated {
                machine_id: uuid::Uuid::new_v4(),
                provider: "latitude".into(),
                provider_id: "sv_place3".into(),
                reservation: Some(unit),
                hostname: Some("shepherd-web-3-aaaaaaaa".into()),
            }
            .into(),
        ],
    )
    .await;
    let server = Server::start(pool.clone()).await;
    let (status, _, page) = server.get("/machines?q=web/3").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("sv_place3"), "{page}");
    let (_, _, page) = server.get("/machines?q=web/4").await;
    assert!(!page.contains("sv_place3"), "{page}");
    server.stop().await;
}

/// A machine the latest pass found missing at the provider is listed as
/// missing, not by its last sighting ("on, 22 s ago"); once a later pass
/// finds everything, its sighting shows again.
#[sqlx::test(migrations = false)]
async fn a_machine_missing_at_the_provider_is_listed_missing(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let device = uuid::Uuid::new_v4();
    append(
        &pool,
        vec![assimilated(device, uuid::Uuid::new_v4(), "shepherd-gone")],
    )
    .await;
    sqlx::query(
        "insert into shepherd.machine_status (provider_id, status, seen_at)
         values ($1, 'active', now() - interval '22 seconds')",
    )
    .bind(device.to_string())
    .execute(&pool)
    .await
    .unwrap();
    let run = uuid::Uuid::new_v4();
    append(
        &pool,
        vec![
            shepherd::events::event::DiscrepancyFound {
                run,
                unknown_devices: vec![],
                missing_devices: vec![device.to_string()],
            }
            .into(),
        ],
    )
    .await;
    let server = Server::start(pool.clone()).await;
    let (_, _, page) = server.get("/machines").await;
    assert!(page.contains("missing at the provider"), "{page}");
    assert!(!page.contains("active <span"), "{page}");
    append(
        &pool,
        vec![
            shepherd::events::event::ReconcileFinished {
                run: uuid::Uuid::new_v4(),
                managed: 1,
                in_flight: 0,
                enqueued: 0,
                at_limit: false,
            }
            .into(),
        ],
    )
    .await;
    let (_, _, page) = server.get("/machines").await;
    assert!(!page.contains("missing at the provider"), "{page}");
    assert!(page.contains("active"), "{page}");
    server.stop().await;
}
