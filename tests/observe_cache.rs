//! The observation memo (issue 28), black box: the daemon keeps what it read from a node
//! file while the file's stamp stays the same, and every change between two coverage
//! calls is still seen: a rewrite of the same size with the mtime put back (the stamp's
//! ctime moves), a rewrite within the racy window, a replacement by rename (a new inode),
//! and a sysctl.d file added to or removed from its directory (the directory's stamp).
//! And the verifying re-plan, limited to the sections the plan touched, still fails an
//! operation whose touched item is still different after its steps ran.

mod common;

use std::time::{Duration, SystemTime};

use common::{Node, apply, change, coverage};
use inplace_wire::pb::Phase;

const FLAGS: &str = "/var/lib/kubelet/kubeadm-flags.env";

/// Past the memo's racy margin (50 ms for file systems with sub-second times), so that
/// what was just written is kept by the next read.
fn settle() {
    std::thread::sleep(Duration::from_millis(150));
}

/// Writes `text` over `p` in place, then puts its mtime back to `mtime`: same size and
/// same mtime to the nanosecond, only the ctime (which user space can not set) moves.
fn rewrite_keeping_mtime(p: &std::path::Path, text: &str, mtime: SystemTime) {
    std::fs::write(p, text).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.set_modified(mtime).unwrap();
}

/// kubeadm's `--max-pods` as coverage reports it (the change's `before`).
async fn max_pods(node: &Node) -> String {
    let r = coverage(node, "kubelet:\n  flags:\n    max-pods: \"250\"\n").await;
    change(&r, "kubelet.flags[max-pods]").before.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_changed_between_two_coverage_calls_is_seen() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    settle();
    let path = node.path(FLAGS);
    let original = std::fs::read_to_string(&path).unwrap();
    assert!(original.contains("--max-pods=110"), "{original}");
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    // read, then kept: the same answer twice
    assert_eq!(max_pods(&node).await, "110");
    assert_eq!(max_pods(&node).await, "110");
    // same size, same mtime to the nanosecond: the ctime tells
    settle();
    rewrite_keeping_mtime(&path, &original.replace("=110", "=111"), mtime);
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(
        (meta.len(), meta.modified().unwrap()),
        (original.len() as u64, mtime)
    );
    assert_eq!(max_pods(&node).await, "111");
    // the racy case: rewritten again at once (same size, same mtime), read at once, and
    // again, each time within the racy window of the previous write
    for v in ["112", "113", "114"] {
        rewrite_keeping_mtime(&path, &original.replace("=110", &format!("={v}")), mtime);
        assert_eq!(max_pods(&node).await, v);
    }
    // kept again once settled, then replaced by a rename: a new inode, same size and mtime
    settle();
    assert_eq!(max_pods(&node).await, "114");
    assert_eq!(max_pods(&node).await, "114");
    let tmp = node.path("/var/lib/kubelet/.flags.tmp");
    std::fs::write(&tmp, original.replace("=110", "=115")).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&tmp)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    assert_eq!(max_pods(&node).await, "115");
    // and gone: absent, not the kept text
    std::fs::remove_file(&path).unwrap();
    assert_eq!(max_pods(&node).await, "absent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sysctl_d_file_added_changed_or_removed_is_seen() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    settle();
    let spec = "sysctls:\n  vm.swappiness: \"10\"\n";
    let reason = |r: &inplace_wire::pb::CoverageReport| {
        let c = change(r, "sysctls[vm.swappiness]");
        (c.covered, c.reason.clone())
    };
    let (covered, why) = reason(&coverage(&node, spec).await);
    assert!(covered, "{why}");
    assert!(reason(&coverage(&node, spec).await).0);
    // a file added to the directory, sorting after the agent's drop-in
    let local = node.path("/etc/sysctl.d/zz-local.conf");
    std::fs::write(&local, "vm.swappiness = 99\n").unwrap();
    let (covered, why) = reason(&coverage(&node, spec).await);
    assert!(!covered);
    assert!(
        why.starts_with("/etc/sysctl.d/zz-local.conf sets vm.swappiness = 99"),
        "{why}"
    );
    // kept, then changed in place: same size, same mtime
    settle();
    assert!(!reason(&coverage(&node, spec).await).0);
    let mtime = std::fs::metadata(&local).unwrap().modified().unwrap();
    rewrite_keeping_mtime(&local, "vm.swappiness = 98\n", mtime);
    let (_, why) = reason(&coverage(&node, spec).await);
    assert!(
        why.starts_with("/etc/sysctl.d/zz-local.conf sets vm.swappiness = 98"),
        "{why}"
    );
    // removed from the directory
    settle();
    assert!(!reason(&coverage(&node, spec).await).0);
    std::fs::remove_file(&local).unwrap();
    let (covered, why) = reason(&coverage(&node, spec).await);
    assert!(covered, "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verifying_re_plan_fails_a_touched_item_still_different() {
    use std::os::unix::fs::PermissionsExt;
    let mut node = Node::new("ubuntu-2404-grub");
    // the boot configuration's regeneration (run after the file writes) puts other
    // content in the file the operation wrote: a touched item that does not verify
    let standin = node.path("/usr/bin/update-grub");
    std::fs::create_dir_all(standin.parent().unwrap()).unwrap();
    std::fs::write(
        &standin,
        "#!/bin/sh\nprintf 'tampered\\n' > \"$INPLACED_STANDIN_ROOT/etc/inplaced-test.conf\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&standin, std::fs::Permissions::from_mode(0o755)).unwrap();
    node.env
        .push(("INPLACED_RECORD_EXEC".into(), "update-grub".into()));
    node.start();
    let spec = "files:\n  - path: /etc/inplaced-test.conf\n    content: \"wanted\\n\"\n\
                kernelArgs: [inplaced.test=1]\n";
    let op = apply(&node, spec, "tampered").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{}", op.message);
    assert!(
        op.message.contains(
            "verifying: still different after the commit: files[/etc/inplaced-test.conf]"
        ),
        "{}",
        op.message
    );
    // the kernel argument is verified after the boot, so it is not listed
    assert!(!op.message.contains("kernelArgs["), "{}", op.message);
    // and the same operation without the tampering succeeds (the re-plan finds nothing)
    std::fs::write(&standin, "#!/bin/sh\nexit 0\n").unwrap();
    let op = apply(&node, spec, "clean").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{}", op.message);
    assert_eq!(node.read("/etc/inplaced-test.conf"), "wanted\n");
}
