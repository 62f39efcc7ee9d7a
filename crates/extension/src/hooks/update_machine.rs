//! UpdateMachine: idempotent. The operation id is derived from the Machine and the
//! desired NodeSpec ([`operation_id`]), so every call of one update maps to the same agent
//! operation; [`super::driver`] starts it and follows it to its end.

use prost::Message;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::capi;
use crate::capi::types::{Status, UpdateMachineRequest, UpdateMachineResponse};
use crate::extension::Extension;
use crate::resolve::MachineRef;
use inplace_wire::pb;

/// Machine annotation whose value is mixed into the operation id: after a failed update
/// (which UpdateMachine keeps reporting for the same desired spec), an operator fixes the
/// node and sets a new value to make the next UpdateMachine call start a new attempt.
pub(crate) const RETRY_ANNOTATION: &str = "inplaced.io/retry";

/// The operation id of an update: `capi-<namespace>-<name>-<16 hex of SHA-256 of the
/// NodeSpec's protobuf encoding and the [`RETRY_ANNOTATION`] value>`, sanitised to
/// `[A-Za-z0-9._-]` and at most 128 bytes.
pub(crate) fn operation_id(m: &MachineRef, spec: &pb::NodeSpec) -> String {
    let mut h = Sha256::new();
    h.update(spec.encode_to_vec());
    if let Some(attempt) = m.annotations.get(RETRY_ANNOTATION) {
        h.update(b"\0retry\0");
        h.update(attempt.as_bytes());
    }
    let hash = hex::encode(h.finalize());
    let clean: String = format!("{}-{}", m.namespace, m.name)
        .chars()
        .map(|c| {
            if inplace_wire::names::is_name_char(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    // Room for "-r<attempt>" (see `super::driver::choose_attempt`).
    let budget = 128 - "capi--".len() - 16 - 8;
    let clean = &clean[..clean.len().min(budget)];
    format!("capi-{clean}-{}", &hash[..16])
}

impl Extension {
    /// UpdateMachine: the request's checks (settings, namespace, a bootstrap config spec
    /// at the version the translation reads, decoded within the budget), then
    /// [`Extension::drive`].
    pub(crate) async fn update_machine(
        &self,
        mut req: UpdateMachineRequest,
    ) -> UpdateMachineResponse {
        req.redact();
        let eff = match self.settings(&req.settings) {
            Ok(e) => e,
            Err(e) => return UpdateMachineResponse::new(Status::Failure, e, 0),
        };
        let m = MachineRef::of(&req.desired.machine);
        if let Some(e) = self.unserved(&m) {
            return UpdateMachineResponse::new(Status::Failure, e, 0);
        }
        if !req
            .desired
            .bootstrap_config
            .as_ref()
            .is_some_and(|b| b.get("spec").is_some_and(Value::is_object))
        {
            // Nothing of the node is described; applying an empty NodeSpec would revert
            // everything the agent manages.
            return UpdateMachineResponse::new(
                Status::Success,
                "no bootstrap config spec: nothing to apply on the node",
                0,
            );
        }
        if let Some(e) = req
            .desired
            .bootstrap_config
            .as_ref()
            .and_then(capi::translate::kubeadm_api_version_problem)
        {
            return UpdateMachineResponse::new(
                Status::Failure,
                format!("{}: nothing was applied: {e}", m.name),
                0,
            );
        }
        // the files are decoded once for the whole hook, within the config's budget
        let base = match capi::desired_node_spec_checked(&req.desired) {
            Ok(s) => s,
            Err(e) => {
                return UpdateMachineResponse::new(
                    Status::Failure,
                    format!("{}: nothing was applied: {e}", m.name),
                    0,
                );
            }
        };
        let (resp, id) = self.drive(&m, &eff, &req.desired, base).await;
        tracing::info!(machine = %m.key(), operation = %id, status = ?resp.status, retry = resp.retry_after_seconds, "UpdateMachine: {}", resp.message);
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids_are_stable_and_valid() {
        let m = MachineRef {
            name: "edge-1-md-0-5f8c7d9b4x-k2v9w".into(),
            namespace: "site-a".into(),
            ..Default::default()
        };
        let spec = pb::NodeSpec {
            sysctls: [("vm.x".to_string(), "1".to_string())].into(),
            ..Default::default()
        };
        let a = operation_id(&m, &spec);
        assert_eq!(a, operation_id(&m, &spec));
        let prefix = "capi-site-a-edge-1-md-0-5f8c7d9b4x-k2v9w-";
        assert!(a.starts_with(prefix) && a.len() == prefix.len() + 16, "{a}");
        assert_ne!(a, operation_id(&m, &pb::NodeSpec::default()));
        let mut retried = m.clone();
        retried
            .annotations
            .insert(RETRY_ANNOTATION.into(), "1".into());
        assert_ne!(a, operation_id(&retried, &spec));
        let long = MachineRef {
            name: "x".repeat(300),
            ..m
        };
        let id = operation_id(&long, &spec);
        assert!(id.len() <= 128);
        inplace_wire::names::validate_operation_id(&id).unwrap();
    }
}
