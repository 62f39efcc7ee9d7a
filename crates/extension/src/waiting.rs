//! What the hook being answered is waiting on, so that a missed deadline names it
//! (issue 27: "the node agent did not answer" was said also when a Kubernetes API call
//! missed it). [`crate::http::route`] opens the scope and reads it when the deadline
//! passes; the hooks mark their cluster calls with [`waiting_on`]; an agent RPC is the
//! default. A leaf module: both `http` and `hooks` use it.

use std::time::Duration;

tokio::task_local! {
    /// What the hook being answered waits on now ([`waiting_on`]), named when its
    /// deadline passes first.
    pub(crate) static WAITING: std::cell::Cell<&'static str>;
}

/// What a hook waits on unless it says otherwise: the agent RPCs.
pub(crate) const NODE_AGENT: &str = "the node agent";
/// The management cluster (the Machine read from it).
pub(crate) const MANAGEMENT_CLUSTER: &str = "the management cluster (Kubernetes API)";
/// The workload cluster (its Node's kubelet version).
pub(crate) const WORKLOAD_CLUSTER: &str = "the workload cluster (Kubernetes API)";
/// A cluster step that talks to both (cordon and drain, the Node check after the
/// update, the Machine's phase and Events).
pub(crate) const CLUSTERS: &str = "the management or workload cluster (Kubernetes API)";

/// Runs `fut` marked as waiting on `what` (one of the constants above), so that a
/// deadline passing meanwhile names it; the mark goes back to what it was once `fut`
/// is done. Outside a hook's answer (no [`WAITING`] scope) it only runs `fut`.
pub(crate) async fn waiting_on<T>(
    what: &'static str,
    fut: impl std::future::Future<Output = T>,
) -> T {
    let before = WAITING.try_with(|w| w.replace(what)).ok();
    let out = fut.await;
    if let Some(b) = before {
        let _ = WAITING.try_with(|w| w.set(b));
    }
    out
}

/// Why a hook's answer came from its deadline: who it was waiting on.
pub(crate) fn missed(what: &str, deadline: Duration) -> String {
    format!("{what} did not answer within the hook's deadline ({deadline:?})")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// issue 27 §5 (the message names what missed the deadline): a call that is still
    /// waiting on a cluster when the deadline passes is named, not the node agent.
    #[tokio::test]
    async fn a_missed_deadline_names_what_the_hook_waited_on() {
        let d = Duration::from_millis(20);
        let (r, what) = WAITING
            .scope(std::cell::Cell::new(NODE_AGENT), async {
                let hung = async {
                    waiting_on(NODE_AGENT, async {}).await;
                    waiting_on(WORKLOAD_CLUSTER, std::future::pending::<()>()).await
                };
                let r = tokio::time::timeout(d, hung).await;
                (r, WAITING.with(|w| w.get()))
            })
            .await;
        assert!(r.is_err());
        assert_eq!(
            missed(what, d),
            "the workload cluster (Kubernetes API) did not answer within the hook's deadline (20ms)"
        );
        // done waiting: the mark goes back
        let what = WAITING
            .scope(std::cell::Cell::new(NODE_AGENT), async {
                waiting_on(MANAGEMENT_CLUSTER, async {}).await;
                WAITING.with(|w| w.get())
            })
            .await;
        assert_eq!(what, NODE_AGENT);
        // outside a hook's answer it only runs the future
        assert_eq!(waiting_on(MANAGEMENT_CLUSTER, async { 7 }).await, 7);
    }
}
