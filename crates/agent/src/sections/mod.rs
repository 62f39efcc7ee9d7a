//! NodeSpec sections: one module per section of the spec, each behind the [`Section`]
//! trait, driven by the planner ([`crate::plan`]) in the fixed order of [`SECTIONS`].
//!
//! A section
//! 1. observes what it needs from the sysroot ([`Section::observe`]: its only I/O; all
//!    that follows is a pure function of the observation);
//! 2. diffs desired × observed × applied record into changes (id, operation, covered and
//!    reason, disruption) and steps (writes, removals, live values, commands): whole files
//!    through the shared file machinery ([`Section::file_items`], [`file_items`]),
//!    anything else in [`Section::diff`];
//! 3. says what is verified only after the boot ([`Section::verified_after_boot`],
//!    [`Section::verify_after_boot`]);
//! 4. reports drift of its managed items ([`Section::drift`], [`Section::watched`]).
//!
//! Sections never import each other. What two of them share lives in [`common`] (the
//! change builder), [`steps`] (the plan's steps), [`observe`] (the observation),
//! [`file_items`] (atomic whole-file writes with the ownership record) or in the domain
//! module it belongs to ([`inplace_formats::sysctl`], [`inplace_formats::cmdline`], [`crate::bootloader`],
//! [`inplace_formats::kubelet`]). Adding a section is adding a module here and a line in
//! [`SECTIONS`] (and, when it reads something new, a field of [`Observed`]).

pub mod common;
pub mod dropins;
pub mod file_items;
pub mod files;
pub mod kernel_args;
pub mod kubelet;
pub mod kubernetes;
pub mod ntp;
pub mod observe;
pub mod steps;
pub mod sysctls;

use std::collections::BTreeMap;

use crate::config::Config;
use crate::spec::NodeSpec;
use crate::state::AppliedRecord;
pub use common::{ChangeBuilder, disruption};
pub use file_items::{DroppedFile, FileItem, FileItems};
use inplace_node::sysroot::Sysroot;
use inplace_wire::pb;
pub use observe::{NodeView, ObserveError, Observed};
pub use steps::Steps;

/// The sections in the order the planner drives them. The order is the order of the
/// steps (the file items of `files`, `ntp`, `dropins` are written first, in this order),
/// never the order of the report, whose changes are sorted by id.
pub static SECTIONS: &[&dyn Section] = &[
    // first: the version upgrade runs before every other step, the other sections apply
    // to the upgraded node
    &kubernetes::Kubernetes,
    &files::Files,
    &ntp::Ntp,
    &dropins::Dropins,
    &kubelet::Kubelet,
    &kernel_args::KernelArgs,
    &sysctls::Sysctls,
];

/// One section of the NodeSpec. Every method but [`Section::name`] has a default that
/// does nothing, so a section implements only what it manages.
pub trait Section: Sync + std::fmt::Debug {
    /// The section's name in the NodeSpec (`kernelArgs`), which its change ids begin with.
    fn name(&self) -> &'static str;

    /// Reads what the section needs from the node into `obs`: the only I/O of planning.
    fn observe(&self, _node: &NodeView<'_>, _obs: &mut Observed) -> Result<(), ObserveError> {
        Ok(())
    }

    /// Node paths the section owns, which whole-file items may not write: (path, owner
    /// named in the refusal).
    fn reserved(&self, _config: &Config, _obs: &Observed) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Whole files the section writes through the shared file machinery, and its changes
    /// refused before any file is known.
    fn file_items<'a>(&self, _input: &Input<'a>) -> FileItems<'a> {
        FileItems::default()
    }

    /// How to revert a recorded file of this section (its [`ManagedFile::item`] marker)
    /// that left the spec; None when the file is not this section's.
    ///
    /// [`ManagedFile::item`]: crate::state::ManagedFile::item
    fn dropped_file(&self, _item: Option<&str>, _path: &str) -> Option<DroppedFile> {
        None
    }

    /// Diffs desired × observed × applied record into changes, steps and the next record.
    /// `out` holds what the sections before this one planned.
    fn diff(&self, _input: &Input<'_>, _out: &mut Output) {}

    /// True when `change`, still listed by the re-plan after an apply of `steps`, is
    /// verified only after the boot (the apply did what it could).
    fn verified_after_boot(&self, _change: &pb::Change, _steps: &Steps) -> bool {
        false
    }

    /// After the boot: what the running node lacks or still has of an operation's
    /// `changes`.
    fn verify_after_boot(&self, _changes: &[pb::Change], _boot: &Boot<'_>) -> AfterBoot {
        AfterBoot::default()
    }

    /// Managed items of the record whose node state differs from it.
    fn drift(&self, _view: &DriftView<'_>) -> Vec<pb::Drift> {
        Vec::new()
    }

    /// Node paths whose directories hold managed items (watched for drift).
    fn watched(&self, _view: &DriftView<'_>) -> Vec<String> {
        Vec::new()
    }
}

/// Inputs that are not the spec, the node or the record.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Reboot policy FORBIDDEN: changes needing a reboot are not covered.
    pub reboot_forbidden: bool,
    /// Node paths the `files` section may not write, with the owner to name (the agent's
    /// own state directory when it lies inside the sysroot).
    pub reserved: Vec<(String, String)>,
    /// node.d drop-in paths to leave as they are on the node (a drop-in file that does not
    /// parse, whose last applied version stays in effect): neither written nor removed,
    /// their record entries carried over.
    pub leave_files: Vec<String>,
}

/// What a section plans from: pure data, no I/O.
#[derive(Debug)]
pub struct Input<'a> {
    /// The desired spec.
    pub desired: &'a NodeSpec,
    /// The node as observed.
    pub obs: &'a Observed,
    /// The applied record.
    pub record: &'a AppliedRecord,
    /// Agent config.
    pub config: &'a Config,
    /// Planning options.
    pub opts: &'a Options,
    /// Paths owned by a section (or the agent): path → owner.
    pub reserved: BTreeMap<String, String>,
}

/// What the sections plan: changes (unsorted), steps and the next applied record.
#[derive(Debug, Default)]
pub struct Output {
    /// Changes of the report.
    pub changes: Vec<pb::Change>,
    /// Steps that converge the node.
    pub steps: Steps,
    /// The applied record once the steps are committed.
    pub next: AppliedRecord,
}

impl Output {
    /// Adds a change.
    pub fn push(&mut self, c: ChangeBuilder<'_>) {
        self.changes.push(c.build());
    }

    /// Marks every change whose id starts with `prefix` not covered with `reason`.
    pub fn fail_all(&mut self, prefix: &str, reason: &str) {
        for c in self.changes.iter_mut().filter(|c| c.id.starts_with(prefix)) {
            c.covered = false;
            c.reason = reason.to_string();
        }
    }
}

/// The node after a boot, for [`Section::verify_after_boot`].
#[derive(Debug, Clone, Copy)]
pub struct Boot<'a> {
    /// The running kernel command line (`/proc/cmdline`).
    pub running: &'a str,
    /// The next boot's command line as configured.
    pub next_boot: &'a str,
}

/// What the running node lacks (`missing`) or still has (`lingering`) of an operation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AfterBoot {
    /// Items the operation added that the booted node lacks.
    pub missing: Vec<String>,
    /// Items the operation removed that the booted node still has.
    pub lingering: Vec<String>,
}

/// What drift is read with: the sysroot, the agent config and the applied record.
#[derive(Debug, Clone, Copy)]
pub struct DriftView<'a> {
    /// The node's root.
    pub root: &'a Sysroot,
    /// Agent config.
    pub config: &'a Config,
    /// The applied record.
    pub record: &'a AppliedRecord,
}
