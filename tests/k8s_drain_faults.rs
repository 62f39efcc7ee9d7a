//! Regression tests for faults found in the extension's drain (from branch wt/breakit),
//! against the real kube-apiserver (tests/k8s/run.sh harness; run with
//! `INPLACED_K8S_BIN=/var/cache/inplaced-k8s/<ver>/bin cargo test --test
//! k8s_drain_faults -- --ignored --test-threads=1`).

mod common;
#[path = "k8s/harness.rs"]
mod harness;
#[path = "k8s/kubelet.rs"]
mod kubelet;
#[path = "k8s/scene.rs"]
mod scene;

use std::time::{Duration, Instant};

use common::capi::{Extension, Pki};
use harness::Cluster;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use scene::*;
use serde_json::{Value, json};

async fn machine(c: &Cluster, kubeconfig: &str) {
    machine_t(c, kubeconfig, 600).await
}

async fn machine_t(c: &Cluster, kubeconfig: &str, drain_timeout: u64) {
    scene::machine_with(c, kubeconfig, drain_timeout, json!([])).await
}

async fn drive(
    c: &Cluster,
    ext: &Extension,
    node: &mut common::Node,
    secs: u64,
) -> (Vec<String>, Value) {
    let req = reboot_request();
    let mut seen = Vec::new();
    let mut rebooted = false;
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let r = ext.update_machine(&req).await;
        seen.push(r["message"].as_str().unwrap_or("").to_string());
        if r["status"] == "Failure" || r["retryAfterSeconds"] == 0 || Instant::now() > deadline {
            return (seen, r);
        }
        if !rebooted && node.actions().iter().any(|a| a.starts_with("reboot")) {
            reboot(node);
            kubelet::node_status(c, NODE, true, BOOT_2).await;
            rebooted = true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// An administrator cordoned the Node; the Node still carries
/// `inplaced.io/cordoned-by-extension: "true"` left from an earlier, failed update (the
/// operator ran `kubectl uncordon` but did not remove the annotations, or anyone who may
/// patch Nodes set it). `node::cordon_patch` keeps the stale claim (`ours_before`) on a
/// cordon it did not set, and `release_patch` then uncordons the administrator's Node.
/// Expected right behaviour (README "Draining": "uncordoned, only if this extension
/// cordoned it"): the Node stays cordoned (Event LeftCordoned).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/k8s/run.sh"]
async fn a_stale_cordon_claim_leaves_the_administrators_cordon() {
    let c = Cluster::start().await;
    machine(&c, &std::fs::read_to_string(&c.ext_kubeconfig).unwrap()).await;
    let nodes: Api<Node> = Api::all(c.admin().await);
    let p = json!({"spec": {"unschedulable": true},
        "metadata": {"annotations": {"inplaced.io/cordoned-by-extension": "true",
                                      "inplaced.io/drain-operation": "an-old-failed-op"}}});
    nodes
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();

    let (_pki, mut node, ext) = scene::start(&c, "");
    let (seen, done) = drive(&c, &ext, &mut node, 60).await;
    assert_eq!(done["status"], "Success", "{seen:#?}");
    let n = nodes.get(NODE).await.unwrap();
    assert_eq!(
        n.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "the administrator's cordon was lifted by the extension; messages: {seen:#?}"
    );
    let ann = n.metadata.annotations.unwrap_or_default();
    assert!(
        !ann.contains_key("inplaced.io/cordoned-by-extension")
            && !ann.contains_key("inplaced.io/drain-operation"),
        "{ann:?}"
    );
}

/// The `<cluster>-kubeconfig` Secret holds garbage whose text includes a credential.
/// Expected right behaviour (guide: "Secrets never in logs"): the UpdateMachine answer
/// and the extension's log name the Secret, never its content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/k8s/run.sh"]
async fn a_garbage_kubeconfig_secret_is_not_echoed() {
    let c = Cluster::start().await;
    // a bearer token pasted as the value instead of a kubeconfig
    let garbage = "eyJhbGciOiJSUzI1NiJ9.SECRET-TOKEN-0123456789";
    machine(&c, garbage).await;
    let (_pki, mut node, ext) = scene::start(&c, "");
    let (seen, _) = drive(&c, &ext, &mut node, 6).await;
    let all = seen.join("\n");
    assert!(
        !all.contains("SECRET-TOKEN"),
        "the hook answer echoes the Secret: {all}"
    );
    assert!(
        !ext.log().contains("SECRET-TOKEN"),
        "the log echoes the Secret"
    );
    assert!(
        all.contains("Secret site-a/edge-1-kubeconfig key `value` is not a kubeconfig"),
        "the answer does not name the Secret and the problem: {all}"
    );
}

async fn blocked_drain(c: &Cluster) -> (Pki, common::Node, Extension, Api<Node>) {
    machine_t(c, &std::fs::read_to_string(&c.ext_kubeconfig).unwrap(), 3).await;
    kubelet::node(c, "other", "33333333-3333-3333-3333-333333333333").await;
    kubelet::replicated(c, "web", &[NODE, "other"], 2).await;
    kubelet::wait_budget(c, "web", |a| a == 0).await;
    let (pki, node, ext) = scene::start(c, "");
    let nodes: Api<Node> = Api::all(c.admin().await);
    (pki, node, ext, nodes)
}

/// An administrator (or a tool) uncordons the Node in the middle of the extension's
/// drain. Expected right behaviour: the drain does not go on (and the reboot never
/// happens) on a schedulable Node: it cordons again, or fails naming the uncordon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/k8s/run.sh"]
async fn an_uncordon_mid_drain_is_cordoned_again() {
    let c = Cluster::start().await;
    let (_pki, _node, ext, nodes) = blocked_drain(&c).await;
    let req = reboot_request();
    let r = ext.update_machine(&req).await;
    eprintln!("1: {}", r["message"]);
    let p = json!({"spec": {"unschedulable": null}});
    nodes
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = ext.update_machine(&req).await;
    eprintln!("2: {}", r["message"]);
    let n = nodes.get(NODE).await.unwrap();
    assert_eq!(
        n.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "the drain goes on with the Node schedulable: {}",
        r["message"]
    );
    assert_ne!(r["status"], "Failure", "{}", r["message"]);
    let op = n.metadata.annotations.as_ref().unwrap()["inplaced.io/drain-operation"].clone();
    assert_eq!(
        n.metadata.annotations.as_ref().unwrap()["inplaced.io/cordoned-by-extension"],
        op
    );
    // the real API server attributes the cordon to the extension's field manager (what a
    // retry's take-over of its own cordon checks)
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
        .map(|m| m.manager.clone().unwrap_or_default())
        .collect();
    assert_eq!(owners, ["inplace-extension"]);
}

/// The Node's `inplaced.io/drain-started` is not a timestamp (tampered). Expected right
/// behaviour: the drain still ends at its deadline (3 s here), or the bad annotation is
/// named; `elapsed` falls back to 0 in flow.rs, so the deadline never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/k8s/run.sh"]
async fn a_garbage_drain_started_restarts_the_deadline() {
    let c = Cluster::start().await;
    let (_pki, _node, ext, nodes) = blocked_drain(&c).await;
    let req = reboot_request();
    let r = ext.update_machine(&req).await;
    eprintln!("1: {}", r["message"]);
    let p = json!({"metadata": {"annotations": {"inplaced.io/drain-started": "yesterday"}}});
    nodes
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap();
    let r = ext.update_machine(&req).await;
    assert!(
        r["message"]
            .as_str()
            .unwrap_or("")
            .contains("inplaced.io/drain-started was not an RFC 3339 time"),
        "{}",
        r["message"]
    );
    let t0 = Instant::now();
    let mut last = Value::Null;
    while t0.elapsed() < Duration::from_secs(8) {
        last = ext.update_machine(&req).await;
        if last["status"] == "Failure" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        last["status"], "Failure",
        "8 s into a 3 s drain deadline: {}",
        last["message"]
    );
    assert!(
        last["message"]
            .as_str()
            .unwrap_or("")
            .contains("did not finish within 3 s"),
        "{}",
        last["message"]
    );
}

/// Pods with odd owners and budgets on the drained Node: a bare Pod, a Job's Pod, a Pod
/// with emptyDir, a Pod owned by a deleted DaemonSet, a Pod under two budgets (the
/// Eviction API answers 500), a Pod under a maxUnavailable 0 budget. Expected right
/// behaviour (README "Draining"): the first three and the DaemonSet orphan evicted (as
/// CAPI's drain with `Force` does); the last two left, each named with the server's cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/k8s/run.sh"]
async fn odd_pods_and_budgets() {
    let c = Cluster::start().await;
    machine(&c, &std::fs::read_to_string(&c.ext_kubeconfig).unwrap()).await;
    let owner = |kind: &str, api: &str| {
        json!({"metadata": {"ownerReferences": [{"apiVersion": api, "kind": kind, "name": "gone",
            "uid": "9d0c2a52-0000-4000-8000-000000000001", "controller": true}]}})
    };
    kubelet::pod(&c, "bare", NODE, json!({})).await;
    kubelet::pod(&c, "jobpod", NODE, owner("Job", "batch/v1")).await;
    kubelet::pod(&c, "orphan-ds", NODE, owner("DaemonSet", "apps/v1")).await;
    kubelet::pod(
        &c,
        "ed",
        NODE,
        json!({"spec": {"volumes": [{"name": "s", "emptyDir": {}}]}}),
    )
    .await;
    kubelet::pod(
        &c,
        "two",
        NODE,
        json!({"metadata": {"labels": {"two": "x"}}}),
    )
    .await;
    kubelet::pod(
        &c,
        "mu0",
        NODE,
        json!({"metadata": {"labels": {"mu0": "x"}}}),
    )
    .await;
    for (name, sel, spec) in [
        ("two-a", "two", json!({"minAvailable": 0})),
        ("two-b", "two", json!({"minAvailable": 0})),
        ("mu0", "mu0", json!({"maxUnavailable": 0})),
    ] {
        let mut s = spec;
        s["selector"] = json!({"matchLabels": {sel: "x"}});
        c.create(
            json!({"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "default"}, "spec": s}),
        )
        .await;
    }
    let (_pki, node, ext) = scene::start(&c, "");
    let req = reboot_request();
    let mut last = Value::Null;
    for _ in 0..12 {
        last = ext.update_machine(&req).await;
        kubelet::finish_terminating(&c, NODE).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let msg = last["message"].as_str().unwrap_or("").to_string();
    eprintln!("last: {msg}");
    eprintln!("left: {:?}", kubelet::pods_on(&c, NODE).await);
    assert!(
        msg.contains("2 Pods left (default/mu0, default/two)"),
        "{msg}"
    );
    assert_eq!(
        kubelet::pods_on(&c, NODE).await,
        ["default/mu0", "default/two"],
        "the orphaned DaemonSet Pod (or another) stayed"
    );
    assert!(
        node.actions().is_empty(),
        "the node was changed with Pods left: {:?}",
        node.actions()
    );
}

/// The `<cluster>-kubeconfig` Secret does not exist. Expected: the wait before the
/// cordon ends at the drain deadline (3 s) with a Failure naming the Secret; the Node is
/// not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/k8s/run.sh"]
async fn a_missing_kubeconfig_secret_fails_at_the_deadline() {
    let c = Cluster::start().await;
    machine_t(&c, "unused", 3).await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(c.admin().await, NS);
    secrets
        .delete("edge-1-kubeconfig", &Default::default())
        .await
        .unwrap();
    let (_pki, mut node, ext) = scene::start(&c, "");
    let (seen, done) = drive(&c, &ext, &mut node, 10).await;
    assert_eq!(done["status"], "Failure", "{seen:#?}");
    let msg = done["message"].as_str().unwrap_or("");
    assert!(msg.contains("Secret site-a/edge-1-kubeconfig"), "{msg}");
    assert!(msg.contains("drain deadline, 3 s"), "{msg}");
    // the clock is on the Machine, so every replica counts the same one
    let ann = machine_annotations(&c).await;
    let clock = ann["inplaced.io/waiting-for-cluster"]
        .as_str()
        .unwrap_or("");
    assert!(clock.starts_with("capi-site-a-edge-1-cp-7xk2p-"), "{ann}");
    let nodes: Api<Node> = Api::all(c.admin().await);
    let n = nodes.get(NODE).await.unwrap();
    assert_eq!(n.spec.as_ref().and_then(|s| s.unschedulable), None);
    assert!(node.actions().is_empty(), "{:?}", node.actions());
}

/// The node rebooted and its agent reports the change done, but the Node never shows
/// the new boot id (the kubelet does not come back). Expected: UpdateMachine waits,
/// counting against `cluster.node_back_timeout_seconds` (3 s here), then answers
/// `Failure` naming what it waits for; the Machine's phase is Failed with a Warning
/// Event, and the Node stays cordoned. Once the Node is back, the next call of the same
/// operation releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/k8s/run.sh"]
async fn a_node_that_does_not_come_back_fails_at_the_deadline() {
    let c = Cluster::start().await;
    machine(&c, &std::fs::read_to_string(&c.ext_kubeconfig).unwrap()).await;
    let (_pki, mut node, ext) = scene::start(&c, "node_back_timeout_seconds = 3\n");
    let req = reboot_request();
    let mut seen = Vec::new();
    let mut rebooted = false;
    let t0 = Instant::now();
    let mut last = Value::Null;
    while t0.elapsed() < Duration::from_secs(40) {
        last = ext.update_machine(&req).await;
        seen.push(last["message"].as_str().unwrap_or("").to_string());
        if last["status"] == "Failure" || last["retryAfterSeconds"] == 0 {
            break;
        }
        if !rebooted && node.actions().iter().any(|a| a.starts_with("reboot")) {
            reboot(&mut node); // the kubelet never reports BOOT_2
            rebooted = true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(last["status"], "Failure", "{seen:#?}");
    let msg = last["message"].as_str().unwrap_or("");
    assert!(
        msg.contains(&format!(
            "Node {NODE}: waiting for the Node to report a new boot id after the reboot (still {BOOT_1})"
        )) && msg.contains("not back within 3 s after the node agent finished"),
        "{msg}"
    );
    assert!(
        seen.iter().any(|m| m.ends_with("(0 s of 3 s)")),
        "the wait does not show its clock: {seen:#?}"
    );
    let ann = machine_annotations(&c).await;
    assert_eq!(ann["inplaced.io/phase"], "Failed", "{ann}");
    let waiting = ann["inplaced.io/waiting-for-node"].as_str().unwrap_or("");
    assert!(
        waiting.starts_with(ann["inplaced.io/operation"].as_str().unwrap()),
        "{ann}"
    );
    let ev = events(&c, NS, "Machine", MACHINE).await;
    assert!(
        ev.iter()
            .any(|(r, m)| r == "UpdateFailed" && m.contains("not back within 3 s")),
        "{ev:#?}"
    );
    assert!(
        unschedulable(&node_obj(&c).await),
        "the Node was uncordoned"
    );

    // the Node comes back late: the same operation is released and done
    kubelet::node_status(&c, NODE, true, BOOT_2).await;
    let done = ext.update_machine(&req).await;
    assert_eq!(done["status"], "Success", "{done}");
    assert_eq!(done["retryAfterSeconds"], 0, "{done}");
    assert!(!unschedulable(&node_obj(&c).await));
    assert_eq!(machine_annotations(&c).await["inplaced.io/phase"], "Done");
}
