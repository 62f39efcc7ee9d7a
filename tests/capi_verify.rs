//! "Done" means verified, black box: the real `inplace-extension` driving a real `inplaced`
//! on the ubuntu fixture with a stand-in kubelet. UpdateMachine answers done only when
//! every field of the desired Machine it translated is verified on the node; the Machine's
//! `spec.version` that the node can not verify (a kubelet whose version does not parse, no
//! kubelet where the agent looks and no `[cluster]` Node to read, a version string that is
//! not a release) is a Failure naming `spec.version`, and nothing is applied.

mod common;
use common::capi::{fixture, one_agent, poll_update, update_request};
use common::k8s::install_standins;
use serde_json::json;

const MACHINE: &str = "site-a/edge-1-cp-7xk2p";

/// Scenario a's UpdateMachine request (kubelet flag and sysctl file) with the Machine at
/// `version`.
fn request(version: &str) -> serde_json::Value {
    let mut req = update_request(&fixture(
        "a-kubelet-args-and-sysctl/canupdatemachine-request.json",
    ));
    req["desired"]["machine"]["spec"]["version"] = json!(version);
    req
}

/// The node runs the Machine's version: the flag and file are applied and the version is
/// verified, so the update is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_the_node_reports_is_verified_and_done() {
    let (_pki, mut node, ext) = one_agent("ubuntu-2404-grub", MACHINE, |n| {
        install_standins(n, "v1.34.2")
    });
    let seen = poll_update(&ext, &request("v1.34.2")).await;
    let done = seen.last().unwrap();
    assert_eq!(
        (done["status"].clone(), done["retryAfterSeconds"].clone()),
        (json!("Success"), json!(0)),
        "{seen:?}"
    );
    assert!(
        done["message"]
            .as_str()
            .unwrap()
            .starts_with("in-place update done: "),
        "{done}"
    );
    assert!(
        node.read("/var/lib/kubelet/kubeadm-flags.env")
            .contains("--max-pods=250")
    );
    node.stop();
}

/// A kubelet whose `--version` does not parse: the node does not report its version, so
/// the Machine's is a Failure naming `spec.version` and the node problem, before anything
/// is applied (the flag and the sysctl file stay as they were).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_the_node_does_not_report_is_a_failure_naming_the_field() {
    let (_pki, mut node, ext) = one_agent("ubuntu-2404-grub", MACHINE, |n| {
        install_standins(n, "1.34.2-custom+build")
    });
    let flags = node.read("/var/lib/kubelet/kubeadm-flags.env");
    let sysctl = node.read("/etc/sysctl.d/90-tuning.conf");
    assert_ne!(sysctl, "vm.max_map_count = 262144\n");
    let r = ext.update_machine(&request("v1.34.2")).await;
    assert_eq!(
        (r["status"].clone(), r["retryAfterSeconds"].clone()),
        (json!("Failure"), json!(0)),
        "{r}"
    );
    let msg = r["message"].as_str().unwrap();
    assert!(
        msg.starts_with(
            "edge-1-cp-7xk2p: spec.version v1.34.2: the node does not report its Kubernetes version (the kubelet at /usr/bin/kubelet does not report a version"
        ),
        "{msg}"
    );
    assert!(
        msg.ends_with("it can not be verified, nothing was applied"),
        "{msg}"
    );
    assert_eq!(node.read("/var/lib/kubelet/kubeadm-flags.env"), flags);
    assert_eq!(node.read("/etc/sysctl.d/90-tuning.conf"), sysctl);
    assert!(
        !node.actions().iter().any(|a| a.contains("kubelet.service")),
        "{:?}",
        node.actions()
    );
    node.stop();
}

/// A Machine version that is not a Kubernetes release (a pre-release) can not be verified
/// against any node: a Failure naming `spec.version`, nothing applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unparseable_machine_version_is_a_failure_naming_the_field() {
    let (_pki, mut node, ext) = one_agent("ubuntu-2404-grub", MACHINE, |n| {
        install_standins(n, "v1.34.2")
    });
    let flags = node.read("/var/lib/kubelet/kubeadm-flags.env");
    let r = ext.update_machine(&request("v1.35.0-rc.1")).await;
    assert_eq!(
        (r["status"].clone(), r["retryAfterSeconds"].clone()),
        (json!("Failure"), json!(0)),
        "{r}"
    );
    assert_eq!(
        r["message"],
        "edge-1-cp-7xk2p: spec.version: \"v1.35.0-rc.1\" is not a Kubernetes release version; give vMAJOR.MINOR.PATCH such as v1.35.2 (pre-releases are not upgraded to in place); it can not be verified on the node, nothing was applied"
    );
    assert_eq!(node.read("/var/lib/kubelet/kubeadm-flags.env"), flags);
    assert!(!flags.contains("--max-pods=250"), "{flags}");
    node.stop();
}

/// issue 27 §2: a node with no kubelet where the agent looks (`/usr/bin/kubelet` absent)
/// and no `[cluster]` Node to read: the Machine's `spec.version` can not be verified, so
/// UpdateMachine is a Failure naming the field and the path the agent looked at, and
/// nothing is applied (before, the version was dropped and the update answered done).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_kubelet_where_the_agent_looks_is_a_failure_naming_the_field() {
    let (_pki, mut node, ext) = one_agent("ubuntu-2404-grub", MACHINE, |_| {});
    assert!(!node.path("/usr/bin/kubelet").exists());
    let flags = node.read("/var/lib/kubelet/kubeadm-flags.env");
    let r = ext.update_machine(&request("v1.34.2")).await;
    assert_eq!(
        (r["status"].clone(), r["retryAfterSeconds"].clone()),
        (json!("Failure"), json!(0)),
        "{r}"
    );
    assert_eq!(
        r["message"],
        "edge-1-cp-7xk2p: spec.version v1.34.2: the node's agent finds no kubelet to read its version (the node's Kubernetes version is not known: /usr/bin/kubelet is absent) and no Node kubelet version ([cluster]) verifies it; nothing was applied: point the agent's [kubernetes] bin_dir at the kubelet"
    );
    assert_eq!(node.read("/var/lib/kubelet/kubeadm-flags.env"), flags);
    assert!(!flags.contains("--max-pods=250"), "{flags}");
    node.stop();
}
