//! The `kubernetes` section (change id `kubernetes.version`): the node's Kubernetes
//! version, upgraded in place with kubeadm.
//!
//! The node's version is its kubelet's (`kubelet --version`, what CAPI compares with the
//! Machine's `spec.version`); kubeadm's (`kubeadm version -o short`) and, on a
//! control-plane node, the image tags of the static Pod manifests are observed too.
//! Coverage tells the truth: not covered when the skew policy forbids the step
//! ([`inplace_wire::k8s_version::skew`]), when kubeadm did not set the node up (no kubelet
//! config or kubeadm flags file), when no source is configured, or when the `url`
//! source can not verify the version (no upstream signature before v1.26, no trust
//! anchor, or no checksum, signature or certificate file: HEAD requests, no side
//! effects).
//!
//! Disruption: `drain` for a minor upgrade (the upgrade guide drains before it) and on a
//! control-plane node, a kubelet restart for a patch upgrade on a worker; a
//! `[[disruption]]` rule matching the kubelet binary's path wins. The steps are one
//! effect, [`effects::UpgradeKubernetes`], which the engine runs before every other
//! section's steps ([`crate::kubernetes::upgrade`]).

pub(crate) mod diff;
pub(crate) mod effects;
pub(crate) mod observe;
pub(crate) mod spec;
#[cfg(test)]
mod tests;
pub(crate) mod unit;

use crate::config::Config;
use crate::kubernetes as k8s;
use crate::kubernetes::SourceKind;
use crate::kubernetes::upgrade::Upgrade;
use crate::sections::kit::change::{ChangeBuilder, disruption};
use crate::sections::kit::observe::{NodeView, ObserveError};
use crate::sections::kit::{Input, Output, Section};
use crate::sections::kubernetes::observe::KubernetesObs;
use crate::sections::model::Observed;
use effects::UpgradeKubernetes;
use inplace_wire::pb;
use inplace_wire::pb::{ChangeOperation, DisruptionLevel};
use inplace_wire::{k8s_version::Step, k8s_version::Version};

/// The `kubernetes` section.
#[derive(Debug)]
pub(crate) struct Kubernetes;

/// The change id.
pub(crate) const ID: &str = inplace_wire::ids::KUBERNETES_VERSION;

/// The static Pod manifests' directory, without a trailing `/`.
pub(super) fn manifests_dir(config: &Config) -> String {
    config
        .kubernetes
        .manifests_dir
        .trim_end_matches('/')
        .to_string()
}

impl Section for Kubernetes {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    fn observe(&self, node: &NodeView<'_>, obs: &mut Observed) -> Result<(), ObserveError> {
        observe::read(node, obs)
    }

    fn diff(&self, input: &Input<'_>, out: &mut Output) {
        let (Some(want), Some(obs)) = (input.desired.kubernetes, &input.obs.kubernetes) else {
            return;
        };
        let to = want.version;
        let config = input.config;
        let unit = config.kubelet.unit.as_str();
        let mut change = ChangeBuilder {
            id: ID.into(),
            op: ChangeOperation::Update,
            before: String::new(),
            after: to.to_string(),
            covered: Err(String::new()),
            disruption: disruption(DisruptionLevel::Drain, &[unit]),
            targets: targets(config, obs),
        };
        let from = match &obs.kubelet {
            Ok(v) => *v,
            Err(e) => {
                change.before = "unknown".into();
                change.covered = Err(format!("the node's Kubernetes version is not known: {e}"));
                out.push(change);
                return;
            }
        };
        change.before = from.to_string();
        let step = inplace_wire::k8s_version::skew(from, to, config.kubernetes.allow_downgrade);
        if step == Ok(Step::Same) {
            if let Some(c) = stale_manifest(obs, to) {
                change.covered = Err(c);
                out.push(change);
            }
            return;
        }
        let (d, why_d) = node_disruption(config, obs, step.as_ref().ok().copied());
        change.disruption = d;
        match refusal(config, obs, step) {
            Some(why) => change.covered = Err(why),
            None => {
                let reason = covered_reason(config, obs, from, to, &why_d);
                out.steps.effect(UpgradeKubernetes(Upgrade {
                    from,
                    to,
                    control_plane: obs.control_plane,
                    kubelet_files: vec![
                        config.kubelet.config_path.clone(),
                        config.kubelet.flags_path.clone(),
                    ],
                }));
                out.changes.push(
                    ChangeBuilder {
                        covered: Ok(&reason),
                        ..change
                    }
                    .build(),
                );
                return;
            }
        }
        out.push(change);
    }
}

/// Node paths the upgrade touches.
fn targets(config: &Config, obs: &KubernetesObs) -> Vec<String> {
    let mut t: Vec<String> = config
        .kubernetes
        .binaries()
        .iter()
        .map(|b| config.kubernetes.bin_path(b))
        .collect();
    t.push(config.kubelet.config_path.clone());
    t.push(config.kubelet.flags_path.clone());
    if obs.control_plane {
        t.push(manifests_dir(config));
    }
    t
}

/// On a control-plane node whose kubelet is at the target: a manifest naming another tag.
fn stale_manifest(obs: &KubernetesObs, to: Version) -> Option<String> {
    let want = to.to_string();
    obs.manifests.iter().find_map(|(path, tags)| match tags {
        Err(u) => Some(format!(
            "the kubelet runs {want} but {u}, so whether the control plane runs {want} too can not be told"
        )),
        Ok(tags) if !tags.contains(&want) => Some(format!(
            "the kubelet runs {want} but {path} names {}; run kubeadm upgrade node by hand or re-provision",
            if tags.is_empty() { "no image tag".to_string() } else { tags.join(", ") }
        )),
        Ok(_) => None,
    })
}

/// Why the upgrade is not covered, in the order a user fixes things.
fn refusal(config: &Config, obs: &KubernetesObs, step: Result<Step, String>) -> Option<String> {
    if !obs.missing_kubeadm_files.is_empty() {
        return Some(format!(
            "the node was not set up by kubeadm ({} missing); inplaced upgrades kubeadm nodes only",
            obs.missing_kubeadm_files.join(", ")
        ));
    }
    if config.kubernetes.source == SourceKind::None {
        return Some(
            "no source for the Kubernetes binaries is configured: set [kubernetes] source = \"url\", \"apt\" or \"dnf\" in the agent config".into(),
        );
    }
    if let Err(e) = step {
        return Some(e);
    }
    if let Err(e) = &obs.kubeadm {
        return Some(format!("kubeadm is needed for the upgrade: {e}"));
    }
    if let Some(why) = &obs.other_kubelet {
        return Some(why.clone());
    }
    match &obs.checksums {
        Some(Err(e)) => Some(e.clone()),
        _ => None,
    }
}

/// The disruption of the upgrade and why: a `[[disruption]]` rule on the kubelet
/// binary's path, else drain (minor, control plane) or a kubelet restart (patch).
fn node_disruption(
    config: &Config,
    obs: &KubernetesObs,
    step: Option<Step>,
) -> (pb::Disruption, String) {
    let unit = config.kubelet.unit.as_str();
    let kubelet = config.kubernetes.bin_path("kubelet");
    if let Some(rule) = config.disruption_for(&kubelet) {
        let units: Vec<&str> = rule.units.iter().map(String::as_str).collect();
        return (
            disruption(rule.action.level(), &units),
            format!("disruption rule {:?} applies", rule.path),
        );
    }
    if obs.control_plane {
        return (
            disruption(DisruptionLevel::Drain, &[unit]),
            "drain first: a control-plane node's static Pods are replaced".into(),
        );
    }
    match step {
        Some(Step::Patch) => (
            disruption(DisruptionLevel::Restart, &[unit]),
            "a patch upgrade of a worker: kubelet restart".into(),
        ),
        _ => (
            disruption(DisruptionLevel::Drain, &[unit]),
            "drain first: the upgrade guide drains a node before a minor kubelet upgrade".into(),
        ),
    }
}

fn covered_reason(
    config: &Config,
    obs: &KubernetesObs,
    from: Version,
    to: Version,
    why_d: &str,
) -> String {
    let kc = &config.kubernetes;
    let source = match kc.source {
        SourceKind::Url => format!(
            "binaries from {}, {}",
            k8s::fetch::redact_url(&kc.url),
            k8s::fetch::describe(kc)
        ),
        SourceKind::Apt => format!(
            "apt packages pinned to {}-{}",
            to.bare(),
            kc.package_revision
        ),
        SourceKind::Dnf => format!("dnf packages pinned to {}", to.bare()),
        SourceKind::None => String::new(),
    };
    let role = if obs.control_plane {
        "control-plane node: static Pods and etcd from the cluster's ClusterConfiguration"
    } else {
        "worker: the kubelet configuration"
    };
    format!(
        "{from} → {to} with kubeadm upgrade node ({role}); {source}; previous binaries and kubelet files restored on failure; {why_d}"
    )
}
