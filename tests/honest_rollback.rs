//! Honest phases after a failed roll-back (issue 27 §1), black box: a roll-back that
//! could not put a unit back ends `Failed` with "roll-back incomplete", the files and
//! the CPU manager's checkpoint are back on disk, the roll-back's own actions are listed,
//! and `status` (and `inplaced_state_problems`) keeps the problem until a later
//! operation. (A roll-back that did everything, after a failed health gate, is
//! `tests/kubelet.rs` `unhealthy_kubelet_rolls_back_and_restarts_again`.)

mod common;
use common::*;
use inplace_wire::pb::Phase;

const RESERVED_CPUS: &str = "kubelet:\n  flags:\n    reserved-cpus: \"0-3\"\n";

/// The example: a static CPU manager, a `reserved-cpus` change whose `start
/// kubelet.service` fails. The checkpoint and the flags come back and the kubelet is
/// restarted to read them: the operation is `RolledBack`, saying so, and not claiming
/// "as before" (the recording service manager can not confirm the unit is active).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_after_a_checkpoint_reset_restores_it_and_restarts() {
    let mut node = Node::new("systemd-boot");
    node.fail = Some("start kubelet".into());
    let checkpoint = node.read("/var/lib/kubelet/cpu_manager_state");
    let flags = node.read("/var/lib/kubelet/kubeadm-flags.env");
    node.start();
    let op = apply(&node, RESERVED_CPUS, "cpus").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{op:?}");
    assert_eq!(
        op.message,
        "acting: start kubelet.service: failed on purpose (INPLACED_RECORD_FAIL); rolled back: 2 step(s) undone, 2 file(s) restored and read back, kubelet.service restarted (its state is not checked: the service manager does not report it)"
    );
    assert_eq!(node.read("/var/lib/kubelet/cpu_manager_state"), checkpoint);
    assert_eq!(node.read("/var/lib/kubelet/kubeadm-flags.env"), flags);
    assert_eq!(
        node.actions(),
        vec![
            "stop kubelet.service",
            "start kubelet.service",
            "restart kubelet.service"
        ]
    );
    let rb: Vec<&String> = op
        .actions
        .iter()
        .filter(|a| a.starts_with("rollback: "))
        .collect();
    assert_eq!(
        rb,
        vec![
            "rollback: restored /var/lib/kubelet/cpu_manager_state",
            "rollback: restored /var/lib/kubelet/kubeadm-flags.env",
            "rollback: restarted kubelet.service",
        ],
        "{:?}",
        op.actions
    );
    let s = status(&node).await;
    assert!(
        !s.problems
            .iter()
            .any(|p| p.contains("roll-back incomplete")),
        "{:?}",
        s.problems
    );
}

/// The same, but the kubelet can not be started at all (`start` and `restart` fail):
/// the files and the checkpoint are back, the kubelet is not, so the operation is
/// `Failed` with "roll-back incomplete", never `RolledBack`, and status keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_that_can_not_be_put_back_is_an_incomplete_roll_back() {
    let mut node = Node::new("systemd-boot");
    node.fail = Some("start kubelet,restart kubelet".into());
    node.log_file = Some(node.dir.path().join("agent.log"));
    let checkpoint = node.read("/var/lib/kubelet/cpu_manager_state");
    let flags = node.read("/var/lib/kubelet/kubeadm-flags.env");
    node.start();
    let op = apply(&node, RESERVED_CPUS, "cpus").await;
    assert_eq!(op.phase, Phase::Failed as i32, "{op:?}");
    assert!(
        op.message.starts_with(
            "acting: start kubelet.service: failed on purpose (INPLACED_RECORD_FAIL); roll-back incomplete: putting kubelet.service back: restart kubelet.service: failed on purpose"
        ),
        "{}",
        op.message
    );
    assert!(
        op.message
            .contains("what was done: 2 step(s) undone, 2 file(s) restored and read back;"),
        "{}",
        op.message
    );
    assert!(!op.message.contains("as before"), "{}", op.message);
    assert!(
        !op.message.contains("nothing was changed"),
        "{}",
        op.message
    );
    // what is on disk: the checkpoint the step removed and the flags, as before
    assert_eq!(node.read("/var/lib/kubelet/cpu_manager_state"), checkpoint);
    assert_eq!(node.read("/var/lib/kubelet/kubeadm-flags.env"), flags);
    // the start was tried again once the files were back
    assert_eq!(
        node.actions(),
        vec![
            "stop kubelet.service",
            "start kubelet.service",
            "restart kubelet.service"
        ]
    );
    // the roll-back's own actions are listed (the failed start is not an action)
    let rb: Vec<&String> = op
        .actions
        .iter()
        .filter(|a| a.starts_with("rollback: "))
        .collect();
    assert_eq!(
        rb,
        vec![
            "rollback: restored /var/lib/kubelet/cpu_manager_state",
            "rollback: restored /var/lib/kubelet/kubeadm-flags.env",
        ],
        "{:?}",
        op.actions
    );
    let log = node.log();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("rollback")
            && l.contains("restored /var/lib/kubelet/cpu_manager_state")),
        "the roll-back's actions are logged at WARN: {log}"
    );
    // status keeps the problem, also after a restart, until a later operation
    let s = status(&node).await;
    let problem = format!(
        "operation cpus: roll-back incomplete, the node is not as before: {}",
        op.message
    );
    assert!(s.problems.contains(&problem), "{:?}", s.problems);
    node.stop();
    node.fail = None;
    node.start();
    let s = status(&node).await;
    assert!(s.problems.contains(&problem), "{:?}", s.problems);
    let op = apply(&node, "sysctls:\n  vm.swappiness: \"10\"\n", "later").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let s = status(&node).await;
    assert!(
        !s.problems
            .iter()
            .any(|p| p.contains("roll-back incomplete")),
        "{:?}",
        s.problems
    );
}

/// A failed `restart kubelet.service`: the flags come back and the kubelet is
/// restarted again so that it reads them; that restart fails too, so the operation
/// is `Failed` with both the cause and the unit that is not put back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_restart_is_retried_after_the_files_are_back() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.fail = Some("restart kubelet".into());
    let flags = node.read("/var/lib/kubelet/kubeadm-flags.env");
    node.start();
    let op = apply(&node, "kubelet:\n  flags:\n    max-pods: \"250\"\n", "pods").await;
    assert_eq!(op.phase, Phase::Failed as i32, "{op:?}");
    assert!(
        op.message.contains("roll-back incomplete: putting kubelet.service back: restart kubelet.service: failed on purpose"),
        "{}",
        op.message
    );
    assert_eq!(node.read("/var/lib/kubelet/kubeadm-flags.env"), flags);
    assert_eq!(
        node.actions(),
        vec!["restart kubelet.service", "restart kubelet.service"]
    );
    assert!(
        op.actions
            .contains(&"rollback: restored /var/lib/kubelet/kubeadm-flags.env".to_string()),
        "{:?}",
        op.actions
    );
}
