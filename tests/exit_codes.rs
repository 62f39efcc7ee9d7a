//! `inplacectl` exit codes for a spec the agent would refuse (issue 27 §5), black box:
//! `coverage`, `apply --dry-run` and `apply` of the same spec agree (3: refused, 0:
//! covered), and the refusing dry run still prints every change with its reason.

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coverage_dry_run_and_apply_agree_on_a_refused_spec() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    // --max-pods in kubeadm-flags.env overrides the field: not covered
    let refused = node.spec("refused.yaml", "kubelet:\n  config:\n    maxPods: 250\n");
    let o = node.ctl(&["coverage", "-f", &refused]);
    assert_eq!(o.status.code(), Some(3), "{}{}", out(&o), err(&o));
    let o = node.ctl(&["apply", "--dry-run", "-f", &refused]);
    assert_eq!(o.status.code(), Some(3), "{}{}", out(&o), err(&o));
    assert!(out(&o).contains("apply would be refused"), "{}", out(&o));
    assert!(out(&o).contains("--max-pods"), "{}", out(&o));
    let o = node.ctl(&["apply", "--dry-run", "-o", "json", "-f", &refused]);
    assert_eq!(o.status.code(), Some(3), "{}{}", out(&o), err(&o));
    let o = node.ctl(&["apply", "-f", &refused]);
    assert_eq!(o.status.code(), Some(3), "{}{}", out(&o), err(&o));
    assert!(err(&o).contains("not covered"), "{}", err(&o));
    assert!(node.operations().await.is_empty(), "nothing was started");

    let covered = node.spec("covered.yaml", "sysctls:\n  vm.swappiness: \"10\"\n");
    for args in [
        vec!["coverage", "-f", &covered],
        vec!["apply", "--dry-run", "-f", &covered],
        vec!["apply", "--wait", "-f", &covered],
    ] {
        let o = node.ctl(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}{}", out(&o), err(&o));
    }
}
