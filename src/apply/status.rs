//! The status view: the agent, the node and the operations at a glance
//! (`NodeStatus`), read-only.

use super::Agent;
use super::AgentError;
use crate::pb::{self, Phase};

impl Agent {
    /// Agent and node status.
    pub fn status(&self) -> Result<pb::NodeStatus, AgentError> {
        let record = self.state.load_record()?;
        let current = {
            let inner = self.lock();
            inner
                .running
                .as_ref()
                .and_then(|id| inner.live.get(id))
                .and_then(|l| l.events.last().cloned())
        };
        let (drift, drift_detections) = self.scan_drift_with(&record);
        let ops = self.state.operation_heads()?;
        let pending = ops
            .iter()
            .find(|o| o.phase == Phase::RebootRequired as i32 || o.phase == Phase::Rebooting as i32)
            .map(|o| o.id.clone())
            .unwrap_or_default();
        Ok(pb::NodeStatus {
            version: env!("CARGO_PKG_VERSION").to_string(),
            agent_uptime_seconds: self.started.elapsed().as_secs(),
            boot_id: self.boot_id(),
            facts: Some(self.facts.clone()),
            applied_spec_hash: record.spec_hash.clone(),
            current_operation: current,
            pending_reboot_operation: pending,
            drift,
            managed_items: record.len() as u32,
            preservation: Some(self.preservation.clone()),
            root: self.root.path().display().to_string(),
            problems: {
                let mut p = self
                    .problems
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone();
                p.extend(self.unknown_observations(&record));
                p
            },
            drift_detections,
            kubernetes_version: self.kubernetes_version(),
        })
    }
}

impl Agent {
    /// The running-state observations the managed items depend on that can not be made
    /// (issue 20 §2), each as a problem: the node observed for the applied record.
    fn unknown_observations(&self, record: &crate::state::AppliedRecord) -> Vec<String> {
        let desired = crate::spec::NodeSpec::default();
        match crate::plan::observe(&self.root, &self.state, &self.config, &desired, record) {
            Ok(obs) => obs
                .unknown
                .iter()
                .map(|u| {
                    format!("unknown observation: {u}; changes that depend on it are not covered")
                })
                .collect(),
            Err(e) => vec![format!("the node could not be observed: {e}")],
        }
    }

    /// `kubelet --version` of the kubelet in `[kubernetes] bin_dir` ("" when absent or
    /// it can not be asked).
    fn kubernetes_version(&self) -> String {
        let kubelet = self.config.kubernetes.bin_path("kubelet");
        if !matches!(self.root.stat(&kubelet), Ok(Some(_))) {
            return String::new();
        }
        self.runner
            .query(&[kubelet, "--version".into()])
            .ok()
            .and_then(|o| crate::kubernetes::parse_kubelet_version(&o).ok())
            .map(|v| v.to_string())
            .unwrap_or_default()
    }
}
