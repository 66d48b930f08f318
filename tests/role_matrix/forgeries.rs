//! What a session with the worker role's password could forge, and that
//! none of it deletes a machine.

use super::*;

/// What the worker's role can write (a row in the views, a job in the
/// queue) deletes nothing: an operator's deletion needs the operator's
/// event in the log, and protection is read from the log too.
#[sqlx::test(migrations = false)]
async fn a_deletion_forged_by_the_worker_role_deletes_nothing(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    apply_roles(&w.pool).await;
    let ids = server_ids(&w);
    let worker = login(&w.pool, "shepherd_worker").await;

    // A deletion "by an operator" written straight into the views and the
    // queue, without the log's event (which the worker may not record).
    let forged = &ids[0];
    sqlx::query(
        "with m as (select * from shepherd.managed_machines where provider_id = $1),
              r as (select gen_random_uuid() as request)
         insert into shepherd.pending_deletions (machine_id, provider_id, reservation_id, pool,
             request, cause, message, requested_by, requested_at)
         select m.machine_id, m.provider_id, m.reservation_id, null, r.request::text,
                'operator', 'forged', 'console:alice', now()
         from m, r",
    )
    .bind(forged)
    .execute(&worker)
    .await
    .expect("the worker's role writes the views");
    sqlx::query(
        "select shepherd.push_job('delete_machine', jsonb_build_object(
             'machine_id', d.machine_id, 'device', d.provider_id,
             'request', d.request::uuid, 'attempt', 1), now(), 25, d.request || '/1')
         from shepherd.pending_deletions d where d.provider_id = $1",
    )
    .bind(forged)
    .execute(&worker)
    .await
    .expect("the worker's role queues jobs");

    // A machine an operator protected, unprotected in the view only, then
    // deprovisioned by an operator who read the view.
    let protected = &ids[1];
    let operator = login(&w.pool, "shepherd_operator").await;
    sqlx::query("select shepherd.protect_machine($1, 'the database primary', null, true)")
        .bind(protected)
        .execute(&operator)
        .await
        .unwrap();
    sqlx::query("update shepherd.managed_machines set protected = false where provider_id = $1")
        .bind(protected)
        .execute(&worker)
        .await
        .expect("the worker's role writes the view");
    sqlx::query("select shepherd.deprovision_machine($1, 'the view said it was not protected')")
        .bind(protected)
        .execute(&operator)
        .await
        .unwrap();

    let ran = drain_rounds(&w, 3).await;
    let outcomes: Vec<String> = ran
        .iter()
        .filter_map(|r| match r {
            common::world::Ran::Delete(o) => Some(format!("{o:?}")),
            _ => None,
        })
        .collect();
    assert_eq!(outcomes.len(), 2, "{ran:?}");
    assert!(
        !outcomes.iter().any(|o| o.contains(&format!(
            "{:?}",
            DeleteOutcome::Deleted {
                already_gone: false
            }
        ))),
        "{outcomes:?}"
    );
    assert_eq!(w.fake.calls(Call::DestroyServer), 0);
    assert_eq!(server_ids(&w), ids);
    let cancelled: Vec<String> = sqlx::query_scalar(
        "select body->>'reason' from shepherd.events where event_type = 'deletion_cancelled'
         order by position",
    )
    .fetch_all(&w.pool)
    .await
    .unwrap();
    assert_eq!(cancelled.len(), 2, "{cancelled:?}");
    assert!(
        cancelled
            .iter()
            .any(|r| r.contains("no operator's request")),
        "{cancelled:?}"
    );
    assert!(
        cancelled.iter().any(|r| r.contains("protected")),
        "{cancelled:?}"
    );
    worker.close().await;
    operator.close().await;
}

/// A pending deletion and its job, written by the worker's role for the
/// machine behind `machine` (its device unless `device` names another),
/// cleared of the leave hook. Returns the request.
async fn forge(
    worker: &PgPool,
    machine: uuid::Uuid,
    device: &str,
    cause: &str,
    pool: Option<&str>,
    request: uuid::Uuid,
) {
    sqlx::query(
        "insert into shepherd.pending_deletions (machine_id, provider_id, reservation_id, pool,
             request, cause, message, requested_by, requested_at, cleared_at)
         select m.machine_id, m.provider_id, m.reservation_id, $2, $3::text, $4, 'forged',
                'shepherd', now(), now()
         from shepherd.managed_machines m where m.machine_id = $1",
    )
    .bind(machine)
    .bind(pool)
    .bind(request)
    .bind(cause)
    .execute(worker)
    .await
    .expect("the worker's role writes the views");
    sqlx::query(
        "select shepherd.push_job('delete_machine', jsonb_build_object(
             'machine_id', $1::uuid, 'device', $2::text, 'request', $3::uuid, 'attempt', 1),
             now(), 25, $3::text || '/forged')",
    )
    .bind(machine)
    .bind(device)
    .bind(request)
    .execute(worker)
    .await
    .expect("the worker's role queues jobs");
}

/// The forgeries a review found, each refused: a deletion row for a made-up
/// machine whose job names a real, protected device; a surplus that names
/// no pool, or a pool the cluster never had; an operator's request that
/// had already ended, replayed.
#[sqlx::test(migrations = false)]
async fn forgeries_naming_another_device_no_pool_or_an_ended_request_delete_nothing(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 3)]).await;
    w.settle(3).await;
    apply_roles(&w.pool).await;
    let ids = server_ids(&w);
    assert_eq!(ids.len(), 3);
    let worker = login(&w.pool, "shepherd_worker").await;
    let operator = login(&w.pool, "shepherd_operator").await;
    let machine_of = |device: String| {
        let pool = w.pool.clone();
        async move {
            sqlx::query_scalar::<_, uuid::Uuid>(
                "select machine_id from shepherd.managed_machines where provider_id = $1",
            )
            .bind(device)
            .fetch_one(&pool)
            .await
            .expect("a managed machine")
        }
    };

    // 1. A made-up machine, its job aimed at a real protected server.
    sqlx::query("select shepherd.protect_machine($1, 'keep it', null, true)")
        .bind(&ids[0])
        .execute(&operator)
        .await
        .unwrap();
    let fake = uuid::Uuid::new_v4();
    sqlx::query(
        "insert into shepherd.managed_machines (machine_id, provider, provider_id, reservation_id,
             hostname, assimilated_at, protected)
         values ($1, 'latitude', 'sv_madeup', null, null, now(), false)",
    )
    .bind(fake)
    .execute(&worker)
    .await
    .expect("the worker's role writes the view");
    forge(
        &worker,
        fake,
        &ids[0],
        "surplus",
        Some("web"),
        uuid::Uuid::new_v4(),
    )
    .await;
    // 2. Surpluses of no pool, and of a pool that never was.
    forge(
        &worker,
        machine_of(ids[1].clone()).await,
        &ids[1],
        "surplus",
        None,
        uuid::Uuid::new_v4(),
    )
    .await;
    let ran = drain_rounds(&w, 2).await;
    sqlx::query("delete from shepherd.pending_deletions")
        .execute(&w.pool)
        .await
        .unwrap();
    forge(
        &worker,
        machine_of(ids[1].clone()).await,
        &ids[1],
        "pool_removed",
        Some("never-was"),
        uuid::Uuid::new_v4(),
    )
    .await;
    // 3. An operator's deprovision of the third, ended (cancelled) before
    // its delete, then replayed with the same request.
    sqlx::query("select shepherd.deprovision_machine($1, 'retire it')")
        .bind(&ids[2])
        .execute(&operator)
        .await
        .unwrap();
    let (request, job): (String, String) = sqlx::query_as(
        "select d.request, j.id from shepherd.pending_deletions d
         join apalis.jobs j on j.job_type = 'delete_machine'
              and convert_from(j.job, 'UTF8')::jsonb->>'request' = d.request
         where d.provider_id = $1",
    )
    .bind(&ids[2])
    .fetch_one(&w.pool)
    .await
    .unwrap();
    shepherd::jobs::manage::cancel(&operator, &job, "cli:test", "changed my mind")
        .await
        .expect("the operator cancels the deletion");
    forge(
        &worker,
        machine_of(ids[2].clone()).await,
        &ids[2],
        "operator",
        None,
        request.parse().unwrap(),
    )
    .await;
    let more = drain_rounds(&w, 3).await;

    assert_eq!(w.fake.calls(Call::DestroyServer), 0, "{ran:?} {more:?}");
    assert_eq!(server_ids(&w), ids);
    let reasons: Vec<String> = sqlx::query_scalar(
        "select body->>'reason' from shepherd.events where event_type = 'deletion_cancelled'
         order by position",
    )
    .fetch_all(&w.pool)
    .await
    .unwrap();
    for says in ["names no pool", "has no pool", "no operator's request"] {
        assert!(
            reasons.iter().any(|r| r.contains(says)),
            "{says}: {reasons:?}"
        );
    }
    // The made-up machine's job found no deletion of its device to run.
    assert!(
        ran.iter()
            .any(|r| format!("{r:?}").contains("no deletion of this request")),
        "{ran:?}"
    );
    worker.close().await;
    operator.close().await;
}

/// A pass's cause the worker's role may record, `unplaced`, forged for a
/// machine that stands on a place of its pool: the deletion's last look
/// finds it on its place, and nothing is deleted.
#[sqlx::test(migrations = false)]
async fn an_unplaced_deletion_forged_for_a_placed_machine_deletes_nothing(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 2)]).await;
    w.settle(3).await;
    apply_roles(&w.pool).await;
    let ids = server_ids(&w);
    let worker = login(&w.pool, "shepherd_worker").await;
    let machine: uuid::Uuid = sqlx::query_scalar(
        "select machine_id from shepherd.managed_machines where provider_id = $1",
    )
    .bind(&ids[0])
    .fetch_one(&w.pool)
    .await
    .expect("a managed machine");
    forge(
        &worker,
        machine,
        &ids[0],
        "unplaced",
        None,
        uuid::Uuid::new_v4(),
    )
    .await;
    let ran = drain_rounds(&w, 2).await;
    assert_eq!(w.fake.calls(Call::DestroyServer), 0, "{ran:?}");
    assert_eq!(server_ids(&w), ids);
    let reason = cancelled_reason(&ran);
    assert!(
        reason.contains("stands on place") && reason.contains("of pool web"),
        "{reason}"
    );
}
