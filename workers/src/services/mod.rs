//! What a long-running process runs until it is stopped: the job runtime
//! bound to apalis and the one connection that wakes it, the scheduler, the sweep, the status page and metrics,
//! what a process says when it loses its database, and the shutdown signal they all watch.

pub mod http;
pub mod outage;
pub mod runs;
pub mod runtime;
pub mod scheduler;
pub mod shutdown;
pub mod sweeper;
pub mod wakeups;
