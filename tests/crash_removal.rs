//! Crash safety of a removal whose pre-images are read from the applied spec (journal
//! format 2, `PRE_FROM_APPLIED_SPEC` in `crates/agent/src/state/journal.rs`): a managed
//! file that still has the content the spec gave it is not copied into the journal; its
//! intent entry names the applied spec, whose durable copies (the previous operation's
//! commit in `journal/`, `applied-spec.pb`) hold the bytes. The agent is killed between
//! two removals (failpoint `remove`) and after them (`act`); the next start must put back
//! every file exactly: bytes, mode, owner and group, from whichever copy is left.

mod common;

use common::*;
use inplace_wire::pb::Phase;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

/// Six managed files: modes, owners, a binary content, an empty one, two with the same
/// content, one in a directory of its own.
const SPEC: &str = r##"files:
- path: /etc/crash-rm/a.conf
  content: "alpha\n"
  mode: "0644"
- path: /etc/crash-rm/secret.env
  content: "TOKEN=s3cr3t\n"
  mode: "0600"
  owner: daemon
  group: daemon
- path: /etc/crash-rm/run.sh
  content: "#!/bin/sh\nexit 0\n"
  mode: "0755"
  owner: bin
  group: sys
- path: /etc/crash-rm/empty
  content: ""
  mode: "0640"
- path: /etc/crash-rm/same-1
  content: "same\n"
  mode: "0444"
- path: /etc/crash-rm/sub/same-2
  content: "same\n"
  mode: "0600"
  owner: daemon
"##;

/// Path -> (bytes, mode, uid, gid) of every file under /etc/crash-rm.
fn files(node: &Node) -> BTreeMap<String, (Vec<u8>, u32, u32, u32)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![node.path("/etc/crash-rm")];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.map(Result::unwrap) {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                out.insert(
                    e.path().display().to_string(),
                    (
                        std::fs::read(e.path()).unwrap(),
                        m.mode() & 0o7777,
                        m.uid(),
                        m.gid(),
                    ),
                );
            }
        }
    }
    out
}

/// What the killed removal left in `journal/`: its intent names the applied spec as the
/// source of every pre-image, and no pre-image was copied.
fn assert_pre_images_from_spec(node: &Node) {
    let journal = node.state.join("journal");
    let names: Vec<String> = std::fs::read_dir(&journal)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.contains(".pre-")),
        "a pre-image was copied: {names:?}"
    );
    let intent = std::fs::read_to_string(journal.join("crash.intent")).unwrap();
    assert_eq!(
        intent.matches("\"file\": \"applied-spec\"").count(),
        6,
        "{intent}"
    );
}

/// Applies SPEC, then (same agent run, so the first operation's commit is still pending
/// in `journal/`) removes it with id `crash`, killed at `failpoint`; returns the files as
/// they were before the removal.
async fn killed_removing(
    node: &mut Node,
    failpoint: &str,
) -> BTreeMap<String, (Vec<u8>, u32, u32, u32)> {
    killed_removing_after(node, failpoint, false).await
}

/// [`killed_removing`]; with `restart`, the agent is restarted between the apply and the
/// removal (the start installs the commit with fsyncs and removes it: `applied-spec.pb`
/// is then the spec's only copy).
async fn killed_removing_after(
    node: &mut Node,
    failpoint: &str,
    restart: bool,
) -> BTreeMap<String, (Vec<u8>, u32, u32, u32)> {
    node.failpoints = Some(failpoint.to_string());
    node.start();
    let op = apply(node, SPEC, "put").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    if restart {
        node.stop();
        node.start();
        assert!(!node.state.join("journal/put.commit").exists());
    }
    let before = files(node);
    assert_eq!(before.len(), 6);
    assert_eq!(
        before[&node.path("/etc/crash-rm/secret.env").display().to_string()],
        (b"TOKEN=s3cr3t\n".to_vec(), 0o600, 1, 1)
    );
    assert_eq!(
        node.apply_until_exit("files: []\n", "crash").await,
        Some(9),
        "{failpoint}: the agent must die by SIGKILL"
    );
    node.failpoints = None;
    assert_pre_images_from_spec(node);
    before
}

/// After the restart: rolled back, every file exactly as before; then the removal runs
/// again with the same id and converges.
async fn assert_restored(node: &mut Node, before: &BTreeMap<String, (Vec<u8>, u32, u32, u32)>) {
    node.start_after_crash("crash").await;
    assert_eq!(&files(node), before, "restored byte-exact, mode and owner");
    let op = apply(node, "files: []\n", "crash").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert!(files(node).is_empty());
    assert!(!node.path("/etc/crash-rm").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_removal_restores_files_from_the_applied_spec() {
    // between two removals (3 of 6 gone), after the 6th, after the removal's unit actions
    // (the first `act` is the apply's)
    for fp in ["remove:3", "remove:6", "act:2"] {
        eprintln!("failpoint {fp}");
        let mut node = Node::new("ubuntu-2404-grub");
        let before = killed_removing(&mut node, fp).await;
        if fp == "remove:3" {
            assert_eq!(files(&node).len(), 3, "{fp}: half removed");
        }
        assert_restored(&mut node, &before).await;
    }
}

/// `applied-spec.pb` damaged or older (a previous release installed it without an
/// fsync; this one installs it only at a start or outside an operation): the pending
/// commit of the operation that applied the spec is the durable copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_from_the_pending_commit_when_applied_spec_is_lost() {
    let mut node = Node::new("ubuntu-2404-grub");
    let before = killed_removing(&mut node, "remove:2").await;
    let journal = node.state.join("journal");
    assert!(journal.join("put.commit").exists());
    std::fs::write(node.state.join("applied-spec.pb"), b"").unwrap();
    assert_restored(&mut node, &before).await;
}

/// After a start installed the commit durably and removed it, `applied-spec.pb` is the
/// durable copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_from_applied_spec_when_no_commit_is_pending() {
    let mut node = Node::new("ubuntu-2404-grub");
    let before = killed_removing_after(&mut node, "remove:5", true).await;
    assert!(!node.state.join("journal/put.commit").exists());
    assert_restored(&mut node, &before).await;
}

/// No copy holds the content any more (both damaged): nothing is restored from a guess;
/// the journal is quarantined and the files it names are listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_copy_of_the_spec_left_restores_nothing() {
    let mut node = Node::new("ubuntu-2404-grub");
    killed_removing(&mut node, "remove:3").await;
    std::fs::remove_file(node.state.join("journal/put.commit")).unwrap();
    std::fs::write(node.state.join("applied-spec.pb"), b"").unwrap();
    let left = files(&node);
    node.start();
    let op = node.settle("crash").await;
    assert_eq!(op.phase, Phase::Failed as i32, "{}", op.message);
    assert!(op.message.contains("applied spec"), "{}", op.message);
    assert_eq!(files(&node), left, "nothing restored or removed");
    let st = status(&node).await;
    assert!(
        st.problems
            .iter()
            .any(|p| p.contains("/etc/crash-rm/a.conf")),
        "{:?}",
        st.problems
    );
}
