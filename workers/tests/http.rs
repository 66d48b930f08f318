//! The status page, the history pages, the event log, the charts and the
//! probes, served over a real socket against a known event log (`/metrics`
//! is `metrics.rs`).

mod web;

use reqwest::StatusCode;
use shepherd::events::event::*;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;
use web::*;

#[sqlx::test(migrations = false)]
async fn the_status_page_shows_the_fleet_and_shouts_about_a_discrepancy(pool: PgPool) {
    let fleet = seed(&pool).await;
    let server = Server::start(pool).await;

    let (status, content_type, page) = server.get("/").await;
    assert_eq!(status, StatusCode::OK);
    assert!(content_type.starts_with("text/html"), "{content_type}");
    assert!(page.contains("<title>shepherd</title>"));
    assert!(page.contains(r#"<meta http-equiv="refresh" content="5">"#));
    assert!(page.contains("shepherd-alpha"), "hostname:\n{page}");
    assert!(page.contains("<th>Machine limit</th><td>10</td>"));
    assert!(page.contains("<th>Managed machines</th><td>1</td>"));
    // The cause is shown, escaped.
    assert!(page.contains("createDevice: no capacity &lt;da11&gt; &amp; retry later (422)"));
    assert!(!page.contains("<da11>"));
    assert!(page.contains("class=\"alarm discrepancy\""));
    assert!(page.contains("DISCREPANCY"));
    assert!(page.contains(&format!("href=\"/device/{}\"", fleet.unknown_device)));
    assert!(page.contains(&format!("href=\"/reservation/{}\"", fleet.penalised)));
    assert!(page.contains(&format!("href=\"/device/{}\"", fleet.device)));
    assert!(page.contains("provider and shepherd disagree"));
    assert!(page.contains("reservation_penalised"));

    server.stop().await;
}

#[sqlx::test(migrations = false)]
async fn history_pages_list_events_in_order_and_refuse_bad_ids(pool: PgPool) {
    let fleet = seed(&pool).await;
    let server = Server::start(pool).await;

    let (status, _, page) = server.get(&format!("/reservation/{}", fleet.managed)).await;
    assert_eq!(status, StatusCode::OK);
    let at = positions(&page, &["creation_requested", "device_created"]);
    assert!(at[0] < at[1], "out of order:\n{page}");
    // The created device links to its own history.
    assert!(page.contains(&format!("href=\"/device/{}\"", fleet.device)));

    let (status, _, page) = server.get(&format!("/device/{}", fleet.device)).await;
    assert_eq!(status, StatusCode::OK);
    let at = positions(&page, &["device_created", "machine_assimilated"]);
    assert!(at[0] < at[1], "out of order:\n{page}");
    assert!(!page.contains("creation_requested"));

    // A reservation is a UUID; a machine is any provider's id (a Latitude
    // `sv_...` too), but never one with a path's characters in it.
    for (kind, bad, says) in [
        ("reservation", "not-a-uuid", "is not a reservation id"),
        ("device", "a%20b%3Bc", "is not a machine id"),
    ] {
        let (status, _, page) = server.get(&format!("/{kind}/{bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{kind}");
        assert!(page.contains(says), "{page}");

        let nobody = Uuid::new_v4();
        let (status, _, page) = server.get(&format!("/{kind}/{nobody}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{kind}");
        assert!(
            page.contains(&format!("No events for {kind} {nobody}")),
            "{page}"
        );
    }
    let (status, _, page) = server.get("/device/sv_ZWr75Zbjr5A91").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        page.contains("No events for device sv_ZWr75Zbjr5A91"),
        "{page}"
    );

    server.stop().await;
}

#[sqlx::test(migrations = false)]
async fn probes_follow_the_database(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    // A pool of its own, so closing it leaves the test's pool to clean up.
    let own = PgPoolOptions::new()
        .max_connections(2)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let server = Server::start(own.clone()).await;

    assert_eq!(
        server.get("/healthz").await,
        (
            StatusCode::OK,
            "text/plain; charset=utf-8".into(),
            "ok".into()
        )
    );
    let (status, _, body) = server.get("/readyz").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ready"));

    own.close().await;
    let (status, _, body) = server.get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.starts_with("not ready"), "{body}");
    assert!(!body.contains("postgres://"));
    assert_eq!(server.get("/healthz").await.0, StatusCode::OK);
    for path in ["/", "/metrics"] {
        let (status, _, body) = server.get(path).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
        assert!(!body.contains("postgres://"), "{body}");
    }

    server.stop().await;
}

/// The status page raises what needs a person: a fleet over its limit, no
/// successful pass for long, creations whose outcome is unknown; it lists
/// live workers apart from silent and replaced generations, and keeps a
/// pass's routine events out of the recent ones.
#[sqlx::test(migrations = false)]
async fn the_status_page_warns_and_tells_live_workers_from_gone(pool: PgPool) {
    shepherd::db::migrate(&pool).await.unwrap();
    let settings =
        shepherd::cluster::ClusterSettings::proposed_by(&shepherd::config::ProvisionerConfig {
            max_machines: 1,
            ..Default::default()
        });
    shepherd::cluster::establish(&pool, &settings, &[], "test")
        .await
        .unwrap();
    let (r1, r2, r3) = (
        uuid::Uuid::new_v4(),
        uuid::Uuid::new_v4(),
        uuid::Uuid::new_v4(),
    );
    let request = uuid::Uuid::new_v4();
    let mut events: Vec<shepherd::events::NewEvent> = vec![];
    for r in [r1, r2] {
        events.push(shepherd::events::NewEvent::new(
            shepherd::events::event::MachineAssimilated {
                machine_id: uuid::Uuid::new_v4(),
                provider: "metal".into(),
                provider_id: uuid::Uuid::new_v4().to_string(),
                reservation: Some(r),
                hostname: None,
            },
        ));
    }
    events.push(shepherd::events::NewEvent::new(
        shepherd::events::event::CreationRequested {
            reservation: r3,
            request,
            manual: false,
            requested_by: None,
            sinbin_override: None,
            place: None,
        },
    ));
    events.push(shepherd::events::NewEvent::new(
        shepherd::events::event::CreationUnresolved {
            reservation: r3,
            request,
            attempt: 5,
            message: "no answer within 30s".into(),
            lease_lost: false,
            looked: false,
        },
    ));
    let mut tx = pool.begin().await.unwrap();
    shepherd::events::record(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();
    // A pass that finished an hour ago (written as it would have been).
    sqlx::query(
        "insert into shepherd.events (event_id, stream, event_type, schema_version, body, recorded_at)
         values (gen_random_uuid(), 'reconcile/' || gen_random_uuid(), 'reconcile_finished', 1,
                 '{\"run\": \"00000000-0000-0000-0000-000000000000\", \"managed\": 2, \"in_flight\": 0,
                   \"enqueued\": 0, \"at_limit\": true}', now() - interval '1 hour')",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "insert into apalis.workers (id, worker_type, storage_name, last_seen) values
           ('create_device@h-1#0', 'create_device', 'x', now()),
           ('create_device@h-1#1', 'create_device', 'x', now()),
           ('assimilate@h-2#0', 'assimilate', 'x', now() - interval '5 minutes')",
    )
    .execute(&pool)
    .await
    .unwrap();
    // The process h-1 recorded itself at start; h-2 is of a release that
    // did not.
    sqlx::query(
        "insert into shepherd.processes (name, host, pid, version, started_at)
         values ('h-1', 'h', 1, '9.9.9', now() - interval '2 hours')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let server = Server::start(pool.clone()).await;
    let (_, _, page) = server.get("/").await;
    server.stop().await;
    assert!(page.contains("OVER THE LIMIT"), "{page}");
    assert!(page.contains("NO PASS:"), "{page}");
    assert!(
        page.contains("creation(s) with an unknown outcome"),
        "{page}"
    );
    assert!(page.contains(&format!("/reservation/{r3}")), "{page}");
    // One row per process, not per queue or generation: its release, its
    // start and its queues; the silent one below the note.
    let workers = &page[page.find("<h2>Workers</h2>").unwrap()..];
    let workers = &workers[..workers[1..].find("<h2>").map_or(workers.len(), |n| n + 1)];
    assert_eq!(workers.matches(">h-1<").count(), 1, "{workers}");
    let live = workers.find(">h-1<").unwrap();
    let gone_note = workers.find("Silent past their missed heartbeats").unwrap();
    let silent = workers.find(">h-2<").unwrap();
    assert!(live < gone_note && gone_note < silent, "{workers}");
    let live_row = &workers[live..gone_note];
    assert!(
        live_row.contains("9.9.9")
            && live_row.contains("(2h 00m ago)")
            && live_row.contains("create_device"),
        "{live_row}"
    );
    assert!(workers[silent..].contains("not recorded"), "{workers}");
    let recent = &page[page.find("Recent events").unwrap()..];
    assert!(!recent.contains("reconcile_finished"), "{recent}");
    assert!(recent.contains("creation_unresolved"), "{recent}");
}

/// The charts count what the log and the queue hold: creations, failures
/// and give-ups in the bar of the moment they were recorded, the queue's
/// depth by kind, and this process's API latency by minute.
#[sqlx::test(migrations = false)]
async fn charts_draw_what_the_log_and_the_queue_hold(pool: PgPool) {
    seed(&pool).await;
    let r = Uuid::new_v4();
    let mut events: Vec<shepherd::events::Event> = Vec::new();
    for n in 0..3 {
        events.push(
            DeviceCreated {
                reservation: r,
                device: Uuid::new_v4().to_string(),
                hostname: format!("shepherd-chart-{n}"),
                witness: format!("shepherd-witness:c{n}"),
                recovered: false,
                request: None,
            }
            .into(),
        );
    }
    events.push(
        CreationGivenUp {
            reservation: r,
            class: shepherd::metal::ErrorClass::Permanent,
            message: "no".into(),
            request: None,
        }
        .into(),
    );
    append(&pool, events).await;
    for _ in 0..2 {
        sqlx::query("select shepherd.enqueue_create_device($1)")
            .bind(Uuid::new_v4())
            .execute(&pool)
            .await
            .unwrap();
    }
    // Jobs that ended: two creations, one of which gave up (Done to the
    // queue, a failure to an operator), and a cancelled pass.
    let ended = |kind: &'static str, status: &'static str, result: &'static str| {
        let pool = pool.clone();
        async move {
            let args = if kind == "reconcile" {
                serde_json::json!({})
            } else {
                serde_json::json!({"reservation": Uuid::new_v4(), "request": Uuid::new_v4()})
            };
            ended_job(&pool, kind, &args, status, result).await;
        }
    };
    ended(
        "create_device",
        "Done",
        r#"{"Ok": "Created { device: \"d\", recovered: false }"}"#,
    )
    .await;
    ended(
        "create_device",
        "Done",
        r#"{"Ok": "GivenUp { class: Permanent, cause: \"no\" }"}"#,
    )
    .await;
    ended("reconcile", "Killed", r#"{"Err": "cancelled"}"#).await;
    let server = Server::start(pool.clone()).await;
    let (status, _, page) = server.get("/charts").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("<title>1 done from"), "{page}");
    assert!(page.contains("<title>1 failed from"), "{page}");
    assert!(page.contains("<title>1 cancelled from"), "{page}");
    assert!(
        page.contains(r#"href="/jobs?kind=create_device&amp;state=failed">1</a>"#),
        "{page}"
    );
    // seed() created one device too: four in all, all in the last bar.
    assert!(page.contains("<title>4 devices created from"), "{page}");
    assert!(page.contains("<title>1 creations given up from"), "{page}");
    assert!(page.contains("<title>2 create_device from"), "{page}");
    assert!(page.contains("<title>150 ms mean from"), "{page}");
    assert!(!page.contains("<title>0 "), "empty bars are not drawn");
    let (status, _, page) = server.get("/charts?window=24h").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("<title>4 devices created from"), "{page}");
    let (status, _, page) = server.get("/charts?window=1y").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(page.contains("1h, 24h, 7d"), "{page}");
    server.stop().await;
}

/// The event log, filtered by stream (one, or a kind) and type, a page of
/// 100 at a time, newest first.
#[sqlx::test(migrations = false)]
async fn the_event_log_filters_by_stream_and_type_and_pages(pool: PgPool) {
    let fleet = seed(&pool).await;
    let server = Server::start(pool.clone()).await;

    // The table only: the type filter's choices name every type.
    let table = |page: &str| match (page.find("<table"), page.find("</table>")) {
        (Some(a), Some(b)) => page[a..b].to_string(),
        _ => String::new(),
    };
    let (status, _, page) = server.get("/events?type=reservation_penalised").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let page = table(&page);
    assert!(page.contains(&fleet.penalised.to_string()), "{page}");
    assert!(!page.contains("reconcile_started"), "{page}");

    let (_, _, page) = server.get("/events?stream=reservation/").await;
    let page = table(&page);
    assert!(
        page.contains("creation_requested") && page.contains("device_created"),
        "{page}"
    );
    assert!(!page.contains("reconcile_started"), "{page}");
    let (_, _, page) = server
        .get(&format!("/events?stream=reservation/{}", fleet.penalised))
        .await;
    let page = table(&page);
    assert!(page.contains("reservation_penalised"), "{page}");
    assert!(!page.contains("creation_requested"), "{page}");
    // A prefix's wildcards are taken literally.
    let (_, _, page) = server.get("/events?stream=%25/").await;
    assert!(page.contains("No events match."), "{page}");

    let (status, _, page) = server.get("/events?type=machine_teleported").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(page.contains("not an event type"), "{page}");

    // 120 pauses and resumes: the first page holds 100, newest first, and
    // links the rest.
    let mut many: Vec<shepherd::events::Event> = Vec::new();
    for n in 0..60 {
        many.push(
            CreationsPaused {
                by: "ops".into(),
                reason: format!("p{n:03}"),
            }
            .into(),
        );
        many.push(
            CreationsResumed {
                by: "ops".into(),
                reason: format!("r{n:03}"),
            }
            .into(),
        );
    }
    append(&pool, many).await;
    let (_, _, page) = server.get("/events?stream=operator/controls").await;
    assert!(page.contains("r059") && page.contains("p010"), "{page}");
    assert!(!page.contains("p009"), "the first page holds 100");
    let older = page
        .split("href=\"")
        .filter_map(|s| s.split('"').next())
        .find(|href| href.starts_with("/events?before="))
        .expect("a link to older events")
        .replace("&amp;", "&");
    let (_, _, page) = server.get(&older).await;
    assert!(page.contains("p009") && page.contains("p000"), "{page}");
    assert!(!page.contains("r059"), "{page}");
    assert!(!page.contains("older →"), "{page}");
    server.stop().await;
}

/// The overview's first line, `shepherd status`'s first line and
/// `/metrics` say whether anything works: no worker heard from within its
/// missed heartbeats is red at once, workers without a successful pass for
/// two of the scheduler's periods are red, and otherwise it says what works.
#[sqlx::test(migrations = false)]
async fn the_first_line_says_whether_anything_works(pool: PgPool) {
    seed(&pool).await;
    let url = database_url(&pool).await;
    let first_line = |url: String| async move {
        let out = tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
                .arg("status")
                .env("DATABASE_URL", url)
                .output()
                .expect("shepherd status runs")
        })
        .await
        .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string()
    };
    let look = |pool: PgPool| async move {
        let server = Server::start(pool).await;
        let (_, _, page) = server.get("/").await;
        let (_, _, metrics) = server.get("/metrics").await;
        server.stop().await;
        (page, metrics)
    };
    // A scheduler's passes a minute apart, the last a minute ago; the last
    // one that succeeded, five minutes ago; one worker process (two
    // queues) heard from just now.
    sqlx::query(
        "insert into shepherd.events (event_id, stream, event_type, schema_version, body, recorded_at)
         select gen_random_uuid(), 'reconcile/' || r, 'reconcile_started', 1,
                jsonb_build_object('run', r, 'max_machines', 10, 'chunk_size', 5,
                                   'requested_by', 'scheduler'),
                now() - make_interval(secs => 60 * n)
         from generate_series(1, 4) n, gen_random_uuid() r",
    )
    .execute(&pool)
    .await
    .unwrap();
    let finished = |ago: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query(
                "insert into shepherd.events (event_id, stream, event_type, schema_version, body, recorded_at)
                 values (gen_random_uuid(), 'reconcile/' || gen_random_uuid(), 'reconcile_finished', 1,
                         '{\"run\": \"00000000-0000-0000-0000-000000000000\", \"managed\": 1,
                           \"in_flight\": 0, \"enqueued\": 0, \"at_limit\": false}',
                         now() - $1::interval)",
            )
            .bind(ago)
            .execute(&pool)
            .await
            .expect("recording a pass")
        }
    };
    finished("5 minutes").await;
    sqlx::query(
        "insert into apalis.workers (id, worker_type, storage_name, last_seen) values
           ('create_device@host-a:1#0', 'create_device', 'x', now()),
           ('reconcile@host-a:1#0', 'reconcile', 'x', now())",
    )
    .execute(&pool)
    .await
    .unwrap();
    let (page, metrics) = look(pool.clone()).await;
    let top = &page[..page.find("<h2>").unwrap_or(page.len())];
    assert!(top.contains("NO PASS:"), "{top}");
    assert!(top.contains("1 worker process is running"), "{top}");
    assert!(metrics.contains("shepherd_workers_alive 1"), "{metrics}");
    assert!(
        metrics.contains("shepherd_reconcile_period_seconds 60"),
        "{metrics}"
    );
    let line = first_line(url.clone()).await;
    assert!(line.starts_with("NO PASS"), "{line}");

    // The worker falls silent past its missed heartbeats (5 s x 12 by
    // default): red at once, whatever the passes.
    sqlx::query("update apalis.workers set last_seen = now() - interval '61 seconds'")
        .execute(&pool)
        .await
        .unwrap();
    let (page, metrics) = look(pool.clone()).await;
    let top = &page[..page.find("<h2>").unwrap_or(page.len())];
    assert!(top.contains("NO WORKER RUNNING"), "{top}");
    assert!(metrics.contains("shepherd_workers_alive 0"), "{metrics}");
    let line = first_line(url.clone()).await;
    assert!(line.starts_with("NO WORKER"), "{line}");

    // Back, two processes in all, and a pass a moment ago: working.
    sqlx::raw_sql(
        "update apalis.workers set last_seen = now();
         insert into apalis.workers (id, worker_type, storage_name, last_seen)
         values ('create_device@host-b:2#0', 'create_device', 'x', now())",
    )
    .execute(&pool)
    .await
    .unwrap();
    finished("5 seconds").await;
    let (page, metrics) = look(pool.clone()).await;
    let top = &page[..page.find("<h2>").unwrap_or(page.len())];
    assert!(top.contains("Working:"), "{top}");
    assert!(top.contains("2 worker processes"), "{top}");
    assert!(
        !top.contains("NO PASS") && !top.contains("NO WORKER"),
        "{top}"
    );
    assert!(metrics.contains("shepherd_workers_alive 2"), "{metrics}");
    let line = first_line(url.clone()).await;
    assert!(
        line.starts_with("working      2 worker processes"),
        "{line}"
    );
}

/// What a page shows is what it holds: a reason with a right-to-left
/// override (U+202E) or a zero-width character shows the mark, never
/// reorders the text; and an action's banner, which the page keeps in its
/// address as it reloads, says when the action has been undone since.
#[sqlx::test(migrations = false)]
async fn pages_show_marks_and_banners_of_the_present(pool: PgPool) {
    seed(&pool).await;
    sqlx::query("select shepherd.pause_creations($1, 'ops:mallory')")
        .bind("rotate\u{202e}txt.exe\u{200b}")
        .execute(&pool)
        .await
        .unwrap();
    let server = Server::start(pool.clone()).await;
    for path in ["/", "/events"] {
        let (_, _, page) = server.get(path).await;
        assert!(
            !page.contains('\u{202e}') && !page.contains('\u{200b}'),
            "{path}"
        );
        assert!(
            page.contains("rotate[U+202E]txt.exe[U+200B]"),
            "{path}: {page}"
        );
    }
    let banner = |page: &str| {
        let at = page.find("class=\"done").map(|i| &page[i..]).unwrap_or("");
        at[..at.find("</p>").unwrap_or(at.len())].to_string()
    };
    let (_, _, page) = server.get("/?done=pause").await;
    assert!(
        banner(&page).contains("Creations are paused."),
        "{}",
        banner(&page)
    );
    let (_, _, page) = server.get("/?done=resume").await;
    assert!(
        banner(&page).contains("resumed from here, and are paused again since"),
        "{}",
        banner(&page)
    );
    sqlx::query("select shepherd.resume_creations('done', 'ops:alice')")
        .execute(&pool)
        .await
        .unwrap();
    let (_, _, page) = server.get("/?done=pause").await;
    assert!(
        banner(&page).contains("paused from here, and are running again since"),
        "{}",
        banner(&page)
    );
    assert!(!page.contains("Creations are paused."), "{page}");
    server.stop().await;
}

/// A process that speaks to no provider (the scheduler) speaks of the
/// cluster in its provider's words: places, not reservations, on Latitude.
#[sqlx::test(migrations = false)]
async fn a_schedulers_pages_speak_the_clusters_words(pool: PgPool) {
    seed(&pool).await;
    let server = Server::start_for_cluster(pool.clone(), "latitude").await;
    let (_, _, page) = server.get("/").await;
    server.stop().await;
    assert!(page.contains("Penalised places"), "{page}");
    assert!(!page.contains("Penalised reservations"), "{page}");
    let server = Server::start(pool).await;
    let (_, _, page) = server.get("/").await;
    server.stop().await;
    assert!(page.contains("Penalised reservations"), "{page}");
}
