//! The operator's commands on known states: status, plan (which changes
//! nothing), history, pause and resume, and clearing the sinbin, through the
//! real binary and through the SQL functions.

use std::process::Command;

use shepherd_fakes::metal::{FakeConfig, FakeMetal};
use sqlx::PgPool;

const TOKEN: &str = "operate-test-token";

async fn url_of(pool: &PgPool) -> String {
    let name: String = sqlx::query_scalar("select current_database()")
        .fetch_one(pool)
        .await
        .unwrap();
    let base = std::env::var("DATABASE_URL").unwrap();
    format!("{}/{name}", base.rsplit_once('/').unwrap().0)
}

struct World {
    pool: PgPool,
    url: String,
    fake: FakeMetal,
}

impl World {
    async fn new(pool: PgPool) -> World {
        shepherd::db::migrate(&pool).await.unwrap();
        let fake = FakeMetal::start(
            FakeConfig {
                token: TOKEN.into(),
                reservations: 12,
                not_provisionable_every: 4,
                ..FakeConfig::default()
            },
            "127.0.0.1:0".parse().unwrap(),
        )
        .await
        .unwrap();
        World {
            url: url_of(&pool).await,
            pool,
            fake,
        }
    }

    /// `shepherd ARGS` against this world's database and fake.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_shepherd"));
        cmd.args(args)
            .env("DATABASE_URL", &self.url)
            .env("METAL_API_URL", self.fake.base_url())
            .env("METAL_PROJECT_ID", self.fake.project_id().to_string())
            .env("METAL_AUTH_TOKEN", TOKEN)
            .env("SHEPHERD_LOG", "warn")
            .env("SHEPHERD_API_RATE", "0s");
        cmd
    }

    /// Runs the binary off the test's thread: the fake it talks to is served
    /// by this thread's runtime.
    async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let mut cmd = self.command(args);
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Runs the binary with its stdout a pipe whose reader is gone before
    /// the command prints; returns whether it exited 0, and its stderr.
    async fn run_into_closed_pipe(&self, args: &[&str], poke: Option<&str>) -> (bool, String) {
        let mut cmd = self.command(args);
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        drop(child.stdout.take());
        if let Some(sql) = poke {
            // Something for a follower to print, once it is listening.
            tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
            sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
                .execute(&self.pool)
                .await
                .unwrap();
        }
        let out = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    async fn counts(&self) -> (i64, i64) {
        sqlx::query_as(
            "select (select count(*) from shepherd.events), (select count(*) from apalis.jobs)",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }
}

#[sqlx::test(migrations = false)]
async fn plan_picks_what_a_pass_would_and_changes_nothing(pool: PgPool) {
    let w = World::new(pool).await;
    let before = w.counts().await;
    let calls_before = w.fake.total_calls();
    let (ok, out, err) = w
        .run(&["plan", "--json", "--max-machines", "5", "--chunk-size", "4"])
        .await;
    assert!(ok, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(plan["reservations_listed"], 12);
    assert_eq!(plan["would_create"].as_array().unwrap().len(), 4, "{plan}");
    let skipped = plan["skipped"].as_array().unwrap();
    let why = |w: &str| skipped.iter().filter(|s| s[1] == w).count();
    assert_eq!(why("not_provisionable"), 3);
    // The chunk size binds before the limit (room 5).
    assert_eq!(why("beyond_chunk"), 12 - 3 - 4);
    assert_eq!(w.counts().await, before, "plan wrote something");
    assert_eq!(w.fake.calls(shepherd::metal::Operation::CreateDevice), 0);
    assert!(w.fake.total_calls() > calls_before);
    let (ok, out, _) = w
        .run(&["plan", "--max-machines", "5", "--chunk-size", "4"])
        .await;
    assert!(ok);
    assert!(out.contains("would create 4 devices"), "{out}");
    assert!(out.contains("not provisionable"), "{out}");
}

#[sqlx::test(migrations = false)]
async fn status_history_pause_resume_and_clear_on_a_known_state(pool: PgPool) {
    let w = World::new(pool).await;
    shepherd::cluster::establish(
        &w.pool,
        &shepherd::cluster::ClusterSettings {
            max_machines: shepherd::cluster::MachineLimit(7),
            ..shepherd::cluster::ClusterSettings::proposed_by(&Default::default())
        },
        &[],
        "test",
    )
    .await
    .unwrap();
    let r = w.fake.reservations()[0].id;
    let mut tx = w.pool.begin().await.unwrap();
    use shepherd::events::event::*;
    shepherd::events::record(
        &mut tx,
        vec![shepherd::events::NewEvent::new(ReservationPenalised {
            reservation: r,
            until: chrono::Utc::now() + chrono::TimeDelta::hours(1),
            cause: "createDevice: rejected as invalid (422): bad plan".into(),
            class: None,
            scope: None,
        })],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let (ok, out, err) = w.run(&["status"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("managed      0 / 7"), "{out}");
    assert!(
        out.contains("bad plan") && out.contains(&r.to_string()),
        "{out}"
    );
    let (ok, out, _) = w.run(&["status", "--json"]).await;
    assert!(ok);
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(status["max_machines"], 7);
    assert_eq!(status["penalised"][0]["reservation_id"], r.to_string());

    let (ok, out, _) = w.run(&["history", "reservation", &r.to_string()]).await;
    assert!(ok);
    assert!(out.contains("reservation_penalised"), "{out}");
    let (ok, _, err) = w
        .run(&["history", "device", &uuid::Uuid::new_v4().to_string()])
        .await;
    assert!(!ok && err.contains("no events"), "{err}");

    // Pause: a pass reports but enqueues nothing; resume: it enqueues again.
    let (ok, _, err) = w.run(&["pause", "--reason", "window"]).await;
    assert!(ok, "{err}");
    let (_, out, _) = w.run(&["status"]).await;
    assert!(out.contains("PAUSED") && out.contains("window"), "{out}");
    let (ok, out, _) = w.run(&["plan", "--json"]).await;
    assert!(ok);
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        plan["would_create"].as_array().unwrap().is_empty(),
        "{plan}"
    );
    assert_eq!(plan["paused"]["reason"], "window");
    let (ok, _, _) = w.run(&["resume"]).await;
    assert!(ok);
    let (_, out, _) = w.run(&["plan", "--json"]).await;
    let plan: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(!plan["would_create"].as_array().unwrap().is_empty());

    // Clearing the sinbin, from the CLI and from SQL, recorded with who and why.
    let (ok, out, err) = w
        .run(&["sinbin", "clear", &r.to_string(), "--reason", "plan fixed"])
        .await;
    assert!(ok, "{err}");
    assert!(out.contains("lifted"));
    let (ok, _, err) = w.run(&["sinbin", "clear", &r.to_string()]).await;
    assert!(!ok && err.contains("not in the sinbin"), "{err}");
    let body: serde_json::Value =
        sqlx::query_scalar("select body from shepherd.events where event_type = 'penalty_cleared'")
            .fetch_one(&w.pool)
            .await
            .unwrap();
    assert_eq!(body["reason"], "plan fixed");
    assert!(body["by"].as_str().unwrap().starts_with("cli:"));
    sqlx::query("select shepherd.pause_creations('from sql')")
        .execute(&w.pool)
        .await
        .unwrap();
    sqlx::query("select shepherd.resume_creations()")
        .execute(&w.pool)
        .await
        .unwrap();
    // The SQL controls and the Rust apply() agree.
    let report = shepherd::events::views::rebuild(&w.pool, false)
        .await
        .unwrap();
    assert!(report.differences.is_empty(), "{:?}", report.differences);
}

#[sqlx::test(migrations = false)]
async fn commands_end_quietly_when_their_reader_goes_away(pool: PgPool) {
    let w = World::new(pool).await;
    // Something to print for each command.
    sqlx::query("select shepherd.pause_creations('to have events')")
        .execute(&w.pool)
        .await
        .unwrap();
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["machines"],
        &["sinbin", "--all"],
        &["plan"],
        &["events"],
        &["settings", "show"],
    ] {
        let (ok, err) = w.run_into_closed_pipe(args, None).await;
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(ok || err.contains("no settings yet"), "{args:?}: {err}");
    }
    let (ok, err) = w
        .run_into_closed_pipe(
            &["events", "--follow"],
            Some("select shepherd.resume_creations('poke the follower')"),
        )
        .await;
    assert!(ok && !err.contains("panicked"), "{err}");
}

#[sqlx::test(migrations = false)]
async fn messages_name_the_cause_and_the_next_command(pool: PgPool) {
    let w = World::new(pool).await;
    // The server answers but the database is not there: the fix is migrate.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shepherd"));
    // (Test databases' names are already 63 characters, the most Postgres
    // keeps: a suffix would be cut off and name the test's own database.)
    let missing = format!("{}/no_such_shepherd_db", w.url.rsplit_once('/').unwrap().0);
    cmd.args(["status"]).env("DATABASE_URL", &missing);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "{missing}: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(err.contains("shepherd migrate"), "{err}");
    assert!(!err.contains("docker compose"), "{err}");
    // A pause needs a reason; a second pause and a second resume record nothing.
    let (ok, _, err) = w.run(&["pause"]).await;
    assert!(!ok && err.contains("--reason"), "{err}");
    let (ok, out, _) = w.run(&["pause", "--reason", "window"]).await;
    assert!(ok && out.contains("paused cluster-wide"), "{out}");
    let (ok, out, _) = w.run(&["pause", "--reason", "again"]).await;
    assert!(ok && out.contains("already paused by cli:"), "{out}");
    let (ok, _, _) = w.run(&["resume"]).await;
    assert!(ok);
    let (ok, out, _) = w.run(&["resume"]).await;
    assert!(ok && out.contains("were not paused"), "{out}");
    let count = |t: &'static str| {
        let pool = w.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "select count(*) from shepherd.events where event_type = $1",
            )
            .bind(t)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(count("creations_paused").await, 1);
    assert_eq!(count("creations_resumed").await, 1);
}

/// `shepherd job retry|cancel`: the same judgement as the console's
/// buttons, with who (`cli:<user>`) and why; a refusal or an unknown id
/// exits non-zero and says why.
#[sqlx::test(migrations = false)]
async fn jobs_are_retried_and_cancelled_from_the_command_line(pool: PgPool) {
    let w = World::new(pool).await;
    let job: String = sqlx::query_scalar("select shepherd.enqueue_reconcile()")
        .fetch_one(&w.pool)
        .await
        .unwrap();

    let (ok, _, err) = w.run(&["job", "retry", &job, "--reason", "now"]).await;
    assert!(!ok);
    assert!(err.contains("only a failed or killed job"), "{err}");
    let (ok, _, err) = w
        .run(&[
            "job",
            "cancel",
            "01JA0000000000000000000000",
            "--reason",
            "x",
        ])
        .await;
    assert!(!ok);
    assert!(err.contains("no shepherd job"), "{err}");
    let (ok, _, err) = w.run(&["job", "cancel", &job, "--reason", " "]).await;
    assert!(!ok);
    assert!(err.contains("--reason"), "{err}");

    let mut cancel = w.command(&["job", "cancel", &job, "--reason", "not now"]);
    cancel.env("USER", "carol");
    let out = tokio::task::spawn_blocking(move || cancel.output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("cancelled"));
    let (status, by): (String, String) = sqlx::query_as(
        "select j.status, e.body->>'by' from apalis.jobs j
         join shepherd.events e on e.event_type = 'job_cancelled' and e.body->>'job' = j.id
         where j.id = $1",
    )
    .bind(&job)
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert_eq!((status.as_str(), by.as_str()), ("Killed", "cli:carol"));
    let (ok, out, err) = w
        .run(&["job", "retry", &job, "--reason", "after all"])
        .await;
    assert!(ok, "{err}");
    assert!(out.contains("will run again"), "{out}");
}

/// `migrate` says what it did: the migrations it applied to a fresh
/// database, then that it is up to date. A command run where neither
/// `$USER` nor `$LOGNAME` is set (cron, a bare container) records the uid,
/// never `cli:unknown`.
#[sqlx::test(migrations = false)]
async fn migrate_says_what_it_applied_and_a_nameless_user_is_their_uid(pool: PgPool) {
    let url = url_of(&pool).await;
    let run = |args: &'static [&'static str], url: String| {
        let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args(args)
            .env("DATABASE_URL", url)
            .env_remove("USER")
            .env_remove("LOGNAME")
            .env("SHEPHERD_LOG", "warn")
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let first = run(&["migrate"], url.clone());
    assert!(
        first.contains("applied") && !first.contains("up to date"),
        "{first}"
    );
    let again = run(&["migrate"], url.clone());
    assert!(again.contains("is up to date"), "{again}");
    // A pause needs the cluster's settings: a worker's first start records them.
    shepherd::cluster::establish(
        &pool,
        &shepherd::cluster::ClusterSettings::proposed_by(&Default::default()),
        &[],
        "test",
    )
    .await
    .unwrap();
    run(&["pause", "--reason", "the nightly job"], url);
    let by: String = sqlx::query_scalar(
        "select body->>'by' from shepherd.events where event_type = 'creations_paused'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(by.starts_with("cli:uid-"), "{by}");
}

/// A role that may not change the schema, migrating, is told who may and
/// how to start without migrating; the demo, which has a database of its
/// own, names its own flag when it cannot reach Postgres.
#[sqlx::test(migrations = false)]
async fn refusals_name_the_next_step(pool: PgPool) {
    let url = url_of(&pool).await;
    sqlx::query(
        "do $$ begin
             create role shepherd_hint_test login;
         exception when duplicate_object or unique_violation then null;
         end $$",
    )
    .execute(&pool)
    .await
    .unwrap();
    let as_role = url.replacen("://postgres@", "://shepherd_hint_test@", 1);
    assert_ne!(as_role, url);
    let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("migrate")
        .env("DATABASE_URL", &as_role)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("permission denied"), "{stderr}");
    assert!(stderr.contains("--skip-migrations"), "{stderr}");
    assert!(stderr.contains("as the database's owner"), "{stderr}");

    let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args([
            "demo",
            "--database-url",
            "postgres://postgres@127.0.0.1:1/nowhere",
        ])
        .env("DATABASE_URL", &url)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("SHEPHERD_DEMO_DATABASE_URL"), "{stderr}");
    assert!(stderr.contains("does not read DATABASE_URL"), "{stderr}");
}

/// A Metal cluster has no pools: `pools set` on one is refused with why,
/// nothing is recorded, and `pools list` says why it lists none.
#[sqlx::test(migrations = false)]
async fn pools_on_a_metal_cluster_are_refused(pool: PgPool) {
    let w = World::new(pool).await;
    shepherd::cluster::establish_identity(
        &w.pool,
        &shepherd::cluster::Identity {
            provider: "metal".into(),
            project: w.fake.project_id().to_string(),
            device_prefix: "shepherd-".into(),
        },
        "test",
    )
    .await
    .unwrap();
    let (ok, _, stderr) = w
        .run(&[
            "pools",
            "set",
            "web",
            "plan=c2-small-x86,site=DAL,count=2,os=ubuntu_24_04_x64_lts",
            "--reason",
            "try",
        ])
        .await;
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("which have no pools"), "{stderr}");
    let pools: i64 = sqlx::query_scalar("select count(*) from shepherd.pools")
        .fetch_one(&w.pool)
        .await
        .unwrap();
    assert_eq!(pools, 0);
    // Nor does listing them suggest declaring one.
    let (ok, out, stderr) = w.run(&["pools", "list"]).await;
    assert!(ok, "{stderr}");
    assert!(
        out.contains("Equinix Metal hardware reservations, which have none"),
        "{out}"
    );
    assert!(!out.contains("declare one"), "{out}");
}

/// `status` lists the jobs that ended failed or killed with the ids
/// `shepherd job retry` takes, and the retry works with one of them.
#[sqlx::test(migrations = false)]
async fn status_prints_the_ids_job_retry_takes(pool: PgPool) {
    let w = World::new(pool).await;
    let id: String = sqlx::query_scalar(
        "select shepherd.push_job('assimilate', jsonb_build_object('device', gen_random_uuid(), 'manual', true))",
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    sqlx::query(
        "update apalis.jobs set status = 'Killed', done_at = now(),
                last_result = '{\"Err\": \"cancelled by test: the disk died\"}'
         where id = $1",
    )
    .bind(&id)
    .execute(&w.pool)
    .await
    .unwrap();
    let (ok, out, err) = w.run(&["status"]).await;
    assert!(ok, "{err}");
    let listed = &out[out.find("jobs that ended failed or killed").expect(&out)..];
    assert!(listed.contains(&id), "{listed}");
    assert!(listed.contains("shepherd job retry ID"), "{listed}");
    assert!(listed.contains("the disk died"), "{listed}");
    let (ok, _, err) = w
        .run(&["job", "retry", &id, "--reason", "a new disk"])
        .await;
    assert!(ok, "{err}");
}

/// A place's penalty is lifted by the place's name (`web/3`), as
/// `enqueue` and `history` take it; and a creation that ended is not
/// "retried" as a job: the refusal names the remedies that would put a
/// machine there.
#[sqlx::test(migrations = false)]
async fn places_are_cleared_by_name_and_an_ended_creation_names_its_remedies(pool: PgPool) {
    let w = World::new(pool).await;
    shepherd::cluster::establish_identity(
        &w.pool,
        &shepherd::cluster::Identity {
            provider: "latitude".into(),
            project: "proj_clear".into(),
            device_prefix: "shepherd-".into(),
        },
        "test",
    )
    .await
    .unwrap();
    let unit = shepherd::latitude::provider::unit_id("proj_clear", "web", 3);
    let mut tx = w.pool.begin().await.unwrap();
    shepherd::events::record(
        &mut tx,
        vec![shepherd::events::NewEvent::new(
            shepherd::events::event::ReservationPenalised {
                reservation: unit,
                until: chrono::Utc::now() + chrono::TimeDelta::hours(1),
                cause: "out of stock".into(),
                class: None,
                scope: None,
            },
        )],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let (ok, out, err) = w
        .run(&["sinbin", "clear", "web/3", "--reason", "stock is back"])
        .await;
    assert!(ok, "{err}");
    assert!(out.contains("penalty of web/3 lifted"), "{out}");
    let left: i64 = sqlx::query_scalar("select count(*) from shepherd.sinbin")
        .fetch_one(&w.pool)
        .await
        .unwrap();
    assert_eq!(left, 0);

    let id: String = sqlx::query_scalar(
        "select shepherd.push_job('create_device', jsonb_build_object(
             'reservation', $1::uuid, 'request', gen_random_uuid(), 'attempt', 1))",
    )
    .bind(unit)
    .fetch_one(&w.pool)
    .await
    .unwrap();
    sqlx::query(
        "update apalis.jobs set status = 'Done', done_at = now(),
                last_result = '{\"Ok\": \"GivenUp { class: Permanent, reason: \\\"no stock\\\" }\"}'
         where id = $1",
    )
    .bind(&id)
    .execute(&w.pool)
    .await
    .unwrap();
    let (ok, _, err) = w.run(&["job", "retry", &id, "--reason", "try again"]).await;
    assert!(!ok);
    assert!(err.contains("sinbin clear"), "{err}");
    assert!(err.contains("enqueue create-device"), "{err}");
    assert!(!err.contains("only a failed or killed job"), "{err}");
}
