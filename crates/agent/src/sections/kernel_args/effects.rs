//! The `kernelArgs` section's effect: a boot-configuration command (the backend's own
//! edit, `rpm-ostree kargs ...`, or the regeneration after a file edit, `update-grub`,
//! `grub2-mkconfig -o ...`), run in Acting before the unit actions. Its undo and its
//! journal entry are the same: run it again once every other step is undone, so that what
//! it generates (`grub.cfg`) follows the restored inputs.

use crate::bootloader::PendingTrial;
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
    /// The command that undoes it, when running it again does not (a one-shot boot is
    /// cleared, not set again); None: run it again.
    pub undo: Option<Vec<String>>,
}

/// The undo of a step that sets or clears the boot loader's one-shot: the command that
/// leaves it as it was before the operation, `before` being the trial pending then (None:
/// none was). Set again (the pending trial's own command) only when it was known to be
/// set; otherwise cleared (`clear`). An unknown one-shot counts as not set: it may have
/// been consumed already (the trial booted and the agent is rebooting back), and setting
/// it again would boot that trial once more, while a waiting operation whose one-shot is
/// not set boots the old default and ends `RolledBack`, to be applied again.
fn one_shot_as_before(before: Option<&PendingTrial>, clear: &[String]) -> Vec<String> {
    match before {
        Some(p) if p.one_shot_pending == Some(true) => p.set_one_shot.clone(),
        _ => clear.to_vec(),
    }
}

/// The steps of a trial boot ([`crate::bootloader::trial`]): the artefact written, then
/// its commands (regeneration, the one-shot), and the reboot. The boot configuration's
/// default is not touched: the commit after a healthy boot is. The one-shot's undo puts
/// it back as it was ([`one_shot_as_before`]): over a trial pending with its one-shot
/// set (`before`), a roll-back sets it again for that trial, whose operation still waits
/// (an operation is superseded only once another one commits).
pub(crate) fn trial_steps(
    steps: &mut crate::sections::kit::steps::Steps,
    t: crate::bootloader::TrialPlan,
    before: Option<&PendingTrial>,
) {
    for w in t.writes {
        steps.writes.push(crate::sections::kit::steps::Write {
            path: w.path,
            content: w.content,
            mode: w.mode,
            uid: 0,
            gid: 0,
            keep_meta: false,
            expect: w.expect,
            save_original: None,
            managed_file: false,
        });
    }
    let n = t.commands.len();
    for (i, argv) in t.commands.into_iter().enumerate() {
        let last = i + 1 == n;
        steps.effect(BootCommand {
            argv,
            // the arguments are verified after the boot only
            edits_args: last,
            undo: last.then(|| one_shot_as_before(before, &t.clear_one_shot)),
        });
    }
    steps.reboot = true;
}

impl BootCommand {
    fn undo_argv(&self) -> &[String] {
        self.undo.as_deref().unwrap_or(&self.argv)
    }
}

impl Effect for BootCommand {
    fn stage(&self) -> Stage {
        Stage::BeforeUnits
    }

    fn journal_entry(&self, _node: &Node<'_>) -> Option<EffectEntry> {
        Some(EffectEntry::Rerun(self.undo_argv().to_vec()))
    }

    /// Reports its undo before it runs: a command that fails half-way may have written
    /// its output already, and running it again over restored inputs is harmless.
    fn apply(&self, node: &Node<'_>, report: &mut dyn Report) -> Result<(), EffectError> {
        report.undo(UndoEntry::Rerun(self.undo_argv().to_vec()));
        node.runner
            .run(&self.argv)
            .map_err(|e| EffectError::RolledBack(e.to_string()))?;
        report.action(format!("ran {}", self.argv.join(" ")));
        Ok(())
    }
}

/// The steps that drop a pending trial a new plan supersedes without a trial of its own
/// (the change it carried is no longer wanted, or is made directly): its artefact
/// removed, the regeneration, the one-shot cleared. A roll-back puts the artefact back
/// and the one-shot as it was ([`one_shot_as_before`]): set again only when it was set,
/// for the trial whose operation still waits; never set where it was not.
pub(crate) fn drop_trial_steps(steps: &mut crate::sections::kit::steps::Steps, t: &PendingTrial) {
    steps.removes.push(crate::sections::kit::steps::Remove {
        path: t.path.clone(),
        expect: t.fingerprint.clone(),
        dirs: Vec::new(),
    });
    let n = t.cleanup.len();
    for (i, argv) in t.cleanup.iter().enumerate() {
        let last = i + 1 == n;
        steps.effect(BootCommand {
            argv: argv.clone(),
            edits_args: false,
            undo: last.then(|| one_shot_as_before(Some(t), argv)),
        });
    }
}
