//! What the cluster shows of an update: Kubernetes Events (`core/v1`, source
//! `inplace-extension`) on the Machine and the Node for each step, and the Machine's
//! annotations [`PHASE`] and [`PHASE_OPERATION`] (`kubectl get machines -o
//! custom-columns=NAME:.metadata.name,INPLACE:.metadata.annotations.inplaced\.io/phase`),
//! modelled on OpenShift's MachineConfigNode.
//!
//! An Event's name is derived from the object, the operation, the reason and the message,
//! so the same step reported again (the next poll, another replica) creates nothing new
//! (the API server answers 409, which is not an error here).

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::machine_resource;

/// The Machine annotation with the in-place phase ([`Phase::name`]).
pub(crate) const PHASE: &str = "inplaced.io/phase";
/// The Machine annotation with the operation id the phase is of.
pub(crate) const PHASE_OPERATION: &str = "inplaced.io/operation";

/// The Machine annotation that starts the clock of the wait for the Node to be back after
/// the agent finished: `<operation id> <RFC 3339 time>`, written once per operation
/// (`cluster.node_back_timeout_seconds` is counted from it by every replica).
pub(crate) const WAITING_FOR_NODE: &str = "inplaced.io/waiting-for-node";
/// The Machine annotation that starts the clock of the wait for the workload cluster (its
/// kubeconfig Secret, its API server, the Node) before the cordon, in the same format;
/// bounded by the drain deadline.
pub(crate) const WAITING_FOR_CLUSTER: &str = "inplaced.io/waiting-for-cluster";

/// The in-place phase of a Machine, as its annotation shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Cordoned, evicting Pods.
    Draining,
    /// The agent applies the change.
    Applying,
    /// The node reboots to finish the change.
    Rebooting,
    /// The node changed; waiting for the Node to be Ready (new boot id, kubelet version).
    WaitingForNode,
    /// Done and uncordoned.
    Done,
    /// Failed; the Node is left as the README states (cordoned if it was drained).
    Failed,
}

impl Phase {
    /// The annotation value.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Phase::Draining => "Draining",
            Phase::Applying => "Applying",
            Phase::Rebooting => "Rebooting",
            Phase::WaitingForNode => "WaitingForNode",
            Phase::Done => "Done",
            Phase::Failed => "Failed",
        }
    }
}

/// The object an Event is about.
#[derive(Debug, Clone)]
pub(crate) struct Subject {
    /// `Machine` or `Node`.
    pub kind: &'static str,
    /// `cluster.x-k8s.io/v1beta2` or `v1`.
    pub api_version: &'static str,
    /// The object's namespace; `None` for a Node (its Events go to `default`).
    pub namespace: Option<String>,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid` ("" when unknown).
    pub uid: String,
}

/// The Event's name: `<object>.<16 hex of SHA-256 of operation, reason, message>`.
pub(crate) fn event_name(s: &Subject, op: &str, reason: &str, message: &str) -> String {
    let mut h = Sha256::new();
    for part in [s.kind, op, reason, message] {
        h.update(part.as_bytes());
        h.update(b"\0");
    }
    let name: String = s.name.chars().take(200).collect();
    format!("{name}.{}", &hex::encode(h.finalize())[..16])
}

/// Creates an Event on `s` (`Warning` when `warning`); failures are logged, never
/// returned: an Event is a report, not a step of the update.
pub(crate) async fn emit(
    client: &kube::Client,
    s: &Subject,
    op: &str,
    reason: &str,
    message: &str,
    warning: bool,
) {
    let ns = s.namespace.clone().unwrap_or_else(|| "default".into());
    let now = Time(jiff_now());
    let ev = Event {
        metadata: kube::api::ObjectMeta {
            name: Some(event_name(s, op, reason, message)),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some(s.api_version.into()),
            kind: Some(s.kind.into()),
            name: Some(s.name.clone()),
            namespace: s.namespace.clone(),
            uid: (!s.uid.is_empty()).then(|| s.uid.clone()),
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(message.chars().take(MESSAGE_CHARS).collect()),
        type_: Some(if warning { "Warning" } else { "Normal" }.into()),
        source: Some(EventSource {
            component: Some("inplace-extension".into()),
            host: None,
        }),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Default::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), &ns);
    match api.create(&PostParams::default(), &ev).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => {
            tracing::warn!(kind = s.kind, name = %s.name, reason, error = %e, "could not create an Event")
        }
    }
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

/// Sets the Machine's phase annotations to `phase` of operation `op` (a merge patch;
/// nothing when `current` already says so). Errors are the message.
pub(crate) async fn set_phase(
    mgmt: &kube::Client,
    ns: &str,
    name: &str,
    current: &std::collections::BTreeMap<String, String>,
    op: &str,
    phase: Phase,
) -> Result<bool, String> {
    if current.get(PHASE).map(String::as_str) == Some(phase.name())
        && current.get(PHASE_OPERATION).map(String::as_str) == Some(op)
    {
        return Ok(false);
    }
    let api: Api<DynamicObject> = Api::namespaced_with(mgmt.clone(), ns, &machine_resource());
    let p = json!({"metadata": {"annotations": {PHASE: phase.name(), PHASE_OPERATION: op}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&p))
        .await
        .map_err(|e| format!("annotating Machine {ns}/{name}: {e}"))?;
    Ok(true)
}

/// When the wait of clock `key` ([`WAITING_FOR_NODE`], [`WAITING_FOR_CLUSTER`]) began for
/// operation `op`, from the Machine's `annotations`; `None` when absent, of another
/// operation or not a time.
pub(crate) fn waiting_since(
    annotations: &std::collections::BTreeMap<String, String>,
    key: &str,
    op: &str,
) -> Option<k8s_openapi::jiff::Timestamp> {
    let (of, at) = annotations.get(key)?.split_once(' ')?;
    (of == op).then(|| at.parse().ok()).flatten()
}

/// Starts the clock `key` of a wait: the annotation = `<op> <now>` on the Machine (a merge
/// patch). Errors are the message.
pub(crate) async fn mark_waiting(
    mgmt: &kube::Client,
    ns: &str,
    name: &str,
    key: &str,
    op: &str,
) -> Result<(), String> {
    let api: Api<DynamicObject> = Api::namespaced_with(mgmt.clone(), ns, &machine_resource());
    let v = format!("{op} {}", jiff_now());
    let p = json!({"metadata": {"annotations": {key: v}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&p))
        .await
        .map(|_| ())
        .map_err(|e| format!("annotating Machine {ns}/{name}: {e}"))
}

/// The longest Event message this extension writes, in characters (the API server's own
/// limit on `message` is 1 KiB in `events.k8s.io/v1`; the core Event is cut here too).
pub(crate) const MESSAGE_CHARS: usize = 1024;

/// `text` cut to at most `max` characters, ending in "…" when cut.
pub(crate) fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_clock_is_of_its_operation_only() {
        let mut a = std::collections::BTreeMap::new();
        assert_eq!(waiting_since(&a, WAITING_FOR_NODE, "op-1"), None);
        a.insert(WAITING_FOR_NODE.into(), "op-1 2026-12-02T08:00:00Z".into());
        assert_eq!(
            waiting_since(&a, WAITING_FOR_NODE, "op-1").map(|t| t.as_second()),
            Some(1_796_198_400)
        );
        assert_eq!(waiting_since(&a, WAITING_FOR_NODE, "op-2"), None);
        a.insert(WAITING_FOR_NODE.into(), "op-1 yesterday".into());
        assert_eq!(waiting_since(&a, WAITING_FOR_NODE, "op-1"), None);
    }

    #[test]
    fn event_names_are_stable_per_step() {
        let s = Subject {
            kind: "Node",
            api_version: "v1",
            namespace: None,
            name: "n1".into(),
            uid: String::new(),
        };
        let a = event_name(&s, "op", "Cordoned", "m");
        assert_eq!(a, event_name(&s, "op", "Cordoned", "m"));
        assert!(a.starts_with("n1.") && a.len() == 3 + 16, "{a}");
        assert_ne!(a, event_name(&s, "op", "Drained", "m"));
        assert_ne!(a, event_name(&s, "op2", "Cordoned", "m"));
        assert_eq!(Phase::WaitingForNode.name(), "WaitingForNode");
    }

    #[test]
    fn shorten_cuts_with_an_ellipsis_within_the_limit() {
        assert_eq!(super::shorten("abc", 3), "abc");
        assert_eq!(super::shorten("abcdef", 4), "abc…");
        assert_eq!(super::shorten("ééééé", 3).chars().count(), 3);
    }
}
