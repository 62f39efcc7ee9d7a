//! The durable barriers of an operation: each operation logs, when it
//! settles, how many fsyncs it made, and that number is the journal's documented order
//! (`crates/agent/src/apply/journal.rs`, journal format 2) exactly: 7 + one per file for
//! an apply of new files into an existing directory (the intent and `journal/` 2, each
//! file's content, the directory 1, the commit and `journal/` 2, the settled operation and
//! `operations/` 2; the Staging operation, the installed record and spec and the
//! journal's clean-up take none), and 7 for their removal however many (the intent 2, the
//! directory 1, the commit 2, the settled operation 2: the files still have the content
//! the applied spec gave them, so their pre-images are read from the spec's durable copy
//! and none is copied; 7 + one per file before). A new content of a managed file is 7 + 1
//! for the same reason; a file that is not the spec's (changed on the node) still has its
//! pre-image copied (one fsync more). The
//! history stays whole although the phases between Staging and the settled one are not
//! written to disk and Staging is written without an fsync.

mod common;

use common::{Node, apply};
use inplace_wire::pb;

fn files_yaml(n: usize) -> String {
    let mut y = String::from("files:\n");
    for i in 0..n {
        y.push_str(&format!(
            "  - path: /etc/bench-barriers/f{i}.conf\n    content: \"value {i}\\n\"\n    mode: \"0644\"\n"
        ));
    }
    y
}

/// The `fsyncs=` of the "operation settled" log line of operation `id` (logged just after
/// the settled phase is published: waited for).
async fn fsyncs_of(node: &Node, id: &str) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let line = loop {
        let log = node.log();
        if let Some(l) = log.lines().find(|l| {
            l.contains("operation settled")
                && l.split_whitespace().any(|w| w == format!("operation={id}"))
        }) {
            break l.to_string();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no 'operation settled' line for {id} in:\n{log}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("fsyncs="))
        .and_then(|v| v.trim_matches(|c: char| !c.is_ascii_digit()).parse().ok())
        .unwrap_or_else(|| panic!("no fsyncs= in {line}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_takes_exactly_the_barriers_of_the_journal_order() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::create_dir_all(node.path("/etc/bench-barriers")).unwrap();
    node.log_file = Some(node.dir.path().join("agent.log"));
    node.start();
    // the first operation also creates operations/ and journal/ (2 fsyncs each)
    apply(&node, &files_yaml(1), "warm").await;
    assert_eq!(fsyncs_of(&node, "warm").await, 7 + 1 + 4);
    apply(&node, "files: []\n", "warm-removed").await;
    for (n, id) in [(1usize, "one"), (3, "three")] {
        let op = apply(&node, &files_yaml(n), id).await;
        assert_eq!(op.phase, pb::Phase::Succeeded as i32, "{}", op.message);
        assert_eq!(fsyncs_of(&node, id).await, 7 + n as u64, "apply of {n}");
        let rm = format!("{id}-removed");
        let op = apply(&node, "files: []\n", &rm).await;
        assert_eq!(op.phase, pb::Phase::Succeeded as i32, "{}", op.message);
        assert!(!node.path("/etc/bench-barriers/f0.conf").exists());
        assert_eq!(fsyncs_of(&node, &rm).await, 7, "removal of {n}");
    }
    // a new content for a managed file: its pre-image is the spec's, not copied
    apply(&node, &files_yaml(2), "two").await;
    let changed = files_yaml(2).replace("value 1", "value 1 changed");
    let op = apply(&node, &changed, "two-changed").await;
    assert_eq!(op.phase, pb::Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(fsyncs_of(&node, "two-changed").await, 7 + 1);
    // a managed file changed on the node since: its content is no item of the spec, so
    // its pre-image is copied (its content fsynced: one more)
    std::fs::write(
        node.path("/etc/bench-barriers/f0.conf"),
        "edited on the node\n",
    )
    .unwrap();
    let op = apply(
        &node,
        &changed.replace("value 0", "value 0 again"),
        "two-over-edit",
    )
    .await;
    assert_eq!(op.phase, pb::Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(fsyncs_of(&node, "two-over-edit").await, 7 + 1 + 1);
    let op = apply(&node, "files: []\n", "two-removed").await;
    assert_eq!(op.phase, pb::Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(fsyncs_of(&node, "two-removed").await, 7);
    // the history and each operation are whole: read back from disk, settled
    let ops = node.operations().await;
    let ids: Vec<&str> = ops.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "two-removed",
            "two-over-edit",
            "two-changed",
            "two",
            "three-removed",
            "three",
            "one-removed",
            "one",
            "warm-removed",
            "warm"
        ]
    );
    assert!(ops.iter().all(|o| o.phase == pb::Phase::Succeeded as i32));
    let three = ops.iter().find(|o| o.id == "three").unwrap();
    assert_eq!(three.changes.len(), 3, "{three:?}");
    assert!(
        three
            .actions
            .iter()
            .any(|a| a.starts_with("wrote /etc/bench-barriers/f2.conf"))
    );
    node.stop();
}
