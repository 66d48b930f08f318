//! Random histories: the views rebuilt from the log equal the views kept
//! live, whatever order and mix of events a fleet lived through.

use super::*;

fn random_event(rng: &mut impl Rng, reservations: &[Uuid], devices: &[Uuid]) -> Event {
    let r = reservations[rng.random_range(0..reservations.len())];
    let d = devices[rng.random_range(0..devices.len())];
    let offset = TimeDelta::seconds(rng.random_range(-3600..3600));
    let pool = ["web", "db", "batch"][rng.random_range(0..3)].to_string();
    // A machine has one id at the provider, as in life.
    let machine = Uuid::from_u128(d.as_u128() ^ 1);
    let request = Uuid::from_u128(rng.random_range(0..3));
    match rng.random_range(0..25) {
        24 => DeletionRequested {
            machine_id: machine,
            provider_id: d.to_string(),
            reservation: Some(r),
            pool: Some(pool),
            request,
            cause: "surplus".into(),
            message: "m".into(),
            by: "reconcile".into(),
        }
        .into(),
        23 => MachineDeleted {
            machine_id: machine,
            provider: "latitude".into(),
            provider_id: d.to_string(),
            reservation: Some(r),
            request,
            already_gone: rng.random(),
        }
        .into(),
        22 if rng.random() => DeletionFailed {
            machine_id: machine,
            provider_id: d.to_string(),
            request,
            message: "m".into(),
        }
        .into(),
        22 => DeletionUnresolved {
            machine_id: machine,
            provider_id: d.to_string(),
            request,
            message: format!("m{}", rng.random::<u8>()),
            lease_lost: false,
        }
        .into(),
        21 if rng.random() => LeaveAcknowledged {
            machine_id: machine,
            provider_id: d.to_string(),
            request,
            by: "ops".into(),
        }
        .into(),
        21 => LeaveTimedOut {
            machine_id: machine,
            provider_id: d.to_string(),
            request,
            action: ["proceed", "give_up"][rng.random_range(0..2)].into(),
        }
        .into(),
        20 if rng.random() => MachineProtected {
            machine_id: machine,
            provider_id: d.to_string(),
            by: "ops".into(),
            reason: "r".into(),
        }
        .into(),
        20 if rng.random() => MachineUnprotected {
            machine_id: machine,
            provider_id: d.to_string(),
            by: "ops".into(),
            reason: "r".into(),
        }
        .into(),
        20 if rng.random() => MachineReady {
            machine_id: machine,
            provider_id: d.to_string(),
            status: Some("on".into()),
        }
        .into(),
        20 => LeaveAsked {
            machine_id: machine,
            provider_id: d.to_string(),
            request,
            by: "ack".into(),
        }
        .into(),
        19 if rng.random() => DeletionsPaused {
            by: "ops".into(),
            reason: format!("r{}", rng.random::<u8>()),
        }
        .into(),
        19 => DeletionCancelled {
            machine_id: machine,
            provider_id: d.to_string(),
            request,
            reason: "r".into(),
            by: "ops".into(),
        }
        .into(),
        18 => CreationSettled {
            reservation: r,
            request: Uuid::from_u128(rng.random_range(0..3)),
            message: "m".into(),
        }
        .into(),
        17 => MachineLost {
            machine_id: Uuid::new_v4(),
            provider: "latitude".into(),
            provider_id: d.to_string(),
            reservation: Some(r),
            evidence: "e".into(),
        }
        .into(),
        16 => PoolRemoved {
            name: pool,
            by: "ops".into(),
            reason: "r".into(),
            confirmed: true,
        }
        .into(),
        15 if rng.random() => PoolDeclared {
            name: pool,
            plan: "p".into(),
            site: "S".into(),
            count: rng.random_range(0..9),
            operating_system: "o".into(),
            ssh_keys: vec![],
            by: "ops".into(),
            reason: "r".into(),
        }
        .into(),
        15 => PoolChanged {
            name: pool,
            plan: "p".into(),
            site: "S".into(),
            count: rng.random_range(0..9),
            operating_system: "o".into(),
            ssh_keys: vec![format!("ssh_{}", rng.random::<u8>())],
            by: "ops".into(),
            reason: "r".into(),
            confirmed: rng.random(),
        }
        .into(),
        14 => SettingsChanged {
            by: "ops".into(),
            reason: "r".into(),
            settings: [(
                ["max_machines", "chunk_size"][rng.random_range(0..2)].to_string(),
                serde_json::Value::from(rng.random_range(1..9u64)),
            )]
            .into_iter()
            .collect(),
        }
        .into(),
        13 => MachineReleased {
            machine_id: Uuid::new_v4(),
            provider: PROVIDER_METAL.into(),
            provider_id: d.to_string(),
            by: "ops".into(),
            reason: "gone".into(),
        }
        .into(),
        12 => CreationUnresolved {
            reservation: r,
            request: Uuid::from_u128(rng.random_range(0..3)),
            attempt: 1,
            message: format!("m{}", rng.random::<u8>()),
            // Read by no view: drawn from nothing, so the stream of
            // histories stays what it was.
            lease_lost: r.as_u128().is_multiple_of(2),
            looked: r.as_u128().is_multiple_of(3),
        }
        .into(),
        11 => CreationsPaused {
            by: "ops".into(),
            reason: format!("r{}", rng.random::<u8>()),
        }
        .into(),
        10 => AdoptionRequested {
            run: Uuid::nil(),
            device: d.to_string(),
            reservation: Some(r),
            witnessed: rng.random(),
        }
        .into(),
        0 => CreationRequested {
            reservation: r,
            // A few requests, so that unresolved outcomes meet their owner.
            request: Uuid::from_u128(rng.random_range(0..3)),
            manual: rng.random(),
            requested_by: None,
            sinbin_override: None,
            place: None,
        }
        .into(),
        1 => DeviceCreated {
            reservation: r,
            device: d.to_string(),
            hostname: "h".into(),
            witness: "w".into(),
            recovered: rng.random(),
            request: [None, Some(Uuid::from_u128(rng.random_range(0..3)))][rng.random_range(0..2)],
        }
        .into(),
        2 => CreationGivenUp {
            reservation: r,
            class: ErrorClass::Permanent,
            message: "m".into(),
            request: None,
        }
        .into(),
        3 => RaceLost {
            reservation: r,
            other_device: None,
            request: None,
        }
        .into(),
        4 | 5 => ReservationPenalised {
            reservation: r,
            until: Utc::now() + offset,
            cause: format!("c{}", rng.random::<u8>()),
            class: None,
            scope: None,
        }
        .into(),
        6 => PenaltyCleared {
            reservation: r,
            by: "ops".into(),
            reason: "r".into(),
        }
        .into(),
        7 => MachineAssimilated {
            machine_id: machine,
            provider: PROVIDER_METAL.into(),
            provider_id: d.to_string(),
            reservation: Some(r),
            hostname: Some("h".into()),
        }
        .into(),
        8 => AssimilationSkipped {
            device: d.to_string(),
            machine_id: Uuid::new_v4(),
        }
        .into(),
        _ => AssimilationRejected {
            device: d.to_string(),
            reason: "gone".into(),
        }
        .into(),
    }
}

#[sqlx::test(migrations = false)]
async fn rebuilt_views_equal_live_views_on_random_histories(pool: PgPool) {
    common::migrated(&pool).await;
    let reservations: Vec<Uuid> = (0..12).map(|_| Uuid::new_v4()).collect();
    let devices: Vec<Uuid> = (0..12).map(|_| Uuid::new_v4()).collect();
    // Four concurrent writers, with a rebuild check running while they write.
    let writers: Vec<_> = (0..4u64)
        .map(|seed| {
            let (pool, reservations, devices) =
                (pool.clone(), reservations.clone(), devices.clone());
            tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                for _ in 0..100 {
                    let n = rng.random_range(1..4);
                    let events = (0..n)
                        .map(|_| NewEvent::new(random_event(&mut rng, &reservations, &devices)))
                        .collect();
                    let mut tx = pool.begin().await.unwrap();
                    record(&mut tx, events).await.unwrap();
                    tx.commit().await.unwrap();
                }
            })
        })
        .collect();
    for _ in 0..3 {
        let report = views::rebuild(&pool, false).await.unwrap();
        assert_eq!(report.differences, Vec::<String>::new(), "mid-run check");
    }
    for w in writers {
        w.await.unwrap();
    }
    let report = views::rebuild(&pool, false).await.unwrap();
    assert_eq!(report.differences, Vec::<String>::new());
    assert!(report.events >= 400);
    assert!(report.machines > 0 && report.penalties > 0, "{report:?}");

    // A damaged view is reported, and replaced by the rebuild.
    sqlx::query("delete from shepherd.managed_machines where machine_id in (select machine_id from shepherd.managed_machines limit 1)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("update shepherd.sinbin set failures = failures + 7")
        .execute(&pool)
        .await
        .unwrap();
    let report = views::rebuild_by(&pool, Some("cli:tester")).await.unwrap();
    assert!(report.differences.len() >= 2, "{report:?}");
    assert!(report.replaced);
    let report = views::rebuild(&pool, false).await.unwrap();
    assert_eq!(report.differences, Vec::<String>::new());
    // The replacement is an operator action: recorded, with who.
    let (by, differences): (String, i64) = sqlx::query_as(
        "select body->>'by', (body->>'differences')::bigint from shepherd.events
         where event_type = 'views_replaced' and stream = 'operator/views'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(by, "cli:tester");
    assert!(differences >= 2);
}
