//! After a journal was quarantined, the files its interrupted operation left are not taken
//! as the node's own, black box: a re-apply that would record a file the operation
//! created as "there before" (unchanged, or saved as the original to restore) is refused
//! in Staging naming the path, the quarantined journal and the fix, and writes nothing;
//! a file the journal names that is still as before the operation is taken as usual;
//! once the administrator removed the quarantined journal, the apply runs.

mod common;
use common::*;
use inplace_wire::pb::Phase;
use std::path::PathBuf;

/// Two new files, an overwrite of an existing file and a kubelet config field.
const WORKLOAD: &str = "files:
- path: /etc/rel/a.conf
  content: \"a\\n\"
- path: /etc/rel/b.conf
  content: \"b\\n\"
- path: /etc/hostname
  content: \"rel-node\\n\"
kubelet:
  config:
    serializeImagePulls: false
";

/// A node whose operation `crash` was killed after its second write (a.conf and b.conf
/// created), with the pre-image of the kubelet's config.yaml truncated: recovery
/// quarantines the journal. Returns the node (running) and the quarantine directory.
async fn quarantined_node() -> (Node, PathBuf) {
    let mut node = Node::new("ubuntu-2404-grub");
    node.die_at("write:2", WORKLOAD).await;
    let intent: serde_json::Value = {
        let b = std::fs::read(node.state.join("journal/crash.intent")).unwrap();
        let start = b.iter().position(|c| *c == b'{').unwrap();
        serde_json::from_slice(&b[start..]).unwrap()
    };
    let pre = intent["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == "/var/lib/kubelet/config.yaml")
        .unwrap()["pre"]["file"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::write(node.state.join("journal").join(pre), b"").unwrap();
    node.start();
    let op = node.settle("crash").await;
    assert_eq!(op.phase, Phase::Failed as i32, "{}", op.message);
    assert!(
        op.message.contains("nothing was restored"),
        "{}",
        op.message
    );
    let q: Vec<PathBuf> = std::fs::read_dir(node.state.join("quarantine"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(node.read("/etc/rel/a.conf"), "a\n", "left by the crash");
    (node, q[0].clone())
}

fn sha(b: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)))
}

/// The expected refusal of `path` (created by the crash, now `now`).
fn refusal_of(path: &str, now: &str, q: &std::path::Path) -> String {
    let q = q.display();
    format!(
        "{path}: the interrupted operation's journal, quarantined in {q}, names it (before the operation: absent; now: {now}), so inplaced cannot tell whether it is the node's own or what that operation left; it would be recorded as what the node had before inplaced managed it; check {path} (put back what the node should have, or remove it if the node should not have it), then remove {q} and apply again"
    )
}

/// The same spec again: a.conf and b.conf already have the content the spec gives them,
/// so they would be recorded "unchanged" (kept when dropped from the spec) although the
/// crashed operation created them. Refused naming both, nothing written, nothing
/// recorded; after the quarantined journal is removed the apply runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_a_quarantined_operation_created_are_not_adopted_unchanged() {
    let (node, q) = quarantined_node().await;
    let before = snapshot(&node.root);
    let state_before = applied_record(&node.state);
    let op = apply(&node, WORKLOAD, "again").await;
    assert_eq!(op.phase, Phase::Failed as i32, "{}", op.message);
    let a = refusal_of("/etc/rel/a.conf", &sha(b"a\n"), &q);
    let b = refusal_of("/etc/rel/b.conf", &sha(b"b\n"), &q);
    assert!(
        op.message
            .ends_with(&format!("staging: {a}; {b}; nothing was changed")),
        "{}",
        op.message
    );
    // hostname and config.yaml are still as before the crash: not named
    assert!(!op.message.contains("/etc/hostname"), "{}", op.message);
    assert!(!op.message.contains("config.yaml"), "{}", op.message);
    assert_eq!(snapshot(&node.root), before, "nothing written");
    assert_eq!(
        applied_record(&node.state),
        state_before,
        "nothing recorded"
    );
    // the administrator checked the files and removes the quarantined journal
    std::fs::remove_dir_all(&q).unwrap();
    let op = apply(&node, WORKLOAD, "after").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
}

/// Other content for a.conf: its current content (what the crash wrote) would be saved
/// as the original to restore when a.conf leaves the spec. Refused the same way; after
/// the administrator removes the file the crash left and the quarantined journal, the
/// file is created (original: absent), and dropping it from the spec removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_a_quarantined_operation_created_are_not_saved_as_originals() {
    let (node, q) = quarantined_node().await;
    let other = "files:\n- path: /etc/rel/a.conf\n  content: \"other\\n\"\n";
    let before = snapshot(&node.root);
    let originals = snapshot(&node.state.join("originals"));
    let op = apply(&node, other, "other").await;
    assert_eq!(op.phase, Phase::Failed as i32, "{}", op.message);
    assert!(
        op.message.ends_with(&format!(
            "staging: {}; nothing was changed",
            refusal_of("/etc/rel/a.conf", &sha(b"a\n"), &q)
        )),
        "{}",
        op.message
    );
    assert_eq!(snapshot(&node.root), before, "nothing written");
    assert_eq!(
        snapshot(&node.state.join("originals")),
        originals,
        "no original saved"
    );
    // the fix the message gives
    std::fs::remove_file(node.path("/etc/rel/a.conf")).unwrap();
    std::fs::remove_dir_all(&q).unwrap();
    let op = apply(&node, other, "other2").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(node.read("/etc/rel/a.conf"), "other\n");
    let op = apply(&node, "files: []\n", "drop").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert!(!node.path("/etc/rel/a.conf").exists(), "created: removed");
}

/// A spec that touches only what the crashed operation never changed (the hostname,
/// still its pre-image) is not held up by the quarantine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_still_as_before_the_quarantined_operation_is_taken_as_usual() {
    let (node, _q) = quarantined_node().await;
    let op = apply(
        &node,
        "files:\n- path: /etc/hostname\n  content: \"rel-node\\n\"\n",
        "host",
    )
    .await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(node.read("/etc/hostname"), "rel-node\n");
}

/// A quarantined intent that does not parse names no file: a file the apply would take
/// over with its content (here /etc/rel/a.conf, left by the crash) is refused naming the
/// journal's intent; a new file (absent now) is created as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantined_intent_that_does_not_parse_vouches_for_nothing() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.die_at("write:2", WORKLOAD).await;
    let p = node.state.join("journal/crash.intent");
    let b = std::fs::read(&p).unwrap();
    std::fs::write(&p, &b[..b.len() / 2]).unwrap();
    node.start();
    assert_eq!(node.settle("crash").await.phase, Phase::Failed as i32);
    let q = std::fs::read_dir(node.state.join("quarantine"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let op = apply(&node, WORKLOAD, "again").await;
    assert_eq!(op.phase, Phase::Failed as i32, "{}", op.message);
    let qd = q.display();
    let expect = format!(
        "/etc/rel/a.conf: a journal quarantined in {qd} does not say which files its operation wrote ({qd}/crash.intent does not parse), so inplaced cannot tell whether /etc/rel/a.conf ({}) is the node's own",
        sha(b"a\n")
    );
    assert!(op.message.contains(&expect), "{}", op.message);
    let op = apply(
        &node,
        "files:\n- path: /etc/rel/new.conf\n  content: \"n\\n\"\n",
        "new",
    )
    .await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
}

/// The same class through a setting: the crashed operation rewrote the kubelet's
/// config.yaml (its journal then quarantined over another file's damaged pre-image), and
/// an apply that edits config.yaml again would read the operation's values as the priors
/// to restore. Refused naming config.yaml with its hash before the operation and now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_whose_settings_a_quarantined_operation_rewrote_is_not_read_for_priors() {
    let mut node = Node::new("ubuntu-2404-grub");
    let config = "/var/lib/kubelet/config.yaml";
    let pre = std::fs::read(node.path(config)).unwrap();
    node.die_at("sysctl", WORKLOAD).await;
    let rewritten = std::fs::read(node.path(config)).unwrap();
    assert_ne!(rewritten, pre, "the crash rewrote config.yaml");
    let intent: serde_json::Value = {
        let b = std::fs::read(node.state.join("journal/crash.intent")).unwrap();
        let start = b.iter().position(|c| *c == b'{').unwrap();
        serde_json::from_slice(&b[start..]).unwrap()
    };
    let host_pre = intent["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == "/etc/hostname")
        .unwrap()["pre"]["file"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::write(node.state.join("journal").join(host_pre), b"x").unwrap();
    node.start();
    assert_eq!(node.settle("crash").await.phase, Phase::Failed as i32);
    let q = std::fs::read_dir(node.state.join("quarantine"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let before = snapshot(&node.root);
    let op = apply(
        &node,
        "kubelet:\n  config:\n    shutdownGracePeriod: 30s\n",
        "prior",
    )
    .await;
    assert_eq!(op.phase, Phase::Failed as i32, "{}", op.message);
    let qd = q.display();
    let expect = format!(
        "staging: {config}: the interrupted operation's journal, quarantined in {qd}, names it (before the operation: {}; now: {}), so inplaced cannot tell whether it is the node's own or what that operation left",
        sha(&pre),
        sha(&rewritten)
    );
    assert!(op.message.contains(&expect), "{}", op.message);
    assert_eq!(snapshot(&node.root), before, "nothing written");
}
