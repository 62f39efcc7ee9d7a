//! Black-box tests: the real `inplaced` on a temporary socket over a copy of each fixture
//! node, driven by `inplacectl` and by a gRPC client. These are the "right values" of
//! issue 2.

mod common;

use common::{Node, apply, change, coverage, err, out, snapshot, spec, status};
use inplace_wire::pb;
use inplace_wire::pb::{ChangeOperation, DisruptionLevel, Phase};
use prost::Message;

const SCENARIO_A: &str = include_str!("../examples/specs/kubelet-and-sysctl.yaml");

fn level(d: &Option<pb::Disruption>) -> DisruptionLevel {
    DisruptionLevel::try_from(d.as_ref().unwrap().level).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_a_kubelet_flag_and_sysctl_file_on_ubuntu() {
    let mut node = Node::new("ubuntu-2404-grub");
    let config_before = std::fs::read(node.path("/var/lib/kubelet/config.yaml")).unwrap();
    node.start();

    let r = coverage(&node, SCENARIO_A).await;
    assert!(r.fully_covered, "{r:#?}");
    assert!(!r.reboot_required);
    let max = r.max_disruption.clone().unwrap();
    assert_eq!(max.level, DisruptionLevel::Restart as i32);
    assert_eq!(max.units, vec!["kubelet.service".to_string()]);
    assert_eq!(r.changes.len(), 2, "{r:#?}");
    let flag = change(&r, "kubelet.flags[max-pods]");
    assert_eq!((flag.before.as_str(), flag.after.as_str()), ("110", "250"));
    assert_eq!(flag.operation, ChangeOperation::Update as i32);
    let file = change(&r, "files[/etc/sysctl.d/90-tuning.conf]");
    assert_eq!(level(&file.disruption), DisruptionLevel::None);
    assert!(
        !file.after.contains("262144"),
        "file content must never be echoed"
    );
    let facts = r.facts.as_ref().unwrap();
    assert_eq!(facts.platform, "bare-metal");
    let p = r.preservation.as_ref().unwrap();
    assert!(p.preserve);
    assert!(
        p.reasons
            .contains(&"bare metal: Dell Inc. PowerEdge R650".to_string()),
        "{p:?}"
    );

    // apply through the CLI and wait
    let path = node.spec("a.yaml", SCENARIO_A);
    let o = node.ctl(&["apply", "-f", &path, "--id", "scenario-a", "--wait"]);
    assert!(o.status.success(), "{}{}", out(&o), err(&o));
    assert!(out(&o).contains("Succeeded"), "{}", out(&o));

    assert_eq!(
        node.read("/var/lib/kubelet/kubeadm-flags.env"),
        "KUBELET_KUBEADM_ARGS=\"--max-pods=250 --node-labels=metal3.io/uuid=7a710f31-7879-4f17-bf4d-646881d6af6a --pod-infra-container-image=registry.k8s.io/pause:3.10.1 --provider-id=metal3://site-a/host-03/edge-1-cp-7xk2p\"\n"
    );
    assert_eq!(
        std::fs::read(node.path("/var/lib/kubelet/config.yaml")).unwrap(),
        config_before,
        "config.yaml must stay byte-identical"
    );
    assert_eq!(
        node.read("/etc/sysctl.d/90-tuning.conf"),
        "vm.max_map_count = 262144\n"
    );
    assert_eq!(node.actions(), vec!["restart kubelet.service".to_string()]);

    let o = node.ctl(&["status"]);
    assert!(o.status.success(), "{}", err(&o));
    let s = status(&node).await;
    assert_eq!(s.applied_spec_hash, r.spec_hash);
    assert!(s.drift.is_empty(), "{:?}", s.drift);
    let h = node.ctl(&["history"]);
    assert!(
        out(&h).contains("scenario-a") && out(&h).contains("Succeeded"),
        "{}",
        out(&h)
    );
    let op = node
        .client()
        .await
        .get_operation(pb::GetOperationRequest {
            id: "scenario-a".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(op.phase, Phase::Succeeded as i32);

    // the same spec again: nothing to do
    let again = coverage(&node, SCENARIO_A).await;
    assert!(again.changes.is_empty(), "{:#?}", again.changes);
}

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
async fn sticky_file_under_missing_parents_ignores_umask() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.umask = Some(0o077);
    node.start();
    let yaml = "files:\n- path: /usr/local/share/edge/scratch/README\n  content: \"x\\n\"\n  mode: \"1777\"\n";
    let op = apply(&node, yaml, "sticky").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::symlink_metadata(node.path(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("/usr/local/share/edge/scratch/README"), 0o1777);
    for d in [
        "/usr/local",
        "/usr/local/share",
        "/usr/local/share/edge",
        "/usr/local/share/edge/scratch",
    ] {
        assert_eq!(mode(d), 0o755, "{d}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_under_a_regular_file_is_not_covered_and_nothing_changes() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::create_dir_all(node.path("/home/ops")).unwrap();
    std::fs::write(node.path("/home/ops/test"), "i am a file\n").unwrap();
    node.start();
    let yaml = "files:\n- path: /home/ops/test/cfg\n  content: x\nkubelet:\n  flags:\n    max-pods: \"250\"\n";
    let r = coverage(&node, yaml).await;
    let c = change(&r, "files[/home/ops/test/cfg]");
    assert!(!c.covered);
    assert_eq!(
        c.reason,
        "parent /home/ops/test is a regular file, not a directory"
    );
    assert!(!r.fully_covered);
    let before = snapshot(&node.root);
    let e = node
        .client()
        .await
        .apply(pb::ApplyRequest {
            desired: Some(spec(yaml)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("/home/ops/test"), "{}", e.message());
    assert_eq!(
        snapshot(&node.root),
        before,
        "apply must not change anything"
    );
    assert!(node.actions().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_resolve_through_the_nodes_own_account_files() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let yaml = "files:\n- path: /etc/etcd-defrag/defrag.env\n  content: \"A=1\\n\"\n  mode: \"0600\"\n  owner: etcd:etcd\n";
    let r = coverage(&node, yaml).await;
    let c = change(&r, "files[/etc/etcd-defrag/defrag.env]");
    assert!(c.covered, "{c:?}");
    assert!(
        c.after.ends_with("mode=0600 uid=997 gid=997"),
        "{}",
        c.after
    );
    if rustix::process::geteuid().is_root() {
        let op = apply(&node, yaml, "etcd").await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(node.path("/etc/etcd-defrag/defrag.env")).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (997, 997, 0o600));
    }
    let r = coverage(&node, "files:\n- path: /etc/x\n  owner: nosuchuser\n").await;
    let c = change(&r, "files[/etc/x]");
    assert!(!c.covered);
    assert_eq!(
        c.reason,
        "user \"nosuchuser\" does not exist in the node's /etc/passwd"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_args_on_grub_default_file() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let yaml = include_str!("../examples/specs/kernel-args.yaml");
    let r = coverage(&node, yaml).await;
    assert!(r.fully_covered, "{r:#?}");
    assert!(r.reboot_required);
    for id in ["kernelArgs[isolcpus]", "kernelArgs[nohz_full]"] {
        let c = change(&r, id);
        assert_eq!(level(&c.disruption), DisruptionLevel::Reboot);
        assert_eq!(c.targets, vec!["/etc/default/grub".to_string()]);
    }
    let op = apply(&node, yaml, "kargs").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    let grub = node.read("/etc/default/grub");
    assert!(
        grub.contains(
            "\nGRUB_CMDLINE_LINUX=\"intel_iommu=on iommu=pt isolcpus=2-7 nohz_full=2-7\"\n"
        ),
        "{grub}"
    );
    assert_eq!(node.actions(), vec!["run update-grub".to_string()]);

    // staged, not running: a reboot and no edit
    let r = coverage(&node, yaml).await;
    assert_eq!(r.changes.len(), 1, "{:#?}", r.changes);
    assert_eq!(r.changes[0].id, "kernelArgs");
    assert!(r.reboot_required);

    // the caller reboots; after boot the agent verifies /proc/cmdline
    let o = node.ctl(&["reboot", "kargs"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(node.actions().last().unwrap().starts_with("reboot "));
    node.stop();
    let cmdline = node.read("/proc/cmdline");
    std::fs::write(
        node.path("/proc/cmdline"),
        format!("{} isolcpus=2-7 nohz_full=2-7\n", cmdline.trim_end()),
    )
    .unwrap();
    std::fs::write(
        node.path("/proc/sys/kernel/random/boot_id"),
        "22222222-2222-2222-2222-222222222222\n",
    )
    .unwrap();
    node.start();
    let op = node.settle("kargs").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert!(coverage(&node, yaml).await.changes.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_args_on_bls_entries() {
    let mut node = Node::new("fedora-41-bls");
    let rescue = "/boot/loader/entries/60427531c86a90c5034f2e849abe07c5-0-rescue.conf";
    let rescue_before = node.read(rescue);
    node.start();
    let yaml = include_str!("../examples/specs/kernel-args.yaml");
    let r = coverage(&node, yaml).await;
    assert!(r.fully_covered, "{r:#?}");
    assert!(
        r.facts
            .unwrap()
            .kernel_args_backend
            .starts_with("bls: 2 kernel entries")
    );
    let op = apply(&node, yaml, "kargs").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    let tail = "systemd.firstboot=off transparent_hugepage=madvise isolcpus=2-7 nohz_full=2-7";
    for e in ["6.14.11-200.fc41.x86_64", "6.15.9-201.fc41.x86_64"] {
        let t = node.read(&format!(
            "/boot/loader/entries/60427531c86a90c5034f2e849abe07c5-{e}.conf"
        ));
        let options = t.lines().find(|l| l.starts_with("options ")).unwrap();
        assert!(options.ends_with(tail), "{options}");
        assert!(t.contains("grub_users $grub_users\ngrub_arg --unrestricted\ngrub_class fedora\n"));
    }
    assert_eq!(node.read(rescue), rescue_before);
    assert!(node.read("/etc/kernel/cmdline").trim_end().ends_with(tail));
    assert!(
        node.read("/etc/default/grub")
            .contains(&format!("{tail}\"\n"))
    );
    assert!(
        node.actions().is_empty(),
        "BLS needs no regeneration: {:?}",
        node.actions()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_specs_name_the_field_without_a_backtrace() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    for (yaml, want) in [
        ("filez: []\n", "filez"),
        ("files:\n- path: /etc/x\n  mode: 644\n", "files[0].mode"),
        ("files:\n- path: \"\"\n", "files[0].path: path is empty"),
        (
            "files:\n- path: etc/x\n",
            "files[0].path: path \"etc/x\" is relative",
        ),
    ] {
        let p = node.spec("bad.yaml", yaml);
        for cmd in ["coverage", "apply"] {
            let o = node.ctl(&[cmd, "-f", &p]);
            assert_eq!(o.status.code(), Some(2), "{cmd} {yaml}: {}", err(&o));
            let e = err(&o);
            let first = e.lines().next().unwrap_or_default();
            assert!(
                first.starts_with("inplacectl: error: ") && first.contains(want),
                "{cmd} {yaml}: {e}"
            );
            assert!(
                !e.contains("panicked") && !e.contains("RUST_BACKTRACE"),
                "{e}"
            );
        }
    }
    // the server says INVALID_ARGUMENT for a bad wire spec
    let bad = pb::NodeSpec {
        files: vec![pb::File {
            path: "relative/x".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let e = node
        .client()
        .await
        .get_coverage(pb::GetCoverageRequest {
            desired: Some(bad),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("files[0].path"), "{}", e.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coverage_is_deterministic_and_json_is_camel_case() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let yaml = include_str!("../examples/specs/full.yaml");
    let a = coverage(&node, yaml).await.encode_to_vec();
    let b = coverage(&node, yaml).await.encode_to_vec();
    assert_eq!(a, b);
    let p = node.spec("full.yaml", yaml);
    let o1 = node.ctl(&["-o", "json", "coverage", "-f", &p]);
    let o2 = node.ctl(&["-o", "json", "coverage", "-f", &p]);
    assert!(o1.status.success(), "{}", err(&o1));
    assert_eq!(o1.stdout, o2.stdout);
    let v: serde_json::Value = serde_json::from_slice(&o1.stdout).unwrap();
    assert_eq!(v["fullyCovered"], serde_json::json!(true), "{v:#}");
    assert_eq!(v["changes"][0]["id"], "files[/etc/etcd-defrag/defrag.env]");
    assert_eq!(v["changes"][0]["operation"], "CHANGE_OPERATION_UPDATE");
    assert!(
        v["maxDisruption"]["level"]
            .as_str()
            .unwrap()
            .starts_with("DISRUPTION_LEVEL_")
    );
    assert_eq!(v["facts"]["platform"], "bare-metal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_items_restores_what_was_there() {
    let mut node = Node::new("fedora-41-bls");
    let before = snapshot(&node.root);
    node.start();
    let yaml = "files:\n- path: /etc/sysctl.d/99-kubernetes-cri.conf\n  content: \"net.ipv4.ip_forward = 1\\n\"\n- path: /etc/new.conf\n  content: new\nkubelet:\n  flags:\n    max-pods: \"200\"\n  config:\n    maxPods: 300\nsysctls:\n  vm.max_map_count: \"262144\"\nkernelArgs: [mitigations=off]\n";
    let r = coverage(&node, yaml).await;
    // maxPods via config is fine here only if no flag sets it; this spec also sets the flag
    let c = change(&r, "kubelet.config.maxPods");
    assert!(!c.covered && c.reason.contains("--max-pods=200"), "{c:?}");
    let yaml = yaml.replace("  config:\n    maxPods: 300\n", "");
    let op = apply(&node, &yaml, "one").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    assert_eq!(node.read("/proc/sys/vm/max_map_count"), "262144\n");
    assert!(
        node.read("/etc/sysctl.d/99-zz-inplaced.conf")
            .contains("vm.max_map_count = 262144")
    );
    // now drop everything: the kernel argument never booted, so no reboot is needed
    let op = apply(&node, "{}", "two").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let after = snapshot(&node.root);
    let changed: Vec<_> = after
        .iter()
        .filter(|a| !before.contains(a))
        .map(|a| a.0.display().to_string())
        .collect();
    assert!(changed.is_empty(), "not restored: {changed:?}");
    assert_eq!(after.len(), before.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operation_ids_are_idempotent() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let op = apply(&node, SCENARIO_A, "same").await;
    assert_eq!(op.phase, Phase::Succeeded as i32);
    let again = node
        .client()
        .await
        .apply(pb::ApplyRequest {
            desired: Some(spec(SCENARIO_A)),
            operation_id: "same".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.phase, Phase::Succeeded as i32);
    assert_eq!(again.created, op.created);
    assert_eq!(node.actions().len(), 1, "no second restart");
    let e = node
        .client()
        .await
        .apply(pb::ApplyRequest {
            desired: Some(spec("kernelArgs: [quiet]\n")),
            operation_id: "same".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_are_served() {
    let mut node = Node::new("systemd-boot");
    node.start();
    let ch = inplace_edge::client::channel(&node.socket).await.unwrap();
    let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
    let r = h
        .check(tonic_health::pb::HealthCheckRequest {
            service: "inplace.v1.NodeAgent".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_args_on_rhel8_kernelopts_and_systemd_boot() {
    // RHEL 8: default entries say `options $kernelopts $tuned_params`; the value lives in
    // grubenv, which must stay exactly 1024 bytes; the older entry has literal options.
    let mut node = Node::new("rhel8-grubenv");
    let entries = "/boot/loader/entries/9f729ae13c6cc2d5038fc425ba3fcd7e";
    let new_entry = node.read(&format!("{entries}-4.18.0-553.58.1.el8_10.x86_64.conf"));
    node.start();
    let yaml = "kernelArgs: [hugepages=64]\n";
    let op = apply(&node, yaml, "rhel").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    let env = std::fs::read(node.path("/boot/grub2/grubenv")).unwrap();
    assert_eq!(env.len(), 1024);
    let env = String::from_utf8(env).unwrap();
    assert!(
        env.contains("kernelopts=root=/dev/mapper/rhel-root ro crashkernel=auto rd.lvm.lv=rhel/root rhgb quiet systemd.unified_cgroup_hierarchy=1 hugepages=64 \n"),
        "{env}"
    );
    assert_eq!(
        node.read(&format!("{entries}-4.18.0-553.58.1.el8_10.x86_64.conf")),
        new_entry
    );
    let old = node.read(&format!("{entries}-4.18.0-553.51.1.el8_10.x86_64.conf"));
    let options = old.lines().find(|l| l.starts_with("options")).unwrap();
    assert!(options.ends_with("hugepages=64"), "{options}");
    assert!(options.contains("$tuned_params"), "{options}");
    node.stop();

    // systemd-boot: entries on the ESP, found from the system
    let mut node = Node::new("systemd-boot");
    node.start();
    let r = coverage(&node, "kernelArgs: [isolcpus=2-7]\n").await;
    assert!(r.fully_covered, "{r:#?}");
    let backend = r.facts.as_ref().unwrap().kernel_args_backend.clone();
    assert_eq!(backend, "bls: 2 kernel entries in /boot/efi/loader/entries");
    let c = change(&r, "kernelArgs[isolcpus]");
    assert!(
        c.targets.contains(&"/etc/kernel/cmdline".to_string()),
        "{:?}",
        c.targets
    );
    let op = apply(&node, "kernelArgs: [isolcpus=2-7]\n", "sdboot").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    for e in ["6.12.41+deb13-amd64", "6.12.48+deb13-amd64"] {
        let t = node.read(&format!(
            "/boot/efi/loader/entries/382841d297f903a743992847508b8eae-{e}.conf"
        ));
        let options = t.lines().find(|l| l.starts_with("options")).unwrap();
        assert!(options.ends_with(" isolcpus=2-7"), "{options}");
        assert!(
            options.contains("systemd.machine_id=382841d297f903a743992847508b8eae"),
            "{options}"
        );
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
async fn file_content_never_reaches_reports_history_or_state() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let secret = "token-7f3a9c1e5b";
    let yaml = format!(
        "files:\n- path: /etc/kubernetes/secret.env\n  content: \"TOKEN={secret}\\n\"\n  mode: \"0600\"\n"
    );
    let r = coverage(&node, &yaml).await;
    assert!(!format!("{r:?}").contains(secret));
    let op = apply(&node, &yaml, "secret").await;
    assert_eq!(op.phase, Phase::Succeeded as i32);
    assert!(!format!("{op:?}").contains(secret));
    for f in ["applied.json", "operations/secret.json"] {
        let t = std::fs::read_to_string(node.state.join(f)).unwrap();
        assert!(!t.contains(secret), "{f}: {t}");
    }
    let o = node.ctl(&["-o", "json", "history"]);
    assert!(!out(&o).contains(secret));
}

/// The VM test looked for the README's `ITEM=` journal field on an operation's lines and
/// found it only on drift lines: each change of an operation is logged with its item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_change_is_logged_with_the_operation_and_its_item() {
    let mut node = Node::new("ubuntu-2404-grub");
    let log = node.dir.path().join("agent.log");
    node.log_file = Some(log.clone());
    node.start();
    let path = node.spec("a.yaml", SCENARIO_A);
    let o = node.ctl(&["apply", "-f", &path, "--id", "logged-op", "--wait"]);
    assert!(o.status.success(), "{}{}", out(&o), err(&o));
    node.stop();
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("item=kubelet.flags[max-pods]"))
        .unwrap_or_else(|| panic!("no change line for kubelet.flags[max-pods] in:\n{text}"));
    assert!(line.contains("operation=logged-op"), "{line}");
    assert!(
        line.contains("before=110") && line.contains("after=250"),
        "{line}"
    );
    let file = text
        .lines()
        .find(|l| l.contains("item=files[/etc/sysctl.d/90-tuning.conf]"))
        .unwrap_or_else(|| panic!("no change line for the file in:\n{text}"));
    assert!(
        !file.contains("262144"),
        "file content must never be logged: {file}"
    );
}

/// A files item's content never reaches responses or logs, also where a section acts on
/// it: a sysctl.d file the spec writes is applied live (as systemd-sysctl would at boot),
/// and the operation names the key, not the value (found by a fresh tester: the whole
/// line, comment included, was in the operation's actions and the extension's message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sysctl_file_item_is_applied_live_without_echoing_its_content() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.log_file = Some(node.dir.path().join("agent.log"));
    node.start();
    let yaml = "files:\n- path: /etc/sysctl.d/60-secret.conf\n  content: \"vm.swappiness = 7 # SECRET-CCC333\\n\"\n";
    let op = apply(&node, yaml, "sysctl-file").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert!(
        op.actions
            .iter()
            .any(|a| a == "set sysctl vm.swappiness (live)"),
        "{:?}",
        op.actions
    );
    let shown = format!("{op:?}");
    assert!(!shown.contains("SECRET-CCC333"), "{shown}");
    let history = format!("{:?}", node.operations().await);
    assert!(!history.contains("SECRET-CCC333"));
    assert!(!node.log().contains("SECRET-CCC333"), "{}", node.log());
}
