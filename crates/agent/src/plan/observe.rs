//! Observed state: everything the planner needs from the node, read once through the
//! sysroot, so that [`super::plan`] is a pure function. Each section reads its own part
//! ([`crate::sections::Section::observe`]); the types are in
//! [`crate::sections::observe`].

use crate::config::Config;
use crate::sections::{SECTIONS, file_items};
use crate::spec::NodeSpec;
use crate::state::{AppliedRecord, StateDir};
use inplace_node::sysroot::Sysroot;

pub use crate::sections::observe::*;
pub use inplace_formats::sysctl::{SYSCTL_DIRS, is_sysctl_conf, sysctl_path};

/// Reads what the planner needs for `desired` and `record`: what the file machinery
/// needs (accounts, the record's files and their saved originals), then each section's
/// part, in the order of [`SECTIONS`].
pub fn observe(
    root: &Sysroot,
    state: &StateDir,
    config: &Config,
    desired: &NodeSpec,
    record: &AppliedRecord,
) -> Result<Observed, ObserveError> {
    observe_with(root, state, config, desired, record, None)
}

/// [`observe`] with a runner for the read-only commands sections ask
/// (`kubelet --version`).
pub fn observe_with(
    root: &Sysroot,
    state: &StateDir,
    config: &Config,
    desired: &NodeSpec,
    record: &AppliedRecord,
    runner: Option<&dyn inplace_node::system::CommandRunner>,
) -> Result<Observed, ObserveError> {
    let node = NodeView {
        root,
        state,
        config,
        desired,
        record,
        runner,
    };
    let mut obs = Observed::empty();
    file_items::observe(&node, &mut obs)?;
    for s in SECTIONS {
        s.observe(&node, &mut obs)?;
    }
    Ok(obs)
}
