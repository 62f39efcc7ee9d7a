//! The verifying re-plan of an operation (issue 28 §2): after the steps ran, the node is
//! observed and planned again, and whatever is still listed (but what the boot verifies)
//! fails the operation. It covers the sections the plan touched, not the whole node.
//!
//! A section is touched when one of the plan's changes is its (the change id begins with
//! its name: `sysctls[vm.max_map_count]` is the `sysctls` section's); its steps (the
//! paths written, the sysctl keys and kernel arguments set, the units restarted) all come
//! from those changes. The sections that write whole files through the shared file
//! machinery (`files`, `dropins`, `ntp`) are always re-planned together: the machinery
//! reverts every recorded file no item names, so planning one without the others would
//! see their recorded files as dropped. The observation is the sections' own, through the
//! sysroot's memo (an untouched file costs one `stat`; a written one is read again, its
//! stamp changed).
//!
//! What this no longer checks: a section the plan did not touch, changed by someone else
//! while the operation ran. Drift detection reports that ([`super::drift`]).

use crate::config::Config;
use crate::sections::SECTIONS;
use crate::sections::kit::observe::ObserveError;
use crate::sections::kit::{Options, Section};
use crate::sections::model::NodeSpec;
use crate::state::{AppliedRecord, StateDir};
use inplace_node::sysroot::Sysroot;

use super::Plan;

/// The sections whose whole files go through the shared file machinery: re-planned
/// together, always.
const WHOLE_FILES: &[&str] = &["files", "dropins", "ntp"];

/// True when the change `id` is the section `name`'s (`name`, `name[...]`, `name.`...).
pub(crate) fn is_sections(name: &str, id: &str) -> bool {
    id.strip_prefix(name)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['[', '.']))
}

/// The sections of [`SECTIONS`] the verifying re-plan of `plan` covers, in their order:
/// those with a change in the plan, and the whole-file ones.
pub(crate) fn touched(plan: &Plan) -> Vec<&'static dyn Section> {
    SECTIONS
        .iter()
        .copied()
        .filter(|s| {
            WHOLE_FILES.contains(&s.name())
                || plan
                    .report
                    .changes
                    .iter()
                    .any(|c| is_sections(s.name(), &c.id))
        })
        .collect()
}

/// What an operation needs to re-plan the node after its steps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Host<'a> {
    /// The node's root.
    pub root: &'a Sysroot,
    /// The agent's state directory.
    pub state: &'a StateDir,
    /// Agent config.
    pub config: &'a Config,
    /// Read-only commands.
    pub runner: Option<&'a dyn inplace_node::system::CommandRunner>,
}

/// Observes and plans again, after the steps of `plan` ran, the sections it touched
/// ([`touched`]), for `desired` and the `record` the operation commits: the changes still
/// listed are what is still different.
pub(crate) fn replan_touched(
    host: Host<'_>,
    plan: &Plan,
    desired: &NodeSpec,
    record: &AppliedRecord,
    opts: Options,
) -> Result<Plan, ObserveError> {
    let sections = touched(plan);
    let obs = super::observe::observe_over(
        &sections,
        host.root,
        host.state,
        host.config,
        desired,
        record,
        host.runner,
    )?;
    Ok(super::plan_over(
        &sections,
        desired,
        &obs,
        record,
        host.config,
        opts,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use inplace_wire::pb;

    fn plan_of(ids: &[&str]) -> Plan {
        Plan {
            report: pb::CoverageReport {
                changes: ids
                    .iter()
                    .map(|id| pb::Change {
                        id: id.to_string(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
            steps: Default::default(),
            record: Default::default(),
        }
    }

    fn names(p: &Plan) -> Vec<&'static str> {
        touched(p).iter().map(|s| s.name()).collect()
    }

    #[test]
    fn a_change_id_belongs_to_the_section_it_begins_with() {
        assert!(is_sections("sysctls", "sysctls[vm.max_map_count]"));
        assert!(is_sections("kubelet", "kubelet.config.maxPods"));
        assert!(is_sections("kubelet", "kubelet.flags[max-pods]"));
        assert!(is_sections("ntp", "ntp"));
        assert!(is_sections("kubernetes", "kubernetes.version"));
        assert!(is_sections("kernelArgs", "kernelArgs[isolcpus]"));
        assert!(!is_sections("kubelet", "kubeletx.y"));
        assert!(!is_sections("files", "filesystem"));
        assert!(!is_sections("kubernetes", "kubelet.config.maxPods"));
    }

    #[test]
    fn the_re_plan_covers_the_touched_sections_and_the_whole_file_ones() {
        let whole = names(&plan_of(&[]));
        assert!(whole.contains(&"files") && whole.contains(&"dropins") && whole.contains(&"ntp"));
        assert_eq!(whole.len(), 3, "{whole:?}");
        let p = names(&plan_of(&[
            "sysctls[vm.swappiness]",
            "kubelet.flags[max-pods]",
        ]));
        assert_eq!(p.len(), 5, "{p:?}");
        assert!(p.contains(&"sysctls") && p.contains(&"kubelet"));
        assert!(!p.contains(&"kernelArgs") && !p.contains(&"kubernetes"));
        // every section is reachable by its changes
        let all: Vec<String> = SECTIONS
            .iter()
            .map(|s| format!("{}[x]", s.name()))
            .collect();
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        assert_eq!(names(&plan_of(&all)).len(), SECTIONS.len());
    }
}
