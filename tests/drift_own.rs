//! The agent's own persisted files are drift sources, black box: editing or deleting the
//! agent's sysctl.d drop-in (the value the node boots with) is drift of the keys it holds,
//! and editing the agent's systemd-timesyncd drop-in is drift of `ntp`; both are reported
//! in status, counted, kept across a restart, and never repaired.

mod common;
use common::*;
use inplace_wire::pb::Phase;

const DROP_IN: &str = "/etc/sysctl.d/99-zz-inplaced.conf";

async fn drift_of(node: &Node, n: usize) -> inplace_wire::pb::NodeStatus {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let s = status(node).await;
        if s.drift.len() == n || std::time::Instant::now() > deadline {
            return s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sysctl_drop_in_edited_or_deleted_is_drift_of_its_keys() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(&node.config, "[drift]\ninterval_secs = 1\n").unwrap();
    node.start();
    let op = apply(&node, "sysctls:\n  vm.swappiness: \"10\"\n", "one").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(status(&node).await.drift.len(), 0);
    // another writer edits the agent's drop-in: the live value is still right
    let text = node.read(DROP_IN);
    assert!(text.contains("vm.swappiness = 10"), "{text}");
    std::fs::write(node.path(DROP_IN), text.replace("= 10", "= 60")).unwrap();
    let s = drift_of(&node, 1).await;
    assert_eq!(s.drift.len(), 1, "{:?}", s.drift);
    assert_eq!(s.drift[0].id, "sysctls[vm.swappiness]");
    assert_eq!(s.drift[0].expected, format!("10 (live and in {DROP_IN})"));
    assert_eq!(
        s.drift[0].observed,
        format!("60 in {DROP_IN} (persisted for the next boot)")
    );
    assert!(s.drift[0].since.is_some());
    assert_eq!(s.drift_detections, 1);
    // deleted: still drift, with what is seen now
    std::fs::remove_file(node.path(DROP_IN)).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let s = loop {
        let s = status(&node).await;
        if s.drift
            .first()
            .is_some_and(|d| d.observed.contains("deleted"))
            || std::time::Instant::now() > deadline
        {
            break s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(
        s.drift[0].observed,
        format!("{DROP_IN} is deleted: the value would not persist at boot")
    );
    // never repaired; reported after a restart, not counted again
    assert!(!node.path(DROP_IN).exists());
    node.stop();
    node.start();
    let s = drift_of(&node, 1).await;
    assert_eq!(s.drift.len(), 1, "{:?}", s.drift);
    assert_eq!(s.drift[0].id, "sysctls[vm.swappiness]");
    assert_eq!(s.drift_detections, 1, "counted across restarts, not again");
    node.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timesyncd_drop_in_edited_is_drift_of_ntp() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(node.path("/usr/lib/systemd/systemd-timesyncd"), "").unwrap();
    std::fs::write(&node.config, "[drift]\ninterval_secs = 1\n").unwrap();
    node.start();
    let op = apply(&node, "ntp:\n  servers: [ntp1.example.invalid]\n", "one").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let dropin = "/etc/systemd/timesyncd.conf.d/inplaced-ntp.conf";
    std::fs::write(node.path(dropin), "[Time]\nNTP=other.example.invalid\n").unwrap();
    let s = drift_of(&node, 1).await;
    let ids: Vec<&str> = s.drift.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["ntp"], "{:?}", s.drift);
    node.stop();
    node.start();
    let s = drift_of(&node, 1).await;
    assert_eq!(s.drift.len(), 1, "{:?}", s.drift);
    assert_eq!(s.drift_detections, 1);
    node.stop();
}
