//! Kernel arguments across operations and boots, black box: what the next boot must show
//! is verified after it (an argument superseded, kept from an earlier operation, already
//! in the effective command line, or of an overridden assignment), and order-sensitive
//! huge-page arguments keep an order the kernel accepts on every backend.

mod common;
use common::*;

/// The change made the default before the reboot (`trial = false`): what these tests
/// check is the edit of the default itself; tests/kernel_args_trial.rs covers trials.
fn direct(node: &Node) {
    std::fs::write(&node.config, "[kernel_args]\ntrial = false\n").unwrap();
}
use inplace_wire::pb::Phase;

/// Simulates a reboot into `extra` after the Ubuntu fixture's command line and restarts
/// the daemon.
fn boot_with(node: &mut Node, extra: &str, boot_id: &str) {
    node.stop();
    std::fs::write(
        node.path("/proc/cmdline"),
        format!("{UBUNTU_PROC} {extra}\n"),
    )
    .unwrap();
    std::fs::write(
        node.path("/proc/sys/kernel/random/boot_id"),
        format!("{boot_id}\n"),
    )
    .unwrap();
    node.start();
}

/// Every file under the Ubuntu fixture's boot configuration, for "not edited" checks.
fn grub_files(node: &Node) -> Vec<String> {
    [
        "/etc/default/grub",
        "/etc/default/grub.d/50-cloudimg-settings.cfg",
        "/etc/default/grub.d/60-hugepages.cfg",
    ]
    .iter()
    .map(|p| node.read(p))
    .collect()
}

/// The example: op1 `[a=1]` waits for the reboot, op2 `[a=1, b=2]` supersedes
/// it; a boot with `b=2` but not `a=1` fails op2 naming `a=1` (no further reboot) and
/// shows as drift of `kernelArgs[a]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_operations_argument_is_verified_after_the_boot() {
    let mut node = Node::new("ubuntu-2404-grub");
    direct(&node);
    node.start();
    let op1 = apply(&node, "kernelArgs: [a=1]\n", "op1").await;
    assert_eq!(op1.phase, Phase::RebootRequired as i32, "{}", op1.message);
    let op2 = apply(&node, "kernelArgs: [a=1, b=2]\n", "op2").await;
    assert_eq!(op2.phase, Phase::RebootRequired as i32, "{}", op2.message);
    boot_with(&mut node, "b=2", "22222222-2222-2222-2222-222222222222");
    let op2 = node.settle("op2").await;
    assert_eq!(op2.phase, Phase::Failed as i32, "{}", op2.message);
    assert!(op2.message.contains("lacks a=1"), "{}", op2.message);
    assert!(!op2.message.contains("b=2"), "{}", op2.message);
    assert!(
        node.actions().iter().all(|a| !a.starts_with("reboot")),
        "no reboot loop"
    );
    let s = status(&node).await;
    assert_eq!(drift_ids(&s), ["kernelArgs[a]"], "{:?}", s.drift);
    assert_eq!(s.drift[0].expected, "a=1");
}

/// `[a, b]` then `[b, c]` without a reboot in between: after the boot `b` (staged by the
/// first operation) is checked as well as `c`, and `a` (removed) must be gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_argument_kept_from_an_earlier_operation_is_verified_after_the_boot() {
    for (booted, want) in [
        ("c", Err("lacks b")),
        ("b", Err("lacks c")),
        ("a b c", Err("still has a")),
        ("b c", Ok(())),
    ] {
        let mut node = Node::new("ubuntu-2404-grub");
        direct(&node);
        node.start();
        apply(&node, "kernelArgs: [a, b]\n", "v1").await;
        let v2 = apply(&node, "kernelArgs: [b, c]\n", "v2").await;
        assert_eq!(v2.phase, Phase::RebootRequired as i32, "{}", v2.message);
        boot_with(&mut node, booted, "33333333-3333-3333-3333-333333333333");
        let v2 = node.settle("v2").await;
        let s = status(&node).await;
        match want {
            Ok(()) => {
                assert_eq!(
                    v2.phase,
                    Phase::Succeeded as i32,
                    "{booted}: {}",
                    v2.message
                );
                assert!(s.drift.is_empty(), "{booted}: {:?}", s.drift);
            }
            Err(why) => {
                assert_eq!(v2.phase, Phase::Failed as i32, "{booted}: {}", v2.message);
                assert!(v2.message.contains(why), "{booted}: {}", v2.message);
                let key = why.rsplit(' ').next().unwrap();
                assert_eq!(
                    drift_ids(&s),
                    [format!("kernelArgs[{key}]")],
                    "{booted}: {:?}",
                    s.drift
                );
            }
        }
    }
}

/// The example (`hugepages=16`, set by a grub.d file in
/// `GRUB_CMDLINE_LINUX_DEFAULT`) and others of the class (`console=ttyS0`, refused before
/// although there; the whole huge page triple): nothing to do, nothing written, nothing
/// claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_argument_already_in_the_effective_command_line_is_not_written_again() {
    for args in [
        "[hugepages=16]",
        "[console=ttyS0]",
        "[default_hugepagesz=1G, hugepagesz=1G, hugepages=16]",
        "[intel_iommu=on, console=tty1]",
    ] {
        let mut node = Node::new("ubuntu-2404-grub");
        direct(&node);
        let before = grub_files(&node);
        node.start();
        let yaml = format!("kernelArgs: {args}\n");
        let r = common::coverage(&node, &yaml).await;
        assert!(r.changes.is_empty(), "{args}: {:#?}", r.changes);
        assert!(r.fully_covered, "{args}");
        let op = apply(&node, &yaml, "same").await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{args}: {}", op.message);
        assert_eq!(
            grub_files(&node),
            before,
            "{args}: the boot configuration was edited"
        );
        assert_eq!(status(&node).await.managed_items, 0, "{args}: claimed");
        // dropping it removes nothing the agent did not add
        assert_eq!(
            apply(&node, "{}\n", "drop").await.phase,
            Phase::Succeeded as i32
        );
        assert_eq!(grub_files(&node), before, "{args}");
    }
}

/// `quiet` is in `/etc/default/grub`'s `GRUB_CMDLINE_LINUX_DEFAULT`, which a grub.d file
/// replaces: it is not on the effective command line, so it is added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_argument_of_an_overridden_assignment_is_added() {
    let mut node = Node::new("ubuntu-2404-grub");
    direct(&node);
    node.start();
    let r = common::coverage(&node, "kernelArgs: [quiet]\n").await;
    assert_eq!(r.changes.len(), 1, "{:#?}", r.changes);
    assert_eq!(r.changes[0].id, "kernelArgs[quiet]");
    assert!(r.changes[0].covered, "{}", r.changes[0].reason);
}

/// A `hugepages=` of another value would land in `GRUB_CMDLINE_LINUX`, before the
/// `hugepagesz=1G` of `GRUB_CMDLINE_LINUX_DEFAULT`: not covered, with the reason; with
/// its own `hugepagesz=` before it in the spec it is covered and written in that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_sensitive_huge_page_arguments_keep_a_working_order() {
    let mut node = Node::new("ubuntu-2404-grub");
    direct(&node);
    node.start();
    for args in ["[hugepages=32]", "[default_hugepagesz=2M]"] {
        let r = common::coverage(&node, &format!("kernelArgs: {args}\n")).await;
        assert_eq!(r.changes.len(), 1, "{args}: {:#?}", r.changes);
        let c = &r.changes[0];
        assert!(!c.covered, "{args}: {}", c.reason);
        assert!(
            c.reason.contains("order-sensitive")
                && c.reason.contains("before GRUB_CMDLINE_LINUX_DEFAULT")
                && c.reason.contains("hugepagesz=1G"),
            "{args}: {}",
            c.reason
        );
    }
    let op = apply(
        &node,
        "kernelArgs: [hugepagesz=2M, hugepages=512]\n",
        "pair",
    )
    .await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{}", op.message);
    let grub = node.read("/etc/default/grub");
    assert!(
        grub.contains("GRUB_CMDLINE_LINUX=\"intel_iommu=on iommu=pt hugepagesz=2M hugepages=512\""),
        "{grub}"
    );
}

/// The same class on BLS: entries that already reserve 1 GiB pages; a bare `hugepages=`
/// appended after them would count 1 GiB pages; `[hugepages=4]`, already there, is
/// nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bls_huge_pages_are_read_in_the_kernels_order() {
    let mut node = Node::new("fedora-41-bls");
    direct(&node);
    for f in [
        "/etc/kernel/cmdline",
        "/etc/default/grub",
        "/boot/loader/entries/60427531c86a90c5034f2e849abe07c5-6.14.11-200.fc41.x86_64.conf",
        "/boot/loader/entries/60427531c86a90c5034f2e849abe07c5-6.15.9-201.fc41.x86_64.conf",
        "/proc/cmdline",
    ] {
        let t = node.read(f).replace(
            "transparent_hugepage=madvise",
            "transparent_hugepage=madvise hugepagesz=1G hugepages=4",
        );
        std::fs::write(node.path(f), t).unwrap();
    }
    node.start();
    let r = common::coverage(&node, "kernelArgs: [hugepages=512]\n").await;
    let c = common::change(&r, "kernelArgs[hugepages]");
    assert!(!c.covered);
    assert!(
        c.reason.contains("order-sensitive") && c.reason.contains("appended after them"),
        "{}",
        c.reason
    );
    assert!(
        common::coverage(&node, "kernelArgs: [hugepages=4]\n")
            .await
            .changes
            .is_empty()
    );
    let r = common::coverage(&node, "kernelArgs: [hugepagesz=2M, hugepages=512]\n").await;
    assert!(r.fully_covered, "{:#?}", r.changes);
}
