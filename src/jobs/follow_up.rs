//! A creation's assimilation, run by the worker that made the machine.
//!
//! When our own create returns a machine, its Assimilate needs no call to
//! the provider, only a transaction. Through the queue it cost a claim (a
//! wake, a fetch, often a second fetch that found nothing) and an
//! acknowledgement, each a transaction on the queue's one serial loop; on
//! a busy Postgres that was a third of a creation's database work (issue
//! 31). So a worker that runs creations pushes a created machine's
//! Assimilate already claimed by itself, and runs it when the creation's
//! handler returns ([`queue::finish_claimed`] acknowledges it as apalis
//! would). The row is a job like any other: operators see it claimed and
//! done, its run is kept, and if the worker dies first the queue gives it
//! to another worker when the claimant's heartbeat stops, as it would any
//! claimed job.
//!
//! The claimant is known to the runtime only, and the ending that pushes
//! the Assimilate is several calls deep in a creation, so it is given to
//! the creation as a task-local for the length of one run ([`claiming`]),
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

/// Runs `run` (a creation) with `claimant`, an apalis worker's registered
/// name, as the claimant of the Assimilate it pushes; returns its output
/// and the Assimilate it claimed, if any.
pub async fn claiming<F: Future>(claimant: String, run: F) -> (F::Output, Option<FollowUp>) {
    let runner = Arc::new(Runner {
        claimant,
        claimed: Mutex::new(None),
    });
    let out = RUNNER.scope(runner.clone(), run).await;
    let claimed = runner
        .claimed
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    (out, claimed)
}

/// The worker to claim a created machine's Assimilate for, in a run under
/// [`claiming`].
pub(crate) fn claimant() -> Option<String> {
    RUNNER.try_with(|r| r.claimant.clone()).ok()
}

/// Hands the committed claim to the runner.
pub(crate) fn claimed(follow_up: FollowUp) {
    let _ = RUNNER.try_with(|r| {
        *r.claimed.lock().unwrap_or_else(|p| p.into_inner()) = Some(follow_up);
    });
}
