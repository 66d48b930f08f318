//! Fakes of the providers shepherd speaks to: real HTTP servers answering
//! from in-memory state, faithful to each provider's document, with fault
//! injection. They are the test doubles of every test and the target of
//! the demo; they live apart from the domain library so that nothing in
//! production links them but the `shepherd fake-*` commands.

pub mod faults;
pub mod latitude;
pub mod metal;
pub mod pgbouncer;

/// A fake's server task: serves `app` on `listener` until the returned
/// sender is used or dropped (a dropped handle stops its server too).
pub(crate) fn spawn_server(
    listener: tokio::net::TcpListener,
    app: axum::Router,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await
    });
    (stop, server)
}
