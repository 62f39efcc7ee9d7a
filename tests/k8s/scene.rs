//! What the Kubernetes tests (`tests/k8s_*.rs`) share: the Machine, its Secret and Node,
//! the extension's `[cluster]` table, the reboot-level UpdateMachine request, the
//! stand-in reboot, and readers of the Node, its Events and the Machine's annotations.
#![allow(dead_code)]

use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::common;
use super::common::capi::{fixture, update_request};
use super::harness::{self, Cluster};
use super::kubelet;

pub(crate) const NS: &str = "site-a";
pub(crate) const MACHINE: &str = "edge-1-cp-7xk2p";
pub(crate) const NODE: &str = "edge-1-cp-7xk2p";
pub(crate) const BOOT_1: &str = "11111111-1111-1111-1111-111111111111";
pub(crate) const BOOT_2: &str = "22222222-2222-2222-2222-222222222222";

/// The Machine (`spec.deletion.nodeDrainTimeoutSeconds` = `drain_timeout`,
/// `status.addresses` = `addresses`), its kubeconfig Secret holding `kubeconfig` (the
/// extension user's own for one server that is both clusters) and its Node (Ready, boot
/// id [`BOOT_1`]).
pub(crate) async fn machine_with(
    c: &Cluster,
    kubeconfig: &str,
    drain_timeout: u64,
    addresses: Value,
) {
    c.create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}))
        .await;
    c.create(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "edge-1-kubeconfig", "namespace": NS},
        "stringData": {"value": kubeconfig},
    }))
    .await;
    c.create(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": MACHINE, "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": "edge-1"}},
        "spec": {"clusterName": "edge-1", "version": "v1.34.2",
                 "deletion": {"nodeDrainTimeoutSeconds": drain_timeout}},
    }))
    .await;
    let api: Api<DynamicObject> =
        Api::namespaced_with(c.admin().await, NS, &harness::machine_resource());
    let st = json!({"status": {"nodeRef": {"name": NODE}, "addresses": addresses}});
    api.patch_status(MACHINE, &PatchParams::default(), &Patch::Merge(&st))
        .await
        .unwrap();
    kubelet::node(c, NODE, BOOT_1).await;
}

/// The `[cluster]` table for the extension.
pub(crate) fn cluster_toml(c: &Cluster, extra: &str) -> String {
    format!(
        "[cluster]\nkubeconfig = \"{}\"\n{extra}",
        c.ext_kubeconfig.display()
    )
}

/// The fixture's UpdateMachine request with a node.d drop-in adding a kernel argument:
/// a change of disruption `reboot`.
pub(crate) fn reboot_request() -> Value {
    let mut req = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    req["desired"]["bootstrapConfig"]["spec"]["files"]
        .as_array_mut()
        .unwrap()
        .push(
            json!({"path": "/etc/inplaced/node.d/20-isolcpus.yaml", "owner": "root:root",
                     "permissions": "0644", "content": "kernelArgs: [isolcpus=2-7]\n"}),
        );
    update_request(&req)
}

/// The stand-in reboot: the agent stops, the node comes back with the new kernel
/// argument and boot id [`BOOT_2`], the agent starts again (the kubelet reports the new
/// boot id later: [`kubelet::node_status`]).
pub(crate) fn reboot(node: &mut Node_) {
    reboot_into(node, " isolcpus=2-7");
}

/// [`reboot`] with `extra` appended to the kernel command line ("" for a boot that did
/// not take the new argument).
pub(crate) fn reboot_into(node: &mut Node_, extra: &str) {
    reboot_as(node, extra, BOOT_2);
}

/// [`reboot_into`] with boot id `boot`.
pub(crate) fn reboot_as(node: &mut Node_, extra: &str, boot: &str) {
    node.stop();
    let cmdline = node.read("/proc/cmdline");
    std::fs::write(
        node.path("/proc/cmdline"),
        format!("{}{extra}\n", cmdline.trim()),
    )
    .unwrap();
    std::fs::write(
        node.path("/proc/sys/kernel/random/boot_id"),
        format!("{boot}\n"),
    )
    .unwrap();
    node.start();
}

pub(crate) type Node_ = common::Node;

pub(crate) async fn node_obj(c: &Cluster) -> Node {
    Api::<Node>::all(c.admin().await).get(NODE).await.unwrap()
}

pub(crate) fn unschedulable(n: &Node) -> bool {
    n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

pub(crate) fn inplaced_annotations(n: &Node) -> Vec<String> {
    n.metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("inplaced.io/"))
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

/// (reason, message) of the Events about `kind` `name` in `ns`, oldest first.
pub(crate) async fn events(c: &Cluster, ns: &str, kind: &str, name: &str) -> Vec<(String, String)> {
    let api: Api<Event> = Api::namespaced(c.admin().await, ns);
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind={kind},involvedObject.name={name}"
    ));
    let mut v: Vec<Event> = api.list(&lp).await.unwrap().items;
    // in the order written (etcd's revisions; the timestamps have seconds only)
    v.sort_by_key(|e| {
        e.metadata
            .resource_version
            .as_deref()
            .and_then(|r| r.parse::<u64>().ok())
    });
    v.into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

pub(crate) fn reasons(ev: &[(String, String)]) -> Vec<&str> {
    ev.iter().map(|e| e.0.as_str()).collect()
}

pub(crate) async fn machine_annotations(c: &Cluster) -> Value {
    let api: Api<DynamicObject> =
        Api::namespaced_with(c.admin().await, NS, &harness::machine_resource());
    let m = api.get(MACHINE).await.unwrap();
    serde_json::to_value(m.metadata.annotations.unwrap_or_default()).unwrap()
}

/// A node agent on a copy of `ubuntu-2404-grub` (started, with the PKI's certificates)
/// and an extension that reaches it for the Machine [`MACHINE`], with the `[cluster]`
/// table plus `extra` lines ([`cluster_toml`]). The [`common::capi::Pki`] is returned
/// because its directory must outlive both.
pub(crate) fn start(
    c: &Cluster,
    extra: &str,
) -> (common::capi::Pki, Node_, common::capi::Extension) {
    let pki = common::capi::Pki::new();
    let mut node = common::Node::new("ubuntu-2404-grub");
    let addr = pki.agent(&node);
    node.start();
    let ext = common::capi::Extension::start(
        &pki,
        &[(&format!("{NS}/{MACHINE}"), &addr)],
        &cluster_toml(c, extra),
    );
    (pki, node, ext)
}
