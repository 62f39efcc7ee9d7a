//! Crash safety, black box: the agent killed with SIGKILL at every failpoint of an
//! operation recovers every file to entirely old or entirely new; killed after
//! RebootRequired it stays there; a truncated record is moved aside and named in status;
//! a full disk during staging fails cleanly.

mod common;

use common::*;
use inplace_wire::pb;
use inplace_wire::pb::Phase;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn temp_files(root: &Path) -> Vec<String> {
    snapshot(root)
        .into_iter()
        .map(|(p, _, _)| p.display().to_string())
        .filter(|p| p.contains(".inplaced-") && p.ends_with(".tmp"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_every_failpoint_recovers_to_old_or_new() {
    let yaml = workload();
    let failpoints = [
        "stage",
        "write-temp",
        "write",
        "write:7",
        "write:22",
        "sysctl",
        "act",
        "record",
        "applied",
        "settled",
    ];
    // the new state, from a run without a crash
    let mut clean = Node::new("ubuntu-2404-grub");
    clean.start();
    assert_eq!(
        apply(&clean, &yaml, "crash").await.phase,
        Phase::Succeeded as i32
    );
    let new: BTreeMap<_, _> = snapshot(&clean.root)
        .into_iter()
        .map(|(p, c, m)| (p.strip_prefix(&clean.root).unwrap().to_path_buf(), (c, m)))
        .collect();
    clean.stop();

    for fp in failpoints {
        let mut node = Node::new("ubuntu-2404-grub");
        let old: BTreeMap<_, _> = snapshot(&node.root)
            .into_iter()
            .map(|(p, c, m)| (p.strip_prefix(&node.root).unwrap().to_path_buf(), (c, m)))
            .collect();
        node.die_at(fp, &yaml).await;
        node.start();
        let op = node.settle("crash").await;
        let after: BTreeMap<_, _> = snapshot(&node.root)
            .into_iter()
            .map(|(p, c, m)| (p.strip_prefix(&node.root).unwrap().to_path_buf(), (c, m)))
            .collect();
        assert!(
            temp_files(&node.root).is_empty(),
            "{fp}: temp files left: {:?}",
            temp_files(&node.root)
        );
        match Phase::try_from(op.phase).unwrap() {
            // stopped before its intent was complete: nothing to roll back
            Phase::Failed => {
                assert!(
                    op.message.starts_with("interrupted:")
                        && op.message.contains("nothing was changed"),
                    "{fp}: {}",
                    op.message
                );
                assert_eq!(after, old, "{fp}: the old state exactly");
            }
            // rolled back from the journal at start: the phase says so
            Phase::RolledBack => {
                assert!(
                    op.message.starts_with("interrupted:")
                        && op
                            .message
                            .contains("rolled back from the write-ahead journal"),
                    "{fp}: {}",
                    op.message
                );
                assert_eq!(after, old, "{fp}: rolled back to the old state exactly");
            }
            Phase::Succeeded => {
                assert_eq!(after, new, "{fp}: rolled forward to the new state exactly");
            }
            p => panic!("{fp}: unexpected phase {p:?}: {}", op.message),
        }
        // every file is entirely old or entirely new (a stricter restatement of the above)
        for (path, content) in &after {
            assert!(
                old.get(path) == Some(content) || new.get(path) == Some(content),
                "{fp}: {} is neither old nor new",
                path.display()
            );
        }
        // re-applying with the same id converges
        let op = apply(&node, &yaml, "crash").await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{fp}: {op:?}");
        assert!(
            coverage(&node, &yaml).await.changes.is_empty(),
            "{fp}: not converged"
        );
        // ownership survived: dropping the spec removes what the agent created
        assert_eq!(
            apply(&node, "{}\n", "drop").await.phase,
            Phase::Succeeded as i32
        );
        assert!(
            !node.path("/etc/crash/f00.conf").exists(),
            "{fp}: created file not owned"
        );
        assert!(
            !node.path("/etc/crash").exists(),
            "{fp}: created directory left"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_reboot_required_stays_reboot_required() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.die_at("reboot-required", "kernelArgs: [nosmt]\n")
        .await;
    node.start();
    let op = node.settle("crash").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    node.stop();
    node.start();
    assert_eq!(
        node.settle("crash").await.phase,
        Phase::RebootRequired as i32
    );
    assert!(!node.actions().iter().any(|a| a.starts_with("reboot")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_record_is_moved_aside_and_named_in_status() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    apply(&node, "kubelet:\n  flags:\n    max-pods: \"200\"\n", "zero").await;
    // the start installs zero's record (its commit is then removed)
    node.stop();
    node.start();
    apply(&node, "kubelet:\n  flags:\n    max-pods: \"250\"\n", "one").await;
    node.stop();
    let p = node.state.join("applied.json");
    let text = std::fs::read(&p).unwrap();
    // the operation's commit is still pending (it is the applied state; the installed
    // record is zero's): a record that does not parse beside it (as an install cut
    // short by a power cut leaves it) is reported, and the commit's installed
    assert!(node.state.join("journal/one.commit").exists());
    assert!(String::from_utf8_lossy(&text).contains("\"200\""));
    std::fs::write(&p, &text[..text.len() / 2]).unwrap();
    node.start();
    let s = status(&node).await;
    assert_eq!(s.problems.len(), 1, "{s:?}");
    assert!(
        s.problems[0].contains("did not parse") && s.problems[0].contains("installed again"),
        "{}",
        s.problems[0]
    );
    assert_eq!(s.managed_items, 1);
    let text = std::fs::read(&p).unwrap();
    let installed = String::from_utf8_lossy(&text);
    assert!(
        installed.contains("\"250\"") && !installed.contains("\"200\""),
        "{installed}"
    );
    node.stop();
    // no commit pending any more (the start installed it): the record is moved aside
    assert!(!node.state.join("journal/one.commit").exists());
    std::fs::write(&p, &text[..text.len() / 2]).unwrap();
    node.start();
    let s = status(&node).await;
    assert_eq!(s.problems.len(), 1, "{s:?}");
    assert!(
        s.problems[0].contains("did not parse") && s.problems[0].contains("applied.json.corrupt-"),
        "{}",
        s.problems[0]
    );
    assert_eq!(state_files(&node, "applied.json.corrupt-").len(), 1);
    // the record said max-pods was the node's 200 before inplaced: with it lost, an
    // apply would take inplaced's 250 as the node's own; refused, nothing changed
    let flags = node.root.join("var/lib/kubelet/kubeadm-flags.env");
    let before = std::fs::read(&flags).unwrap();
    let e = apply_refused(&node, "kubelet:\n  flags:\n    max-pods: \"300\"\n", "two").await;
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("applied.json.corrupt-")
            && e.message().contains("kubelet.flags[max-pods]"),
        "{}",
        e.message()
    );
    assert_eq!(std::fs::read(&flags).unwrap(), before);
}

/// The name a lost-record marker begins with.
const MISSING: &str = "applied.json.missing-";

/// The state directory's entries whose names begin with `prefix` (quarantined records,
/// lost-record markers), full paths, sorted.
fn state_files(node: &Node, prefix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(&node.state)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// Status lists no problem that contains `needle`.
async fn no_problem_naming(node: &Node, needle: &str) {
    let s = status(node).await;
    assert!(
        !s.problems.iter().any(|p| p.contains(needle)),
        "{:?}",
        s.problems
    );
}

/// `spec` applied as operation `one`, then a start that installs its record (removing
/// its commit), the daemon stopped: `applied.json` is then the only record.
async fn applied_and_installed(node: &mut Node, spec: &str) {
    node.start();
    assert_eq!(
        apply(node, spec, "one").await.phase,
        Phase::Succeeded as i32
    );
    node.stop();
    node.start();
    node.stop();
    assert!(!node.state.join("journal/one.commit").exists());
}

/// While a record is quarantined or marked lost: coverage of `applied` and of the empty
/// spec says not covered (naming the record), a dry run fails, and applying either is
/// refused FAILED_PRECONDITION naming `item`, the record and the fix.
async fn refused_while_lost(node: &Node, applied: &str, item: &str) {
    for yaml in [applied, "{}\n"] {
        let r = coverage(node, yaml).await;
        assert!(!r.fully_covered, "{yaml}: {r:?}");
        assert!(
            r.changes.iter().all(|c| !c.covered
                && (c.reason.contains("applied record was quarantined")
                    || c.reason.contains("applied record was marked lost"))),
            "{yaml}: {:?}",
            r.changes
        );
        let dry = node
            .client()
            .await
            .apply(pb::ApplyRequest {
                desired: Some(spec(yaml)),
                operation_id: "dry".into(),
                dry_run: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(dry.phase, Phase::Failed as i32, "{yaml}: {dry:?}");
        let e = apply_refused(node, yaml, "refused").await;
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{yaml}: {e:?}");
        for part in ["applied.json.", item, "then remove "] {
            assert!(
                e.message().contains(part),
                "{yaml}: {part:?} in {}",
                e.message()
            );
        }
    }
}

/// The class of the test above for files, and for an apply that drops the item: with
/// the record lost, a file's saved original is known to no record. Re-applying the spec
/// would take inplaced's content as the node's own (`Unchanged`: a later drop keeps it);
/// dropping it would leave inplaced's content and report the node as asked. Both are
/// refused naming the item, its saved original and the quarantined record, at every
/// start until the record is removed; then the apply runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_record_keeps_every_apply_from_taking_its_items_as_the_nodes() {
    let mut node = Node::new("ubuntu-2404-grub");
    let target = node.root.join("etc/hostname");
    let original = std::fs::read(&target).unwrap();
    let spec = "files:\n- path: /etc/hostname\n  content: \"managed\\n\"\n- path: /etc/inplaced-made.conf\n  content: \"made\\n\"\n";
    applied_and_installed(&mut node, spec).await;
    std::fs::write(node.state.join("applied.json"), b"{\"specHash\": ").unwrap();
    node.start();
    refused_while_lost(
        &node,
        spec,
        "files[/etc/hostname] (its original is saved as ",
    )
    .await;
    // a file inplaced created has no saved original, and the refusal says so
    let e = apply_refused(&node, spec, "refused").await;
    assert!(
        e.message()
            .contains("files[/etc/inplaced-made.conf] (no original saved: the file was absent before inplaced first wrote it"),
        "{}",
        e.message()
    );
    assert_eq!(std::fs::read(&target).unwrap(), b"managed\n");
    // said at the next start too, naming the quarantined record
    node.stop();
    node.start();
    let s = status(&node).await;
    let quarantined = state_files(&node, "applied.json.corrupt-");
    assert_eq!(quarantined.len(), 1);
    let named = quarantined[0].display().to_string();
    assert!(
        s.problems
            .iter()
            .any(|p| p.contains(&named) && p.contains("no apply runs")),
        "{:?}",
        s.problems
    );
    // an answer kept by this start (asked twice: the second is the kept one)
    assert!(!coverage(&node, spec).await.fully_covered);
    assert!(!coverage(&node, spec).await.fully_covered);
    // the administrator puts the original back and removes the record: the drop runs
    std::fs::remove_file(&quarantined[0]).unwrap();
    // the kept coverage answer follows the removal, nothing else changed, and status
    // no longer names the record (it did until a restart)
    assert!(coverage(&node, spec).await.fully_covered);
    no_problem_naming(&node, &named).await;
    // and across a restart (no marker of a missing record takes its place)
    node.stop();
    node.start();
    no_problem_naming(&node, "applied.json").await;
    std::fs::write(&target, &original).unwrap();
    let op = apply(&node, "{}\n", "after").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(std::fs::read(&target).unwrap(), original);
}

/// The same for a record that is gone rather than damaged: `applied.json` removed while
/// `applied-spec.pb` names the items. The start leaves a marker, which refuses applies
/// as a quarantined record does, until it is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_record_is_marked_and_keeps_applies_from_taking_its_items() {
    let mut node = Node::new("ubuntu-2404-grub");
    let spec = "sysctls:\n  vm.swappiness: \"10\"\n";
    applied_and_installed(&mut node, spec).await;
    std::fs::remove_file(node.state.join("applied.json")).unwrap();
    node.start();
    let s = status(&node).await;
    let markers = state_files(&node, MISSING);
    assert_eq!(markers.len(), 1, "{:?}", s.problems);
    let named = markers[0].display().to_string();
    assert!(
        s.problems
            .iter()
            .any(|p| p.contains(&named) && p.contains("is missing")),
        "{:?}",
        s.problems
    );
    refused_while_lost(&node, spec, "sysctls[vm.swappiness]").await;
    // a start that finds the marker says it again and writes no second one
    node.stop();
    node.start();
    let s = status(&node).await;
    assert!(
        s.problems.iter().any(|p| p.contains(&named)),
        "{:?}",
        s.problems
    );
    assert_eq!(state_files(&node, MISSING).len(), 1);
    // coverage says how the record came to be in doubt; kept, it follows the marker's
    // removal (a listing of the state directory's own entries: the helper's finding)
    for _ in 0..2 {
        let r = coverage(&node, spec).await;
        assert!(
            r.changes
                .iter()
                .all(|c| !c.covered && c.reason.contains("applied record was marked lost")),
            "{:?}",
            r.changes
        );
    }
    // a change not covered for its own reason keeps that reason, first (the new user
    // saw only the record's)
    let typo = "sysctls:\n  vm.swappiness: \"10\"\nkubelet:\n  config:\n    maxpods: 250\n";
    let r = coverage(&node, typo).await;
    let c = r
        .changes
        .iter()
        .find(|c| c.id == "kubelet.config.maxpods")
        .expect("the typo's change");
    assert!(
        c.reason
            .starts_with("maxpods is not a KubeletConfiguration")
            && c.reason.contains("(did you mean maxPods?)")
            && c.reason
                .contains("; and the applied record was marked lost"),
        "{}",
        c.reason
    );
    std::fs::remove_file(&markers[0]).unwrap();
    let r = coverage(&node, spec).await;
    assert!(r.fully_covered, "{:?}", r.changes);
    no_problem_naming(&node, &named).await;
    // the removal stands across a restart: the start finds the record written in place
    // of the lost one and marks nothing again (a breaker's finding: it marked again)
    node.stop();
    node.start();
    no_problem_naming(&node, "applied.json").await;
    assert!(coverage(&node, spec).await.fully_covered);
    assert_eq!(
        apply(&node, spec, "after").await.phase,
        Phase::Succeeded as i32
    );
    assert_eq!(state_files(&node, MISSING), Vec::<PathBuf>::new());
}

/// The administrator's removal of a marker while the agent is stopped (stop, fix,
/// start) is kept by the next start: the record the marking start wrote in place of the
/// lost one names the marker, so its absence reads as settled, not as a new loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_removed_while_the_agent_is_stopped_stays_removed() {
    let mut node = Node::new("ubuntu-2404-grub");
    let spec = "sysctls:\n  vm.swappiness: \"10\"\n";
    applied_and_installed(&mut node, spec).await;
    std::fs::remove_file(node.state.join("applied.json")).unwrap();
    node.start();
    node.stop();
    let found = state_files(&node, MISSING);
    assert_eq!(found.len(), 1);
    std::fs::remove_file(&found[0]).unwrap();
    node.start();
    assert_eq!(state_files(&node, MISSING), Vec::<PathBuf>::new());
    no_problem_naming(&node, "applied.json").await;
    assert_eq!(
        apply(&node, spec, "after").await.phase,
        Phase::Succeeded as i32
    );
}

/// Status names each marker while it is there, by its exact path: a marker whose name
/// begins another's (`applied.json.missing-1` of `applied.json.missing-1796...`) does
/// not keep the other's problem alive after its removal (a breaker's finding).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_each_marker_by_its_exact_path() {
    let mut node = Node::new("ubuntu-2404-grub");
    let spec = "sysctls:\n  vm.swappiness: \"10\"\n";
    applied_and_installed(&mut node, spec).await;
    std::fs::remove_file(node.state.join("applied.json")).unwrap();
    node.start();
    let made = state_files(&node, MISSING)
        .pop()
        .expect("the start's marker");
    let prefix = node.state.join("applied.json.missing-1");
    std::fs::write(&prefix, "").unwrap();
    std::fs::remove_file(&made).unwrap();
    let s = status(&node).await;
    let named = made.display().to_string();
    assert!(
        !s.problems
            .iter()
            .any(|p| p.contains(&format!("{named}\u{20}")) || p.ends_with(&named)),
        "{:?}",
        s.problems
    );
    assert!(
        s.problems
            .iter()
            .any(|p| p.starts_with(&format!("{}: left by an earlier start", prefix.display()))),
        "{:?}",
        s.problems
    );
}

/// A record that still parses but manages nothing (`{}`) while the spec applied last
/// names items is a lost record too (the breaker's F-1): marked, and applies refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emptied_record_is_a_lost_one() {
    let mut node = Node::new("ubuntu-2404-grub");
    let spec = "kubelet:\n  flags:\n    max-pods: \"250\"\n";
    applied_and_installed(&mut node, spec).await;
    std::fs::write(node.state.join("applied.json"), b"{}").unwrap();
    node.start();
    let s = status(&node).await;
    assert!(
        s.problems
            .iter()
            .any(|p| p.contains("manages nothing") && p.contains("applied.json.missing-")),
        "{:?}",
        s.problems
    );
    refused_while_lost(&node, spec, "kubelet.flags[max-pods]").await;
}

/// The record and the applied spec both gone: the saved originals still say inplaced
/// managed files (F-2), and with nothing naming the items every apply is refused, the
/// empty spec too (F-3), until the marker is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_lost_with_its_spec_is_told_by_the_saved_originals() {
    let mut node = Node::new("ubuntu-2404-grub");
    let spec = "files:\n- path: /etc/hostname\n  content: \"managed\\n\"\n";
    applied_and_installed(&mut node, spec).await;
    std::fs::remove_file(node.state.join("applied.json")).unwrap();
    std::fs::remove_file(node.state.join("applied-spec.pb")).unwrap();
    node.start();
    let s = status(&node).await;
    assert!(
        s.problems
            .iter()
            .any(|p| p.contains("originals inplaced saved")),
        "{:?}",
        s.problems
    );
    refused_while_lost(&node, spec, "whatever the spec applied last named").await;
    assert_eq!(
        std::fs::read(node.root.join("etc/hostname")).unwrap(),
        b"managed\n"
    );
}

/// A record quarantined while the applied spec is gone, and no original saved: nothing
/// says which items were managed, so every apply is refused, the spec's own items
/// named (F-3: the first apply used to be taken, the next refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantined_record_without_its_spec_refuses_every_apply() {
    let mut node = Node::new("ubuntu-2404-grub");
    let spec = "sysctls:\n  vm.swappiness: \"10\"\n";
    applied_and_installed(&mut node, spec).await;
    std::fs::write(node.state.join("applied.json"), b"{\"files\": ").unwrap();
    std::fs::remove_file(node.state.join("applied-spec.pb")).unwrap();
    node.start();
    refused_while_lost(&node, spec, "whatever the spec applied last named").await;
    let e = apply_refused(&node, spec, "named").await;
    assert!(
        e.message().contains("sysctls[vm.swappiness]"),
        "{}",
        e.message()
    );
}

/// What must not be taken for a lost record: a node never applied, and one whose last
/// spec was emptied (its record empty, a stale original from a crash left behind).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_record_of_an_empty_spec_is_not_a_lost_one() {
    let mut node = Node::new("ubuntu-2404-grub");
    let spec = "files:\n- path: /etc/hostname\n  content: \"managed\\n\"\n";
    applied_and_installed(&mut node, spec).await;
    node.start();
    assert_eq!(
        apply(&node, "{}\n", "emptied").await.phase,
        Phase::Succeeded as i32
    );
    node.stop();
    std::fs::create_dir_all(node.state.join("originals")).unwrap();
    std::fs::write(node.state.join("originals/stale"), b"x").unwrap();
    node.start();
    node.stop();
    node.start();
    no_problem_naming(&node, "applied.json.").await;
    assert_eq!(
        apply(&node, spec, "again").await.phase,
        Phase::Succeeded as i32
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_during_staging_fails_cleanly() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.failpoints = Some("stage-enospc".into());
    let before = snapshot(&node.root);
    node.start();
    let op = apply(&node, &workload(), "full").await;
    assert_eq!(op.phase, Phase::Failed as i32, "{op:?}");
    assert!(
        op.message.contains("No space left on device")
            && op.message.contains("nothing was changed"),
        "{}",
        op.message
    );
    assert_eq!(snapshot(&node.root), before);
    let journal: Vec<_> = std::fs::read_dir(node.state.join("journal"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(journal.is_empty(), "{journal:?}");
}

/// The kubelet's CPU manager checkpoint, removed by the reset of its manager, is in the
/// journal: killed after the reset (failpoint `act`), with a checkpoint of the new policy
/// written since (as the started kubelet does), the start puts the old one back over it
/// with the kubelet's flags, restarts the kubelet and ends RolledBack naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_removed_before_a_crash_is_restored_from_the_journal() {
    let mut node = Node::new("systemd-boot");
    let state = "/var/lib/kubelet/cpu_manager_state";
    let checkpoint = node.read(state);
    let flags = node.read("/var/lib/kubelet/kubeadm-flags.env");
    node.die_at("act", "kubelet:\n  flags:\n    reserved-cpus: \"0-3\"\n")
        .await;
    assert!(!node.path(state).exists(), "the reset removed it");
    std::fs::write(node.path(state), "{\"policyName\":\"static\",\"new\":true}").unwrap();
    node.start();
    let op = node.settle("crash").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{}", op.message);
    assert!(
        op.message.contains(&format!(
            "restored from the journal's pre-images: {state}, /var/lib/kubelet/kubeadm-flags.env;"
        )),
        "{}",
        op.message
    );
    assert_eq!(node.read(state), checkpoint);
    assert_eq!(node.read("/var/lib/kubelet/kubeadm-flags.env"), flags);
    assert_eq!(
        node.actions().last().map(String::as_str),
        Some("restart kubelet.service")
    );
}

/// A bug's panic in the middle of an apply (the operation thread, after the 7th file
/// written) ends the daemon by SIGABRT (its panic hook), and the next start rolls the
/// operation back. Without the hook the panic ended the operation thread alone: the daemon
/// went on serving with the operation `running` forever and refused every later Apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_mid_apply_ends_the_daemon_and_the_start_rolls_back() {
    let yaml = workload();
    let mut node = Node::new("ubuntu-2404-grub");
    let old: BTreeMap<_, _> = snapshot(&node.root)
        .into_iter()
        .map(|(p, c, m)| (p.strip_prefix(&node.root).unwrap().to_path_buf(), (c, m)))
        .collect();
    node.failpoints = Some("write:7".into());
    node.env
        .push(("INPLACED_FAILPOINT_PANIC".into(), "1".into()));
    node.start();
    assert_eq!(
        node.apply_until_exit(&yaml, "crash").await,
        Some(6),
        "the panic must end the daemon by SIGABRT"
    );
    node.failpoints = None;
    node.env.clear();
    node.start_after_crash("crash").await;
    let after: BTreeMap<_, _> = snapshot(&node.root)
        .into_iter()
        .map(|(p, c, m)| (p.strip_prefix(&node.root).unwrap().to_path_buf(), (c, m)))
        .collect();
    assert_eq!(after, old, "rolled back to the old state exactly");
    assert!(temp_files(&node.root).is_empty());
    // and the node takes the next operation
    assert_eq!(
        apply(&node, &yaml, "after-panic").await.phase,
        Phase::Succeeded as i32
    );
}

/// A bug's panic in a request's work (a coverage computation, on the runtime's blocking
/// pool) fails that call with INTERNAL and nothing else: the daemon serves on, the next
/// call is answered and an apply runs, where ending the daemon would have rolled back any
/// operation another caller had running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_a_coverage_computation_fails_that_call_only() {
    let yaml = workload();
    let mut node = Node::new("ubuntu-2404-grub");
    node.failpoints = Some("coverage".into());
    node.env
        .push(("INPLACED_FAILPOINT_PANIC".into(), "1".into()));
    node.start();
    let mut c = node.client().await;
    let err = c
        .get_coverage(inplace_wire::pb::GetCoverageRequest {
            desired: Some(spec(&yaml)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Internal, "{err:?}");
    assert!(
        node.wait_exit(std::time::Duration::from_millis(300))
            .is_none(),
        "the daemon ended"
    );
    // the failpoint triggers once: the same call is answered now
    assert!(!coverage(&node, &yaml).await.changes.is_empty());
    assert_eq!(
        apply(&node, &yaml, "after-panic").await.phase,
        Phase::Succeeded as i32
    );
}
