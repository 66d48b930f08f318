//! The Metal client against the fake server over real HTTP: every call, the
//! pagination, and each failure path the call discipline has to handle.

mod common;
#[path = "metal_client/pacing.rs"]
mod pacing;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::*;
use shepherd::metal::model::{DeviceAction, DeviceUpdateRequest, SshKeyInput};
use shepherd::metal::{
    ClientMetrics, CreateDevice, ErrorClass, MetalClient, MetalError, Operation, Witness,
};
use shepherd_fakes::metal::{FaultKind, Faults};
use uuid::Uuid;

fn create_request(reservation: Uuid, key: Uuid, witness: &str) -> CreateDevice {
    CreateDevice {
        reservation,
        hostname: format!("shepherd-{}", &reservation.to_string()[..18]),
        operating_system: "ubuntu_20_04".into(),
        ssh_keys: vec![key],
        witness: Witness::new(witness),
        first: None,
    }
}

async fn world(reservations: usize) -> (shepherd_fakes::metal::FakeMetal, MetalClient, Uuid) {
    let config = fake_config(reservations);
    let project = config.project_id;
    let fake = start_fake(config).await;
    let client = client_for(&fake, project);
    (fake, client, project)
}

#[tokio::test]
async fn every_call_works_against_the_fake() {
    let (fake, client, _) = world(5).await;

    let key = client
        .ensure_ssh_key("shepherd-test", "ssh-ed25519 AAAA one")
        .await
        .unwrap();
    assert_eq!(
        client.get_ssh_key(key).await.unwrap().label,
        "shepherd-test"
    );
    // Idempotent: the same label and key give the same id and create nothing.
    assert_eq!(
        client
            .ensure_ssh_key("shepherd-test", "ssh-ed25519 AAAA one")
            .await
            .unwrap(),
        key
    );
    assert_eq!(fake.calls(Operation::CreateProjectSshKey), 1);
    // Another key under the label is an update of the same key.
    assert_eq!(
        client
            .ensure_ssh_key("shepherd-test", "ssh-ed25519 AAAA two")
            .await
            .unwrap(),
        key
    );
    assert_eq!(
        client.get_ssh_key(key).await.unwrap().key,
        "ssh-ed25519 AAAA two"
    );
    assert_eq!(client.list_ssh_keys().await.unwrap().len(), 1);

    let reservations = client
        .list_reservations(&["facility", "device"])
        .await
        .unwrap();
    assert_eq!(reservations.len(), 5);
    let r = &reservations[0];
    assert!(r.provisionable && r.device.is_none());
    assert!(r.plan_slug().is_some() && r.metro_code().is_some());
    let single = client.get_reservation(r.id, &["facility"]).await.unwrap();
    assert_eq!(single.id, r.id);

    let created = client
        .create_device(&create_request(r.id, key, "job-1"))
        .await
        .unwrap();
    assert!(!created.recovered);
    let device = created.device;
    assert!(device.has_tag(&Witness::new("job-1").tag()));
    assert_eq!(client.get_device(device.id).await.unwrap().id, device.id);
    assert_eq!(client.list_devices().await.unwrap().len(), 1);
    let with_device = client.get_reservation(r.id, &["device"]).await.unwrap();
    assert_eq!(with_device.device_id(), Some(device.id));

    let updated = client
        .update_device(
            device.id,
            &DeviceUpdateRequest {
                description: Some("updated".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(updated.id, device.id);
    for action in [
        DeviceAction::PowerOff,
        DeviceAction::PowerOn,
        DeviceAction::Reboot,
    ] {
        client.device_action(device.id, action).await.unwrap();
    }

    client.delete_device(device.id).await.unwrap();
    assert!(matches!(
        client.get_device(device.id).await,
        Err(MetalError::NotFound { .. })
    ));
    assert!(client.list_devices().await.unwrap().is_empty());

    let other_project = Uuid::new_v4();
    let moved = client
        .move_reservation(reservations[1].id, other_project)
        .await
        .unwrap();
    assert_eq!(moved.id, reservations[1].id);
    assert_eq!(client.list_reservations(&[]).await.unwrap().len(), 4);

    let extra = client
        .create_ssh_key(&SshKeyInput {
            label: "extra".into(),
            key: "ssh-ed25519 AAAA extra".into(),
        })
        .await
        .unwrap();
    client
        .update_ssh_key(
            extra.id,
            &SshKeyInput {
                label: "extra2".into(),
                key: "ssh-ed25519 AAAA extra".into(),
            },
        )
        .await
        .unwrap();
    client.delete_ssh_key(extra.id).await.unwrap();
    assert_eq!(client.list_ssh_keys().await.unwrap().len(), 1);
}

#[tokio::test]
async fn listings_follow_every_page_whatever_the_page_size() {
    let config = fake_config(25);
    let project = config.project_id;
    let fake = start_fake(config).await;
    for (per_page, pages) in [(10u32, 3u64), (7, 4), (25, 1), (1000, 1)] {
        let mut config = client_config(&fake, project);
        config.per_page = per_page;
        let client = MetalClient::new(config, ClientMetrics::default()).unwrap();
        let before = fake.calls(Operation::FindProjectHardwareReservations);
        let all = client.list_reservations(&[]).await.unwrap();
        let ids: HashSet<_> = all.iter().map(|r| r.id).collect();
        assert_eq!(ids.len(), 25, "per_page {per_page}");
        assert_eq!(
            fake.calls(Operation::FindProjectHardwareReservations) - before,
            pages,
            "per_page {per_page}"
        );
    }
}

/// After the first page the rest are fetched at once (as many as the
/// client's parallelism allows), in the same order as a sequential listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_after_the_first_overlap_their_round_trips() {
    let config = fake_config(40);
    let project = config.project_id;
    let fake = start_fake(config).await;
    let mut config = client_config(&fake, project);
    config.per_page = 5;
    config.parallelism = 4;
    let client = MetalClient::new(config, ClientMetrics::default()).unwrap();
    let sequential = client.list_reservations(&[]).await.unwrap();
    fake.set_faults(Faults::none().with_latency(100, 0));
    let before = fake.request_log().len();
    let listed = client.list_reservations(&[]).await.unwrap();
    assert_eq!(
        listed.iter().map(|r| r.id).collect::<Vec<_>>(),
        sequential.iter().map(|r| r.id).collect::<Vec<_>>()
    );
    let pages: Vec<_> = fake.request_log().split_off(before);
    assert_eq!(pages.len(), 8);
    let overlapping = pages[1..]
        .iter()
        .filter(|a| {
            pages[1..]
                .iter()
                .any(|b| !std::ptr::eq(*a, b) && b.started <= a.started && a.started < b.finished)
        })
        .count();
    assert!(overlapping >= 3, "only {overlapping} pages overlapped");
}

#[tokio::test]
async fn a_transient_error_is_retried_and_the_call_succeeds() {
    let (fake, client, _) = world(3).await;
    let r = client.list_reservations(&[]).await.unwrap()[0].id;
    for status in [500, 502, 503] {
        fake.set_faults(next(
            Operation::FindHardwareReservationById,
            2,
            FaultKind::Status { status },
        ));
        let before = fake.calls(Operation::FindHardwareReservationById);
        client.get_reservation(r, &[]).await.unwrap();
        assert_eq!(
            fake.calls(Operation::FindHardwareReservationById) - before,
            3,
            "{status}"
        );
    }
}

#[tokio::test]
async fn a_permanent_error_fails_at_once_with_one_request() {
    let (fake, client, _) = world(3).await;
    let r = client.list_reservations(&[]).await.unwrap()[0].id;
    for status in [400, 401, 403, 404, 409, 422] {
        fake.set_faults(next(
            Operation::FindHardwareReservationById,
            5,
            FaultKind::Status { status },
        ));
        let before = fake.calls(Operation::FindHardwareReservationById);
        let err = client.get_reservation(r, &[]).await.unwrap_err();
        assert_eq!(err.class(), ErrorClass::Permanent, "{status}: {err}");
        assert_eq!(
            fake.calls(Operation::FindHardwareReservationById) - before,
            1,
            "{status}"
        );
    }
}

#[tokio::test]
async fn an_invalid_answer_carries_the_api_messages() {
    let (fake, client, _) = world(3).await;
    let r = client.list_reservations(&["facility"]).await.unwrap()[0].clone();
    let mut request = create_request(r.id, Uuid::new_v4(), "job-unknown-key");
    request.hostname = "bad_hostname".into();
    let err = client.create_device(&request).await.unwrap_err();
    match &err {
        MetalError::Invalid {
            status: 422,
            messages,
            ..
        } => assert!(!messages.is_empty()),
        other => panic!("expected a 422, got {other:?}"),
    }
    assert_eq!(fake.calls(Operation::CreateDevice), 1);
}

#[tokio::test]
async fn rate_limited_calls_wait_as_long_as_the_server_asked() {
    let (fake, client, _) = world(3).await;
    let r = client.list_reservations(&[]).await.unwrap()[0].id;
    fake.set_faults(next(
        Operation::FindHardwareReservationById,
        1,
        FaultKind::RateLimited {
            retry_after_secs: 1,
        },
    ));
    let started = Instant::now();
    client.get_reservation(r, &[]).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let log = fake.request_log();
    let gets: Vec<_> = log
        .iter()
        .filter(|c| c.op == Operation::FindHardwareReservationById)
        .collect();
    assert_eq!(gets.len(), 2);
    assert_eq!(gets[0].status, 429);
    assert!(gets[1].started.duration_since(gets[0].finished) >= Duration::from_millis(990));
}

#[tokio::test]
async fn accept_then_fail_yields_exactly_one_device() {
    for kind in [
        FaultKind::AcceptThenFail { status: 500 },
        FaultKind::AcceptThenDrop,
    ] {
        let (fake, client, _) = world(3).await;
        let key = client
            .ensure_ssh_key("k", "ssh-ed25519 AAAA k")
            .await
            .unwrap();
        let r = client.list_reservations(&[]).await.unwrap()[0].id;
        fake.set_faults(next(Operation::CreateDevice, 1, kind.clone()));
        let reads = fake.calls(Operation::FindHardwareReservationById);
        let created = client
            .create_device(&create_request(r, key, "job-7"))
            .await
            .unwrap();
        assert!(created.recovered, "{kind:?}");
        let on_reservation: Vec<_> = fake
            .devices()
            .into_iter()
            .filter(|d| d.reservation == Some(r))
            .collect();
        assert_eq!(on_reservation.len(), 1, "{kind:?}");
        assert_eq!(on_reservation[0].id, created.device.id);
        assert_eq!(
            fake.calls(Operation::CreateDevice),
            1,
            "{kind:?}: one POST only"
        );
        assert_eq!(
            fake.calls(Operation::FindHardwareReservationById) - reads,
            2,
            "{kind:?}"
        );
    }
}

#[tokio::test]
async fn create_device_costs_two_calls_in_the_normal_case() {
    let (fake, client, _) = world(3).await;
    let key = client
        .ensure_ssh_key("k", "ssh-ed25519 AAAA k")
        .await
        .unwrap();
    let r = client.list_reservations(&[]).await.unwrap()[0].id;
    let before = fake.total_calls();
    client
        .create_device(&create_request(r, key, "job-n"))
        .await
        .unwrap();
    assert_eq!(fake.total_calls() - before, 2);
}

#[tokio::test]
async fn a_retry_after_a_crash_finds_its_own_device() {
    let (fake, client, _) = world(3).await;
    let key = client
        .ensure_ssh_key("k", "ssh-ed25519 AAAA k")
        .await
        .unwrap();
    let r = client.list_reservations(&[]).await.unwrap()[0].id;
    let first = client
        .create_device(&create_request(r, key, "job-9"))
        .await
        .unwrap();
    // Another process running the same job (same witness) finds it, and
    // does not POST again.
    let again = client
        .create_device(&create_request(r, key, "job-9"))
        .await
        .unwrap();
    assert_eq!(first.device.id, again.device.id);
    assert!(again.recovered);
    assert_eq!(fake.calls(Operation::CreateDevice), 1);
    // A different job on the same reservation lost the race.
    let other = client
        .create_device(&create_request(r, key, "job-10"))
        .await
        .unwrap_err();
    assert!(matches!(other, MetalError::RaceLost { .. }), "{other:?}");
}

#[tokio::test]
async fn a_taken_reservation_yields_race_lost_and_no_device_of_ours() {
    let (fake, client, _) = world(3).await;
    let key = client
        .ensure_ssh_key("k", "ssh-ed25519 AAAA k")
        .await
        .unwrap();
    let r = client.list_reservations(&[]).await.unwrap()[0].id;
    fake.set_faults(next(
        Operation::FindHardwareReservationById,
        1,
        FaultKind::StealReservation,
    ));
    let err = client
        .create_device(&create_request(r, key, "job-s"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, MetalError::RaceLost { reservation, .. } if reservation == r),
        "{err:?}"
    );
    assert_eq!(err.class(), ErrorClass::RaceLost);
    assert_eq!(fake.calls(Operation::CreateDevice), 0);
    let ours = Witness::new("job-s").tag();
    assert!(fake.devices().iter().all(|d| !d.tags.contains(&ours)));
}

#[tokio::test]
async fn a_reservation_taken_between_read_and_create_is_race_lost() {
    let (fake, client, _) = world(3).await;
    let key = client
        .ensure_ssh_key("k", "ssh-ed25519 AAAA k")
        .await
        .unwrap();
    let r = client.list_reservations(&[]).await.unwrap()[0].id;
    fake.set_faults(next(
        Operation::CreateDevice,
        1,
        FaultKind::StealReservation,
    ));
    let err = client
        .create_device(&create_request(r, key, "job-t"))
        .await
        .unwrap_err();
    assert!(matches!(err, MetalError::RaceLost { .. }), "{err:?}");
}

#[tokio::test]
async fn a_stale_list_does_not_lead_to_a_create() {
    let (fake, client, _) = world(3).await;
    let key = client
        .ensure_ssh_key("k", "ssh-ed25519 AAAA k")
        .await
        .unwrap();
    let r = client.list_reservations(&[]).await.unwrap()[0].id;
    fake.mark_stale(r);
    let listed = client.list_reservations(&[]).await.unwrap();
    assert!(listed.iter().find(|x| x.id == r).unwrap().provisionable);
    let err = client
        .create_device(&create_request(r, key, "job-st"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, MetalError::NotProvisionable { .. }),
        "{err:?}"
    );
    assert_eq!(fake.calls(Operation::CreateDevice), 0);
}

#[tokio::test]
async fn exhausted_retries_on_an_ambiguous_create_say_so() {
    let (fake, client, _) = world(3).await;
    let key = client
        .ensure_ssh_key("k", "ssh-ed25519 AAAA k")
        .await
        .unwrap();
    let r = client.list_reservations(&[]).await.unwrap()[0].id;
    // Every POST fails without creating; the reads in between succeed.
    fake.set_faults(next(
        Operation::CreateDevice,
        1000,
        FaultKind::Status { status: 503 },
    ));
    let mut config = client_config(&fake, fake_project(&fake));
    config.retry.max_elapsed = Duration::from_millis(300);
    let client = MetalClient::new(config, ClientMetrics::default()).unwrap();
    let err = client
        .create_device(&create_request(r, key, "job-a"))
        .await
        .unwrap_err();
    assert!(matches!(err, MetalError::Ambiguous { .. }), "{err:?}");
    assert_eq!(err.class(), ErrorClass::Ambiguous);
    // Each POST was preceded by a read of the reservation.
    let log = fake.request_log();
    let ops: Vec<_> = log
        .iter()
        .filter(|c| {
            matches!(
                c.op,
                Operation::CreateDevice | Operation::FindHardwareReservationById
            )
        })
        .map(|c| c.op)
        .collect();
    assert!(ops.len() >= 4);
    for pair in ops.chunks(2) {
        assert_eq!(pair[0], Operation::FindHardwareReservationById);
    }
}

fn fake_project(fake: &shepherd_fakes::metal::FakeMetal) -> Uuid {
    let _ = fake;
    shepherd_fakes::metal::FakeConfig::default().project_id
}

#[tokio::test]
async fn cancellation_stops_a_call_stuck_in_backoff() {
    let (fake, _, project) = world(3).await;
    let mut config = client_config(&fake, project);
    config.retry.initial_interval = Duration::from_millis(300);
    config.retry.max_interval = Duration::from_secs(5);
    config.retry.max_elapsed = Duration::from_secs(600);
    let client = MetalClient::new(config, ClientMetrics::default()).unwrap();
    let id = Uuid::new_v4();
    fake.set_faults(next(
        Operation::FindDeviceById,
        u64::MAX,
        FaultKind::Status { status: 503 },
    ));
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_millis(800), client.get_device(id)).await;
    assert!(outcome.is_err(), "the call should still be retrying");
    assert!(started.elapsed() < Duration::from_millis(1200));
    let calls = fake.calls(Operation::FindDeviceById);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        fake.calls(Operation::FindDeviceById),
        calls,
        "no attempt after the drop"
    );
    assert_eq!(client.metrics().waiting.get(), 0);
    assert_eq!(client.metrics().in_flight.get(), 0);
}

// Several threads, so the fake's stamps are not held up by the callers' own
// scheduling on one thread.

#[tokio::test]
async fn undecodable_answers_are_typed_errors_with_an_excerpt() {
    let (fake, client, _) = world(3).await;
    let r = client.list_reservations(&[]).await.unwrap()[0].id;
    fake.set_faults(next(
        Operation::FindHardwareReservationById,
        1,
        FaultKind::Garbage {
            body: "<html>gateway says hi</html>".into(),
            status: 200,
        },
    ));
    let err = client.get_reservation(r, &[]).await.unwrap_err();
    match &err {
        MetalError::Undecodable {
            status: 200,
            excerpt,
            ..
        } => assert!(excerpt.contains("gateway")),
        other => panic!("expected Undecodable, got {other:?}"),
    }
    assert_eq!(fake.calls(Operation::FindHardwareReservationById), 1);
}

#[tokio::test]
async fn a_wrong_token_is_unauthorised_and_not_retried() {
    let (fake, _, project) = world(3).await;
    let mut config = client_config(&fake, project);
    config.token = shepherd::secret::ApiToken::new("wrong");
    let client = MetalClient::new(config, ClientMetrics::default()).unwrap();
    let err = client.list_devices().await.unwrap_err();
    assert!(
        matches!(err, MetalError::Unauthorized { status: 401, .. }),
        "{err:?}"
    );
    assert_eq!(fake.calls(Operation::FindProjectDevices), 1);
}

#[tokio::test]
async fn placeholder_labels_are_refused_before_any_call() {
    let (fake, client, _) = world(1).await;
    let err = client
        .ensure_ssh_key("FIXME-label", "ssh-ed25519 AAAA")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("FIXME"));
    assert_eq!(fake.total_calls(), 0);
}

#[tokio::test]
async fn metrics_record_latency_by_endpoint_and_status() {
    let (fake, client, _) = world(2).await;
    client.list_reservations(&[]).await.unwrap();
    let _ = client.get_device(Uuid::new_v4()).await;
    let mut registry = prometheus_client::registry::Registry::default();
    client.metrics().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains(
        r#"shepherd_provider_request_duration_seconds_count{provider="metal",endpoint="findProjectHardwareReservations",status="200"} 1"#
    ), "{text}");
    assert!(text.contains(
        r#"shepherd_provider_request_duration_seconds_count{provider="metal",endpoint="findDeviceById",status="404"} 1"#
    ), "{text}");
    assert!(text.contains(r#"shepherd_provider_calls_in_flight{provider="metal"} 0"#));
    assert!(text.contains(r#"shepherd_provider_calls_waiting{provider="metal"} 0"#));
    drop(fake);
}

/// A fence that refuses (the unit's lock lost with its connection, in a
/// database restart) ends the call at once: it is asked once, nothing is
/// sent, and the call is not retried inside itself, where the fence would
/// refuse for ever; the job's next run takes a lock of its own.
#[tokio::test]
async fn a_refusing_fence_ends_the_create_without_retrying_it() {
    struct Refusing(std::sync::atomic::AtomicU32);
    impl shepherd::provider::Fence for Refusing {
        fn check(&self) -> futures::future::BoxFuture<'_, Result<(), String>> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async { Err("the unit's lock may be lost".to_string()) })
        }
    }
    let (fake, client, _) = world(2).await;
    let key = client
        .ensure_ssh_key("k", "ssh-ed25519 AAAA k")
        .await
        .unwrap();
    let r = client.list_reservations(&[]).await.unwrap()[0].id;
    let fence = Refusing(std::sync::atomic::AtomicU32::new(0));
    let pacer = shepherd::metal::LocalPacer::new(shepherd::config::Rate::UNLIMITED);
    let err = client
        .create_device_paced(&create_request(r, key, "fenced"), &pacer, &fence)
        .await
        .unwrap_err();
    assert!(matches!(err, MetalError::NotSent { .. }), "{err:?}");
    assert_eq!(fence.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(fake.devices().is_empty());
}
