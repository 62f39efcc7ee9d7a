//! The write-ahead journal, black box: a damaged journal never restores a wrong pre-image
//! and never stops the agent (it is quarantined and reported), a verified rollback names
//! each path it put back and leaves what another writer changed, and a full state
//! directory never turns a committed operation into a failed one nor stops the agent.

mod common;
use common::*;
use inplace_wire::pb;
use inplace_wire::pb::Phase;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The base spec applied first (so that the record, the applied spec and an original
/// exist), then the workload crashed.
const BASE: &str = "files:\n- path: /etc/rel/base.conf\n  content: \"base\\n\"\n- path: /etc/machine-id\n  content: \"0123456789abcdef0123456789abcdef\\n\"\n";

/// A node crashed at a failpoint, kept to be copied for each damage.
struct Crashed {
    _dir: tempfile::TempDir,
    root: PathBuf,
    state: PathBuf,
}

const FAILPOINTS: [&str; 6] = ["stage", "write", "write:3", "sysctl", "act", "record"];

/// Path → (content, mode) of every file and directory under `root`.
type Tree = BTreeMap<PathBuf, (Vec<u8>, u32)>;

/// Two new files, an overwrite of an existing file, a kubelet config field and a sysctl:
/// pre-images of both kinds (absent and present) and the kubelet's config.yaml.
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
sysctls:
  vm.swappiness: \"10\"
";

/// The old tree (base applied), the new tree (workload applied), and a crashed copy per
/// failpoint; built once.
fn fixtures() -> &'static (Tree, Tree, Vec<Crashed>) {
    static F: std::sync::OnceLock<(Tree, Tree, Vec<Crashed>)> = std::sync::OnceLock::new();
    F.get_or_init(|| {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let wl = workload_over_base();
            let mut clean = Node::new("ubuntu-2404-grub");
            clean.start();
            assert_eq!(
                apply(&clean, BASE, "base").await.phase,
                Phase::Succeeded as i32
            );
            let old = tree(&clean.root);
            assert_eq!(
                apply(&clean, &wl, "crash").await.phase,
                Phase::Succeeded as i32
            );
            let new = tree(&clean.root);
            clean.stop();
            let mut crashed = Vec::new();
            for fp in FAILPOINTS {
                let mut node = Node::new("ubuntu-2404-grub");
                node.start();
                assert_eq!(
                    apply(&node, BASE, "base").await.phase,
                    Phase::Succeeded as i32
                );
                node.stop();
                node.die_at(fp, &wl).await;
                let dir = tempfile::tempdir().unwrap();
                copy_tree(&node.root, &dir.path().join("root"));
                copy_tree(&node.state, &dir.path().join("state"));
                crashed.push(Crashed {
                    root: dir.path().join("root"),
                    state: dir.path().join("state"),
                    _dir: dir,
                });
            }
            (old, new, crashed)
        })
    })
}

/// Damage that can not be told from an earlier crash or from history, and need not be
/// reported: the commit marker (empty; deleting it is a crash just before it), a deleted
/// progress marker (a crash just after the intent), an original of an operation that was
/// rolled back (replaced at the next first overwrite), another operation's deleted file
/// (history only), the record and last applied spec a roll-forward replaces with the
/// journal's copies.
///
/// Format 2 adds: a deleted commit (a crash just before it), past the commit a deleted
/// intent, progress marker or pre-image (the journal drops them, without an fsync, once
/// the commit is installed), and a deleted `operations/crash.json` (in Staging until the
/// operation settles, written without an fsync: the intent's copy settles it).
fn harmless(rel: &str, what: &str, rolled_back: bool) -> bool {
    let v2 = rel.starts_with("journal/crash.") && what == "delete";
    (v2 && (rel.ends_with(".commit") || !rolled_back || rel.ends_with(".progress")))
        || rel.ends_with("/committed")
        || (!rolled_back && (rel == "applied-spec.pb" || rel == "applied.json"))
        || (rolled_back && rel.ends_with("/progress") && what == "delete")
        || (rolled_back && rel.starts_with("originals/"))
        || (rel.starts_with("operations/") && what == "delete")
}

fn inode(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().ino()
}

/// The journal's intent, read past its checksum header.
fn intent(node: &Node) -> serde_json::Value {
    let b = std::fs::read(node.state.join("journal/crash.intent")).unwrap();
    let start = b.iter().position(|c| *c == b'{').unwrap();
    serde_json::from_slice(&b[start..]).unwrap()
}

fn one_case(fp: usize, file: usize, kind: u8, at: u16) -> Result<(), String> {
    let (old, new, crashed) = fixtures();
    let c = &crashed[fp % crashed.len()];
    let files = state_files(&c.state);
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::remove_dir_all(&node.root).unwrap();
    copy_tree(&c.root, &node.root);
    copy_tree(&c.state, &node.state);
    let victim = node
        .state
        .join(files[file % files.len()].strip_prefix(&c.state).unwrap());
    let rel = victim
        .strip_prefix(&node.state)
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let mut b = std::fs::read(&victim).unwrap();
    let what = match kind % 3 {
        0 => {
            b.truncate(at as usize % (b.len().max(1)));
            std::fs::write(&victim, &b).unwrap();
            "truncate"
        }
        1 if !b.is_empty() => {
            let i = at as usize % b.len();
            b[i] ^= 0x80;
            std::fs::write(&victim, &b).unwrap();
            "flip"
        }
        1 => "flip (empty file: no byte)",
        _ => {
            std::fs::remove_file(&victim).unwrap();
            "delete"
        }
    };
    let case = format!("{} / {rel} / {what}", FAILPOINTS[fp % FAILPOINTS.len()]);
    eprintln!("damage case: {case}");
    node.start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (s, ops) = rt.block_on(async { (status(&node).await, node.operations().await) });
    let after = tree(&node.root);
    for (p, content) in &after {
        if old.get(p) != Some(content) && new.get(p) != Some(content) {
            return Err(format!("{case}: {} is neither old nor new", p.display()));
        }
    }
    let msg = ops
        .iter()
        .find(|o| o.id == "crash")
        .map(|o| o.message.clone())
        .unwrap_or_default();
    let reported =
        !s.problems.is_empty() || msg.contains("does not verify") || msg.contains("problems:");
    let rolled_back = &after == old;
    if !reported && !harmless(&rel, what, rolled_back) && what != "flip (empty file: no byte)" {
        return Err(format!(
            "{case}: damage not reported; problems {:?}, message {msg:?}",
            s.problems
        ));
    }
    if !reported && !rolled_back && &after != new {
        return Err(format!(
            "{case}: unreported and the node is neither old nor new"
        ));
    }
    Ok(())
}

/// The pre-image file of `path` in the journal.
fn pre_of(node: &Node, path: &str) -> PathBuf {
    let i = intent(node);
    let e = i["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["path"] == path)
        .unwrap_or_else(|| panic!("{path} not in the intent {i:#}"));
    let file = e["pre"]["file"].as_str().expect("a pre-image");
    node.state.join("journal").join(file)
}

/// The journal files of operation `op` (format 2: `journal/<op>.*`; format 1: its
/// directory).
fn journal_of(node: &Node, op: &str) -> Vec<String> {
    std::fs::read_dir(node.state.join("journal"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n == op || n.starts_with(&format!("{op}.")))
                .collect()
        })
        .unwrap_or_default()
}

fn quarantined(node: &Node) -> Vec<PathBuf> {
    std::fs::read_dir(node.state.join("quarantine"))
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default()
}

/// The state files damage is tried on: the journal, the operations, the record, the
/// last applied spec, the saved originals.
fn state_files(state: &Path) -> Vec<PathBuf> {
    snapshot(state)
        .into_iter()
        .map(|(p, _, _)| p)
        .filter(|p| p.is_file())
        .filter(|p| {
            let r = p
                .strip_prefix(state)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            r.starts_with("journal/")
                || r.starts_with("operations/")
                || r.starts_with("originals/")
                || r == "applied.json"
                || r == "applied-spec.pb"
        })
        .collect()
}

fn tree(root: &Path) -> Tree {
    snapshot(root)
        .into_iter()
        .map(|(p, c, m)| (p.strip_prefix(root).unwrap().to_path_buf(), (c, m)))
        .collect()
}

fn workload_over_base() -> String {
    WORKLOAD.replacen(
        "files:\n",
        "files:\n- path: /etc/rel/base.conf\n  content: \"base\\n\"\n- path: /etc/machine-id\n  content: \"0123456789abcdef0123456789abcdef\\n\"\n",
        1,
    )
}

/// The example: killed after the second write, the pre-image of the untouched
/// kubelet config.yaml truncated. Nothing is restored from the journal (it does not
/// verify), config.yaml keeps its bytes and its inode, the journal is quarantined whole,
/// and status names every file with its hashes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_pre_image_quarantines_the_journal_and_restores_nothing() {
    let mut node = Node::new("ubuntu-2404-grub");
    let config = "/var/lib/kubelet/config.yaml";
    let before = node.read(config);
    let ino = inode(&node.path(config));
    node.die_at("write:2", WORKLOAD).await;
    let crashed = tree(&node.root);
    std::fs::write(pre_of(&node, config), b"").unwrap();
    node.start();
    let op = node.settle("crash").await;
    assert_eq!(op.phase, Phase::Failed as i32);
    assert!(
        op.message.contains("does not verify") && op.message.contains("nothing was restored"),
        "{}",
        op.message
    );
    assert!(
        !op.message
            .contains("restored from the journal's pre-images")
    );
    // nothing was written: every file is as the crash left it, config.yaml untouched
    assert_eq!(tree(&node.root), crashed);
    assert_eq!(node.read(config), before);
    assert_eq!(inode(&node.path(config)), ino, "config.yaml was rewritten");
    assert!(journal_of(&node, "crash").is_empty());
    let q = quarantined(&node);
    assert_eq!(q.len(), 1, "{q:?}");
    assert!(q[0].join("crash.intent").exists() && q[0].join("REPORT").exists());
    let s = status(&node).await;
    let all = s.problems.join("\n");
    assert!(all.contains("pre-image has 0 bytes"), "{all}");
    for p in [
        "/etc/rel/a.conf",
        "/etc/rel/b.conf",
        "/etc/hostname",
        config,
    ] {
        assert!(
            s.problems
                .iter()
                .any(|l| l.contains(&format!("{p}: not restored")) && l.contains("on disk now")),
            "{p} not listed: {all}"
        );
    }
    // the two files written before the kill are listed as holding the new content
    assert!(
        s.problems.iter().any(
            |l| l.contains("/etc/rel/a.conf: not restored") && l.ends_with("(the new content)")
        ),
        "{all}"
    );
    assert!(
        s.problems
            .iter()
            .any(|l| l.contains(&format!("{config}: not restored"))
                && l.ends_with("(the pre-image)")),
        "{all}"
    );
    // a restart still reports the quarantined journal until it is removed
    node.stop();
    node.start();
    let s = status(&node).await;
    assert!(
        s.problems.iter().any(|l| l.contains("quarantined journal")),
        "{:?}",
        s.problems
    );
    // the agent serves, but does not take the files the crash created as the node's own
    // (tests/quarantine_claims.rs): a.conf and b.conf are named, nothing is written
    let again = apply(&node, WORKLOAD, "again").await;
    assert_eq!(again.phase, Phase::Failed as i32, "{}", again.message);
    for p in ["/etc/rel/a.conf", "/etc/rel/b.conf"] {
        assert!(
            again.message.contains(&format!(
                "{p}: the interrupted operation's journal, quarantined in {}",
                q[0].display()
            )),
            "{}",
            again.message
        );
    }
    assert_eq!(tree(&node.root), crashed);
    // once the administrator removed the quarantined journal, a re-apply converges
    std::fs::remove_dir_all(&q[0]).unwrap();
    assert_eq!(
        apply(&node, WORKLOAD, "again2").await.phase,
        Phase::Succeeded as i32
    );
}

/// Garbage in a pre-image (same length, other bytes) and a deleted pre-image: the same
/// class, the same answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_or_missing_pre_image_is_never_restored() {
    for damage in ["garbage", "delete", "extend"] {
        let mut node = Node::new("ubuntu-2404-grub");
        node.die_at("write:4", WORKLOAD).await;
        let crashed = tree(&node.root);
        let pre = pre_of(&node, "/etc/hostname");
        let len = std::fs::metadata(&pre).unwrap().len() as usize;
        match damage {
            "garbage" => std::fs::write(&pre, vec![b'x'; len]).unwrap(),
            "delete" => std::fs::remove_file(&pre).unwrap(),
            _ => {
                let mut b = std::fs::read(&pre).unwrap();
                b.extend_from_slice(b"tail\n");
                std::fs::write(&pre, b).unwrap();
            }
        }
        node.start();
        let op = node.settle("crash").await;
        assert_eq!(op.phase, Phase::Failed as i32, "{damage}");
        assert!(
            op.message.contains("nothing was restored"),
            "{damage}: {}",
            op.message
        );
        assert_eq!(tree(&node.root), crashed, "{damage}: something was written");
        let why = match damage {
            "garbage" => "was journaled",
            "delete" => "pre-image missing",
            _ => "bytes, ",
        };
        assert!(
            status(&node).await.problems.iter().any(|l| l.contains(why)),
            "{damage}: {:?}",
            status(&node).await.problems
        );
    }
}

/// A damaged intent: quarantined, nothing restored, no "0 file(s) restored", the files
/// it names (read without trusting it) listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_intent_is_quarantined_and_reported() {
    for damage in ["flip", "truncate", "delete"] {
        let mut node = Node::new("ubuntu-2404-grub");
        node.die_at("write:3", WORKLOAD).await;
        let crashed = tree(&node.root);
        let p = node.state.join("journal/crash.intent");
        let mut b = std::fs::read(&p).unwrap();
        match damage {
            "flip" => {
                // a byte inside a path: the JSON still parses, the checksum does not
                let at = b.windows(8).position(|w| w == b"rel/a.co").unwrap();
                b[at] = b'R';
                std::fs::write(&p, b).unwrap();
            }
            "truncate" => std::fs::write(&p, &b[..b.len() / 2]).unwrap(),
            _ => std::fs::remove_file(&p).unwrap(),
        }
        node.start();
        let op = node.settle("crash").await;
        assert_eq!(op.phase, Phase::Failed as i32, "{damage}");
        assert!(
            op.message.contains("does not verify") && !op.message.contains("0 file(s) restored"),
            "{damage}: {}",
            op.message
        );
        // the new files stay (they are listed), nothing is deleted or restored
        assert_eq!(tree(&node.root), crashed, "{damage}");
        let s = status(&node).await;
        let all = s.problems.join("\n");
        let named = if damage == "flip" {
            all.contains("/etc/Rel/a.conf: not restored")
                && all.contains("/etc/hostname: not restored")
        } else {
            all.contains("the files it names are not known")
        };
        assert!(named, "{damage}: {all}");
        assert!(all.contains("journal/crash.intent"), "{damage}: {all}");
    }
}

/// Garbage in `operations/<id>.json` (and in another operation's file) while a journal
/// is pending: the daemon starts, rolls the journal back, moves the file aside and says
/// so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_garbage_operation_file_does_not_stop_the_agent() {
    let mut node = Node::new("ubuntu-2404-grub");
    let old = tree(&node.root);
    node.die_at("write:2", WORKLOAD).await;
    std::fs::write(
        node.state.join("operations/crash.json"),
        b"{\"id\": garbage",
    )
    .unwrap();
    node.start();
    let s = status(&node).await;
    let all = s.problems.join("\n");
    assert!(
        all.contains("operations/crash.json") && all.contains("moved to"),
        "{all}"
    );
    assert!(
        all.contains("restored from the journal's pre-images"),
        "{all}"
    );
    assert_eq!(tree(&node.root), old, "rolled back");
    assert!(journal_of(&node, "crash").is_empty());
    // the id is free again: a re-apply runs
    assert_eq!(
        apply(&node, WORKLOAD, "crash").await.phase,
        Phase::Succeeded as i32
    );
}

/// A journal that verifies: every changed path restored and named, an untouched one
/// (the kubelet's config.yaml, not written yet) left with its inode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_rollback_names_each_path_and_skips_untouched_ones() {
    let mut node = Node::new("ubuntu-2404-grub");
    let config = "/var/lib/kubelet/config.yaml";
    let old = tree(&node.root);
    let ino = inode(&node.path(config));
    node.die_at("write:3", WORKLOAD).await;
    node.start();
    let op = node.settle("crash").await;
    assert_eq!(tree(&node.root), old);
    assert_eq!(
        inode(&node.path(config)),
        ino,
        "an untouched file was rewritten"
    );
    assert!(
        op.message
            .contains("restored from the journal's pre-images: /etc/hostname;")
            && op
                .message
                .contains("removed (created by the operation): /etc/rel/b.conf, /etc/rel/a.conf;"),
        "{}",
        op.message
    );
    assert!(
        op.message.contains("were still as before"),
        "{}",
        op.message
    );
}

/// A file another writer changed after the crash is neither restored nor removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_changed_by_another_writer_is_left_and_named() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.die_at("write:2", WORKLOAD).await;
    std::fs::write(node.path("/etc/rel/a.conf"), "someone else\n").unwrap();
    node.start();
    let op = node.settle("crash").await;
    assert_eq!(node.read("/etc/rel/a.conf"), "someone else\n");
    assert!(
        op.message.contains("/etc/rel/a.conf: left as it is"),
        "{}",
        op.message
    );
    assert!(!node.path("/etc/rel/b.conf").exists());
}

/// Cases the property test found, kept as plain tests: a truncation of the last applied
/// spec to nothing or into its checksum header at a failpoint before the commit (it was
/// read as an empty NodeSpec of the older, unsealed format, and not reported).
#[test]
fn applied_spec_cut_into_its_header_is_reported() {
    for (fp, file, kind, at) in [(0, 10, 0, 61241), (0, 10, 0, 0), (0, 10, 0, 5)] {
        one_case(fp, file, kind, at).unwrap();
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: std::env::var("RELIABILITY_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(40),
        max_shrink_iters: 16,
        ..Default::default()
    })]
    /// For random damage (truncate, flip a byte, delete) of any single state or journal
    /// file at any failpoint: the daemon starts and serves, every node file is the old or
    /// the new content, and the damage is reported.
    #[test]
    fn random_damage_of_one_state_file_at_any_failpoint(
        fp in 0usize..FAILPOINTS.len(),
        file in 0usize..64,
        kind in 0u8..3,
        at in proptest::prelude::any::<u16>(),
    ) {
        if let Err(e) = one_case(fp, file, kind, at) {
            return Err(proptest::test_runner::TestCaseError::fail(e));
        }
    }
}

/// The state directory fills up just after the commit point: the operation is what it
/// is (Succeeded: its changes are on the node; the commit is the applied state, nothing
/// is installed) with the failing bookkeeping (the settled operation's file) named by
/// its full path in status; mutations are refused with UNAVAILABLE naming the state
/// directory, read-only calls served; the next start installs the journal's record.
///
/// A fault found on the way: the settled operation's file not written was a log line
/// only (no problem, changes not refused); it went unseen while installing the record,
/// the write before it, failed first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_after_the_commit_point_is_committed_not_failed() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.failpoints = Some("full-after-commit".into());
    node.start();
    let op = apply(&node, WORKLOAD, "full").await;
    let state = node.state.display().to_string();
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert!(node.state.join("journal/full.commit").exists());
    assert_eq!(node.read("/etc/rel/a.conf"), "a\n");
    let s = status(&node).await;
    assert!(
        s.problems.iter().any(|p| p.contains(&format!(
            "operation full ended Succeeded but could not be recorded ({state}/operations/full.json: write: No space left on device"
        ))),
        "{:?}",
        s.problems
    );
    let e = apply_refused(&node, "{}\n", "next").await;
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(
        e.message()
            .contains(&format!("the state directory {state} can not be written")),
        "{}",
        e.message()
    );
    // read-only calls are served
    assert!(common::coverage(&node, WORKLOAD).await.changes.is_empty());
    assert_eq!(node.operations().await[0].id, "full");
    node.stop();
    node.failpoints = None;
    node.start();
    let s = status(&node).await;
    assert!(s.problems.is_empty(), "{:?}", s.problems);
    assert_eq!(s.managed_items, 5, "the journal's record was installed");
    assert!(common::coverage(&node, WORKLOAD).await.changes.is_empty());
    assert_eq!(
        apply(&node, "{}\n", "drop").await.phase,
        Phase::Succeeded as i32
    );
}

/// A state directory that is full from the start: the daemon starts and serves
/// read-only calls with a problem line, and refuses mutations (apply and reboot) with
/// UNAVAILABLE naming the state directory. A committed journal pending at that start is
/// kept and installed once there is space.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_state_directory_at_start_serves_and_refuses_changes() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.die_at("record", WORKLOAD).await;
    node.failpoints = Some("state-full:1".into());
    node.start();
    let state = node.state.display().to_string();
    let s = status(&node).await;
    let all = s.problems.join("\n");
    assert!(
        all.contains(&format!(
            "{state}/applied.json: write: No space left on device"
        )) && all.contains("the journal is kept"),
        "{all}"
    );
    assert!(
        all.contains("the state directory can not be written"),
        "{all}"
    );
    let e = apply_refused(&node, WORKLOAD, "x").await;
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().contains(&state), "{}", e.message());
    let e = node
        .client()
        .await
        .reboot(pb::RebootRequest {
            operation_id: "crash".into(),
        })
        .await
        .expect_err("reboot refused");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(
        node.state.join("journal/crash.commit").exists(),
        "journal kept"
    );
    node.stop();
    node.failpoints = None;
    node.start();
    let op = node.settle("crash").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(status(&node).await.managed_items, 5);
    assert!(journal_of(&node, "crash").is_empty());
}

/// The state directory on a real 2 MiB tmpfs (when this test may mount one): a spec
/// whose journal and records do not fit is refused before the first node write, saying
/// how much is needed and where; a read-only remount still lets the daemon start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_tmpfs_state_directory() {
    struct Mount(PathBuf);
    impl Drop for Mount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::create_dir_all(&node.state).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs"])
        .arg(&node.state)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "a_small_tmpfs_state_directory: can not mount a tmpfs here; covered by the failpoint tests"
        );
        return;
    }
    let _m = Mount(node.state.clone());
    let before = tree(&node.root);
    node.start();
    let big = "x".repeat(1_200_000);
    let yaml = format!("files:\n- path: /etc/rel/big.bin\n  content: \"{big}\"\n");
    let op = apply(&node, &yaml, "big").await;
    let state = node.state.display().to_string();
    assert_eq!(op.phase, Phase::Failed as i32, "{}", op.message);
    assert!(
        op.message
            .contains(&format!("the state directory {state} needs "))
            && op.message.contains("nothing was changed"),
        "{}",
        op.message
    );
    assert_eq!(tree(&node.root), before);
    assert!(journal_of(&node, "big").is_empty());
    // a small spec still fits
    assert_eq!(
        apply(&node, WORKLOAD, "small").await.phase,
        Phase::Succeeded as i32
    );
    node.stop();
    let ro = std::process::Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(&node.state)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ro);
    node.start();
    let s = status(&node).await;
    assert_eq!(s.managed_items, 5);
    assert!(
        s.problems
            .iter()
            .any(|p| p.contains("can not be written") && p.contains(&state)),
        "{:?}",
        s.problems
    );
    let e = apply_refused(&node, "{}\n", "ro").await;
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    node.stop();
}

/// A 255-byte file name killed between its temporary file and the rename: the
/// temporary file (whose name had to be shortened) is found and removed at the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_longest_name_crash_leaves_no_temporary_file() {
    let mut node = Node::new("ubuntu-2404-grub");
    let yaml = format!(
        "files:\n- path: /etc/{}\n  content: \"x\\n\"\n",
        "n".repeat(255)
    );
    node.die_at("write-temp", &yaml).await;
    let temps = |root: &Path| {
        std::fs::read_dir(root.join("etc"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".tmp")
            })
            .count()
    };
    assert_eq!(temps(&node.root), 1, "the crash left its temporary file");
    node.start();
    // the journal's intent was complete: the start rolls it back and says so
    assert_eq!(node.settle("crash").await.phase, Phase::RolledBack as i32);
    assert_eq!(temps(&node.root), 0);
}

/// A rollback from the journal restarts the units the operation touched and checks each
/// one: a unit that does not restart is named (operation message and status) and the
/// operation ends Failed, not RolledBack, although every path went back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_that_does_not_come_back_after_a_rollback_is_named() {
    let mut node = Node::new("ubuntu-2404-grub");
    let old = tree(&node.root);
    node.die_at("act", WORKLOAD).await;
    node.fail = Some("restart kubelet".into());
    node.start();
    let op = node.settle("crash").await;
    assert_eq!(tree(&node.root), old, "every path went back");
    assert_eq!(op.phase, Phase::Failed as i32, "{}", op.message);
    assert!(
        op.message
            .contains("rolled back from the write-ahead journal")
            && op
                .message
                .contains("kubelet.service did not restart: restart kubelet.service"),
        "{}",
        op.message
    );
    let s = status(&node).await;
    assert!(
        s.problems
            .iter()
            .any(|p| p
                .contains("after rolling back from the journal, kubelet.service did not restart")),
        "{:?}",
        s.problems
    );
    assert!(
        node.actions()
            .iter()
            .any(|a| a == "restart kubelet.service")
    );
}

/// The Staging operation is written without an fsync: a power cut can lose it and leave
/// the file of an earlier run of the same id. The journal's copy (the commit's) is told
/// from that file by its creation time, and the operation is settled from it: rolled
/// forward, not left as the earlier run's RolledBack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_runs_operation_file_is_not_taken_for_this_run() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.die_at("write:2", WORKLOAD).await;
    node.start();
    assert_eq!(node.settle("crash").await.phase, Phase::RolledBack as i32);
    node.stop();
    let earlier = std::fs::read(node.state.join("operations/crash.json")).unwrap();
    node.die_at("record", WORKLOAD).await;
    std::fs::write(node.state.join("operations/crash.json"), &earlier).unwrap();
    node.start();
    let op = node.settle("crash").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(
        op.message,
        "changes committed; completed after an agent restart"
    );
    assert_eq!(node.read("/etc/rel/a.conf"), "a\n");
    assert!(journal_of(&node, "crash").is_empty());
}

/// A state directory as the previous release (up to c649bfd) left it: besides the
/// pending commit, every operation installed `applied.json` (the record, pretty JSON)
/// and `applied-spec.pb` (the sealed spec) from it. Such a directory starts as before:
/// no problem, the same record (status, coverage of both specs), the start installs the
/// same bytes and drops the commit, and the next operation goes back to the base spec
/// (the hostname's original restored from `originals/`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_directory_of_the_previous_release_starts_as_before() {
    let mut node = Node::new("ubuntu-2404-grub");
    let hostname = node.read("/etc/hostname");
    node.start();
    let wl = workload_over_base();
    assert_eq!(
        apply(&node, BASE, "base").await.phase,
        Phase::Succeeded as i32
    );
    assert_eq!(
        apply(&node, &wl, "prev").await.phase,
        Phase::Succeeded as i32
    );
    let back = coverage(&node, BASE).await;
    assert!(!back.changes.is_empty());
    let managed = status(&node).await.managed_items;
    node.stop();
    // this agent installed nothing; the previous release's install, from the commit
    let commit = std::fs::read(node.state.join("journal/prev.commit")).unwrap();
    let body = &commit[commit.iter().position(|c| *c == b'\n').unwrap() + 1..];
    let nl = body.iter().position(|c| *c == b'\n').unwrap();
    let head: serde_json::Value = serde_json::from_slice(&body[..nl]).unwrap();
    let record = serde_json::to_vec_pretty(&head["record"]).unwrap();
    let spec = sealed(&body[nl + 1..]);
    std::fs::write(node.state.join("applied.json"), &record).unwrap();
    std::fs::write(node.state.join("applied-spec.pb"), &spec).unwrap();
    node.start();
    let s = status(&node).await;
    assert!(s.problems.is_empty(), "{:?}", s.problems);
    assert_eq!(s.managed_items, managed);
    assert!(coverage(&node, &wl).await.changes.is_empty());
    assert_eq!(coverage(&node, BASE).await.changes, back.changes);
    assert!(
        journal_of(&node, "prev").is_empty(),
        "installed and dropped"
    );
    assert_eq!(
        std::fs::read(node.state.join("applied.json")).unwrap(),
        record
    );
    assert_eq!(
        std::fs::read(node.state.join("applied-spec.pb")).unwrap(),
        spec
    );
    let op = apply(&node, BASE, "back").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert!(!node.path("/etc/rel/a.conf").exists());
    assert_eq!(
        node.read("/etc/hostname"),
        hostname,
        "its original put back"
    );
}
