//! What the translation knows of the `bootstrap.cluster.x-k8s.io/v1beta2` types: the
//! version it reads, the members of the list entries and structs it translates, and the
//! JSON pointers of any other member (which make their unit not covered: a member the
//! node would never act on is never reported in place).

use serde_json::Value;

/// The API version the translation reads KubeadmConfigs and KubeadmConfigTemplates at.
pub const KUBEADM_API_VERSION: &str = "bootstrap.cluster.x-k8s.io/v1beta2";

/// Why a bootstrap object can not be read, if it is a KubeadmConfig(Template) at another
/// version than [`KUBEADM_API_VERSION`] (`None` for v1beta2, and for other kinds).
///
/// Upstream sends only v1beta2: KCP builds the request from its typed
/// `bootstrap/kubeadm/v1beta2` objects (`inplace_canupdatemachine.go`, `createRequest` /
/// `cleanupKubeadmConfig` set `APIVersion: bootstrapv1.GroupVersion`), and the
/// MachineDeployment path fetches the templates with
/// `external.GetObjectFromContractVersionedRef` (`machinedeployment_canupdatemachineset.go`,
/// `getTemplateObjects`), at the version the CRD declares for the v1beta2 contract. So the
/// v1beta1 shapes (a `kubeletExtraArgs` map) are not read at all: an object at v1beta1 is
/// a request CAPI does not make, answered "not covered" with this reason.
pub fn kubeadm_api_version_problem(obj: &Value) -> Option<String> {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    if !matches!(kind, "KubeadmConfig" | "KubeadmConfigTemplate") {
        return None;
    }
    let v = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    (v != KUBEADM_API_VERSION).then(|| {
        format!(
            "{kind} apiVersion {v:?} is not read: CAPI sends KubeadmConfigs and KubeadmConfigTemplates at {KUBEADM_API_VERSION} (KCP from its typed objects, MachineDeployments at the contract version), which is the only version this extension translates"
        )
    })
}

/// Members of a v1beta2 `File` (`bootstrap/kubeadm/v1beta2` `File`: `path`, `owner`,
/// `permissions`, `encoding`, `append`, `content`, `contentFrom`) that [`super::decode_file`]
/// reads, plus `contentFormat`, which it refuses unless `Raw`.
pub const FILE_FIELDS: [&str; 8] = [
    "path",
    "owner",
    "permissions",
    "encoding",
    "append",
    "content",
    "contentFrom",
    "contentFormat",
];

/// Members of a v1beta2 `Arg` (a `kubeletExtraArgs[]` entry).
pub const ARG_FIELDS: [&str; 2] = ["name", "value"];

/// Members of a v1beta2 `NTP`.
pub const NTP_FIELDS: [&str; 2] = ["enabled", "servers"];

/// JSON pointers (from the object root; `at` holds the tokens of `v`) of the members of
/// the object `v` that are not in `known`: what the translation would ignore. A value
/// that is not an object has none.
pub fn unknown_members(v: &Value, known: &[&str], at: &[String]) -> Vec<String> {
    let Some(m) = v.as_object() else {
        return vec![];
    };
    m.keys()
        .filter(|k| !known.contains(&k.as_str()))
        .map(|k| {
            let mut t = at.to_vec();
            t.push(k.clone());
            crate::capi::patch::pointer(&t)
        })
        .collect()
}

/// The reason for unknown members `ptrs` of one entry (empty = none).
pub(super) fn unknown_reason(what: &str, ptrs: &[String]) -> Option<String> {
    let mut ptrs = ptrs.to_vec();
    ptrs.sort();
    ptrs.dedup();
    (!ptrs.is_empty()).then(|| {
        format!(
            "{} not a field of a v1beta2 {what} this extension translates, so the node would never act on it; remove it, or update this Machine by replacement",
            ptrs.join(", ")
        )
    })
}
