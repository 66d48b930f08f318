//! The jobs provisioning Latitude.sh pools through the provider seam: the
//! same handlers, events and views as for Metal, against the fake Latitude
//! API over HTTP, calm and under its faults (5xx on create, creates that
//! succeed and answer 500, 429 with `meta.retry_after`, stock running out
//! mid-run, another party creating in the project).

mod common;

use std::time::Duration;

use common::latitude::{PREFIX, World, create_lost_then_hidden, pool};
use common::world::drain_with;
use shepherd::latitude::pools;
use shepherd_fakes::latitude::{Call, FaultKind, FaultRule, Faults};
use sqlx::PgPool;

#[path = "latitude_provisioning/lost_answers.rs"]
mod lost_answers;
#[path = "latitude_provisioning/spend_cap.rs"]
mod spend_cap;

#[sqlx::test(migrations = false)]
async fn pools_are_kept_full_through_the_seam(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 3), pool("db", "ASH", 2)]).await;
    let first = w.pass().await;
    assert_eq!(first.enqueued.len(), 5, "{first:?}");
    drain_with(&w.pool, &w.ctx).await;
    assert_eq!(w.fake.servers().len(), 5);
    let providers: Vec<String> =
        sqlx::query_scalar("select distinct provider from shepherd.managed_machines")
            .fetch_all(&w.pool)
            .await
            .unwrap();
    assert_eq!(providers, vec!["latitude"]);
    // A second pass finds every place taken, and nothing to say.
    let second = w.pass().await;
    assert!(second.enqueued.is_empty(), "{second:?}");
    assert!(second.refused.is_none(), "{second:?}");
    assert!(second.unknown_devices.is_empty() && second.missing_devices.is_empty());
    w.assert_invariants().await;
}

#[sqlx::test(migrations = false)]
async fn a_pool_without_stock_waits_and_the_limit_holds(db: PgPool) {
    // CHI has the plan and none in stock; the limit leaves room for 4 of 5.
    let w = World::new(db, 4, vec![pool("web", "DAL", 3), pool("cold", "CHI", 2)]).await;
    let pass = w.pass().await;
    assert_eq!(pass.enqueued.len(), 3, "{pass:?}");
    drain_with(&w.pool, &w.ctx).await;
    let cold = w.fake.servers().iter().filter(|s| s.site == "CHI").count();
    assert_eq!(cold, 0, "a create was sent where there is no stock");
    // Stock arrives: the next pass fills what the limit allows.
    assert!(w.fake.set_stock("c2-small-x86", "CHI", 5));
    let pass = w.pass().await;
    assert_eq!(pass.enqueued.len(), 1, "{pass:?}");
    assert!(pass.at_limit);
    drain_with(&w.pool, &w.ctx).await;
    assert_eq!(w.fake.servers().len(), 4);
    w.assert_invariants().await;
}

#[sqlx::test(migrations = false)]
async fn under_latitudes_faults_no_pool_overfills_and_nothing_is_lost(db: PgPool) {
    // Pools are taken in the order of their names: app's creates come
    // first, so the other party's servers land in DAL, which has stock.
    let w = World::new(db, 9, vec![pool("app", "DAL", 6), pool("db", "ASH", 4)]).await;
    // ASH holds 2 of the plan: the first pass sees it in stock and admits
    // two of db's places, and the stock runs out before their creates.
    assert!(w.fake.set_stock("c2-small-x86", "ASH", 2));
    w.fake.set_faults(Faults {
        rules: vec![
            FaultRule::on(Call::CreateServer, FaultKind::OtherPartyCreates).times(2),
            FaultRule::on(
                Call::CreateServer,
                FaultKind::AcceptThenFail { status: 500 },
            )
            .times(2),
            FaultRule::on(Call::CreateServer, FaultKind::Status { status: 503 }).times(2),
            FaultRule::on(Call::GetServers, FaultKind::Status { status: 502 })
                .with_probability(0.1),
            FaultRule::new(FaultKind::RateLimited {
                retry_after_secs: 1,
            })
            .times(2),
        ],
        ..Faults::default()
    });
    for round in 0..8 {
        w.pass().await;
        if round == 0 {
            assert!(w.fake.set_stock("c2-small-x86", "ASH", 0));
        }
        drain_with(&w.pool, &w.ctx).await;
        w.make_due().await;
        drain_with(&w.pool, &w.ctx).await;
    }
    // The faults stop; what is left in flight settles.
    w.fake.set_faults(Faults::default());
    w.settle(10).await;
    w.assert_invariants().await;
    let servers = w.fake.servers();
    let others = servers.iter().filter(|s| s.created_by_other).count();
    assert_eq!(others, 2, "another party's servers are part of the world");
    let ours = servers.len() - others;
    // 6 of app, and of db what ASH's stock allowed: the limit is 9.
    assert!((6..=9).contains(&ours), "{ours} servers of ours");
    let app = servers
        .iter()
        .filter(|s| s.hostname.starts_with("shepherd-app-"))
        .count();
    assert_eq!(app, 6, "app is not full");
    // The creates that were made and answered 500 were found by their
    // hostname, not sent again. A fault that met ASH's empty stock made
    // nothing (the refusal is the answer), so the 500s are counted.
    let made_then_failed = w
        .fake
        .request_log()
        .iter()
        .filter(|r| r.call == Call::CreateServer && r.status == 500)
        .count() as i64;
    assert!(made_then_failed >= 1, "no create was made and then failed");
    let recovered = w
        .count(
            "select count(*) from shepherd.events
             where event_type = 'device_created' and (body->>'recovered')::boolean",
        )
        .await;
    assert_eq!(recovered, made_then_failed);
    // Stock ran out under db's creates: the places that met it are
    // penalised for the plan at ASH, and none holds a server.
    let penalised = w
        .count("select count(*) from shepherd.sinbin where scope = 'c2-small-x86@ASH'")
        .await;
    assert!(penalised >= 1, "no place met the empty stock");
    let ash = servers
        .iter()
        .filter(|s| s.site == "ASH" && !s.created_by_other)
        .count();
    assert_eq!(ash, 0, "a server of ours where the stock had run out");
}

/// A create refused for want of stock penalises the plan at the site: the
/// pool's places that never met the refusal wait with the ones that did,
/// while a pool drawing on other stock goes on; once lifted, a pass takes
/// no more places than the stock the provider counts. A pass lists the
/// servers once, and records how each pool stood.
#[sqlx::test(migrations = false)]
async fn out_of_stock_penalises_the_plan_at_its_site(db: PgPool) {
    use shepherd::jobs::pass::Skip;
    let w = World::new(db, 3, vec![pool("db", "ASH", 4), pool("web", "DAL", 1)]).await;
    // ASH counts 5 of the plan, and they are gone when the first create
    // arrives: the pass takes three of db's places and all three are
    // refused.
    assert!(w.fake.set_stock("c2-small-x86", "ASH", 5));
    w.fake.set_faults(
        Faults::none()
            .with_rule(FaultRule::on(Call::CreateServer, FaultKind::StockRunsOut).times(1)),
    );
    let listings = w.fake.calls(Call::GetServers);
    let first = w.pass().await;
    assert_eq!(
        w.fake.calls(Call::GetServers) - listings,
        1,
        "a pass lists the servers once"
    );
    assert_eq!(first.enqueued.len(), 3, "{first:?}");
    drain_with(&w.pool, &w.ctx).await;
    assert!(w.fake.servers().is_empty());
    let scoped: Vec<(Option<String>, String)> =
        sqlx::query_as("select scope, cause from shepherd.sinbin order by reservation_id")
            .fetch_all(&w.pool)
            .await
            .unwrap();
    assert_eq!(scoped.len(), 3, "{scoped:?}");
    for (scope, cause) in &scoped {
        assert_eq!(scope.as_deref(), Some("c2-small-x86@ASH"), "{cause}");
        assert!(cause.contains("SERVERS_OUT_OF_STOCK"), "{cause}");
    }

    // Stock comes back, but the penalty holds for the plan at ASH: db's
    // fourth place, never refused itself, waits; web at DAL is taken.
    assert!(w.fake.set_stock("c2-small-x86", "ASH", 5));
    let second = w.pass().await;
    assert_eq!(second.enqueued.len(), 1, "{second:?}");
    let plan = shepherd::fleet::plan(&w.pool, w.ctx.provider.as_ref(), &w.ctx.config)
        .await
        .unwrap();
    let penalised = plan
        .skipped
        .iter()
        .filter(|(_, why)| *why == Skip::Penalised)
        .count();
    assert_eq!(penalised, 4, "{:?}", plan.skipped);
    drain_with(&w.pool, &w.ctx).await;
    let sites: Vec<String> = w.fake.servers().iter().map(|s| s.site.clone()).collect();
    assert_eq!(sites, vec!["DAL".to_string()]);

    // Lifted early, the places are taken again, as far as the stock the
    // provider counts: ASH now has 2, so two of db's four are taken.
    assert!(w.fake.set_stock("c2-small-x86", "ASH", 2));
    sqlx::query("select shepherd.clear_penalty(reservation_id, 'restocked') from shepherd.sinbin")
        .execute(&w.pool)
        .await
        .unwrap();
    let third = w.pass().await;
    assert_eq!(third.enqueued.len(), 2, "{third:?}");
    drain_with(&w.pool, &w.ctx).await;
    let ash = w.fake.servers().iter().filter(|s| s.site == "ASH").count();
    assert_eq!(ash, 2);

    // The third pass recorded the pools as it saw them: ASH's count, db
    // empty, web's one server.
    let pools = w.last_pools().await;
    let db = pools.iter().find(|p| p.name == "db").unwrap();
    let stock = db.stock.unwrap();
    assert_eq!(
        (
            db.count,
            db.taken,
            stock.in_stock,
            stock.count,
            db.site.as_str()
        ),
        (4, 0, true, Some(2), "ASH")
    );
    let web = pools.iter().find(|p| p.name == "web").unwrap();
    assert_eq!((web.count, web.taken), (1, 1));
    w.assert_invariants().await;
}

/// A server whose deployment failed is replaced: the pass records it as
/// failed in its pool, deletes it (the request an event before the call),
/// penalises its place so that a plan that always fails does not churn
/// money, and fills the place again once the penalty ends. Never a second
/// server on the place meanwhile.
#[sqlx::test(migrations = false)]
async fn a_failed_deployment_is_replaced_and_its_place_penalised(db: PgPool) {
    let w = World::new(db, 3, vec![pool("web", "DAL", 3)]).await;
    a_failed_deployment_is_replaced(w).await;
}

/// The same, with one database connection for every job: no job holds a
/// connection while it asks for another (a worker's pool is two, shared
/// with its queues; two jobs each holding one and waiting for a second
/// would wait for good).
#[sqlx::test(migrations = false)]
async fn a_failed_deployment_is_replaced_on_one_connection(db: PgPool) {
    let w = World::on_one_connection(db, 3, vec![pool("web", "DAL", 3)]).await;
    a_failed_deployment_is_replaced(w).await;
}

async fn a_failed_deployment_is_replaced(w: World) {
    w.fake.set_faults(
        Faults::none()
            .with_rule(FaultRule::on(Call::CreateServer, FaultKind::FailDeployment).times(1)),
    );
    let pass = w.pass().await;
    assert_eq!(pass.enqueued.len(), 3);
    drain_with(&w.pool, &w.ctx).await;
    let failed: Vec<_> = w
        .fake
        .servers()
        .into_iter()
        .filter(|s| s.status == "failed_deployment")
        .collect();
    assert_eq!(failed.len(), 1);
    // The next pass counts it as failed and requests its deletion.
    let pass = w.pass().await;
    assert_eq!(pass.deletions, vec![failed[0].id.clone()], "{pass:?}");
    let pools = w.last_pools().await;
    assert_eq!((pools[0].taken, pools[0].failed), (3, 1), "{pools:?}");
    drain_with(&w.pool, &w.ctx).await;
    assert_eq!(w.fake.calls(Call::DestroyServer), 1);
    assert_eq!(w.fake.servers().len(), 2, "the failed server is gone");
    assert_eq!(
        w.count("select count(*) from shepherd.managed_machines")
            .await,
        2
    );
    let cause: String = sqlx::query_scalar(
        "select body->>'cause' from shepherd.events where event_type = 'deletion_requested'",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert_eq!(cause, "failed");
    // Its place waits out its penalty: no server on it meanwhile.
    let pass = w.pass().await;
    assert!(pass.enqueued.is_empty(), "{pass:?}");
    assert_eq!(
        w.count("select count(*) from shepherd.sinbin where now() <= until")
            .await,
        1
    );
    // The penalty lifted (by an operator here), the place is filled again.
    sqlx::query("select shepherd.clear_all_penalties('the plan is fixed')")
        .execute(&w.pool)
        .await
        .unwrap();
    w.settle(5).await;
    assert_eq!(w.fake.servers().len(), 3);
    assert!(
        w.fake
            .servers()
            .iter()
            .all(|s| s.status != "failed_deployment")
    );
    w.assert_invariants().await;
}

/// The server stays hidden past the settle window (the window was set too
/// short for this weather): after it, a look that finds nothing is trusted
/// and the creation creates again; the hidden server, once visible, is a
/// second one on the place, and the pass finds it, reports it, and deletes
/// the surplus. Never silently kept.
#[sqlx::test(migrations = false)]
async fn surplus_after_a_window_too_short_is_reported_and_deleted(db: PgPool) {
    let w = World::with_settle(
        db,
        5,
        vec![pool("web", "DAL", 1)],
        Duration::from_millis(500),
    )
    .await;
    w.fake.set_faults(create_lost_then_hidden(2_500));
    w.pass().await;
    for _ in 0..20 {
        drain_with(&w.pool, &w.ctx).await;
        w.make_due().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Two creates: the second after the (too short) window.
    assert_eq!(w.fake.calls(Call::CreateServer), 2);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(w.fake.servers().len(), 2);
    // The hidden one shows: a witnessed orphan, adopted, then surplus.
    w.pass().await;
    drain_with(&w.pool, &w.ctx).await;
    let pass = w.pass().await;
    let surplus = w
        .count("select count(*) from shepherd.events where event_type = 'surplus_found'")
        .await;
    assert!(surplus >= 1, "the surplus was not reported: {pass:?}");
    drain_with(&w.pool, &w.ctx).await;
    assert_eq!(w.fake.servers().len(), 1, "the surplus stayed");
    assert_eq!(w.fake.calls(Call::DestroyServer), 1);
    w.settle(3).await;
    w.assert_invariants().await;
}

/// A server the provider removed (deleted in its console, reclaimed) is a
/// fact to confirm, not a reason to stop: looked up by its id, a first
/// "not found" refuses the pass and is recorded; a second, some time later,
/// records the machine as lost, and the pass goes on and fills the place.
/// A listing that merely omits a server that exists still refuses.
#[sqlx::test(migrations = false)]
async fn a_removed_server_is_replaced_after_two_not_founds_and_an_omission_refuses(db: PgPool) {
    let w = World::with_settle(db, 5, vec![pool("web", "DAL", 2)], Duration::from_secs(2)).await;
    w.settle(3).await;
    let servers = w.fake.servers();
    assert_eq!(servers.len(), 2);
    // Machines recorded within the settle window are not looked for yet.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // One is omitted from the listings only: the pass refuses, and loses
    // nothing.
    assert!(
        w.fake
            .omit_from_listings(&servers[0].id, Duration::from_secs(3))
    );
    let pass = w.pass().await;
    assert!(
        pass.refused
            .as_deref()
            .is_some_and(|r| r.contains("disagree")),
        "{pass:?}"
    );
    assert_eq!(pass.missing_devices, vec![servers[0].id.clone()]);
    assert!(pass.lost.is_empty());
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The other is taken away by the provider.
    assert!(w.fake.reclaim(&servers[1].id));
    let first = w.pass().await;
    assert!(first.refused.is_some(), "{first:?}");
    assert!(first.lost.is_empty(), "lost on one look: {first:?}");
    assert_eq!(
        w.count("select count(*) from shepherd.events where event_type = 'machine_not_found'")
            .await,
        1
    );
    // Passes come often (every 300 ms here); the machine is lost once a
    // quarter of the window (at least a second) has passed since the first
    // "not found", however many passes saw it in between.
    let second = loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pass = w.pass().await;
        if !pass.lost.is_empty() {
            break pass;
        }
        assert!(pass.refused.is_some(), "{pass:?}");
        let waited: f64 = sqlx::query_scalar(
            "select extract(epoch from now() - min(recorded_at))::float8
             from shepherd.events where event_type = 'machine_not_found'",
        )
        .fetch_one(&w.pool)
        .await
        .unwrap();
        assert!(
            waited < 3.0,
            "not lost {waited} s after the first not-found"
        );
    };
    assert_eq!(second.lost, vec![servers[1].id.clone()], "{second:?}");
    let apart: f64 = sqlx::query_scalar(
        "select extract(epoch from
                (select recorded_at from shepherd.events where event_type = 'machine_lost')
              - (select min(recorded_at) from shepherd.events where event_type = 'machine_not_found'))::float8",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert!(apart >= 1.0, "lost {apart} s after the first not-found");
    assert_eq!(
        w.count("select count(*) from shepherd.events where event_type = 'machine_not_found'")
            .await,
        1,
        "every pass recorded its own not-found"
    );
    assert!(second.refused.is_none(), "{second:?}");
    assert_eq!(
        second.enqueued.len(),
        1,
        "the place was not filled: {second:?}"
    );
    drain_with(&w.pool, &w.ctx).await;
    assert_eq!(w.fake.servers().len(), 2);
    let evidence: String = sqlx::query_scalar(
        "select body->>'evidence' from shepherd.events where event_type = 'machine_lost'",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert!(evidence.contains("not found"), "{evidence}");
    w.assert_invariants().await;
}

/// An operator assimilates a server onto a place whose creation is in
/// flight: the assimilation waits for the creation instead of taking the
/// place from under it (that creation would otherwise go on and make a
/// second server there).
#[sqlx::test(migrations = false)]
async fn a_manual_assimilation_does_not_take_a_place_from_its_creation(db: PgPool) {
    use shepherd::jobs::AssimilateArgs;
    use shepherd::jobs::assimilate::{AssimilateOutcome, assimilate};
    let w = World::new(db, 5, vec![pool("web", "DAL", 1)]).await;
    let pass = w.pass().await;
    assert_eq!(pass.enqueued.len(), 1);
    // A server named for the same place by another request (an earlier
    // creation's, say), made before this creation runs.
    let client = w.client();
    let stray = client
        .create_server(&shepherd::latitude::CreateServer {
            plan: "c2-small-x86".into(),
            site: "DAL".into(),
            operating_system: "ubuntu_24_04_x64_lts".into(),
            hostname: pools::hostname(PREFIX, "web", 0, uuid::Uuid::new_v4()),
            ssh_keys: vec![],
        })
        .await
        .unwrap();
    let args = AssimilateArgs {
        device: stray.server.id.clone(),
        reservation: None,
        manual: true,
        created: None,
        attempt: 1,
    };
    let outcome = assimilate(&w.ctx, &args, "manual-assimilate")
        .await
        .unwrap();
    match outcome {
        AssimilateOutcome::Rejected { reason } => {
            assert!(reason.contains("in flight"), "{reason}")
        }
        other => panic!("assimilated over a creation in flight: {other:?}"),
    }
    assert_eq!(
        w.count("select count(*) from shepherd.managed_machines")
            .await,
        0
    );
}

/// Beside 250 other servers of the project, a pass reads only the
/// cluster's: one page, whatever else the project holds. An API that
/// ignores the prefix filter costs pages and no wrong answer; one that
/// reads it as an exact match leaves our servers out, and the pass that
/// finds one of them still standing stops trusting the filter: it refuses
/// once, lists the whole project from then on, and no second server is
/// ever made.
#[sqlx::test(migrations = false)]
async fn a_pass_reads_only_the_clusters_servers_and_survives_a_filter_it_cannot_trust(db: PgPool) {
    use shepherd_fakes::latitude::{HostnameOperators, Weather};
    let w = World::with_settle(db, 5, vec![pool("web", "DAL", 2)], Duration::from_secs(1)).await;
    let project = w.fake.project().to_string();
    for n in 0..250 {
        w.fake
            .add_foreign_server(&project, "c2-small-x86", "DAL", &format!("other-{n}"));
    }
    w.settle(3).await;
    let ours = |servers: &[shepherd_fakes::latitude::ServerSnapshot]| {
        servers
            .iter()
            .filter(|s| s.hostname.starts_with(PREFIX))
            .count()
    };
    assert_eq!(ours(&w.fake.servers()), 2);
    let listing = |w: &World| {
        let pool = w.pool.clone();
        async move {
            let body: serde_json::Value = sqlx::query_scalar(
                "select body->'listing' from shepherd.events
                 where event_type = 'pools_surveyed' order by position desc limit 1",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            body
        }
    };

    let before = w.fake.calls(Call::GetServers);
    let pass = w.pass().await;
    assert!(
        pass.refused.is_none() && pass.enqueued.is_empty(),
        "{pass:?}"
    );
    assert_eq!(
        w.fake.calls(Call::GetServers) - before,
        1,
        "one page of ours"
    );
    let seen = listing(&w).await;
    assert_eq!(seen["reads"], 1, "{seen}");
    assert_eq!(seen["machines"], 2, "{seen}");
    assert!(seen["scope"].as_str().unwrap().contains(PREFIX), "{seen}");

    // An API that ignores the operator: the whole project, filtered here.
    w.fake.set_weather(Weather {
        hostname_operators: HostnameOperators::Ignored,
        ..w.fake.weather()
    });
    let before = w.fake.calls(Call::GetServers);
    let pass = w.pass().await;
    assert!(
        pass.refused.is_none() && pass.enqueued.is_empty(),
        "{pass:?}"
    );
    let pages = w.fake.calls(Call::GetServers) - before;
    assert!(pages >= 3, "252 servers in {pages} pages");
    assert_eq!(listing(&w).await["machines"], 2);

    // One that reads it as an exact hostname: nothing of ours is listed.
    w.fake.set_weather(Weather {
        hostname_operators: HostnameOperators::Exact,
        ..w.fake.weather()
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pass = w.pass().await;
    assert!(pass.refused.is_some(), "{pass:?}");
    assert!(pass.lost.is_empty() && pass.enqueued.is_empty(), "{pass:?}");
    assert_eq!(
        w.count("select count(*) from shepherd.events where event_type = 'machine_not_found'")
            .await,
        0,
        "the provider knows both servers"
    );
    // From then on the whole project is listed, and the pass works.
    let pass = w.pass().await;
    assert!(
        pass.refused.is_none() && pass.enqueued.is_empty(),
        "{pass:?}"
    );
    let seen = listing(&w).await;
    assert_eq!(seen["machines"], 252, "{seen}");
    assert_eq!(seen["scope"], "every server of the project", "{seen}");
    assert_eq!(ours(&w.fake.servers()), 2);
    w.assert_invariants().await;
}

/// A listing that lags behind our creates shows a place we just filled as
/// free: the next pass fills the place that is really empty, not the one
/// our records hold (choosing it spent the pool's one lacking machine on a
/// place the admission refused, and the pass did nothing). The server is
/// made and not yet assimilated here; a pass that lists while a creation
/// lands is the same case (the Latitude demo ended a machine short).
#[sqlx::test(migrations = false)]
async fn a_lagging_listing_does_not_hide_the_place_still_empty(db: PgPool) {
    use shepherd_fakes::latitude::Weather;
    let w = World::with_config(db, 2, vec![pool("web", "DAL", 2)], Duration::ZERO, |c| {
        c.chunk_size = 1
    })
    .await;
    w.fake.set_weather(Weather {
        listing_lag_ms: 600_000,
        ..w.fake.weather()
    });
    let first = w.pass().await;
    assert_eq!(first.enqueued.len(), 1, "{first:?}");
    // The creation only: its server is ours and made, not yet assimilated.
    let ran = common::world::run_next(&w.pool, &w.ctx)
        .await
        .expect("the creation runs");
    assert_eq!(w.fake.servers().len(), 1, "{ran:?}");
    assert_eq!(
        w.count("select count(*) from shepherd.unassimilated_devices")
            .await,
        1
    );
    // The listing does not show it yet.
    let second = w.pass().await;
    assert_eq!(second.enqueued.len(), 1, "{second:?}");
    assert_ne!(second.enqueued, first.enqueued, "the held place again");
    w.fake.set_weather(Weather {
        listing_lag_ms: 0,
        ..w.fake.weather()
    });
    drain_with(&w.pool, &w.ctx).await;
    assert_eq!(
        w.count("select count(*) from shepherd.managed_machines")
            .await,
        2
    );
    assert_eq!(w.fake.servers().len(), 2);
}
