//! An agent upgraded while an operation written by the previous journal format is
//! pending (format 1: `journal/<op>/`, inplaced up to commit 43048f4) settles it as that
//! agent did. The state directories are the old agent's own, killed in the middle of
//! operation `v1` (`tests/fixtures/journal-v1/generate.sh`, spec `spec.yaml`: a new file
//! in a new directory and an overwrite of `/etc/hostname`): at failpoint `act` (before
//! the commit point) and `record` (just past it). `tests/compat/cross-version-recovery.sh`
//! compares with the old binary itself; this runs without it.

mod common;

use common::*;
use inplace_wire::pb::Phase;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const SPEC: &str = include_str!("fixtures/journal-v1/spec.yaml");

fn fixture(fp: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/journal-v1")
        .join(fp)
}

type Tree = BTreeMap<PathBuf, (Vec<u8>, u32)>;

fn tree(root: &Path) -> Tree {
    snapshot(root)
        .into_iter()
        .map(|(p, c, m)| (p.strip_prefix(root).unwrap().to_path_buf(), (c, m)))
        .collect()
}

/// A node as the old agent left it at `fp`, with its tree before the operation.
fn crashed(fp: &str) -> (Node, Tree) {
    let node = Node::new("ubuntu-2404-grub");
    let before = tree(&node.root);
    copy_tree(&fixture(fp).join("changed"), &node.root);
    copy_tree(&fixture(fp).join("state"), &node.state);
    assert_eq!(
        node.read("/etc/hostname"),
        "v1-node\n",
        "the crash left the write"
    );
    assert!(
        node.state.join("journal/v1/intent.json").exists(),
        "a format-1 journal"
    );
    (node, before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_1_journal_before_its_commit_is_rolled_back() {
    let (mut node, before) = crashed("act");
    node.start();
    let op = node.settle("v1").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{}", op.message);
    assert!(
        op.message
            .starts_with("interrupted: the agent stopped (last step: acted)")
            && op
                .message
                .contains("restored from the journal's pre-images: /etc/hostname;")
            && op
                .message
                .contains("removed (created by the operation): /etc/v1/a.conf;"),
        "{}",
        op.message
    );
    assert_eq!(tree(&node.root), before, "the old node exactly");
    assert!(!node.state.join("journal/v1").exists());
    let s = status(&node).await;
    assert!(s.problems.is_empty(), "{:?}", s.problems);
    assert_eq!(s.managed_items, 0);
    // the id is free: the operation runs again, in the new format
    assert_eq!(
        apply(&node, SPEC, "v1").await.phase,
        Phase::Succeeded as i32
    );
    assert_eq!(node.read("/etc/v1/a.conf"), "written by the operation\n");
    assert!(node.state.join("journal/v1.commit").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_1_journal_past_its_commit_is_rolled_forward() {
    let (mut node, before) = crashed("record");
    node.start();
    let op = node.settle("v1").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(
        op.message,
        "changes committed; completed after an agent restart"
    );
    assert_eq!(node.read("/etc/hostname"), "v1-node\n");
    assert_eq!(node.read("/etc/v1/a.conf"), "written by the operation\n");
    assert!(!node.state.join("journal/v1").exists());
    let s = status(&node).await;
    assert!(s.problems.is_empty(), "{:?}", s.problems);
    assert_eq!(s.managed_items, 2, "the old journal's record was installed");
    assert!(coverage(&node, SPEC).await.changes.is_empty());
    // the record owns what the old agent wrote: dropping the spec restores the old
    // agent's saved original of /etc/hostname and removes the created file and directory
    assert_eq!(
        apply(&node, "{}\n", "drop").await.phase,
        Phase::Succeeded as i32
    );
    assert_eq!(tree(&node.root), before);
}
