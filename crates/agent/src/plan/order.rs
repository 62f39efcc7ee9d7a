//! Coverage in the order the apply runs (issue 27 §3): a Kubernetes upgrade runs first
//! (`Stage::BeforeFiles`) and `kubeadm upgrade node` rewrites the kubelet's
//! `config.yaml` and `kubeadm-flags.env` (and on a control-plane node the static Pod
//! manifests), so another change planned against those files as they are now would
//! find them "changed since the plan" and roll back, and a re-run would fail the same
//! way. Such a combination is not covered, with the reason and the fix.

use super::Plan;
use crate::config::Config;
use crate::sections::kubernetes::effects::UpgradeKubernetes;

/// Marks not covered every change (other than the upgrade's own) that targets a file
/// the planned Kubernetes upgrade rewrites; recomputes `fully_covered`. Pure.
pub(crate) fn refuse_rewritten(plan: &mut Plan, config: &Config) {
    let Some(up) = plan.steps.effects_of::<UpgradeKubernetes>().next() else {
        return;
    };
    let up = &up.0;
    let manifests = format!("{}/", config.kubernetes.manifests_dir.trim_end_matches('/'));
    let rewritten = |t: &str| {
        up.kubelet_files.iter().any(|f| f == t) || (up.control_plane && t.starts_with(&manifests))
    };
    for c in &mut plan.report.changes {
        if c.id == "kubernetes.version" || !c.covered {
            continue;
        }
        if let Some(t) = c.targets.iter().find(|t| rewritten(t)) {
            c.covered = false;
            c.reason = format!(
                "kubeadm upgrade node (the kubernetes.version upgrade to {}, which runs first) rewrites {t}, so this change can not be planned against it in the same operation: apply kubernetes.version alone first, then this change",
                up.to
            );
        }
    }
    plan.report.fully_covered = plan.report.changes.iter().all(|c| c.covered);
}
