//! What the `kubernetes` section observes: the versions of the node's binaries, its
//! kubeadm files and control-plane manifests, and whether the target can be verified.

use crate::sections::kit::observe::Observation;

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
    /// Control-plane manifests: path → image tags named, or why the manifest is not
    /// known (absent, unreadable or empty on a control-plane node).
    pub manifests: Vec<(String, Observation<Vec<String>>)>,
    /// `source = "url"`: the target version can be verified (signed upstream, the trust
    /// anchor readable, its checksum, signature and certificate files answer a HEAD
    /// each), or why not ([`crate::kubernetes::fetch::preflight`]).
    pub checksums: Option<Result<(), String>>,
}
