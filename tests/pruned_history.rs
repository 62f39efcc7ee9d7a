//! A pruned operation stays gone across a restart (`[history] keep`), black box: an
//! operation's format-2 commit outlives it as the durable copy of the applied state, and
//! the restart must not settle a pruned operation again from that commit. Each member of
//! the class: a confirmed try (came back `AwaitingConfirmation` and was reverted at its
//! deadline), a plain `Succeeded` operation with `keep = 0`, a try reverted at its
//! deadline (`RolledBack`, with its revert operation), and a reboot-level operation that
//! succeeded after its boot. In every case the node keeps exactly what it had before the
//! restart, and the applied state is what the last operation committed.

mod common;
use std::time::{Duration, Instant};

use common::*;
use inplace_wire::pb;
use inplace_wire::pb::Phase;

/// A live change a try is for: a new file and a live sysctl.
const TRY_SPEC: &str = "files:\n  - path: /etc/try-new.conf\n    content: \"new\\n\"\nsysctls:\n  vm.swappiness: \"10\"\n";

fn keep(node: &Node, n: usize, extra: &str) {
    std::fs::write(&node.config, format!("[history]\nkeep = {n}\n{extra}")).unwrap();
}

async fn apply_try(node: &Node, yaml: &str, id: &str, secs: u32) -> pb::Operation {
    node.client()
        .await
        .apply(pb::ApplyRequest {
            desired: Some(spec(yaml)),
            operation_id: id.into(),
            try_seconds: secs,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

async fn wait_phase(node: &Node, id: &str, phase: Phase, secs: u64) -> pb::Operation {
    let mut c = node.client().await;
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Ok(op) = c
            .get_operation(pb::GetOperationRequest { id: id.into() })
            .await
        {
            let op = op.into_inner();
            if op.phase == phase as i32 {
                return op;
            }
            assert!(
                Instant::now() < deadline,
                "{id} is not {phase:?}: {:?} {}",
                Phase::try_from(op.phase),
                op.message
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Operation `id` is not known to the agent (NOT_FOUND) and not in its history.
async fn gone(node: &Node, id: &str) {
    let r = node
        .client()
        .await
        .get_operation(pb::GetOperationRequest { id: id.into() })
        .await;
    match r {
        Err(s) => assert_eq!(s.code(), tonic::Code::NotFound, "{id}: {s:?}"),
        Ok(op) => {
            let op = op.into_inner();
            panic!(
                "pruned operation {id} came back after the restart as {:?}: {}",
                Phase::try_from(op.phase),
                op.message
            )
        }
    }
    let ids: Vec<String> = node.operations().await.into_iter().map(|o| o.id).collect();
    assert!(
        !ids.contains(&id.to_string()),
        "{id} in the history: {ids:?}"
    );
}

/// An operation that ends before its commit point (the kubelet's restart fails on
/// purpose: rolled back, nothing committed; Failed since putting the kubelet back fails too), so that it prunes the history without
/// replacing the commit an earlier operation keeps.
async fn prune_without_a_commit(node: &Node, id: &str, also: &str) {
    let yaml = format!("{also}kubelet:\n  flags:\n    max-pods: \"251\"\n");
    let op = apply(node, &yaml, id).await;
    // Failed: the roll-back's own restart of the kubelet fails too
    assert_eq!(op.phase, Phase::Failed as i32, "{}", op.message);
    assert!(
        op.message
            .starts_with("acting: restart kubelet.service: failed on purpose"),
        "{}",
        op.message
    );
}

/// Waits (up to 10 s) until the operation files are `want`: the history is pruned just
/// after an operation is published as settled. Returns them.
async fn pruned_to(node: &Node, want: &[&str]) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let have = op_files(node);
        if have == want || Instant::now() > deadline {
            return have;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The operation files in the state directory.
fn op_files(node: &Node) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(node.state.join("operations"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    v.sort();
    v
}

/// The case: `keep = 1`, a try confirmed, then an operation that commits nothing
/// (rolled back before its commit point) prunes the try while its commit is kept. After a restart past
/// the try's deadline the try is gone, nothing is reverted, and the node and the applied
/// state are exactly as confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_try_pruned_from_the_history_stays_gone_after_a_restart() {
    let mut node = Node::new("ubuntu-2404-grub");
    keep(&node, 1, "");
    node.fail = Some("restart kubelet".into());
    node.start();
    apply_try(&node, TRY_SPEC, "t1", 2).await;
    wait_phase(&node, "t1", Phase::AwaitingConfirmation, 30).await;
    let o = node.ctl(&["confirm", "t1"]);
    assert!(o.status.success(), "{}", err(&o));
    let confirmed = node.settle("t1").await;
    assert_eq!(confirmed.phase, Phase::Succeeded as i32);
    prune_without_a_commit(&node, "again", TRY_SPEC).await;
    assert_eq!(
        pruned_to(&node, &["again.json"]).await,
        ["again.json"],
        "t1 was pruned"
    );
    let applied = status(&node).await.applied_spec_hash;
    let before = snapshot(&node.root);
    node.stop();
    // past the try's deadline: a resurrected try would be reverted at once
    tokio::time::sleep(Duration::from_secs(3)).await;
    node.start();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    gone(&node, "t1").await;
    gone(&node, "t1.revert").await;
    assert_eq!(node.read("/etc/try-new.conf"), "new\n");
    assert_eq!(node.read("/proc/sys/vm/swappiness"), "10\n");
    assert_eq!(snapshot(&node.root), before, "the node is as confirmed");
    let s = status(&node).await;
    assert_eq!(s.applied_spec_hash, applied);
    assert_eq!(op_files(&node), ["again.json"]);
    assert!(
        !node.state.join("journal/t1.commit").exists(),
        "the pruned try's commit is settled"
    );
}

/// `keep = 0`: a `Succeeded` operation is pruned as it ends, its commit still pending; a
/// restart does not bring it back ("completed after an agent restart"), and the applied
/// state is its.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_succeeded_operation_pruned_at_once_stays_gone() {
    let mut node = Node::new("ubuntu-2404-grub");
    keep(&node, 0, "");
    node.start();
    let op = apply(&node, TRY_SPEC, "s1").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(pruned_to(&node, &[]).await, Vec::<String>::new());
    let applied = status(&node).await.applied_spec_hash;
    assert_eq!(applied, op.spec_hash);
    let before = snapshot(&node.root);
    node.stop();
    node.start();
    gone(&node, "s1").await;
    assert_eq!(snapshot(&node.root), before);
    let s = status(&node).await;
    assert_eq!(s.applied_spec_hash, applied, "the applied state is s1's");
    assert!(op_files(&node).is_empty(), "{:?}", op_files(&node));
    // and the record still manages the file: dropping it from the spec removes it
    let empty = apply(&node, "sysctls:\n  vm.swappiness: \"10\"\n", "s2").await;
    assert_eq!(empty.phase, Phase::Succeeded as i32, "{}", empty.message);
    assert!(!node.path("/etc/try-new.conf").exists());
}

/// `keep = 0`, a try nobody confirms: it ends `RolledBack` and its revert `Succeeded`,
/// both pruned (the revert's commit pending). After a restart neither comes back and the
/// node is as before the try, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reverted_try_and_its_revert_pruned_stay_gone() {
    let mut node = Node::new("ubuntu-2404-grub");
    keep(&node, 0, "");
    node.fail = Some("restart kubelet".into());
    let before = snapshot(&node.root);
    node.start();
    apply_try(&node, TRY_SPEC, "t2", 1).await;
    wait_phase(&node, "t2", Phase::RolledBack, 30).await;
    assert_eq!(snapshot(&node.root), before);
    // the revert pruned itself as it ended (its commit pending); this prunes the try
    prune_without_a_commit(&node, "nudge", "").await;
    assert_eq!(pruned_to(&node, &[]).await, Vec::<String>::new());
    node.stop();
    node.start();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for id in ["t2", "t2.revert", "nudge"] {
        gone(&node, id).await;
    }
    assert_eq!(snapshot(&node.root), before);
}

/// `keep = 0` and a reboot-level change made the default directly: `RebootRequired` is
/// kept (not ended), then after its boot it is `Succeeded`; the next operation prunes
/// it (ending before its own commit point) while its commit (phase RebootRequired) is
/// pending. After a restart it is gone,
/// not waiting for a reboot again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_that_succeeded_after_its_reboot_pruned_stays_gone() {
    let mut node = Node::new("ubuntu-2404-grub");
    keep(&node, 0, "[kernel_args]\ntrial = false\n");
    node.fail = Some("restart kubelet".into());
    node.start();
    let op = apply(&node, "kernelArgs: [nosmt]\n", "k1").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{}", op.message);
    assert_eq!(op_files(&node), ["k1.json"], "waiting: kept");
    node.boot_into(
        &format!("{UBUNTU_PROC} nosmt"),
        "33333333-3333-3333-3333-333333333333",
    );
    assert_eq!(node.settle("k1").await.phase, Phase::Succeeded as i32);
    prune_without_a_commit(&node, "k2", "kernelArgs: [nosmt]\n").await;
    assert_eq!(pruned_to(&node, &[]).await, Vec::<String>::new());
    let before = snapshot(&node.root);
    node.stop();
    node.start();
    gone(&node, "k1").await;
    gone(&node, "k2").await;
    assert_eq!(snapshot(&node.root), before);
    let s = status(&node).await;
    assert_eq!(
        s.pending_reboot_operation, "",
        "no reboot is asked for again: {:?}",
        s.problems
    );
}
