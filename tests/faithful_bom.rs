//! Faithful edits of files that start with a UTF-8 byte-order mark (issue 27 §6), black
//! box: a KubeletConfiguration with a BOM gets a new field inserted as in a file without
//! one, every other field of the spec stays covered, and the BOM and every other byte
//! are kept.

mod common;
use common::*;
use inplace_wire::pb::Phase;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_configuration_with_a_bom_gets_new_fields_and_keeps_the_bom() {
    let mut node = Node::new("ubuntu-2404-grub");
    let plain = node.read("/var/lib/kubelet/config.yaml");
    std::fs::write(
        node.path("/var/lib/kubelet/config.yaml"),
        format!("\u{feff}{plain}"),
    )
    .unwrap();
    node.start();
    let yaml =
        "kubelet:\n  config:\n    serializeImagePulls: false\n    shutdownGracePeriod: 30s\n";
    let r = coverage(&node, yaml).await;
    for id in [
        "kubelet.config.serializeImagePulls",
        "kubelet.config.shutdownGracePeriod",
    ] {
        let c = change(&r, id);
        assert!(c.covered, "{id}: {}", c.reason);
    }
    let op = apply(&node, yaml, "bom").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    let after = node.read("/var/lib/kubelet/config.yaml");
    assert!(after.starts_with('\u{feff}'), "the BOM is kept: {after:?}");
    // every line of the file before is still there, in order; the new field is added
    let kept: Vec<&str> = after
        .trim_start_matches('\u{feff}')
        .lines()
        .filter(|l| {
            !l.starts_with("serializeImagePulls:") && !l.starts_with("shutdownGracePeriod:")
        })
        .collect();
    let before: Vec<&str> = plain
        .lines()
        .filter(|l| {
            !l.starts_with("serializeImagePulls:") && !l.starts_with("shutdownGracePeriod:")
        })
        .collect();
    assert_eq!(kept, before);
    assert!(after.contains("\nserializeImagePulls: false\n"), "{after}");
    assert!(after.contains("\nshutdownGracePeriod: 30s\n"), "{after}");
}
