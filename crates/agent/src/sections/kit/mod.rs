//! The kit every section is built with: the [`Section`] trait the planner drives, what a
//! section plans from ([`Input`]) and into ([`Output`]), and the shared machinery: the
//! change builder ([`change`]), the plan's steps ([`steps`]), the effects sections run
//! through the engine with their undo and journal entry ([`effect`]), the shared
//! observation primitives ([`observe`]) and the whole-file machinery ([`file_items`]).

pub(crate) mod change;
pub(crate) mod effect;
pub(crate) mod file_items;
pub(crate) mod marker;
pub(crate) mod observe;
pub(crate) mod overlay;
pub(crate) mod steps;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::BTreeMap;

use crate::config::Config;
use crate::sections::model::{NodeSpec, Observed};
use crate::state::AppliedRecord;
use change::ChangeBuilder;
use file_items::{DroppedFile, FileItems};
use inplace_node::sysroot::Sysroot;
use inplace_wire::pb;
use observe::{NodeView, ObserveError};
use steps::Steps;

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

    /// After the boot: what the running node lacks or still has of the whole applied
    /// `record`, whatever operation staged it (an operation superseded before the reboot
    /// staged part of what this boot must show); `boot_id` is the running boot's.
    fn verify_applied_after_boot(
        &self,
        _record: &AppliedRecord,
        _boot: &Boot<'_>,
        _boot_id: &str,
    ) -> AfterBoot {
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

/// Reads the node after a boot: the running kernel command line (`/proc/cmdline`; unknown
/// when it can not be read or is empty) and the next boot's command line as the boot
/// loader's configuration holds it (empty without a backend): owned, for a [`Boot`].
pub(crate) fn read_boot(
    root: &Sysroot,
    config: &Config,
) -> Result<(String, String), observe::Unknown> {
    let running = observe::observe_running(root, "/proc/cmdline")?;
    let next_boot = crate::bootloader::detect(root, config.kernel_args.backend)
        .map(|b| b.next_boot().render())
        .unwrap_or_default();
    Ok((running.trim_end().to_string(), next_boot))
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
