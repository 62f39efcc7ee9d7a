//! The kubelet section, black box: KubeletConfiguration and kubeadm-flags.env edits that
//! keep every other byte and revert to the original bytes, fields the agent can not change
//! in place (overridden by flags or kubeletExtraArgs, unknown, in a symlinked file), the
//! CPU and Topology manager checkpoints, and the health gate after a restart.

mod common;
use common::*;
use inplace_wire::pb::{DisruptionLevel, Phase};
use std::io::{Read, Write};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_kubelet_configuration_merge_keeps_every_other_byte() {
    for fixture in [
        "ubuntu-2404-grub",
        "fedora-41-bls",
        "rhel8-grubenv",
        "systemd-boot",
    ] {
        let mut node = Node::new(fixture);
        let before = node.read("/var/lib/kubelet/config.yaml");
        let flags_before = node.read("/var/lib/kubelet/kubeadm-flags.env");
        node.start();
        let yaml = "kubelet:\n  config:\n    maxPods: 250\n    systemReserved:\n      cpu: 500m\n    cgroupRoot: \"on\"\n    podLogsDir: \"no\"\n";
        let r = coverage(&node, yaml).await;
        let max_pods = change(&r, "kubelet.config.maxPods");
        if flags_before.contains("--max-pods=") {
            // kubeadm-flags.env overrides config.yaml: a merge there would have no effect
            assert!(!max_pods.covered, "{fixture}: {max_pods:?}");
            assert!(
                max_pods.reason.contains("--max-pods=110"),
                "{}",
                max_pods.reason
            );
            continue;
        }
        assert!(r.fully_covered, "{fixture}: {:#?}", r.changes);
        let op = apply(&node, yaml, "merge").await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{fixture}: {op:?}");
        let after = node.read("/var/lib/kubelet/config.yaml");
        let old: Vec<&str> = before.lines().collect();
        let new: Vec<&str> = after.lines().collect();
        // every old line is still there, in order
        let mut it = new.iter();
        for l in &old {
            assert!(
                it.any(|n| n == l),
                "{fixture}: line {l:?} lost or reordered:\n{after}"
            );
        }
        let added: Vec<&&str> = new.iter().filter(|l| !old.contains(l)).collect();
        for want in ["maxPods: 250", "cgroupRoot: \"on\"", "podLogsDir: \"no\""] {
            assert!(
                added.iter().any(|l| **l == want),
                "{fixture}: {want} missing in\n{after}"
            );
        }
        assert!(after.contains("infoBufferSize: \"0\""), "{fixture}");
        let doc = inplace_formats::kubelet::config::parse(&after).unwrap();
        assert_eq!(doc["maxPods"], serde_json::json!(250));
        assert_eq!(doc["systemReserved"]["cpu"], serde_json::json!("500m"));
        assert_eq!(doc["cgroupRoot"], serde_json::json!("on"));
        assert_eq!(node.actions(), vec!["restart kubelet.service".to_string()]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flag_overridden_by_kubelet_extra_args_is_not_covered() {
    let mut node = Node::new("rhel8-grubenv");
    node.start();
    let r = coverage(&node, "kubelet:\n  flags:\n    node-ip: 192.0.2.99\n").await;
    let c = change(&r, "kubelet.flags[node-ip]");
    assert!(!c.covered);
    assert!(
        c.reason
            .starts_with("--node-ip=192.0.2.21 in /etc/sysconfig/kubelet (KUBELET_EXTRA_ARGS)"),
        "{}",
        c.reason
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlinked_kubelet_file_is_not_covered_and_left_alone() {
    let mut node = Node::new("ubuntu-2404-grub");
    let flags = node.path("/var/lib/kubelet/kubeadm-flags.env");
    std::fs::rename(&flags, node.path("/var/lib/kubelet/kubeadm-flags.env.real")).unwrap();
    std::os::unix::fs::symlink("kubeadm-flags.env.real", &flags).unwrap();
    let before = snapshot(&node.root);
    node.start();
    let r = coverage(&node, "kubelet:\n  flags:\n    max-pods: \"250\"\n").await;
    let c = change(&r, "kubelet.flags[max-pods]");
    assert!(!c.covered);
    assert!(c.reason.contains("is a symlink"), "{}", c.reason);
    assert_eq!(snapshot(&node.root), before);
    assert!(
        std::fs::symlink_metadata(&flags)
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_manager_changes_drain_and_reset_the_checkpoint() {
    let mut node = Node::new("systemd-boot");
    node.start();
    let yaml = "kubelet:\n  flags:\n    reserved-cpus: \"0-3\"\n";
    let r = coverage(&node, yaml).await;
    let c = change(&r, "kubelet.flags[reserved-cpus]");
    assert!(c.covered, "{c:?}");
    let d = c.disruption.as_ref().unwrap();
    assert_eq!(d.level, DisruptionLevel::Drain as i32);
    assert_eq!(d.units, vec!["kubelet.service".to_string()]);
    assert!(c.reason.contains("cpu_manager_state"), "{}", c.reason);
    let op = apply(&node, yaml, "cpus").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(
        node.actions(),
        vec!["stop kubelet.service", "start kubelet.service"]
    );
    assert!(!node.path("/var/lib/kubelet/cpu_manager_state").exists());
    assert!(
        op.actions
            .contains(&"removed /var/lib/kubelet/cpu_manager_state".to_string()),
        "{:?}",
        op.actions
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_manager_changes_drain_and_reset_both_checkpoints() {
    // the topology manager aligns the CPU and memory managers' assignments: a change of
    // its policy, scope or options invalidates both checkpoints
    for (yaml, id) in [
        (
            "kubelet:\n  flags:\n    topology-manager-policy: single-numa-node\n",
            "kubelet.flags[topology-manager-policy]",
        ),
        (
            "kubelet:\n  config:\n    topologyManagerScope: pod\n",
            "kubelet.config.topologyManagerScope",
        ),
    ] {
        let mut node = Node::new("systemd-boot");
        std::fs::write(node.path("/var/lib/kubelet/memory_manager_state"), "{}\n").unwrap();
        node.start();
        let r = coverage(&node, yaml).await;
        let c = change(&r, id);
        assert!(c.covered, "{c:?}");
        let d = c.disruption.as_ref().unwrap();
        assert_eq!(d.level, DisruptionLevel::Drain as i32, "{id}");
        assert_eq!(d.units, vec!["kubelet.service".to_string()]);
        assert!(c.reason.contains("topology manager"), "{}", c.reason);
        let op = apply(&node, yaml, "topology").await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
        assert_eq!(
            node.actions(),
            vec!["stop kubelet.service", "start kubelet.service"],
            "{id}"
        );
        for f in [
            "/var/lib/kubelet/cpu_manager_state",
            "/var/lib/kubelet/memory_manager_state",
        ] {
            assert!(!node.path(f).exists(), "{id}: {f} left");
            assert!(
                op.actions.contains(&format!("removed {f}")),
                "{id}: {:?}",
                op.actions
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_fields_overridden_by_flags_or_unknown_are_not_covered() {
    let mut node = Node::new("fedora-41-bls");
    let flags = node.read("/var/lib/kubelet/kubeadm-flags.env").replace(
        "KUBELET_KUBEADM_ARGS=\"",
        "KUBELET_KUBEADM_ARGS=\"--kube-api-qps=50 --client-ca-file=/etc/ca.crt ",
    );
    std::fs::write(node.path("/var/lib/kubelet/kubeadm-flags.env"), flags).unwrap();
    node.start();
    let yaml = "kubelet:\n  config:\n    kubeAPIQPS: 100\n    maxPodz: 1\n    authentication:\n      x509:\n        clientCAFile: /etc/other.crt\n    evictionHard:\n      memory.available: 200Mi\n";
    let r = coverage(&node, yaml).await;
    let qps = change(&r, "kubelet.config.kubeAPIQPS");
    assert!(
        !qps.covered && qps.reason.contains("--kube-api-qps=50"),
        "{}",
        qps.reason
    );
    let ca = change(&r, "kubelet.config.authentication.x509.clientCAFile");
    assert!(
        !ca.covered && ca.reason.contains("--client-ca-file"),
        "{}",
        ca.reason
    );
    let typo = change(&r, "kubelet.config.maxPodz");
    assert!(
        !typo.covered && typo.reason.contains("not a KubeletConfiguration"),
        "{}",
        typo.reason
    );
    // the fixture sets --eviction-hard as a flag too (a dotted key keeps its own id)
    let eviction = change(&r, "kubelet.config.evictionHard[\"memory.available\"]");
    assert!(!eviction.covered, "{eviction:?}");
    assert!(
        eviction
            .reason
            .contains("--eviction-hard=memory.available<500Mi,nodefs.available<10%"),
        "{}",
        eviction.reason
    );
}

/// The example (`clusterDomain: "off"`, `resolvConf: "null"`, both quoted by
/// necessity) and others of the class (a single-quoted original, a nested map value, an
/// integer field): after the empty spec the file is byte-identical to before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revert_restores_each_fields_original_bytes() {
    let cfg = "/var/lib/kubelet/config.yaml";
    for (edit_original, yaml) in [
        (
            None,
            "kubelet:\n  config:\n    clusterDomain: \"off\"\n    resolvConf: \"null\"\n",
        ),
        (
            Some((
                "clusterDomain: cluster.local",
                "clusterDomain: 'cluster.local'",
            )),
            "kubelet:\n  config:\n    clusterDomain: \"yes\"\n",
        ),
        (
            Some((
                "resolvConf: /run/systemd/resolve/resolv.conf",
                "resolvConf: \"/run/systemd/resolve/resolv.conf\"",
            )),
            "kubelet:\n  config:\n    resolvConf: /etc/resolv.conf\n",
        ),
        (
            None,
            "kubelet:\n  config:\n    evictionHard:\n      memory.available: \"off\"\n",
        ),
    ] {
        let mut node = Node::new("ubuntu-2404-grub");
        if let Some((from, to)) = edit_original {
            let t = node.read(cfg).replace(from, to);
            std::fs::write(node.path(cfg), t).unwrap();
        }
        let before = node.read(cfg);
        node.start();
        let op = apply(&node, yaml, "set").await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{yaml}: {}", op.message);
        assert_ne!(node.read(cfg), before, "{yaml}");
        let op = apply(&node, "{}\n", "revert").await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{yaml}: {}", op.message);
        assert_eq!(
            node.read(cfg),
            before,
            "{yaml}: not byte-identical after the revert"
        );
    }
}

/// A spec value of the wrong type for its KubeletConfiguration field (types of
/// `k8s.io/kubelet/config/v1beta1`): an unquoted `no` in a string-valued map, `0644`
/// for a string, a string for an integer, a string in `featureGates` (bool-valued).
/// INVALID_ARGUMENT naming the field and the expected type; nothing written. Quoted, the
/// same values are written as strings the kubelet reads back as strings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_field_types_decide_how_a_value_is_written() {
    let mut node = Node::new("ubuntu-2404-grub");
    let cfg = "/var/lib/kubelet/config.yaml";
    let before = node.read(cfg);
    node.start();
    for (yaml, field, want) in [
        (
            "evictionHard:\n      memory.available: no",
            "kubelet.config.evictionHard[\"memory.available\"]",
            "as a string",
        ),
        (
            "clusterDomain: 0644",
            "kubelet.config.clusterDomain",
            "as a string",
        ),
        (
            "maxPods: \"110\"",
            "kubelet.config.maxPods",
            "as an integer",
        ),
        (
            "featureGates:\n      KubeletTracing: \"yes\"",
            "kubelet.config.featureGates[\"KubeletTracing\"]",
            "as a boolean",
        ),
        (
            "serializeImagePulls: \"false\"",
            "kubelet.config.serializeImagePulls",
            "as a boolean",
        ),
    ] {
        let (code, msg) = refusal(&node, &format!("kubelet:\n  config:\n    {yaml}\n")).await;
        assert_eq!(code, tonic::Code::InvalidArgument, "{yaml}: {msg}");
        assert!(msg.contains(field) && msg.contains(want), "{yaml}: {msg}");
    }
    assert_eq!(node.read(cfg), before);
    let op = apply(
        &node,
        "kubelet:\n  config:\n    clusterDomain: \"0644\"\n    evictionHard:\n      memory.available: \"no\"\n",
        "quoted",
    )
    .await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    let text = node.read(cfg);
    let doc = inplace_formats::kubelet::config::parse(&text).unwrap();
    assert_eq!(doc["clusterDomain"], "0644", "{text}");
    assert_eq!(doc["evictionHard"]["memory.available"], "no", "{text}");
}

/// A node without kubeadm-flags.env at all: the agent creates it for a flag; dropping the
/// flag must leave no file (the original state), not an empty one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_env_the_agent_created_is_gone_after_the_drop() {
    let mut node = Node::new("ubuntu-2404-grub");
    let p = "/var/lib/kubelet/kubeadm-flags.env";
    std::fs::remove_file(node.path(p)).unwrap();
    node.start();
    let yaml = "kubelet:\n  flags:\n    max-pods: \"250\"\n";
    let op = apply(&node, yaml, "one").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert!(node.read(p).contains("--max-pods=250"));
    let op = apply(&node, "{}\n", "drop").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert!(
        !node.path(p).exists(),
        "left behind: {:?}",
        std::fs::read_to_string(node.path(p))
    );
}

/// A one-route HTTP server answering `status` to every request, for `n` requests at most.
fn fake_healthz(status: u16) -> (String, std::thread::JoinHandle<()>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/healthz", l.local_addr().unwrap());
    let h = std::thread::spawn(move || {
        for s in l.incoming().take(50) {
            let Ok(mut s) = s else { break };
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let reason = if status == 200 {
                "OK"
            } else {
                "Internal Server Error"
            };
            let _ = write!(
                s,
                "HTTP/1.1 {status} {reason}\r\ncontent-length: 2\r\nconnection: close\r\n\r\nno"
            );
        }
    });
    (url, h)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhealthy_kubelet_rolls_back_and_restarts_again() {
    let (url, _server) = fake_healthz(500);
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(
        &node.config,
        format!("[kubelet]\nhealthz_url = \"{url}\"\nhealth_timeout_secs = 1\n"),
    )
    .unwrap();
    let config_before = node.read("/var/lib/kubelet/config.yaml");
    let flags_before = node.read("/var/lib/kubelet/kubeadm-flags.env");
    node.start();
    let op = apply(
        &node,
        "kubelet:\n  config:\n    serializeImagePulls: false\n  flags:\n    max-pods: \"250\"\n",
        "sick",
    )
    .await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{op:?}");
    // the whole message, the times the checks took aside: the cause, the undo, the
    // restart and the kubelet's health after it, and nothing that contradicts them
    let parts: Vec<&str> = op.message.split("(checked for ").collect();
    let timeless = parts[1..].iter().fold(parts[0].to_string(), |m, p| {
        format!(
            "{m}(checked for _s){}",
            p.split_once("s)").map_or(*p, |(_, r)| r)
        )
    });
    let unhealthy = format!("GET {url} answered 500 Internal Server Error (checked for _s)");
    assert_eq!(
        timeless,
        format!(
            "kubelet health check failed: {unhealthy}; rolled back: 2 step(s) undone, 2 file(s) restored and read back, kubelet.service restarted (its state is not checked: the service manager does not report it); the kubelet is still unhealthy: {unhealthy}"
        ),
        "{}",
        op.message
    );
    assert_eq!(node.read("/var/lib/kubelet/config.yaml"), config_before);
    assert_eq!(
        node.read("/var/lib/kubelet/kubeadm-flags.env"),
        flags_before
    );
    assert_eq!(
        node.actions(),
        vec!["restart kubelet.service", "restart kubelet.service"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_healthz_is_a_failure_and_a_healthy_one_passes() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(
        &node.config,
        "[kubelet]\nhealthz_url = \"http://127.0.0.1:9/healthz\"\nhealth_timeout_secs = 1\n",
    )
    .unwrap();
    node.start();
    let op = apply(&node, "kubelet:\n  flags:\n    max-pods: \"250\"\n", "down").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{op:?}");
    assert!(op.message.contains("unreachable"), "{}", op.message);
    node.stop();

    let (url, _server) = fake_healthz(200);
    std::fs::write(
        &node.config,
        format!("[kubelet]\nhealthz_url = \"{url}\"\n"),
    )
    .unwrap();
    node.start();
    let op = apply(&node, "kubelet:\n  flags:\n    max-pods: \"250\"\n", "up").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert!(
        op.actions.contains(&"kubelet healthy".to_string()),
        "{:?}",
        op.actions
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_successive_kubelet_changes_restart_after_the_last_write() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    apply(
        &node,
        "kubelet:\n  flags:\n    max-pods: \"200\"\n",
        "first",
    )
    .await;
    let op = apply(
        &node,
        "kubelet:\n  flags:\n    max-pods: \"210\"\n",
        "second",
    )
    .await;
    let w = op
        .actions
        .iter()
        .position(|a| a.starts_with("wrote /var/lib/kubelet/kubeadm-flags.env"))
        .unwrap();
    let r = op
        .actions
        .iter()
        .position(|a| a == "restarted kubelet.service")
        .unwrap();
    assert!(w < r, "{:?}", op.actions);
    assert_eq!(
        node.actions(),
        vec!["restart kubelet.service", "restart kubelet.service"]
    );
    assert!(
        node.read("/var/lib/kubelet/kubeadm-flags.env")
            .contains("--max-pods=210")
    );
}
