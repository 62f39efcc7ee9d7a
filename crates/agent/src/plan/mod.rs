//! Planning: the diff between the desired spec, the observed node and the applied record,
//! as a coverage report plus the exact steps that converge the node.
//!
//! [`plan`] is a pure function of its inputs (no I/O, no clock), so the same inputs give a
//! byte-identical report. Each change has a stable id (`files[/etc/x]`,
//! `kubelet.config.maxPods`, `kubelet.flags[max-pods]`, `kernelArgs[isolcpus]`,
//! `sysctls[vm.max_map_count]`, `ntp`, `dropins[10-x.yaml]`), and changes are sorted by id.
//!
//! The planner only drives the sections ([`crate::sections`], one module per NodeSpec
//! section, in the order of [`SECTIONS`]): it collects the paths they own, hands their
//! whole-file items to the shared file machinery, lets each diff the rest, and merges
//! their changes (sorted by id), steps and disruptions into one [`Plan`].
//!
//! Ownership rules (DESIGN §2): an item dropped from the spec is reverted to what was there
//! before the agent changed it (a created file is deleted, an overwritten one restored from
//! its saved original, a kubelet field or flag or sysctl set back to its prior value, a
//! kernel argument the agent added removed); nothing the agent did not add is touched.

pub mod diff;
pub(crate) mod observe;
pub(crate) mod order;
pub(crate) mod verify;
pub(crate) mod writable;

use std::collections::{BTreeMap, BTreeSet};

use crate::config::Config;
use crate::sections::SECTIONS;
use crate::sections::kit::file_items;
use crate::sections::kit::steps::Steps;
use crate::sections::kit::{AfterBoot, Boot, DriftView, Input, Options, Output, Section};
use crate::sections::model::{NodeSpec, Observed};
use crate::state::AppliedRecord;
use inplace_node::sysroot::Sysroot;
use inplace_wire::pb;
use inplace_wire::pb::DisruptionLevel;

pub use observe::observe;

/// A plan: the report and the steps.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Coverage report (facts and preservation are filled by the caller).
    pub report: pb::CoverageReport,
    /// Steps that converge the node.
    pub steps: Steps,
    /// The applied record once the steps are committed.
    pub record: AppliedRecord,
}

/// Computes the plan over [`SECTIONS`]. Pure: see the module docs.
pub fn plan(
    desired: &NodeSpec,
    obs: &Observed,
    record: &AppliedRecord,
    config: &Config,
    opts: Options,
) -> Plan {
    plan_over(SECTIONS, desired, obs, record, config, opts)
}

/// [`plan`] over the given sections, in their order (a new section can be planned on
/// its own, or before it joins [`SECTIONS`]).
pub fn plan_over(
    sections: &[&dyn Section],
    desired: &NodeSpec,
    obs: &Observed,
    record: &AppliedRecord,
    config: &Config,
    opts: Options,
) -> Plan {
    let spec_hash = desired.hash();
    let mut reserved = BTreeMap::new();
    for s in sections {
        reserved.extend(s.reserved(config, obs));
    }
    reserved.extend(opts.reserved.iter().cloned());
    let input = Input {
        desired,
        obs,
        record,
        config,
        opts: &opts,
        reserved,
    };
    let mut out = Output {
        next: AppliedRecord {
            spec_hash: spec_hash.clone(),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut items = Vec::new();
    for s in sections {
        let f = s.file_items(&input);
        items.extend(f.items);
        out.changes.extend(f.refused);
    }
    let dropped =
        |item: Option<&str>, path: &str| sections.iter().find_map(|s| s.dropped_file(item, path));
    file_items::plan_files(&items, &input, &mut out, &dropped);
    for s in sections {
        s.diff(&input, &mut out);
    }
    let Output {
        changes,
        steps,
        next,
    } = out;
    let mut plan = Plan {
        report: report(changes, spec_hash),
        steps,
        record: next,
    };
    order::refuse_rewritten(&mut plan, config);
    plan
}

/// The coverage report of the sections' changes: sorted by id, with the largest
/// disruption and the units of the changes short of a reboot.
fn report(mut changes: Vec<pb::Change>, spec_hash: String) -> pb::CoverageReport {
    changes.sort_by(|a, b| a.id.cmp(&b.id));
    let fully_covered = changes.iter().all(|c| c.covered);
    let max_level = changes
        .iter()
        .filter_map(|c| c.disruption.as_ref().map(|d| d.level))
        .max()
        .unwrap_or(DisruptionLevel::None as i32);
    let mut units = BTreeSet::new();
    for c in &changes {
        if let Some(d) = &c.disruption
            && d.level <= DisruptionLevel::DaemonReload as i32
        {
            units.extend(d.units.iter().cloned());
        }
    }
    let reboot_required = changes.iter().any(|c| {
        c.disruption
            .as_ref()
            .is_some_and(|d| d.level == DisruptionLevel::Reboot as i32)
    });
    pb::CoverageReport {
        diffs: Vec::new(),
        changes,
        fully_covered,
        max_disruption: Some(pb::Disruption {
            level: max_level,
            units: if max_level == DisruptionLevel::Reboot as i32 {
                Vec::new()
            } else {
                units.into_iter().collect()
            },
        }),
        reboot_required,
        facts: None,
        preservation: None,
        spec_hash,
    }
}

/// True when `change`, still listed by the re-plan after an apply of `steps`, is one a
/// section verifies only after the boot.
pub fn verified_after_boot(change: &pb::Change, steps: &Steps) -> bool {
    SECTIONS
        .iter()
        .any(|s| s.verified_after_boot(change, steps))
}

/// Checks an operation after a boot against the running command line (`running`) and
/// the next boot's configuration (`next_boot`): what the node lacks or still has of it,
/// over every section.
pub fn verify_after_boot(changes: &[pb::Change], running: &str, next_boot: &str) -> AfterBoot {
    let boot = Boot { running, next_boot };
    let mut all = AfterBoot::default();
    for s in SECTIONS {
        let a = s.verify_after_boot(changes, &boot);
        all.missing.extend(a.missing);
        all.lingering.extend(a.lingering);
    }
    all
}

/// Managed items whose node state differs from the applied record, sorted by id.
pub fn drift(root: &Sysroot, config: &Config, record: &AppliedRecord) -> Vec<pb::Drift> {
    let view = DriftView {
        root,
        config,
        record,
    };
    let mut out: Vec<pb::Drift> = SECTIONS.iter().flat_map(|s| s.drift(&view)).collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

/// Node paths whose directories hold managed items, over every section.
pub fn watched(root: &Sysroot, config: &Config, record: &AppliedRecord) -> Vec<String> {
    let view = DriftView {
        root,
        config,
        record,
    };
    SECTIONS.iter().flat_map(|s| s.watched(&view)).collect()
}

#[cfg(test)]
mod tests {
    //! A section written the way a new one would be, planned on its own and beside the
    //! `files` section: the trait is enough, the planner needs no change.
    use std::borrow::Cow;

    use super::*;
    use crate::sections::kit::change::{ChangeBuilder, disruption};
    use crate::sections::kit::file_items::FileSpec;
    use crate::sections::kit::file_items::{FileItem, FileItems};
    use inplace_wire::pb::{ChangeOperation, DisruptionLevel};

    /// Writes `/etc/motd` through the file machinery and reports a `zz` change of its own.
    #[derive(Debug)]
    struct Motd;

    impl Section for Motd {
        fn name(&self) -> &'static str {
            "motd"
        }

        fn file_items<'a>(&self, _input: &Input<'a>) -> FileItems<'a> {
            let content = b"hello\n".to_vec();
            FileItems {
                items: vec![FileItem {
                    file: Cow::Owned(FileSpec {
                        path: "/etc/motd".into(),
                        sha256: inplace_node::digest::sha256_hex(&content),
                        content,
                        mode: 0o644,
                        owner: None,
                        group: None,
                    }),
                    id: "motd".into(),
                    item: Some("motd".into()),
                    disruption: Some((disruption(DisruptionLevel::None, &[]), "motd".into())),
                    summary: None,
                    agent_owned: false,
                }],
                refused: Vec::new(),
            }
        }

        fn diff(&self, _input: &Input<'_>, out: &mut Output) {
            out.push(ChangeBuilder {
                id: "zz".into(),
                op: ChangeOperation::Update,
                before: "a".into(),
                after: "b".into(),
                covered: Err("not yet".into()),
                disruption: disruption(DisruptionLevel::Restart, &["z.service"]),
                targets: vec![],
            });
        }
    }

    #[test]
    fn a_new_section_plugs_in_with_the_trait_alone() {
        let desired = NodeSpec::default();
        let obs = Observed::empty();
        let record = AppliedRecord::default();
        let config = Config::default();
        let files: &dyn Section = &crate::sections::files::Files;
        let p = plan_over(
            &[files, &Motd],
            &desired,
            &obs,
            &record,
            &config,
            Options::default(),
        );
        let ids: Vec<&str> = p.report.changes.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["motd", "zz"]);
        assert!(!p.report.fully_covered);
        assert_eq!(p.steps.writes.len(), 1);
        assert_eq!(p.steps.writes[0].path, "/etc/motd");
        assert_eq!(p.record.files["/etc/motd"].item.as_deref(), Some("motd"));
        assert_eq!(
            p.report.max_disruption.as_ref().map(|d| d.units.clone()),
            Some(vec!["z.service".to_string()])
        );
    }
}
