//! Kubernetes version changes through CAPI's in-place hooks, black box: the real
//! extension, a real agent on the ubuntu fixture with stand-in kubeadm/kubelet and a
//! loopback mirror of the release layout (see `tests/kubernetes.rs`).

mod common;

use common::capi::{Extension, Pki, fixture, patch_ops as ops};
use common::k8s::{Mirror, install_standins, url_config};
use common::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Scenario a's request with only the Machine's version changed, `from` → `to`.
fn version_request(from: &str, to: &str) -> Value {
    let mut req = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    req["desired"]["bootstrapConfig"] = req["current"]["bootstrapConfig"].clone();
    req["current"]["machine"]["spec"]["version"] = json!(from);
    req["desired"]["machine"]["spec"]["version"] = json!(to);
    req
}

/// The agent for Machine site-a/edge-1-cp-7xk2p at v1.34.3 with the url source, and the
/// extension.
fn setup(mirror: &Mirror) -> (Pki, Node, Extension, String) {
    let pki = Pki::new();
    let mut node = Node::new("ubuntu-2404-grub");
    install_standins(&mut node, "v1.34.3");
    let addr = pki.agent(&node);
    let tls = std::fs::read_to_string(&node.config).unwrap();
    std::fs::write(&node.config, format!("{tls}\n{}", url_config(mirror))).unwrap();
    node.start();
    let metrics = format!("127.0.0.1:{}", common::pki::free_port());
    let ext = Extension::start(
        &pki,
        &[("site-a/edge-1-cp-7xk2p", &addr)],
        &format!("[metrics]\nlisten = \"{metrics}\"\n"),
    );
    (pki, node, ext, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_version_change_is_covered_and_applied_in_place() {
    let mirror = Mirror::start();
    let new = mirror.release("v1.35.2");
    let (_pki, node, ext, metrics) = setup(&mirror);
    // kubeadm upgrade node takes a while, so that a poll sees it
    std::fs::create_dir_all(node.path("/etc/standin")).unwrap();
    std::fs::write(node.path("/etc/standin/kubeadm-upgrade-sleep"), "2").unwrap();
    let req = version_request("v1.34.3", "v1.35.2");
    let resp = ext.can_update_machine(&req).await;
    assert_eq!(resp["status"], "Success", "{resp}");
    let patch = ops(&resp, "machinePatch").expect("a machine patch");
    assert_eq!(
        patch,
        json!([{"op": "replace", "path": "/spec/version", "value": "v1.35.2"}])
    );
    // upstream's apply-and-compare: the patched current spec is the desired spec
    let patched = inplace_extension::capi::patch::apply(
        &req["current"]["machine"],
        patch.as_array().unwrap(),
    )
    .unwrap();
    assert_eq!(patched["spec"], req["desired"]["machine"]["spec"]);
    assert!(resp.get("bootstrapConfigPatch").is_none(), "{resp}");
    assert!(
        resp.get("preserveOnInsufficientCoverage").is_none(),
        "{resp}"
    );
    let msg = resp["message"].as_str().unwrap();
    assert!(
        msg.starts_with("edge-1-cp-7xk2p: in place: spec.version"),
        "{msg}"
    );
    assert!(msg.contains("drain"), "{msg}");

    let upd = json!({
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "kind": "UpdateMachineRequest",
        "settings": req["settings"],
        "desired": req["desired"],
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut progress = Vec::new();
    let done = loop {
        let r = ext.update_machine(&upd).await;
        if r["retryAfterSeconds"] == 0 {
            break r;
        }
        progress.push(r["message"].as_str().unwrap_or("").to_string());
        assert!(Instant::now() < deadline, "never finished: {r}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(done["status"], "Success", "{done}");
    // the in-progress message names the step
    assert!(
        progress
            .iter()
            .any(|m| m == "Committing: kubeadm upgrade node"),
        "{progress:?}"
    );
    let m = done["message"].as_str().unwrap();
    assert!(m.starts_with("in-place update done: "), "{m}");
    assert!(m.contains("ran /usr/bin/kubeadm upgrade node"), "{m}");
    assert_eq!(
        std::fs::read(node.path("/usr/bin/kubelet")).unwrap(),
        new["kubelet"]
    );
    // done is stable
    let again = ext.update_machine(&upd).await;
    assert_eq!(
        (again["status"].clone(), again["retryAfterSeconds"].clone()),
        (json!("Success"), json!(0)),
        "{again}"
    );
    // Agent RPCs per hook: one Inspect per hook call, and the one Apply
    // that started the update; the spec inspected is the one applied (the node reports
    // its version), so no other call.
    let body = common::capi::scrape(&metrics);
    let calls = progress.len() as f64 + 2.0;
    assert_eq!(
        common::capi::agent_rpcs(&body, "CanUpdateMachine"),
        [("inspect".to_string(), 1.0)],
        "{body}"
    );
    assert_eq!(
        common::capi::agent_rpcs(&body, "UpdateMachine"),
        [("apply".to_string(), 1.0), ("inspect".to_string(), calls)],
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_skipping_a_minor_is_not_covered() {
    let mirror = Mirror::start();
    mirror.release("v1.36.0");
    let (_pki, _node, ext, _metrics) = setup(&mirror);
    let resp = ext
        .can_update_machine(&version_request("v1.34.3", "v1.36.0"))
        .await;
    assert_eq!(resp["status"], "Success", "{resp}");
    assert!(resp.get("machinePatch").is_none(), "{resp}");
    let msg = resp["message"].as_str().unwrap();
    assert!(msg.contains("spec.version"), "{msg}");
    assert!(msg.contains("version skew policy"), "{msg}");
}

fn set_request(from: &str, to: &str) -> Value {
    let mut req = fixture("e-machineset-worker-template/canupdatemachineset-request.json");
    req["desired"]["bootstrapConfigTemplate"] = req["current"]["bootstrapConfigTemplate"].clone();
    req["current"]["machineSet"]["spec"]["template"]["spec"]["version"] = json!(from);
    req["desired"]["machineSet"]["spec"]["template"]["spec"]["version"] = json!(to);
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machineset_version_change_needs_the_declared_capability() {
    let pki = Pki::new();
    let caps = "[machine_set]\ncapabilities = [\"files\", \"kubeletExtraArgs\", \"ntp\", \"kubernetes-version\"]\n";
    let ext = Extension::start(&pki, &[], caps);
    let req = set_request("v1.34.3", "v1.35.2");
    let resp = ext.can_update_machine_set(&req).await;
    assert_eq!(resp["status"], "Success", "{resp}");
    let patch = ops(&resp, "machineSetPatch").expect("a machine set patch");
    let patched = inplace_extension::capi::patch::apply(
        &req["current"]["machineSet"],
        patch.as_array().unwrap(),
    )
    .unwrap();
    // CAPI's own apply-and-compare (tests/common/upstream.rs) sees nothing different
    assert!(
        common::upstream::still_different("CanUpdateMachineSet", &req, &resp).is_empty(),
        "{resp}"
    );
    assert_eq!(patched["spec"]["template"]["spec"]["version"], "v1.35.2");
    assert!(
        resp.get("preserveOnInsufficientCoverage").is_none(),
        "{resp}"
    );

    // two minors: blocked by the skew policy whatever the capabilities
    let skip = ext
        .can_update_machine_set(&set_request("v1.34.3", "v1.36.0"))
        .await;
    assert!(skip.get("machineSetPatch").is_none(), "{skip}");
    assert!(
        skip["message"]
            .as_str()
            .unwrap()
            .contains("version skew policy"),
        "{skip}"
    );

    // the default capabilities do not include it
    let ext = Extension::start(&pki, &[], "");
    let resp = ext.can_update_machine_set(&req).await;
    assert!(resp.get("machineSetPatch").is_none(), "{resp}");
    assert!(
        resp["message"]
            .as_str()
            .unwrap()
            .contains("KubernetesVersion capability"),
        "{resp}"
    );
}
