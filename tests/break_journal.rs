//! Hostile checks of three CPU cuts (branch wt/applycpu), black box: the cache of parsed
//! operation heads (re-parsed only when a file's stamp changed), progress markers written
//! over the old one in place, and the commit's header serialised straight from the
//! record and the operation.

mod common;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use common::*;
use inplace_wire::pb::Phase;
use sha2::Digest;

const SPEC: &str = "files:\n  - path: /etc/break-journal.conf\n    content: \"new\\n\"\n";

fn keep(node: &Node, n: usize) {
    std::fs::write(&node.config, format!("[history]\nkeep = {n}\n")).unwrap();
}

/// The journal directory as the agent makes it (created here when no operation made it
/// yet).
fn journal_dir(node: &Node) -> std::path::PathBuf {
    let j = node.state.join("journal");
    std::fs::create_dir_all(&j).unwrap();
    std::fs::set_permissions(&j, std::fs::Permissions::from_mode(0o700)).unwrap();
    j
}

/// Applies SPEC as `id`, failing the test (instead of hanging it) after 30 s.
async fn apply_within(node: &Node, id: &str) -> inplace_wire::pb::Operation {
    tokio::time::timeout(Duration::from_secs(30), apply(node, SPEC, id))
        .await
        .unwrap_or_else(|_| panic!("operation {id} did not settle within 30 s (hung)"))
}

/// A FIFO where an operation's progress marker goes (damage in the state directory) must
/// not hang the agent: the atomic write refuses it (the operation fails, nothing
/// changed); the in-place write opened the name for writing, which blocks on a FIFO
/// until a reader comes, with the apply in progress: the operation never settled.
#[tokio::test]
async fn a_fifo_in_place_of_a_progress_marker_does_not_hang_the_apply() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let fifo = journal_dir(&node).join("fifo1.progress");
    let ok = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(ok.success());
    // refused as the atomic write refuses any special file (as before the in-place
    // write), nothing changed; and the agent goes on
    let op = apply_within(&node, "fifo1").await;
    assert_ne!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert!(
        op.message.contains("fifo1.progress") && op.message.contains("nothing was changed"),
        "{}",
        op.message
    );
    assert!(!node.path("/etc/break-journal.conf").exists());
    let op = apply_within(&node, "after").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(node.read("/etc/break-journal.conf"), "new\n");
}

/// A progress marker's name that is a hard link to another file must not be written
/// through: a marker is the journal's own file (0600, one link), as it was when each
/// marker was a new file renamed over the last.
#[tokio::test]
async fn a_progress_marker_is_never_written_through_a_hard_link() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let outside = node.dir.path().join("outside.txt");
    std::fs::write(&outside, b"x").unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
    let marker = journal_dir(&node).join("hl.progress");
    std::fs::hard_link(&outside, &marker).unwrap();
    let op = apply_within(&node, "hl").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(std::fs::read(&outside).unwrap(), b"x");
    assert_eq!(std::fs::metadata(&outside).unwrap().mode() & 0o7777, 0o644);
}

/// A stale marker left under the operation's name, world-readable and empty, is not
/// kept as it is: the marker written is the journal's own (0600, one link), as a new
/// file renamed over it was.
#[tokio::test]
async fn a_progress_marker_written_over_a_stale_one_has_the_journals_mode() {
    use std::os::unix::process::ExitStatusExt;
    let mut node = Node::new("ubuntu-2404-grub");
    // dies after the files, before 'written': the marker is 'staged'
    node.failpoints = Some("sysctl".into());
    node.start();
    // after the start (which quarantines a marker without an intent)
    let marker = journal_dir(&node).join("m.progress");
    std::fs::write(&marker, b"").unwrap();
    std::fs::set_permissions(&marker, std::fs::Permissions::from_mode(0o644)).unwrap();
    let _ = node
        .client()
        .await
        .apply(inplace_wire::pb::ApplyRequest {
            desired: Some(spec(SPEC)),
            operation_id: "m".into(),
            ..Default::default()
        })
        .await;
    let status = node.wait_exit(Duration::from_secs(20));
    assert_eq!(status.and_then(|s| s.signal()), Some(9));
    let meta = std::fs::symlink_metadata(&marker).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o600);
    assert_eq!(meta.nlink(), 1);
    assert!(
        std::fs::read(&marker).unwrap().ends_with(b"\nstaged"),
        "{:?}",
        String::from_utf8_lossy(&std::fs::read(&marker).unwrap())
    );
}

/// `bytes` written to `p` with the state directory's mode (0600).
fn write_0600(p: &Path, bytes: &[u8]) {
    std::fs::write(p, bytes).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `bytes` written over the start of the existing file `p` (same inode).
fn overwrite_in_place(p: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::File::options().write(true).open(p).unwrap();
    f.write_all(bytes).unwrap();
}

/// Applies a one-file spec whose content is `tag` as operation `tag` (which prunes the
/// history after it) and asserts that it succeeded.
async fn prune_by_applying(node: &Node, tag: &str) {
    let spec = format!("files:\n  - path: /etc/break-journal.conf\n    content: \"{tag}\\n\"\n");
    let op = apply(node, &spec, tag).await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
}

/// An operation file's head cached as ended (Succeeded), then rewritten in place as
/// waiting for a reboot with the same length, inode and modification time: pruning must
/// keep it (an operation waiting for a reboot is kept whatever its age), and the history
/// must show its true phase. Then the same with the file removed and a new one made in
/// its place (an inode the file system may recycle), again with the old mtime.
#[tokio::test]
async fn pruning_acts_on_an_operation_files_true_phase_not_a_cached_one() {
    let mut node = Node::new("ubuntu-2404-grub");
    keep(&node, 1);
    node.start();
    let b = apply(&node, SPEC, "b").await;
    assert_eq!(b.phase, Phase::Succeeded as i32, "{}", b.message);
    let ops = node.state.join("operations");
    let template: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ops.join("b.json")).unwrap()).unwrap();
    // an older operation's file in phase `phase`, padded to `len` bytes
    let file = |id: &str, phase: Phase, len: usize| {
        let mut v = template.clone();
        v["id"] = id.into();
        v["phase"] = phase.as_str_name().into();
        v["created"] = "2020-01-01T00:00:00Z".into();
        let mut bytes = serde_json::to_vec_pretty(&v).unwrap();
        assert!(bytes.len() <= len, "{} > {len}", bytes.len());
        bytes.resize(len, b' ');
        bytes
    };
    let len = serde_json::to_vec_pretty(&template).unwrap().len() + 64;
    let settle_and_cache = |p: &Path| {
        let mtime = std::fs::metadata(p).unwrap().modified().unwrap();
        // past the racy window, so a head read now is kept
        std::thread::sleep(Duration::from_millis(300));
        mtime
    };
    let restore_mtime = |p: &Path, t: std::time::SystemTime| {
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(t)
            .unwrap();
    };
    let ended = |id: &str| file(id, Phase::Succeeded, len);
    let waiting = |id: &str| file(id, Phase::RebootRequired, len);

    // 1. rewritten in place: same inode, same size, mtime put back
    let p1 = ops.join("old1.json");
    write_0600(&p1, &ended("old1"));
    let t1 = settle_and_cache(&p1);
    status(&node).await; // reads every head: old1's is kept as Succeeded
    let ino = std::fs::metadata(&p1).unwrap().ino();
    overwrite_in_place(&p1, &waiting("old1"));
    restore_mtime(&p1, t1);
    assert_eq!(std::fs::metadata(&p1).unwrap().ino(), ino);
    assert_eq!(std::fs::metadata(&p1).unwrap().len(), len as u64);
    prune_by_applying(&node, "c").await;
    assert!(
        p1.exists(),
        "pruning deleted an operation waiting for a reboot"
    );
    let listed = node.operations().await;
    let old1 = listed.iter().find(|o| o.id == "old1").expect("old1 listed");
    assert_eq!(old1.phase, Phase::RebootRequired as i32);

    // 2. removed and made again (same size, the old mtime): maybe the same inode
    let p2 = ops.join("old2.json");
    write_0600(&p2, &ended("old2"));
    let t2 = settle_and_cache(&p2);
    status(&node).await;
    std::fs::remove_file(&p2).unwrap();
    write_0600(&p2, &waiting("old2"));
    restore_mtime(&p2, t2);
    prune_by_applying(&node, "d").await;
    assert!(
        p2.exists(),
        "pruning deleted an operation waiting for a reboot"
    );

    // 3. replaced by rename (a new inode), the old mtime
    let p3 = ops.join("old3.json");
    write_0600(&p3, &ended("old3"));
    let t3 = settle_and_cache(&p3);
    status(&node).await;
    let tmp = ops.join(".old3.tmp");
    write_0600(&tmp, &waiting("old3"));
    restore_mtime(&tmp, t3);
    std::fs::rename(&tmp, &p3).unwrap();
    prune_by_applying(&node, "e").await;
    assert!(
        p3.exists(),
        "pruning deleted an operation waiting for a reboot"
    );

    // 4. rewritten within the same moment as it was written and read (no time to tell
    //    them apart by their stamps): what was read then is not kept
    let p4 = ops.join("old4.json");
    write_0600(&p4, &ended("old4"));
    let t4 = std::fs::metadata(&p4).unwrap().modified().unwrap();
    status(&node).await;
    overwrite_in_place(&p4, &waiting("old4"));
    restore_mtime(&p4, t4);
    std::thread::sleep(Duration::from_millis(300));
    prune_by_applying(&node, "g").await;
    assert!(
        p4.exists(),
        "pruning deleted an operation waiting for a reboot"
    );

    // and the reverse: cached as waiting, then ended in place: pruned by the next one
    let t1 = settle_and_cache(&p1);
    status(&node).await;
    overwrite_in_place(&p1, &ended("old1"));
    restore_mtime(&p1, t1);
    prune_by_applying(&node, "f").await;
    assert!(
        !p1.exists(),
        "an ended operation past `keep` was not pruned"
    );
    let ids: Vec<String> = node.operations().await.into_iter().map(|o| o.id).collect();
    assert!(!ids.contains(&"old1".to_string()), "{ids:?}");
}

/// `journal/<op>.commit` as sealed by the agent: its header line and spec.
fn read_commit(p: &Path) -> (serde_json::Value, Vec<u8>) {
    let b = std::fs::read(p).unwrap();
    let nl = b.iter().position(|c| *c == b'\n').unwrap();
    let body = &b[nl + 1..];
    let nl = body.iter().position(|c| *c == b'\n').unwrap();
    (
        serde_json::from_slice(&body[..nl]).unwrap(),
        body[nl + 1..].to_vec(),
    )
}

/// Seals `header` + newline + `spec` as the agent does (`inplaced-sealed sha256:<hex>
/// len=<n>`).
fn write_commit(p: &Path, header: &[u8], spec: &[u8]) {
    let mut body = header.to_vec();
    body.push(b'\n');
    body.extend_from_slice(spec);
    let mut out = format!(
        "inplaced-sealed sha256:{} len={}\n",
        hex::encode(sha2::Sha256::digest(&body)),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    std::fs::write(p, out).unwrap();
}

/// Every key of `v`, at every depth, in reverse order.
fn reversed(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => serde_json::Value::Object(
            m.iter()
                .rev()
                .map(|(k, v)| (k.clone(), reversed(v)))
                .collect(),
        ),
        serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(reversed).collect()),
        v => v.clone(),
    }
}

/// A commit whose header has its keys in another order (the previous release built it as
/// a `serde_json::Value`; the reader takes keys by name) rolls forward at start as the
/// agent's own.
#[tokio::test]
async fn a_commit_with_its_header_keys_in_another_order_rolls_forward() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.die_at("record", SPEC).await;
    let p = node.state.join("journal/crash.commit");
    let (header, spec) = read_commit(&p);
    for k in ["version", "generation", "phase", "record", "operation"] {
        assert!(header.get(k).is_some(), "no {k} in {header}");
    }
    write_commit(&p, &serde_json::to_vec(&reversed(&header)).unwrap(), &spec);
    node.start();
    let op = node.settle("crash").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(node.read("/etc/break-journal.conf"), "new\n");
    assert!(!p.exists());
}

/// A commit that is sealed but whose header is not a commit's (a `generation` that is no
/// number, or no JSON at all) does not verify: the agent starts, and the operation is
/// rolled back from its intent, saying so.
#[tokio::test]
async fn a_sealed_commit_with_a_damaged_header_rolls_back() {
    for bad in [
        br#"{"version":2,"generation":"x","phase":3,"record":{},"operation":{}}"#.as_slice(),
        b"{not json".as_slice(),
    ] {
        let mut node = Node::new("ubuntu-2404-grub");
        let before = std::fs::read(node.path("/etc/break-journal.conf")).ok();
        node.die_at("record", SPEC).await;
        let p = node.state.join("journal/crash.commit");
        let (_, spec) = read_commit(&p);
        write_commit(&p, bad, &spec);
        node.start();
        let op = node.settle("crash").await;
        assert_eq!(op.phase, Phase::RolledBack as i32, "{}", op.message);
        assert!(
            op.message.contains("its committed record does not verify"),
            "{}",
            op.message
        );
        assert_eq!(
            std::fs::read(node.path("/etc/break-journal.conf")).ok(),
            before
        );
    }
}

/// A marker torn between `staged` and `written` (what a power cut during the in-place
/// write may leave: the new marker's first bytes over the old one's) does not verify:
/// recovery rolls back from the journal, restarts the units in case and says so; the
/// node is as before.
#[tokio::test]
async fn a_torn_progress_marker_rolls_back_and_says_it_does_not_verify() {
    let old = sealed(b"staged");
    let new = sealed(b"written");
    assert!(new.len() > old.len());
    for cut in [30, 60, new.len() - 3, new.len() - 1] {
        let mut node = Node::new("ubuntu-2404-grub");
        // dies after the files, before 'written'
        node.die_at("sysctl", SPEC).await;
        let marker = node.state.join("journal/crash.progress");
        assert_eq!(std::fs::read(&marker).unwrap(), old);
        let mut torn = new[..cut].to_vec();
        if cut < old.len() {
            torn.extend_from_slice(&old[cut..]);
        }
        assert!(torn != new && torn != old, "cut {cut}");
        std::fs::write(&marker, &torn).unwrap();
        node.start();
        let op = node.settle("crash").await;
        assert_eq!(
            op.phase,
            Phase::RolledBack as i32,
            "cut {cut}: {}",
            op.message
        );
        assert!(
            op.message.contains("(last step: unknown)")
                && op.message.contains("the progress marker does not verify"),
            "cut {cut}: {}",
            op.message
        );
        assert!(!node.path("/etc/break-journal.conf").exists(), "cut {cut}");
        assert!(!marker.exists(), "cut {cut}");
    }
}
