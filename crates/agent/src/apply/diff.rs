//! The diff view's I/O: the current bytes of every path a plan writes or removes, read
//! through the sysroot and checked against the plan's own fingerprints, handed to the
//! pure [`crate::plan::diff::file_diffs`].

use std::collections::BTreeMap;

use super::{Agent, AgentError};
use crate::plan;
use crate::plan::Plan;
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
        Ok(plan::diff::file_diffs(
            &plan.steps,
            &before,
            &plan.report.changes,
            &confidential,
            show_content,
        ))
    }
}
