//! Trial boots with damaged trial state (the breakit reproductions of wt/breakit's
//! tests/breakit_trial.rs), asserting the right behaviour: an operation that staged a
//! trial never ends `Succeeded` unless the default carries the change, whatever became
//! of its trial entry (GRUB script, systemd-boot and RHEL 8 BLS entries); an orphan trial
//! entry is a status problem; a fallback's record and message claim only what booted.
//! Setup as tests/kernel_args_trial.rs (fixture nodes, simulated boots).

mod common;

use common::*;
use inplace_wire::pb::Phase;

const SCRIPT: &str = "/etc/grub.d/99_inplaced_trial";
const BOOT_2: &str = "22222222-2222-2222-2222-222222222222";
const TRIAL_ARGS: &str = "inplaced.e2e=1 panic=10 systemd.watchdog_sec=60";

/// Stages the trial of `inplaced.e2e=1` as operation `id`; returns the old command line.
async fn staged(node: &mut Node, id: &str, entry: &str) -> String {
    node.start();
    let op = apply(node, "kernelArgs: [inplaced.e2e=1]\n", id).await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    assert!(node.path(entry).exists(), "{entry}");
    node.read("/proc/cmdline").trim().to_string()
}

/// The trial command line booted, but the entry was damaged: Failed, naming the entry.
async fn assert_failed_naming(node: &Node, id: &str, entry: &str) {
    let op = node.settle(id).await;
    assert_eq!(op.phase, Phase::Failed as i32, "{op:?}");
    assert!(
        op.message.contains(entry) && op.message.contains("missing or damaged"),
        "{}",
        op.message
    );
    assert!(
        op.message
            .contains("/proc/cmdline shows the trial's arguments"),
        "{}",
        op.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grub_truncated_trial_script_fails_naming_it_not_succeeded_uncommitted() {
    let mut node = Node::new("ubuntu-2404-grub");
    staged(&mut node, "trial", SCRIPT).await;
    std::fs::write(node.path(SCRIPT), "#!/bin/sh\n").unwrap();
    node.boot_into(&format!("{UBUNTU_PROC} {TRIAL_ARGS}"), BOOT_2);
    assert_failed_naming(&node, "trial", SCRIPT).await;
    assert!(!node.read("/etc/default/grub").contains("inplaced.e2e=1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grub_deleted_trial_script_fails_naming_it_not_succeeded_uncommitted() {
    let mut node = Node::new("ubuntu-2404-grub");
    staged(&mut node, "trial", SCRIPT).await;
    std::fs::remove_file(node.path(SCRIPT)).unwrap();
    node.boot_into(&format!("{UBUNTU_PROC} {TRIAL_ARGS}"), BOOT_2);
    assert_failed_naming(&node, "trial", SCRIPT).await;
    assert!(!node.read("/etc/default/grub").contains("inplaced.e2e=1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_boot_truncated_trial_entry_fails_naming_it() {
    let mut node = Node::new("systemd-boot");
    let entry = "/boot/efi/loader/entries/inplaced-trial.conf";
    let old = staged(&mut node, "sdb", entry).await;
    std::fs::write(node.path(entry), "title x\n").unwrap();
    node.boot_into(&format!("{old} {TRIAL_ARGS}"), BOOT_2);
    assert_failed_naming(&node, "sdb", entry).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rhel8_deleted_trial_entry_fails_naming_it_and_kernelopts_stay() {
    let mut node = Node::new("rhel8-grubenv");
    let entry = "/boot/loader/entries/inplaced-trial.conf";
    let old = staged(&mut node, "r8", entry).await;
    let env = std::fs::read(node.path("/boot/grub2/grubenv")).unwrap();
    std::fs::remove_file(node.path(entry)).unwrap();
    node.boot_into(&format!("{old} {TRIAL_ARGS}"), BOOT_2);
    assert_failed_naming(&node, "r8", entry).await;
    assert_eq!(
        std::fs::read(node.path("/boot/grub2/grubenv")).unwrap(),
        env
    );
}

/// A damaged entry and the old default booted: Failed as well, naming the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grub_deleted_trial_script_then_old_default_fails_naming_it() {
    let mut node = Node::new("ubuntu-2404-grub");
    staged(&mut node, "trial", SCRIPT).await;
    std::fs::remove_file(node.path(SCRIPT)).unwrap();
    node.boot_into(UBUNTU_PROC, BOOT_2);
    let op = node.settle("trial").await;
    assert_eq!(op.phase, Phase::Failed as i32, "{op:?}");
    assert!(
        op.message.contains(SCRIPT) && op.message.contains("lacks the trial's arguments"),
        "{}",
        op.message
    );
}

/// A trial script left with no operation (state directory reset): a status problem
/// naming it and how to remove it; an apply not carrying it commits nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_trial_script_is_a_status_problem() {
    let mut node = Node::new("ubuntu-2404-grub");
    staged(&mut node, "trial", SCRIPT).await;
    node.stop();
    std::fs::remove_dir_all(&node.state).unwrap();
    std::fs::create_dir_all(&node.state).unwrap();
    node.boot_into(&format!("{UBUNTU_PROC} {TRIAL_ARGS}"), BOOT_2);
    let st = status(&node).await;
    let p = st
        .problems
        .iter()
        .find(|p| p.starts_with(SCRIPT))
        .unwrap_or_else(|| panic!("{:?}", st.problems));
    assert!(p.contains(&format!("rm {SCRIPT}")), "{p}");
    let _ = apply(&node, "sysctls:\n  vm.swappiness: \"10\"\n", "other").await;
    assert!(!node.read("/etc/default/grub").contains("inplaced.e2e=1"));
    // reported, not removed: the agent does not judge an entry no operation owns
    assert!(node.path(SCRIPT).exists());
}

/// A healthy pending trial is not an orphan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_trial_is_not_an_orphan() {
    let mut node = Node::new("ubuntu-2404-grub");
    staged(&mut node, "trial", SCRIPT).await;
    node.stop();
    node.start();
    let st = status(&node).await;
    assert!(
        !st.problems.iter().any(|p| p.contains(SCRIPT)),
        "{:?}",
        st.problems
    );
}

/// Trial 2 over pending trial 1, then the old default boots: the record does not claim
/// inplaced.e2e=1 (never booted), and the message says what it set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trial_over_a_pending_trial_then_fallback_claims_only_what_booted() {
    let mut node = Node::new("ubuntu-2404-grub");
    staged(&mut node, "trial", SCRIPT).await;
    let op = apply(&node, "kernelArgs: [inplaced.e2e=2]\n", "second").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    node.boot_into(UBUNTU_PROC, BOOT_2);
    let first = node.settle("trial").await;
    let second = node.settle("second").await;
    assert_ne!(first.phase, Phase::RebootRequired as i32, "{first:?}");
    assert_eq!(second.phase, Phase::RolledBack as i32, "{second:?}");
    assert!(
        !second.message.contains("restored to [inplaced.e2e=1]")
            && second.message.contains("set to []")
            && second.message.contains("booted without inplaced.e2e=1"),
        "{}",
        second.message
    );
    let r = coverage(&node, "kernelArgs: [inplaced.e2e=1]\n").await;
    assert!(!r.changes.is_empty(), "the record claims inplaced.e2e=1");
}

/// The trial an operation staged is a typed field of the applied record
/// (`kernelArgsTrial.artefact`), written when the trial entry is staged, not read back
/// from the operation's action strings: with the entry deleted and the operation's
/// actions gone (reworded by another version, or never written), the boot is still
/// told from a plain reboot, Failed naming the entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_staged_trial_is_recorded_typed_not_parsed_from_actions() {
    let mut node = Node::new("ubuntu-2404-grub");
    staged(&mut node, "typed", SCRIPT).await;
    node.stop();
    let record = common::applied_record(&node.state).expect("a record");
    assert_eq!(
        record["kernelArgsTrial"],
        serde_json::json!({ "artefact": SCRIPT }),
        "{record:#}"
    );
    let p = node.state.join("operations/typed.json");
    let mut op: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    op["actions"] = serde_json::json!([]);
    std::fs::write(&p, serde_json::to_vec_pretty(&op).unwrap()).unwrap();
    std::fs::remove_file(node.path(SCRIPT)).unwrap();
    node.boot_into(&format!("{UBUNTU_PROC} {TRIAL_ARGS}"), BOOT_2);
    assert_failed_naming(&node, "typed", SCRIPT).await;
    assert!(!node.read("/etc/default/grub").contains("inplaced.e2e=1"));
}

/// A record written before the field existed (no `kernelArgsTrial`) is read as before:
/// the agent starts, manages what it records, and reports no problem with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_without_the_trial_field_is_read() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let op = apply(&node, "sysctls:\n  vm.swappiness: \"10\"\n", "old").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    node.stop();
    let text = common::applied_record(&node.state)
        .expect("a record")
        .to_string();
    assert!(!text.contains("kernelArgsTrial"), "{text}");
    node.start();
    let s = status(&node).await;
    assert!(s.problems.is_empty(), "{:?}", s.problems);
    assert_eq!(s.managed_items, 1);
}
