//! Wire types of the Cluster API Runtime SDK in-place update hooks, exactly as upstream
//! marshals them with Go `encoding/json` (`api/runtime/hooks/v1alpha1`,
//! `inplaceupdate_types.go`, `common_types.go`, `discovery_types.go`).
//!
//! Objects (`machine`, `infrastructureMachine`, `bootstrapConfig`, templates) stay raw
//! [`serde_json::Value`]s: CAPI applies our patches to the JSON it sent and compares it
//! exactly, so the extension must neither drop nor reformat fields it does not know.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `apiVersion` of every hook request and response.
pub const API_VERSION: &str = "hooks.runtime.cluster.x-k8s.io/v1alpha1";

/// `status` of a response (`CommonResponse.Status`, required, no omitempty).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    /// The call worked (for CanUpdate hooks: whatever the coverage).
    Success,
    /// The call failed: CAPI errors and retries, it never falls back to replacement.
    Failure,
}

/// `patchType` of a [`Patch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PatchType {
    /// RFC 6902 JSON Patch.
    JSONPatch,
    /// RFC 7386 JSON Merge Patch.
    JSONMergePatch,
}

/// A patch of one object (`Patch` in Go). `patch` is a Go `[]byte`, so on the wire it is
/// the base64 (standard alphabet, padded) of the patch document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Patch {
    /// Kind of patch document.
    pub patch_type: PatchType,
    /// The patch document (compact JSON), base64 on the wire.
    #[serde(with = "b64")]
    pub patch: Vec<u8>,
}

impl Patch {
    /// A JSON Patch from its operations (compact JSON, as CAPI's examples).
    pub fn json_patch(ops: &[Value]) -> Patch {
        Patch {
            patch_type: PatchType::JSONPatch,
            patch: serde_json::to_vec(ops).unwrap_or_default(),
        }
    }

    /// The decoded operations, for tests and logs. Errors if the document is not JSON.
    pub fn operations(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_slice(&self.patch)
    }
}

mod b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(s.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

/// `CanUpdateMachineRequestObjects` / `UpdateMachineRequestObjects`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineObjects {
    /// The Machine (`cluster.x-k8s.io/v1beta2`, metadata trimmed, spec only).
    pub machine: Value,
    /// The InfraMachine (e.g. a Metal3Machine), any version.
    pub infrastructure_machine: Value,
    /// The bootstrap config (a KubeadmConfig, `bootstrap.cluster.x-k8s.io/v1beta2`, the
    /// only version CAPI sends), if the Machine has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_config: Option<Value>,
}

/// `CanUpdateMachineSetRequestObjects`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineSetObjects {
    /// The MachineSet.
    pub machine_set: Value,
    /// The InfraMachineTemplate (e.g. a Metal3MachineTemplate).
    pub infrastructure_machine_template: Value,
    /// The bootstrap config template (a KubeadmConfigTemplate), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_config_template: Option<Value>,
}

/// `CanUpdateMachineRequest`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CanUpdateMachineRequest {
    /// ExtensionConfig settings, merged in by CAPI.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// Current objects.
    pub current: MachineObjects,
    /// Desired objects.
    pub desired: MachineObjects,
}

/// `CanUpdateMachineSetRequest`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CanUpdateMachineSetRequest {
    /// ExtensionConfig settings.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// The old MachineSet and its templates.
    pub current: MachineSetObjects,
    /// The new MachineSet and its templates.
    pub desired: MachineSetObjects,
}

/// `UpdateMachineRequest`: desired objects only, already written to the API server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateMachineRequest {
    /// ExtensionConfig settings.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// Desired objects.
    pub desired: MachineObjects,
}

/// `CanUpdateMachineResponse`, with the proposed `preserveOnInsufficientCoverage`
/// (cluster-api PR #14035: optional, omitted when false).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CanUpdateMachineResponse {
    /// Always [`API_VERSION`].
    pub api_version: String,
    /// `CanUpdateMachineResponse`.
    pub kind: String,
    /// Success unless the extension could not decide.
    pub status: Status,
    /// What is and is not covered, and why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Patch of the Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_patch: Option<Patch>,
    /// Patch of the InfraMachine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_machine_patch: Option<Patch>,
    /// Patch of the bootstrap config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_config_patch: Option<Patch>,
    /// Keep the Machine and report the rollout blocked instead of replacing it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserve_on_insufficient_coverage: Option<bool>,
    /// Whether the in-place update makes the Machine unavailable (`*bool`,
    /// `omitempty`; unset reads as true upstream, cluster-api #14160).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affects_availability: Option<bool>,
}

/// `CanUpdateMachineSetResponse`, with the proposed `preserveOnInsufficientCoverage`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CanUpdateMachineSetResponse {
    /// Always [`API_VERSION`].
    pub api_version: String,
    /// `CanUpdateMachineSetResponse`.
    pub kind: String,
    /// Success unless the extension could not decide.
    pub status: Status,
    /// What is and is not covered, and why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Patch of the MachineSet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_set_patch: Option<Patch>,
    /// Patch of the InfraMachineTemplate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_machine_template_patch: Option<Patch>,
    /// Patch of the bootstrap config template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_config_template_patch: Option<Patch>,
    /// Keep the Machines and report the rollout blocked instead of replacing them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserve_on_insufficient_coverage: Option<bool>,
    /// Whether updating a Machine in place makes it unavailable; `false` lets a
    /// MachineDeployment with `maxUnavailable: 0` update in place without a surge Machine
    /// (cluster-api #14160, #14195; unset reads as true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affects_availability: Option<bool>,
}

/// `UpdateMachineResponse` (`CommonRetryResponse`): `retryAfterSeconds` is always present.
/// Success + >0 = in progress, Success + 0 = done, Failure = failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdateMachineResponse {
    /// Always [`API_VERSION`].
    pub api_version: String,
    /// `UpdateMachineResponse`.
    pub kind: String,
    /// Success or Failure.
    pub status: Status,
    /// While in progress (Success, `retryAfterSeconds` > 0) CAPI shows it in the
    /// Machine's `Updating` condition as "In-place update in progress: <message>". On
    /// `Failure` CAPI shows only a fixed text ("UpdateMachine hook failed: please check
    /// controller logs") and the message reaches the controller's log, not the Machine:
    /// operators find the cause in this extension's log (by Machine) and in `inplacectl
    /// status` on the node.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Seconds until CAPI calls again; 0 = done.
    pub retry_after_seconds: i32,
}

impl UpdateMachineResponse {
    /// A response with `status`, `message` and `retry_after_seconds`.
    pub fn new(status: Status, message: impl Into<String>, retry_after_seconds: i32) -> Self {
        UpdateMachineResponse {
            api_version: API_VERSION.into(),
            kind: "UpdateMachineResponse".into(),
            status,
            message: message.into(),
            retry_after_seconds,
        }
    }
}

/// A failure response of any hook kind (`{"apiVersion", "kind", "status": "Failure",
/// "message"}`), plus `retryAfterSeconds: 0` for `UpdateMachineResponse`.
pub fn failure(kind: &str, message: &str) -> Value {
    let mut v = serde_json::json!({
        "apiVersion": API_VERSION,
        "kind": kind,
        "status": "Failure",
        "message": message,
    });
    if kind == "UpdateMachineResponse" {
        v["retryAfterSeconds"] = 0.into();
    }
    v
}

/// `GroupVersionHook` of a handler.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupVersionHook {
    /// [`API_VERSION`].
    pub api_version: String,
    /// Hook name (`CanUpdateMachine`, ...).
    pub hook: String,
}

/// `ExtensionHandler` of the discovery response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionHandler {
    /// Handler name; the URL is `/<apiVersion>/<hook lowercased>/<name>`.
    pub name: String,
    /// The hook it implements.
    pub request_hook: GroupVersionHook,
    /// Per-call timeout CAPI uses, seconds (CAPI's default is 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i32>,
    /// `Fail` (default) or `Ignore`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<String>,
}

/// `DiscoveryResponse`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryResponse {
    /// Always [`API_VERSION`].
    pub api_version: String,
    /// `DiscoveryResponse`.
    pub kind: String,
    /// Success.
    pub status: Status,
    /// Empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The three in-place handlers.
    pub handlers: Vec<ExtensionHandler>,
}

/// Handler names this extension registers, by hook.
pub const HANDLERS: [(&str, &str); 3] = [
    ("CanUpdateMachine", "can-update-machine"),
    ("CanUpdateMachineSet", "can-update-machineset"),
    ("UpdateMachine", "update-machine"),
];

/// The discovery answer: the three in-place hooks, failure policy `Fail` (a transport
/// error must never read as "not covered", which would replace the Machine).
pub fn discovery(timeout_seconds: i32) -> DiscoveryResponse {
    DiscoveryResponse {
        api_version: API_VERSION.into(),
        kind: "DiscoveryResponse".into(),
        status: Status::Success,
        message: String::new(),
        handlers: HANDLERS
            .iter()
            .map(|(hook, name)| ExtensionHandler {
                name: (*name).into(),
                request_hook: GroupVersionHook {
                    api_version: API_VERSION.into(),
                    hook: (*hook).into(),
                },
                timeout_seconds: Some(timeout_seconds),
                failure_policy: Some("Fail".into()),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_is_base64_on_the_wire() {
        let p = Patch::json_patch(&[serde_json::json!({"op":"remove","path":"/spec/x"})]);
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["patchType"], "JSONPatch");
        // base64 of `[{"op":"remove","path":"/spec/x"}]`
        assert_eq!(
            v["patch"],
            "W3sib3AiOiJyZW1vdmUiLCJwYXRoIjoiL3NwZWMveCJ9XQ=="
        );
        let back: Patch = serde_json::from_value(v).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn retry_after_is_always_present() {
        let v = serde_json::to_value(UpdateMachineResponse::new(Status::Success, "", 0)).unwrap();
        assert_eq!(v["retryAfterSeconds"], 0);
        assert!(v.get("message").is_none());
    }
}
