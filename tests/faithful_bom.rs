//! Faithful edits of files that start with a UTF-8 byte-order mark (issue 27 §6), black
//! box: a KubeletConfiguration with a BOM gets a new field inserted as in a file without
//! one, every other field of the spec stays covered, and the BOM and every other byte
//! are kept; a BLS entry is edited as without it and keeps it; chrony.conf, which
//! chronyd can not read with a BOM, is refused naming it and left as it is. The other
//! editors' members of the class are unit-tested in crates/formats (sysctl.d, the kubelet
//! flags file, /etc/default/grub, grubenv).

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

/// chrony.conf with a BOM: chronyd stops at line 1 ("Invalid directive"), so the ntp
/// change is not covered, naming the mark and the fix, and the file stays byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chrony_conf_with_a_bom_is_refused_for_chronyds_reason_and_kept() {
    let mut node = Node::new("rhel8-grubenv");
    let plain = node.read("/etc/chrony.conf");
    let bom = format!("\u{feff}{plain}");
    std::fs::write(node.path("/etc/chrony.conf"), &bom).unwrap();
    node.start();
    let yaml = "ntp:\n  servers: [ntp2.example.invalid]\n";
    let r = coverage(&node, yaml).await;
    let c = change(&r, "ntp");
    assert!(!c.covered, "{c:?}");
    assert_eq!(
        c.reason,
        "/etc/chrony.conf starts with a UTF-8 byte-order mark (EF BB BF), which chronyd does not skip: it reads line 1 (\"# Use public servers from the pool.ntp.o\") as the directive \"\\u{feff}#\" and stops with \"Invalid directive at line 1\" (a comment too, chrony knows one only by its first character); nothing was changed: remove the byte-order mark"
    );
    let refused = apply_refused(&node, yaml, "chrony-bom").await;
    assert!(
        refused.message().contains("byte-order mark"),
        "{}",
        refused.message()
    );
    assert_eq!(node.read("/etc/chrony.conf"), bom);
    assert!(node.actions().is_empty(), "{:?}", node.actions());
}

/// A Boot Loader Specification entry whose `title` line carries a BOM: the options are
/// edited as in the entry without it, and the BOM is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bls_entry_with_a_bom_gets_its_options_edited_and_keeps_the_bom() {
    let entry = "/boot/loader/entries/60427531c86a90c5034f2e849abe07c5-6.15.9-201.fc41.x86_64.conf";
    let mut node = Node::new("fedora-41-bls");
    let plain = node.read(entry);
    std::fs::write(node.path(entry), format!("\u{feff}{plain}")).unwrap();
    std::fs::write(&node.config, "[kernel_args]\ntrial = false\n").unwrap();
    node.start();
    let yaml = "kernelArgs: [\"isolcpus=2-7\"]\n";
    let c = coverage(&node, yaml).await;
    assert!(change(&c, "kernelArgs[isolcpus]").covered, "{c:?}");
    let op = apply(&node, yaml, "bls-bom").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{}", op.message);
    let want = plain.replace(
        "transparent_hugepage=madvise\n",
        "transparent_hugepage=madvise isolcpus=2-7\n",
    );
    assert_ne!(want, plain);
    assert_eq!(node.read(entry), format!("\u{feff}{want}"));
}
