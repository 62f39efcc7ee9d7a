//! Hostile checks of "an operation's pending commit is the applied state" (black box, the
//! real daemon): two commits brought back by a power cut, a damaged newest commit, foreign
//! `*.commit` entries, kills around the retire and settle points, readers beside back-to-back
//! operations, and state directories of the previous release.

mod common;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use inplace_wire::pb::{self, Phase};

/// `/etc/bc/a.conf`.
const SPEC_A: &str = "files:\n  - path: /etc/bc/a.conf\n    content: \"A\\n\"\n";
/// `/etc/bc/a.conf` and `/etc/bc/b.conf` (neither exists on the fixture node).
const SPEC_B: &str = "files:\n  - path: /etc/bc/a.conf\n    content: \"A\\n\"\n  - path: /etc/bc/b.conf\n    content: \"B\\n\"\n";

async fn ok(node: &Node, yaml: &str, id: &str) {
    let op = tokio::time::timeout(Duration::from_secs(30), apply(node, yaml, id))
        .await
        .unwrap_or_else(|_| panic!("operation {id} did not settle within 30 s"));
    assert_eq!(op.phase, Phase::Succeeded as i32, "{id}: {}", op.message);
}

fn commit_path(node: &Node, op: &str) -> PathBuf {
    node.state.join(format!("journal/{op}.commit"))
}

/// The `*.commit` names in `journal/`.
fn commits(state: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(state.join("journal"))
        .into_iter()
        .flatten()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".commit"))
        .collect();
    v.sort();
    v
}

/// The managed file paths of the applied record (`common::applied_record`).
fn managed_files(state: &Path) -> Vec<String> {
    let r = applied_record(state).unwrap_or_default();
    let mut v: Vec<String> = r["files"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// A commit's (header JSON, spec bytes).
fn open_commit(b: &[u8]) -> (serde_json::Value, Vec<u8>) {
    let body = &b[b.iter().position(|c| *c == b'\n').unwrap() + 1..];
    let nl = body.iter().position(|c| *c == b'\n').unwrap();
    (
        serde_json::from_slice(&body[..nl]).unwrap(),
        body[nl + 1..].to_vec(),
    )
}

fn reseal(head: &serde_json::Value, spec: &[u8]) -> Vec<u8> {
    let mut b = serde_json::to_vec(head).unwrap();
    b.push(b'\n');
    b.extend_from_slice(spec);
    sealed(&b)
}

fn quarantined(state: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![state.join("quarantine")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// 1. A power cut brings back an older commit whose removal was not fsynced: two commits;
/// the newer one is the applied state while running, after a restart, and the next
/// operation takes it (b.conf, which did not exist before, is removed when dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_commit_brought_back_loses_to_the_newer() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    ok(&node, SPEC_A, "a").await;
    let old = std::fs::read(commit_path(&node, "a")).unwrap();
    ok(&node, SPEC_B, "b").await;
    assert!(!commit_path(&node, "a").exists(), "retired by b");
    std::fs::write(commit_path(&node, "a"), &old).unwrap();
    assert_eq!(status(&node).await.managed_items, 2);
    assert!(coverage(&node, SPEC_B).await.changes.is_empty());
    node.stop();
    node.start();
    let s = status(&node).await;
    assert!(s.problems.is_empty(), "{:?}", s.problems);
    assert_eq!(s.managed_items, 2);
    assert!(
        commits(&node.state).is_empty(),
        "a start settles every commit"
    );
    assert_eq!(
        managed_files(&node.state),
        vec!["/etc/bc/a.conf", "/etc/bc/b.conf"]
    );
    ok(&node, SPEC_A, "back").await;
    assert!(!node.path("/etc/bc/b.conf").exists());
    assert_eq!(node.read("/etc/bc/a.conf"), "A\n");
}

/// Flips one byte in the middle of the file.
fn flip(p: &Path) {
    let mut b = std::fs::read(p).unwrap();
    let i = b.len() / 2;
    b[i] ^= 0x20;
    std::fs::write(p, b).unwrap();
}

/// 2a. The newest commit damaged on disk while the daemon runs (nothing installed before
/// it: no applied.json). It may hold the node's newest applied state, so it is reported
/// in status, the next change is refused naming it (nothing planned on the older state:
/// b.conf, created by `b`, is never left unmanaged), and its bytes are kept; the restart
/// quarantines it and reports it. (Before the fix the readers passed it over silently,
/// `c` built on the older state and its retire deleted the damaged commit unreported.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_newest_commit_while_running_loses_nothing() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    ok(&node, SPEC_A, "a").await;
    ok(&node, SPEC_B, "b").await;
    let damaged = commit_path(&node, "b");
    flip(&damaged);
    let bytes = std::fs::read(&damaged).unwrap();
    let s = status(&node).await;
    assert!(
        s.problems
            .iter()
            .any(|m| m.contains("b.commit") && m.contains("does not verify")),
        "status does not report the damaged commit (managed_items {}, problems {:?})",
        s.managed_items,
        s.problems
    );
    let refused = apply_refused(&node, SPEC_A, "c").await;
    assert!(
        refused.message().contains("b.commit") && refused.message().contains("restart"),
        "{refused:?}"
    );
    let refused = node
        .client()
        .await
        .get_coverage(pb::GetCoverageRequest {
            desired: Some(spec(SPEC_A)),
            ..Default::default()
        })
        .await
        .expect_err("coverage planned on an older applied state");
    assert!(refused.message().contains("b.commit"), "{refused:?}");
    assert_eq!(node.read("/etc/bc/b.conf"), "B\n");
    assert_eq!(
        std::fs::read(&damaged).unwrap(),
        bytes,
        "the damaged commit was not kept"
    );
    node.stop();
    node.start();
    assert!(
        quarantined(&node.state)
            .iter()
            .any(|q| std::fs::read(q).unwrap() == bytes),
        "the start did not quarantine the damaged commit with its bytes"
    );
    let s = status(&node).await;
    assert!(
        s.problems.iter().any(|m| m.contains("journal/b.")),
        "the start does not report b's damaged journal: {:?}",
        s.problems
    );
}

/// 2a'. A commit written by a newer inplaced (format 3) appears while the daemon runs:
/// reported, changes refused naming it, never removed by a retire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_agents_commit_while_running_is_never_removed() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    ok(&node, SPEC_A, "a").await;
    let (mut head, spec_bytes) = open_commit(&std::fs::read(commit_path(&node, "a")).unwrap());
    head["generation"] = serde_json::json!(999);
    head["version"] = serde_json::json!(3);
    let newer = node.state.join("journal/newer.commit");
    std::fs::write(&newer, reseal(&head, &spec_bytes)).unwrap();
    let s = status(&node).await;
    assert!(
        s.problems
            .iter()
            .any(|m| m.contains("newer.commit") && m.contains("format")),
        "{:?}",
        s.problems
    );
    let refused = apply_refused(&node, SPEC_B, "b").await;
    assert!(refused.message().contains("newer.commit"), "{refused:?}");
    assert!(newer.exists());
    assert!(!node.path("/etc/bc/b.conf").exists());
}

/// The control of 2a: without damage, `c` removes b.conf and dropping every file removes
/// a.conf (both absent before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_damage_dropped_files_are_removed() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    ok(&node, SPEC_A, "a").await;
    ok(&node, SPEC_B, "b").await;
    ok(&node, SPEC_A, "c").await;
    assert!(!node.path("/etc/bc/b.conf").exists());
    node.stop();
    node.start();
    ok(&node, "files: []\n", "none").await;
    assert!(!node.path("/etc/bc/a.conf").exists());
}

/// 2b. The newest commit damaged, then a restart: the damage is reported in status and
/// the commit quarantined (its bytes kept), not silently dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_newest_commit_at_start_is_reported_and_kept() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    ok(&node, SPEC_A, "a").await;
    ok(&node, SPEC_B, "b").await;
    node.stop();
    let p = commit_path(&node, "b");
    let b = std::fs::read(&p).unwrap();
    std::fs::write(&p, &b[..b.len() - 7]).unwrap(); // truncated
    let damaged = std::fs::read(&p).unwrap();
    node.start();
    let s = status(&node).await;
    assert!(
        s.problems.iter().any(|m| m.contains("b")),
        "the damaged commit is not reported: {:?}",
        s.problems
    );
    assert!(
        quarantined(&node.state)
            .iter()
            .any(|q| std::fs::read(q).unwrap() == damaged),
        "the damaged commit's bytes are not kept in quarantine/"
    );
    assert!(!p.exists());
    // b's history is kept as it was
    assert_eq!(node.settle("b").await.phase, Phase::Succeeded as i32);
}

/// 2c. As 2b: the report names what happened, the damaged commit `b.commit` (not a
/// missing `b.intent`, which a settled operation never has) and that b's applied state
/// was lost (the agent now manages nothing: `managed_items` 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_newest_commit_at_start_is_named() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    ok(&node, SPEC_A, "a").await;
    ok(&node, SPEC_B, "b").await;
    node.stop();
    flip(&commit_path(&node, "b"));
    node.start();
    let s = status(&node).await;
    assert_eq!(s.managed_items, 0);
    assert!(
        s.problems
            .iter()
            .any(|m| m.contains("b.commit") && m.contains("applied")),
        "{:#?}",
        s.problems
    );
    assert!(
        !s.problems.iter().any(|m| m.contains("b.intent: missing")),
        "{:#?}",
        s.problems
    );
}

/// 3. Foreign entries named `*.commit`: a directory, a symlink to a well-formed commit of
/// a higher generation outside the state directory, a FIFO, a large sparse file and a
/// commit of a newer agent (version 3, higher generation). Status, coverage and an apply
/// answer in time; none of them is taken as the applied state, before and after a
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_commit_entries_are_never_the_applied_state() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    ok(&node, SPEC_A, "a").await;
    ok(&node, SPEC_B, "b").await;
    let (mut head, spec) = open_commit(&std::fs::read(commit_path(&node, "b")).unwrap());
    head["generation"] = serde_json::json!(999);
    head["record"] = serde_json::json!({});
    let j = node.state.join("journal");
    std::fs::create_dir(j.join("dir.commit")).unwrap();
    let outside = node.dir.path().join("outside.commit");
    std::fs::write(&outside, reseal(&head, &spec)).unwrap();
    std::os::unix::fs::symlink(&outside, j.join("link.commit")).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(j.join("fifo.commit"))
            .status()
            .unwrap()
            .success()
    );
    let big = std::fs::File::create(j.join("big.commit")).unwrap();
    big.set_len(1 << 30).unwrap();
    drop(big);
    let mut v3 = head.clone();
    v3["version"] = serde_json::json!(3);
    std::fs::write(j.join("newer.commit"), reseal(&v3, &spec)).unwrap();
    // while running: the regular files that do not verify are reported (changes are
    // refused until the restart quarantines them: 2a), the other entries passed over
    let s = status(&node).await;
    assert_eq!(s.managed_items, 2);
    for name in ["big.commit", "newer.commit"] {
        assert!(
            s.problems.iter().any(|m| m.contains(name)),
            "{name}: {:?}",
            s.problems
        );
    }
    for name in ["dir.commit", "link.commit", "fifo.commit"] {
        assert!(
            !s.problems.iter().any(|m| m.contains(name)),
            "{name}: {:?}",
            s.problems
        );
    }
    node.stop();
    node.start();
    let s = foreign_check(&node).await;
    eprintln!("problems after restart: {:?}", s.problems);
    assert_eq!(std::fs::read(&outside).unwrap(), reseal(&head, &spec));
    ok(&node, SPEC_A, "back").await;
    assert!(!node.path("/etc/bc/b.conf").exists());
}

/// Status and coverage answer in time with b's record (2 files).
async fn foreign_check(node: &Node) -> pb::NodeStatus {
    let s = tokio::time::timeout(Duration::from_secs(20), status(node))
        .await
        .expect("status hung");
    assert_eq!(s.managed_items, 2, "{:?}", s.problems);
    let c = tokio::time::timeout(Duration::from_secs(20), coverage(node, SPEC_B))
        .await
        .expect("coverage hung");
    assert!(c.changes.is_empty(), "{:?}", c.changes);
    s
}

/// 4. SIGKILL right after the commit, after the retire and after the settled phase: the
/// restarted agent's applied record is the killed operation's, and the next operation
/// builds on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_around_the_retire_keeps_the_last_commit() {
    for fp in ["record", "applied", "settled"] {
        let mut node = Node::new("ubuntu-2404-grub");
        node.start();
        ok(&node, SPEC_A, "a").await;
        node.stop();
        node.die_at(fp, SPEC_B).await;
        node.start();
        let s = status(&node).await;
        assert!(s.problems.is_empty(), "{fp}: {:?}", s.problems);
        assert_eq!(s.managed_items, 2, "{fp}");
        assert_eq!(
            managed_files(&node.state),
            vec!["/etc/bc/a.conf", "/etc/bc/b.conf"],
            "{fp}"
        );
        let op = node.settle("crash").await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{fp}: {}", op.message);
        ok(&node, SPEC_A, "back").await;
        assert!(!node.path("/etc/bc/b.conf").exists(), "{fp}");
        // a kill between two operations, with the last commit pending
        let pid = nix::unistd::Pid::from_raw(node.pid().unwrap() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        node.wait_exit(Duration::from_secs(10));
        node.start();
        assert_eq!(status(&node).await.managed_items, 1, "{fp}");
        assert_eq!(managed_files(&node.state), vec!["/etc/bc/a.conf"], "{fp}");
    }
}

/// spec `i`: files f0..=fi (`i + 1` managed items).
fn growing(i: usize) -> String {
    let mut y = String::from("files:\n");
    for k in 0..=i {
        y.push_str(&format!(
            "  - path: /etc/bc/f{k:02}.conf\n    content: \"{k}\\n\"\n"
        ));
    }
    y
}

/// 5. Readers beside back-to-back operations: status and coverage never fail and never
/// show a record older than an operation already reported Succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_never_see_an_older_record() {
    readers(None).await;
}

/// 5b. The same while pruning (history keep = 2) settles the commits beside the readers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_never_see_an_older_record_while_pruning_settles() {
    readers(Some(2)).await;
}

async fn readers(keep: Option<usize>) {
    let mut node = Node::new("ubuntu-2404-grub");
    if let Some(n) = keep {
        std::fs::write(&node.config, format!("[history]\nkeep = {n}\n")).unwrap();
    }
    node.start();
    let node = Arc::new(node);
    const N: usize = 12;
    let done = Arc::new(AtomicUsize::new(0));
    let mut readers = Vec::new();
    for r in 0..4 {
        let (node, done) = (node.clone(), done.clone());
        readers.push(tokio::spawn(async move {
            let mut c = node.client().await;
            let mut looks = 0;
            loop {
                let before = done.load(Ordering::SeqCst);
                if before >= N {
                    return looks;
                }
                let s = c
                    .get_status(pb::GetStatusRequest {})
                    .await
                    .unwrap_or_else(|e| panic!("reader {r}: status: {e:?}"))
                    .into_inner();
                assert!(
                    s.managed_items as usize >= before,
                    "reader {r}: {} managed after {before} operations succeeded",
                    s.managed_items
                );
                if before > 0 {
                    // coverage of the spec already applied: at most additions pending
                    // for the newer ones, never a change to files 0..before
                    let cov = c
                        .get_coverage(pb::GetCoverageRequest {
                            desired: Some(spec(&growing(before - 1))),
                            ..Default::default()
                        })
                        .await
                        .unwrap_or_else(|e| panic!("reader {r}: coverage: {e:?}"))
                        .into_inner();
                    // an operation newer than `before` may have succeeded meanwhile: its
                    // files show as deletions; nothing else may differ
                    for ch in &cov.changes {
                        let k: Option<usize> = ch
                            .id
                            .strip_prefix("files[/etc/bc/f")
                            .and_then(|t| t.strip_suffix(".conf]"))
                            .and_then(|n| n.parse().ok());
                        assert!(
                            k.is_some_and(|k| k >= before)
                                && ch.operation == pb::ChangeOperation::Delete as i32,
                            "reader {r}: spec {} already applied shows {ch:?}",
                            before - 1
                        );
                    }
                }
                looks += 1;
            }
        }));
    }
    for i in 0..N {
        ok(&node, &growing(i), &format!("g{i}")).await;
        done.store(i + 1, Ordering::SeqCst);
    }
    for r in readers {
        assert!(r.await.unwrap() > 0);
    }
    assert_eq!(status(&node).await.managed_items as usize, N);
}

/// 6a. A state directory of the previous release in which applied.json is older than the
/// pending commit (installed by a start after `a`, then `b` committed) and
/// applied-spec.pb is missing: the commit is the applied state, no problem reported;
/// the start installs it (both files), and the next operation builds on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applied_json_older_than_the_pending_commit() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    ok(&node, SPEC_A, "a").await;
    node.stop();
    node.start(); // installs a
    assert!(node.state.join("applied.json").exists());
    ok(&node, SPEC_B, "b").await;
    node.stop();
    std::fs::remove_file(node.state.join("applied-spec.pb")).unwrap();
    let installed: serde_json::Value =
        serde_json::from_slice(&std::fs::read(node.state.join("applied.json")).unwrap()).unwrap();
    assert_eq!(installed["files"].as_object().unwrap().len(), 1);
    assert!(commit_path(&node, "b").exists());
    node.start();
    let s = status(&node).await;
    assert!(s.problems.is_empty(), "{:?}", s.problems);
    assert_eq!(s.managed_items, 2);
    assert!(coverage(&node, SPEC_B).await.changes.is_empty());
    assert!(node.state.join("applied-spec.pb").exists(), "installed");
    assert!(commits(&node.state).is_empty());
    ok(&node, SPEC_A, "back").await;
    assert!(!node.path("/etc/bc/b.conf").exists());
}

/// 6b. Previous release: applied.json + applied-spec.pb of `b` installed and b's commit
/// pending, plus an older commit `a` brought back: b wins, no problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previous_release_files_and_two_commits() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    ok(&node, SPEC_A, "a").await;
    let old = std::fs::read(commit_path(&node, "a")).unwrap();
    ok(&node, SPEC_B, "b").await;
    node.stop();
    let (head, spec) = open_commit(&std::fs::read(commit_path(&node, "b")).unwrap());
    std::fs::write(
        node.state.join("applied.json"),
        serde_json::to_vec_pretty(&head["record"]).unwrap(),
    )
    .unwrap();
    std::fs::write(node.state.join("applied-spec.pb"), sealed(&spec)).unwrap();
    std::fs::write(commit_path(&node, "a"), &old).unwrap();
    node.start();
    let s = status(&node).await;
    assert!(s.problems.is_empty(), "{:?}", s.problems);
    assert_eq!(s.managed_items, 2);
    assert!(coverage(&node, SPEC_B).await.changes.is_empty());
    ok(&node, SPEC_A, "back").await;
    assert!(!node.path("/etc/bc/b.conf").exists());
}

/// 3b. Foreign `*.commit` entries put in `journal/` while the daemon runs (a FIFO, a
/// symlink; a commit of a newer agent is 2a'): the next operations retire the earlier commits
/// and leave these; each succeeds, the agent keeps taking changes, the file the link
/// points to is untouched, and the next start reports and moves aside what was left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_commit_entries_while_running_do_not_stop_changes() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    ok(&node, SPEC_A, "a").await;
    let j = node.state.join("journal");
    let outside = node.dir.path().join("outside.commit");
    std::fs::write(&outside, b"outside").unwrap();
    std::os::unix::fs::symlink(&outside, j.join("link.commit")).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(j.join("fifo.commit"))
            .status()
            .unwrap()
            .success()
    );
    ok(&node, SPEC_B, "b").await;
    let s = status(&node).await;
    assert!(s.problems.is_empty(), "{:?}", s.problems);
    assert_eq!(s.managed_items, 2);
    ok(&node, SPEC_A, "c").await;
    assert!(!node.path("/etc/bc/b.conf").exists());
    assert_eq!(status(&node).await.managed_items, 1);
    assert_eq!(std::fs::read(&outside).unwrap(), b"outside");
    // the retires left them (not files this agent wrote): the start reports each as a
    // journal that does not verify and moves it aside, without following the link
    assert!(j.join("fifo.commit").exists() && j.join("link.commit").exists());
    node.stop();
    node.start();
    let s = status(&node).await;
    for op in ["operation fifo:", "operation link:"] {
        assert!(
            s.problems.iter().any(|m| m.starts_with(op)),
            "{op} {:?}",
            s.problems
        );
    }
    assert_eq!(s.managed_items, 1);
    assert_eq!(std::fs::read(&outside).unwrap(), b"outside");
    ok(&node, SPEC_B, "d").await;
}

/// 3c. A directory named `x.commit` in `journal/` while the daemon runs (the name of a
/// format-1 journal of an operation `x.commit`, or debris) is not a commit: the readers
/// pass it over and a retire leaves it, so changes go on. (Before the fix the retire
/// unlinked it as an earlier commit, got EISDIR, and the agent refused every change until
/// a restart, saying the state directory "can not be written".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_named_commit_does_not_stop_changes() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    ok(&node, SPEC_A, "a").await;
    std::fs::create_dir(node.state.join("journal/dir.commit")).unwrap();
    ok(&node, SPEC_B, "b").await;
    let s = status(&node).await;
    assert!(s.problems.is_empty(), "{:?}", s.problems);
    let op = node
        .client()
        .await
        .apply(pb::ApplyRequest {
            desired: Some(spec(SPEC_A)),
            operation_id: "c".into(),
            ..Default::default()
        })
        .await;
    assert!(op.is_ok(), "c refused: {:?}", op.err());
    let op = node.settle("c").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert!(!node.path("/etc/bc/b.conf").exists());
}

/// 4b. An operation killed mid-write after two commits (a's brought back beside b's by a
/// power cut): the roll-back restores a.conf from the applied spec (b's, the highest
/// commit; a.conf's pre-image is not copied since it holds what the applied spec gave
/// it), and the record stays b's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_takes_its_pre_image_from_the_newest_commit() {
    rollback_over_two_commits(false).await;
}

/// 4c. As 4b, with b's commit damaged after the kill: the roll-back can not take a.conf's
/// pre-image from b's spec, and must not take it from a's older commit (content "A2",
/// which the intent's SHA-256 of the pre-image refuses): a.conf is never "A2", and the
/// damage is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_never_takes_its_pre_image_from_an_older_commit() {
    rollback_over_two_commits(true).await;
}

const SPEC_A2: &str = "files:\n  - path: /etc/bc/a.conf\n    content: \"A2\\n\"\n";

async fn rollback_over_two_commits(damage: bool) {
    const SPEC_C: &str = "files:\n  - path: /etc/bc/a.conf\n    content: \"C\\n\"\n  - path: /etc/bc/b.conf\n    content: \"C\\n\"\n";
    use std::os::unix::process::ExitStatusExt;
    let mut node = Node::new("ubuntu-2404-grub");
    // the 4th write: the first of c (a and b write 3 files in all; asserted below)
    node.failpoints = Some("write:4".into());
    node.start();
    ok(&node, SPEC_A2, "a").await;
    let old = std::fs::read(commit_path(&node, "a")).unwrap();
    ok(&node, SPEC_B, "b").await;
    std::fs::write(commit_path(&node, "a"), &old).unwrap();
    let _ = node
        .client()
        .await
        .apply(pb::ApplyRequest {
            desired: Some(spec(SPEC_C)),
            operation_id: "crash".into(),
            ..Default::default()
        })
        .await;
    let died = node.wait_exit(Duration::from_secs(20));
    assert_eq!(died.and_then(|s| s.signal()), Some(9));
    node.failpoints = None;
    let intent = std::fs::read_to_string(node.state.join("journal/crash.intent")).unwrap();
    assert!(intent.contains("applied-spec"), "{intent}");
    assert!(commit_path(&node, "a").exists() && commit_path(&node, "b").exists());
    if damage {
        flip(&commit_path(&node, "b"));
        node.start();
        let s = status(&node).await;
        assert_ne!(node.read("/etc/bc/a.conf"), "A2\n", "{:?}", s.problems);
        assert!(
            s.problems.iter().any(|m| m.contains("operation b:")),
            "{:?}",
            s.problems
        );
        return;
    }
    node.start();
    let s = status(&node).await;
    assert_eq!(node.read("/etc/bc/a.conf"), "A\n", "{:?}", s.problems);
    assert_eq!(node.read("/etc/bc/b.conf"), "B\n", "{:?}", s.problems);
    assert_eq!(s.managed_items, 2);
    assert!(coverage(&node, SPEC_B).await.changes.is_empty());
    assert!(commits(&node.state).is_empty());
    ok(&node, SPEC_A2, "back").await;
    assert!(!node.path("/etc/bc/b.conf").exists());
    assert_eq!(node.read("/etc/bc/a.conf"), "A2\n");
}

/// 3d. A large file named `x.commit` put in `journal/` while the daemon runs (a 1 GiB
/// sparse file: debris, or a hostile local writer of the state directory): a status must
/// not read it whole into memory (a commit that does not verify is not cached, so every
/// reader would read it again): one over `COMMIT_MAX_BYTES` is damaged unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_commit_is_not_read_whole_by_every_reader() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    ok(&node, SPEC_A, "a").await;
    let big = std::fs::File::create(node.state.join("journal/big.commit")).unwrap();
    big.set_len(1 << 30).unwrap();
    drop(big);
    let t = std::time::Instant::now();
    for _ in 0..3 {
        assert_eq!(status(&node).await.managed_items, 1);
    }
    let took = t.elapsed();
    let rss = peak_rss(node.pid().unwrap());
    assert!(
        rss < 256 << 20,
        "peak RSS {} MiB after 3 status calls ({took:?}) with a 1 GiB big.commit",
        rss >> 20
    );
}
