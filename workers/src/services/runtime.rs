//! Binding the job handlers to apalis queues and running them as a process.
//!
//! One apalis worker per job kind, each supervised: apalis lets any database
//! error (a restart of Postgres, a dropped connection) end a worker for good,
//! so each is rebuilt after a backoff under a fresh name (a reused name is
//! refused while the dead one's advisory lock lingers). Batches are of one
//! job: apalis neither heartbeats nor acknowledges while fetched jobs wait in
//! its buffer, and a silent worker's jobs are run again by others.
//!
//! Job arguments decode leniently: a row whose JSON does not fit its kind
//! ends as Killed with the reason in `last_result`, instead of stopping the
//! worker that claimed it.

use std::sync::Arc;
use std::time::Duration;

use apalis::prelude::*;
use apalis_postgres::{Config, PostgresStorage};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use shepherd::jobs::{
    self, AssimilateArgs, CreateDeviceArgs, DeleteMachineArgs, JobContext, ReconcileArgs,
};
use sqlx::PgPool;
use tokio::sync::watch;
use tracing::Instrument;

use super::runs::{Running, Settle, Shared, guarded, run_follow_up, run_guarded, settle_claim};

/// Job arguments that always decode, so a bad row fails its job, not the worker.
#[derive(Debug, Clone)]
pub enum Lenient<T> {
    Ok(T),
    Invalid {
        raw: serde_json::Value,
        error: String,
    },
}

impl<T: Serialize> Serialize for Lenient<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Lenient::Ok(t) => t.serialize(s),
            Lenient::Invalid { raw, .. } => raw.serialize(s),
        }
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = serde_json::Value::deserialize(d)?;
        Ok(match T::deserialize(&raw) {
            Ok(t) => Lenient::Ok(t),
            Err(e) => Lenient::Invalid {
                raw,
                error: e.to_string(),
            },
        })
    }
}

#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Host, pid and a start id (`fleet::process_name`), unique per
    /// process: apalis registers workers by name.
    pub process_name: String,
    pub reconcile_concurrency: usize,
    pub create_concurrency: usize,
    pub assimilate_concurrency: usize,
    pub delete_concurrency: usize,
    pub heartbeat: Duration,
    pub missed_heartbeats: u32,
    /// Fallback wake-up for delayed jobs and missed notifications.
    pub poll_interval: Duration,
    /// After a shutdown signal, how long running jobs may take before they
    /// are dropped and their rows released for other workers.
    pub drain_timeout: Duration,
    /// Where job run times are counted (served on /metrics).
    pub job_metrics: JobMetrics,
    /// Hold one LISTEN connection to wake the queues at once; without it
    /// (`--no-listen`, behind PgBouncer in transaction mode) they poll.
    pub listen: bool,
    /// The process's one account of a database outage, shared with its
    /// scheduler and sweeper so that an outage is said once.
    pub outage: super::outage::Outage,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct JobRunLabels {
    pub kind: &'static str,
    /// `ok`, `failed` (retried by the queue) or `dropped` (cut by shutdown).
    pub outcome: &'static str,
}

/// This process's job run times, by kind and outcome.
#[derive(Debug, Clone)]
pub struct JobMetrics {
    pub run_time: Family<JobRunLabels, Histogram>,
}

impl Default for JobMetrics {
    fn default() -> Self {
        JobMetrics {
            // 5 ms to about 20 min: from an assimilation against a local fake
            // to a creation waiting out its limiter and its retries.
            run_time: Family::new_with_constructor(|| {
                Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                    0.005, 2.0, 18,
                ))
            }),
        }
    }
}

impl JobMetrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register_with_unit(
            "shepherd_job_run_time",
            "Time this process's job handlers ran, by kind and outcome",
            prometheus_client::registry::Unit::Seconds,
            self.run_time.clone(),
        );
    }
}

/// Shutdown as a value every loop can wait on.
#[derive(Clone)]
pub struct Stop(watch::Receiver<bool>);

impl Stop {
    pub fn new() -> (watch::Sender<bool>, Stop) {
        let (tx, rx) = watch::channel(false);
        (tx, Stop(rx))
    }

    pub fn is_stopping(&self) -> bool {
        *self.0.borrow()
    }

    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}

fn decode<T>(args: Lenient<T>) -> Result<T, BoxDynError> {
    match args {
        Lenient::Ok(t) => Ok(t),
        Lenient::Invalid { raw, error } => {
            tracing::error!(%raw, %error, "job arguments do not decode; the job is killed");
            Err(AbortError::new(format!("undecodable arguments {raw}: {error}")).into())
        }
    }
}

async fn reconcile_job(
    args: Lenient<ReconcileArgs>,
    task_id: TaskId,
    shared: Data<Shared>,
) -> Result<String, BoxDynError> {
    let job_id = task_id.to_string();
    let args = decode(args)?;
    let span = tracing::info_span!("job", kind = "reconcile", job_id = %job_id, requested_by = %args.requested_by);
    let pass = {
        let (ctx, job_id) = (shared.ctx.clone(), job_id.clone());
        async move {
            jobs::reconcile::reconcile_requested(&ctx, &job_id, Some(&args.requested_by)).await
        }
    };
    let outcome = guarded(&shared, "reconcile", &job_id, pass)
        .instrument(span)
        .await?;
    Ok(format!("{outcome:?}"))
}

async fn create_device_job(
    args: Lenient<CreateDeviceArgs>,
    task_id: TaskId,
    shared: Data<Shared>,
    worker: WorkerContext,
) -> Result<String, BoxDynError> {
    use futures::FutureExt;
    let job_id = task_id.to_string();
    let args = decode(args)?;
    let span = tracing::info_span!("job", kind = "create_device", job_id = %job_id, reservation = %args.reservation, attempt = args.attempt);
    // One run with its follow-up: the nudge that gets the creation's
    // acknowledgement sent comes once both are over.
    let _running = Running::start(&shared, "create_device");
    // This worker claims the Assimilate of a machine the run makes, and
    // runs it next (`jobs::follow_up`).
    let claims = jobs::follow_up::Claims::new(worker.name().to_string());
    let run = run_guarded(&shared, "create_device", &job_id, {
        let (ctx, job_id, claims) = (shared.ctx.clone(), job_id.clone(), claims.clone());
        async move {
            let run = jobs::create_device::create_device(&ctx, &args, &job_id);
            claims.scope(run).await
        }
    })
    .instrument(span.clone());
    let outcome = std::panic::AssertUnwindSafe(run).catch_unwind().await;
    let follow_up = claims.take();
    let outcome = match outcome {
        Ok(Ok(outcome)) => outcome,
        // Cut short, failed or panicked after its claim may have committed:
        // the row goes back to the queue before the run's end goes on.
        ended => {
            if let Some(follow_up) = follow_up {
                settle_claim(
                    &shared,
                    worker.name(),
                    &follow_up.job_id,
                    Settle::HandBack,
                    &span,
                )
                .await;
            }
            return ended
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                .map(|o| format!("{o:?}"));
        }
    };
    span.in_scope(|| outcome.log());
    if let Some(follow_up) = follow_up {
        run_follow_up(&shared, worker.name(), follow_up).await;
    }
    Ok(format!("{outcome:?}"))
}

async fn assimilate_job(
    args: Lenient<AssimilateArgs>,
    task_id: TaskId,
    shared: Data<Shared>,
) -> Result<String, BoxDynError> {
    let job_id = task_id.to_string();
    let args = decode(args)?;
    let span =
        tracing::info_span!("job", kind = "assimilate", job_id = %job_id, device = %args.device);
    let outcome = guarded(&shared, "assimilate", &job_id, {
        let (ctx, job_id) = (shared.ctx.clone(), job_id.clone());
        async move { jobs::assimilate::assimilate(&ctx, &args, &job_id).await }
    })
    .instrument(span.clone())
    .await?;
    span.in_scope(|| outcome.log());
    Ok(format!("{outcome:?}"))
}

async fn delete_machine_job(
    args: Lenient<DeleteMachineArgs>,
    task_id: TaskId,
    shared: Data<Shared>,
) -> Result<String, BoxDynError> {
    let job_id = task_id.to_string();
    let args = decode(args)?;
    let span = tracing::info_span!("job", kind = "delete_machine", job_id = %job_id, device = %args.device, attempt = args.attempt);
    let outcome = guarded(&shared, "delete_machine", &job_id, {
        let (ctx, job_id) = (shared.ctx.clone(), job_id.clone());
        async move { jobs::delete_machine::delete_machine(&ctx, &args, &job_id).await }
    })
    .instrument(span.clone())
    .await?;
    span.in_scope(|| outcome.log());
    Ok(format!("{outcome:?}"))
}

fn config(queue: &str, opts: &RuntimeOptions) -> Config {
    Config::default()
        .queue(queue)
        .batch_size(1)
        .lock_tasks(false)
        .heartbeat_interval(opts.heartbeat)
        .missed_heartbeats(opts.missed_heartbeats as usize)
}

/// Hands a worker's claimed jobs back to the queue. Their handlers have
/// finished or been dropped; every handler is idempotent, so a job whose
/// result was not acknowledged runs again harmlessly. A row that was
/// running counts its run: the next one is then a rerun, which looks for
/// what this one may have sent before it sends anything (a create cut off
/// mid-POST).
pub async fn release(pool: &PgPool, worker: &str) {
    let released = sqlx::query(
        "update apalis.jobs
         set status = 'Pending', lock_by = null, lock_at = null,
             attempts = attempts + (status = 'Running')::int
         where lock_by = $1 and status in ('Queued', 'Running')",
    )
    .bind(worker)
    .execute(pool)
    .await;
    match released {
        Ok(r) => tracing::info!(worker, jobs = r.rows_affected(), "released claimed jobs"),
        Err(e) => tracing::warn!(worker, error = %e, "could not release claimed jobs"),
    }
}

/// Hands back what an earlier process on this host with this pid left
/// claimed, once its queue workers have been silent for the rescue
/// `window`: a container restarted as pid 1 on its hostname. Names carry a
/// start id (`fleet::process_name`), so such a process is another name, and
/// a live process that shares host and pid (two pid-1 containers on host
/// networking) keeps its claims: only silence releases them, as apalis's
/// own rescue would. Names of releases before the start id (`host:pid`)
/// are matched as that host and pid. Counted as a run that its worker did
/// not finish, as apalis's rescue counts one.
pub async fn release_previous(
    pool: &PgPool,
    process_name: &str,
    window: Duration,
) -> Result<u64, sqlx::Error> {
    let host_pid = process_name
        .rsplit_once(':')
        .map_or(process_name, |(hp, _)| hp);
    let released = sqlx::query(
        "with claimed as (
             select j.id,
                    pg_catalog.regexp_replace(pg_catalog.split_part(j.lock_by, '@', 2),
                                              '#[0-9]+$', '') as process
             from apalis.jobs j
             where j.status in ('Queued', 'Running')
               and not exists (select 1 from apalis.workers w
                               where w.id = j.lock_by
                                 and w.last_seen > now() - $3::int8 * interval '1 millisecond'))
         update apalis.jobs j
         set status = 'Pending', lock_by = null, lock_at = null, done_at = null,
             attempts = attempts + 1,
             last_result = jsonb_build_object('Err',
                 'handed back: claimed by an earlier process on this host with this pid, silent \
                  past the rescue window')
         from claimed c
         where c.id = j.id and c.process <> $2
           and (c.process = $1 or pg_catalog.regexp_replace(c.process, ':[^:]*$', '') = $1)",
    )
    .bind(host_pid)
    .bind(process_name)
    .bind(i64::try_from(window.as_millis()).unwrap_or(i64::MAX / 2))
    .execute(pool)
    .await?;
    Ok(released.rows_affected())
}

/// Builds and runs one kind's worker until shutdown, rebuilding it after a
/// backoff whenever apalis gives up on it.
macro_rules! supervise {
    ($pool:expr, $shared:expr, $opts:expr, $queue:expr, $args:ty, $handler:expr, $concurrency:expr) => {{
        let pool: PgPool = $pool.clone();
        let shared: Shared = $shared.clone();
        let wakeups = shared.wakeups.clone();
        let opts: RuntimeOptions = $opts.clone();
        async move {
            let mut generation = 0u32;
            // Failures in a row: the backoff grows with them, and a worker
            // that ran a while before failing starts again from the
            // shortest wait, so a second outage hours later is not met
            // with the longest one.
            let mut in_a_row = 0u32;
            loop {
                let name = format!("{}@{}#{}", $queue, opts.process_name, generation);
                let began = std::time::Instant::now();
                // Woken by the process's one listener, and by the clock.
                let backend = PostgresStorage::<Lenient<$args>>::new(&pool)
                    .with_config(config($queue, &opts))
                    .poll_with_stream(wakeups.subscribe($queue))
                    .poll_with_interval(opts.poll_interval);
                let worker = WorkerBuilder::new(name.clone())
                    .backend(backend)
                    .data(shared.clone())
                    .concurrency($concurrency)
                    .build($handler);
                let stop = shared.stop.clone();
                let run = worker.run_until(async move {
                    stop.wait().await;
                    Ok::<(), std::io::Error>(())
                });
                // apalis has been seen not to return after a drain; past the
                // drain timeout and a grace, the worker is abandoned and its
                // rows released here, so a stopping process always exits.
                let overdue = {
                    let stop = shared.stop.clone();
                    let limit = shared.drain_timeout + Duration::from_secs(5);
                    async move {
                        stop.wait().await;
                        tokio::time::sleep(limit).await;
                    }
                };
                let result = tokio::select! {
                    r = run => r.map_err(|e| e.to_string()),
                    _ = overdue => {
                        tracing::warn!(worker = %name, "worker did not stop after draining; releasing its jobs");
                        release(&pool, &name).await;
                        Ok(())
                    }
                };
                if shared.stop.is_stopping() {
                    // apalis can claim a job (Queued) as it stops and leave
                    // it claimed: seen in the SIGTERM test. The handlers are
                    // done by now, so whatever this worker still holds goes
                    // back to the queue at once instead of after the
                    // heartbeat timeout.
                    release(&pool, &name).await;
                    tracing::info!(worker = %name, "worker stopped");
                    break;
                }
                if began.elapsed() > Duration::from_secs(60) {
                    in_a_row = 0;
                }
                let backoff = Duration::from_secs(u64::from(2u32.pow(in_a_row.min(4))));
                in_a_row += 1;
                match result {
                    Ok(()) => tracing::warn!(worker = %name, "worker ended; restarting"),
                    Err(e) => {
                        shared.outage.failed(&pool, &shared.stop, &name, &e).await;
                        tracing::debug!(worker = %name, retry_in = ?backoff, "restarting the worker");
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = shared.stop.clone().wait() => break,
                }
                generation += 1;
            }
        }
    }};
}

/// Runs the four workers until `stop`; returns when all have drained.
pub async fn run(pool: PgPool, ctx: Arc<JobContext>, opts: RuntimeOptions, stop: Stop) {
    // The queue's statements and the jobs' share the one pool: a few
    // connections, each used for a statement at a time, serve both (kept
    // apart, the queue's held 2 or 3 of their own at rest, and twenty
    // workers filled a stock Postgres; issue 31).
    let shared = Shared {
        ctx,
        stop,
        drain_timeout: opts.drain_timeout,
        job_metrics: opts.job_metrics.clone(),
        wakeups: super::wakeups::Wakeups::default(),
        outage: opts.outage.clone(),
        running: Default::default(),
    };
    let window = opts.heartbeat * opts.missed_heartbeats;
    match release_previous(&pool, &opts.process_name, window).await {
        Ok(0) => {}
        Ok(n) => tracing::warn!(
            jobs = n,
            process = %opts.process_name,
            "an earlier process on this host with this pid left jobs claimed and fell silent; handed back to the queue"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "could not look for jobs left claimed by an earlier process of this name")
        }
    }
    let listener = opts.listen.then(|| {
        tokio::spawn(
            shared
                .wakeups
                .clone()
                .listen(shepherd::db::listener_pool(&pool), shared.stop.clone()),
        )
    });
    // One task per queue worker, not one future joining four: polled
    // together, every wake of one queue polled the others, and apalis
    // starts a fetch whenever a ready worker is polled, so idle queues
    // fetched for each other (issue 31: about 2,900 commits a second at
    // rest, 10 once apart).
    let tasks = [
        tokio::spawn(supervise!(
            pool,
            shared,
            opts,
            jobs::RECONCILE_QUEUE,
            ReconcileArgs,
            reconcile_job,
            opts.reconcile_concurrency
        )),
        tokio::spawn(supervise!(
            pool,
            shared,
            opts,
            jobs::CREATE_DEVICE_QUEUE,
            CreateDeviceArgs,
            create_device_job,
            opts.create_concurrency
        )),
        tokio::spawn(supervise!(
            pool,
            shared,
            opts,
            jobs::ASSIMILATE_QUEUE,
            AssimilateArgs,
            assimilate_job,
            opts.assimilate_concurrency
        )),
        tokio::spawn(supervise!(
            pool,
            shared,
            opts,
            jobs::DELETE_MACHINE_QUEUE,
            DeleteMachineArgs,
            delete_machine_job,
            opts.delete_concurrency
        )),
    ];
    for task in tasks {
        if let Err(e) = task.await
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    if let Some(listener) = listener {
        let _ = listener.await;
    }
}
