//! The client's discipline under concurrent callers: parallelism, minimum
//! intervals, a budget's burst, creations' spacing and a 429 shared.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallelism_holds_under_twenty_concurrent_callers() {
    let config = fake_config(3);
    let project = config.project_id;
    let fake = start_fake(config).await;
    fake.set_faults(Faults {
        latency_ms: 100,
        ..Faults::default()
    });
    let mut config = client_config(&fake, project);
    config.parallelism = 3;
    let client = MetalClient::new(config, ClientMetrics::default()).unwrap();
    let r = client.list_reservations(&[]).await.unwrap()[0].id;
    let calls = (0..20).map(|_| {
        let client = client.clone();
        async move { client.get_reservation(r, &[]).await.unwrap() }
    });
    futures::future::join_all(calls).await;
    let log: Vec<_> = fake
        .request_log()
        .into_iter()
        .filter(|c| c.op == Operation::FindHardwareReservationById)
        .collect();
    assert_eq!(log.len(), 20);
    let max_overlap = log
        .iter()
        .map(|a| {
            log.iter()
                .filter(|b| b.started <= a.started && a.started < b.finished)
                .count()
        })
        .max()
        .unwrap();
    assert!(max_overlap <= 3, "{max_overlap} calls overlapped");
    assert!(max_overlap >= 2, "parallelism was not used at all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_minimum_interval_holds_under_twenty_concurrent_callers() {
    let config = fake_config(3);
    let project = config.project_id;
    let fake = start_fake(config).await;
    let mut config = client_config(&fake, project);
    config.parallelism = 3;
    config.api_rate = "100ms,1".parse().unwrap();
    let client = MetalClient::new(config, ClientMetrics::default()).unwrap();
    let r = client.list_reservations(&[]).await.unwrap()[0].id;
    let calls = (0..20).map(|_| {
        let client = client.clone();
        async move { client.get_reservation(r, &[]).await.unwrap() }
    });
    futures::future::join_all(calls).await;
    let mut starts: Vec<_> = fake.request_log().into_iter().map(|c| c.started).collect();
    starts.sort();
    assert_eq!(starts.len(), 21);
    for pair in starts.windows(2) {
        let gap = pair[1].duration_since(pair[0]);
        // Slack for scheduling jitter between the client's clock and the
        // moment the server stamps a request; the span below is exact.
        assert!(
            gap >= Duration::from_millis(80),
            "calls started {gap:?} apart"
        );
    }
    let span = starts[starts.len() - 1].duration_since(starts[0]);
    assert!(
        span >= Duration::from_millis(20 * 100 - 10),
        "21 calls in {span:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_lets_its_burst_through_at_once_then_spaces_the_rest() {
    let config = fake_config(3);
    let project = config.project_id;
    let fake = start_fake(config).await;
    let mut config = client_config(&fake, project);
    config.parallelism = 10;
    // A bucket of 5, refilled at one per 100 ms.
    config.api_rate = "500ms,5".parse().unwrap();
    let client = MetalClient::new(config, ClientMetrics::default()).unwrap();
    let r = fake.reservations()[0].id;
    let calls = (0..10).map(|_| {
        let client = client.clone();
        async move { client.get_reservation(r, &[]).await.unwrap() }
    });
    futures::future::join_all(calls).await;
    let mut starts: Vec<_> = fake.request_log().into_iter().map(|c| c.started).collect();
    starts.sort();
    let first = starts[0];
    let burst_span = starts[4].duration_since(first);
    assert!(
        burst_span < Duration::from_millis(60),
        "the first five calls took {burst_span:?}: the burst was not used"
    );
    // The other five wait for the bucket to refill, 100 ms each.
    let span = starts[9].duration_since(first);
    assert!(
        span >= Duration::from_millis(5 * 100 - 10),
        "ten calls in {span:?} with a burst of five at 100 ms"
    );
}

/// A creation waits for its turn without holding an API slot, and a turn
/// that went stale while every slot was busy is given up for a fresh one:
/// creations never reach the provider bunched together, even when slow
/// calls hold every slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creations_keep_their_spacing_when_every_api_slot_is_busy() {
    let config = fake_config(6);
    let project = config.project_id;
    let fake = start_fake(config).await;
    let mut config = client_config(&fake, project);
    config.parallelism = 2;
    let client = MetalClient::new(config, ClientMetrics::default()).unwrap();
    let key = client
        .ensure_ssh_key("k", "ssh-ed25519 AAAA k")
        .await
        .unwrap();
    fake.set_faults(Faults::none().with_latency(250, 0));
    let pacer = shepherd::metal::LocalPacer::new("100ms,1".parse().unwrap());
    let reservations: Vec<_> = fake.reservations().into_iter().map(|r| r.id).collect();
    let busy = (0..4).map(|_| {
        let client = client.clone();
        let r = reservations[0];
        async move {
            client.get_reservation(r, &[]).await.unwrap();
        }
    });
    let creations = reservations[1..5].iter().map(|r| {
        let client = client.clone();
        let pacer = &pacer;
        let req = create_request(*r, key, &r.to_string());
        async move {
            client
                .create_device_paced(&req, pacer, &shepherd::provider::discipline::Open)
                .await
                .unwrap();
        }
    });
    futures::future::join(
        futures::future::join_all(busy),
        futures::future::join_all(creations),
    )
    .await;
    let mut posts: Vec<_> = fake
        .request_log()
        .into_iter()
        .filter(|c| c.op == Operation::CreateDevice)
        .map(|c| c.started)
        .collect();
    posts.sort();
    assert_eq!(posts.len(), 4);
    for pair in posts.windows(2) {
        let gap = pair[1].duration_since(pair[0]);
        assert!(
            gap >= Duration::from_millis(70),
            "two creations {gap:?} apart"
        );
    }
}

/// A 429 with `Retry-After` stops every caller of the client, not only the
/// one that got it, and the calls resume after the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_holds_every_caller_for_as_long_as_it_asks() {
    let config = fake_config(3);
    let project = config.project_id;
    let fake = start_fake(config).await;
    let mut config = client_config(&fake, project);
    config.parallelism = 4;
    config.api_rate = shepherd::config::Rate::UNLIMITED;
    let metrics = ClientMetrics::default();
    let client = MetalClient::new(config, metrics.clone()).unwrap();
    let r = fake.reservations()[0].id;
    fake.set_faults(next(
        Operation::FindHardwareReservationById,
        1,
        FaultKind::RateLimited {
            retry_after_secs: 1,
        },
    ));
    client.get_reservation(r, &[]).await.unwrap();
    let calls = (0..6).map(|_| {
        let client = client.clone();
        async move { client.get_reservation(r, &[]).await.unwrap() }
    });
    futures::future::join_all(calls).await;
    let log = fake.request_log();
    let throttled = log.iter().find(|c| c.status == 429).expect("a 429");
    let after: Vec<_> = log
        .iter()
        .filter(|c| c.started > throttled.finished)
        .collect();
    assert_eq!(after.len(), 7, "the retry and the six calls");
    for call in after {
        let gap = call.started.duration_since(throttled.finished);
        assert!(
            gap >= Duration::from_millis(950),
            "a call started {gap:?} after a 429 that asked for 1 s"
        );
    }
    assert_eq!(metrics.throttled.get(), 1);
}
