//! Manual jobs and the SQL door to the queue: unknown ids refused and
//! recorded, devices of other projects rejected, a managed device's
//! assimilation a no-op, poison rows refused, successor keys scoped.

use super::*;

#[sqlx::test(migrations = false)]
async fn manual_jobs_for_unknown_ids_are_refused_and_recorded(pool: PgPool) {
    let w = World::with(pool, 3, config(5, 5)).await;
    let unknown = Uuid::new_v4();
    sqlx::query("select shepherd.enqueue_create_device($1)")
        .bind(unknown)
        .execute(&w.pool)
        .await
        .unwrap();
    sqlx::query("select shepherd.enqueue_assimilate($1)")
        .bind(unknown)
        .execute(&w.pool)
        .await
        .unwrap();
    let ran = w.drain().await;
    assert_eq!(ran.len(), 2);
    assert_eq!(w.events("creation_refused").await, 1);
    assert_eq!(w.events("assimilation_rejected").await, 1);
    // Who asked is on the device's stream before the outcome.
    let by: String = sqlx::query_scalar(
        "select body->>'requested_by' from shepherd.events
         where event_type = 'assimilation_requested' and stream = $1",
    )
    .bind(format!("device/{unknown}"))
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert!(by.starts_with("sql:"), "{by}");
    assert_eq!(w.fake.calls(Operation::CreateDevice), 0);
    assert_eq!(w.managed().await + w.in_flight().await, 0);
    // A malformed id never gets that far.
    let err = sqlx::query("select shepherd.enqueue_create_device('not-a-uuid')")
        .execute(&w.pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("uuid"), "{err}");
}

#[sqlx::test(migrations = false)]
async fn a_manual_assimilate_of_a_device_in_another_project_is_rejected(pool: PgPool) {
    let w = World::with(pool, 3, config(5, 5)).await;
    let elsewhere = Uuid::new_v4();
    let r = w.fake.reservations()[0].id;
    w.metal.move_reservation(r, elsewhere).await.unwrap();
    let device = w.fake.add_foreign_device(r, "shepherd-theirs", vec![]);
    sqlx::query("select shepherd.enqueue_assimilate($1)")
        .bind(device)
        .execute(&w.pool)
        .await
        .unwrap();
    w.drain().await;
    let reason: String = sqlx::query_scalar(
        "select body->>'reason' from shepherd.events where event_type = 'assimilation_rejected'",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert!(reason.contains(&elsewhere.to_string()), "{reason}");
    assert_eq!(w.managed().await + w.in_flight().await, 0);
    assert_eq!(w.fake.calls(Operation::CreateDevice), 0);
}

#[sqlx::test(migrations = false)]
async fn assimilating_a_managed_device_is_a_recorded_no_op(pool: PgPool) {
    let w = World::with(pool, 3, config(1, 1)).await;
    w.reconcile().await;
    w.drain().await;
    let device: Uuid =
        sqlx::query_scalar::<_, String>("select provider_id from shepherd.managed_machines")
            .fetch_one(&w.pool)
            .await
            .unwrap()
            .parse()
            .unwrap();
    let mut tx = w.pool.begin().await.unwrap();
    let args = AssimilateArgs {
        device: device.to_string(),
        reservation: None,
        manual: true,
        created: None,
        attempt: 1,
    };
    queue::push_assimilate(&mut tx, &args, None).await.unwrap();
    tx.commit().await.unwrap();
    w.drain().await;
    assert_eq!(w.managed().await, 1);
    assert_eq!(w.events("assimilation_skipped").await, 1);
}

#[sqlx::test(migrations = false)]
async fn the_queue_refuses_poison_rows_from_sql(pool: PgPool) {
    common::migrated(&pool).await;
    for (id, body) in [
        ("not-a-ulid", r#"{"reservation": "x"}"#),
        ("01KBM3ZB8CVZ3R6Q0X2JZ5M0AA", "not json at all"),
        ("01KBM3ZB8CVZ3R6Q0X2JZ5M0AB", "[1, 2]"),
    ] {
        let err = sqlx::query(
            "insert into apalis.jobs (id, job_type, job) values ($1, 'create_device', convert_to($2, 'UTF8'))",
        )
        .bind(id)
        .bind(body)
        .execute(&pool)
        .await
        .unwrap_err();
        assert!(
            err.to_string().contains("enqueue with shepherd.enqueue_"),
            "{err}"
        );
    }
    let jobs: i64 = sqlx::query_scalar("select count(*) from apalis.jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(jobs, 0);
}

#[sqlx::test(migrations = false)]
async fn successor_keys_are_scoped_so_later_attempts_are_not_blocked(pool: PgPool) {
    common::migrated(&pool).await;
    let args = CreateDeviceArgs::admitted(Uuid::new_v4(), Uuid::new_v4());
    let mut tx = pool.begin().await.unwrap();
    assert!(
        queue::push_create_device(&mut tx, &args, None)
            .await
            .unwrap()
            .is_some()
    );
    // The same push again (a retried transaction) is a no-op, not an error.
    assert!(
        queue::push_create_device(&mut tx, &args, None)
            .await
            .unwrap()
            .is_none()
    );
    // The next attempt, and a new request for the same reservation, go through.
    let second = CreateDeviceArgs {
        attempt: 2,
        ..args.clone()
    };
    assert!(
        queue::push_create_device(&mut tx, &second, Some(std::time::Duration::ZERO))
            .await
            .unwrap()
            .is_some()
    );
    let again = CreateDeviceArgs {
        request: Uuid::new_v4(),
        ..args
    };
    assert!(
        queue::push_create_device(&mut tx, &again, None)
            .await
            .unwrap()
            .is_some()
    );
    tx.commit().await.unwrap();
}
