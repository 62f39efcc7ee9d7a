//! The `kernelArgs` section's effect: a boot-configuration command (the backend's own
//! edit, `rpm-ostree kargs ...`, or the regeneration after a file edit, `update-grub`,
//! `grub2-mkconfig -o ...`), run in Acting before the unit actions. Its undo and its
//! journal entry are the same: run it again once every other step is undone, so that what
//! it generates (`grub.cfg`) follows the restored inputs.

use crate::sections::kit::effect::{Effect, EffectError, Node, Report, Stage, UndoEntry};
use crate::state::EffectEntry;

/// Runs a boot-configuration command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BootCommand {
    /// The command, argv.
    pub argv: Vec<String>,
    /// The command edits the kernel arguments itself (rpm-ostree), so they can only be
    /// verified after the boot, in `/proc/cmdline`.
    pub edits_args: bool,
}

impl Effect for BootCommand {
    fn stage(&self) -> Stage {
        Stage::BeforeUnits
    }

    fn journal_entry(&self, _node: &Node<'_>) -> Option<EffectEntry> {
        Some(EffectEntry::Rerun(self.argv.clone()))
    }

    /// Reports its undo before it runs: a command that fails half-way may have written
    /// its output already, and running it again over restored inputs is harmless.
    fn apply(&self, node: &Node<'_>, report: &mut dyn Report) -> Result<(), EffectError> {
        report.undo(UndoEntry::Rerun(self.argv.clone()));
        node.runner
            .run(&self.argv)
            .map_err(|e| EffectError::RolledBack(e.to_string()))?;
        report.action(format!("ran {}", self.argv.join(" ")));
        Ok(())
    }
}
