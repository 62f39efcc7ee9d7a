//! The status view: the agent, the node and the operations at a glance
//! (`NodeStatus`), read-only.

use super::Agent;
use super::AgentError;
use inplace_node::system::CommandRunner;
use inplace_wire::pb;
use inplace_wire::pb::Phase;

impl Agent {
    /// Agent and node status.
    pub(crate) fn status(&self) -> Result<pb::NodeStatus, AgentError> {
        // a pending commit that does not verify is reported, not a failed status
        let (record, damaged_commits) = self.state.load_record_reporting()?;
        let current = {
            let inner = self.lock();
            inner
                .running
                .as_ref()
                .and_then(|id| inner.live.get(id))
                .and_then(|l| l.last().cloned())
        };
        let (drift, drift_detections) = self.scan_drift_with(&record);
        let ops = self.state.operation_heads()?;
        let pending = ops
            .iter()
            .find(|o| o.phase == Phase::RebootRequired as i32 || o.phase == Phase::Rebooting as i32)
            .map(|o| o.id.clone())
            .unwrap_or_default();
        let (boot_id, kubernetes_version) = (self.boot_id(), self.kubernetes_version());
        let unreadable = self.unreadable(&boot_id, &kubernetes_version);
        Ok(pb::NodeStatus {
            version: env!("CARGO_PKG_VERSION").to_string(),
            agent_uptime_seconds: self.started.elapsed().as_secs(),
            boot_id,
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
                p.extend(
                    self.live_problems
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .values()
                        .cloned(),
                );
                p.extend(self.quarantine_problems());
                p.extend(self.unknown_observations(&record));
                p.extend(unreadable);
                p.extend(damaged_commits);
                p.extend(self.incomplete_rollback(ops.first().map(|o| (o.id.as_str(), o.phase))));
                p
            },
            drift_detections,
            kubernetes_version,
        })
    }
}

impl Agent {
    /// The newest operation, when its rollback did not complete
    /// ([`super::rollback::rollback_problem`]): listed until a later operation.
    fn incomplete_rollback(&self, newest: Option<(&str, i32)>) -> Option<String> {
        let (id, phase) = newest?;
        if phase != Phase::Failed as i32 {
            return None;
        }
        let op = self.state.get_operation(id).ok()??;
        super::rollback::rollback_problem(&op)
    }

    /// Sets (`Some`) or clears (`None`) the problem about `about` (a config key or a
    /// path: one problem each) in `NodeStatus.problems`, logging it when it appears or
    /// changes: for conditions that come and go, such as the metrics textfile's directory
    /// (missing, or writable by others) or an untrusted certificate file.
    pub(crate) fn set_problem(&self, about: &str, problem: Option<String>) {
        let mut live = self.live_problems.lock().unwrap_or_else(|p| p.into_inner());
        match problem {
            Some(msg) => {
                if live.get(about) != Some(&msg) {
                    tracing::warn!("{msg}");
                    live.insert(about.to_string(), msg);
                }
            }
            None => {
                live.remove(about);
            }
        }
    }

    /// One problem per applied record quarantined or marked lost
    /// ([`crate::state::StateDir::quarantined_records`]), while it is there: each refuses
    /// applies until it is removed ([`crate::state::StateDir::record_doubt`]), so it is
    /// said at every start and gone once the administrator removes it. The one this
    /// start made is said as the start found it.
    fn quarantine_problems(&self) -> Vec<String> {
        self.state
            .quarantined_records()
            .into_iter()
            .map(|r| match &self.record_problem {
                Some((about, p)) if *about == r => p.clone(),
                _ => format!(
                    "{r}: left by an earlier start that found the applied record damaged or missing; no apply runs until you check the items inplaced managed (an apply's refusal names them) and remove it"
                ),
            })
            .collect()
    }

    /// The running-state observations the managed items depend on that can not be made
    /// (issue 20 §2), each as a problem: the node observed for the applied record.
    fn unknown_observations(&self, record: &crate::state::AppliedRecord) -> Vec<String> {
        let desired = crate::sections::model::NodeSpec::default();
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
    /// it can not be asked). Asked once per binary ([`super::kept::KeptVersions`]: asked
    /// again when the file or a link on its way changes), so a status poll does not start
    /// a process every time.
    fn kubernetes_version(&self) -> String {
        let kubelet = self.config.kubernetes.bin_path("kubelet");
        if self.stamps_following(&kubelet).is_none() {
            return String::new();
        }
        self.version_queries()
            .query(&[kubelet, "--version".into()])
            .ok()
            .and_then(|o| crate::kubernetes::parse_kubelet_version(&o).ok())
            .map(|v| v.to_string())
            .unwrap_or_default()
    }

    /// The file `path` names once symlinks are followed ([`inplace_node::sysroot::Sysroot::resolve`]),
    /// with its stamp: a retargeted link gives another path or another file, a replaced
    /// or rewritten file another stamp. `None` when it is absent or can not be looked at.
    pub(super) fn stamps_following(
        &self,
        path: &str,
    ) -> Option<(String, inplace_node::sysroot::Stamp)> {
        let real = self.root.resolve(path).ok()?;
        let stamp = self.root.stamp(&real).ok()??;
        Some((real, stamp))
    }
}
