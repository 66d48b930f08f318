//! A world of the fake Latitude and the jobs that provision it through
//! the seam, claimed from the real queue.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use shepherd::config::{ProvisionerConfig, Rate};
use shepherd::jobs::JobContext;
use shepherd::jobs::reconcile::{ReconcileOutcome, reconcile};
use shepherd::latitude::pools::{self, Pool};
use shepherd::latitude::provider::LatitudeProvider;
use shepherd::latitude::{LatitudeClient, LatitudeConfig};
use shepherd::metal::{LocalPacer, RetrySettings};
use shepherd::secret::ApiToken;
use shepherd_fakes::latitude::{FakeConfig, FakeLatitude};
use sqlx::PgPool;

use super::assert_rebuild_equals_live;
use super::world::{PUBLIC_KEY, drain_with, fast_config};

pub const KEY: &str = "latitude-provisioning-key";
pub const PREFIX: &str = "shepherd-";

pub struct World {
    pub pool: PgPool,
    /// Shared with a world on a restored copy of the database
    /// ([`World::restored`]): one provider, two logs.
    pub fake: Arc<FakeLatitude>,
    pub ctx: Arc<JobContext>,
    pub pools: Vec<Pool>,
}

/// The next create answered 504 by the gateway after the origin made the
/// server, which stays out of every read for `hidden_ms`: the answer lost
/// after the work was done.
pub fn create_lost_then_hidden(hidden_ms: u64) -> shepherd_fakes::latitude::Faults {
    use shepherd_fakes::latitude::{Call, FaultKind, FaultRule, Faults};
    Faults::none().with_rule(
        FaultRule::on(
            Call::CreateServer,
            FaultKind::GatewayTimeout {
                status: 504,
                hidden_ms,
            },
        )
        .times(1),
    )
}

pub fn pool(name: &str, site: &str, count: u32) -> Pool {
    format!("name={name},plan=c2-small-x86,site={site},count={count},os=ubuntu_24_04_x64_lts")
        .parse()
        .unwrap()
}

impl World {
    pub async fn new(db: PgPool, max_machines: u64, pools: Vec<Pool>) -> World {
        World::with_settle(db, max_machines, pools, Duration::ZERO).await
    }

    /// A world whose unknown creations wait `settle` before a look that
    /// finds nothing is trusted (the fake's weather can hide servers).
    pub async fn with_settle(
        db: PgPool,
        max_machines: u64,
        pools: Vec<Pool>,
        settle: Duration,
    ) -> World {
        World::with_config(db, max_machines, pools, settle, |_| {}).await
    }

    /// [`World::with_settle`], with the provisioner's settings adjusted.
    pub async fn with_config(
        db: PgPool,
        max_machines: u64,
        pools: Vec<Pool>,
        settle: Duration,
        adjust: impl FnOnce(&mut ProvisionerConfig),
    ) -> World {
        World::build(db, max_machines, pools, settle, adjust, None).await
    }

    /// A world on `db`, a database restored from a backup of this world's,
    /// against the same fake provider and with the same pools: what a
    /// cluster's workers meet after a restore or a failover. The restored
    /// settings and pools are the backup's, and are not set again.
    pub async fn restored(&self, db: PgPool, settle: Duration) -> World {
        let provider = Self::provider(&self.fake, &self.pools);
        let config = ProvisionerConfig {
            max_machines: self.ctx.config.max_machines,
            chunk_size: self.ctx.config.chunk_size,
            settle_window: settle,
            ..fast_config()
        };
        let ctx = Arc::new(JobContext::with_provider(
            db.clone(),
            Arc::new(provider),
            Arc::new(config),
            PUBLIC_KEY.into(),
        ));
        World {
            pool: db,
            fake: self.fake.clone(),
            ctx,
            pools: self.pools.clone(),
        }
    }

    fn provider(fake: &FakeLatitude, pools: &[Pool]) -> LatitudeProvider {
        let mut config = LatitudeConfig::new(fake.base_url(), fake.project(), ApiToken::new(KEY));
        config.attempt_timeout = Duration::from_secs(2);
        config.retry = RetrySettings {
            initial_interval: Duration::from_millis(10),
            max_interval: Duration::from_millis(100),
            max_elapsed: Duration::from_secs(5),
            ..RetrySettings::default()
        };
        // The key's budgets are another test's subject (tests/latitude_client.rs).
        let free = || Arc::new(LocalPacer::new(Rate::UNLIMITED));
        let client = LatitudeClient::with_pacers(config, free(), free()).unwrap();
        LatitudeProvider::new(client, pools.to_vec(), PREFIX.into()).unwrap()
    }

    /// A world whose jobs have one database connection between them
    /// ([`super::one_connection`]).
    pub async fn on_one_connection(db: PgPool, max_machines: u64, pools: Vec<Pool>) -> World {
        let one = super::one_connection(&db);
        World::build(db, max_machines, pools, Duration::ZERO, |_| {}, Some(one)).await
    }

    async fn build(
        db: PgPool,
        max_machines: u64,
        pools: Vec<Pool>,
        settle: Duration,
        adjust: impl FnOnce(&mut ProvisionerConfig),
        jobs_pool: Option<PgPool>,
    ) -> World {
        super::migrated(&db).await;
        let fake = FakeLatitude::start(
            FakeConfig {
                token: KEY.into(),
                reads_per_window: 100_000,
                writes_per_window: 100_000,
                ..FakeConfig::default()
            },
            "127.0.0.1:0".parse().unwrap(),
        )
        .await
        .unwrap();
        let provider = Self::provider(&fake, &pools);
        let mut config = ProvisionerConfig {
            max_machines,
            chunk_size: max_machines.max(1),
            settle_window: settle,
            ..fast_config()
        };
        adjust(&mut config);
        shepherd::cluster::establish(
            &db,
            &shepherd::cluster::ClusterSettings::proposed_by(&config),
            &[],
            "test",
        )
        .await
        .unwrap();
        // The pools are the cluster's, which every job reads.
        shepherd::pools::establish(&db, &pools, "test")
            .await
            .unwrap();
        let ctx = Arc::new(JobContext::with_provider(
            jobs_pool.unwrap_or_else(|| db.clone()),
            Arc::new(provider),
            Arc::new(config),
            PUBLIC_KEY.into(),
        ));
        World {
            pool: db,
            fake: Arc::new(fake),
            ctx,
            pools,
        }
    }

    /// A client of the fake for a test to act at the provider itself.
    pub fn client(&self) -> LatitudeClient {
        let config = LatitudeConfig::new(
            self.fake.base_url(),
            self.fake.project(),
            ApiToken::new(KEY),
        );
        LatitudeClient::new(config).unwrap()
    }

    pub async fn pass(&self) -> ReconcileOutcome {
        reconcile(&self.ctx, "test-reconcile").await.unwrap()
    }

    /// The pools as the last pass recorded them.
    pub async fn last_pools(&self) -> Vec<shepherd::provider::PoolReport> {
        use shepherd::events::event::Event;
        let (version, body): (i32, serde_json::Value) = sqlx::query_as(
            "select schema_version, body from shepherd.events
             where event_type = 'pools_surveyed' order by position desc limit 1",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap();
        match Event::decode("pools_surveyed", version, body).unwrap() {
            Event::PoolsSurveyed(e) => e.pools,
            other => panic!("not a survey: {other:?}"),
        }
    }

    /// The bodies of the events of one type, in order; a query error fails
    /// the test.
    pub async fn events(&self, kind: &str) -> Vec<serde_json::Value> {
        sqlx::query_scalar(
            "select body from shepherd.events where event_type = $1 order by position",
        )
        .bind(kind)
        .fetch_all(&self.pool)
        .await
        .unwrap_or_else(|e| panic!("events of {kind}: {e}"))
    }

    pub async fn count(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap()
    }

    pub async fn make_due(&self) {
        sqlx::query("update apalis.jobs set run_at = now() where status = 'Pending'")
            .execute(&self.pool)
            .await
            .unwrap();
    }

    /// Passes and jobs until nothing is in flight and a pass admits nothing.
    pub async fn settle(&self, rounds: usize) {
        for _ in 0..rounds {
            let pass = self.pass().await;
            drain_with(&self.pool, &self.ctx).await;
            self.make_due().await;
            drain_with(&self.pool, &self.ctx).await;
            let left = self
                .count(
                    "select (select count(*) from shepherd.in_flight)
                          + (select count(*) from apalis.jobs
                             where job_type <> 'reconcile' and status = 'Pending')",
                )
                .await;
            if pass.enqueued.is_empty() && pass.refused.is_none() && left == 0 {
                return;
            }
        }
        panic!("not settled after {rounds} rounds");
    }

    /// The invariants, against the fake's own servers: no pool over its
    /// count and no place twice, one server per witness, every server of
    /// ours managed and every managed machine a server, another party's
    /// servers never ours, the limit kept, and the views equal to the log.
    pub async fn assert_invariants(&self) {
        let servers = self.fake.servers();
        let mut per_pool: HashMap<String, u32> = HashMap::new();
        let mut places = HashSet::new();
        let mut hostnames = HashSet::new();
        let mut ours = HashSet::new();
        for s in &servers {
            assert!(
                hostnames.insert(s.hostname.clone()),
                "two servers named {}",
                s.hostname
            );
            if let Some(named) = pools::parse(PREFIX, &self.pools, &s.hostname) {
                assert!(!s.created_by_other);
                *per_pool.entry(named.pool.name.clone()).or_default() += 1;
                assert!(
                    named.index < named.pool.count,
                    "{} beyond its pool",
                    s.hostname
                );
                assert!(
                    places.insert((named.pool.name.clone(), named.index)),
                    "two servers on place {} of {}",
                    named.index,
                    named.pool.name
                );
                ours.insert(s.id.clone());
            }
        }
        for p in &self.pools {
            assert!(per_pool.get(&p.name).copied().unwrap_or(0) <= p.count);
        }
        let managed: HashSet<String> = sqlx::query_scalar(
            "select provider_id from shepherd.managed_machines where provider = 'latitude'",
        )
        .fetch_all(&self.pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
        assert_eq!(managed, ours, "managed machines and our servers differ");
        let max = self.count("select shepherd.max_machines()").await;
        assert!(managed.len() as i64 <= max);
        assert_rebuild_equals_live(&self.pool).await;
    }
}
