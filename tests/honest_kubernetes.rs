//! Honest phases of a Kubernetes upgrade that fails (issue 27 §1), black box: on a
//! control-plane node `kubeadm upgrade node` changes what the agent can not undo (the
//! static Pods and etcd), so a failure after it is an incomplete roll-back (`Failed`),
//! never `RolledBack`; a crash in the middle of an upgrade is settled `Failed` at start-up
//! with the step it reached, because the journal can not put the binaries back.

mod common;

use common::k8s::{Mirror, install_standins, url_config};
use common::*;
use inplace_wire::pb::Phase;

const TO_135: &str = "kubernetes:\n  version: v1.35.2\n";

fn manifest(component: &str, version: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {component}\n  namespace: kube-system\nspec:\n  containers:\n  - command:\n    - {component}\n    image: registry.k8s.io/{component}:{version}\n    name: {component}\n"
    )
}

#[tokio::test]
async fn a_failed_kubeadm_upgrade_node_on_a_control_plane_is_an_incomplete_roll_back() {
    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    let mut node = Node::new("ubuntu-2404-grub");
    install_standins(&mut node, "v1.34.3");
    std::fs::write(&node.config, url_config(&mirror)).unwrap();
    let dir = node.path("/etc/kubernetes/manifests");
    std::fs::create_dir_all(&dir).unwrap();
    for c in inplace_agent::kubernetes::CONTROL_PLANE_COMPONENTS {
        std::fs::write(dir.join(format!("{c}.yaml")), manifest(c, "v1.34.3")).unwrap();
    }
    std::fs::create_dir_all(node.path("/etc/standin")).unwrap();
    std::fs::write(node.path("/etc/standin/kubeadm-upgrade-fails"), "").unwrap();
    let config_before = node.read("/var/lib/kubelet/config.yaml");
    node.start();
    let op = apply(&node, TO_135, "cp-fail").await;
    assert_eq!(op.phase, Phase::Failed as i32, "{}", op.message);
    assert!(
        op.message.contains(
            "roll-back incomplete: not undone: kubeadm upgrade node upgraded the control-plane static Pods (/etc/kubernetes/manifests) and etcd"
        ),
        "{}",
        op.message
    );
    // what could be undone was: the kubelet config kubeadm half-wrote, the kubeadm binary
    assert_eq!(node.read("/var/lib/kubelet/config.yaml"), config_before);
    assert!(
        op.actions
            .contains(&"rollback: restored /var/lib/kubelet/config.yaml".to_string()),
        "{:?}",
        op.actions
    );
    let s = status(&node).await;
    assert!(
        s.problems
            .iter()
            .any(|p| p.starts_with("operation cp-fail: roll-back incomplete")),
        "{:?}",
        s.problems
    );
}

/// The journal can not record a step of the upgrade (the state directory full when the
/// step's durable marker is written, failpoint `effect-marker-enospc` on the second
/// marker, `kubeadm upgrade node`): the step is not begun, and what was done before it
/// (kubeadm installed) is undone. Before the fix the step ran unrecorded, and a crash in
/// it would have been recovered as an operation that never began the upgrade.
#[tokio::test]
async fn a_step_the_journal_can_not_record_is_not_begun() {
    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    let mut node = Node::new("ubuntu-2404-grub");
    install_standins(&mut node, "v1.34.3");
    std::fs::write(&node.config, url_config(&mirror)).unwrap();
    let config_before = node.read("/var/lib/kubelet/config.yaml");
    let kubeadm_before = std::fs::read(node.path("/usr/bin/kubeadm")).unwrap();
    node.failpoints = Some("effect-marker-enospc:2".into());
    node.start();
    let op = apply(&node, TO_135, "unrecorded").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{}", op.message);
    assert!(
        op.message
            .contains("the journal could not record the step \"kubernetes: kubeadm upgrade node\""),
        "{}",
        op.message
    );
    // `kubeadm upgrade node` never ran (the stand-in appends to the kubelet config)
    assert_eq!(node.read("/var/lib/kubelet/config.yaml"), config_before);
    assert_eq!(
        std::fs::read(node.path("/usr/bin/kubeadm")).unwrap(),
        kubeadm_before
    );
    assert!(
        !op.actions.iter().any(|a| a.contains("upgrade node")),
        "{:?}",
        op.actions
    );
}

#[tokio::test]
async fn a_crash_during_an_upgrade_is_settled_failed_naming_the_step() {
    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    let mut node = Node::new("ubuntu-2404-grub");
    install_standins(&mut node, "v1.34.3");
    std::fs::write(&node.config, url_config(&mirror)).unwrap();
    node.die_at("kubernetes-step", TO_135).await;
    node.start();
    let op = node.settle("crash").await;
    assert_eq!(op.phase, Phase::Failed as i32, "{}", op.message);
    assert!(
        op.message.contains(
            "roll-back incomplete: a Kubernetes upgrade had begun (last step: upgrading kubeadm to v1.35.2)"
        ),
        "{}",
        op.message
    );
    assert!(
        op.message
            .contains("the previous binaries are kept in /var/lib/inplaced-kubernetes/previous"),
        "{}",
        op.message
    );
    let s = status(&node).await;
    assert!(
        s.problems
            .iter()
            .any(|p| p.starts_with("operation crash: roll-back incomplete")),
        "{:?}",
        s.problems
    );
}

/// A crash after the upgrade completed, the files were written and the units acted on
/// (failpoint `act`) is still a Kubernetes upgrade the journal can not undo: the engine's
/// own markers (`written`, `acted`) must not hide the upgrade's, or the roll-back would
/// end `RolledBack` with the new binaries in place.
#[tokio::test]
async fn a_crash_after_a_completed_upgrade_is_settled_failed() {
    let (_mirror, mut node) = upgraded_then_killed_at_act().await;
    settled_incomplete(
        &mut node,
        "roll-back incomplete: a Kubernetes upgrade had begun (last step: upgraded)",
    )
    .await;
}

/// The same crash with the progress marker torn (a power cut during its write in place):
/// the marker could have been the upgrade's, so the roll-back is incomplete (Failed),
/// never `RolledBack` with the new binaries in place.
#[tokio::test]
async fn a_torn_marker_of_an_operation_with_an_upgrade_is_settled_failed() {
    let (_mirror, mut node) = upgraded_then_killed_at_act().await;
    let marker = node.state.join("journal/crash.progress");
    let sealed = std::fs::read(&marker).unwrap();
    // the first bytes of another marker over it, as a torn write leaves them
    let mut torn = sealed.clone();
    torn[sealed.len() / 2..].iter_mut().for_each(|b| *b = b'x');
    std::fs::write(&marker, &torn).unwrap();
    settled_incomplete(
        &mut node,
        "roll-back incomplete: the progress marker does not verify and the operation carried a Kubernetes upgrade",
    )
    .await;
}

/// A node upgraded from v1.34.3 to v1.35.2 (the `url` source on a mirror, kept alive by
/// the returned value) whose agent was killed at failpoint `act`, not started again.
async fn upgraded_then_killed_at_act() -> (Mirror, Node) {
    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    let mut node = Node::new("ubuntu-2404-grub");
    install_standins(&mut node, "v1.34.3");
    std::fs::write(&node.config, url_config(&mirror)).unwrap();
    node.die_at("act", TO_135).await;
    (mirror, node)
}

/// Starts the agent and asserts that the crashed operation settled Failed, saying `why`.
async fn settled_incomplete(node: &mut Node, why: &str) {
    node.start();
    let op = node.settle("crash").await;
    assert_eq!(op.phase, Phase::Failed as i32, "{}", op.message);
    assert!(op.message.contains(why), "{}", op.message);
}

/// A spec that upgrades Kubernetes and edits the kubelet's config.yaml (which `kubeadm
/// upgrade node` rewrites first) is not covered, with the reason and the fix, instead of
/// rolling back "changed since the plan" on every run; the fix works.
#[tokio::test]
async fn an_upgrade_with_an_edit_of_a_file_kubeadm_rewrites_is_not_covered() {
    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    let mut node = Node::new("ubuntu-2404-grub");
    install_standins(&mut node, "v1.34.3");
    std::fs::write(&node.config, url_config(&mirror)).unwrap();
    node.start();
    let edit = "kubelet:\n  config:\n    shutdownGracePeriod: 30s\n";
    let both = format!("{TO_135}{edit}");
    let r = coverage(&node, &both).await;
    assert!(!r.fully_covered);
    assert!(change(&r, "kubernetes.version").covered);
    let c = change(&r, "kubelet.config.shutdownGracePeriod");
    assert!(!c.covered);
    assert_eq!(
        c.reason,
        "kubeadm upgrade node (the kubernetes.version upgrade to v1.35.2, which runs first) rewrites /var/lib/kubelet/config.yaml, so this change can not be planned against it in the same operation: apply kubernetes.version alone first, then this change"
    );
    let (code, _) = refusal(&node, &both).await;
    assert_eq!(code, tonic::Code::FailedPrecondition);
    // the fix the reason gives
    let op = apply(&node, TO_135, "version").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    let op = apply(&node, &both, "then-config").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert!(
        node.read("/var/lib/kubelet/config.yaml")
            .contains("\nshutdownGracePeriod: 30s\n")
    );
}

/// The upgrade verifies the kubelet the unit runs: a drop-in whose last `ExecStart=`
/// runs another binary than the one the source installs makes the upgrade not covered,
/// naming both paths and the drop-in.
#[tokio::test]
async fn a_unit_that_runs_another_kubelet_is_not_covered() {
    let mirror = Mirror::start();
    mirror.release("v1.35.2");
    let mut node = Node::new("ubuntu-2404-grub");
    install_standins(&mut node, "v1.34.3");
    std::fs::write(&node.config, url_config(&mirror)).unwrap();
    let dir = node.path("/etc/systemd/system/kubelet.service.d");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("20-local.conf"),
        "[Service]\nExecStart=\nExecStart=/opt/k8s/bin/kubelet $KUBELET_KUBEADM_ARGS\n",
    )
    .unwrap();
    node.start();
    let r = coverage(&node, TO_135).await;
    let c = change(&r, "kubernetes.version");
    assert!(!c.covered);
    assert_eq!(
        c.reason,
        "the kubelet unit runs /opt/k8s/bin/kubelet (the effective ExecStart= is in /etc/systemd/system/kubelet.service.d/20-local.conf), not /usr/bin/kubelet, which the upgrade installs: the running kubelet would not change; point [kubernetes] bin_dir at /opt/k8s/bin/kubelet's directory or the unit at /usr/bin/kubelet"
    );
    // a drop-in sorted before kubeadm's 10-kubeadm.conf is overridden by it: covered
    std::fs::rename(dir.join("20-local.conf"), dir.join("05-local.conf")).unwrap();
    let r = coverage(&node, TO_135).await;
    assert!(change(&r, "kubernetes.version").covered, "{:?}", r.changes);
}
