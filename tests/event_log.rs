//! The event log on real Postgres: appends, decoding, append-only, the
//! commit-safe feed, transactions, the sinbin and rebuilds.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use rand::{Rng, SeedableRng};
use shepherd::events::event::*;
use shepherd::events::store::{self, Follower};
use shepherd::events::views::{self, PROVIDER_METAL};
use shepherd::events::{Event, NewEvent, record};
use shepherd::metal::ErrorClass;
use sqlx::PgPool;
use uuid::Uuid;

#[path = "event_log/one_of_each.rs"]
mod one_of_each;
#[path = "event_log/random_histories.rs"]
mod random_histories;
#[path = "event_log/view_rows.rs"]
mod view_rows;
use one_of_each::one_of_each;

#[sqlx::test(migrations = false)]
async fn every_event_type_reads_back_as_written(pool: PgPool) {
    common::migrated(&pool).await;
    let events = one_of_each();
    let names: HashSet<_> = events.iter().map(|e| e.type_name().to_string()).collect();
    assert_eq!(
        names.len(),
        Event::TYPE_NAMES.len(),
        "the sample covers every type"
    );
    let mut tx = pool.begin().await.unwrap();
    let stored = record(
        &mut tx,
        events
            .iter()
            .cloned()
            .map(|e| NewEvent::new(e).caused_by("job-1"))
            .collect(),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(stored.len(), events.len());
    let read = store::read_recent(&pool, 100).await.unwrap();
    let read_events: Vec<_> = read.iter().map(|e| e.event.clone()).collect();
    assert_eq!(read_events, events);
    assert!(read.iter().all(|e| e.job_id.as_deref() == Some("job-1")));
    for e in &read {
        let stream = store::read_stream(&pool, &e.stream).await.unwrap();
        assert!(stream.iter().any(|s| s.event_id == e.event_id));
    }
}

#[sqlx::test(migrations = false)]
async fn an_older_version_still_decodes_from_the_table(pool: PgPool) {
    common::migrated(&pool).await;
    let r = Uuid::new_v4();
    sqlx::query(
        "insert into shepherd.events (event_id, stream, event_type, schema_version, body)
         values ($1, $2, 'reservation_penalised', 1, $3)",
    )
    .bind(Uuid::new_v4())
    .bind(format!("reservation/{r}"))
    .bind(serde_json::json!({"reservation": r, "until": "2026-01-01T00:00:00Z", "cause": "old"}))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "insert into shepherd.events (event_id, stream, event_type, schema_version, body)
         values ($1, $2, 'from_the_future', 1, '{}')",
    )
    .bind(Uuid::new_v4())
    .bind(format!("reservation/{r}"))
    .execute(&pool)
    .await
    .unwrap();
    let read = store::read_stream(&pool, &format!("reservation/{r}"))
        .await
        .unwrap();
    match &read[0].event {
        Event::ReservationPenalised(p) => {
            assert_eq!(p.cause, "old");
            assert_eq!(p.class, None);
        }
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(&read[1].event, Event::Unknown { event_type, .. } if event_type == "from_the_future")
    );
    // The rebuild reads past rows it does not know.
    let report = views::rebuild(&pool, false).await.unwrap();
    assert_eq!(report.events, 2);
}

#[sqlx::test(migrations = false)]
async fn the_log_refuses_updates_deletes_and_truncates(pool: PgPool) {
    common::migrated(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    record(
        &mut tx,
        vec![NewEvent::new(SshKeyEnsured {
            label: "k".into(),
            key_id: Uuid::new_v4().to_string(),
        })],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    for sql in [
        "update shepherd.events set body = '{}'",
        "delete from shepherd.events",
        "truncate shepherd.events",
    ] {
        let err = sqlx::query(sql).execute(&pool).await.unwrap_err();
        assert!(err.to_string().contains("append-only"), "{sql}: {err}");
    }
    let count: i64 = sqlx::query_scalar("select count(*) from shepherd.events")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(count, 1);
}

/// What an operator writes into the permanent log has a limit, whatever
/// the door: every SQL function an operator calls, and the library's own
/// appends. A refusal records nothing and says what the limit is.
#[sqlx::test(migrations = false)]
async fn an_operators_reason_over_the_limit_is_refused_at_every_door(pool: PgPool) {
    common::migrated(&pool).await;
    let long = "x".repeat(1001);
    let r = Uuid::new_v4();
    let events = || async {
        let n: i64 = sqlx::query_scalar("select count(*) from shepherd.events")
            .fetch_one(&pool)
            .await
            .unwrap();
        n
    };
    let refused = |sql: &'static str, text: String| {
        let pool = pool.clone();
        async move {
            let err = sqlx::query(sql)
                .bind(&text)
                .execute(&pool)
                .await
                .expect_err(sql);
            let db = err.as_database_error().expect("a database error");
            assert_eq!(db.code().as_deref(), Some("22023"), "{sql}: {err}");
            assert!(db.message().contains("at most"), "{sql}: {err}");
        }
    };
    refused(
        "select shepherd.pause_creations($1, 'sql:test')",
        long.clone(),
    )
    .await;
    refused(
        "select shepherd.pause_deletions($1, 'sql:test')",
        long.clone(),
    )
    .await;
    refused(
        "select shepherd.pause_deletions('why', $1)",
        "y".repeat(201),
    )
    .await;
    refused(
        "select shepherd.change_setting('chunk_size', '5', $1, 'sql:test')",
        long.clone(),
    )
    .await;
    assert_eq!(events().await, 0, "a refused action left an event");
    sqlx::query("select shepherd.pause_creations('maintenance', 'sql:test')")
        .execute(&pool)
        .await
        .unwrap();
    refused(
        "select shepherd.resume_creations($1, 'sql:test')",
        long.clone(),
    )
    .await;
    let mut tx = pool.begin().await.unwrap();
    record(
        &mut tx,
        vec![NewEvent::new(ReservationPenalised {
            reservation: r,
            until: Utc::now() + TimeDelta::minutes(10),
            cause: "test".into(),
            class: None,
            scope: None,
        })],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let err = sqlx::query("select shepherd.clear_penalty($1, $2, 'sql:test')")
        .bind(r)
        .bind(&long)
        .execute(&pool)
        .await
        .expect_err("a penalty cleared with a reason over the limit");
    assert!(err.to_string().contains("at most"), "{err}");
    // The library's own appends meet the same check.
    let mut tx = pool.begin().await.unwrap();
    let appended = record(
        &mut tx,
        vec![NewEvent::new(CreationsResumed {
            by: "cli:test".into(),
            reason: long.clone(),
        })],
    )
    .await;
    assert!(
        appended.is_err(),
        "the library appended a reason over the limit"
    );
    drop(tx);
    assert_eq!(events().await, 2, "a refused action left an event");
    // At the limit, it is taken.
    sqlx::query("select shepherd.resume_creations($1, 'sql:test')")
        .bind("x".repeat(1000))
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(events().await, 3);
}

#[sqlx::test(migrations = false)]
async fn a_retried_append_is_stored_once(pool: PgPool) {
    common::migrated(&pool).await;
    let r = Uuid::new_v4();
    let e = NewEvent::new(CreationRequested {
        reservation: r,
        request: Uuid::new_v4(),
        manual: true,
        requested_by: None,
        sinbin_override: None,
        place: None,
    });
    for _ in 0..2 {
        let mut tx = pool.begin().await.unwrap();
        record(&mut tx, vec![e.clone()]).await.unwrap();
        tx.commit().await.unwrap();
    }
    let stream = store::read_stream(&pool, &format!("reservation/{r}"))
        .await
        .unwrap();
    assert_eq!(stream.len(), 1);
}

#[sqlx::test(migrations = false)]
async fn a_rollback_leaves_neither_events_nor_view_changes(pool: PgPool) {
    common::migrated(&pool).await;
    let (r, d) = (Uuid::new_v4(), Uuid::new_v4());
    let mut tx = pool.begin().await.unwrap();
    record(
        &mut tx,
        vec![
            NewEvent::new(CreationRequested {
                reservation: r,
                request: Uuid::new_v4(),
                manual: false,
                requested_by: None,
                sinbin_override: None,
                place: None,
            }),
            device_created(r, d.to_string()),
        ],
    )
    .await
    .unwrap();
    // Inside the transaction the view already shows the device.
    let inside = views::read_live(&mut tx).await.unwrap();
    assert!(inside.unassimilated.contains_key(&d.to_string()));
    tx.rollback().await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(
        views::read_live(&mut conn).await.unwrap(),
        views::ViewState::default()
    );
    assert!(store::read_recent(&pool, 10).await.unwrap().is_empty());
}

/// Eight writers commit in an order unlike their insert order (each holds
/// its transaction open a random while); a follower reading concurrently
/// must see every event exactly once, each stream in order.
#[sqlx::test(migrations = false)]
async fn a_follower_never_skips_a_late_commit(pool: PgPool) {
    common::migrated(&pool).await;
    const WRITERS: usize = 8;
    const PER_WRITER: u32 = 60;
    let commit_order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let pool = pool.clone();
            let commit_order = commit_order.clone();
            tokio::spawn(async move {
                let reservation = Uuid::new_v4();
                let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64);
                for attempt in 0..PER_WRITER {
                    let mut tx = pool.begin().await.unwrap();
                    let event = CreationAttemptFailed {
                        reservation,
                        class: ErrorClass::Transient,
                        message: String::new(),
                        attempt,
                    };
                    let stored = record(&mut tx, vec![NewEvent::new(event)]).await.unwrap();
                    tokio::time::sleep(Duration::from_micros(rng.random_range(0..3000))).await;
                    tx.commit().await.unwrap();
                    commit_order.lock().unwrap().push(stored[0].position);
                }
            })
        })
        .collect();
    let follower = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut follower = Follower::from_start();
            let mut seen = Vec::new();
            let total = WRITERS * PER_WRITER as usize;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while seen.len() < total && tokio::time::Instant::now() < deadline {
                let batch = follower.poll(&pool).await.unwrap();
                if batch.is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                seen.extend(batch);
            }
            // Anything more would be a duplicate.
            tokio::time::sleep(Duration::from_millis(50)).await;
            seen.extend(follower.poll(&pool).await.unwrap());
            seen
        })
    };
    for w in writers {
        w.await.unwrap();
    }
    let seen = follower.await.unwrap();
    assert_eq!(seen.len(), WRITERS * PER_WRITER as usize);
    let ids: HashSet<_> = seen.iter().map(|e| e.event_id).collect();
    assert_eq!(ids.len(), seen.len(), "an event was delivered twice");
    let mut last: BTreeMap<String, u32> = BTreeMap::new();
    for e in &seen {
        let Event::CreationAttemptFailed(f) = &e.event else {
            panic!()
        };
        if let Some(prev) = last.insert(e.stream.clone(), f.attempt) {
            assert!(f.attempt > prev, "stream {} out of order", e.stream);
        }
    }
    // Commits did not follow insert order, or this test proves little.
    let committed = commit_order.lock().unwrap().clone();
    let late = committed.windows(2).filter(|w| w[1] < w[0]).count();
    assert!(late > 0, "no commit came late; widen the sleeps");
}

async fn penalise(pool: &PgPool, r: Uuid, until: chrono::DateTime<Utc>) {
    let mut tx = pool.begin().await.unwrap();
    record(
        &mut tx,
        vec![NewEvent::new(ReservationPenalised {
            reservation: r,
            until,
            cause: "test".into(),
            class: None,
            scope: None,
        })],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

#[sqlx::test(migrations = false)]
async fn sinbin_basics(pool: PgPool) {
    common::migrated(&pool).await;
    let mut conn = pool.acquire().await.unwrap();
    let now = Utc::now();
    let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    // Never added: not penalised.
    assert!(!views::is_penalised(&mut conn, a).await.unwrap());
    // Added with a future deadline: penalised.
    penalise(&pool, a, now + TimeDelta::hours(1)).await;
    assert!(views::is_penalised(&mut conn, a).await.unwrap());
    // Added with a past deadline: not penalised.
    penalise(&pool, b, now - TimeDelta::seconds(1)).await;
    assert!(!views::is_penalised(&mut conn, b).await.unwrap());
    // Adding keeps the later deadline, and counts the failures.
    penalise(&pool, a, now + TimeDelta::minutes(10)).await;
    let p = views::penalty(&mut conn, a).await.unwrap().unwrap();
    assert!(
        (p.until - (now + TimeDelta::hours(1)))
            .num_milliseconds()
            .abs()
            < 1
    );
    assert_eq!(p.failures, 2);
    // Expiry: penalised until the deadline passes, then not.
    penalise(&pool, c, Utc::now() + TimeDelta::milliseconds(300)).await;
    assert!(views::is_penalised(&mut conn, c).await.unwrap());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!views::is_penalised(&mut conn, c).await.unwrap());
    // An operator's clear lifts it at once.
    let mut tx = pool.begin().await.unwrap();
    record(
        &mut tx,
        vec![NewEvent::new(PenaltyCleared {
            reservation: a,
            by: "ops".into(),
            reason: "t".into(),
        })],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert!(!views::is_penalised(&mut conn, a).await.unwrap());
}

#[sqlx::test(migrations = false)]
async fn a_growing_penalty_resets_on_success(pool: PgPool) {
    common::migrated(&pool).await;
    let policy = views::PenaltyPolicy {
        initial: Duration::from_secs(60),
        factor: 2.0,
        max: Duration::from_secs(3600),
    };
    let r = Uuid::new_v4();
    let mut conn = pool.acquire().await.unwrap();
    let mut durations = vec![];
    for _ in 0..3 {
        let failures = views::penalty(&mut conn, r)
            .await
            .unwrap()
            .map_or(0, |p| p.failures as u32);
        let d = policy.duration(failures);
        durations.push(d.as_secs());
        penalise(&pool, r, Utc::now() + TimeDelta::from_std(d).unwrap()).await;
    }
    assert_eq!(durations, vec![60, 120, 240]);
    let mut tx = pool.begin().await.unwrap();
    record(&mut tx, vec![device_created(r, Uuid::new_v4().to_string())])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(views::penalty(&mut conn, r).await.unwrap().is_none());
}

/// A machine's first readiness is what lets shepherd tell a broken machine
/// from one never finished, so no later event may move or erase it: not an
/// operator protecting it, not a second pass seeing it ready. The live path
/// loads a machine's row before folding events into it; a column it did not
/// load came back empty and the write-back erased it.
#[sqlx::test(migrations = false)]
async fn a_machines_first_readiness_survives_every_later_event(pool: PgPool) {
    common::migrated(&pool).await;
    let (machine, device, reservation) = (Uuid::new_v4(), "dev-1".to_string(), Uuid::new_v4());
    let append = |event: Event| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            let stored = record(&mut tx, vec![NewEvent::new(event)]).await.unwrap();
            tx.commit().await.unwrap();
            stored[0].recorded_at
        }
    };
    let ready_at = async |pool: &PgPool| -> Option<chrono::DateTime<Utc>> {
        sqlx::query_scalar("select ready_at from shepherd.managed_machines where machine_id = $1")
            .bind(machine)
            .fetch_one(pool)
            .await
            .unwrap()
    };
    append(
        MachineAssimilated {
            machine_id: machine,
            provider: "latitude".into(),
            provider_id: device.clone(),
            reservation: Some(reservation),
            hostname: Some("shepherd-web-1".into()),
        }
        .into(),
    )
    .await;
    let ready = MachineReady {
        machine_id: machine,
        provider_id: device.clone(),
        status: Some("on".into()),
    };
    let first = append(ready.clone().into()).await;
    assert_eq!(ready_at(&pool).await, Some(first));
    for later in [
        Event::from(MachineProtected {
            machine_id: machine,
            provider_id: device.clone(),
            by: "ops".into(),
            reason: "keep".into(),
        }),
        ready.into(),
        MachineUnprotected {
            machine_id: machine,
            provider_id: device.clone(),
            by: "ops".into(),
            reason: "done".into(),
        }
        .into(),
    ] {
        let name = later.type_name().to_string();
        append(later).await;
        assert_eq!(ready_at(&pool).await, Some(first), "after {name}");
    }
    let report = views::rebuild(&pool, false).await.unwrap();
    assert_eq!(report.differences, Vec::<String>::new());

    // Rows the old write-back damaged (erased, or moved to a later
    // readiness) get their first readiness back from the log on upgrade.
    for damage in [
        "update shepherd.managed_machines set ready_at = null",
        "update shepherd.managed_machines set ready_at = ready_at + interval '1 minute'",
    ] {
        sqlx::raw_sql(damage).execute(&pool).await.unwrap();
        assert_ne!(ready_at(&pool).await, Some(first), "{damage}");
        sqlx::raw_sql(include_str!(
            "../migrations/20261206000009_ready_repair.sql"
        ))
        .execute(&pool)
        .await
        .unwrap();
        assert_eq!(
            ready_at(&pool).await,
            Some(first),
            "repaired after: {damage}"
        );
    }
    let report = views::rebuild(&pool, false).await.unwrap();
    assert_eq!(report.differences, Vec::<String>::new());
}

/// An append takes its keys' locks (here the device's) before its first
/// row goes in, in the call that inserts it (`shepherd.append_reading`): a
/// writer recording on the same device holds the append back until it
/// commits, and the append then folds into views that include what that
/// writer recorded (the device it made, which the machine's assimilation
/// takes out of flight). A read in the snapshot the call started with
/// would not see it.
#[sqlx::test(migrations = false)]
async fn an_append_waits_for_the_writer_holding_its_keys(pool: PgPool) {
    let (r, device, holder) = a_writer_holding_a_device(&pool).await;
    let append = tokio::spawn({
        let (pool, device) = (pool.clone(), device.clone());
        async move {
            let mut tx = pool.begin().await.unwrap();
            record(
                &mut tx,
                vec![NewEvent::new(MachineAssimilated {
                    machine_id: Uuid::new_v4(),
                    provider: PROVIDER_METAL.into(),
                    provider_id: device,
                    reservation: Some(r),
                    hostname: Some("h".into()),
                })],
            )
            .await
            .unwrap();
            tx.commit().await.unwrap();
        }
    });
    held_back_until_it_commits(holder, append, "the append").await;
    let (in_flight, managed): (i64, i64) = sqlx::query_as(
        "select (select count(*) from shepherd.unassimilated_devices where device_id = $1),
                (select count(*) from shepherd.managed_machines where provider_id = $1)",
    )
    .bind(&device)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (in_flight, managed),
        (0, 1),
        "the assimilation folded into views without the device its holder made"
    );
    common::assert_rebuild_equals_live(&pool).await;
}

/// An assimilation reads what its record depends on in the call that takes
/// the device's lock (`shepherd.assimilation_seen`): held back by a writer
/// recording on the device, it reads once that writer has committed, and
/// sees the device it made in flight. A read in the snapshot the call
/// started with would see nothing there, and count the machine again.
#[sqlx::test(migrations = false)]
async fn an_assimilations_read_waits_for_the_writer_holding_its_device(pool: PgPool) {
    let (r, device, holder) = a_writer_holding_a_device(&pool).await;
    let seen = tokio::spawn({
        let (pool, device) = (pool.clone(), device.clone());
        async move {
            let mut tx = pool.begin().await.unwrap();
            let seen: (Option<Uuid>, bool) = sqlx::query_as(
                "select existing, in_flight from shepherd.assimilation_seen($1, $2, $3, $4)",
            )
            .bind(format!("device/{device}"))
            .bind(PROVIDER_METAL)
            .bind(&device)
            .bind(r)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
            tx.commit().await.unwrap();
            seen
        }
    });
    let seen = held_back_until_it_commits(holder, seen, "the read").await;
    assert_eq!(
        seen,
        (None, true),
        "the read did not see the device its lock's holder made"
    );
}

/// A writer that has recorded our create's answer (a device on a
/// reservation) and holds their locks, not yet committed.
async fn a_writer_holding_a_device(
    pool: &PgPool,
) -> (Uuid, String, sqlx::Transaction<'static, sqlx::Postgres>) {
    common::migrated(pool).await;
    let (r, device) = (Uuid::new_v4(), Uuid::new_v4().to_string());
    let mut holder = pool.begin().await.unwrap();
    record(&mut holder, vec![device_created(r, device.clone())])
        .await
        .unwrap();
    (r, device, holder)
}

/// `what`, started while `holder` holds its locks, is still waiting 700 ms
/// later, and ends once `holder` commits.
async fn held_back_until_it_commits<T>(
    holder: sqlx::Transaction<'static, sqlx::Postgres>,
    what: tokio::task::JoinHandle<T>,
    name: &str,
) -> T {
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !what.is_finished(),
        "{name} went ahead while another writer held its device's lock"
    );
    holder.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), what)
        .await
        .unwrap_or_else(|_| panic!("{name} goes on once the lock is free"))
        .unwrap()
}

/// Our create's answer for `device` on `reservation`, as the tests record it.
fn device_created(reservation: Uuid, device: impl Into<String>) -> NewEvent {
    NewEvent::new(DeviceCreated {
        reservation,
        device: device.into(),
        hostname: "h".into(),
        witness: "w".into(),
        recovered: false,
        request: None,
    })
}
