//! The chaos run against the fake Latitude.sh: three worker processes
//! keeping pools under Latitude's faults (5xx, 429 with `meta.retry_after`,
//! creates that succeed and answer 500, a gateway's 504 after the server
//! was made with the server hidden from every read for seconds, listings
//! that lag, a server the provider takes away, another party creating in
//! the project, stock that runs out under the creates), SIGKILLs, a
//! Postgres restart, and operators enqueueing passes. Checked all along at
//! the fake (no pool over its count, no place with two servers, no
//! hostname twice) and at the end from shepherd's views too: every server
//! of ours managed, the taken one recorded as lost and replaced, the limit
//! never exceeded, nothing left in flight, and the views equal to the log.
//! Its own test binary, so it runs alone.

use std::collections::HashSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use shepherd::latitude::pools::{self, Pool};
use shepherd_fakes::latitude::{Call, FakeConfig, FaultKind, FaultRule, Faults};
use sqlx::PgPool;

mod common;
use common::*;

const KEY: &str = "latitude-chaos-key-51c0";

#[sqlx::test(migrations = false)]
async fn latitude_chaos_breaks_no_invariant(pool: PgPool) {
    let pools_flag = "name=web,plan=c2-small-x86,site=DAL,count=30,os=ubuntu_24_04_x64_lts;\
                      name=batch,plan=c2-small-x86,site=ASH,count=20,os=ubuntu_24_04_x64_lts;\
                      name=cold,plan=c2-small-x86,site=CHI,count=5,os=ubuntu_24_04_x64_lts";
    let pools: Vec<Pool> = pools_flag.split(';').map(|p| p.parse().unwrap()).collect();
    let max: i64 = 45;
    let kill_every = Duration::from_millis(env_or("SHEPHERD_CHAOS_KILL_EVERY_MS", 3000));
    // How long a server made behind a gateway's 504 stays out of every
    // read, and how long a listing lags behind a create or a delete; the
    // settle window is longer than both, as an operator would set it.
    let hidden_ms = env_or("SHEPHERD_CHAOS_HIDDEN_MS", 15_000);
    let lag_ms = env_or("SHEPHERD_CHAOS_LAG_MS", 10_000);
    let settle = format!("{}ms", hidden_ms.max(lag_ms) * 3 / 2);
    let fake = start_latitude(FakeConfig {
        token: KEY.into(),
        // Ten times Latitude's budgets, and the workers told so: the run
        // would otherwise wait minutes on 20 writes a minute.
        reads_per_window: 600,
        writes_per_window: 200,
        deploy_delay: Duration::from_millis(500),
        faults: Faults {
            latency_ms: 0,
            latency_jitter_ms: 150,
            rules: vec![
                FaultRule::on(Call::CreateServer, FaultKind::OtherPartyCreates).times(3),
                FaultRule::on(
                    Call::CreateServer,
                    FaultKind::AcceptThenFail { status: 500 },
                )
                .with_probability(0.05),
                // The weather that once made a pool of 6 hold 11 servers.
                FaultRule::on(
                    Call::CreateServer,
                    FaultKind::GatewayTimeout {
                        status: 504,
                        hidden_ms,
                    },
                )
                .with_probability(0.08),
                FaultRule::new(FaultKind::RateLimited {
                    retry_after_secs: 1,
                })
                .with_probability(0.03),
                FaultRule::new(FaultKind::Status { status: 503 }).with_probability(0.15),
            ],
        },
        ..FakeConfig::default()
    });
    // ASH has 12 of the plan for batch's 20 places, and its stock runs out
    // once batch's first server stands, under the creates a pass admitted
    // with it. CHI has none: cold waits.
    assert!(fake.set_stock("c2-small-x86", "ASH", 12));
    fake.set_weather(shepherd_fakes::latitude::Weather {
        listing_lag_ms: lag_ms,
        ..fake.weather()
    });
    let mut c = Cluster::new(pool, 0, shepherd_fakes::metal::Faults::none()).await;
    migrate(&c).await;
    let env = [
        ("SHEPHERD_PROVIDER", "latitude"),
        ("LATITUDE_API_URL", &fake.base_url()),
        ("LATITUDE_PROJECT", fake.project()),
        ("LATITUDE_API_KEY", KEY),
        ("SHEPHERD_LATITUDE_POOLS", pools_flag),
        ("LATITUDE_READS_PER_MINUTE", "600"),
        ("LATITUDE_WRITES_PER_MINUTE", "200"),
    ]
    .map(|(k, v)| (k, v.to_string()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let max_arg = max.to_string();
    let worker_args = [
        "--scheduler",
        "--max-machines",
        &max_arg,
        "--chunk-size",
        "20",
        "--device-creation-rate",
        "10ms,1",
        "--create-attempts",
        "6",
        "--sweep-interval",
        "2s",
        "--penalty",
        "1h",
        // One API attempt plus a heartbeat inside the harness's 3 s rescue
        // window, as a worker requires.
        "--latitude-api-timeout",
        "1500ms",
        // Longer than the fake hides a server or lags a listing (the real
        // service's window is minutes: the default is 5m).
        "--settle-window",
        &settle,
    ];
    for _ in 0..3 {
        c.spawn_worker_with_env(&worker_args, &env);
    }
    let cluster = local_cluster();
    let mut guard = RestartGuard(None);
    let started = Instant::now();
    let mut random = picker(u64::from(std::process::id()) ^ 0x2545_f491_4f6c_dd1d);
    let (mut kills, mut manual, mut highest) = (0u32, 0u32, 0i64);
    let mut ash_ran_out = false;
    let mut last_kill = Instant::now();
    let mut restarted: Option<Duration> = None;
    let mut passes = vec![];
    let mut taken_away: Option<String> = None;
    // Servers of ours that ran and were then powered off and put in
    // rescue by their owner: kept, whatever the run does.
    let mut dormant: Vec<String> = vec![];
    // An operator lowers web to 24 once it is whole, and raises it back to
    // 30 once it has shed its surplus: deletions under the same weather.
    let mut lowered = false;
    let mut raised = false;
    let mut other_party: HashSet<String> = HashSet::new();
    let (mut samples, mut most_servers) = (0u64, 0usize);
    let timeout = Duration::from_secs(env_or("SHEPHERD_CHAOS_TIMEOUT_SECS", 240));
    let web_full = |fake: &shepherd_fakes::latitude::FakeLatitude| {
        fake.servers()
            .iter()
            .filter(|s| s.hostname.starts_with("shepherd-web-"))
            .count()
            // More than the pool's 30 ends the run too, so the checks below
            // name what broke instead of a timeout.
            >= 30
    };
    loop {
        let elapsed = started.elapsed();
        if elapsed >= timeout {
            let mut names: Vec<String> = fake
                .servers()
                .iter()
                .map(|s| format!("{} {} {}", s.hostname, s.site, s.status))
                .collect();
            names.sort();
            let sinbin: Vec<(uuid::Uuid, String)> =
                sqlx::query_as("select reservation_id, cause from shepherd.sinbin")
                    .fetch_all(&c.pool)
                    .await
                    .unwrap_or_default();
            panic!(
                "Latitude chaos run not settled after {timeout:?} (last sample {:?}); logs in {}\nservers: {names:#?}\nsinbin: {sinbin:?}",
                sqlx::query_as::<_, (i64, i64)>(
                    "select (select count(*) from shepherd.managed_machines),
                            (select count(*) from shepherd.in_flight)"
                )
                .fetch_one(&c.pool)
                .await
                .ok(),
                c.dir.display()
            );
        }
        let sample: Option<(i64, i64, i64)> = sqlx::query_as(
            "select (select count(*) from shepherd.managed_machines),
                    (select count(*) from shepherd.in_flight),
                    (select count(*) from apalis.jobs
                      where job_type in ('create_device', 'assimilate')
                        and (status in ('Pending', 'Queued', 'Running')
                             or (status = 'Failed' and attempts < max_attempts)))",
        )
        .fetch_one(&c.pool)
        .await
        .ok();
        if let Some((m, f, _)) = sample {
            highest = highest.max(m + f);
            assert!(m + f <= max, "managed {m} + in flight {f} > {max}");
        }
        // At every moment, at the provider: what money is spent on.
        let now = fake.servers();
        most_servers = most_servers.max(now.len());
        samples += 1;
        assert_eq!(fake.duplicate_hostnames(), 0, "a hostname created twice");
        let mut seen = HashSet::new();
        other_party.extend(
            now.iter()
                .filter(|s| s.created_by_other)
                .map(|s| s.id.clone()),
        );
        let web_now = now
            .iter()
            .filter(|s| !s.created_by_other && s.hostname.starts_with("shepherd-web-"))
            .count();
        if !lowered && web_now >= 30 {
            operator(
                &c,
                &env,
                &[
                    "settings",
                    "set",
                    "deletion_budget",
                    "100%,10",
                    "--reason",
                    "chaos",
                ],
            );
            operator(
                &c,
                &env,
                &[
                    "pools",
                    "set",
                    "web",
                    "count=24",
                    "--reason",
                    "chaos: lower",
                ],
            );
            lowered = true;
        } else if lowered && !raised && web_now <= 24 {
            operator(
                &c,
                &env,
                &[
                    "pools",
                    "set",
                    "web",
                    "count=30",
                    "--reason",
                    "chaos: raise",
                ],
            );
            raised = true;
        }
        for s in now.iter().filter(|s| !s.created_by_other) {
            if let Some(named) = pools::parse("shepherd-", &pools, &s.hostname) {
                assert!(
                    seen.insert((named.pool.name.clone(), named.index)),
                    "at {elapsed:?}, place {} of {} holds two servers",
                    named.index,
                    named.pool.name
                );
            }
        }
        for p in &pools {
            let n = seen.iter().filter(|(name, _)| *name == p.name).count();
            assert!(
                n as u32 <= p.count,
                "at {elapsed:?}, pool {} holds {n}",
                p.name
            );
        }
        // The provider takes a server away (reclaimed, deleted in its
        // console): it is confirmed lost and its place filled again.
        // Once the shrink is over, so that no deletion can meet it first.
        if taken_away.is_none() && raised && elapsed > Duration::from_secs(20) {
            // A managed one, so that its loss is shepherd's to find (a
            // server still in its creation's hands is that creation's).
            let managed: HashSet<String> = match sqlx::query_scalar::<_, String>(
                "select provider_id from shepherd.managed_machines m
                 where not exists (select 1 from shepherd.pending_deletions d
                                   where d.machine_id = m.machine_id)",
            )
            .fetch_all(&c.pool)
            .await
            {
                Ok(ids) => ids.into_iter().collect(),
                // Postgres may be down for its restart: the next sample.
                Err(_) => HashSet::new(),
            };
            if let Some(victim) = now
                .iter()
                .find(|s| s.hostname.starts_with("shepherd-web-") && managed.contains(&s.id))
            {
                assert!(fake.reclaim(&victim.id));
                taken_away = Some(victim.id.clone());
            }
        }
        // Once the shrink is over and the server taken away is chosen, so
        // that neither can meet them: any two that ran.
        if dormant.is_empty() && taken_away.is_some() && elapsed > Duration::from_secs(20) {
            let ready: HashSet<String> = match sqlx::query_scalar::<_, String>(
                "select provider_id from shepherd.managed_machines where ready_at is not null",
            )
            .fetch_all(&c.pool)
            .await
            {
                Ok(ids) => ids.into_iter().collect(),
                // Postgres may be down for its restart: the next sample.
                Err(_) => HashSet::new(),
            };
            let picks: Vec<String> = now
                .iter()
                .filter(|s| {
                    s.hostname.starts_with("shepherd-")
                        && ready.contains(&s.id)
                        && taken_away.as_ref() != Some(&s.id)
                })
                .take(2)
                .map(|s| s.id.clone())
                .collect();
            if picks.len() == 2 {
                for (id, status) in picks.iter().zip(["off", "rescue_mode"]) {
                    assert!(fake.set_status(id, Some(status)));
                    assert!(fake.age_server(id, Duration::from_secs(30 * 86_400)));
                }
                dormant = picks;
            }
        }
        if !ash_ran_out
            && fake
                .servers()
                .iter()
                .any(|s| s.hostname.starts_with("shepherd-batch-"))
        {
            assert!(fake.set_stock("c2-small-x86", "ASH", 0));
            ash_ran_out = true;
        }
        let settled = matches!(sample, Some((_, 0, 0)))
            && web_full(&fake)
            && taken_away.is_some()
            && raised
            && !dormant.is_empty();
        if settled && restarted.is_some() && elapsed > Duration::from_secs(15) {
            break;
        }
        if restarted.is_none() && elapsed > Duration::from_secs(6) {
            guard.0 = Some(cluster.clone());
            let down = Instant::now();
            pg_ctl(&cluster, "stop");
            tokio::time::sleep(Duration::from_secs(4)).await;
            pg_ctl(&cluster, "start");
            guard.0 = None;
            restarted = Some(down.elapsed());
        }
        if !settled && last_kill.elapsed() >= kill_every {
            let alive: Vec<usize> = (0..c.workers.len())
                .filter(|&i| c.workers[i].try_wait().unwrap().is_none())
                .collect();
            assert!(
                !alive.is_empty(),
                "every worker has exited; logs in {}: {}",
                c.dir.display(),
                log_of(&c.dir, c.workers.len() - 1)
            );
            let victim = alive[random(alive.len())];
            signal(&c.workers[victim], "KILL");
            let _ = c.workers[victim].wait();
            kills += 1;
            c.spawn_worker_with_env(&worker_args, &env);
            last_kill = Instant::now();
        }
        if manual < 6 && elapsed > Duration::from_secs(2 + 4 * u64::from(manual / 2)) {
            for _ in 0..2 {
                passes.push(
                    c.command(&["enqueue", "reconcile"])
                        .envs(env.iter().copied())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .unwrap(),
                );
                manual += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    for mut p in passes {
        let _ = p.wait();
    }
    c.stop_all();

    // The provider's side, from the fake's own servers.
    let servers = fake.servers();
    let mut hostnames = HashSet::new();
    let mut places = HashSet::new();
    let mut ours = HashSet::new();
    for s in &servers {
        assert!(
            hostnames.insert(s.hostname.clone()),
            "two servers named {}",
            s.hostname
        );
        if let Some(named) = pools::parse("shepherd-", &pools, &s.hostname) {
            assert!(!s.created_by_other, "{} is another party's", s.hostname);
            assert!(named.index < named.pool.count);
            assert!(
                places.insert((named.pool.name.clone(), named.index)),
                "place {} of {} holds two servers",
                named.index,
                named.pool.name
            );
            ours.insert(s.id.clone());
        }
    }
    for p in &pools {
        let n = places.iter().filter(|(name, _)| *name == p.name).count();
        assert!(n as u32 <= p.count, "pool {} overfilled: {n}", p.name);
    }
    let cold = places.iter().filter(|(name, _)| name == "cold").count();
    assert_eq!(cold, 0, "a server in a site without stock");
    let managed: HashSet<String> = c.managed_ids().await.into_iter().collect();
    let log = fake.request_log();
    assert_eq!(managed, ours, "managed machines and our servers differ");
    assert!(managed.len() as i64 <= max);
    assert_eq!(c.in_flight().await, 0, "something is left in flight");
    let report = shepherd::events::views::rebuild(&c.pool, false)
        .await
        .unwrap();
    assert!(report.differences.is_empty(), "{:?}", report.differences);
    let recovered = c
        .count(
            "select count(*) from shepherd.events
             where event_type = 'device_created' and (body->>'recovered')::bool",
        )
        .await;
    let taken_away = taken_away.expect("no server was taken away");
    // Deletions: no more than the surplus the operator made, and never a
    // server that is not ours.
    let surplus_deletions = c
        .count(
            "select count(*) from shepherd.events
             where event_type = 'deletion_requested' and body->>'cause' = 'surplus'",
        )
        .await;
    let failed_deletions = c
        .count("select count(*) from shepherd.events where event_type = 'deletion_failed'")
        .await;
    assert!(
        (6..=6 + failed_deletions).contains(&surplus_deletions),
        "{surplus_deletions} surplus deletions for a surplus of 6 ({failed_deletions} failed)"
    );
    let deleted_ids: HashSet<String> = log
        .iter()
        .filter(|r| r.call == Call::DestroyServer)
        .filter_map(|r| r.path.rsplit('/').next().map(str::to_string))
        .collect();
    assert!(
        deleted_ids.is_disjoint(&other_party),
        "another party's server was deleted"
    );
    assert_eq!(dormant.len(), 2, "no server of ours was powered off");
    let left: HashSet<String> = fake.servers().into_iter().map(|s| s.id).collect();
    for id in &dormant {
        assert!(
            !deleted_ids.contains(id) && left.contains(id),
            "server {id}, ready once and then off or in rescue, was deleted"
        );
    }
    let deleted_machines: HashSet<String> = sqlx::query_scalar(
        "select body->>'provider_id' from shepherd.events where event_type = 'deletion_requested'",
    )
    .fetch_all(&c.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert!(
        deleted_ids.is_subset(&deleted_machines),
        "a DELETE for a server no deletion was requested for: {deleted_ids:?}"
    );
    assert!(
        !managed.contains(&taken_away),
        "the taken server is still managed"
    );
    let lost = c
        .count("select count(*) from shepherd.events where event_type = 'machine_lost'")
        .await;
    assert_eq!(
        lost, 1,
        "the server taken away was not recorded as lost once"
    );
    let hidden = log
        .iter()
        .filter(|r| r.call == Call::CreateServer && r.status == 504)
        .count();
    let penalised = c.count("select count(*) from shepherd.sinbin").await;
    let out_of_stock = c
        .count("select count(*) from shepherd.sinbin where scope is not null")
        .await;
    assert!(
        ash_ran_out,
        "batch never had a server, so ASH never ran out"
    );
    let (errors, limited) = (
        log.iter().filter(|r| r.status >= 500).count(),
        log.iter().filter(|r| r.status == 429).count(),
    );
    let batch = places.iter().filter(|(name, _)| name == "batch").count();
    eprintln!(
        "latitude chaos: {} servers of ours (web 30, batch {batch} on ASH's stock, cold 0), \
         {} of another party's, limit {max} (highest managed + in flight {highest}), \
         {penalised} places penalised ({out_of_stock} for want of stock), {} API calls ({errors} answered 5xx, {limited} 429), \
         web lowered to 24 and raised to 30 ({surplus_deletions} deleted), {kills} workers SIGKILLed, Postgres down {:.1?}, {manual} manual passes, \
         {recovered} servers found by their hostname after a lost answer ({hidden} of them answered by a 504 and hidden \
         {hidden_ms} ms), listings {lag_ms} ms behind (settle window {settle}), 1 server taken away and \
         replaced, {samples} samples at the fake (at most {most_servers} servers), {:.1?}",
        ours.len(),
        servers.iter().filter(|s| s.created_by_other).count(),
        fake.total_calls(),
        restarted.unwrap_or_default(),
        elapsed
    );
}

/// An operator's command, run to its end; it must succeed.
fn operator(c: &Cluster, env: &[(&str, &str)], args: &[&str]) {
    let out = c
        .command(args)
        .envs(env.iter().copied())
        .env("SHEPHERD_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "shepherd {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
