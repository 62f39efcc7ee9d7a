//! Observed state: everything the planner needs from the node, read once through the
//! sysroot, so that [`super::plan`] is a pure function. Each section reads its own part
//! ([`crate::sections::kit::Section::observe`]); the aggregate is
//! [`crate::sections::model::Observed`], the shared primitives are in
//! [`crate::sections::kit::observe`].

use crate::config::Config;
use crate::sections::SECTIONS;
use crate::sections::kit::Section;
use crate::sections::kit::file_items;
use crate::sections::kit::observe::{NodeView, ObserveError};
use crate::sections::model::{NodeSpec, Observed};
use crate::state::{AppliedRecord, StateDir};
use inplace_node::sysroot::Sysroot;

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
pub(crate) fn observe_with(
    root: &Sysroot,
    state: &StateDir,
    config: &Config,
    desired: &NodeSpec,
    record: &AppliedRecord,
    runner: Option<&dyn inplace_node::system::CommandRunner>,
) -> Result<Observed, ObserveError> {
    observe_over(SECTIONS, root, state, config, desired, record, runner)
}

/// [`observe_with`] over the given sections only (the verifying re-plan's,
/// [`super::verify`]), in their order, after the file machinery's part.
pub(crate) fn observe_over(
    sections: &[&dyn Section],
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
    for s in sections {
        s.observe(&node, &mut obs)?;
    }
    Ok(obs)
}
