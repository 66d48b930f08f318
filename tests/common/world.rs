//! A provisioning world for handler-level tests: real Postgres, the fake
//! Metal server over HTTP, the job handlers, and a test driver that claims
//! jobs from the real queue table and runs them one by one.

use std::sync::Arc;
use std::time::Duration;

use shepherd::config::{JobRetry, ProvisionerConfig, Rate};
use shepherd::jobs::assimilate::{AssimilateOutcome, assimilate};
use shepherd::jobs::create_device::{CreateOutcome, create_device};
use shepherd::jobs::delete_machine::{DeleteOutcome, delete_machine};
use shepherd::jobs::reconcile::{ReconcileOutcome, reconcile};
use shepherd::jobs::{AssimilateArgs, CreateDeviceArgs, DeleteMachineArgs, JobContext};
use shepherd_fakes::metal::{FakeConfig, FakeMetal};
use sqlx::PgPool;

use super::{client_for, fake_config, migrated, start_fake};

pub const PUBLIC_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGV4YW1wbGUta2V5LWZvci10ZXN0cw shepherd-test";

pub fn fast_config() -> ProvisionerConfig {
    let quick = JobRetry {
        max_attempts: 3,
        initial_backoff: Duration::from_secs(0),
        factor: 1.0,
        max_backoff: Duration::from_secs(0),
        timeout: Duration::from_secs(30),
    };
    ProvisionerConfig {
        device_creation_rate: Rate::UNLIMITED,
        api_rate: shepherd::config::Rate::UNLIMITED,
        create_retry: quick,
        assimilate_retry: quick,
        // The fakes show a machine the moment it is made, unless a test
        // asks them to lag (and sets a window of its own).
        settle_window: Duration::ZERO,
        ..ProvisionerConfig::default()
    }
}

/// What running one job did.
#[derive(Debug)]
pub enum Ran {
    Create(CreateOutcome),
    Assimilate(AssimilateOutcome),
    Delete(DeleteOutcome),
}

pub struct World {
    pub pool: PgPool,
    pub fake: FakeMetal,
    pub ctx: Arc<JobContext>,
    /// The jobs' client, for a test to act at the provider as someone else.
    pub metal: shepherd::metal::MetalClient,
}

impl World {
    pub async fn new(pool: PgPool, fake: FakeConfig, config: ProvisionerConfig) -> World {
        World::build(pool, fake, config, None).await
    }

    /// A world whose jobs have one database connection between them
    /// ([`super::one_connection`]).
    pub async fn on_one_connection(
        pool: PgPool,
        reservations: usize,
        config: ProvisionerConfig,
    ) -> World {
        let one = super::one_connection(&pool);
        World::build(pool, fake_config(reservations), config, Some(one)).await
    }

    async fn build(
        pool: PgPool,
        fake: FakeConfig,
        config: ProvisionerConfig,
        jobs_pool: Option<PgPool>,
    ) -> World {
        migrated(&pool).await;
        let project = fake.project_id;
        let fake = start_fake(fake).await;
        let client = client_for(&fake, project);
        // As a first worker would: its settings become the cluster's.
        shepherd::cluster::establish(
            &pool,
            &shepherd::cluster::ClusterSettings::proposed_by(&config),
            &[],
            "test",
        )
        .await
        .expect("the cluster's settings are recorded");
        let ctx = Arc::new(JobContext::new(
            jobs_pool.unwrap_or_else(|| pool.clone()),
            client.clone(),
            Arc::new(config),
            PUBLIC_KEY.to_string(),
        ));
        World {
            pool,
            fake,
            ctx,
            metal: client,
        }
    }

    pub async fn with(pool: PgPool, reservations: usize, config: ProvisionerConfig) -> World {
        World::new(pool, fake_config(reservations), config).await
    }

    pub async fn reconcile(&self) -> ReconcileOutcome {
        reconcile(&self.ctx, "test-reconcile")
            .await
            .expect("the pass runs")
    }

    /// Claims the next runnable CreateDevice, Assimilate or DeleteMachine job, as a worker
    /// would, and runs it. `None` when nothing is runnable.
    pub async fn run_next(&self) -> Option<Ran> {
        run_next(&self.pool, &self.ctx).await
    }

    /// Runs jobs until none is runnable, checking the capacity invariant
    /// after every one. Returns what ran.
    pub async fn drain(&self) -> Vec<Ran> {
        drain_with(&self.pool, &self.ctx).await
    }

    pub async fn count(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap()
    }

    pub async fn managed(&self) -> i64 {
        self.count("select count(*) from shepherd.managed_machines")
            .await
    }

    pub async fn in_flight(&self) -> i64 {
        self.count("select (select count(*) from shepherd.in_flight)")
            .await
    }

    /// Invariant 2: managed + in flight never exceeds max_machines.
    pub async fn assert_within_limit(&self) {
        assert_within_limit(&self.pool).await;
    }

    /// Invariant 1 and 3 against the fake's state: no reservation has two
    /// of our devices, and every device with our prefix is managed.
    pub async fn assert_fleet_consistent(&self) {
        let prefix = &self.ctx.config.device_prefix;
        let devices = self.fake.devices();
        let ours: Vec<_> = devices
            .iter()
            .filter(|d| d.hostname.starts_with(prefix.as_str()))
            .collect();
        let mut reservations: Vec<_> = ours.iter().filter_map(|d| d.reservation).collect();
        let n = reservations.len();
        reservations.sort();
        reservations.dedup();
        assert_eq!(
            reservations.len(),
            n,
            "a reservation has two devices of ours"
        );
        // Metal refuses a second create on a taken reservation, which would
        // hide one from the check above: the fake counts them.
        assert_eq!(
            self.fake.duplicate_creates(),
            0,
            "a create was sent for a reservation that held a device of ours"
        );
        let managed: Vec<String> =
            sqlx::query_scalar("select provider_id from shepherd.managed_machines")
                .fetch_all(&self.pool)
                .await
                .unwrap();
        for d in &ours {
            assert!(
                managed.contains(&d.id.to_string()),
                "device {} is not managed",
                d.id
            );
        }
        for m in &managed {
            assert!(
                devices.iter().any(|d| d.id.to_string() == *m),
                "machine {m} has no device"
            );
        }
    }

    /// Makes every delayed job runnable now (retries wait out a backoff).
    pub async fn make_due(&self) {
        sqlx::query("update apalis.jobs set run_at = now() where status = 'Pending'")
            .execute(&self.pool)
            .await
            .unwrap();
    }

    /// Whether the reservation has a sinbin row.
    pub async fn has_penalty(&self, reservation: uuid::Uuid) -> bool {
        sqlx::query_scalar("select exists(select 1 from shepherd.sinbin where reservation_id = $1)")
            .bind(reservation)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    pub async fn jobs(&self, kind: &str) -> i64 {
        sqlx::query_scalar("select count(*) from apalis.jobs where job_type = $1")
            .bind(kind)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    pub async fn events(&self, event_type: &str) -> i64 {
        sqlx::query_scalar("select count(*) from shepherd.events where event_type = $1")
            .bind(event_type)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }
}

/// Claims the next runnable CreateDevice, Assimilate or DeleteMachine job, as a worker
/// would, and runs it with `ctx`, whichever provider it speaks to. `None`
/// when nothing is runnable. As apalis does, the claim leaves `attempts`
/// alone and the end of the run counts it.
pub async fn run_next(pool: &PgPool, ctx: &JobContext) -> Option<Ran> {
    let row: Option<(String, String, serde_json::Value)> = sqlx::query_as(
        "update apalis.jobs j set status = 'Running'
         from (select id from apalis.jobs
               where job_type in ('create_device', 'assimilate', 'delete_machine')
                 and status = 'Pending'
                 and run_at <= now()
               order by run_at, id limit 1 for update skip locked) next
         where j.id = next.id
         returning j.id, j.job_type, convert_from(j.job, 'UTF8')::jsonb",
    )
    .fetch_optional(pool)
    .await
    .unwrap();
    let (id, kind, args) = row?;
    let ran = match kind.as_str() {
        "create_device" => {
            let args: CreateDeviceArgs = serde_json::from_value(args).unwrap();
            Ran::Create(create_device(ctx, &args, &id).await.unwrap())
        }
        "delete_machine" => {
            let args: DeleteMachineArgs = serde_json::from_value(args).unwrap();
            Ran::Delete(delete_machine(ctx, &args, &id).await.unwrap())
        }
        _ => {
            let args: AssimilateArgs = serde_json::from_value(args).unwrap();
            Ran::Assimilate(assimilate(ctx, &args, &id).await.unwrap())
        }
    };
    sqlx::query(
        "update apalis.jobs set status = 'Done', done_at = now(), attempts = attempts + 1
         where id = $1",
    )
    .bind(&id)
    .execute(pool)
    .await
    .unwrap();
    Some(ran)
}

/// Invariant 2: managed + in flight never exceeds the cluster's
/// max_machines (which an operator may have changed mid-test).
pub async fn assert_within_limit(pool: &PgPool) {
    let count = |sql: &'static str| async move {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(pool)
            .await
            .unwrap()
    };
    let max = count("select shepherd.max_machines()").await;
    if max > 0 {
        let m = count("select count(*) from shepherd.managed_machines").await;
        let f = count("select (select count(*) from shepherd.in_flight)").await;
        assert!(m + f <= max, "managed {m} + in flight {f} > max {max}");
    }
}

/// Runs jobs until none is runnable, checking the capacity invariant after
/// every one.
pub async fn drain_with(pool: &PgPool, ctx: &JobContext) -> Vec<Ran> {
    let mut ran = Vec::new();
    while let Some(r) = run_next(pool, ctx).await {
        assert_within_limit(pool).await;
        ran.push(r);
    }
    ran
}
