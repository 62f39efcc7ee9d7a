//! What the sections' unit tests (`<x>/tests.rs`) share: a spec from its YAML form, a
//! file as observed, and one planning run over chosen sections (the planner's pure
//! function, no node). Test code only.

use crate::config::Config;
use crate::plan::{Plan, plan_over};
use crate::sections::kit::effect::{Node, Report, UndoEntry};
use crate::sections::kit::observe::FileObs;
use crate::sections::kit::{Options, Section};
use crate::sections::model::{NodeSpec, Observed};
use crate::state::AppliedRecord;
use inplace_node::sysroot::{Entry, Kind, Sysroot};
use inplace_node::system::Recorder;
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

/// What an effect reported while it ran, for its tests.
#[derive(Debug, Default)]
pub(crate) struct Reported {
    /// Operation messages, in order.
    pub steps: Vec<String>,
    /// Journal progress markers, in order.
    pub progress: Vec<String>,
    /// Actions, in order.
    pub actions: Vec<String>,
    /// Undo entries, in order of completion.
    pub undo: Vec<UndoEntry>,
}

impl Report for Reported {
    fn step(&mut self, message: &str) {
        self.steps.push(message.into());
    }
    fn progress(&mut self, marker: &crate::sections::kit::marker::Marker) -> Result<(), String> {
        self.progress.push(marker.text());
        Ok(())
    }
    fn action(&mut self, text: String) {
        self.actions.push(text);
    }
    fn undo(&mut self, undo: UndoEntry) {
        self.undo.push(undo);
    }
}

/// A sysroot in a temporary directory holding `files` (node path, content).
pub(crate) fn sysroot(files: &[(&str, &str)]) -> (tempfile::TempDir, Sysroot) {
    let dir = tempfile::tempdir().unwrap();
    for (p, c) in files {
        let full = dir.path().join(p.trim_start_matches('/'));
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, c).unwrap();
    }
    let root = Sysroot::open(dir.path()).unwrap();
    (dir, root)
}

/// Calls `f` with the node an effect acts on: `root`, services and commands recorded by
/// `rec`, the default config, no health endpoint.
pub(crate) fn with_node<R>(root: &Sysroot, rec: &Recorder, f: impl FnOnce(&Node<'_>) -> R) -> R {
    let config = Config::default();
    let node = Node {
        root,
        services: rec,
        runner: rec,
        config: &config,
        state_dir: std::path::Path::new("/nonexistent"),
        default_healthz: None,
    };
    f(&node)
}
