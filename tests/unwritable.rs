//! Coverage approves only what the apply can write (issue 27 §3), black box: a managed
//! target with the immutable or append-only attribute (`chattr`), or in a directory
//! with it, is not covered, naming the attribute and the fix; nothing is written. (Too
//! little space is `inplace_node::sysroot::writable`'s unit test; a read-only mount
//! needs a mount namespace the tests do not have.)

mod common;
use common::*;
use std::process::Command;

/// `chattr <flag> <path>`; the attribute is cleared again when the guard drops, so the
/// temporary directory can be removed.
struct Attr(std::path::PathBuf, &'static str);

impl Attr {
    fn set(path: std::path::PathBuf, set: &'static str, clear: &'static str) -> Attr {
        let o = Command::new("chattr").arg(set).arg(&path).output().unwrap();
        assert!(
            o.status.success(),
            "chattr {set}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        Attr(path, clear)
    }
}

impl Drop for Attr {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg(self.1).arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immutable_and_append_only_targets_are_not_covered() {
    let mut node = Node::new("ubuntu-2404-grub");
    let flags = node.path("/var/lib/kubelet/kubeadm-flags.env");
    let before = std::fs::read(&flags).unwrap();
    node.start();
    let yaml = "kubelet:\n  flags:\n    max-pods: \"250\"\n";
    {
        let _i = Attr::set(flags.clone(), "+i", "-i");
        let r = coverage(&node, yaml).await;
        let c = change(&r, "kubelet.flags[max-pods]");
        assert!(!c.covered);
        assert_eq!(
            c.reason,
            "/var/lib/kubelet/kubeadm-flags.env can not be written: the file /var/lib/kubelet/kubeadm-flags.env has the immutable attribute (chattr +i): it can not be replaced, changed or removed, not even by root; clear it with `chattr -i /var/lib/kubelet/kubeadm-flags.env` if the change is meant"
        );
        let (code, msg) = refusal(&node, yaml).await;
        assert_eq!(code, tonic::Code::FailedPrecondition, "{msg}");
        assert!(msg.contains("immutable attribute"), "{msg}");
    }
    {
        let _a = Attr::set(node.path("/var/lib/kubelet"), "+a", "-a");
        let r = coverage(&node, yaml).await;
        let c = change(&r, "kubelet.flags[max-pods]");
        assert!(!c.covered);
        assert!(
            c.reason.starts_with("/var/lib/kubelet/kubeadm-flags.env can not be written: its directory /var/lib/kubelet has the append-only attribute (chattr +a)"),
            "{}",
            c.reason
        );
    }
    assert_eq!(
        std::fs::read(&flags).unwrap(),
        before,
        "nothing was written"
    );
    // without the attributes the same change is covered
    let r = coverage(&node, yaml).await;
    assert!(change(&r, "kubelet.flags[max-pods]").covered);
}

/// A managed file with more than one hard link is named in the reason, with what the
/// apply and a revert do to the other links (issue 27 §4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_linked_target_is_named() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::hard_link(
        node.path("/var/lib/kubelet/kubeadm-flags.env"),
        node.path("/var/lib/kubelet/kubeadm-flags.env.link"),
    )
    .unwrap();
    node.start();
    let r = coverage(&node, "kubelet:\n  flags:\n    max-pods: \"250\"\n").await;
    let c = change(&r, "kubelet.flags[max-pods]");
    assert!(c.covered, "{}", c.reason);
    assert!(
        c.reason.ends_with("; /var/lib/kubelet/kubeadm-flags.env has 2 hard links: the apply replaces it with a new file, so the other 1 link(s) keep the old content, and a revert does not link them again"),
        "{}",
        c.reason
    );
}
