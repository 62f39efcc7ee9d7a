//! The one rollback of a running operation ([`Agent::roll_back_run`]): what a failed
//! transition reports ([`Fail`]), the list of completed steps ([`Undo`]) undone in reverse,
//! and after a failed gate ([`Stage::Gate`](crate::sections::kit::effect::Stage::Gate), the kubelet's health) the units restarted
//! with the restored files and the gate asked again; then the operation's message says
//! exactly that.
//! (A crash is rolled back from the journal instead: [`super::journal`].)

use std::sync::Arc;

use super::Agent;
use super::machine::{IllegalTransition, Op};
use crate::sections::kit::effect::Effect;
use inplace_node::sysroot::Entry;
use inplace_wire::phase::Phase;

/// One completed step and how to undo it.
#[derive(Debug)]
pub(super) enum Undo {
    /// A file written or removed: its previous content and metadata (None = absent).
    File(String, Option<(Vec<u8>, Entry)>),
    /// A directory created.
    Dir(String),
    /// A change of a section's effect ([`crate::sections::kit::effect`]).
    Effect(Box<dyn crate::sections::kit::effect::Undo>),
    /// A boot-configuration command that ran (`update-grub`): run again once every other
    /// step is undone, so what it generates (`grub.cfg`) follows the restored inputs.
    Rerun(Vec<String>),
}

/// A failed transition: the phase it ends in (`Failed`: nothing was changed;
/// `RolledBack`: what was done is undone), and why.
#[derive(Debug)]
pub(super) struct Fail {
    /// The phase the operation ends in.
    end: Phase,
    /// Why: the first part of the operation's message.
    cause: String,
    /// The gate that failed ([`Stage::Gate`](crate::sections::kit::effect::Stage::Gate)): after the undo, the units of the intent
    /// are restarted and the gate asked again ([`Effect::recheck`]).
    recheck: Option<Arc<dyn Effect>>,
}

impl Fail {
    /// Ends `Failed`: nothing was changed.
    pub(super) fn failed(cause: impl Into<String>) -> Self {
        Fail {
            end: Phase::Failed,
            cause: cause.into(),
            recheck: None,
        }
    }

    /// Ends `RolledBack`: what was done is undone.
    pub(super) fn rolled_back(cause: impl Into<String>) -> Self {
        Fail {
            end: Phase::RolledBack,
            cause: cause.into(),
            recheck: None,
        }
    }

    /// Ends `RolledBack` after the failed `gate`: what was done is undone, the units are
    /// restarted with the restored files, the gate asked again.
    pub(super) fn unhealthy(cause: impl Into<String>, gate: Arc<dyn Effect>) -> Self {
        Fail {
            recheck: Some(gate),
            ..Fail::rolled_back(cause)
        }
    }

    /// Why: the first part of the operation's message.
    pub(super) fn cause(&self) -> &str {
        &self.cause
    }
}

/// A transition the machine refused (a bug): the operation fails there, rolled back
/// once it may have written.
impl From<IllegalTransition> for Fail {
    fn from(e: IllegalTransition) -> Self {
        let cause = format!("internal error: {e}");
        if matches!(
            e.from,
            Phase::Unspecified | Phase::Validating | Phase::Staging
        ) {
            Fail::failed(cause)
        } else {
            Fail::rolled_back(cause)
        }
    }
}

/// The message of a failed operation: the `cause`, then what its rollback did (`undone`,
/// [`Agent::undo`]'s account; none: nothing was changed), then after a failed gate the
/// units `restarted` and what the gate says `after` that ([`Effect::recheck`]).
fn rollback_message(cause: &str, undone: Option<&str>, again: Option<(String, String)>) -> String {
    let Some(undone) = undone else {
        return format!("{cause}; nothing was changed");
    };
    match again {
        Some((restarted, after)) => {
            format!("{cause}; {undone}; {restarted}; {after}")
        }
        None => format!("{cause}; {undone}"),
    }
}

impl Agent {
    /// The one rollback of a running operation, after `fail`: undoes the completed steps
    /// in reverse; after a failed gate, restarts the units of the intent (which the
    /// operation's state carries) with the restored files and asks the gate again; removes the journal; then ends the operation `Failed` (nothing
    /// was changed) or `RolledBack`, its message the cause and what was done about it.
    pub(super) fn roll_back_run(&self, op: &mut Op, undo: &[Undo], fail: Fail) {
        let message = if undo.is_empty() && fail.recheck.is_none() {
            rollback_message(&fail.cause, None, None)
        } else {
            let undone = self.undo(undo);
            let again = fail.recheck.as_ref().map(|gate| {
                let intent = op.state().intent();
                let units = intent.map(|i| i.units.as_slice()).unwrap_or(&[]);
                let restarted = self.restart_units(units);
                let after = self
                    .with_node(|node| gate.recheck(node))
                    .unwrap_or_default();
                (restarted, after)
            });
            rollback_message(&fail.cause, Some(&undone), again)
        };
        let _ = self.state.journal_remove(op.id());
        // a refusal here is a bug (a failure is decided once, by where it happened):
        // logged, and the operation still ends, Failed
        let next = op.state().failed(fail.end).or_else(|e| {
            tracing::error!(operation = %op.id(), error = %e, "ending a failed operation");
            op.state().failed(Phase::Failed)
        });
        let _ = self.publish(op, next, message);
    }

    /// Restarts `units` after a rollback so they run with the restored files.
    pub(super) fn restart_units(&self, units: &[String]) -> String {
        let mut done = Vec::new();
        for u in units {
            match self.services.restart(u) {
                Ok(()) => done.push(format!("{u} restarted")),
                Err(e) => done.push(format!("{u} restart failed: {e}")),
            }
        }
        if done.is_empty() {
            "no unit to restart".into()
        } else {
            done.join(", ")
        }
    }

    /// Undoes the completed steps in reverse, then runs the boot-configuration commands
    /// again over the restored inputs ([`Undo::Rerun`]); says what it did.
    fn undo(&self, undo: &[Undo]) -> String {
        let mut failed = Vec::new();
        let mut rerun = Vec::new();
        for u in undo.iter().rev() {
            let r = match u {
                Undo::Rerun(cmd) => {
                    rerun.insert(0, cmd);
                    continue;
                }
                Undo::File(path, Some((content, e))) => self
                    .root
                    .write_atomic(path, content, e.mode, e.uid, e.gid)
                    .map(|_| ())
                    .map_err(|e| format!("{path}: {e}")),
                Undo::File(path, None) => self
                    .root
                    .remove(path)
                    .map(|_| ())
                    .map_err(|e| format!("{path}: {e}")),
                Undo::Dir(d) => self
                    .root
                    .remove_dir_if_empty(d)
                    .map(|_| ())
                    .map_err(|e| format!("{d}: {e}")),
                Undo::Effect(u) => self.with_node(|node| u.undo(node)),
            };
            if let Err(e) = r {
                failed.push(e);
            }
        }
        let mut ran = Vec::new();
        for cmd in rerun {
            match self.runner.run(cmd) {
                Ok(_) => ran.push(cmd.join(" ")),
                Err(e) => failed.push(format!("re-running {}: {e}", cmd.join(" "))),
            }
        }
        let steps = undo.iter().filter(|u| !matches!(u, Undo::Rerun(_))).count();
        let again = if ran.is_empty() {
            String::new()
        } else {
            format!(", {} ran again over the restored files", ran.join(", "))
        };
        if failed.is_empty() {
            format!("{steps} step(s) undone{again}, the node is as before")
        } else {
            format!("undoing failed for {}", failed.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rollback_message;

    /// The message says what happened once: nothing changed, or what was undone (and
    /// after a failed health gate, the restart and the kubelet's health after it).
    #[test]
    fn the_rollback_message_is_true() {
        assert_eq!(
            rollback_message("staging: disk full", None, None),
            "staging: disk full; nothing was changed"
        );
        assert_eq!(
            rollback_message(
                "acting: restart failed",
                Some("2 step(s) undone, the node is as before"),
                None
            ),
            "acting: restart failed; 2 step(s) undone, the node is as before"
        );
        assert_eq!(
            rollback_message(
                "kubelet health check failed: GET http://127.0.0.1:1/healthz answered 500",
                Some("2 step(s) undone, the node is as before"),
                Some((
                    "kubelet.service restarted".into(),
                    "the kubelet is still unhealthy: GET http://127.0.0.1:1/healthz answered 500"
                        .into()
                ))
            ),
            "kubelet health check failed: GET http://127.0.0.1:1/healthz answered 500; 2 step(s) undone, the node is as before; kubelet.service restarted; the kubelet is still unhealthy: GET http://127.0.0.1:1/healthz answered 500"
        );
    }
}
