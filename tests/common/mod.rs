//! Shared set-up for integration tests: a fake Metal server on a random port
//! and a client pointed at it with test-sized timings.

#![allow(dead_code)]

pub mod latitude;
pub mod lifecycle;
pub mod openapi;
pub mod world;

use std::time::Duration;

use shepherd::metal::{ClientConfig, ClientMetrics, MetalClient, Operation, RetrySettings};
use shepherd::secret::ApiToken;
use shepherd_fakes::metal::{FakeConfig, FakeMetal, FaultKind, FaultRule, Faults};

pub const TOKEN: &str = "tok-0f1e2d3c-TEST-SECRET-9a8b7c";

/// Retries quick enough for tests, with the seed's shape.
pub fn fast_retry() -> RetrySettings {
    RetrySettings {
        initial_interval: Duration::from_millis(20),
        multiplier: 1.5,
        randomization_factor: 0.5,
        max_interval: Duration::from_millis(200),
        max_elapsed: Duration::from_secs(10),
    }
}

pub fn fake_config(reservations: usize) -> FakeConfig {
    FakeConfig {
        token: TOKEN.to_string(),
        reservations,
        ..FakeConfig::default()
    }
}

pub async fn start_fake(config: FakeConfig) -> FakeMetal {
    FakeMetal::start(config, "127.0.0.1:0".parse().unwrap())
        .await
        .expect("the fake Metal server starts")
}

pub fn client_config(fake: &FakeMetal, project: uuid::Uuid) -> ClientConfig {
    let mut config = ClientConfig::new(fake.base_url(), project, ApiToken::new(TOKEN));
    config.api_rate = shepherd::config::Rate::UNLIMITED;
    config.parallelism = 8;
    config.attempt_timeout = Duration::from_secs(5);
    config.retry = fast_retry();
    config
}

pub fn client_for(fake: &FakeMetal, project: uuid::Uuid) -> MetalClient {
    MetalClient::new(client_config(fake, project), ClientMetrics::default()).unwrap()
}

/// A fault that fires on the next `times` calls of `op`.
pub fn next(op: Operation, times: u64, kind: FaultKind) -> Faults {
    Faults {
        rules: vec![FaultRule {
            op: Some(op),
            probability: 1.0,
            remaining: Some(times),
            kind,
            ..FaultRule::default()
        }],
        ..Faults::default()
    }
}

/// Applies shepherd's schema to a fresh test database.
/// A pool of one connection to `pool`'s database, for jobs that must never
/// hold a connection while asking for another: such a job waits out the
/// 3 s acquire timeout and fails, where on a worker's small pool it would
/// wait beside another doing the same.
pub fn one_connection(pool: &sqlx::PgPool) -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(std::time::Duration::from_secs(3))
        .connect_lazy_with((*pool.connect_options()).clone())
}

pub async fn migrated(pool: &sqlx::PgPool) {
    shepherd::db::migrate(pool).await.expect("migrations apply");
}

/// Invariant 5: the views rebuilt from the log equal the live ones.
pub async fn assert_rebuild_equals_live(pool: &sqlx::PgPool) {
    let report = shepherd::events::views::rebuild(pool, false)
        .await
        .expect("the log replays");
    assert_eq!(report.differences, Vec::<String>::new());
}

/// The URL of the test's own database, for a client that logs in afresh
/// (as another role, or from psql).
#[allow(dead_code)]
pub async fn database_url(pool: &sqlx::PgPool) -> String {
    let name: String = sqlx::query_scalar("select current_database()")
        .fetch_one(pool)
        .await
        .expect("reading the test database's name");
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for tests");
    let (server, _) = base
        .rsplit_once('/')
        .expect("DATABASE_URL names a database");
    format!("{server}/{name}")
}
