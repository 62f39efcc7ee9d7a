//! What a long-running binary does at its start and end: its exit code from a result,
//! and the stop signals it obeys.

/// The exit of a long-running binary: success, or the error with its context chain logged
/// (no backtrace) and exit code 1.
pub fn exit(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGTERM (systemd, Kubernetes) or SIGINT. If the SIGTERM handler can not be
/// installed, that is logged and only SIGINT stops.
pub async fn stop_requested() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot install the SIGTERM handler");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
