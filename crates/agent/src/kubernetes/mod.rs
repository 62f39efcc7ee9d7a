//! Kubernetes version upgrades in place: the domain rules, free of I/O.
//!
//! - [`Version`]: a release version as CAPI names it (`v1.35.2`, the `v` optional).
//! - [`skew`]: what the [Kubernetes version skew policy] and `kubeadm upgrade` allow
//!   from the node's version to the target: a patch or exactly one minor up; never a
//!   skipped minor; a downgrade only when the agent config allows it.
//! - [`parse_kubelet_version`], [`parse_kubeadm_version`]: the output of
//!   `kubelet --version` (`Kubernetes v1.34.3`) and `kubeadm version -o short`
//!   (`v1.34.3`).
//! - [`manifest_tags`]: the image tags a static Pod manifest names
//!   (`image: registry.k8s.io/kube-apiserver:v1.35.2`).
//!
//! The agent config's `[kubernetes]` table is [`config::KubernetesConfig`]; the sources of
//! the binaries are [`source`], the streamed download and checksum check [`fetch`], the
//! check of upstream's sigstore signatures [`signature`], the steps of an upgrade and
//! their rollback [`upgrade`].
//!
//! [Kubernetes version skew policy]: https://kubernetes.io/releases/version-skew-policy/

pub mod config;
pub(crate) mod fetch;
pub(crate) mod signature;
pub(crate) mod source;
pub(crate) mod upgrade;

pub use config::{KubernetesConfig, SourceKind};

use inplace_wire::k8s_version::Version;

/// The control-plane components whose static Pod manifests name the release's image
/// tag (etcd has its own versions).
pub const CONTROL_PLANE_COMPONENTS: &[&str] = &[
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// The version in `kubelet --version` output (`Kubernetes v1.34.3`).
pub fn parse_kubelet_version(out: &str) -> Result<Version, String> {
    let word = out
        .split_whitespace()
        .find(|w| w.starts_with('v') && w.len() > 1)
        .ok_or_else(|| format!("kubelet --version printed {:?}, no version", tail(out, 200)))?;
    Version::parse(word)
}

/// The version in `kubectl version --client` output (`Client Version: v1.35.2`, then
/// `Kustomize Version: ...`; kubectl 1.28 and later print no other form by default).
pub fn parse_kubectl_version(out: &str) -> Result<Version, String> {
    let word = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Client Version:"))
        .map(str::trim)
        .ok_or_else(|| {
            format!(
                "kubectl version --client printed {:?}, no \"Client Version:\" line",
                tail(out, 200)
            )
        })?;
    Version::parse(word)
}

/// The version in `kubeadm version -o short` output (`v1.34.3`).
pub fn parse_kubeadm_version(out: &str) -> Result<Version, String> {
    let line = out.lines().map(str::trim).find(|l| !l.is_empty());
    match line {
        Some(l) => Version::parse(l),
        None => Err("kubeadm version -o short printed nothing".into()),
    }
}

/// The image tags a static Pod manifest names, in order: (image without tag, tag) for
/// each `image:` line.
pub fn manifest_tags(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.trim().trim_start_matches("- ").strip_prefix("image:"))
        .map(|v| v.trim().trim_matches('"').trim_matches('\''))
        .filter_map(|img| {
            let slash = img.rfind('/').map(|i| i + 1).unwrap_or(0);
            let colon = img[slash..].find(':')? + slash;
            Some((img[..colon].to_string(), img[colon + 1..].to_string()))
        })
        .collect()
}

/// The last `max` characters of command output, for messages (secrets never come from
/// these commands' output, which is a version or kubeadm's progress log).
pub fn tail(s: &str, max: usize) -> String {
    let t = s.trim();
    let n = t.chars().count();
    if n <= max {
        t.to_string()
    } else {
        let skip = n - max;
        format!("…{}", t.chars().skip(skip).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    #[test]
    fn command_outputs() {
        assert_eq!(
            parse_kubelet_version("Kubernetes v1.34.3\n"),
            Ok(v("v1.34.3"))
        );
        assert_eq!(parse_kubeadm_version("v1.34.3\n"), Ok(v("v1.34.3")));
        assert!(parse_kubelet_version("").is_err());
    }

    #[test]
    fn manifest_image_tags() {
        let m = "spec:\n  containers:\n  - command:\n    - kube-apiserver\n    image: registry.k8s.io/kube-apiserver:v1.34.3\n  - image: \"localhost:5000/x/kube-proxy:v1.2.3\"\n";
        assert_eq!(
            manifest_tags(m),
            vec![
                ("registry.k8s.io/kube-apiserver".into(), "v1.34.3".into()),
                ("localhost:5000/x/kube-proxy".into(), "v1.2.3".into())
            ]
        );
    }
}
