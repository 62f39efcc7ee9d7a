//! Timed tries (`inplacectl apply --try`, `ApplyRequest.try_seconds`), black box: a
//! confirmed try stays; an unconfirmed one is reverted byte for byte at its deadline,
//! also across an agent restart in the window and when the deadline passes while the
//! agent is down; confirm is refused after the deadline, for an unknown operation and
//! for an operation that is not a try; a try of a reboot-level change and other applies
//! while a try waits are refused.

mod common;
use std::time::{Duration, Instant};

use common::*;
use inplace_wire::pb;
use inplace_wire::pb::Phase;

/// A live change of every kind a try is for: a new file, an overwritten file, a live
/// sysctl, a kubelet config field and flag (restart of the kubelet).
const TRY_SPEC: &str = r#"
files:
  - path: /etc/try-new.conf
    content: "new\n"
  - path: /etc/sysctl.d/90-tuning.conf
    content: "vm.max_map_count = 262144\n"
sysctls:
  vm.swappiness: "10"
kubelet:
  config:
    serializeImagePulls: false
  flags:
    max-pods: "250"
"#;

/// Applies `yaml` as the try `id` with a window of `secs` seconds.
async fn apply_try(
    node: &Node,
    yaml: &str,
    id: &str,
    secs: u32,
) -> Result<pb::Operation, tonic::Status> {
    node.client()
        .await
        .apply(pb::ApplyRequest {
            desired: Some(spec(yaml)),
            operation_id: id.into(),
            try_seconds: secs,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

/// Waits until operation `id` is in `phase` (up to `secs` seconds) and returns it.
async fn wait_phase(node: &Node, id: &str, phase: Phase, secs: u64) -> pb::Operation {
    let mut c = node.client().await;
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let op = c
            .get_operation(pb::GetOperationRequest { id: id.into() })
            .await
            .unwrap()
            .into_inner();
        if op.phase == phase as i32 {
            return op;
        }
        assert!(
            Instant::now() < deadline,
            "operation {id} is not {phase:?} after {secs} s: {:?} {}",
            Phase::try_from(op.phase),
            op.message
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The root with the state of the world a revert must restore (every file's bytes and
/// mode, every directory).
fn root_snapshot(node: &Node) -> Vec<(std::path::PathBuf, Vec<u8>, u32)> {
    snapshot(&node.root)
}

/// The try waits, is confirmed within its window, ends Succeeded and stays after the
/// deadline passed: no revert operation, the new content still on the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_try_stays() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    apply_try(&node, TRY_SPEC, "t1", 3).await.unwrap();
    let op = wait_phase(&node, "t1", Phase::AwaitingConfirmation, 30).await;
    assert!(
        op.message.contains("inplacectl confirm t1"),
        "{}",
        op.message
    );
    assert_eq!(op.try_seconds, 3);
    let created = op.created.unwrap().seconds;
    assert_eq!(op.try_deadline.unwrap().seconds, created + 3);
    let o = node.ctl(&["confirm", "t1"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(out(&o).contains("Succeeded"), "{}", out(&o));
    tokio::time::sleep(Duration::from_secs(4)).await;
    let op = node.settle("t1").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert!(op.message.starts_with("confirmed"), "{}", op.message);
    assert_eq!(node.read("/etc/try-new.conf"), "new\n");
    assert_eq!(node.read("/proc/sys/vm/swappiness"), "10\n");
    let ops = node.operations().await;
    assert!(
        ops.iter().all(|o| o.id != "t1.revert"),
        "no revert: {ops:?}"
    );
    // confirming again is harmless
    let o = node.ctl(&["confirm", "t1"]);
    assert!(o.status.success(), "{}", err(&o));
    // and the node takes the next apply
    let next = apply(&node, "sysctls:\n  vm.swappiness: \"20\"\n", "n1").await;
    assert_eq!(next.phase, Phase::Succeeded as i32, "{}", next.message);
}

/// Nobody confirms: at the deadline the agent applies the spec applied before (here:
/// none) as `t2.revert`, the try ends RolledBack saying it was not confirmed in time,
/// and the node is byte for byte as before (files, modes, live sysctls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_try_is_reverted_byte_exact() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let before = root_snapshot(&node);
    apply_try(&node, TRY_SPEC, "t2", 2).await.unwrap();
    let waiting = wait_phase(&node, "t2", Phase::AwaitingConfirmation, 30).await;
    assert_eq!(
        node.read("/etc/try-new.conf"),
        "new\n",
        "applied while waiting"
    );
    assert_ne!(root_snapshot(&node), before);
    let op = wait_phase(&node, "t2", Phase::RolledBack, 30).await;
    assert!(
        op.message
            .starts_with("not confirmed within its 2 s try window: reverted"),
        "{}",
        op.message
    );
    assert!(op.message.contains("t2.revert"), "{}", op.message);
    assert!(op.updated.unwrap().seconds >= waiting.try_deadline.unwrap().seconds);
    let rev = node.settle("t2.revert").await;
    assert_eq!(rev.phase, Phase::Succeeded as i32, "{}", rev.message);
    assert_eq!(
        root_snapshot(&node),
        before,
        "the node is exactly as before the try"
    );
    // the kubelet ran with the reverted files
    let restarts = node
        .actions()
        .iter()
        .filter(|a| a.as_str() == "restart kubelet.service")
        .count();
    assert_eq!(restarts, 2, "{:?}", node.actions());
}

/// A try over an earlier applied spec reverts to that spec, not to nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_reverts_to_the_spec_applied_before_it() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let base = "sysctls:\n  vm.swappiness: \"30\"\nfiles:\n  - path: /etc/try-base.conf\n    content: \"base\\n\"\n";
    let b = apply(&node, base, "base").await;
    assert_eq!(b.phase, Phase::Succeeded as i32, "{}", b.message);
    let before = root_snapshot(&node);
    let tried = "sysctls:\n  vm.swappiness: \"5\"\nfiles:\n  - path: /etc/try-base.conf\n    content: \"tried\\n\"\n";
    apply_try(&node, tried, "t3", 1).await.unwrap();
    wait_phase(&node, "t3", Phase::RolledBack, 30).await;
    assert_eq!(root_snapshot(&node), before);
    assert_eq!(node.read("/etc/try-base.conf"), "base\n");
    let s = status(&node).await;
    assert_eq!(
        s.applied_spec_hash, b.spec_hash,
        "the base is applied again"
    );
}

/// The agent is restarted in the window: the deadline was kept with the operation, and
/// the restarted agent reverts at it. And a deadline that passes while the agent is down
/// reverts as soon as it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_window_still_reverts_at_the_deadline() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let before = root_snapshot(&node);
    apply_try(&node, TRY_SPEC, "t4", 4).await.unwrap();
    let waiting = wait_phase(&node, "t4", Phase::AwaitingConfirmation, 30).await;
    node.stop();
    node.start();
    let op = node.settle("t4").await;
    assert_eq!(
        op.phase,
        Phase::AwaitingConfirmation as i32,
        "still waiting after the restart"
    );
    let op = wait_phase(&node, "t4", Phase::RolledBack, 30).await;
    assert!(op.updated.unwrap().seconds >= waiting.try_deadline.unwrap().seconds);
    assert!(op.message.contains("not confirmed"), "{}", op.message);
    assert_eq!(root_snapshot(&node), before);

    // down across the deadline
    apply_try(&node, TRY_SPEC, "t5", 1).await.unwrap();
    wait_phase(&node, "t5", Phase::AwaitingConfirmation, 30).await;
    node.stop();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_ne!(
        root_snapshot(&node),
        before,
        "nothing reverts while the agent is down"
    );
    node.start();
    let op = wait_phase(&node, "t5", Phase::RolledBack, 30).await;
    assert!(op.message.contains("not confirmed"), "{}", op.message);
    assert_eq!(root_snapshot(&node), before);
}

/// Confirm after the deadline, of an unknown operation and of an operation that is not a
/// try: refused, each with a message that says why; nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_is_refused_late_unknown_or_not_a_try() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    apply_try(&node, TRY_SPEC, "t6", 1).await.unwrap();
    wait_phase(&node, "t6", Phase::RolledBack, 30).await;
    let mut c = node.client().await;
    let e = c
        .confirm(pb::ConfirmRequest {
            operation_id: "t6".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("can no longer be confirmed: it ended RolledBack (not confirmed within its 1 s try window"),
        "{}",
        e.message()
    );
    let o = node.ctl(&["confirm", "t6"]);
    assert!(!o.status.success());
    assert!(
        err(&o).contains("can no longer be confirmed"),
        "{}",
        err(&o)
    );
    assert_eq!(node.settle("t6").await.phase, Phase::RolledBack as i32);

    let e = c
        .confirm(pb::ConfirmRequest {
            operation_id: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert!(
        e.message().contains("no operation \"nope\""),
        "{}",
        e.message()
    );
    let o = node.ctl(&["confirm", "nope"]);
    assert!(
        !o.status.success() && err(&o).contains("no operation"),
        "{}",
        err(&o)
    );

    apply(&node, "sysctls:\n  vm.swappiness: \"20\"\n", "plain").await;
    let e = c
        .confirm(pb::ConfirmRequest {
            operation_id: "plain".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("is not a timed try"),
        "{}",
        e.message()
    );
}

/// While a try waits, another apply is ABORTED naming it (its own repeated apply
/// returns it); a try of a reboot-level change is INVALID_ARGUMENT naming try_seconds,
/// before anything is written; a window over a day is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_try_holds_the_node_and_a_try_is_for_live_changes() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let before = root_snapshot(&node);
    let e = apply_try(&node, "kernelArgs: [isolcpus=2-3]\n", "k1", 60)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("try_seconds") && e.message().contains("kernelArgs[isolcpus]"),
        "{}",
        e.message()
    );
    let e = apply_try(&node, TRY_SPEC, "k2", 86_401).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert_eq!(root_snapshot(&node), before, "nothing written");

    apply_try(&node, TRY_SPEC, "t7", 60).await.unwrap();
    wait_phase(&node, "t7", Phase::AwaitingConfirmation, 30).await;
    let e = apply_refused(&node, "sysctls:\n  vm.swappiness: \"20\"\n", "other").await;
    assert_eq!(e.code(), tonic::Code::Aborted, "{e:?}");
    assert!(
        e.message().contains("inplacectl confirm t7"),
        "{}",
        e.message()
    );
    let again = apply_try(&node, TRY_SPEC, "t7", 60).await.unwrap();
    assert_eq!(again.phase, Phase::AwaitingConfirmation as i32);
    let o = node.ctl(&["confirm", "t7"]);
    assert!(o.status.success(), "{}", err(&o));
    let next = apply(&node, "sysctls:\n  vm.swappiness: \"20\"\n", "other").await;
    assert_eq!(next.phase, Phase::Succeeded as i32, "{}", next.message);
}

/// `inplacectl apply --try` sends the window; `--wait` ends with the wait (exit 0);
/// a bad duration is refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inplacectl_apply_try() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let f = node.spec("s.yaml", TRY_SPEC);
    let o = node.ctl(&["apply", "-f", &f, "--id", "c1", "--try", "1m", "--wait"]);
    assert!(o.status.success(), "{}{}", out(&o), err(&o));
    assert!(out(&o).contains("AwaitingConfirmation"), "{}", out(&o));
    assert!(
        out(&o).contains("try:             60 s, confirm by"),
        "{}",
        out(&o)
    );
    let op = node.settle("c1").await;
    assert_eq!(op.try_seconds, 60);
    let o = node.ctl(&["apply", "-f", &f, "--try", "5x"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("is not a duration"), "{}", err(&o));
}

/// The agent is killed right after a try's commit point (failpoint `record`: the journal
/// holds the record, the operation file still says Staging): the next start rolls the
/// journal forward into the wait, never into Succeeded, and the deadline still reverts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_commit_point_rolls_forward_into_the_wait() {
    use std::os::unix::process::ExitStatusExt;
    let mut node = Node::new("ubuntu-2404-grub");
    let before = root_snapshot(&node);
    node.failpoints = Some("record".into());
    node.start();
    let _ = apply_try(&node, TRY_SPEC, "t8", 3).await;
    let status = node.wait_exit(Duration::from_secs(20));
    assert_eq!(
        status.and_then(|s| s.signal()),
        Some(9),
        "killed at the failpoint"
    );
    node.failpoints = None;
    node.start();
    let op = node.settle("t8").await;
    assert_eq!(
        op.phase,
        Phase::AwaitingConfirmation as i32,
        "{}",
        op.message
    );
    let op = wait_phase(&node, "t8", Phase::RolledBack, 30).await;
    assert!(op.message.contains("not confirmed"), "{}", op.message);
    assert_eq!(root_snapshot(&node), before);
}

/// The revert of a try runs as `<id>.revert`: a caller may not choose that id, neither
/// before the try (its revert would answer with the caller's operation and the try would
/// claim a revert that changed nothing) nor while it waits (an operation under it would
/// pass the try's block). Found by the session-7 break-it tester.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_may_not_take_the_revert_id_of_a_try() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let s = apply_refused(&node, TRY_SPEC, "t1.revert").await;
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    assert!(
        s.message().contains("operation_id") && s.message().contains("the revert of a timed try"),
        "{}",
        s.message()
    );
    apply_try(&node, TRY_SPEC, "t1", 2).await.unwrap();
    wait_phase(&node, "t1", Phase::AwaitingConfirmation, 30).await;
    let s = apply_refused(&node, "", "t1.revert").await;
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    let op = wait_phase(&node, "t1", Phase::RolledBack, 30).await;
    assert!(
        op.message
            .contains("reverted to the spec applied before it by operation t1.revert"),
        "{}",
        op.message
    );
}
