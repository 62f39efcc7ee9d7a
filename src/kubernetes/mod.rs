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
pub mod fetch;
pub mod signature;
pub mod source;
pub mod upgrade;

pub use config::{KubernetesConfig, SourceKind};

/// The skew policy's page, named in refusals.
pub const SKEW_POLICY: &str = "https://kubernetes.io/releases/version-skew-policy/";

/// The control-plane components whose static Pod manifests name the release's image
/// tag (etcd has its own versions).
pub const CONTROL_PLANE_COMPONENTS: &[&str] = &[
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// A Kubernetes release version `vMAJOR.MINOR.PATCH` (pre-releases are refused: an
/// in-place upgrade targets a release).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major version (1).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

impl Version {
    /// Parses `v1.35.2` or `1.35.2`; the error says what a version looks like.
    pub fn parse(s: &str) -> Result<Version, String> {
        let t = s.trim();
        let body = t.strip_prefix('v').unwrap_or(t);
        let parts: Vec<&str> = body.split('.').collect();
        let num = |p: &str| -> Option<u32> {
            (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .then(|| p.parse().ok())
                .flatten()
        };
        match parts.as_slice() {
            [a, b, c] => match (num(a), num(b), num(c)) {
                (Some(major), Some(minor), Some(patch)) => Ok(Version {
                    major,
                    minor,
                    patch,
                }),
                _ => Err(bad_version(s)),
            },
            _ => Err(bad_version(s)),
        }
    }

    /// The version without the `v` (`1.35.2`), as packages and the download layout's
    /// package revisions name it.
    pub fn bare(&self) -> String {
        format!("{}.{}.{}", self.major, self.minor, self.patch)
    }
}

fn bad_version(s: &str) -> String {
    format!(
        "{s:?} is not a Kubernetes release version; give vMAJOR.MINOR.PATCH such as v1.35.2 (pre-releases are not upgraded to in place)"
    )
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What an upgrade from the node's version to the target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Same version: nothing to do.
    Same,
    /// Same minor, another patch (up, or down when allowed).
    Patch,
    /// One minor up (or down when allowed).
    Minor,
}

/// Checks the skew policy for `from` → `to`: the kubelet may be upgraded a patch or one
/// minor version at a time (kubeadm upgrades "one MINOR version at a time"; skipping a
/// minor version is unsupported); a downgrade only with `allow_downgrade`. The error
/// names the policy and what to do instead.
pub fn skew(from: Version, to: Version, allow_downgrade: bool) -> Result<Step, String> {
    if from == to {
        return Ok(Step::Same);
    }
    if from.major != to.major {
        return Err(format!(
            "{from} → {to} changes the major version; the Kubernetes version skew policy ({SKEW_POLICY}) has no such upgrade"
        ));
    }
    if to < from && !allow_downgrade {
        return Err(format!(
            "{from} → {to} is a downgrade; kubeadm and the Kubernetes version skew policy ({SKEW_POLICY}) support upgrades only (set kubernetes.allow_downgrade in the agent config to allow it)"
        ));
    }
    match from.minor.abs_diff(to.minor) {
        0 => Ok(Step::Patch),
        1 => Ok(Step::Minor),
        n => Err(format!(
            "{from} → {to} skips {} minor version(s); the Kubernetes version skew policy ({SKEW_POLICY}) and kubeadm upgrade one minor version at a time: go to v{}.{}.x first",
            n - 1,
            from.major,
            if to > from {
                from.minor + 1
            } else {
                from.minor - 1
            }
        )),
    }
}

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
    fn versions_parse_with_or_without_v() {
        assert_eq!(v("v1.35.2"), v("1.35.2"));
        assert_eq!(v("v1.35.2").to_string(), "v1.35.2");
        assert_eq!(v("1.35.2").bare(), "1.35.2");
        for bad in ["v1.35", "v1.35.2-rc.0", "1.x.2", "", "v1..2"] {
            assert!(Version::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn skew_allows_patch_and_one_minor() {
        assert_eq!(skew(v("v1.34.3"), v("v1.35.2"), false), Ok(Step::Minor));
        assert_eq!(skew(v("v1.35.0"), v("v1.35.2"), false), Ok(Step::Patch));
        assert_eq!(skew(v("v1.35.2"), v("v1.35.2"), false), Ok(Step::Same));
        let e = skew(v("v1.34.3"), v("v1.36.0"), false).unwrap_err();
        assert!(
            e.contains("skips 1 minor") && e.contains(SKEW_POLICY),
            "{e}"
        );
        assert!(e.contains("v1.35.x first"), "{e}");
        let e = skew(v("v1.35.2"), v("v1.35.1"), false).unwrap_err();
        assert!(
            e.contains("downgrade") && e.contains("allow_downgrade"),
            "{e}"
        );
        assert_eq!(skew(v("v1.35.2"), v("v1.34.9"), true), Ok(Step::Minor));
        assert!(skew(v("v1.35.2"), v("v2.0.0"), false).is_err());
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
