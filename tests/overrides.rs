//! Every place a managed kubelet setting can come from is read, black box: a real
//! `inplaced` on the ubuntu fixture whose kubelet has a `--config-dir` (set through
//! `KUBELET_EXTRA_ARGS`). A KubeletConfiguration field that one of its `*.conf` drop-ins
//! sets is not covered, naming the drop-in that wins (the last in name order, per
//! upstream "Kubelet configuration directory merging"); a field no drop-in sets is.

mod common;
use common::*;

const DIR: &str = "/etc/kubernetes/kubelet.conf.d";

fn with_config_dir(node: &Node) {
    std::fs::write(
        node.path("/etc/default/kubelet"),
        format!("KUBELET_EXTRA_ARGS=--config-dir={DIR}\n"),
    )
    .unwrap();
    std::fs::create_dir_all(node.path(DIR)).unwrap();
    let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    for (name, body) in [
        ("10-base.conf", "imageGCHighThresholdPercent: 80\n"),
        (
            "20-site.conf",
            "imageGCHighThresholdPercent: 90\nevictionHard:\n  memory.available: 100Mi\n",
        ),
        // not a drop-in: only `*.conf` files are merged
        ("30-off.conf.disabled", "clusterDomain: other.local\n"),
    ] {
        std::fs::write(node.path(&format!("{DIR}/{name}")), format!("{head}{body}")).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_a_config_dir_drop_in_sets_is_not_covered_naming_it() {
    let mut node = Node::new("ubuntu-2404-grub");
    with_config_dir(&node);
    node.start();
    let yaml = "kubelet:\n  config:\n    imageGCHighThresholdPercent: 85\n    evictionHard:\n      memory.available: 200Mi\n    clusterDomain: edge.local\n";
    let r = coverage(&node, yaml).await;
    let gc = change(&r, "kubelet.config.imageGCHighThresholdPercent");
    assert!(!gc.covered);
    assert_eq!(
        gc.reason,
        format!(
            "KubeletConfiguration drop-in {DIR}/20-site.conf (kubelet --config-dir) sets imageGCHighThresholdPercent, and the kubelet merges its drop-ins over /var/lib/kubelet/config.yaml (a later drop-in wins): the value stays {DIR}/20-site.conf's; change it there"
        )
    );
    let ev = change(&r, "kubelet.config.evictionHard[\"memory.available\"]");
    assert!(!ev.covered);
    assert!(
        ev.reason
            .starts_with(&format!("KubeletConfiguration drop-in {DIR}/20-site.conf")),
        "{}",
        ev.reason
    );
    let cd = change(&r, "kubelet.config.clusterDomain");
    assert!(cd.covered, "{}", cd.reason);
    node.stop();
}

/// Without `--config-dir` the same drop-ins are not the kubelet's: the field is covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_ins_without_config_dir_do_not_count() {
    let mut node = Node::new("ubuntu-2404-grub");
    with_config_dir(&node);
    std::fs::write(node.path("/etc/default/kubelet"), "KUBELET_EXTRA_ARGS=\n").unwrap();
    node.start();
    let r = coverage(
        &node,
        "kubelet:\n  config:\n    imageGCHighThresholdPercent: 85\n",
    )
    .await;
    let gc = change(&r, "kubelet.config.imageGCHighThresholdPercent");
    assert!(gc.covered, "{}", gc.reason);
    node.stop();
}
