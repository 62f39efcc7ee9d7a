//! What the sections' unit tests (`<x>/tests.rs`) share: a spec from its YAML form, a
//! file as observed, and one planning run over chosen sections (the planner's pure
//! function, no node). Test code only.

use crate::config::Config;
use crate::plan::{Plan, plan_over};
use crate::sections::kit::observe::FileObs;
use crate::sections::kit::{Options, Section};
use crate::sections::model::{NodeSpec, Observed};
use crate::state::AppliedRecord;
use inplace_node::sysroot::{Entry, Kind};
use inplace_wire::names::SpecError;
use inplace_wire::{pb, yaml};

/// The validated spec of the YAML document `main` with the drop-ins `(name, YAML)`.
pub(crate) fn spec(main: &str, dropins: &[(&str, &str)]) -> Result<NodeSpec, SpecError> {
    let mut p = yaml::parse(main).unwrap();
    p.dropins = dropins
        .iter()
        .map(|(n, c)| pb::DropIn {
            name: n.to_string(),
            content: c.to_string(),
            keep: false,
        })
        .collect();
    NodeSpec::from_pb(&p)
}

/// A regular file with `content`, `mode`, owned by `uid:gid`.
pub(crate) fn file(content: &str, mode: u32, uid: u32, gid: u32) -> FileObs {
    FileObs::File {
        content: content.as_bytes().to_vec(),
        entry: Entry {
            kind: Kind::File,
            mode,
            uid,
            gid,
            len: content.len() as u64,
        },
    }
}

/// Plans `sections` alone over `desired`, `obs` and `record` with the default config.
pub(crate) fn plan(
    sections: &[&dyn Section],
    desired: &NodeSpec,
    obs: &Observed,
    record: &AppliedRecord,
) -> Plan {
    let config = Config::default();
    plan_over(sections, desired, obs, record, &config, Options::default())
}

/// The ids of a plan's changes, in report order.
pub(crate) fn ids(p: &Plan) -> Vec<&str> {
    p.report.changes.iter().map(|c| c.id.as_str()).collect()
}
