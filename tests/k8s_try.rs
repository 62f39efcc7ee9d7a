//! Timed tries driven by the extension against the real kube-apiserver
//! (`[update] try_seconds`, README "Timed tries"): a live change is applied as a try and
//! confirmed only after the Node's kubelet reported after it; a node that goes silent
//! gets its change reverted by the agent at the deadline. Run by tests/k8s/run.sh.

mod common;
#[path = "k8s/harness.rs"]
mod harness;
#[path = "k8s/kubelet.rs"]
mod kubelet;
#[path = "k8s/scene.rs"]
mod scene;

use std::time::{Duration, Instant};

use common::capi::{fixture, update_request};
use harness::Cluster;
use scene::*;
use serde_json::{Value, json};

/// The fixture's live change (kubelet flags and a sysctl file: a kubelet restart), with
/// the ExtensionConfig setting `trySeconds` (as `[update] try_seconds` would set it).
fn live_request(try_seconds: u32) -> Value {
    let mut r = update_request(&fixture(
        "a-kubelet-args-and-sysctl/canupdatemachine-request.json",
    ));
    r["settings"]["trySeconds"] = json!(try_seconds.to_string());
    r
}

/// Calls UpdateMachine every 300 ms until `stop` says so of an answer, or `secs` pass;
/// returns every message and the last answer.
async fn poll(
    ext: &common::capi::Extension,
    try_seconds: u32,
    secs: u64,
    mut stop: impl FnMut(&Value) -> bool,
) -> (Vec<String>, Value) {
    let req = live_request(try_seconds);
    let (mut seen, t0) = (Vec::new(), Instant::now());
    loop {
        let r = ext.update_machine(&req).await;
        seen.push(r["message"].as_str().unwrap_or("").to_string());
        if stop(&r) || r["status"] == "Failure" || t0.elapsed() > Duration::from_secs(secs) {
            return (seen, r);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The try waits for the kubelet: a Node that is Ready but has not reported since the
/// change does not confirm it; once its Lease is renewed, the next call confirms the
/// try, the operation is `Succeeded` and the update done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/k8s/run.sh"]
async fn a_live_change_is_confirmed_after_the_kubelet_reports() {
    let c = Cluster::start().await;
    machine_with(
        &c,
        &std::fs::read_to_string(&c.ext_kubeconfig).unwrap(),
        600,
        json!([]),
    )
    .await;
    let (_pki, node, ext) = scene::start(&c, "");
    let (seen, r) = poll(&ext, 120, 60, |r| {
        r["message"]
            .as_str()
            .unwrap_or("")
            .contains("not confirmed yet")
    })
    .await;
    let msg = r["message"].as_str().unwrap_or("");
    assert_eq!(r["status"], "Success", "{seen:#?}");
    assert_ne!(
        r["retryAfterSeconds"], 0,
        "done before the kubelet reported: {seen:#?}"
    );
    assert!(
        msg.contains(&format!(
            "Node {NODE}: waiting for its kubelet to report after the change"
        )) && msg.contains("the node reverts the change in "),
        "{msg}"
    );
    let ops = node.operations().await;
    let op = ops.first().unwrap();
    assert_eq!(op.try_seconds, 120, "{op:?}");
    assert_eq!(
        inplace_wire::phase::name(pb_phase(op.phase)),
        "AwaitingConfirmation"
    );

    kubelet::renew_lease(&c, NODE).await;
    let (seen, done) = poll(&ext, 120, 30, |r| r["retryAfterSeconds"] == 0).await;
    assert_eq!(done["status"], "Success", "{seen:#?}");
    assert_eq!(done["retryAfterSeconds"], 0, "{seen:#?}");
    let op = node.operations().await.into_iter().next().unwrap();
    assert_eq!(inplace_wire::phase::name(pb_phase(op.phase)), "Succeeded");
    assert!(
        node.read("/var/lib/kubelet/kubeadm-flags.env")
            .contains("--max-pods=250"),
        "the change did not stay"
    );
    assert_eq!(machine_annotations(&c).await["inplaced.io/phase"], "Done");
}

/// The Node never reports after the change (cut off by it): the try is not confirmed,
/// the agent reverts the change at its deadline (3 s), and UpdateMachine answers
/// `Failure` naming the try; the node's files are as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: tests/k8s/run.sh"]
async fn a_change_that_silences_the_node_is_reverted_at_the_deadline() {
    let c = Cluster::start().await;
    machine_with(
        &c,
        &std::fs::read_to_string(&c.ext_kubeconfig).unwrap(),
        600,
        json!([]),
    )
    .await;
    let (_pki, node, ext) = scene::start(&c, "");
    let before = node.read("/var/lib/kubelet/kubeadm-flags.env");
    let (seen, r) = poll(&ext, 3, 40, |_| false).await;
    assert_eq!(r["status"], "Failure", "{seen:#?}");
    let msg = r["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("RolledBack") && msg.contains("not confirmed within its 3 s try window"),
        "{msg}"
    );
    assert!(
        seen.iter().any(|m| m.contains("not confirmed yet")),
        "{seen:#?}"
    );
    assert_eq!(node.read("/var/lib/kubelet/kubeadm-flags.env"), before);
    assert_eq!(machine_annotations(&c).await["inplaced.io/phase"], "Failed");
}

fn pb_phase(p: i32) -> inplace_wire::pb::Phase {
    inplace_wire::pb::Phase::try_from(p).unwrap()
}
