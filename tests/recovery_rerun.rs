//! A start killed in the middle of a rollback from the journal, after the paths were put
//! back and before the reruns and restarts (found by the session-7 break-it tester): the
//! next start must still rerun the boot-configuration commands and restart the units,
//! since "every path is as before" does not mean the units and generated files are.

mod common;

use common::*;
use inplace_wire::pb::Phase;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn tree(root: &Path) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
    snapshot(root)
        .into_iter()
        .map(|(p, c, m)| (p.strip_prefix(root).unwrap().to_path_buf(), (c, m)))
        .collect()
}

/// Puts every file of `old` back under `root` and removes the files `old` did not have
/// (what a first recovery does before it restarts the units).
fn put_back(root: &Path, old: &BTreeMap<PathBuf, (Vec<u8>, u32)>) {
    for (p, _) in tree(root) {
        if !old.contains_key(&p) && !p.starts_with("proc") && root.join(&p).is_file() {
            std::fs::remove_file(root.join(&p)).unwrap();
        }
    }
    let _ = std::fs::remove_dir(root.join("etc/crash"));
    for (p, (c, _)) in old {
        if p.starts_with("proc") || !root.join(p).is_file() && root.join(p).exists() {
            continue;
        }
        if root.join(p).is_dir() {
            continue;
        }
        std::fs::write(root.join(p), c).unwrap();
    }
}

/// The state a SIGKILL leaves when it lands inside a start's rollback from the journal,
/// after the paths were put back and before the units were restarted: the next start
/// finds every path "untouched", restarts nothing and says RolledBack, although the
/// kubelet still runs with the configuration the interrupted operation gave it (it was
/// restarted at `act`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_killed_mid_rollback_still_restarts_the_units() {
    let yaml = workload();
    let mut node = Node::new("ubuntu-2404-grub");
    let old = tree(&node.root);
    node.die_at("act", &yaml).await;
    let acted = node.actions();
    assert!(
        acted.iter().any(|a| a.contains("kubelet")),
        "the kubelet was restarted at act: {acted:?}"
    );
    // the first recovery's restore, then SIGKILL before its restart
    put_back(&node.root, &old);
    node.start();
    let op = node.settle("crash").await;
    let after = node.actions()[acted.len()..].to_vec();
    eprintln!("phase {:?}: {}", op.phase, op.message);
    eprintln!("actions after the recovery: {after:?}");
    for k in ["vm/max_map_count", "vm/swappiness"] {
        eprintln!("{k} live: {}", node.read(&format!("/proc/sys/{k}")).trim());
    }
    assert_eq!(op.phase, Phase::RolledBack as i32, "{}", op.message);
    assert!(
        after.iter().any(|a| a == "restart kubelet.service"),
        "RolledBack, yet the kubelet (restarted with the new config at act) was not restarted: {after:?}"
    );
}

/// The same window with `update-grub`: the first start put `/etc/default/grub` back and
/// was killed before running `update-grub` again; the next start finds the path as
/// before, reruns nothing, and says RolledBack, while grub.cfg (the real one, not
/// modelled by the recorder) is still generated from the rolled-back arguments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_killed_mid_rollback_still_reruns_update_grub() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(&node.config, "[kernel_args]\ntrial = false\n").unwrap();
    let before = std::fs::read(node.path("/etc/default/grub")).unwrap();
    node.die_at("act", "kernelArgs: [isolcpus=2-7]\n").await;
    let n = node.actions().len();
    assert!(node.actions().iter().any(|a| a.contains("update-grub")));
    // the first recovery's restore, then SIGKILL before its rerun
    std::fs::write(node.path("/etc/default/grub"), &before).unwrap();
    node.start();
    let op = node.settle("crash").await;
    let after = node.actions()[n..].to_vec();
    eprintln!(
        "{:?}: {}\nactions: {after:?}",
        Phase::try_from(op.phase),
        op.message
    );
    assert_eq!(op.phase, Phase::RolledBack as i32, "{}", op.message);
    assert!(
        after.iter().any(|a| a.contains("update-grub")),
        "RolledBack without update-grub over the restored file: {after:?}"
    );
}
