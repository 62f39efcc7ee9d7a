//! The CAPI Runtime Extension, black box: the real `inplace-extension` binary over HTTPS,
//! real `inplaced` agents on copies of the fixture nodes over mutual TLS, and the fixture
//! hook requests of `tests/fixtures/capi`.

mod common;

use common::capi::{
    Extension, Pki, fixture, fully_covered_then_updated, one_agent, ops, poll_update,
    update_request,
};
use common::pki::free_port;
use common::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn mode_of(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_lists_the_three_in_place_handlers() {
    let pki = Pki::new();
    let ext = Extension::start(&pki, &[], "");
    let (status, v) = ext
        .post("/hooks.runtime.cluster.x-k8s.io/v1alpha1/discovery", &json!({"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "DiscoveryRequest"}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(v["kind"], "DiscoveryResponse");
    assert_eq!(v["status"], "Success");
    let hooks: Vec<(String, String, String)> = v["handlers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["requestHook"]["hook"].as_str().unwrap().to_string(),
                h["name"].as_str().unwrap().to_string(),
                h["failurePolicy"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        hooks,
        [
            ("CanUpdateMachine", "can-update-machine"),
            ("CanUpdateMachineSet", "can-update-machineset"),
            ("UpdateMachine", "update-machine")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string(), "Fail".to_string()))
    );
    // A malformed request names what is missing and is a Failure, not a success.
    let (status, v) = ext
        .post(
            "/hooks.runtime.cluster.x-k8s.io/v1alpha1/canupdatemachine/can-update-machine",
            &json!({"desired": {}}),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(v["status"], "Failure");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("request: desired: missing field `machine`"),
        "{v}"
    );
}

/// Scenario b: ntp covered, diskSetup never; on bare metal the node recommends
/// preservation, on a virtual machine it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_b_disksetup_preserves_bare_metal_only() {
    let pki = Pki::new();
    let mut metal = Node::new("rhel8-grubenv");
    let metal_addr = pki.agent(&metal);
    metal.start();
    let mut vm = Node::new("rhel8-grubenv");
    std::fs::write(vm.path("/sys/class/dmi/id/sys_vendor"), "QEMU\n").unwrap();
    std::fs::write(
        vm.path("/sys/class/dmi/id/product_name"),
        "Standard PC (Q35 + ICH9, 2009)\n",
    )
    .unwrap();
    let vm_addr = pki.agent(&vm);
    vm.start();

    let req = fixture("b-disksetup-not-coverable/canupdatemachine-request.json");
    let want = fixture("b-disksetup-not-coverable/canupdatemachine-response.json");
    let ext = Extension::start(&pki, &[("site-b/edge-2-cp-q4m8d", &metal_addr)], "");
    let resp = ext.can_update_machine(&req).await;
    assert_eq!(resp["status"], "Success", "{resp}");
    assert_eq!(
        ops(&resp, "bootstrapConfigPatch"),
        ops(&want, "bootstrapConfigPatch")
    );
    assert_eq!(resp["preserveOnInsufficientCoverage"], true, "{resp}");
    let msg = resp["message"].as_str().unwrap();
    assert!(
        msg.contains("not covered: spec.diskSetup (partitioning and formatting are destructive"),
        "{msg}"
    );
    assert!(msg.contains("asking CAPI to keep the Machine: "), "{msg}");

    let ext_vm = Extension::start(&pki, &[("site-b/edge-2-cp-q4m8d", &vm_addr)], "");
    let resp = ext_vm.can_update_machine(&req).await;
    assert_eq!(
        ops(&resp, "bootstrapConfigPatch"),
        ops(&want, "bootstrapConfigPatch")
    );
    assert!(
        resp.get("preserveOnInsufficientCoverage").is_none(),
        "{resp}"
    );
    assert!(resp["message"].as_str().unwrap().contains("spec.diskSetup"));
    // Settings force it on the VM too.
    let mut forced = req.clone();
    forced["settings"]["preserveOnInsufficientCoverage"] = json!("true");
    let resp = ext_vm.can_update_machine(&forced).await;
    assert_eq!(resp["preserveOnInsufficientCoverage"], true, "{resp}");
    metal.stop();
    vm.stop();
}

/// Scenarios c and d: a v1beta1 KubeadmConfig (which CAPI never sends) is not covered,
/// naming its apiVersion, and UpdateMachine refuses it; the gzip+base64 file is covered, and UpdateMachine lands it decoded with mode 0600 and owner etcd:etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenarios_c_and_d() {
    let pki = Pki::new();
    let mut rhel = Node::new("rhel8-grubenv");
    let rhel_addr = pki.agent(&rhel);
    rhel.start();
    let mut ubuntu = Node::new("ubuntu-2404-grub");
    let ubuntu_addr = pki.agent(&ubuntu);
    ubuntu.start();
    let ext = Extension::start(
        &pki,
        &[
            ("site-b/edge-2-cp-w7n2c", &rhel_addr),
            ("site-a/edge-1-cp-7xk2p", &ubuntu_addr),
        ],
        "",
    );

    let c = fixture("c-v1beta1-kubeletextraargs-map/canupdatemachine-request.json");
    let resp = ext.can_update_machine(&c).await;
    assert_eq!(resp["status"], "Success", "{resp}");
    assert!(resp.get("bootstrapConfigPatch").is_none(), "{resp}");
    let msg = resp["message"].as_str().unwrap();
    assert!(
        msg.contains("not covered: bootstrapConfig.apiVersion (KubeadmConfig apiVersion \"bootstrap.cluster.x-k8s.io/v1beta1\" is not read")
            && msg.contains("at bootstrap.cluster.x-k8s.io/v1beta2"),
        "{msg}"
    );
    // UpdateMachine refuses it before it asks the node anything.
    let rhel_ops = rhel
        .client()
        .await
        .list_operations(inplace_wire::pb::ListOperationsRequest {})
        .await
        .unwrap()
        .into_inner()
        .operations
        .len();
    let up = ext.update_machine(&update_request(&c)).await;
    assert_eq!(up["status"], "Failure", "{up}");
    assert!(
        up["message"].as_str().unwrap().contains(
            "nothing was applied: KubeadmConfig apiVersion \"bootstrap.cluster.x-k8s.io/v1beta1\""
        ),
        "{up}"
    );
    assert_eq!(
        rhel.client()
            .await
            .list_operations(inplace_wire::pb::ListOperationsRequest {})
            .await
            .unwrap()
            .into_inner()
            .operations
            .len(),
        rhel_ops
    );

    let d = fixture("d-gzip-file-etcd-owner/canupdatemachine-request.json");
    let resp = ext.can_update_machine(&d).await;
    assert_eq!(resp["status"], "Success");
    // Our patch replaces the atomic list where the fixture addresses files[1]: compare
    // what CAPI would compute from each.
    let want = fixture("d-gzip-file-etcd-owner/canupdatemachine-response.json");
    let cur = &d["current"]["bootstrapConfig"];
    let apply = |o: Value| {
        inplace_extension::capi::patch::apply(cur, o.as_array().unwrap()).unwrap()["spec"].clone()
    };
    assert_eq!(
        apply(ops(&resp, "bootstrapConfigPatch")),
        apply(ops(&want, "bootstrapConfigPatch"))
    );
    assert_eq!(
        apply(ops(&resp, "bootstrapConfigPatch")),
        d["desired"]["bootstrapConfig"]["spec"]
    );
    assert!(
        resp.get("preserveOnInsufficientCoverage").is_none(),
        "{resp}"
    );

    let seen = poll_update(&ext, &update_request(&d)).await;
    assert_eq!(seen.last().unwrap()["status"], "Success", "{seen:?}");
    let path = ubuntu.path("/etc/etcd-defrag/defrag.env");
    let desired = std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/capi/d-gzip-file-etcd-owner/defrag.env.desired.decoded"),
    )
    .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), desired);
    assert_eq!(mode_of(&path), 0o600);
    // Ownership: the agent resolved etcd:etcd through the node's own passwd/group.
    let mut client = ubuntu.client().await;
    let ops_list = client
        .list_operations(inplace_wire::pb::ListOperationsRequest {})
        .await
        .unwrap()
        .into_inner();
    let change = ops_list.operations[0]
        .changes
        .iter()
        .find(|c| c.id == "files[/etc/etcd-defrag/defrag.env]")
        .expect("the defrag.env change");
    assert!(
        change.after.ends_with("mode=0600 uid=997 gid=997"),
        "{change:?}"
    );
    rhel.stop();
    ubuntu.stop();
}

/// Scenario e: the MachineSet answer is the fixture's, without asking any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_e_machineset_from_capabilities() {
    let pki = Pki::new();
    let ext = Extension::start(&pki, &[], "");
    let req = fixture("e-machineset-worker-template/canupdatemachineset-request.json");
    let want = fixture("e-machineset-worker-template/canupdatemachineset-response.json");
    let resp = ext.can_update_machine_set(&req).await;
    assert_eq!(resp["status"], "Success", "{resp}");
    assert_eq!(
        ops(&resp, "bootstrapConfigTemplatePatch"),
        ops(&want, "bootstrapConfigTemplatePatch")
    );
    assert!(
        resp.get("machineSetPatch").is_none()
            && resp.get("preserveOnInsufficientCoverage").is_none()
    );
    // Without the kubelet capability the args stay different and the Metal3 template
    // makes the MachineSet hardware-bound: preserve.
    let ext = Extension::start(&pki, &[], "[machine_set]\ncapabilities = [\"files\"]\n");
    let resp = ext.can_update_machine_set(&req).await;
    assert_eq!(resp["preserveOnInsufficientCoverage"], true, "{resp}");
    assert!(
        resp["message"]
            .as_str()
            .unwrap()
            .contains("Metal3MachineTemplate machines are hardware-bound"),
        "{resp}"
    );
}

/// A terminal node failure is `Failure` + 0 with the cause; an unreachable agent is a
/// `Failure` for CanUpdateMachine (never an empty success) and "waiting" for UpdateMachine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_and_unreachable_agents() {
    let pki = Pki::new();
    let mut node = Node::new("systemd-boot");
    node.fail = Some("start kubelet.service".into());
    let addr = pki.agent(&node);
    node.start();
    let dead = format!("127.0.0.1:{}", free_port());
    let ext = Extension::start(
        &pki,
        &[
            ("site-a/edge-1-md-0-5f8c7d9b4x-k2v9w", &addr),
            ("site-a/edge-1-cp-7xk2p", &dead),
        ],
        "",
    );
    let req = common::capi::without_machine_version(fixture(
        "f-updatemachine-bootstrap-token/updatemachine-request.json",
    ));
    let seen = poll_update(&ext, &req).await;
    let last = seen.last().unwrap();
    assert_eq!(last["status"], "Failure", "{seen:?}");
    assert_eq!(last["retryAfterSeconds"], 0);
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .contains("kubelet.service"),
        "{last}"
    );
    // Idempotent: the failed operation is reported again, not restarted, even once the
    // node is fixed...
    let again = ext.update_machine(&req).await;
    assert_eq!(again, *last);
    node.stop();
    node.fail = None;
    node.start();
    assert_eq!(ext.update_machine(&req).await, *last);
    // ...until the operator asks for a new attempt with the retry annotation.
    let mut retry = req.clone();
    retry["desired"]["machine"]["metadata"]["annotations"]["inplaced.io/retry"] = json!("1");
    let seen = poll_update(&ext, &retry).await;
    assert_eq!(seen.last().unwrap()["status"], "Success", "{seen:?}");
    assert!(
        node.read("/var/lib/kubelet/kubeadm-flags.env")
            .contains("--reserved-cpus=0-3")
    );
    // Once another operation succeeded after it, the old failure is stale: the request
    // without the annotation is answered from the node again, not from the failure.
    let seen = poll_update(&ext, &req).await;
    assert_eq!(seen.last().unwrap()["status"], "Success", "{seen:?}");
    node.stop();

    let a = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    let resp = ext.can_update_machine(&a).await;
    assert_eq!(resp["status"], "Failure", "{resp}");
    assert!(resp.get("bootstrapConfigPatch").is_none());
    assert!(
        resp["message"]
            .as_str()
            .unwrap()
            .contains("can not ask the node agent"),
        "{resp}"
    );
    let upd = ext.update_machine(&update_request(&a)).await;
    assert_eq!(
        (upd["status"].clone(), upd["retryAfterSeconds"].clone()),
        (json!("Success"), json!(30)),
        "{upd}"
    );
    assert!(
        upd["message"]
            .as_str()
            .unwrap()
            .starts_with("waiting for the node agent"),
        "{upd}"
    );
}

/// A NodeSpec drop-in carried as a KubeadmConfig file: the agent merges it (not written
/// blindly as a file), UpdateMachine leaves exactly that document in node.d and applies
/// its sysctl; a drop-in item the node can not apply (a kernel argument under reboot policy
/// `forbidden`) keeps `spec.files` uncovered, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_d_dropin_from_a_kubeadm_config() {
    let (_pki, mut node, ext) = one_agent("ubuntu-2404-grub", "site-a/edge-1-cp-7xk2p", |_| {});
    let doc = "sysctls:\n  vm.swappiness: \"10\"\n";
    let mut req = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    req["desired"]["bootstrapConfig"]["spec"]["files"]
        .as_array_mut()
        .unwrap()
        .push(json!({"path": "/etc/inplaced/node.d/20-tuning.yaml", "owner": "root:root", "permissions": "0644", "content": doc}));
    let (resp, seen) = fully_covered_then_updated(&ext, &req).await;
    assert_eq!(resp["status"], "Success", "{resp}");
    assert_eq!(seen.last().unwrap()["status"], "Success", "{seen:?}");
    assert_eq!(node.read("/etc/inplaced/node.d/20-tuning.yaml"), doc);
    assert_eq!(node.read("/proc/sys/vm/swappiness").trim(), "10");

    // A kernel argument in a drop-in, with reboots forbidden by settings.
    let mut req2 = req.clone();
    req2["settings"]["rebootPolicy"] = json!("forbidden");
    req2["settings"]["preserveOnInsufficientCoverage"] = json!("false");
    req2["desired"]["bootstrapConfig"]["spec"]["files"][2]["content"] =
        json!("sysctls:\n  vm.swappiness: \"10\"\nkernelArgs: [isolcpus=2-7]\n");
    let resp = ext.can_update_machine(&req2).await;
    let msg = resp["message"].as_str().unwrap();
    assert!(msg.contains("not covered: spec.files (kernelArgs"), "{msg}");
    assert!(
        resp.get("preserveOnInsufficientCoverage").is_none(),
        "{resp}"
    );
    let patch = ops(&resp, "bootstrapConfigPatch");
    assert!(
        patch
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["path"] != "/spec/files"),
        "{patch}"
    );
    node.stop();
}

/// A file the KubeadmConfig provisioned under a path the agent's policy never writes
/// (`/etc/passwd`), unchanged and already as desired on the node, neither blocks coverage
/// nor the update; the same file drifted on the node blocks both, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_provisioned_file_outside_policy() {
    use std::os::unix::fs::MetadataExt;
    let (_pki, mut node, ext) = one_agent("ubuntu-2404-grub", "site-a/edge-1-cp-7xk2p", |_| {});
    let md = std::fs::metadata(node.path("/etc/passwd")).unwrap();
    let entry = json!({
        "path": "/etc/passwd",
        "owner": format!("{}:{}", md.uid(), md.gid()),
        "permissions": format!("{:04o}", md.mode() & 0o7777),
        "content": node.read("/etc/passwd"),
    });
    let mut req = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    for side in ["current", "desired"] {
        req[side]["bootstrapConfig"]["spec"]["files"]
            .as_array_mut()
            .unwrap()
            .push(entry.clone());
    }
    let (_, seen) = fully_covered_then_updated(&ext, &req).await;
    assert_eq!(seen.last().unwrap()["status"], "Success", "{seen:?}");
    assert_eq!(
        node.read("/var/lib/kubelet/kubeadm-flags.env")
            .matches("--max-pods=250")
            .count(),
        1
    );

    // Drifted: the node's /etc/passwd is no longer what the KubeadmConfig provisioned.
    std::fs::write(
        node.path("/etc/passwd"),
        format!("{}intruder:x:0:0::/:/bin/sh\n", node.read("/etc/passwd")),
    )
    .unwrap();
    let mut req2 = req.clone();
    req2["desired"]["bootstrapConfig"]["spec"]["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"]
        [0]["value"] = json!("300");
    let resp = ext.can_update_machine(&req2).await;
    let msg = resp["message"].as_str().unwrap();
    assert!(msg.contains("files[/etc/passwd]"), "{msg}");
    assert!(
        resp.get("bootstrapConfigPatch").is_none(),
        "nothing covered when drift can not be fixed: {resp}"
    );
    node.stop();
}

/// A desired KubeadmConfig the node refuses as invalid (a kubelet argument that would
/// inject a second flag into kubeadm-flags.env) is "not covered" with the node's reason,
/// never a `Failure` that would make CAPI retry forever; UpdateMachine fails with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_desired_spec_is_not_covered() {
    let (_pki, mut node, ext) = one_agent("ubuntu-2404-grub", "site-a/edge-1-cp-7xk2p", |_| {});
    let before = node.read("/var/lib/kubelet/kubeadm-flags.env");
    for bad in [
        "250 --authorization-mode=AlwaysAllow",
        "250\n--anonymous-auth=true",
    ] {
        let mut req = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
        req["desired"]["bootstrapConfig"]["spec"]["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"]
            [0]["value"] = json!(bad);
        let resp = ext.can_update_machine(&req).await;
        assert_eq!(resp["status"], "Success", "{resp}");
        let msg = resp["message"].as_str().unwrap();
        assert!(msg.contains("not covered: spec.joinConfiguration.nodeRegistration.kubeletExtraArgs (kubelet.flags[max-pods]: the node refuses the spec"), "{msg}");
        assert_eq!(
            resp["preserveOnInsufficientCoverage"], true,
            "bare metal: {resp}"
        );
        let patch = ops(&resp, "bootstrapConfigPatch");
        assert!(
            patch
                .as_array()
                .unwrap()
                .iter()
                .all(|o| o["path"] != "/spec/joinConfiguration/nodeRegistration/kubeletExtraArgs"),
            "{patch}"
        );
        let upd = ext.update_machine(&update_request(&req)).await;
        assert_eq!(
            (upd["status"].clone(), upd["retryAfterSeconds"].clone()),
            (json!("Failure"), json!(0)),
            "{upd}"
        );
    }
    assert_eq!(node.read("/var/lib/kubelet/kubeadm-flags.env"), before);
    node.stop();
}

/// `affectsAvailability` (cluster-api #14160): false when every covered change leaves the
/// workloads running (a kubelet restart, a sysctl file), true when one drains (a CPU
/// manager flag); forced by the setting; absent when nothing is covered; the same bytes
/// on every call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affects_availability_from_the_covered_disruption() {
    let (_pki, _node, ext) = one_agent("ubuntu-2404-grub", "site-a/edge-1-cp-7xk2p", |_| {});
    let a = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    let first = ext.can_update_machine(&a).await;
    assert!(first.get("bootstrapConfigPatch").is_some(), "{first}");
    assert_eq!(first["affectsAvailability"], json!(false), "{first}");
    let again = ext.can_update_machine(&a).await;
    assert_eq!(
        serde_json::to_vec(&first).unwrap(),
        serde_json::to_vec(&again).unwrap()
    );
    // a CPU manager flag drains the node
    let mut drain = a.clone();
    drain["desired"]["bootstrapConfig"]["spec"]["joinConfiguration"]["nodeRegistration"]
        ["kubeletExtraArgs"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "reserved-cpus", "value": "0-1"}));
    let r = ext.can_update_machine(&drain).await;
    assert!(r.get("bootstrapConfigPatch").is_some(), "{r}");
    assert_eq!(r["affectsAvailability"], json!(true), "{r}");
    // the setting forces it
    let mut forced = a.clone();
    forced["settings"]["affectsAvailability"] = json!("true");
    assert_eq!(
        ext.can_update_machine(&forced).await["affectsAvailability"],
        json!(true)
    );
    // nothing covered: no in-place update to describe
    let b = fixture("b-disksetup-not-coverable/canupdatemachine-request.json");
    let mut b_on_a = a.clone();
    b_on_a["desired"]["bootstrapConfig"]["spec"]["diskSetup"] =
        b["desired"]["bootstrapConfig"]["spec"]["diskSetup"].clone();
    b_on_a["desired"]["bootstrapConfig"]["spec"]["joinConfiguration"] =
        a["current"]["bootstrapConfig"]["spec"]["joinConfiguration"].clone();
    b_on_a["desired"]["bootstrapConfig"]["spec"]["files"] =
        a["current"]["bootstrapConfig"]["spec"]["files"].clone();
    let r = ext.can_update_machine(&b_on_a).await;
    assert!(r.get("bootstrapConfigPatch").is_none(), "{r}");
    assert!(r.get("affectsAvailability").is_none(), "{r}");

    // MachineSets: reserved-cpus drains; the files-only change of the same pair does not
    let e = fixture("e-machineset-worker-template/canupdatemachineset-request.json");
    let set = |body: &Value| {
        let ext = &ext;
        let body = body.clone();
        async move { ext.can_update_machine_set(&body).await }
    };
    let r = set(&e).await;
    assert_eq!(r["affectsAvailability"], json!(true), "{r}");
    let mut files_only = e.clone();
    files_only["desired"]["bootstrapConfigTemplate"]["spec"]["template"]["spec"]["joinConfiguration"] =
        e["current"]["bootstrapConfigTemplate"]["spec"]["template"]["spec"]["joinConfiguration"]
            .clone();
    let r = set(&files_only).await;
    assert!(r.get("bootstrapConfigTemplatePatch").is_some(), "{r}");
    assert_eq!(r["affectsAvailability"], json!(false), "{r}");
    assert_eq!(set(&files_only).await, r);
}

/// Every hook answers within its deadline (CAPI's `?timeout=`, else the advertised
/// handler timeout) even when the agent accepts the connection and never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_answer_within_their_deadline_when_the_agent_stalls() {
    let pki = Pki::new();
    let stalled = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = stalled.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in stalled.incoming().take(64) {
            held.push(c); // accepted, never answered
        }
        std::thread::sleep(Duration::from_secs(120));
    });
    let ext = Extension::start(&pki, &[("site-a/edge-1-cp-7xk2p", &addr)], "");
    let a = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    let base = "/hooks.runtime.cluster.x-k8s.io/v1alpha1";
    let t = Instant::now();
    let (status, r) = ext
        .post(
            &format!("{base}/canupdatemachine/can-update-machine?timeout=3s"),
            &a,
        )
        .await;
    let took = t.elapsed();
    assert_eq!(status, 200);
    assert_eq!(r["status"], "Failure", "{r}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    let t = Instant::now();
    let (_, r) = ext
        .post(
            &format!("{base}/updatemachine/update-machine?timeout=3s"),
            &update_request(&a),
        )
        .await;
    let took = t.elapsed();
    assert_eq!(r["status"], "Success", "{r}");
    assert_eq!(r["retryAfterSeconds"], 30, "{r}");
    assert!(r["message"].as_str().unwrap().starts_with("waiting"), "{r}");
    assert!(took < Duration::from_secs(3), "{took:?}");
    // without the query parameter: the advertised 10 s, less the margin
    let t = Instant::now();
    let (_, r) = ext
        .post(&format!("{base}/canupdatemachine/can-update-machine"), &a)
        .await;
    assert_eq!(r["status"], "Failure", "{r}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

/// The MachineDeployment path diffs the raw templates (upstream blanks
/// `joinConfiguration.discovery` only for KCP): a pair that differs only in the discovery
/// token is not covered, naming the path, and the token appears nowhere in the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machine_set_discovery_change_is_seen_as_capi_sees_it() {
    let pki = Pki::new();
    let ext = Extension::start(&pki, &[], "");
    let mut e = fixture("e-machineset-worker-template/canupdatemachineset-request.json");
    let spec = |side: &str| format!("/{side}/bootstrapConfigTemplate/spec/template/spec");
    let cur = e.pointer(&spec("current")).unwrap().clone();
    *e.pointer_mut(&spec("desired")).unwrap() = cur;
    for (side, token) in [
        ("current", "abcdef.0123456789abcdef"),
        ("desired", "uvwxyz.9876543210fedcba"),
    ] {
        e.pointer_mut(&spec(side)).unwrap()["joinConfiguration"]["discovery"] =
            json!({"bootstrapToken": {"token": token, "apiServerEndpoint": "10.0.0.1:6443"}});
    }
    let r = ext.can_update_machine_set(&e).await;
    assert_eq!(r["status"], "Success", "{r}");
    assert!(r.get("bootstrapConfigTemplatePatch").is_none(), "{r}");
    let msg = r["message"].as_str().unwrap();
    assert!(
        msg.contains("spec.template.spec.joinConfiguration.discovery"),
        "{msg}"
    );
    let text = r.to_string();
    assert!(
        !text.contains("9876543210fedcba") && !text.contains("0123456789abcdef"),
        "{text}"
    );
}

/// The extension's metrics: hook calls by hook and answer, their latency, agent calls by
/// result and agent RPCs by hook, scraped from its own port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extension_metrics_count_hooks_answers_and_agent_calls() {
    let pki = Pki::new();
    let mut node = Node::new("ubuntu-2404-grub");
    let addr = pki.agent(&node);
    node.start();
    let metrics = format!("127.0.0.1:{}", free_port());
    let ext = Extension::start(
        &pki,
        &[("site-a/edge-1-cp-7xk2p", &addr)],
        &format!("[metrics]\nlisten = \"{metrics}\"\n"),
    );
    let a = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    ext.can_update_machine(&a).await;
    let seen = poll_update(&ext, &update_request(&a)).await;
    assert_eq!(seen.last().unwrap()["retryAfterSeconds"], 0);
    let body = common::capi::scrape(&metrics);
    let value = |name: &str| -> f64 {
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} not in {body}"))
    };
    assert_eq!(
        value("inplace_extension_hook_calls_total{hook=\"CanUpdateMachine\",answer=\"covered\"}"),
        1.0
    );
    assert_eq!(
        value("inplace_extension_hook_calls_total{hook=\"UpdateMachine\",answer=\"done\"}"),
        1.0
    );
    assert_eq!(
        value("inplace_extension_hook_calls_total{hook=\"UpdateMachine\",answer=\"in_progress\"}"),
        (seen.len() - 1) as f64
    );
    assert!(value("inplace_extension_agent_calls_total{result=\"ok\"}") >= 3.0);
    // the series alerts take increase() of are there at 0 before their first event
    for hook in ["CanUpdateMachine", "CanUpdateMachineSet", "UpdateMachine"] {
        let failures =
            format!("inplace_extension_hook_calls_total{{hook=\"{hook}\",answer=\"failure\"}}");
        assert_eq!(value(&failures), 0.0, "{body}");
        let misses = format!("inplace_extension_deadline_misses_total{{hook=\"{hook}\"}}");
        assert_eq!(value(&misses), 0.0, "{body}");
    }
    assert!(
        body.contains("inplace_extension_build_info{version=\"0.1.0\"} 1"),
        "{body}"
    );
    assert!(value("process_resident_memory_bytes") > 0.0, "{body}");
    // Agent RPCs per hook: CanUpdateMachine one Inspect; UpdateMachine one
    // Inspect per call and one Apply for the attempt it started. The request names no
    // Machine version (this node has no kubelet to verify one: update_request), so the
    // spec inspected is the one applied; `tests/kubernetes_capi.rs` counts a node that
    // reports its version.
    let rpcs = |hook: &str| common::capi::agent_rpcs(&body, hook);
    assert_eq!(
        rpcs("CanUpdateMachine"),
        [("inspect".to_string(), 1.0)],
        "{body}"
    );
    assert_eq!(
        rpcs("UpdateMachine"),
        [
            ("apply".to_string(), 1.0),
            ("inspect".to_string(), seen.len() as f64)
        ],
        "{body}"
    );
    assert_eq!(
        value("inplace_extension_hook_duration_seconds_count{hook=\"CanUpdateMachine\"}"),
        1.0
    );
    node.stop();
}
