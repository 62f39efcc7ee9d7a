//! Black-box safety cases found by trying to break the agent: rollback, supersession,
//! one agent per node, refusal of changes that would have no effect or break the kubelet.

mod common;

use common::{Node, apply, change, coverage, err, out, snapshot, spec, status};
use inplace_wire::pb;
use inplace_wire::pb::{DisruptionLevel, Phase};

const SCENARIO_A: &str = include_str!("../examples/specs/kubelet-and-sysctl.yaml");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_restart_rolls_every_write_and_sysctl_back() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.fail = Some("restart kubelet.service".into());
    let yaml = format!("{SCENARIO_A}sysctls:\n  vm.swappiness: \"10\"\n");
    let before = snapshot(&node.root);
    node.start();
    let op = apply(&node, &yaml, "fails").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{op:?}");
    assert!(
        op.message
            .starts_with("acting: restart kubelet.service: failed on purpose"),
        "{}",
        op.message
    );
    assert!(
        op.message.contains("the node is as before"),
        "{}",
        op.message
    );
    assert_eq!(
        snapshot(&node.root),
        before,
        "every file and live sysctl restored"
    );
    let s = status(&node).await;
    assert_eq!(s.managed_items, 0, "nothing recorded as applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_a_applies_the_sysctl_drop_in_live() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let r = coverage(&node, SCENARIO_A).await;
    let c = change(&r, "files[/etc/sysctl.d/90-tuning.conf]");
    assert!(c.reason.contains("applied live"), "{}", c.reason);
    let op = apply(&node, SCENARIO_A, "a").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(node.read("/proc/sys/vm/max_map_count"), "262144\n");
    assert_eq!(node.actions(), vec!["restart kubelet.service".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_apply_supersedes_an_operation_waiting_for_reboot() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let op = apply(&node, "kernelArgs: [nosmt]\n", "kargs").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32);
    let op = apply(&node, SCENARIO_A, "other").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let old = node.settle("kargs").await;
    assert_eq!(old.phase, Phase::Failed as i32);
    assert!(
        old.message.starts_with("superseded by operation other"),
        "{}",
        old.message
    );
    let e = node
        .client()
        .await
        .reboot(pb::RebootRequest {
            operation_id: "kargs".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("is Failed, not waiting for a reboot"),
        "{}",
        e.message()
    );
    assert!(!node.actions().iter().any(|a| a.starts_with("reboot")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agent_per_state_directory_and_socket() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let second = node
        .daemon_with(&node.state, &node.dir.path().join("other.sock"))
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(
        err(&second).contains("held by another inplaced"),
        "{}",
        err(&second)
    );
    let third = node
        .daemon_with(&node.dir.path().join("other-state"), &node.socket)
        .output()
        .unwrap();
    assert!(!third.status.success());
    assert!(
        err(&third).contains("is in use by a running server"),
        "{}",
        err(&third)
    );
    // the first agent still answers
    let o = node.ctl(&["status"]);
    assert!(o.status.success(), "{}", err(&o));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unit_drop_ins_reload_systemd_and_restart_their_unit() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let yaml = "files:\n- path: /etc/systemd/system/kubelet.service.d/20-limits.conf\n  content: \"[Service]\\nLimitNOFILE=1048576\\n\"\n";
    let r = coverage(&node, yaml).await;
    let d = r.changes[0].disruption.clone().unwrap();
    assert_eq!(d.level, DisruptionLevel::DaemonReload as i32);
    assert_eq!(d.units, vec!["kubelet.service".to_string()]);
    let op = apply(&node, yaml, "dropin").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(
        node.actions(),
        vec!["daemon-reload", "try-restart kubelet.service"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysctls_that_would_not_persist_or_can_not_be_written_are_not_covered() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(
        node.path("/etc/sysctl.d/zz-local.conf"),
        "vm.swappiness = 99\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        node.path("/proc/sys/kernel/random/boot_id"),
        std::fs::Permissions::from_mode(0o444),
    )
    .unwrap();
    node.start();
    let r = coverage(
        &node,
        "sysctls:\n  vm.swappiness: \"10\"\n  kernel.random.boot_id: x\n  vm.nosuch: \"1\"\n",
    )
    .await;
    let c = change(&r, "sysctls[vm.swappiness]");
    assert!(!c.covered);
    assert!(
        c.reason
            .starts_with("/etc/sysctl.d/zz-local.conf sets vm.swappiness = 99"),
        "{}",
        c.reason
    );
    let c = change(&r, "sysctls[kernel.random.boot_id]");
    assert_eq!(c.reason, "/proc/sys/kernel/random/boot_id is read-only");
    let c = change(&r, "sysctls[vm.nosuch]");
    assert!(
        c.reason.contains("does not exist on this node"),
        "{}",
        c.reason
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_own_files_and_boot_files_are_not_writable_as_files() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.state = node.root.join("var/lib/inplaced");
    node.start();
    let yaml = "files:\n- path: /var/lib/inplaced/applied.json\n  content: \"{}\"\n- path: /etc/default/grub\n  content: x\n- path: /boot/grub/grub.cfg\n  content: x\n";
    let r = coverage(&node, yaml).await;
    for (id, want) in [
        (
            "files[/var/lib/inplaced/applied.json]",
            "managed by inplaced itself",
        ),
        (
            "files[/etc/default/grub]",
            "managed by the kernelArgs section",
        ),
        ("files[/boot/grub/grub.cfg]", "boot configuration"),
    ] {
        let c = change(&r, id);
        assert!(!c.covered && c.reason.contains(want), "{id}: {}", c.reason);
    }
    // invalid ids and owners are refused outright
    let e = node
        .client()
        .await
        .get_coverage(pb::GetCoverageRequest {
            desired: Some(spec("files:\n- path: /etc/x\n  owner: \"4294967295\"\n")),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e = node
        .client()
        .await
        .get_coverage(pb::GetCoverageRequest {
            desired: Some(spec("kernelArgs: [root=/dev/sda1]\n")),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message()
            .contains("kernelArgs[0]: root is set by the installer"),
        "{}",
        e.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_survives_a_corrupt_operation_file_and_watch_replays_every_phase() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let p = node.spec("a.yaml", SCENARIO_A);
    let o = node.ctl(&["apply", "-f", &p, "--id", "first", "--wait"]);
    let text = out(&o);
    let phases: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with('['))
        .map(|l| l.split_whitespace().nth(2).unwrap())
        .collect();
    assert_eq!(
        phases,
        [
            "Validating",
            "Staging",
            "Committing",
            "Acting",
            "Verifying",
            "Succeeded"
        ],
        "{text}"
    );
    node.stop();
    std::fs::write(node.state.join("operations/broken.json"), "{\"id\": \"bro").unwrap();
    node.start();
    let o = node.ctl(&["history"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(out(&o).contains("first"));
    // a closed pipe ends inplacectl quietly
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} --socket {} history | head -c 1 >/dev/null; exit 0",
            env!("CARGO_BIN_EXE_inplacectl"),
            node.socket.display()
        ))
        .output()
        .unwrap();
    assert!(!err(&o).contains("panicked"), "{}", err(&o));
    // coverage of a spec that is not fully covered exits 3
    let bad = node.spec("bad.yaml", "sysctls:\n  vm.nosuch: \"1\"\n");
    assert_eq!(node.ctl(&["coverage", "-f", &bad]).status.code(), Some(3));
}
