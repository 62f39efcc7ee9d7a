//! The stand-ins at the API boundary (README "Draining and the cluster side"): no kubelet
//! and no ReplicaSet controller run here, so the tests do what they would do, through the
//! real API server, as `admin`:
//!
//! - the kubelet registers its Node (Ready, `status.nodeInfo.bootID`, `kubeletVersion`)
//!   and reports it again after a reboot with a new boot id; it marks the Pods bound to it
//!   Running and Ready (`pods/status`), and finishes the termination of a Pod the Eviction
//!   API deleted (v1.20's eviction deletes the Pod with its grace period: it stays
//!   Terminating with a `deletionTimestamp` until the kubelet confirms, a delete with grace
//!   period 0);
//! - the ReplicaSet controller puts a replacement on another Node.

#![allow(dead_code)] // each test file uses a part

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use crate::harness::Cluster;

/// The kubelet version the stand-in kubelet reports.
pub(crate) const KUBELET: &str = "v1.20.2";

/// Registers Node `name` Ready with boot id `boot`.
pub(crate) async fn node(c: &Cluster, name: &str, boot: &str) {
    let api: Api<Node> = Api::all(c.admin().await);
    let n: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
    }))
    .unwrap();
    api.create(&PostParams::default(), &n).await.unwrap();
    node_status(c, name, true, boot).await;
}

/// Reports Node `name`'s status: Ready or not, boot id `boot`.
pub(crate) async fn node_status(c: &Cluster, name: &str, ready: bool, boot: &str) {
    let api: Api<Node> = Api::all(c.admin().await);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let st = json!({"status": {
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                        "reason": if ready { "KubeletReady" } else { "KubeletNotReady" },
                        "message": if ready { "kubelet is posting ready status" } else { "kubelet stopped posting node status" },
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "nodeInfo": {"bootID": boot, "kubeletVersion": KUBELET, "machineID": "m", "systemUUID": "s",
                     "kernelVersion": "6.8.0", "osImage": "Ubuntu 24.04", "containerRuntimeVersion": "containerd://1.7",
                     "kubeProxyVersion": KUBELET, "operatingSystem": "linux", "architecture": "amd64"},
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&st))
        .await
        .unwrap();
}

/// Creates Pod `default/name` bound to `node`, with `extra` merged into its object
/// (labels, annotations, ownerReferences, volumes), and marks it Running and Ready.
pub(crate) async fn pod(c: &Cluster, name: &str, node: &str, extra: Value) -> Pod {
    let api: Api<Pod> = Api::namespaced(c.admin().await, "default");
    let mut v = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.invalid/app:1"}]},
    });
    json_patch::merge(&mut v, &extra);
    let p: Pod = serde_json::from_value(v).unwrap();
    let created = api.create(&PostParams::default(), &p).await.unwrap();
    let st = json!({"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&st))
        .await
        .unwrap();
    created
}

fn rs_resource() -> ApiResource {
    ApiResource {
        group: "apps".into(),
        version: "v1".into(),
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        plural: "replicasets".into(),
    }
}

/// A ReplicaSet `app` (no controller runs: its Pods are made here), one Pod
/// `app-<i>` per entry of `nodes`, and a PodDisruptionBudget `app` (policy/v1beta1,
/// minAvailable `min_available`) over them.
pub(crate) async fn replicated(c: &Cluster, app: &str, nodes: &[&str], min_available: i32) {
    let rs: Api<DynamicObject> = Api::namespaced_with(c.admin().await, "default", &rs_resource());
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": app, "namespace": "default"},
        "spec": {"replicas": nodes.len(), "selector": {"matchLabels": {"app": app}},
                 "template": {"metadata": {"labels": {"app": app}},
                              "spec": {"containers": [{"name": "c", "image": "registry.invalid/app:1"}]}}},
    }))
    .unwrap();
    let made = rs.create(&PostParams::default(), &obj).await.unwrap();
    let uid = made.metadata.uid.unwrap();
    for (i, n) in nodes.iter().enumerate() {
        replica(c, app, &uid, &format!("{app}-{i}"), n).await;
    }
    c.create(json!({
        "apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget",
        "metadata": {"name": app, "namespace": "default"},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
    }))
    .await;
}

/// One Pod of ReplicaSet `app` (uid `uid`) on `node` (what the ReplicaSet controller
/// does for a Pod evicted from the drained Node).
pub(crate) async fn replica(c: &Cluster, app: &str, uid: &str, name: &str, node: &str) {
    pod(
        c,
        name,
        node,
        json!({"metadata": {"labels": {"app": app}, "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": app, "uid": uid,
            "controller": true, "blockOwnerDeletion": true}]}}),
    )
    .await;
}

/// The uid of ReplicaSet `app`, if there is one.
pub(crate) async fn rs_uid(c: &Cluster, app: &str) -> Option<String> {
    let rs: Api<DynamicObject> = Api::namespaced_with(c.admin().await, "default", &rs_resource());
    rs.get_opt(app)
        .await
        .unwrap()
        .map(|r| r.metadata.uid.unwrap())
}

/// Waits (20 s at most) until budget `name`'s `status.disruptionsAllowed` satisfies
/// `want`; returns it.
pub(crate) async fn wait_budget(c: &Cluster, name: &str, want: impl Fn(i64) -> bool) -> i64 {
    let ar = ApiResource {
        group: "policy".into(),
        version: "v1beta1".into(),
        api_version: "policy/v1beta1".into(),
        kind: "PodDisruptionBudget".into(),
        plural: "poddisruptionbudgets".into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(c.admin().await, "default", &ar);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let b = api.get(name).await.unwrap();
        let allowed = b.data["status"]["disruptionsAllowed"].as_i64();
        if let Some(a) = allowed.filter(|a| want(*a)) {
            return a;
        }
        assert!(
            Instant::now() < deadline,
            "budget {name} never as wanted: {:?}",
            b.data["status"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The Pods bound to `node` (`namespace/name`, terminating ones marked `(terminating)`).
pub(crate) async fn pods_on(c: &Cluster, node: &str) -> Vec<String> {
    let api: Api<Pod> = Api::all(c.admin().await);
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let mut v: Vec<String> = api
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| {
            format!(
                "{}/{}{}",
                p.metadata.namespace.as_deref().unwrap_or(""),
                p.metadata.name.as_deref().unwrap_or(""),
                if p.metadata.deletion_timestamp.is_some() {
                    " (terminating)"
                } else {
                    ""
                }
            )
        })
        .collect();
    v.sort();
    v
}

/// The kubelet confirms the termination of every terminating Pod on `node` (a delete
/// with grace period 0); returns their names.
pub(crate) async fn finish_terminating(c: &Cluster, node: &str) -> Vec<String> {
    let api: Api<Pod> = Api::namespaced(c.admin().await, "default");
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let mut gone = Vec::new();
    for p in api.list(&lp).await.unwrap().items {
        if p.metadata.deletion_timestamp.is_some() {
            let name = p.metadata.name.unwrap();
            let _ = api
                .delete(&name, &DeleteParams::default().grace_period(0))
                .await;
            gone.push(name);
        }
    }
    gone
}

/// Creates DaemonSet `name` in `default` (its Pods select no Node, so no controller puts
/// one anywhere) and returns its uid, for a Pod's `ownerReferences`.
pub(crate) async fn daemon_set(c: &Cluster, name: &str) -> String {
    let api: Api<k8s_openapi::api::apps::v1::DaemonSet> =
        Api::namespaced(c.admin().await, "default");
    let ds = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"nodeSelector": {"inplaced.io/no-such-node": "x"},
                                       "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10.1"}]}}},
    }))
    .unwrap();
    let made = api.create(&PostParams::default(), &ds).await.unwrap();
    made.metadata.uid.unwrap()
}

/// Renews Node `name`'s Lease in `kube-node-lease` (creates it the first time), as the
/// kubelet does every 10 s: `spec.renewTime` = now.
pub(crate) async fn renew_lease(c: &Cluster, name: &str) {
    use k8s_openapi::api::coordination::v1::Lease;
    let api: Api<Lease> = Api::namespaced(c.admin().await, "kube-node-lease");
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now},
    }))
    .unwrap();
    match api.get_opt(name).await.unwrap() {
        None => {
            api.create(&PostParams::default(), &lease).await.unwrap();
        }
        Some(_) => {
            let p = json!({"spec": {"renewTime": now}});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&p))
                .await
                .unwrap();
        }
    }
}
