//! A creation's assimilation, run by the worker that made the machine.
//!
//! When our own create returns a machine, its Assimilate needs no call to
//! the provider, only a transaction. Through the queue it cost a claim (a
//! wake, a fetch, often a second fetch that found nothing) and an
//! acknowledgement, each a transaction on the queue's one serial loop; on
//! a busy Postgres that was a third of a creation's database work (issue
//! 31). So a worker that runs creations pushes a created machine's
//! Assimilate already claimed by itself, and runs it when the creation's
//! handler returns; the transaction that records the machine acknowledges
//! the row as apalis would ([`acknowledge`]; `queue::finish_claimed` for
//! any other ending). The row is a job like any other: operators see it
//! claimed and done, its run is kept, and if the worker dies first the
//! queue gives it to another worker when the claimant's heartbeat stops,
//! as it would any claimed job.
//!
//! The claimant is known to the runtime only, and the ending that pushes
//! the Assimilate is several calls deep in a creation, so it is given to
//! the creation as a task-local for the length of one run ([`Claims`]),
//! rather than through every function between. A run without one (a test
//! calling the handler, the CLI) pushes the Assimilate unclaimed, as before.

use std::future::Future;
use std::sync::{Arc, Mutex};

use super::AssimilateArgs;

/// A claimed Assimilate for the claimant to run.
#[derive(Debug, Clone, PartialEq)]
pub struct FollowUp {
    pub job_id: String,
    pub args: AssimilateArgs,
}

struct Runner {
    claimant: String,
    claimed: Mutex<Option<FollowUp>>,
}

tokio::task_local! {
    static RUNNER: Arc<Runner>;
}

/// One creation's run under a claimant: what it claimed is read from here
/// whether or not the run returned (a run cut short may have committed its
/// claim), so that nothing claimed is left unseen.
#[derive(Clone)]
pub struct Claims(Arc<Runner>);

impl Claims {
    /// Claims for `claimant`, an apalis worker's registered name.
    pub fn new(claimant: String) -> Claims {
        Claims(Arc::new(Runner {
            claimant,
            claimed: Mutex::new(None),
        }))
    }

    /// `run` (a creation) with these claims' claimant as the claimant of
    /// the Assimilate it pushes.
    pub fn scope<F: Future>(&self, run: F) -> impl Future<Output = F::Output> {
        RUNNER.scope(self.0.clone(), run)
    }

    /// The Assimilate claimed, if any: pushed in a transaction that may or
    /// may not have committed.
    pub fn take(&self) -> Option<FollowUp> {
        self.0
            .claimed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

/// The worker to claim a created machine's Assimilate for, in a run under
/// [`Claims::scope`].
pub(crate) fn claimant() -> Option<String> {
    RUNNER.try_with(|r| r.claimant.clone()).ok()
}

/// Tells the runner of a claim pushed in a transaction not yet committed:
/// if the commit's answer is lost, the runner hands the row back (a no-op
/// where it never committed) rather than leave it claimed by a live
/// worker, which nobody else takes it from.
pub(crate) fn claimed(follow_up: FollowUp) {
    let _ = RUNNER.try_with(|r| {
        *r.claimed.lock().unwrap_or_else(|p| p.into_inner()) = Some(follow_up);
    });
}

/// A claimed Assimilate being run by its claimant: its acknowledgement can
/// ride in the transaction that records its outcome, one commit (and WAL
/// flush) fewer a machine than a statement of its own after it.
struct Acking {
    job_id: String,
    claimant: String,
    acknowledged: std::sync::atomic::AtomicBool,
}

tokio::task_local! {
    static ACKING: Arc<Acking>;
}

/// The run of a claimed Assimilate, acknowledged by [`acknowledge`] where
/// its outcome's transaction can carry it.
#[derive(Clone)]
pub struct Run(Arc<Acking>);

impl Run {
    pub fn new(job_id: &str, claimant: &str) -> Run {
        Run(Arc::new(Acking {
            job_id: job_id.into(),
            claimant: claimant.into(),
            acknowledged: Default::default(),
        }))
    }

    pub fn scope<F: Future>(&self, run: F) -> impl Future<Output = F::Output> {
        ACKING.scope(self.0.clone(), run)
    }

    /// Whether a transaction of the run acknowledged the row. Only what the
    /// run returned tells whether that transaction committed: read this
    /// after a run that ended well.
    pub fn acknowledged(&self) -> bool {
        self.0
            .acknowledged
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Acknowledges the claimed Assimilate being run, if this is one, as done
/// with `outcome`, in `conn`'s transaction: called just before the commit
/// that records the outcome, and by a run that returns `outcome` exactly
/// when that commit succeeds (the runner takes a returned outcome after a
/// call here as acknowledged).
pub(crate) async fn acknowledge(
    conn: &mut sqlx::PgConnection,
    outcome: &impl std::fmt::Debug,
) -> Result<(), sqlx::Error> {
    let Ok(acking) = ACKING.try_with(Arc::clone) else {
        return Ok(());
    };
    let done = super::queue::Ending::Done(format!("{outcome:?}"));
    super::queue::finish_claimed(conn, &acking.job_id, &acking.claimant, &done).await?;
    acking
        .acknowledged
        .store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}
