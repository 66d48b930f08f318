//! The live path's reads and deletes of the views: by key, never a scan of
//! a view, and several keys ended in one append as one key is.

use super::*;

/// An append reads the rows it changes by key, never by scanning a view,
/// however small the views are when the read is planned (a plan made on a
/// nearly empty table would otherwise scan it, and keep scanning it as the
/// fleet grows) and whether it is handed keys or none.
#[sqlx::test(migrations = false)]
async fn an_appends_read_of_its_views_never_scans_them(pool: PgPool) {
    common::migrated(&pool).await;
    // Rows written straight into the views: the read is what is measured.
    sqlx::raw_sql(
        "insert into shepherd.managed_machines
             (machine_id, provider, provider_id, reservation_id, hostname, assimilated_at)
         select gen_random_uuid(), 'metal', 'device-' || i, gen_random_uuid(), 'host-' || i, now()
         from generate_series(1, 20) i;
         insert into shepherd.pending_creations (reservation_id, request, enqueued_at)
         select reservation_id, 'request', now() from shepherd.managed_machines;
         insert into shepherd.unassimilated_devices (device_id, reservation_id, hostname, created_at)
         select provider_id, reservation_id, hostname, now() from shepherd.managed_machines;",
    )
    .execute(&pool)
    .await
    .unwrap();
    let (devices, reservations): (Vec<String>, Vec<Uuid>) = sqlx::query_as(
        "select coalesce(array_agg(provider_id), '{}'),
                coalesce(array_agg(reservation_id) filter (where reservation_id is not null), '{}')
         from shepherd.managed_machines",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(!devices.is_empty() && !reservations.is_empty());

    let mut tx = pool.begin().await.unwrap();
    let before = view_scans(&mut tx).await;
    let keyed = [
        (devices.clone(), reservations.clone()),
        (vec![], reservations.clone()),
        (devices.clone(), vec![]),
        (vec![], vec![]),
    ];
    // More than five runs of each, past where Postgres weighs a generic
    // plan against custom ones.
    for _ in 0..3 {
        for (d, r) in &keyed {
            let machines: serde_json::Value =
                sqlx::query_scalar("select machines from shepherd.view_rows($1, $2)")
                    .bind(d)
                    .bind(r)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
            let found = machines.as_array().unwrap().len();
            assert_eq!(
                found > 0,
                !d.is_empty() || !r.is_empty(),
                "machines read for {d:?} / {r:?}"
            );
        }
    }
    // Differences within the transaction: Postgres 15 keeps a backend's
    // counts of earlier transactions in these until it flushes them.
    let after = view_scans(&mut tx).await;
    let scans: Vec<(String, i64, i64)> = after
        .iter()
        .zip(&before)
        .map(|((t, seq, idx), (_, seq0, idx0))| (t.clone(), seq - seq0, idx - idx0))
        .collect();
    assert_eq!(scans.len(), 5, "{scans:?}");
    for (table, seq, idx) in &scans {
        assert_eq!(*seq, 0, "{table} was scanned whole: {scans:?}");
        assert!(*idx > 0, "{table} was never looked up by key: {scans:?}");
    }
}

/// The five views' scans so far, whole (`seq_scan`) and by index.
async fn view_scans(tx: &mut sqlx::PgConnection) -> Vec<(String, i64, i64)> {
    sqlx::query_as(
        "select relname::text, seq_scan, coalesce(idx_scan, 0)
         from pg_stat_xact_user_tables
         where schemaname = 'shepherd'
           and relname in ('managed_machines', 'sinbin', 'pending_creations',
                           'unassimilated_devices', 'pending_deletions')
         order by 1",
    )
    .fetch_all(tx)
    .await
    .unwrap()
}

/// An append that ends rows of a view for several keys at once removes
/// each of them, as one key at a time does (two ways to send the keys).
#[sqlx::test(migrations = false)]
async fn an_append_ends_several_rows_of_a_view_at_once(pool: PgPool) {
    common::migrated(&pool).await;
    let reservations: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
    let requested: Vec<NewEvent> = reservations
        .iter()
        .map(|r| {
            NewEvent::new(CreationRequested {
                reservation: *r,
                request: Uuid::new_v4(),
                manual: false,
                requested_by: None,
                sinbin_override: None,
                place: None,
            })
        })
        .collect();
    let pending = |pool: PgPool| async move {
        let keys: Vec<Uuid> = sqlx::query_scalar(
            "select reservation_id from shepherd.pending_creations order by reservation_id",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        keys
    };
    let mut sorted = reservations.clone();
    sorted.sort();
    for (step, events, left) in [
        ("three requested", requested, sorted.clone()),
        (
            "two created in one append",
            vec![
                device_created(reservations[0], "device-0"),
                device_created(reservations[1], "device-1"),
            ],
            vec![reservations[2]],
        ),
        (
            "the last one created",
            vec![device_created(reservations[2], "device-2")],
            vec![],
        ),
    ] {
        let mut tx = pool.begin().await.unwrap();
        record(&mut tx, events).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(pending(pool.clone()).await, left, "{step}");
    }
    common::assert_rebuild_equals_live(&pool).await;
}

/// An append that moves a machine from one view to another (a creation's
/// device made, a device assimilated) ends the row of the one and writes
/// the row of the other, one key each (the delete rides with the upsert's
/// statement); an append that only ends a row (a creation given up) ends
/// it alone.
#[sqlx::test(migrations = false)]
async fn an_append_moves_a_machine_between_views_and_ends_a_row_alone(pool: PgPool) {
    common::migrated(&pool).await;
    let (r0, r1) = (Uuid::new_v4(), Uuid::new_v4());
    let views = |pool: PgPool| async move {
        let read = |sql: &'static str| {
            let pool = pool.clone();
            async move {
                sqlx::query_scalar::<_, String>(sql)
                    .fetch_all(&pool)
                    .await
                    .expect("reading a view")
            }
        };
        (
            read("select reservation_id::text from shepherd.pending_creations order by 1").await,
            read("select device_id from shepherd.unassimilated_devices order by 1").await,
            read("select provider_id from shepherd.managed_machines order by 1").await,
        )
    };
    let requested = |reservation| {
        NewEvent::new(CreationRequested {
            reservation,
            request: Uuid::new_v4(),
            manual: false,
            requested_by: None,
            sinbin_override: None,
            place: None,
        })
    };
    let none: Vec<String> = vec![];
    for (step, events, pending, unassimilated, managed) in [
        (
            "two requested",
            vec![requested(r0), requested(r1)],
            {
                let mut both = vec![r0.to_string(), r1.to_string()];
                both.sort();
                both
            },
            none.clone(),
            none.clone(),
        ),
        (
            "one created",
            vec![device_created(r0, "device-0")],
            vec![r1.to_string()],
            vec!["device-0".to_string()],
            none.clone(),
        ),
        (
            "its device assimilated",
            vec![NewEvent::new(MachineAssimilated {
                machine_id: Uuid::new_v4(),
                provider: PROVIDER_METAL.into(),
                provider_id: "device-0".into(),
                reservation: Some(r0),
                hostname: Some("h".into()),
            })],
            vec![r1.to_string()],
            none.clone(),
            vec!["device-0".to_string()],
        ),
        (
            "the other given up",
            vec![NewEvent::new(CreationGivenUp {
                reservation: r1,
                class: ErrorClass::Permanent,
                message: "no".into(),
                request: None,
            })],
            none.clone(),
            none.clone(),
            vec!["device-0".to_string()],
        ),
    ] {
        let mut tx = pool.begin().await.unwrap();
        record(&mut tx, events).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(
            views(pool.clone()).await,
            (pending, unassimilated, managed),
            "{step}"
        );
    }
    common::assert_rebuild_equals_live(&pool).await;
}
