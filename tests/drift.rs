//! Drift, black box: a managed item changed behind the agent's back is reported and
//! counted, across restarts, and never repaired by the agent on its own.

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_is_reported_counted_across_restarts_and_never_repaired() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(&node.config, "[drift]\ninterval_secs = 1\n").unwrap();
    node.start();
    apply(&node, "files:\n- path: /etc/managed.conf\n  content: \"a\\n\"\nkubelet:\n  flags:\n    max-pods: \"250\"\n", "one").await;
    // another writer rewrites a managed file and the flags file
    std::fs::write(node.path("/etc/managed.conf"), "b\n").unwrap();
    let flags = node
        .read("/var/lib/kubelet/kubeadm-flags.env")
        .replace("--max-pods=250", "--max-pods=120");
    std::fs::write(node.path("/var/lib/kubelet/kubeadm-flags.env"), flags).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let seen = loop {
        let s = status(&node).await;
        if s.drift.len() == 2 || std::time::Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let ids: Vec<&str> = seen.drift.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["files[/etc/managed.conf]", "kubelet.flags[max-pods]"]);
    assert!(seen.drift.iter().all(|d| d.since.is_some()));
    assert_eq!(seen.drift_detections, 2);
    // the watcher saw it and did nothing about it
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(node.read("/etc/managed.conf"), "b\n");
    assert_eq!(
        node.actions(),
        vec!["restart kubelet.service"],
        "no repair, no restart loop"
    );
    node.stop();
    node.start();
    let s = status(&node).await;
    assert_eq!(s.drift_detections, 2, "counted across restarts, not again");
}
