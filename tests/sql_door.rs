//! The SQL door against a role that can create objects on the caller's
//! path: a `public.hashtextextended(text, integer)` would win over the
//! built-in `(text, bigint)` for an integer argument, and run its body as
//! whoever called. Every function of shepherd's pins its search_path, the
//! jobs name `pg_catalog` for the locks they take, and nobody runs
//! shepherd's functions unless granted.

mod common;

use common::latitude::{World, pool};
use sqlx::PgPool;

#[sqlx::test(migrations = false)]
async fn a_function_planted_on_the_path_is_never_called(db: PgPool) {
    let w = World::new(db, 10, vec![pool("web", "DAL", 1)]).await;
    // Planted where every session's default path looks: it records that
    // it ran, which is all an attacker needs.
    for statement in [
        "create table public.hijacked (at timestamptz)",
        "create function public.hashtextextended(text, integer) returns bigint
         language sql as $$ insert into public.hijacked values (now()) returning 7 $$",
    ] {
        sqlx::query(statement)
            .execute(&w.pool)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    // The functions an operator calls, and a whole pass of the jobs.
    for statement in [
        "select shepherd.pause_creations('the test', 'test')",
        "select shepherd.resume_creations('the test', 'test')",
        "select shepherd.set_pool('web', 'c2-small-x86', 'DAL', 2, 'ubuntu_24_04_x64_lts',
                                  '{}', 'the test raises it', 'test', false)",
        "select shepherd.change_setting('chunk_size', '5', 'the test', 'test')",
    ] {
        sqlx::query(statement)
            .execute(&w.pool)
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    w.settle(3).await;
    assert_eq!(w.fake.servers().len(), 2);
    let ran: i64 = sqlx::query_scalar("select count(*) from public.hijacked")
        .fetch_one(&w.pool)
        .await
        .unwrap();
    assert_eq!(ran, 0, "a function planted on the path ran");
}

#[sqlx::test(migrations = false)]
async fn every_function_pins_its_path_and_none_is_public(db: PgPool) {
    common::migrated(&db).await;
    let unpinned: Vec<String> = sqlx::query_scalar(
        "select p.oid::regprocedure::text from pg_proc p
         join pg_namespace n on n.oid = p.pronamespace
         where n.nspname = 'shepherd'
           and not coalesce(p.proconfig @> array['search_path=pg_catalog, shepherd, pg_temp'], false)
         order by 1",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    assert!(
        unpinned.is_empty(),
        "functions without a pinned search_path: {unpinned:?}"
    );
    let public: Vec<String> = sqlx::query_scalar(
        "select p.oid::regprocedure::text from pg_proc p
         join pg_namespace n on n.oid = p.pronamespace
         where n.nspname = 'shepherd' and has_function_privilege('public', p.oid, 'execute')
         order by 1",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    assert!(public.is_empty(), "functions anyone may run: {public:?}");
    // Inside a function that runs as its owner, current_user is the owner:
    // who called is session_user.
    let owners_name: Vec<String> = sqlx::query_scalar(
        "select p.oid::regprocedure::text from pg_proc p
         join pg_namespace n on n.oid = p.pronamespace
         where n.nspname = 'shepherd' and p.prosecdef and p.prosrc ilike '%current_user%'
         order by 1",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    assert!(
        owners_name.is_empty(),
        "functions that run as their owner and record current_user: {owners_name:?}"
    );
    let definers: i64 = sqlx::query_scalar(
        "select count(*) from pg_proc p join pg_namespace n on n.oid = p.pronamespace
         where n.nspname = 'shepherd' and p.prosecdef",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert!(
        definers >= 18,
        "{definers} operator functions run as their owner"
    );
}

/// Free text has a limit at both doors, bodies without a `by` included: a
/// penalty override's reason and who asked for a job are refused with a
/// message when they are enqueued or recorded, never stored at any length.
#[sqlx::test(migrations = false)]
async fn every_free_text_is_bounded_at_the_queue_and_the_log(db: PgPool) {
    common::migrated(&db).await;
    for (statement, says) in [
        (
            "select shepherd.push_job('reconcile', jsonb_build_object('requested_by', repeat('x', 201)))",
            "who asked is at most 200 characters (this has 201)",
        ),
        (
            "select shepherd.push_job('create_device', jsonb_build_object(
                 'reservation', gen_random_uuid(), 'sinbin_override', repeat('x', 1001)))",
            "at most 1000 characters (this one has 1001)",
        ),
        (
            "select shepherd.append_event('operator/jobs', 'creation_requested',
                 jsonb_build_object('reservation', gen_random_uuid(), 'request', gen_random_uuid(),
                   'manual', true, 'sinbin_override', repeat('x', 1001)))",
            "at most 1000 characters (this one has 1001)",
        ),
        (
            "select shepherd.append_event('operator/reconcile', 'reconcile_started',
                 jsonb_build_object('run', gen_random_uuid(), 'max_machines', 1, 'chunk_size', 1,
                   'requested_by', repeat('x', 201)))",
            "who asked is at most 200 characters (this has 201)",
        ),
    ] {
        let refused = sqlx::query(statement).execute(&db).await.unwrap_err();
        let sqlx::Error::Database(e) = &refused else {
            panic!("{statement}: {refused}");
        };
        assert_eq!(e.code().as_deref(), Some("22023"), "{statement}: {refused}");
        assert!(e.message().contains(says), "{statement}: {refused}");
    }
    // At the limit, both go in.
    sqlx::query(
        "select shepherd.push_job('reconcile', jsonb_build_object('requested_by', repeat('x', 200)))",
    )
    .execute(&db)
    .await
    .unwrap();
}
