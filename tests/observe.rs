//! Unknown is not empty: a running-state file the planner reads that is
//! absent, unreadable or empty where it can not be makes the changes that depend on it
//! not covered, with a reason naming the file and why, and a problem in `status`; the
//! sections that do not depend on it are served as usual. Each observation is tested
//! with its source removed and emptied, through the real daemon on a fixture copy.

mod common;

use common::{Node, apply, change, coverage, status};
use inplace_wire::pb::Phase;

/// How a source is taken away.
#[derive(Debug, Clone, Copy)]
enum Gone {
    Removed,
    Emptied,
}

impl Gone {
    const BOTH: [Gone; 2] = [Gone::Removed, Gone::Emptied];

    fn apply(self, node: &Node, path: &str) {
        match self {
            Gone::Removed => std::fs::remove_file(node.path(path)).unwrap(),
            Gone::Emptied => std::fs::write(node.path(path), "").unwrap(),
        }
    }

    /// How the reason says why.
    fn why(self) -> &'static str {
        match self {
            Gone::Removed => "it is absent",
            Gone::Emptied => "it is empty",
        }
    }
}

/// The sysctl that stays observable beside the one taken away: served as usual.
const OTHER: &str = "sysctls:\n  vm.max_map_count: \"262144\"\n";

async fn problems(node: &Node) -> Vec<String> {
    status(node).await.problems
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proc_cmdline_unknown_makes_kernel_arg_changes_not_covered() {
    for gone in Gone::BOTH {
        let mut node = Node::new("ubuntu-2404-grub");
        node.start();
        // an argument the agent added, whose removal needs a reboot
        let op = apply(&node, "kernelArgs: [inplaced.test=1]\n", "add").await;
        assert_eq!(op.phase, Phase::RebootRequired as i32, "{}", op.message);
        gone.apply(&node, "/proc/cmdline");
        let want = format!("/proc/cmdline could not be read: {}", gone.why());
        // an addition and a removal: neither is covered, both name the file
        for (yaml, id) in [
            (
                format!("kernelArgs: [inplaced.test=1, nosmt]\n{OTHER}"),
                "kernelArgs[nosmt]",
            ),
            (OTHER.to_string(), "kernelArgs[inplaced.test]"),
        ] {
            let r = coverage(&node, &yaml).await;
            let c = change(&r, id);
            assert!(!c.covered, "{gone:?} {id}: {c:?}");
            assert!(
                c.reason.contains(&want) && c.reason.contains("needs a reboot can not be told"),
                "{gone:?} {id}: {}",
                c.reason
            );
            assert!(!r.fully_covered);
            let s = change(&r, "sysctls[vm.max_map_count]");
            assert!(s.covered, "{gone:?}: an unrelated section is served: {s:?}");
        }
        let p = problems(&node).await;
        assert!(p.iter().any(|p| p.contains(&want)), "{gone:?}: {p:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proc_cmdline_unknown_after_a_boot_is_not_verified_as_lacking() {
    for gone in Gone::BOTH {
        let mut node = Node::new("ubuntu-2404-grub");
        node.start();
        let op = apply(&node, "kernelArgs: [inplaced.test=1]\n", "k").await;
        assert_eq!(op.phase, Phase::RebootRequired as i32, "{}", op.message);
        node.stop();
        // a boot: a new boot id, and a /proc/cmdline that can not be read
        std::fs::write(
            node.path("/proc/sys/kernel/random/boot_id"),
            "22222222-2222-2222-2222-222222222222\n",
        )
        .unwrap();
        gone.apply(&node, "/proc/cmdline");
        node.start();
        let op = node.settle("k").await;
        assert_eq!(op.phase, Phase::Failed as i32, "{gone:?}: {}", op.message);
        assert!(
            op.message
                .contains(&format!("/proc/cmdline could not be read: {}", gone.why()))
                && op.message.contains("could not be verified")
                && !op.message.contains("lacks"),
            "{gone:?}: {}",
            op.message
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_live_sysctl_is_not_covered() {
    let path = "/proc/sys/vm/swappiness";
    // removed: no such kernel parameter (a real state, with its own reason)
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    Gone::Removed.apply(&node, path);
    let r = coverage(&node, &format!("{OTHER}  vm.swappiness: \"10\"\n")).await;
    let c = change(&r, "sysctls[vm.swappiness]");
    assert!(
        !c.covered && c.reason.contains("does not exist on this node"),
        "{c:?}"
    );
    assert!(change(&r, "sysctls[vm.max_map_count]").covered);
    // emptied: a kernel parameter always has a value, so it is unknown
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    Gone::Emptied.apply(&node, path);
    let r = coverage(&node, &format!("{OTHER}  vm.swappiness: \"10\"\n")).await;
    let c = change(&r, "sysctls[vm.swappiness]");
    assert!(!c.covered, "{c:?}");
    assert!(
        c.reason
            .contains(&format!("{path} could not be read: it is empty")),
        "{}",
        c.reason
    );
    assert!(change(&r, "sysctls[vm.max_map_count]").covered);
    // a managed key whose live value becomes unknown is a status problem
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let op = apply(&node, "sysctls:\n  vm.swappiness: \"10\"\n", "s").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    Gone::Emptied.apply(&node, path);
    let p = problems(&node).await;
    assert!(
        p.iter()
            .any(|p| p.contains(&format!("{path} could not be read: it is empty"))),
        "{p:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_or_absent_kubelet_file_is_not_read_as_empty_settings() {
    for (path, yaml, id, absent_reason) in [
        (
            "/var/lib/kubelet/config.yaml",
            "kubelet:\n  config:\n    maxPods: 300\n",
            "kubelet.config.maxPods",
            Some("no KubeletConfiguration file at /var/lib/kubelet/config.yaml"),
        ),
        (
            "/var/lib/kubelet/kubeadm-flags.env",
            "kubelet:\n  flags:\n    max-pods: \"200\"\n",
            "kubelet.flags[max-pods]",
            // absent: kubelet's unit reads it optionally (EnvironmentFile=-): no flags
            None,
        ),
    ] {
        for gone in Gone::BOTH {
            let mut node = Node::new("ubuntu-2404-grub");
            node.start();
            gone.apply(&node, path);
            let r = coverage(&node, &format!("{yaml}{OTHER}")).await;
            assert!(change(&r, "sysctls[vm.max_map_count]").covered);
            let c = change(&r, id);
            match (gone, absent_reason) {
                (Gone::Emptied, _) => {
                    assert!(!c.covered, "{path} {gone:?}: {c:?}");
                    assert!(
                        c.reason
                            .contains(&format!("{path} could not be read: it is empty")),
                        "{path}: {}",
                        c.reason
                    );
                }
                (Gone::Removed, Some(reason)) => {
                    assert!(!c.covered && c.reason.contains(reason), "{path}: {c:?}");
                }
                (Gone::Removed, None) => {
                    assert!(c.covered, "{path} absent is no flags: {c:?}");
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_boot_configuration_makes_kernel_arg_changes_not_covered() {
    let yaml = format!("kernelArgs: [nosmt]\n{OTHER}");
    // grubenv holds kernelopts, which RHEL 8's BLS entries use
    for (gone, want) in [
        (Gone::Removed, "/boot/grub2/grubenv does not exist"),
        (Gone::Emptied, "/boot/grub2/grubenv"),
    ] {
        let mut node = Node::new("rhel8-grubenv");
        node.start();
        assert!(change(&coverage(&node, &yaml).await, "kernelArgs[nosmt]").covered);
        gone.apply(&node, "/boot/grub2/grubenv");
        let r = coverage(&node, &yaml).await;
        let c = change(&r, "kernelArgs[nosmt]");
        assert!(!c.covered && c.reason.contains(want), "{gone:?}: {c:?}");
        assert!(change(&r, "sysctls[vm.max_map_count]").covered);
    }
    // an emptied BLS entry names no kernel: not read as an entry without options
    let mut node = Node::new("fedora-41-bls");
    node.start();
    let entry = "/boot/loader/entries/60427531c86a90c5034f2e849abe07c5-6.15.9-201.fc41.x86_64.conf";
    Gone::Emptied.apply(&node, entry);
    let r = coverage(&node, &yaml).await;
    let c = change(&r, "kernelArgs[nosmt]");
    assert!(!c.covered, "{c:?}");
    assert!(
        c.reason
            .contains(&format!("{entry} could not be read: it is empty")),
        "{}",
        c.reason
    );
    assert!(change(&r, "sysctls[vm.max_map_count]").covered);
}

/// A sysctl.d directory or file that can not be read is not an empty one: what it sets at
/// boot is unknown, so no sysctl is covered (the reason names it), `status` lists it, and
/// the other sections are served. A name that is a directory (`50-x.conf/`) fails to read
/// also for root, as a listed path that is a file does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_sysctl_d_entry_makes_sysctls_not_covered() {
    let yaml = "kernelArgs: [nosmt]\nsysctls:\n  vm.swappiness: \"10\"\n";
    for (make, source) in [
        (
            "/etc/sysctl.d/50-vendor.conf",
            "/etc/sysctl.d/50-vendor.conf",
        ),
        ("/run/sysctl.d", "/run/sysctl.d"),
    ] {
        let mut node = Node::new("ubuntu-2404-grub");
        node.start();
        // managed first, so that status observes the sysctls section too
        let op = apply(&node, "sysctls:\n  vm.swappiness: \"5\"\n", "s").await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
        if make.ends_with(".conf") {
            std::fs::create_dir_all(node.path(make)).unwrap();
        } else {
            let _ = std::fs::remove_dir_all(node.path(make));
            std::fs::create_dir_all(node.path("/run")).unwrap();
            std::fs::write(node.path(make), "not a directory\n").unwrap();
        }
        let r = coverage(&node, yaml).await;
        let c = change(&r, "sysctls[vm.swappiness]");
        assert!(!c.covered, "{make}: {c:?}");
        assert!(
            c.reason.contains(&format!("{source} could not be read")),
            "{make}: {}",
            c.reason
        );
        assert!(change(&r, "kernelArgs[nosmt]").covered, "{make}");
        let p = problems(&node).await;
        assert!(
            p.iter()
                .any(|p| p.contains(&format!("{source} could not be read"))),
            "{make}: {p:?}"
        );
    }
}

/// `/etc/default/grub.d` that can not be listed (here a file where the directory goes):
/// a fragment in it could reassign GRUB_CMDLINE_LINUX, so kernel arguments are not
/// covered, naming it; sysctls are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlistable_grub_d_makes_kernel_args_not_covered() {
    let yaml = format!("kernelArgs: [nosmt]\n{OTHER}");
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    assert!(change(&coverage(&node, &yaml).await, "kernelArgs[nosmt]").covered);
    let _ = std::fs::remove_dir_all(node.path("/etc/default/grub.d"));
    std::fs::write(node.path("/etc/default/grub.d"), "GRUB_CMDLINE_LINUX=x\n").unwrap();
    let r = coverage(&node, &yaml).await;
    let c = change(&r, "kernelArgs[nosmt]");
    assert!(!c.covered, "{c:?}");
    assert!(
        c.reason.contains("/etc/default/grub.d") && c.reason.contains("GRUB_CMDLINE_LINUX"),
        "{}",
        c.reason
    );
    assert!(change(&r, "sysctls[vm.max_map_count]").covered);
}
