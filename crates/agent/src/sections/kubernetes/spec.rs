//! The `kubernetes` section's part of the NodeSpec: the node's Kubernetes version
//! (`v1.35.2`, [`inplace_wire::k8s_version::Version`]), set by one source only, hashed
//! only when set.

use inplace_wire::k8s_version::Version;
use inplace_wire::names::SpecError;
use inplace_wire::pb;

/// The validated Kubernetes version (`kubernetes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubernetesSpec {
    /// The target version.
    pub version: Version,
}

/// Which source set the version (`kubernetes`, `dropins[<name>].kubernetes`), for errors
/// naming both.
pub(crate) type Sources = Option<String>;

/// Validates the wire `kubernetes` of one document: None when it is absent or names no
/// version (the version is then not managed). Errors name `kubernetes.version`.
pub(crate) fn from_pb(p: Option<&pb::Kubernetes>) -> Result<Option<KubernetesSpec>, SpecError> {
    let Some(k) = p.filter(|k| !k.version.is_empty()) else {
        return Ok(None);
    };
    let version =
        Version::parse(&k.version).map_err(|m| SpecError::new("kubernetes.version", m))?;
    Ok(Some(KubernetesSpec { version }))
}

/// Merges the version of a source found under `prefix` into `spec`: set by two sources
/// is an error naming both, even with the same version.
pub(crate) fn merge(
    sources: &mut Sources,
    spec: &mut Option<KubernetesSpec>,
    part: Option<KubernetesSpec>,
    prefix: &str,
) -> Result<(), SpecError> {
    let Some(k) = part else {
        return Ok(());
    };
    let src = format!("{prefix}kubernetes");
    if let Some(other) = sources {
        return Err(SpecError::new(
            format!("{src}.version"),
            format!("kubernetes.version is already set by {other}; set it once"),
        ));
    }
    *sources = Some(src);
    *spec = Some(k);
    Ok(())
}

/// The section's part of the canonical hash: `kubernetes`, the version, only when set
/// (so the hash of a spec without it is what it always was).
pub(crate) fn hash(k: Option<&KubernetesSpec>, v: &mut serde_json::Map<String, serde_json::Value>) {
    if let Some(k) = k {
        v.insert(
            "kubernetes".into(),
            serde_json::json!(k.version.to_string()),
        );
    }
}
