//! The Machine's (or MachineSet template's) Kubernetes `version`.

use serde_json::Value;

use super::{DiffUnit, get, toks};
use inplace_wire::pb;

/// The agent change id of a Kubernetes version change.
pub const VERSION_ID: &str = inplace_wire::ids::KUBERNETES_VERSION;

/// The unit of a `version` change (Machine `spec.version`, MachineSet
/// `spec.template.spec.version`): copied verbatim, covered when the node covers
/// `kubernetes.version`. Blocked when the desired version is not a release version, and
/// for a MachineSet (whose Machines' nodes are not asked) when the version skew policy
/// forbids the step from the template's current version.
pub(super) fn version_unit(current: &Value, desired: &Value, root: &[&str]) -> DiffUnit {
    let t = toks(root, &["version"]);
    let ver = |v: &Value| {
        get(v, &t)
            .and_then(Value::as_str)
            .map(inplace_wire::k8s_version::Version::parse)
    };
    let unit = DiffUnit {
        ids: vec![VERSION_ID.to_string()],
        ..DiffUnit::open(&t)
    };
    match (ver(current), ver(desired)) {
        (_, None) => DiffUnit::blocked(&t, "the desired version is removed"),
        (_, Some(Err(e))) => DiffUnit::blocked(&t, e),
        (Some(Ok(from)), Some(Ok(to))) if root.len() > 1 => {
            match inplace_wire::k8s_version::skew(from, to, false) {
                Ok(_) => unit,
                Err(e) => DiffUnit::blocked(&t, e),
            }
        }
        _ => unit,
    }
}

/// The desired version when `version` differs: what the node's coverage is asked about.
pub fn version_delta(current: &Value, desired: &Value, root: &[&str]) -> Option<pb::Kubernetes> {
    let t = toks(root, &["version"]);
    let d = get(desired, &t).and_then(Value::as_str)?;
    (get(current, &t).and_then(Value::as_str) != Some(d)).then(|| pb::Kubernetes {
        version: d.to_string(),
    })
}
