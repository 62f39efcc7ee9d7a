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
//! [`Upgrade`] the engine runs before every other section's ([`crate::kubernetes::upgrade`]).

pub mod observe;

use crate::config::Config;
use crate::kubernetes as k8s;
use crate::kubernetes::upgrade::Upgrade;
use crate::kubernetes::{CONTROL_PLANE_COMPONENTS, SourceKind};
use crate::sections::kit::change::{ChangeBuilder, disruption};
use crate::sections::kit::observe::{NodeView, ObserveError, observe_running};
use crate::sections::kit::{Input, Output, Section};
use crate::sections::kubernetes::observe::KubernetesObs;
use crate::sections::model::Observed;
use inplace_wire::pb;
use inplace_wire::pb::{ChangeOperation, DisruptionLevel};
use inplace_wire::{k8s_version::Step, k8s_version::Version};

/// The `kubernetes` section.
#[derive(Debug)]
pub struct Kubernetes;

/// The change id.
pub const ID: &str = "kubernetes.version";

fn version_of(node: &NodeView<'_>, bin: &str, args: &[&str]) -> Result<String, String> {
    let path = node.config.kubernetes.bin_path(bin);
    match node.root.stat(&path) {
        Ok(Some(_)) => {}
        Ok(None) => return Err(format!("{path} is absent")),
        Err(e) => return Err(e.to_string()),
    }
    let runner = node
        .runner
        .ok_or_else(|| format!("{path}: no command runner to ask its version"))?;
    let mut argv = vec![path];
    argv.extend(args.iter().map(|s| s.to_string()));
    runner.query(&argv).map_err(|e| e.to_string())
}

fn manifests_dir(config: &Config) -> String {
    config
        .kubernetes
        .manifests_dir
        .trim_end_matches('/')
        .to_string()
}

/// Longest a checksum `HEAD` of coverage may take, in seconds.
const HEAD_TIMEOUT_SECS: u64 = 5;

/// [`k8s::fetch::preflight`] of `to` (`source = "url"`): signed upstream, the trust
/// anchor readable, each binary's `.sha256`, `.sig` and `.cert` answering a HEAD.
fn checksums(config: &Config, to: Version) -> Result<(), String> {
    let kc = &config.kubernetes;
    if kc.url.is_empty() {
        return Err("kubernetes.url is empty; give the release layout's URL template".into());
    }
    // coverage must answer within the caller's deadline: a short timeout for the HEADs
    let quick = k8s::KubernetesConfig {
        timeout_secs: kc.timeout_secs.min(HEAD_TIMEOUT_SECS),
        ..kc.clone()
    };
    let client = k8s::fetch::Client::new(&quick).map_err(|e| e.to_string())?;
    k8s::fetch::preflight(&client, kc, to)
}

impl Section for Kubernetes {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    fn observe(&self, node: &NodeView<'_>, obs: &mut Observed) -> Result<(), ObserveError> {
        let Some(want) = node.desired.kubernetes else {
            return Ok(());
        };
        let config = node.config;
        let kubelet = version_of(node, "kubelet", &["--version"])
            .and_then(|o| k8s::parse_kubelet_version(&o));
        let kubeadm = version_of(node, "kubeadm", &["version", "-o", "short"])
            .and_then(|o| k8s::parse_kubeadm_version(&o));
        let mut missing = Vec::new();
        for p in [&config.kubelet.config_path, &config.kubelet.flags_path] {
            if !matches!(node.root.stat(p), Ok(Some(_))) {
                missing.push(p.clone());
            }
        }
        let dir = manifests_dir(config);
        let apiserver = format!("{dir}/kube-apiserver.yaml");
        let control_plane = matches!(node.root.stat(&apiserver), Ok(Some(_)));
        let mut manifests = Vec::new();
        if control_plane {
            for c in CONTROL_PLANE_COMPONENTS {
                let path = format!("{dir}/{c}.yaml");
                // unknown is not empty: a manifest that can not be read names no tag
                let tags = observe_running(node.root, &path).map(|text| {
                    k8s::manifest_tags(&text)
                        .into_iter()
                        .filter(|(img, _)| img.ends_with(c))
                        .map(|(_, t)| t)
                        .collect()
                });
                if let Err(u) = &tags {
                    obs.unknown.push(u.clone());
                }
                manifests.push((path, tags));
            }
        }
        let upgrading = kubelet.as_ref().is_ok_and(|v| *v != want.version);
        let checksums = (config.kubernetes.source == SourceKind::Url && upgrading)
            .then(|| checksums(config, want.version));
        obs.kubernetes = Some(KubernetesObs {
            kubelet,
            kubeadm,
            missing_kubeadm_files: missing,
            control_plane,
            manifests,
            checksums,
        });
        Ok(())
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
                out.steps.kubernetes = Some(Upgrade {
                    from,
                    to,
                    control_plane: obs.control_plane,
                    kubelet_files: vec![
                        config.kubelet.config_path.clone(),
                        config.kubelet.flags_path.clone(),
                    ],
                });
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
