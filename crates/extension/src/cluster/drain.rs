//! Drain decisions, pure: which of a Node's Pods are evicted, skipped or waited for, and
//! what an Eviction answer means. The rules follow Cluster API's Machine drain,
//! `core/reconcilers/machine/drain/filters.go` (kubernetes-sigs/cluster-api, main), which
//! follows `kubectl drain` (`k8s.io/kubectl/pkg/drain/filters.go`):
//!
//! - mirror (static) Pods, annotation `kubernetes.io/config.mirror`: skipped (the kubelet
//!   owns them; `mirrorPodFilter`);
//! - Pods whose controller is a DaemonSet, unless Succeeded or Failed: skipped (the
//!   DaemonSet would recreate them on the cordoned Node; `daemonSetFilter`), except an
//!   orphan, whose DaemonSet is gone (the drain reads it, [`daemon_set_of`]): evicted, as
//!   CAPI's drain with `Force: true` does (the later filters still apply to it);
//! - label `cluster.x-k8s.io/drain: skip`: skipped; `wait-completed`: not evicted, but the
//!   drain waits until it is gone (`drainLabelFilter`, `clusterv1.PodDrainLabel`);
//! - Pods with `emptyDir` volumes, unless Succeeded or Failed: evicted when
//!   `[cluster] evict_local_storage` (CAPI's `DeleteEmptyDirData: true`), else they block
//!   the drain, named (`kubectl drain` without `--delete-emptydir-data`;
//!   `localStorageFilter`);
//! - Pods without a controller: evicted (CAPI drains with `Force: true`;
//!   `unreplicatedFilter`);
//! - Pods already terminating (`deletionTimestamp` set): not evicted again, waited for.
//!
//! MachineDrainRules (CAPI's `MachineDrainRule` objects, ordering) are not read.

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

/// CAPI's drain label on Pods (`clusterv1.PodDrainLabel`).
pub(crate) const DRAIN_LABEL: &str = "cluster.x-k8s.io/drain";
/// The kubelet's mirror-Pod annotation (`corev1.MirrorPodAnnotationKey`).
pub(crate) const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// What the drain does with one Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PodAction {
    /// Evicted through the Eviction API; the drain waits until it is gone.
    Evict,
    /// Left on the Node; does not hold the drain (the reason, for the log).
    Skip(&'static str),
    /// Not evicted, but the drain waits until it is gone (the reason).
    Wait(&'static str),
    /// Holds the drain until the configuration or the Pod changes (the reason and fix).
    Refuse(String),
}

fn finished(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
}

/// The name of the DaemonSet that controls `pod`, when the Pod is not finished: the drain
/// reads that DaemonSet in the Pod's namespace, and a Pod whose DaemonSet is gone is an
/// orphan for [`classify`].
pub(crate) fn daemon_set_of(pod: &Pod) -> Option<&str> {
    if finished(pod) {
        return None;
    }
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "DaemonSet")
        .map(|o| o.name.as_str())
}

/// The action for `pod` (the order of CAPI's filters; the first that leaves the Pod wins);
/// `orphan`: its DaemonSet ([`daemon_set_of`]) is gone.
pub(crate) fn classify(pod: &Pod, evict_local_storage: bool, orphan: bool) -> PodAction {
    let md = &pod.metadata;
    if md
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
    {
        return PodAction::Skip("mirror Pod");
    }
    if daemon_set_of(pod).is_some() && !orphan {
        return PodAction::Skip("DaemonSet-managed Pod");
    }
    match md
        .labels
        .as_ref()
        .and_then(|l| l.get(DRAIN_LABEL))
        .map(|v| v.to_ascii_lowercase())
        .as_deref()
    {
        Some("skip") => return PodAction::Skip("label cluster.x-k8s.io/drain=skip"),
        Some("wait-completed") => {
            return PodAction::Wait("label cluster.x-k8s.io/drain=wait-completed");
        }
        _ => {}
    }
    if md.deletion_timestamp.is_some() {
        return PodAction::Wait("terminating");
    }
    let local = pod
        .spec
        .as_ref()
        .is_some_and(|s| s.volumes.iter().flatten().any(|v| v.empty_dir.is_some()));
    if local && !evict_local_storage && !finished(pod) {
        return PodAction::Refuse(
            "has emptyDir local storage, which [cluster] evict_local_storage = false keeps; move the Pod or allow it".into(),
        );
    }
    PodAction::Evict
}

/// What an Eviction request answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Evicted {
    /// 201/200: the Pod is being deleted.
    Yes,
    /// 404: the Pod is already gone.
    Gone,
    /// 429: a PodDisruptionBudget does not allow it now; the server's cause (names the
    /// budget: "The disruption budget web needs 2 healthy pods and has 2 currently").
    Blocked(String),
    /// Anything else (status code and message).
    Error(String),
}

/// Reads an Eviction answer: `code` and the body (a `meta/v1` Status, whose
/// `details.causes[].message` of type `DisruptionBudget` names the budget;
/// `pkg/registry/core/pod/storage/eviction.go`).
pub(crate) fn eviction_outcome(code: u16, body: &str) -> Evicted {
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let message = v["message"].as_str().unwrap_or(body).trim().to_string();
    match code {
        200 | 201 => Evicted::Yes,
        404 => Evicted::Gone,
        429 => {
            let causes: Vec<&str> = v["details"]["causes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["message"].as_str())
                .collect();
            Evicted::Blocked(if causes.is_empty() {
                message
            } else {
                causes.join("; ")
            })
        }
        _ => Evicted::Error(format!("HTTP {code}: {message}")),
    }
}

/// The Eviction object for `policy/<version>` of Pod `ns/name`.
pub(crate) fn eviction_body(version: &str, ns: &str, name: &str) -> Value {
    serde_json::json!({
        "apiVersion": format!("policy/{version}"),
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": ns},
    })
}

/// Which Eviction version to use, from the versions the server serves for group
/// `policy` (discovery): `v1` when served (Kubernetes 1.22+), else `v1beta1` (1.20 and
/// 1.21 serve only that; removed in 1.25).
pub(crate) fn eviction_version<'a>(served: impl IntoIterator<Item = &'a str>) -> &'static str {
    if served.into_iter().any(|v| v == "v1") {
        "v1"
    } else {
        "v1beta1"
    }
}

/// The `retryAfterSeconds` while a budget blocks the drain, `elapsed` seconds after it
/// started: the configured interval `base`, doubled every `4 × base` seconds up to
/// `8 × base` (30 s: 30, 60, 120, then 240 s), so a long-blocked drain does not poll the
/// API server at full rate; the deadline still ends it.
pub(crate) fn backoff(base: i32, elapsed: i64) -> i32 {
    let base = base.max(1);
    let steps = (elapsed.max(0) / (4 * i64::from(base))).min(3) as u32;
    base.saturating_mul(1 << steps)
}

/// The progress of a drain, for the answer and the Events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Pods that must still go (`namespace/name`), sorted.
    pub left: Vec<String>,
    /// Why some of them did not go at the last attempt (`namespace/name: cause`).
    pub blocked: Vec<String>,
    /// How many Pods were evicted in this pass.
    pub evicted: usize,
}

impl Progress {
    /// Whether nothing holds the drain.
    pub(crate) fn done(&self) -> bool {
        self.left.is_empty()
    }

    /// "2 Pods left (ns/a, ns/b); blocked: ns/a: The disruption budget ...".
    pub(crate) fn summary(&self) -> String {
        let mut s = format!(
            "{} Pod{} left ({})",
            self.left.len(),
            if self.left.len() == 1 { "" } else { "s" },
            self.left.join(", ")
        );
        if !self.blocked.is_empty() {
            s.push_str(&format!("; blocked: {}", self.blocked.join("; ")));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, PodSpec, PodStatus, Volume};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

    fn pod(f: impl FnOnce(&mut Pod)) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("p".into());
        p.metadata.namespace = Some("ns".into());
        f(&mut p);
        p
    }

    fn owned_by(kind: &str) -> impl FnOnce(&mut Pod) {
        let kind = kind.to_string();
        move |p: &mut Pod| {
            p.metadata.owner_references = Some(vec![OwnerReference {
                kind,
                controller: Some(true),
                name: "o".into(),
                api_version: "apps/v1".into(),
                uid: "u".into(),
                ..Default::default()
            }])
        }
    }

    fn phase(p: &mut Pod, ph: &str) {
        p.status = Some(PodStatus {
            phase: Some(ph.into()),
            ..Default::default()
        });
    }

    #[test]
    fn capi_filters_in_order() {
        assert_eq!(classify(&pod(|_| {}), false, false), PodAction::Evict);
        assert_eq!(
            classify(&pod(owned_by("ReplicaSet")), false, false),
            PodAction::Evict
        );
        assert_eq!(
            classify(&pod(owned_by("DaemonSet")), false, false),
            PodAction::Skip("DaemonSet-managed Pod")
        );
        let done_ds = pod(|p| {
            owned_by("DaemonSet")(p);
            phase(p, "Succeeded");
        });
        assert_eq!(classify(&done_ds, false, false), PodAction::Evict);
        // an orphan (its DaemonSet gone) is evicted; the later filters still apply
        assert_eq!(
            classify(&pod(owned_by("DaemonSet")), false, true),
            PodAction::Evict
        );
        let orphan_skip = pod(|p| {
            owned_by("DaemonSet")(p);
            p.metadata.labels = Some([(DRAIN_LABEL.to_string(), "skip".into())].into());
        });
        assert!(matches!(
            classify(&orphan_skip, false, true),
            PodAction::Skip(_)
        ));
        assert_eq!(daemon_set_of(&done_ds), None);
        let mirror = pod(|p| {
            p.metadata.annotations = Some([(MIRROR_ANNOTATION.to_string(), "x".into())].into())
        });
        assert_eq!(
            classify(&mirror, true, false),
            PodAction::Skip("mirror Pod")
        );
        let label = |v: &str| {
            let v = v.to_string();
            pod(move |p| p.metadata.labels = Some([(DRAIN_LABEL.to_string(), v)].into()))
        };
        assert!(matches!(
            classify(&label("Skip"), true, false),
            PodAction::Skip(_)
        ));
        assert!(matches!(
            classify(&label("wait-completed"), true, false),
            PodAction::Wait(_)
        ));
        assert_eq!(classify(&label("other"), true, false), PodAction::Evict);
        let terminating = pod(|p| p.metadata.deletion_timestamp = Some(Time(Default::default())));
        assert_eq!(
            classify(&terminating, true, false),
            PodAction::Wait("terminating")
        );
        let local = pod(|p| {
            p.spec = Some(PodSpec {
                volumes: Some(vec![Volume {
                    name: "scratch".into(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Default::default()
                }]),
                ..Default::default()
            })
        });
        assert_eq!(classify(&local, true, false), PodAction::Evict);
        assert!(
            matches!(classify(&local, false, false), PodAction::Refuse(m) if m.contains("emptyDir"))
        );
        let mut finished_local = local.clone();
        phase(&mut finished_local, "Failed");
        assert_eq!(classify(&finished_local, false, false), PodAction::Evict);
    }

    #[test]
    fn eviction_answers() {
        // the body kube-apiserver v1.20 answers when a budget blocks (eviction.go)
        let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"Cannot evict pod as it would violate the pod's disruption budget.","reason":"TooManyRequests","details":{"causes":[{"reason":"DisruptionBudget","message":"The disruption budget web needs 2 healthy pods and has 2 currently"}]},"code":429}"#;
        assert_eq!(
            eviction_outcome(429, body),
            Evicted::Blocked(
                "The disruption budget web needs 2 healthy pods and has 2 currently".into()
            )
        );
        let bare = r#"{"kind":"Status","message":"Cannot evict pod as it would violate the pod's disruption budget.","code":429}"#;
        assert_eq!(
            eviction_outcome(429, bare),
            Evicted::Blocked(
                "Cannot evict pod as it would violate the pod's disruption budget.".into()
            )
        );
        assert_eq!(eviction_outcome(201, "{}"), Evicted::Yes);
        assert_eq!(eviction_outcome(404, "{}"), Evicted::Gone);
        assert_eq!(
            eviction_outcome(403, r#"{"message":"forbidden"}"#),
            Evicted::Error("HTTP 403: forbidden".into())
        );
    }

    #[test]
    fn eviction_version_by_discovery() {
        assert_eq!(eviction_version(["v1", "v1beta1"]), "v1");
        assert_eq!(eviction_version(["v1beta1"]), "v1beta1");
        assert_eq!(
            eviction_body("v1beta1", "ns", "p")["apiVersion"],
            "policy/v1beta1"
        );
    }

    #[test]
    fn blocked_drains_back_off() {
        assert_eq!(
            [0, 119, 120, 240, 360, 10_000].map(|e| backoff(30, e)),
            [30, 30, 60, 120, 240, 240]
        );
        assert_eq!(backoff(0, 5), 2);
    }

    #[test]
    fn summary_names_pods_and_budget() {
        let p = Progress {
            left: vec!["ns/a".into(), "ns/b".into()],
            blocked: vec!["ns/b: The disruption budget web needs 2".into()],
            evicted: 1,
        };
        assert!(!p.done());
        assert_eq!(
            p.summary(),
            "2 Pods left (ns/a, ns/b); blocked: ns/b: The disruption budget web needs 2"
        );
        assert!(Progress::default().done());
    }
}
