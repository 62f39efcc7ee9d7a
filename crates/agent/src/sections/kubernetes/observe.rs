//! What the `kubernetes` section observes: the versions of the node's binaries, its
//! kubeadm files and control-plane manifests, and whether the target can be verified.

use crate::config::Config;
use crate::kubernetes as k8s;
use crate::kubernetes::{CONTROL_PLANE_COMPONENTS, SourceKind};
use crate::sections::kit::observe::{NodeView, Observation, ObserveError, observe_running};
use crate::sections::model::Observed;
use inplace_wire::k8s_version::Version;

/// The node's Kubernetes as observed (`kubernetes` section).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesObs {
    /// `kubelet --version`, or why it is not known.
    pub kubelet: Result<inplace_wire::k8s_version::Version, String>,
    /// `kubeadm version -o short`, or why it is not known.
    pub kubeadm: Result<inplace_wire::k8s_version::Version, String>,
    /// kubeadm's kubelet files that are missing (a node kubeadm did not set up).
    pub missing_kubeadm_files: Vec<String>,
    /// The node has the kube-apiserver static Pod.
    pub control_plane: bool,
    /// Why the kubelet unit does not run the kubelet the upgrade installs (its effective
    /// `ExecStart=` names another program, [`super::unit`]); None when it does or
    /// when the unit can not be found.
    pub other_kubelet: Option<String>,
    /// Control-plane manifests: path → image tags named, or why the manifest is not
    /// known (absent, unreadable or empty on a control-plane node).
    pub manifests: Vec<(String, Observation<Vec<String>>)>,
    /// `source = "url"`: the target version can be verified (signed upstream, the trust
    /// anchor readable, its checksum, signature and certificate files answer a HEAD
    /// each), or why not ([`crate::kubernetes::fetch::preflight`]).
    pub checksums: Option<Result<(), String>>,
}

/// The output of `<bin> <args>` (its version), or why it can not be asked.
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

/// Longest a checksum `HEAD` of coverage may take, in seconds.
const HEAD_TIMEOUT_SECS: u64 = 5;

/// [`k8s::fetch::preflight`] of `to` (`source = "url"`): signed upstream, the trust
/// anchor readable, each binary's `.sha256`, `.sig` and `.cert` answering a HEAD.
fn checksums(config: &Config, to: Version) -> Result<(), String> {
    // the network's answer can not be looked at again: this coverage is not kept
    inplace_node::sysroot::trace::poison("asked the release's checksums over the network");
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

/// Reads the versions of the node's kubelet and kubeadm, its kubeadm files, its
/// control-plane manifests' image tags and, for `source = "url"` when the version
/// changes, whether the target can be verified; only when the spec names a version.
pub(super) fn read(node: &NodeView<'_>, obs: &mut Observed) -> Result<(), ObserveError> {
    let Some(want) = node.desired.kubernetes else {
        return Ok(());
    };
    let config = node.config;
    let kubelet =
        version_of(node, "kubelet", &["--version"]).and_then(|o| k8s::parse_kubelet_version(&o));
    let kubeadm = version_of(node, "kubeadm", &["version", "-o", "short"])
        .and_then(|o| k8s::parse_kubeadm_version(&o));
    let mut missing = Vec::new();
    for p in [&config.kubelet.config_path, &config.kubelet.flags_path] {
        if !matches!(node.root.stat(p), Ok(Some(_))) {
            missing.push(p.clone());
        }
    }
    let dir = super::manifests_dir(config);
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
        other_kubelet: super::unit::kubelet_exec_start(node.root, &config.kubelet.unit).and_then(
            |e| {
                super::unit::runs_another_kubelet(
                    node.root,
                    &e,
                    &config.kubernetes.bin_path("kubelet"),
                )
            },
        ),
        manifests,
        checksums,
    });
    Ok(())
}
