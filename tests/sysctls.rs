//! The sysctls section, black box: the agent's sysctl.d drop-in applied live and at boot,
//! the lines the admin wrote given back, keys that would not persist or can not be written
//! refused, VLAN keys mapped to their /proc/sys path, and the sysctl.d directories read as
//! systemd-sysctl reads them (merged /usr, symlinked directories, FIFOs).

mod common;
use common::*;
use inplace_wire::pb::Phase;

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

/// A sysctl of a VLAN interface in procps' dotted form (`/` for the `.` in `eth0.100`)
/// and in the slashed form both reach `/proc/sys/net/ipv4/conf/eth0.100/rp_filter`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vlan_sysctl_maps_to_its_proc_path_in_both_forms() {
    for (key, value) in [
        ("net.ipv4.conf.eth0/100.rp_filter", "2"),
        ("net/ipv4/conf/eth0.100/rp_filter", "0"),
    ] {
        let mut node = Node::new("ubuntu-2404-grub");
        let proc = node.path("/proc/sys/net/ipv4/conf/eth0.100/rp_filter");
        std::fs::create_dir_all(proc.parent().unwrap()).unwrap();
        std::fs::write(&proc, "1\n").unwrap();
        node.start();
        let op = apply(&node, &format!("sysctls:\n  {key}: \"{value}\"\n"), "vlan").await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{key}: {}", op.message);
        assert_eq!(
            std::fs::read_to_string(&proc).unwrap(),
            format!("{value}\n"),
            "{key}"
        );
        assert!(
            !node.path("/proc/sys/net/ipv4/conf/eth0").exists(),
            "{key}: a wrong path was created"
        );
        let dropin = node.read("/etc/sysctl.d/99-zz-inplaced.conf");
        assert!(
            dropin.contains(&format!("{key} = {value}")),
            "{key}: {dropin}"
        );
    }
}

const DROP_IN: &str = "/etc/sysctl.d/99-zz-inplaced.conf";

/// An admin's drop-in that sets the same key twice (systemd-sysctl applies the last): the
/// agent rewrites both lines, and the drop must give each line its own old value text back,
/// not the value of one of them on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysctl_drop_in_duplicate_key_lines_each_get_their_own_value_back() {
    for original in [
        "vm.swappiness = 10\nvm.swappiness = 20\n",
        "vm/swappiness = 10\nvm.swappiness = 20\n",
    ] {
        let mut node = Node::new("fedora-41-bls");
        std::fs::write(node.path(DROP_IN), original).unwrap();
        std::fs::create_dir_all(node.path("/proc/sys/vm")).unwrap();
        std::fs::write(node.path("/proc/sys/vm/swappiness"), "20\n").unwrap();
        node.start();
        let op = apply(&node, "sysctls:\n  vm.swappiness: \"1\"\n", "one").await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
        let op = apply(&node, "{}\n", "drop").await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
        assert_eq!(
            node.read(DROP_IN),
            original,
            "the admin's lines, byte for byte"
        );
        assert_eq!(node.read("/proc/sys/vm/swappiness"), "20\n");
    }
}

/// The spec names the key first dotted, then slashed (the same /proc/sys path): the
/// admin's old value text must survive the rename and come back on the drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysctl_drop_in_prior_survives_the_key_changing_its_spelling() {
    let mut node = Node::new("fedora-41-bls");
    let original = "# admin\nvm.swappiness = 10\n";
    std::fs::write(node.path(DROP_IN), original).unwrap();
    std::fs::create_dir_all(node.path("/proc/sys/vm")).unwrap();
    std::fs::write(node.path("/proc/sys/vm/swappiness"), "10\n").unwrap();
    node.start();
    let op = apply(&node, "sysctls:\n  vm.swappiness: \"1\"\n", "one").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let op = apply(&node, "sysctls:\n  vm/swappiness: \"5\"\n", "two").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let op = apply(&node, "{}\n", "drop").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(node.read(DROP_IN), original);
    assert_eq!(node.read("/proc/sys/vm/swappiness"), "10\n");
}

/// A merged-/usr node (Ubuntu 24.04, Fedora, Debian 12, RHEL 9): `/lib` is a symlink to
/// `usr/lib`, so `/lib/sysctl.d` is `/usr/lib/sysctl.d`. That is a directory systemd-sysctl
/// reads without trouble, not an unknown one: sysctls must stay covered and status must
/// not report an unknown observation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_usr_lib_symlink_is_not_an_unknown_sysctl_d() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::create_dir_all(node.path("/usr/lib/sysctl.d")).unwrap();
    let _ = std::fs::remove_dir_all(node.path("/lib"));
    std::os::unix::fs::symlink("usr/lib", node.path("/lib")).unwrap();
    node.start();
    let yaml = "sysctls:\n  vm.swappiness: \"10\"\n";
    let r = coverage(&node, yaml).await;
    let c = change(&r, "sysctls[vm.swappiness]");
    assert!(c.covered, "{c:?}");
    let op = apply(&node, yaml, "one").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let p = status(&node).await.problems;
    assert!(p.is_empty(), "{p:?}");
}

/// A sysctl.d file that is a symlink whose target passes through a symlinked directory
/// (`/etc/sysctl.d/60-vendor.conf -> /opt/vendor/60-vendor.conf`, `/opt -> srv/opt`): the
/// node reads `/srv/opt/vendor/60-vendor.conf`; the agent must read that same file, not
/// the directory the first symlink on the way names (`/srv/opt`: reading it fails, and it
/// is reported as an unreadable sysctl.d file, so no sysctl is covered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysctl_d_symlink_through_a_symlinked_directory_is_followed_whole() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::create_dir_all(node.path("/srv/opt/vendor")).unwrap();
    std::fs::write(
        node.path("/srv/opt/vendor/60-vendor.conf"),
        "vm.max_map_count = 262144\n",
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(node.path("/opt"));
    std::os::unix::fs::symlink("srv/opt", node.path("/opt")).unwrap();
    std::fs::create_dir_all(node.path("/etc/sysctl.d")).unwrap();
    std::os::unix::fs::symlink(
        "/opt/vendor/60-vendor.conf",
        node.path("/etc/sysctl.d/60-vendor.conf"),
    )
    .unwrap();
    node.start();
    let r = coverage(&node, "sysctls:\n  vm.swappiness: \"10\"\n").await;
    let c = change(&r, "sysctls[vm.swappiness]");
    assert!(c.covered, "{c:?}");
    let p = status(&node).await.problems;
    assert!(p.is_empty(), "{p:?}");
}

/// A FIFO named like a sysctl.d file (`/etc/sysctl.d/70-x.conf`): opening it for reading
/// blocks until a writer comes. It must be an unknown observation (not covered, a status
/// problem), never a hung agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_sysctl_d_does_not_hang_the_agent() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::create_dir_all(node.path("/etc/sysctl.d")).unwrap();
    let fifo = node.path("/etc/sysctl.d/70-x.conf");
    let ok = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(ok.success());
    node.start();
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        coverage(&node, "sysctls:\n  vm.swappiness: \"10\"\n"),
    )
    .await;
    // unblock the agent whatever happened, so that it can be stopped
    std::thread::spawn(move || {
        let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
    });
    let r = r.expect("coverage did not answer within 10 s: the agent is stuck opening a FIFO");
    assert!(!change(&r, "sysctls[vm.swappiness]").covered);
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
