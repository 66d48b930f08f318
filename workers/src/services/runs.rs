//! One job's run: guarded against shutdown and panics (`guarded`),
//! counted among its queue's (`Running`), kept in `shepherd.job_runs` when
//! it fails (`record_run`); and a creation's claimed Assimilate, run after
//! the creation and settled as apalis would settle it (`run_follow_up`).

use std::sync::Arc;
use std::time::Duration;

use apalis::prelude::*;
use shepherd::jobs::{self, JobContext, JobError};
use sqlx::PgPool;
use tracing::Instrument;

use super::runtime::{JobMetrics, JobRunLabels, Stop};

#[derive(Clone)]
pub(super) struct Shared {
    pub(super) ctx: Arc<JobContext>,
    pub(super) stop: Stop,
    pub(super) drain_timeout: Duration,
    pub(super) job_metrics: JobMetrics,
    pub(super) wakeups: super::wakeups::Wakeups,
    pub(super) outage: super::outage::Outage,
    /// Runs going on in this process, by queue.
    pub(super) running: Arc<std::sync::Mutex<std::collections::HashMap<&'static str, usize>>>,
}

/// One run counted in [`Shared::running`] until dropped (a run ended, or
/// dropped at shutdown); the last of its queue's nudges the queue's worker
/// so that apalis sends the acknowledgements it holds.
pub(super) struct Running<'a> {
    shared: &'a Shared,
    queue: &'static str,
}

impl<'a> Running<'a> {
    pub(super) fn start(shared: &'a Shared, queue: &'static str) -> Self {
        *shared
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(queue)
            .or_default() += 1;
        Running { shared, queue }
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut running = self
            .shared
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let left = running.entry(self.queue).or_default();
        *left = left.saturating_sub(1);
        if *left == 0 && tokio::runtime::Handle::try_current().is_ok() {
            self.shared.wakeups.nudge_after_last_run(self.queue);
        }
    }
}

/// Runs the handler; on shutdown, lets it finish within the drain timeout,
/// then drops it. A dropped handler's transaction rolls back and its job is
/// left Failed with attempts to spare, so another worker takes it up; every
/// handler is idempotent, so a half-done run is safe to repeat. Each run is
/// kept in `shepherd.job_runs`, for the console's history of a job.
///
/// The handler runs as a task of its own (issue 31): apalis polls a
/// queue's handlers inside the task that claims and acknowledges its jobs,
/// one at a time, so on that task their work held up the queue's next
/// claim. The task goes with this future: dropped (apalis let the run go),
/// it is aborted, as the handler itself was dropped before.
pub(super) async fn guarded<T: std::fmt::Debug + Send + 'static>(
    shared: &Shared,
    kind: &'static str,
    job_id: &str,
    fut: impl std::future::Future<Output = Result<T, JobError>> + Send + 'static,
) -> Result<T, BoxDynError> {
    let _running = Running::start(shared, kind);
    run_guarded(shared, kind, job_id, fut).await
}

/// [`guarded`] without counting the run among its queue's: a run its
/// queue's worker did not claim (a creation's follow-up) leaves that
/// worker no acknowledgement to send.
pub(super) async fn run_guarded<T: std::fmt::Debug + Send + 'static>(
    shared: &Shared,
    kind: &'static str,
    job_id: &str,
    fut: impl std::future::Future<Output = Result<T, JobError>> + Send + 'static,
) -> Result<T, BoxDynError> {
    let started = std::time::Instant::now();
    let stop = shared.stop.clone();
    let drain = shared.drain_timeout;
    let deadline = async move {
        stop.wait().await;
        tokio::time::sleep(drain).await;
    };
    let mut work = AbortOnDrop(tokio::spawn(fut.in_current_span()));
    let (outcome, result): (&'static str, Result<T, BoxDynError>) = tokio::select! {
        r = &mut work.0 => match r {
            Ok(Ok(v)) => ("ok", Ok(v)),
            Ok(Err(JobError::BadArgs(e))) => ("failed", Err(AbortError::new(e).into())),
            Ok(Err(e)) => {
                // The database is most likely away; don't let the queue
                // hand the job straight back while it still is.
                tracing::error!(error = %e, "job failed on infrastructure; it will be retried");
                tokio::time::sleep(Duration::from_secs(2)).await;
                ("failed", Err(e.into()))
            }
            // A handler's panic goes on to apalis, as when it ran here.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => ("dropped", Err(format!("the job's task ended early: {e}").into())),
        },
        _ = deadline => {
            // Gone (its transaction rolled back, its leases given back by
            // their drops) before the run is recorded as dropped.
            work.0.abort();
            let _ = (&mut work.0).await;
            ("dropped", Err("the worker shut down before the job finished; released for retry".into()))
        }
    };
    shared
        .job_metrics
        .run_time
        .get_or_create(&JobRunLabels { kind, outcome })
        .observe(started.elapsed().as_secs_f64());
    // A run that ended well is kept by the queue's acknowledgement, in its
    // own transaction (migration `runs_at_ack`); a failed or dropped one
    // only this process can tell apart.
    if let Err(e) = &result {
        record_run(
            &shared.ctx.pool,
            job_id,
            kind,
            started.elapsed(),
            outcome,
            &e.to_string(),
        )
        .await;
    }
    result
}

/// A job's task, aborted when its handle is dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How long a run's record may hold up the run: it is history for the
/// pages, not part of the job's work.
const RUN_RECORD_TIMEOUT: Duration = Duration::from_secs(2);

/// Keeps a run that failed or was dropped in `shepherd.job_runs`, numbered
/// as the queue counts it (`attempts` counts the runs that ended or that a
/// dead worker left, and is raised after this). One write, at the end: a
/// run whose worker died leaves no row, and the job's page tells it from
/// the queue's count.
pub(super) async fn record_run(
    pool: &PgPool,
    job_id: &str,
    kind: &str,
    took: Duration,
    outcome: &str,
    said: &str,
) {
    let said: String = said.chars().take(2000).collect();
    let insert = sqlx::query(
        "insert into shepherd.job_runs
             (job_id, run, kind, worker, started_at, ended_at, outcome, result)
         select $1, coalesce(j.attempts, 0) + 1, $2, j.lock_by,
                now() - make_interval(secs => $3), now(), $4, $5
         from (select 1) one
         left join apalis.jobs j on j.id = $1
         on conflict (job_id, run) do nothing",
    )
    .bind(job_id)
    .bind(kind)
    .bind(took.as_secs_f64())
    .bind(outcome)
    .bind(&said)
    .execute(pool);
    match tokio::time::timeout(RUN_RECORD_TIMEOUT, insert).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "could not record the job's run"),
        Err(_) => tracing::warn!("recording the job's run timed out"),
    }
}

/// Runs a creation's claimed Assimilate and acknowledges it as apalis
/// would. A failure goes back to the queue (`Failed`, run again by the
/// assimilation workers); a stopping process leaves it claimed, for the
/// release at the worker's stop to hand back.
pub(super) async fn run_follow_up(
    shared: &Shared,
    claimant: &str,
    follow_up: jobs::follow_up::FollowUp,
) {
    use futures::FutureExt;
    use jobs::queue::Ending;
    if shared.stop.is_stopping() {
        return;
    }
    let jobs::follow_up::FollowUp { job_id, args } = follow_up;
    let span = tracing::info_span!("job", kind = "assimilate", job_id = %job_id, device = %args.device, attempt = args.attempt, follow_up = true);
    // Acknowledged in the outcome's own transaction where it has one.
    let acking = jobs::follow_up::Run::new(&job_id, claimant);
    let run = run_guarded(shared, "assimilate", &job_id, {
        let (ctx, job_id, acking) = (shared.ctx.clone(), job_id.clone(), acking.clone());
        async move {
            let run = jobs::assimilate::assimilate(&ctx, &args, &job_id);
            acking.scope(run).await
        }
    })
    .instrument(span.clone());
    let ending = match std::panic::AssertUnwindSafe(run).catch_unwind().await {
        Ok(Ok(outcome)) => {
            span.in_scope(|| outcome.log());
            if acking.acknowledged() {
                return;
            }
            Ending::Done(format!("{outcome:?}"))
        }
        Ok(Err(e)) if e.is::<AbortError>() => Ending::Killed(e.to_string()),
        Ok(Err(e)) => Ending::Failed(e.to_string()),
        Err(_) => {
            let said = "the assimilation panicked; the queue runs it again";
            tracing::error!(parent: &span, "{said}");
            record_run(
                &shared.ctx.pool,
                &job_id,
                "assimilate",
                Duration::ZERO,
                "failed",
                said,
            )
            .await;
            Ending::Failed(said.into())
        }
    };
    settle_claim(shared, claimant, &job_id, Settle::Finish(ending), &span).await;
}

/// What becomes of a row a worker claimed itself.
pub(super) enum Settle {
    Finish(jobs::queue::Ending),
    HandBack,
}

/// Settles a claimed row, trying until it lands: until it does, the row
/// stays claimed by a live worker, which neither the queue nor the sweep
/// takes back. A stopping process gives up; its worker's release at the
/// stop hands the row back.
pub(super) async fn settle_claim(
    shared: &Shared,
    claimant: &str,
    job_id: &str,
    settle: Settle,
    span: &tracing::Span,
) {
    let mut wait = Duration::from_millis(100);
    loop {
        let settled = async {
            let mut conn = shared.ctx.pool.acquire().await?;
            match &settle {
                Settle::Finish(ending) => {
                    jobs::queue::finish_claimed(&mut conn, job_id, claimant, ending).await
                }
                Settle::HandBack => {
                    jobs::queue::hand_back_claimed(&mut conn, job_id, claimant).await
                }
            }
        };
        match settled.await {
            Ok(_) => break,
            Err(e) if shared.stop.is_stopping() => {
                tracing::warn!(parent: span, job_id, error = %e, "could not settle a claimed assimilation; the worker's stop hands it back");
                return;
            }
            Err(e) => {
                tracing::warn!(parent: span, job_id, error = %e, retry_in = ?wait, "could not settle a claimed assimilation; trying again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(30));
            }
        }
    }
    if !matches!(settle, Settle::Finish(jobs::queue::Ending::Done(_))) {
        shared.wakeups.wake_queue(jobs::ASSIMILATE_QUEUE);
    }
}
