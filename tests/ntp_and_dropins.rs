//! Black-box tests of the node-side sections the CAPI extension needs: `ntp` (chrony or
//! systemd-timesyncd, detected on the node) and the NodeSpec drop-ins kept in
//! `/etc/inplaced/node.d`, including the start-up convergence to them.

mod common;

use common::{Node, apply, change, coverage, status};
use inplace_wire::pb;
use inplace_wire::pb::{DisruptionLevel, Phase};

const NTP: &str = "ntp:\n  servers: [ntp1.example.invalid, ntp2.example.invalid]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ntp_on_rhel8_edits_chrony_conf_and_restarts_chronyd() {
    let mut node = Node::new("rhel8-grubenv");
    let original = node.read("/etc/chrony.conf");
    node.start();
    let r = coverage(&node, NTP).await;
    let c = change(&r, "ntp");
    assert!(c.covered, "{c:?}");
    assert_eq!(c.before, "ntp1.example.invalid");
    assert_eq!(c.after, "ntp1.example.invalid ntp2.example.invalid");
    let d = c.disruption.as_ref().unwrap();
    assert_eq!(d.level, DisruptionLevel::Restart as i32);
    assert_eq!(d.units, vec!["chronyd.service".to_string()]);
    assert_eq!(c.targets, vec!["/etc/chrony.conf".to_string()]);
    assert!(c.reason.contains("/etc/chrony.conf exists"), "{}", c.reason);
    assert_eq!(r.changes.len(), 1, "{:?}", r.changes);

    let op = apply(&node, NTP, "ntp").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let expected = original.replace(
        "server ntp1.example.invalid iburst\n",
        "server ntp1.example.invalid iburst\nserver ntp2.example.invalid iburst\n",
    );
    assert_ne!(expected, original);
    assert_eq!(node.read("/etc/chrony.conf"), expected);
    assert_eq!(node.actions(), vec!["restart chronyd.service"]);
    // converged: nothing left to do, no drift
    assert!(coverage(&node, NTP).await.changes.is_empty());
    assert!(status(&node).await.drift.is_empty());

    // dropped from the spec: the original comes back byte for byte
    let r = coverage(&node, "").await;
    let c = change(&r, "ntp");
    assert_eq!(
        (c.before.as_str(), c.after.as_str()),
        (
            "ntp1.example.invalid ntp2.example.invalid",
            "ntp1.example.invalid"
        )
    );
    let op = apply(&node, "", "no-ntp").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(node.read("/etc/chrony.conf"), original);
    assert_eq!(
        node.actions(),
        vec!["restart chronyd.service", "restart chronyd.service"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ntp_without_a_time_daemon_is_not_covered() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let r = coverage(&node, NTP).await;
    let c = change(&r, "ntp");
    assert!(!c.covered, "{c:?}");
    for looked_for in [
        "/etc/chrony.conf",
        "/etc/chrony/chrony.conf",
        "systemd-timesyncd",
        "/etc/systemd/timesyncd.conf",
    ] {
        assert!(c.reason.contains(looked_for), "{}", c.reason);
    }
    assert!(!r.fully_covered);
    let e = node
        .client()
        .await
        .apply(pb::ApplyRequest {
            desired: Some(common::spec(NTP)),
            operation_id: "ntp".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ntp_with_timesyncd_writes_its_drop_in() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(node.path("/usr/lib/systemd/systemd-timesyncd"), "").unwrap();
    node.start();
    let op = apply(&node, NTP, "ntp").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let dropin = "/etc/systemd/timesyncd.conf.d/inplaced-ntp.conf";
    assert_eq!(
        node.read(dropin),
        "[Time]\nNTP=ntp1.example.invalid ntp2.example.invalid\n"
    );
    assert_eq!(node.actions(), vec!["restart systemd-timesyncd.service"]);
    let op = apply(&node, "", "no-ntp").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert!(!node.path(dropin).exists());
    assert!(!node.path("/etc/systemd/timesyncd.conf.d").exists());
}

fn dropin(name: &str, content: &str) -> pb::DropIn {
    pb::DropIn {
        name: name.into(),
        content: content.into(),
        keep: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_in_of_an_apply_is_kept_in_node_d() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let content = "# tuning\nsysctls:\n  vm.swappiness: \"10\"\n";
    let desired = pb::NodeSpec {
        dropins: vec![dropin("10-tuning.yaml", content)],
        ..Default::default()
    };
    let mut client = node.client().await;
    let r = client
        .get_coverage(pb::GetCoverageRequest {
            desired: Some(desired.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let c = change(&r, "dropins[10-tuning.yaml]");
    assert!(c.covered, "{c:?}");
    assert_eq!(
        c.disruption.as_ref().unwrap().level,
        DisruptionLevel::None as i32
    );
    assert_eq!(
        c.targets,
        vec!["/etc/inplaced/node.d/10-tuning.yaml".to_string()]
    );
    assert!(change(&r, "sysctls[vm.swappiness]").covered);
    let op = client
        .apply(pb::ApplyRequest {
            desired: Some(desired),
            operation_id: "dropin".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let op = node.settle(&op.id).await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let path = node.path("/etc/inplaced/node.d/10-tuning.yaml");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), content);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777,
        0o644
    );
    assert_eq!(node.read("/proc/sys/vm/swappiness").trim(), "10");

    // dropped: its file goes, its items are reverted
    let op = apply(&node, "", "no-dropin").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert!(!path.exists());
    assert_eq!(node.read("/proc/sys/vm/swappiness").trim(), "60");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_under_etc_inplaced_stay_refused() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let r = coverage(
        &node,
        "files:\n- path: /etc/inplaced/node.d/10-x.yaml\n  content: \"sysctls: {}\"\n",
    )
    .await;
    let c = change(&r, "files[/etc/inplaced/node.d/10-x.yaml]");
    assert!(!c.covered, "{c:?}");
    assert!(c.reason.contains("inplaced itself"), "{}", c.reason);
    assert!(!node.path("/etc/inplaced/node.d").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_converges_to_the_node_d_drop_ins() {
    let mut node = Node::new("ubuntu-2404-grub");
    let dir = node.path("/etc/inplaced/node.d");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("50-maps.yaml"),
        "sysctls:\n  vm.max_map_count: \"262144\"\n",
    )
    .unwrap();
    // one that does not parse: logged, reported, not applied
    std::fs::write(dir.join("60-bad.yaml"), "sysctls:\n  vm.swappiness: \"\"\n").unwrap();
    node.start();
    let mut client = node.client().await;
    let ops = client
        .list_operations(pb::ListOperationsRequest {})
        .await
        .unwrap()
        .into_inner()
        .operations;
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert!(ops[0].id.starts_with("startup-"), "{}", ops[0].id);
    assert_eq!(ops[0].id.len(), "startup-".len() + 8);
    let op = node.settle(&ops[0].id).await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert!(
        op.changes
            .iter()
            .any(|c| c.id == "sysctls[vm.max_map_count]"),
        "{:?}",
        op.changes
    );
    assert_eq!(node.read("/proc/sys/vm/max_map_count").trim(), "262144");
    assert!(
        node.read("/etc/sysctl.d/99-zz-inplaced.conf")
            .contains("vm.max_map_count = 262144")
    );
    assert_eq!(node.read("/proc/sys/vm/swappiness").trim(), "60");
    let problems = status(&node).await.problems;
    assert!(
        problems.iter().any(|p| p.contains("60-bad.yaml")
            && p.contains("sysctls[vm.swappiness]")
            && p.contains("not applied")),
        "{problems:?}"
    );

    // a restart finds nothing new: no second operation
    node.stop();
    node.start();
    let ops = node.operations().await;
    assert_eq!(ops.len(), 1, "{ops:?}");

    // An apply without the drop-in removes it; put back on the node, the same drop-in is
    // converged to again at the next start, as a new operation (not the old one's answer).
    let first = ops[0].id.clone();
    let op = apply(&node, "{}", "without-drop-ins").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert!(!dir.join("50-maps.yaml").exists());
    assert_eq!(node.read("/proc/sys/vm/max_map_count").trim(), "65530");
    std::fs::write(
        dir.join("50-maps.yaml"),
        "sysctls:\n  vm.max_map_count: \"262144\"\n",
    )
    .unwrap();
    node.stop();
    node.start();
    let ops = node.operations().await;
    assert_eq!(ops[0].id, format!("{first}-2"), "{ops:?}");
    assert_eq!(node.settle(&ops[0].id).await.phase, Phase::Succeeded as i32);
    assert_eq!(node.read("/proc/sys/vm/max_map_count").trim(), "262144");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_keeps_the_applied_spec_and_replaces_only_its_drop_ins() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let op = apply(&node, "sysctls:\n  vm.swappiness: \"10\"\n", "first").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    node.stop();
    let dir = node.path("/etc/inplaced/node.d");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("50-maps.yaml"),
        "sysctls:\n  vm.max_map_count: \"262144\"\n",
    )
    .unwrap();
    node.start();
    let ops = node.operations().await;
    let startup = ops
        .iter()
        .find(|o| o.id.starts_with("startup-"))
        .unwrap_or_else(|| panic!("no start-up operation in {ops:?}"));
    let op = node.settle(&startup.id).await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    // the spec applied before stays: swappiness kept, max_map_count added
    assert_eq!(node.read("/proc/sys/vm/swappiness").trim(), "10");
    assert_eq!(node.read("/proc/sys/vm/max_map_count").trim(), "262144");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_edit_of_an_applied_drop_in_changes_nothing() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let desired = pb::NodeSpec {
        dropins: vec![dropin(
            "10-tuning.yaml",
            "sysctls:\n  vm.swappiness: \"10\"\n",
        )],
        ..Default::default()
    };
    let op = node
        .client()
        .await
        .apply(pb::ApplyRequest {
            desired: Some(desired),
            operation_id: "dropin".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node.settle(&op.id).await.phase, Phase::Succeeded as i32);
    node.stop();
    // the operator breaks the applied drop-in and adds a good one
    let dir = node.path("/etc/inplaced/node.d");
    let broken = "sysctls:\n  vm.swappiness: [10\n";
    std::fs::write(dir.join("10-tuning.yaml"), broken).unwrap();
    std::fs::write(
        dir.join("20-maps.yaml"),
        "sysctls:\n  vm.max_map_count: \"262144\"\n",
    )
    .unwrap();
    node.start();
    let ops = node.operations().await;
    let startup = ops
        .iter()
        .find(|o| o.id.starts_with("startup-"))
        .unwrap_or_else(|| panic!("no start-up operation in {ops:?}"));
    let op = node.settle(&startup.id).await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    // the applied version stays in effect, the operator's file is left as it is
    assert_eq!(node.read("/proc/sys/vm/swappiness").trim(), "10");
    assert_eq!(node.read("/proc/sys/vm/max_map_count").trim(), "262144");
    assert_eq!(node.read("/etc/inplaced/node.d/10-tuning.yaml"), broken);
    assert!(
        !op.changes.iter().any(|c| c.id == "dropins[10-tuning.yaml]"),
        "{:?}",
        op.changes
    );
    let problems = status(&node).await.problems;
    assert!(
        problems
            .iter()
            .any(|p| p.contains("10-tuning.yaml") && p.contains("stays in effect")),
        "{problems:?}"
    );
}

/// A drop-in marked `keep` takes the node's copy; a missing copy is an invalid spec
/// naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_drop_ins_use_the_node_copy() {
    let mut node = Node::new("ubuntu-2404-grub");
    let dir = node.path("/etc/inplaced/node.d");
    std::fs::create_dir_all(&dir).unwrap();
    node.start();
    let keep = |name: &str| pb::NodeSpec {
        dropins: vec![pb::DropIn {
            name: name.into(),
            content: String::new(),
            keep: true,
        }],
        ..Default::default()
    };
    let mut c = node.client().await;
    let e = c
        .get_coverage(pb::GetCoverageRequest {
            desired: Some(keep("20-x.yaml")),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("dropins[20-x.yaml].keep"),
        "{}",
        e.message()
    );
    std::fs::write(dir.join("20-x.yaml"), "sysctls:\n  vm.swappiness: \"5\"\n").unwrap();
    let r = c
        .get_coverage(pb::GetCoverageRequest {
            desired: Some(keep("20-x.yaml")),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        r.changes
            .iter()
            .any(|ch| ch.id == "sysctls[vm.swappiness]" && ch.covered),
        "{:#?}",
        r.changes
    );
}
