//! One `LISTEN` connection for the whole process, where apalis's own
//! pubsub holds one per queue worker for life: a job inserted into any
//! queue wakes that queue's worker at once. The queue workers also poll
//! every `--poll-interval`, so a notification lost (the listener
//! reconnecting, a NOTIFY raised by nobody) costs at most that interval,
//! and a process started with `--no-listen` (behind PgBouncer in
//! transaction mode, which cannot hold a LISTEN) works by polling alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc;
use serde::Deserialize;
use sqlx::PgPool;
use sqlx::postgres::PgListener;

use super::runtime::Stop;

/// Wakes a queue's worker may have pending.
const WAKES_PENDING: usize = 256;

/// How long after a queue's last run ends its worker is polled again:
/// time for apalis to queue the run's acknowledgement, which it does right
/// after the handler returns.
const ACK_NUDGE: Duration = Duration::from_millis(10);

/// What apalis's insert trigger says of a new job.
#[derive(Deserialize)]
struct Inserted {
    job_type: String,
}

/// Each queue's wakers; a worker rebuilt after a failure subscribes anew,
/// and the closed senders of its predecessors are pruned as they are met.
#[derive(Clone, Default)]
pub struct Wakeups {
    queues: Arc<Mutex<HashMap<String, Vec<mpsc::Sender<()>>>>>,
}

impl Wakeups {
    /// A stream that yields whenever `queue` has a new job. It never ends
    /// while the process runs: the registry keeps its sender.
    pub fn subscribe(&self, queue: &str) -> mpsc::Receiver<()> {
        // A wake per new job, as apalis's own listener gives: after a fetch
        // the worker waits for the next wake (or the poll), so wakes that
        // were merged would leave jobs waiting. Past the bound they are
        // dropped; the fetches they would have made find the jobs anyway.
        let (tx, rx) = mpsc::channel(WAKES_PENDING);
        self.queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(queue.to_string())
            .or_default()
            .push(tx);
        rx
    }

    /// The last of `queue`'s runs in this process has ended: its worker is
    /// polled once more in a moment. apalis sends a run's acknowledgement
    /// from its worker's next poll (`try_drain_events` in apalis-core), and
    /// an idle worker polls on a wake, its poll interval or its heartbeat
    /// only: without this, the last job of a burst stayed unacknowledged
    /// (its status, its run's record) until then (scenario 1: the last
    /// assimilation of 2,000 jobs waited 0.7 s of a 1 s poll in about half
    /// the runs). The poll also fetches, once per burst.
    pub fn nudge_after_last_run(&self, queue: &'static str) {
        let wakeups = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(ACK_NUDGE).await;
            wakeups.wake(Some(queue));
        });
    }

    /// Wakes `queue`'s workers: a job went back to it without an insert.
    pub fn wake_queue(&self, queue: &str) {
        self.wake(Some(queue));
    }

    /// Wakes `queue`'s workers (every queue's with `None`).
    fn wake(&self, queue: Option<&str>) {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        for (name, senders) in queues.iter_mut() {
            if queue.is_some_and(|q| q != name) {
                continue;
            }
            senders.retain_mut(|tx| match tx.try_send(()) {
                Ok(()) => true,
                Err(e) => !e.is_disconnected(),
            });
        }
    }

    /// Listens until `stop`, reconnecting after a failure with a growing
    /// wait, and saying so once per outage rather than at every try.
    pub async fn listen(self, pool: PgPool, stop: Stop) {
        let mut failures = 0u32;
        loop {
            if stop.is_stopping() {
                return;
            }
            let connected = async {
                let mut listener = PgListener::connect_with(&pool).await?;
                // A lost connection is reported, not mended in place: sqlx
                // mends it in a loop that retries at once on every I/O
                // error but a refusal (a reset, an early EOF), which spins
                // while the server is away. This loop waits between tries.
                listener.eager_reconnect(false);
                listener.listen("apalis::job::insert").await?;
                Ok::<_, sqlx::Error>(listener)
            };
            let mut listener = tokio::select! {
                l = connected => match l {
                    Ok(l) => l,
                    Err(e) => {
                        if failures == 0 {
                            tracing::warn!(error = %e, "cannot listen for new jobs; the queues poll meanwhile");
                        }
                        failures += 1;
                        let wait = Duration::from_secs(1 << failures.min(5));
                        tokio::select! {
                            () = tokio::time::sleep(wait) => continue,
                            () = stop.clone().wait() => return,
                        }
                    }
                },
                () = stop.clone().wait() => return,
            };
            if failures > 0 {
                tracing::info!("listening for new jobs again");
                // The next outage is said again, and waited out from the
                // shortest wait.
                failures = 0;
            }
            // Whatever was inserted while nobody listened is looked for now.
            self.wake(None);
            loop {
                tokio::select! {
                    n = listener.try_recv() => match n {
                        Ok(Some(n)) => match serde_json::from_str::<Inserted>(n.payload()) {
                            Ok(i) => self.wake(Some(&i.job_type)),
                            Err(_) => self.wake(None),
                        },
                        // The connection was lost: listen again from the
                        // top, which waits between failed tries. Whatever
                        // came meanwhile is looked for when it listens.
                        Ok(None) => {
                            tracing::debug!("the listening connection was lost; listening again");
                            self.wake(None);
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "the listening connection failed; reconnecting");
                            failures = 1;
                            break;
                        }
                    },
                    () = stop.clone().wait() => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test]
    async fn wakes_reach_their_queue_up_to_a_bound_and_closed_workers_are_forgotten() {
        let w = Wakeups::default();
        let mut create = w.subscribe("create_device");
        let mut reconcile = w.subscribe("reconcile");
        let gone = w.subscribe("reconcile");
        drop(gone);
        w.wake(Some("create_device"));
        w.wake(Some("create_device"));
        assert_eq!(create.next().await, Some(()));
        assert_eq!(create.next().await, Some(()));
        assert!(create.try_recv().is_err());
        assert!(reconcile.try_recv().is_err());
        // Past the bound, wakes are dropped, never blocking the listener.
        for _ in 0..WAKES_PENDING + 10 {
            w.wake(Some("create_device"));
        }
        let mut pending = 0;
        while create.try_recv().is_ok() {
            pending += 1;
        }
        assert!(
            (WAKES_PENDING..=WAKES_PENDING + 1).contains(&pending),
            "{pending}"
        );
        w.wake(None);
        assert_eq!(reconcile.next().await, Some(()));
        assert_eq!(w.queues.lock().unwrap()["reconcile"].len(), 1);
    }
}
