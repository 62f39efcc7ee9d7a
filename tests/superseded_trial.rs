//! An apply that would supersede an operation waiting in `RebootRequired` with a trial
//! boot armed, and that does not commit (its roll-back fails or succeeds, it is refused
//! at staging, or the agent is killed before its commit point), leaves that operation
//! pending, as it was: still `RebootRequired`, `status` naming its reboot, its trial entry
//! on the node and the boot loader's one-shot as it was before (armed again when it was
//! armed, never armed when it was not). An operation is superseded only once the one
//! that replaces its staged changes commits. The boot loader, status and history tell
//! one story, and a restart finds no trial entry "left by an earlier run".
//!
//! The one-shot is what the recorded commands would have set: the test writes grubenv's
//! `next_entry` (GRUB) or the `LoaderEntryOneShot` EFI variable (systemd-boot) where
//! `grub-reboot` or `bootctl set-oneshot` would have, since the recording service
//! manager only records them. Setup as tests/kernel_args_trial.rs (fixture nodes,
//! simulated boots).

mod common;

use common::*;
use inplace_wire::pb::Phase;

const SCRIPT: &str = "/etc/grub.d/99_inplaced_trial";
const GRUBENV: &str = "/boot/grub/grubenv";
const SDB_ENTRY: &str = "/boot/efi/loader/entries/inplaced-trial.conf";
const EFIVAR: &str =
    "/sys/firmware/efi/efivars/LoaderEntryOneShot-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f";
const KARGS: &str = "kernelArgs: [inplaced.e2e=1]\n";
const TRIAL_ARGS: &str = "inplaced.e2e=1 panic=10 systemd.watchdog_sec=60";
/// No kernel arguments (so it drops the pending trial) and a kubelet change, which
/// restarts kubelet.service.
const KUBELET: &str = "kubelet:\n  config:\n    serializeImagePulls: false\n";
const GRUB_ARM: &str = "run grub-reboot inplaced-trial";
const GRUB_CLEAR: &str = "run grub-editenv /boot/grub/grubenv unset next_entry";
const SDB_ARM: &str = "run bootctl set-oneshot inplaced-trial.conf";
const SDB_CLEAR: &str = "run bootctl set-oneshot ";
const BOOT_2: &str = "22222222-2222-2222-2222-222222222222";

/// A 1024-byte grubenv block, with `next_entry` when given.
fn grubenv(next_entry: Option<&str>) -> Vec<u8> {
    let mut text = String::from("# GRUB Environment Block\n");
    if let Some(e) = next_entry {
        text.push_str(&format!("next_entry={e}\n"));
    }
    let mut b = text.into_bytes();
    b.resize(1024, b'#');
    b
}

/// What `grub-reboot inplaced-trial` does to grubenv (`armed`), or `grub-editenv ...
/// unset next_entry` and GRUB's boot of the one-shot entry (not armed).
fn grub_one_shot(node: &Node, armed: bool) {
    let next = armed.then_some("inplaced-trial");
    std::fs::write(node.path(GRUBENV), grubenv(next)).unwrap();
}

/// What `bootctl set-oneshot inplaced-trial.conf` does (`armed`: the EFI variable is set),
/// or systemd-boot reading it (removed).
fn sdb_one_shot(node: &Node, armed: bool) {
    let p = node.path(EFIVAR);
    if armed {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, b"\x07\x00\x00\x00i\x00").unwrap();
    } else if p.exists() {
        std::fs::remove_file(&p).unwrap();
    }
}

/// Applies the kernel argument as operation `a`, which waits for its trial boot.
async fn trial_pending(node: &Node, entry: &str) {
    let op = apply(node, KARGS, "a").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    assert!(node.path(entry).exists(), "{entry}");
}

/// The recorded commands among `arm` and `clear` after the first `arm` (operation a's).
fn one_shots_after_a(node: &Node, arm: &str, clear: &str) -> Vec<String> {
    let acts = node.actions();
    let first = acts
        .iter()
        .position(|a| a == arm)
        .unwrap_or_else(|| panic!("a armed its trial: {acts:?}"));
    acts[first + 1..]
        .iter()
        .filter(|a| *a == arm || *a == clear)
        .cloned()
        .collect()
}

/// Operation a is pending, and status, history and the boot loader say so: a is
/// RebootRequired (never "superseded"), status names its reboot, the history lists it
/// waiting beside `b` in `b_phase`, its trial entry `entry` is on the node; after a
/// restart the entry is still a's (no orphan problem) and a still waits.
async fn assert_a_pending(node: &mut Node, b: &str, b_phase: Phase, entry: &str) {
    for restarted in [false, true] {
        if restarted {
            node.stop();
            node.start();
        }
        let a = node.settle("a").await;
        assert_eq!(a.phase, Phase::RebootRequired as i32, "{a:?}");
        assert!(!a.message.contains("superseded"), "{}", a.message);
        let s = status(node).await;
        assert_eq!(s.pending_reboot_operation, "a", "restarted: {restarted}");
        assert!(
            !s.problems
                .iter()
                .any(|p| p.contains("left by an earlier run")),
            "restarted: {restarted}: {:?}",
            s.problems
        );
        let hist: Vec<(String, i32)> = node
            .operations()
            .await
            .into_iter()
            .map(|o| (o.id, o.phase))
            .collect();
        assert_eq!(
            hist,
            vec![
                (b.to_string(), b_phase as i32),
                ("a".to_string(), Phase::RebootRequired as i32)
            ]
        );
        assert!(node.path(entry).exists(), "{entry} is a's trial entry");
    }
}

/// The case: b (no kernel arguments: it drops a's trial) fails at the kubelet's
/// restart and its roll-back fails too (the kubelet can not be restarted). a was not
/// superseded: it still waits, its trial entry and one-shot are back as they were, and
/// its trial boot then commits it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grub_a_superseding_apply_whose_roll_back_fails_leaves_the_trial_pending() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.fail = Some("restart kubelet".into());
    node.start();
    trial_pending(&node, SCRIPT).await;
    grub_one_shot(&node, true);
    let b = apply(&node, KUBELET, "b").await;
    assert_eq!(b.phase, Phase::Failed as i32, "{b:?}");
    assert!(b.message.contains("roll-back incomplete"), "{}", b.message);
    assert!(
        b.actions
            .iter()
            .any(|a| a == "removed /etc/grub.d/99_inplaced_trial"),
        "b dropped the trial: {:?}",
        b.actions
    );
    // cleared by b, armed again by its roll-back: as it was, for a, which waits
    assert_eq!(
        one_shots_after_a(&node, GRUB_ARM, GRUB_CLEAR),
        vec![GRUB_CLEAR, GRUB_ARM]
    );
    assert_a_pending(&mut node, "b", Phase::Failed, SCRIPT).await;
    // GRUB boots the one-shot entry (clearing next_entry) and the node is healthy
    grub_one_shot(&node, false);
    node.boot_into(&format!("{UBUNTU_PROC} {TRIAL_ARGS}"), BOOT_2);
    let a = node.settle("a").await;
    assert_eq!(a.phase, Phase::Succeeded as i32, "{a:?}");
    assert!(
        a.message.contains("committed as the default"),
        "{}",
        a.message
    );
    assert!(!node.path(SCRIPT).exists());
}

/// b's roll-back succeeds (the kubelet's health check failed, everything was undone),
/// and the one-shot was not armed before b (cleared since a staged it): the roll-back
/// does not arm it. a still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grub_a_rolled_back_superseding_apply_arms_no_one_shot_that_was_not() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(
        &node.config,
        "[kubelet]\nhealthz_url = \"http://127.0.0.1:9/healthz\"\nhealth_timeout_secs = 1\n",
    )
    .unwrap();
    node.start();
    trial_pending(&node, SCRIPT).await;
    grub_one_shot(&node, false);
    let b = apply(&node, KUBELET, "b").await;
    assert_eq!(b.phase, Phase::RolledBack as i32, "{b:?}");
    assert!(
        b.message.starts_with("kubelet health check failed"),
        "{}",
        b.message
    );
    let acts = node.actions();
    assert_eq!(
        acts.iter().filter(|a| *a == GRUB_ARM).count(),
        1,
        "only a's own grub-reboot: {acts:?}"
    );
    assert_a_pending(&mut node, "b", Phase::RolledBack, SCRIPT).await;
}

/// systemd-boot: as the GRUB case, with `bootctl set-oneshot` and the LoaderEntryOneShot
/// EFI variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_boot_a_superseding_apply_whose_roll_back_fails_leaves_the_trial_pending() {
    let mut node = Node::new("systemd-boot");
    node.fail = Some("restart kubelet".into());
    node.start();
    trial_pending(&node, SDB_ENTRY).await;
    sdb_one_shot(&node, true);
    let old = node.read("/proc/cmdline").trim().to_string();
    let b = apply(&node, KUBELET, "b").await;
    assert_eq!(b.phase, Phase::Failed as i32, "{b:?}");
    assert!(b.message.contains("roll-back incomplete"), "{}", b.message);
    assert_eq!(
        one_shots_after_a(&node, SDB_ARM, SDB_CLEAR),
        vec![SDB_CLEAR, SDB_ARM]
    );
    assert_a_pending(&mut node, "b", Phase::Failed, SDB_ENTRY).await;
    // systemd-boot boots the entry once (removing the variable) and the node is healthy
    sdb_one_shot(&node, false);
    node.boot_into(&format!("{old} {TRIAL_ARGS}"), BOOT_2);
    let a = node.settle("a").await;
    assert_eq!(a.phase, Phase::Succeeded as i32, "{a:?}");
    assert!(!node.path(SDB_ENTRY).exists());
}

/// systemd-boot, b rolled back completely, the one-shot not set before b: not set by
/// the roll-back either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_boot_a_rolled_back_superseding_apply_arms_no_one_shot_that_was_not() {
    let mut node = Node::new("systemd-boot");
    std::fs::write(
        &node.config,
        "[kubelet]\nhealthz_url = \"http://127.0.0.1:9/healthz\"\nhealth_timeout_secs = 1\n",
    )
    .unwrap();
    node.start();
    trial_pending(&node, SDB_ENTRY).await;
    let b = apply(&node, KUBELET, "b").await;
    assert_eq!(b.phase, Phase::RolledBack as i32, "{b:?}");
    let acts = node.actions();
    assert_eq!(
        acts.iter().filter(|a| *a == SDB_ARM).count(),
        1,
        "only a's own set-oneshot: {acts:?}"
    );
    assert_a_pending(&mut node, "b", Phase::RolledBack, SDB_ENTRY).await;
}

/// Without trial boots (`kernel_args.trial = false`) a's argument is in the BLS entries'
/// options themselves, and b (no kernel arguments) takes it out again: b rolled back puts
/// it back, so a, whose argument the next boot carries, still waits, and that boot
/// settles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_boot_without_trials_a_rolled_back_superseding_apply_leaves_a_pending() {
    let mut node = Node::new("systemd-boot");
    std::fs::write(
        &node.config,
        "[kernel_args]\ntrial = false\n[kubelet]\nhealthz_url = \"http://127.0.0.1:9/healthz\"\nhealth_timeout_secs = 1\n",
    )
    .unwrap();
    let entry =
        "/boot/efi/loader/entries/382841d297f903a743992847508b8eae-6.12.48+deb13-amd64.conf";
    node.start();
    let old = node.read("/proc/cmdline").trim().to_string();
    let a = apply(&node, KARGS, "a").await;
    assert_eq!(a.phase, Phase::RebootRequired as i32, "{a:?}");
    let staged = node.read(entry);
    assert!(staged.contains(" inplaced.e2e=1"), "{staged}");
    let b = apply(&node, KUBELET, "b").await;
    assert_eq!(b.phase, Phase::RolledBack as i32, "{b:?}");
    assert!(
        b.actions
            .iter()
            .any(|a| a == &format!("rollback: restored {entry}")),
        "b took the argument out, its roll-back put it back: {:?}",
        b.actions
    );
    assert_eq!(node.read(entry), staged);
    assert!(!node.path(SDB_ENTRY).exists());
    assert_a_pending(&mut node, "b", Phase::RolledBack, entry).await;
    node.boot_into(&format!("{old} inplaced.e2e=1"), BOOT_2);
    let a = node.settle("a").await;
    assert_eq!(a.phase, Phase::Succeeded as i32, "{a:?}");
}

/// b is refused at staging (the state directory is full): nothing was changed, so a
/// still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseding_apply_refused_at_staging_leaves_the_trial_pending() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    trial_pending(&node, SCRIPT).await;
    node.stop();
    node.failpoints = Some("stage-enospc".into());
    node.start();
    let b = apply(&node, KUBELET, "b").await;
    assert_eq!(b.phase, Phase::Failed as i32, "{b:?}");
    assert!(b.message.contains("nothing was changed"), "{}", b.message);
    node.failpoints = None;
    assert_a_pending(&mut node, "b", Phase::Failed, SCRIPT).await;
}

/// The agent is killed after b dropped a's trial (failpoint `act`), before b's commit:
/// the next start rolls b back from its journal, the one-shot armed again as it was,
/// and a still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseding_apply_killed_before_its_commit_leaves_the_trial_pending() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    trial_pending(&node, SCRIPT).await;
    grub_one_shot(&node, true);
    node.stop();
    node.die_at("act", KUBELET).await;
    node.start_after_crash("crash").await;
    assert_eq!(
        one_shots_after_a(&node, GRUB_ARM, GRUB_CLEAR),
        vec![GRUB_CLEAR, GRUB_ARM]
    );
    assert_a_pending(&mut node, "crash", Phase::RolledBack, SCRIPT).await;
}

/// A second trial staged over a's pending one (b: another value of the argument), the
/// agent killed before b's commit: the roll-back puts a's trial entry back and its
/// one-shot armed, as it was (not cleared, which would leave a waiting for a trial boot
/// the boot loader no longer makes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trial_over_a_pending_trial_killed_before_its_commit_re_arms_the_pending_one() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    trial_pending(&node, SCRIPT).await;
    grub_one_shot(&node, true);
    let script = node.read(SCRIPT);
    node.stop();
    node.die_at("act", "kernelArgs: [inplaced.e2e=2]\n").await;
    assert!(
        node.read(SCRIPT).contains("inplaced.e2e=2"),
        "b staged its trial"
    );
    node.start_after_crash("crash").await;
    assert_eq!(node.read(SCRIPT), script, "a's trial entry is back");
    // b armed its own trial, and its roll-back armed a's again
    assert_eq!(
        one_shots_after_a(&node, GRUB_ARM, GRUB_CLEAR),
        vec![GRUB_ARM, GRUB_ARM]
    );
    assert_a_pending(&mut node, "crash", Phase::RolledBack, SCRIPT).await;
}

/// Killed just past b's commit point (failpoint `record`), before a was marked
/// superseded: the start rolls b forward and supersedes a then, so status does not name
/// a reboot that b replaced, and no trial entry is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseding_apply_killed_past_its_commit_supersedes_at_the_next_start() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    trial_pending(&node, SCRIPT).await;
    node.stop();
    node.die_at("record", KUBELET).await;
    node.start();
    let b = node.settle("crash").await;
    assert_eq!(b.phase, Phase::Succeeded as i32, "{b:?}");
    let a = node.settle("a").await;
    assert_eq!(a.phase, Phase::Failed as i32, "{a:?}");
    assert!(
        a.message.starts_with("superseded by operation crash"),
        "{}",
        a.message
    );
    let s = status(&node).await;
    assert_eq!(s.pending_reboot_operation, "");
    assert!(!node.path(SCRIPT).exists());
    assert!(
        !s.problems.iter().any(|p| p.contains(SCRIPT)),
        "{:?}",
        s.problems
    );
}
