//! Kubernetes release versions as CAPI names them (`v1.35.2`) and what the [Kubernetes
//! version skew policy] allows between two of them: the agent refuses an upgrade with
//! [`skew`], the extension decides coverage with it.
//!
//! [Kubernetes version skew policy]: https://kubernetes.io/releases/version-skew-policy/

/// The skew policy's page, named in refusals.
pub const SKEW_POLICY: &str = "https://kubernetes.io/releases/version-skew-policy/";

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
}
