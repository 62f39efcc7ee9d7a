//! The Node side of an update, pure: the drain state recorded in the Node's annotations
//! (so another replica, or this one restarted, continues the same drain), the cordon and
//! uncordon patches, and when the Node counts as back (`Ready`, a new boot id after a
//! reboot, the target kubelet version).
//!
//! Annotations on the Node, all removed when the update ends:
//! - [`OPERATION`]: the in-place operation id the Node is drained for;
//! - [`DRAIN_STARTED`]: when that drain started (RFC 3339), the start of its deadline;
//! - [`CORDONED`]: the operation id for which this extension set `spec.unschedulable`
//!   (a claim of another operation, or `"true"` of an older version, does not count: a
//!   Node cordoned when an operation's drain starts is never uncordoned by it);
//! - [`BOOT_ID`]: `status.nodeInfo.bootID` when the drain started, to see the reboot.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

/// The operation id the Node is drained for.
pub(crate) const OPERATION: &str = "inplaced.io/drain-operation";
/// When the drain started (RFC 3339, UTC).
pub(crate) const DRAIN_STARTED: &str = "inplaced.io/drain-started";
/// The operation id this extension cordoned the Node for (it uncordons only then).
pub(crate) const CORDONED: &str = "inplaced.io/cordoned-by-extension";
/// The field manager of the extension's Node patches: the Node's `managedFields` then
/// say whether `spec.unschedulable` was last set by this extension.
pub(crate) const FIELD_MANAGER: &str = "inplace-extension";
/// The Node's boot id when the drain started.
pub(crate) const BOOT_ID: &str = "inplaced.io/boot-id-before";

/// The drain state an earlier call recorded on the Node, when it is for `op`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DrainState {
    /// When the drain started (RFC 3339).
    pub started: String,
    /// Whether this extension cordoned the Node.
    pub cordoned_by_us: bool,
    /// The boot id when the drain started ("" if the Node reported none).
    pub boot_id: String,
}

fn annotations(n: &Node) -> BTreeMap<String, String> {
    n.metadata.annotations.clone().unwrap_or_default()
}

/// Whether the Node is cordoned (`spec.unschedulable`).
pub(crate) fn unschedulable(n: &Node) -> bool {
    n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

/// `status.nodeInfo.bootID` ("" when absent).
pub(crate) fn boot_id(n: &Node) -> String {
    n.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.clone())
        .unwrap_or_default()
}

/// Whether the Node's `spec.unschedulable` was last set by this extension: its
/// `managedFields` entry owning `f:spec.f:unschedulable` is [`FIELD_MANAGER`]'s (an
/// administrator's `kubectl cordon` after our cordon moves it to kubectl's manager).
pub(crate) fn cordon_set_by_us(n: &Node) -> bool {
    let owners: Vec<_> = n
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:spec/f:unschedulable").is_some())
        })
        .collect();
    !owners.is_empty()
        && owners
            .iter()
            .all(|m| m.manager.as_deref() == Some(FIELD_MANAGER))
}

/// The drain state recorded for operation `op`, if any.
pub(crate) fn drain_state(n: &Node, op: &str) -> Option<DrainState> {
    let a = annotations(n);
    (a.get(OPERATION).map(String::as_str) == Some(op)).then(|| DrainState {
        started: a.get(DRAIN_STARTED).cloned().unwrap_or_default(),
        cordoned_by_us: a.get(CORDONED).map(String::as_str) == Some(op),
        boot_id: a.get(BOOT_ID).cloned().unwrap_or_default(),
    })
}

/// The merge patch that starts the drain for `op` at `now`: cordons the Node unless it
/// is cordoned already, and records the state. The cordon is claimed (for `op`) when
/// this patch sets it, or when an earlier operation's claim (its own id, on its own
/// state) is on a cordon the Node's managedFields show this extension set
/// ([`cordon_set_by_us`]: a retry after a failed update); any other claim (`"true"`,
/// another operation's, a cordon since set by an administrator) is dropped. The `resourceVersion` makes two replicas' patches
/// conflict instead of both succeeding, and the cordon and its claim land together.
pub(crate) fn cordon_patch(n: &Node, op: &str, now: &str) -> Value {
    let cordon = !unschedulable(n);
    // a retry after a failed update takes over its own earlier cordon, only when the
    // Node's managedFields show the cordon is still the one this extension set
    let a = annotations(n);
    let take_over = !cordon
        && a.get(CORDONED)
            .is_some_and(|c| c == a.get(OPERATION).map_or("", String::as_str))
        && cordon_set_by_us(n);
    let mut ann = serde_json::Map::new();
    ann.insert(OPERATION.into(), json!(op));
    ann.insert(DRAIN_STARTED.into(), json!(now));
    ann.insert(BOOT_ID.into(), json!(boot_id(n)));
    ann.insert(
        CORDONED.into(),
        if cordon || take_over {
            json!(op)
        } else {
            Value::Null
        },
    );
    let mut p = json!({
        "metadata": {
            "resourceVersion": n.metadata.resource_version,
            "annotations": ann,
        }
    });
    if cordon {
        p["spec"] = json!({"unschedulable": true});
    }
    p
}

/// The merge patch that cordons again a Node found schedulable in the middle of `op`'s
/// drain (someone ran `kubectl uncordon`): the cordon is set by this extension now, so
/// it is claimed for `op`.
pub(crate) fn recordon_patch(n: &Node, op: &str) -> Value {
    json!({
        "metadata": {
            "resourceVersion": n.metadata.resource_version,
            "annotations": {CORDONED: op},
        },
        "spec": {"unschedulable": true},
    })
}

/// Seconds since the drain started at `started` (RFC 3339) as of `now`; `None` when it
/// is not a time or lies more than a minute ahead of `now` (tampered, or a clock far
/// off): the caller restarts the clock, so the deadline always comes.
pub(crate) fn drain_elapsed(started: &str, now: k8s_openapi::jiff::Timestamp) -> Option<i64> {
    let s = started.parse::<k8s_openapi::jiff::Timestamp>().ok()?;
    let secs = now.duration_since(s).as_secs();
    (secs >= -60).then_some(secs.max(0))
}

/// The merge patch that ends operation `op` on the Node: uncordons it when this
/// extension cordoned it for `op` ([`CORDONED`] is `op`), and removes the state. `None`
/// when there is nothing to remove.
pub(crate) fn release_patch(n: &Node, op: &str) -> Option<Value> {
    let a = annotations(n);
    if ![OPERATION, DRAIN_STARTED, CORDONED, BOOT_ID]
        .iter()
        .any(|k| a.contains_key(*k))
    {
        return None;
    }
    let ours = a.get(CORDONED).map(String::as_str) == Some(op)
        && a.get(OPERATION).map(String::as_str) == Some(op);
    let mut p = json!({
        "metadata": {
            "resourceVersion": n.metadata.resource_version,
            "annotations": {OPERATION: null, DRAIN_STARTED: null, CORDONED: null, BOOT_ID: null},
        }
    });
    if ours {
        p["spec"] = json!({"unschedulable": null});
    }
    Some(p)
}

/// The Ready condition's `lastHeartbeatTime`, Unix seconds.
pub(crate) fn ready_heartbeat(n: &Node) -> Option<i64> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?
        .last_heartbeat_time
        .as_ref()
        .map(|t| t.0.as_second())
}

/// What the Node lacks to count as back after the update, or `Ok`: the `Ready`
/// condition `True`; a boot id other than `boot_before` when the update rebooted
/// (`Some`); `status.nodeInfo.kubeletVersion` equal to `kubelet` when the update set a
/// version (compared as Kubernetes versions: `v1.34.2` = `1.34.2`).
pub(crate) fn back(
    n: &Node,
    boot_before: Option<&str>,
    kubelet: Option<&str>,
) -> Result<(), String> {
    let st = n.status.as_ref();
    let ready = st
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Ready");
    match ready {
        Some(c) if c.status == "True" => {}
        Some(c) => {
            return Err(format!(
                "waiting for the Node to be Ready (Ready is {}{})",
                c.status,
                c.message
                    .as_deref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            ));
        }
        None => return Err("waiting for the Node to report a Ready condition".into()),
    }
    let now = boot_id(n);
    if let Some(before) = boot_before.filter(|b| !b.is_empty())
        && now == before
    {
        return Err(format!(
            "waiting for the Node to report a new boot id after the reboot (still {now})"
        ));
    }
    if let Some(want) = kubelet {
        let have = st
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.kubelet_version.as_str())
            .unwrap_or("");
        if want.trim_start_matches('v') != have.trim_start_matches('v') {
            return Err(format!(
                "waiting for the Node's kubelet to report {want} (it reports {have:?})"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo};

    fn node(unsched: bool, ann: &[(&str, &str)], ready: &str, boot: &str, kubelet: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n".into());
        n.metadata.resource_version = Some("7".into());
        n.metadata.annotations = Some(
            ann.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        n.spec = Some(NodeSpec {
            unschedulable: unsched.then_some(true),
            ..Default::default()
        });
        n.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                ..Default::default()
            }]),
            node_info: Some(NodeSystemInfo {
                boot_id: boot.into(),
                kubelet_version: kubelet.into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        n
    }

    #[test]
    fn cordons_only_a_schedulable_node_and_records_it() {
        let p = cordon_patch(&node(false, &[], "True", "b1", "v1.20.2"), "op1", "T");
        assert_eq!(p["spec"]["unschedulable"], true);
        assert_eq!(p["metadata"]["annotations"][CORDONED], "op1");
        assert_eq!(p["metadata"]["annotations"][OPERATION], "op1");
        assert_eq!(p["metadata"]["annotations"][BOOT_ID], "b1");
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        // an administrator's cordon: recorded as not ours
        let p = cordon_patch(&node(true, &[], "True", "b1", ""), "op1", "T");
        assert!(p.get("spec").is_none());
        assert_eq!(p["metadata"]["annotations"][CORDONED], Value::Null);
        // a claim of an earlier operation on a cordoned Node is dropped (breakit: an
        // administrator's cordon with a stale claim)
        for stale in ["true", "op0"] {
            let n = node(
                true,
                &[(OPERATION, "op0"), (CORDONED, stale)],
                "True",
                "b",
                "",
            );
            let p = cordon_patch(&n, "op1", "T");
            assert_eq!(p["metadata"]["annotations"][CORDONED], Value::Null);
            assert!(p.get("spec").is_none(), "{p}");
            assert_eq!(drain_state(&n, "op1"), None);
        }
        let p = cordon_patch(
            &node(false, &[(CORDONED, "true")], "True", "b", ""),
            "op1",
            "T",
        );
        assert_eq!(p["metadata"]["annotations"][CORDONED], "op1");
    }

    #[test]
    fn uncordons_only_its_own_cordon() {
        let ours = node(true, &[(OPERATION, "op"), (CORDONED, "op")], "True", "", "");
        assert!(drain_state(&ours, "op").unwrap().cordoned_by_us);
        let p = release_patch(&ours, "op").unwrap();
        assert_eq!(p["spec"]["unschedulable"], Value::Null);
        assert!(p["spec"].as_object().unwrap().contains_key("unschedulable"));
        let admins = node(true, &[(OPERATION, "op")], "True", "", "");
        let p = release_patch(&admins, "op").unwrap();
        assert!(p.get("spec").is_none(), "{p}");
        assert_eq!(p["metadata"]["annotations"][OPERATION], Value::Null);
        assert_eq!(release_patch(&node(true, &[], "True", "", ""), "op"), None);
        // a stale or forged claim: "true", another operation's id
        for (o, c) in [("op", "true"), ("op", "op0"), ("op0", "op0")] {
            let n = node(true, &[(OPERATION, o), (CORDONED, c)], "True", "", "");
            let p = release_patch(&n, "op").unwrap();
            assert!(p.get("spec").is_none(), "{o} {c}: {p}");
            assert!(!drain_state(&n, "op").is_some_and(|s| s.cordoned_by_us));
        }
    }

    #[test]
    fn a_retry_takes_over_only_a_cordon_we_set() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
        let owned = |manager: &str| ManagedFieldsEntry {
            manager: Some(manager.into()),
            fields_v1: Some(FieldsV1(json!({"f:spec": {"f:unschedulable": {}}}))),
            ..Default::default()
        };
        let left = [(OPERATION, "op0"), (CORDONED, "op0")];
        let mut n = node(true, &left, "True", "b", "");
        n.metadata.managed_fields = Some(vec![owned(FIELD_MANAGER)]);
        let p = cordon_patch(&n, "op1", "T");
        assert_eq!(p["metadata"]["annotations"][CORDONED], "op1");
        assert!(p.get("spec").is_none(), "{p}");
        // kubectl uncordon + cordon since: the cordon is kubectl's
        n.metadata.managed_fields = Some(vec![owned("kubectl-cordon")]);
        assert_eq!(
            cordon_patch(&n, "op1", "T")["metadata"]["annotations"][CORDONED],
            Value::Null
        );
        // a claim that is not its operation's own ("true", forged)
        let mut n = node(
            true,
            &[(OPERATION, "op0"), (CORDONED, "true")],
            "True",
            "b",
            "",
        );
        n.metadata.managed_fields = Some(vec![owned(FIELD_MANAGER)]);
        assert_eq!(
            cordon_patch(&n, "op1", "T")["metadata"]["annotations"][CORDONED],
            Value::Null
        );
    }

    #[test]
    fn recordon_claims_for_the_operation() {
        let n = node(false, &[(OPERATION, "op")], "True", "", "");
        let p = recordon_patch(&n, "op");
        assert_eq!(p["spec"]["unschedulable"], true);
        assert_eq!(p["metadata"]["annotations"][CORDONED], "op");
        assert_eq!(p["metadata"]["resourceVersion"], "7");
    }

    #[test]
    fn drain_elapsed_rejects_garbage_and_the_future() {
        let now: k8s_openapi::jiff::Timestamp = "2026-12-02T06:00:00Z".parse().unwrap();
        assert_eq!(drain_elapsed("2026-12-02T05:59:00Z", now), Some(60));
        assert_eq!(drain_elapsed("2026-12-02T06:00:30Z", now), Some(0));
        assert_eq!(drain_elapsed("2026-12-02T07:00:00Z", now), None);
        assert_eq!(drain_elapsed("yesterday", now), None);
        assert_eq!(drain_elapsed("", now), None);
    }

    #[test]
    fn back_needs_ready_new_boot_and_version() {
        assert_eq!(
            back(
                &node(false, &[], "True", "b2", "v1.34.2"),
                Some("b1"),
                Some("v1.34.2")
            ),
            Ok(())
        );
        assert!(
            back(&node(false, &[], "False", "b2", ""), None, None)
                .unwrap_err()
                .contains("Ready is False")
        );
        assert!(
            back(&node(false, &[], "True", "b1", ""), Some("b1"), None)
                .unwrap_err()
                .contains("new boot id")
        );
        assert_eq!(
            back(&node(false, &[], "True", "b1", ""), None, None),
            Ok(())
        );
        assert!(
            back(
                &node(false, &[], "True", "b2", "v1.33.0"),
                Some("b1"),
                Some("1.34.2")
            )
            .unwrap_err()
            .contains("1.34.2")
        );
        assert_eq!(
            back(
                &node(false, &[], "True", "b", "v1.34.2"),
                None,
                Some("1.34.2")
            ),
            Ok(())
        );
    }
}
