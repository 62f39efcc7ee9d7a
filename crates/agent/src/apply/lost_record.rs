//! A lost applied record in the plan: while one is quarantined
//! ([`StateDir::record_doubt`](crate::state::StateDir::record_doubt)) every apply is
//! refused, so coverage and a dry run must not say otherwise. Each change of the report
//! is made not covered, and each item in doubt that the plan has no change for (a spec
//! applied again, a node that matches it) gets one, not covered: a caller deciding from
//! coverage (the CAPI extension's CanUpdateMachine) hears that this update can not be
//! applied in place until an administrator settles the record, instead of a yes that the
//! apply then refuses in Staging.

use std::collections::BTreeSet;

use super::Agent;
use crate::plan::Plan;
use crate::sections::kit::change::{ChangeBuilder, disruption};
use crate::sections::model::NodeSpec;
use inplace_wire::pb;
use inplace_wire::pb::{ChangeOperation, DisruptionLevel};

/// The item ids of the spec applied last (`applied-spec.pb`), drop-ins merged when they
/// validate, else its own items; an error when neither does.
pub(super) fn applied_ids(applied: &pb::NodeSpec) -> Result<BTreeSet<String>, String> {
    NodeSpec::from_pb(applied)
        .or_else(|_| NodeSpec::from_pb_items(applied))
        .map(|s| s.item_ids())
        .map_err(|e| e.to_string())
}

impl Agent {
    /// The refusal of an apply of `desired` while a record is quarantined: the whole of
    /// [`StateDir::record_doubt`](crate::state::StateDir::record_doubt)'s message (the
    /// items, their saved originals, the fix), which the report's per-change reasons
    /// only point to.
    pub(super) fn lost_record_refusal(&self, desired: &NodeSpec) -> Option<String> {
        if self.state.quarantined_records().is_empty() {
            return None;
        }
        self.state
            .record_doubt(&desired.item_ids(), applied_ids)
            .map(|d| d.message)
    }

    /// Makes `plan`'s report say what a lost record leaves in doubt (see the module
    /// docs); nothing while no record is quarantined.
    pub(super) fn lost_record_not_covered(&self, desired: &NodeSpec, plan: &mut Plan) {
        if self.state.quarantined_records().is_empty() {
            return;
        }
        let Some(doubt) = self.state.record_doubt(&desired.item_ids(), applied_ids) else {
            return;
        };
        let reason = format!(
            "the applied record was {} ({}): what the items inplaced managed were like before it changed them is lost, so no apply runs until an administrator checks them and removes it (an apply's refusal names them and their saved originals)",
            crate::state::record_loss(&doubt.record),
            doubt.record
        );
        let report = &mut plan.report;
        for c in &mut report.changes {
            // a change not covered for its own reason keeps it, first: it still has to
            // be fixed once the record is settled
            c.reason = if !c.covered && !c.reason.is_empty() {
                format!("{}; and {reason}", c.reason)
            } else {
                reason.clone()
            };
            c.covered = false;
        }
        let planned: BTreeSet<String> = report.changes.iter().map(|c| c.id.clone()).collect();
        for id in doubt.ids.iter().filter(|id| !planned.contains(*id)) {
            report.changes.push(
                ChangeBuilder {
                    id: id.clone(),
                    op: ChangeOperation::Update,
                    before: "not known: the applied record was lost".into(),
                    after: "not known".into(),
                    covered: Err(reason.clone()),
                    disruption: disruption(DisruptionLevel::None, &[]),
                    targets: Vec::new(),
                }
                .build(),
            );
        }
        report.fully_covered = false;
    }
}
