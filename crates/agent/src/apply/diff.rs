//! The diff view's I/O: the current bytes of every path a plan writes or removes, read
//! through the sysroot and checked against the plan's own fingerprints, handed to the
//! pure [`crate::plan::diff::file_diffs`]; and a planned Kubernetes upgrade's binaries
//! and kubeadm-rewritten files ([`crate::sections::kubernetes::diff`]).

use std::collections::BTreeMap;

use super::{Agent, AgentError};
use crate::plan;
use crate::plan::Plan;
use crate::sections::kubernetes;
use crate::sections::kubernetes::effects::UpgradeKubernetes;
use crate::sections::model::NodeSpec;
use crate::state::AppliedRecord;
use inplace_wire::pb;

impl Agent {
    /// The diffs of `plan` (made from `desired` over `record`), confidential content shown
    /// only with `show_content` (the server has checked the caller may see it).
    ///
    /// Errors: a file that is no longer what the plan observed (another writer changed
    /// it meanwhile) is `FAILED_PRECONDITION`, asking to try again; a file that can not be
    /// read is `INTERNAL`.
    pub(super) fn diffs(
        &self,
        plan: &Plan,
        desired: &NodeSpec,
        record: &AppliedRecord,
        show_content: bool,
    ) -> Result<Vec<pb::FileDiff>, AgentError> {
        let mut before = BTreeMap::new();
        for (path, expect) in plan::diff::planned_paths(&plan.steps) {
            let bytes = self
                .root
                .read(path)
                .map_err(|e| AgentError::Internal(format!("reading {path} for the diff: {e}")))?;
            let now = match &bytes {
                Some(b) => format!("sha256:{}", inplace_node::digest::sha256_hex(b)),
                None => "absent".to_string(),
            };
            if now != expect {
                return Err(AgentError::Precondition(format!(
                    "{path} changed while the diff was computed (another writer); ask again"
                )));
            }
            before.insert(path.to_string(), bytes);
        }
        let confidential = plan::diff::confidential_paths(desired, record);
        let mut diffs = plan::diff::file_diffs(
            &plan.steps,
            &before,
            &plan.report.changes,
            &confidential,
            show_content,
        );
        self.upgrade_diffs(plan, &mut diffs)?;
        Ok(diffs)
    }

    /// Adds the diffs of a planned Kubernetes upgrade (its binaries, the files kubeadm
    /// rewrites; [`kubernetes::diff`]) to `diffs`, sorted by path. A path a step also
    /// writes keeps the step's diff (coverage refuses such a combination,
    /// [`crate::plan::order`]).
    fn upgrade_diffs(&self, plan: &Plan, diffs: &mut Vec<pb::FileDiff>) -> Result<(), AgentError> {
        let Some(up) = plan.steps.effects_of::<UpgradeKubernetes>().next() else {
            return Ok(());
        };
        let more = kubernetes::diff::upgrade_diffs(&up.0, &self.config, &self.root)
            .map_err(AgentError::Internal)?;
        for d in more {
            if !diffs.iter().any(|e| e.path == d.path) {
                diffs.push(d);
            }
        }
        diffs.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(())
    }
}
