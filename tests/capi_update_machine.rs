//! UpdateMachine, black box: the real `inplace-extension` over HTTPS driving real `inplaced`
//! agents on fixture copies to the end of an in-place update: scenario a applied, the
//! bootstrap token never leaked, a reverted update applied again, an agent crash mid-update
//! converging, and a rendered node.d drop-in surviving an unrelated update.

mod common;
use common::capi::{
    Extension, Pki, fixture, fully_covered_then_updated, one_agent, ops, poll_update,
    update_request,
};
use common::*;
use serde_json::{Value, json};
use std::time::Duration;

const TOKEN: &str = "2llldv.b7bn3izenrsfazb2";

const TOKEN_SECRET: &str = "b7bn3izenrsfazb2";

/// Scenario a end to end: CanUpdateMachine answers the fixture's patch from the ubuntu
/// node's coverage; UpdateMachine polled repeatedly is in progress, then done, and the
/// node holds the new kubelet flag and sysctl file; repeating it changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_a_covered_then_applied_by_update_machine() {
    let (_pki, mut node, ext) = one_agent("ubuntu-2404-grub", "site-a/edge-1-cp-7xk2p", |_| {});

    let req = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    let want = fixture("a-kubelet-args-and-sysctl/canupdatemachine-response.json");
    let resp = ext.can_update_machine(&req).await;
    assert_eq!(resp["status"], "Success", "{resp}");
    assert_eq!(
        ops(&resp, "bootstrapConfigPatch"),
        ops(&want, "bootstrapConfigPatch")
    );
    assert!(resp.get("machinePatch").is_none() && resp.get("infrastructureMachinePatch").is_none());
    assert!(
        resp.get("preserveOnInsufficientCoverage").is_none(),
        "{resp}"
    );
    let msg = resp["message"].as_str().unwrap();
    assert!(msg.starts_with("edge-1-cp-7xk2p: in place: spec.joinConfiguration.nodeRegistration.kubeletExtraArgs, spec.files"), "{msg}");
    assert!(msg.contains("kubelet.service"), "{msg}");

    let upd = update_request(&req);
    let seen = poll_update(&ext, &upd).await;
    assert!(
        seen.len() >= 2,
        "the first answer must be in progress: {seen:?}"
    );
    assert_eq!(seen[0]["status"], "Success");
    assert_eq!(seen[0]["retryAfterSeconds"], 30);
    let done = seen.last().unwrap();
    assert_eq!(done["status"], "Success", "{done}");
    assert!(
        done["message"]
            .as_str()
            .unwrap()
            .starts_with("in-place update done: "),
        "{done}"
    );

    let flags = node.read("/var/lib/kubelet/kubeadm-flags.env");
    assert!(flags.contains("--max-pods=250"), "{flags}");
    assert!(
        flags.contains("--node-labels=metal3.io/uuid=7a710f31-7879-4f17-bf4d-646881d6af6a"),
        "rendered value kept: {flags}"
    );
    assert_eq!(
        node.read("/etc/sysctl.d/90-tuning.conf"),
        "vm.max_map_count = 262144\n"
    );
    // Done is stable: the same request again answers done from the node's record.
    let again = ext.update_machine(&upd).await;
    assert_eq!(
        (again["status"].clone(), again["retryAfterSeconds"].clone()),
        (json!("Success"), json!(0))
    );
    assert_eq!(
        node.actions()
            .iter()
            .filter(|a| a.contains("restart kubelet.service"))
            .count(),
        1,
        "{:?}",
        node.actions()
    );
    node.stop();
}

/// Scenario f: UpdateMachine on the static-CPU-manager worker: in progress, then done;
/// the kubelet is stopped, cpu_manager_state removed and the kubelet started; the
/// bootstrap token appears in no log line, no agent state or node file, no response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_f_update_machine_and_the_token_never_leaks() {
    let (_pki, mut node, ext) = one_agent(
        "systemd-boot",
        "site-a/edge-1-md-0-5f8c7d9b4x-k2v9w",
        |node| {
            node.log_file = Some(node.dir.path().join("agent.log"));
        },
    );
    let req = common::capi::without_machine_version(fixture(
        "f-updatemachine-bootstrap-token/updatemachine-request.json",
    ));
    assert!(
        serde_json::to_string(&req).unwrap().contains(TOKEN),
        "the fixture carries the token"
    );
    assert!(node.path("/var/lib/kubelet/cpu_manager_state").exists());

    let seen = poll_update(&ext, &req).await;
    assert_eq!(seen[0]["retryAfterSeconds"], 30, "{seen:?}");
    let done = seen.last().unwrap();
    assert_eq!(done["status"], "Success", "{done}");
    assert_eq!(done["retryAfterSeconds"], 0);
    let actions = node.actions();
    let pos = |s: &str| {
        actions
            .iter()
            .position(|a| a.contains(s))
            .unwrap_or_else(|| panic!("{s} not in {actions:?}"))
    };
    assert!(
        pos("stop kubelet.service") < pos("start kubelet.service"),
        "{actions:?}"
    );
    assert!(!node.path("/var/lib/kubelet/cpu_manager_state").exists());
    assert!(
        node.read("/var/lib/kubelet/kubeadm-flags.env")
            .contains("--reserved-cpus=0-3")
    );
    assert_eq!(
        node.read("/etc/sysctl.d/90-worker.conf"),
        "fs.inotify.max_user_instances = 8192\nfs.inotify.max_user_watches = 524288\n"
    );
    node.stop();

    // The token: not in any response, log, agent state or node file.
    for r in &seen {
        let s = r.to_string();
        assert!(!s.contains(TOKEN_SECRET), "response leaks the token: {s}");
    }
    let logs = format!(
        "{}\n{}",
        ext.log(),
        std::fs::read_to_string(node.dir.path().join("agent.log")).unwrap()
    );
    assert!(
        logs.contains("UpdateMachine"),
        "the extension logs the hook: {logs}"
    );
    assert!(!logs.contains(TOKEN_SECRET), "a log leaks the token");
    for (path, content, _) in common::snapshot(node.dir.path()) {
        assert!(
            !String::from_utf8_lossy(&content).contains(TOKEN_SECRET),
            "{} holds the token",
            path.display()
        );
    }
}

/// An update reverted to an earlier desired spec (A → B → A) is applied again, not
/// answered "done" from A's old operation; polls of each attempt stay idempotent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverted_update_is_applied_again() {
    let (_pki, mut node, ext) = one_agent("ubuntu-2404-grub", "site-a/edge-1-cp-7xk2p", |_| {});
    let a = update_request(&fixture(
        "a-kubelet-args-and-sysctl/canupdatemachine-request.json",
    ));
    let mut b = a.clone();
    b["desired"]["bootstrapConfig"]["spec"]["joinConfiguration"]["nodeRegistration"]["kubeletExtraArgs"]
        [0]["value"] = json!("300");
    let flags = |n: &Node| n.read("/var/lib/kubelet/kubeadm-flags.env");
    for (req, want) in [
        (&a, "--max-pods=250"),
        (&b, "--max-pods=300"),
        (&a, "--max-pods=250"),
        (&b, "--max-pods=300"),
    ] {
        let seen = poll_update(&ext, req).await;
        assert_eq!(seen.last().unwrap()["status"], "Success", "{seen:?}");
        assert!(flags(&node).contains(want), "{want}: {}", flags(&node));
        // Done stays done without another operation.
        let n = node.actions().len();
        assert_eq!(ext.update_machine(req).await["retryAfterSeconds"], 0);
        assert_eq!(node.actions().len(), n);
    }
    let mut c = node.client().await;
    let ids: Vec<String> = c
        .list_operations(inplace_wire::pb::ListOperationsRequest {})
        .await
        .unwrap()
        .into_inner()
        .operations
        .into_iter()
        .map(|o| o.id)
        .collect();
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert!(
        ids[0].ends_with("-r1") && ids[1].ends_with("-r1"),
        "newest first: {ids:?}"
    );
    node.stop();
}

/// The agent dies in the middle of an UpdateMachine (failpoint after the second file
/// write): while it is down the extension keeps CAPI waiting; once it is back, the
/// interrupted operation (rolled back from the journal) is run again and converges,
/// never a sticky Failure and never a false "done". A request without a bootstrap config
/// changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_crash_mid_update_converges() {
    let (_pki, mut node, ext) = one_agent("ubuntu-2404-grub", "site-a/edge-1-cp-7xk2p", |node| {
        node.failpoints = Some("write:2".into());
    });
    let req = update_request(&fixture(
        "a-kubelet-args-and-sysctl/canupdatemachine-request.json",
    ));
    let first = ext.update_machine(&req).await;
    assert_eq!(
        (first["status"].clone(), first["retryAfterSeconds"].clone()),
        (json!("Success"), json!(30)),
        "{first}"
    );
    assert!(
        node.wait_exit(Duration::from_secs(20)).is_some(),
        "the failpoint kills the agent"
    );
    let down = ext.update_machine(&req).await;
    assert_eq!(down["retryAfterSeconds"], 30, "{down}");
    assert!(
        down["message"]
            .as_str()
            .unwrap()
            .starts_with("waiting for the node agent"),
        "{down}"
    );
    node.failpoints = None;
    node.start();
    let seen = poll_update(&ext, &req).await;
    assert_eq!(seen.last().unwrap()["status"], "Success", "{seen:?}");
    assert!(
        node.read("/var/lib/kubelet/kubeadm-flags.env")
            .contains("--max-pods=250")
    );
    assert_eq!(
        node.read("/etc/sysctl.d/90-tuning.conf"),
        "vm.max_map_count = 262144\n"
    );

    let n = node.actions().len();
    for bootstrap in [
        Value::Null,
        json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2", "kind": "KubeadmConfig"}),
    ] {
        let mut none = req.clone();
        none["desired"]["bootstrapConfig"] = bootstrap;
        let r = ext.update_machine(&none).await;
        assert_eq!(
            (r["status"].clone(), r["retryAfterSeconds"].clone()),
            (json!("Success"), json!(0)),
            "{r}"
        );
    }
    assert_eq!(node.actions().len(), n);
    assert!(
        node.read("/var/lib/kubelet/kubeadm-flags.env")
            .contains("--max-pods=250"),
        "nothing reverted"
    );
    node.stop();
}

/// A drop-in provisioned by cloud-init from Jinja (rendered only on the node), applied by
/// the agent at start-up and unchanged in the KubeadmConfig, is kept as the node has it by
/// an unrelated UpdateMachine, not removed and reverted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendered_dropin_survives_an_unrelated_update() {
    let pki = Pki::new();
    let mut node = Node::new("ubuntu-2404-grub");
    let dir = node.path("/etc/inplaced/node.d");
    std::fs::create_dir_all(&dir).unwrap();
    let rendered = "sysctls:\n  vm.swappiness: \"7\"\n";
    std::fs::write(dir.join("10-j.yaml"), rendered).unwrap();
    let addr = pki.agent(&node);
    node.start();
    let ext = Extension::start(&pki, &[("site-a/edge-1-cp-7xk2p", &addr)], "");
    let mut req = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    let entry = json!({"path": "/etc/inplaced/node.d/10-j.yaml", "content": "sysctls:\n  vm.swappiness: \"{{ ds.meta_data.swap }}\"\n"});
    for side in ["current", "desired"] {
        req[side]["bootstrapConfig"]["spec"]["files"]
            .as_array_mut()
            .unwrap()
            .push(entry.clone());
    }
    // wait for the start-up convergence
    for _ in 0..100 {
        if node.read("/proc/sys/vm/swappiness").trim() == "7" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(node.read("/proc/sys/vm/swappiness").trim(), "7");
    let (_, seen) = fully_covered_then_updated(&ext, &req).await;
    let done = seen.last().unwrap();
    assert_eq!(done["status"], "Success", "{seen:?}");
    assert!(
        !done["message"].as_str().unwrap().contains("10-j.yaml"),
        "{done}"
    );
    assert_eq!(node.read("/etc/inplaced/node.d/10-j.yaml"), rendered);
    assert_eq!(node.read("/proc/sys/vm/swappiness").trim(), "7");
    assert!(
        node.read("/var/lib/kubelet/kubeadm-flags.env")
            .contains("--max-pods=250")
    );
    node.stop();
}
