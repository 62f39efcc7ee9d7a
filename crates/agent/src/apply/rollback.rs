//! The one rollback of a running operation ([`Agent::roll_back_run`]): what a failed
//! transition reports ([`Fail`]), the list of completed steps ([`Undo`]) undone in reverse,
//! then the boot-configuration commands run again, `daemon-reload` again when the run did
//! one, and every unit the run stopped, restarted or reloaded put back into the state it
//! had before (restarted so it reads the restored files, or stopped when it was inactive)
//! and checked; after a failed gate ([`Stage::Gate`](crate::sections::kit::effect::Stage::Gate),
//! the kubelet's health) the gate is asked again. Each of the rollback's own actions is
//! listed in the operation's `actions` (`rollback: ...`) and logged at WARN.
//!
//! The phase says what the rollback achieved: `RolledBack` only when every undo
//! succeeded (each restored file read back); an undo that failed, or a step that has no
//! undo ([`crate::kubernetes::upgrade::Restore::Irreversible`]), ends `Failed` with
//! [`ROLLBACK_INCOMPLETE`] in the message, what is on disk now and where the saved
//! originals are, and `status` lists it as a problem until a later operation
//! ([`rollback_problem`]). "the node is as before" is said only when every unit's state
//! was checked too.
//! (A crash is rolled back from the journal instead: [`super::journal`].)

use std::sync::Arc;

use super::Agent;
use super::machine::{IllegalTransition, Op};
use crate::sections::kit::effect::{Effect, UnitAction, UnitTouched};
use crate::sections::kit::marker::Marker;
use inplace_node::sysroot::Entry;
use inplace_wire::phase::Phase;

/// The words a failed operation's message carries when its rollback did not complete:
/// `status` lists such an operation as a problem while it is the newest.
pub(crate) const ROLLBACK_INCOMPLETE: &str = "roll-back incomplete";

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
    /// A unit acted on (pushed before the action): put back once every file is back.
    Unit(UnitTouched),
    /// `systemctl daemon-reload` ran: run again once every unit file is back.
    DaemonReload,
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

/// What the rollback did, for the operation's message and actions.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Undone {
    /// Steps undone (commands run again not counted).
    steps: usize,
    /// Files written back and read back equal to their content before.
    verified_files: usize,
    /// Commands run again over the restored files.
    rerun: Vec<String>,
    /// What happened to each unit (`kubelet.service restarted, active`).
    units: Vec<String>,
    /// Units whose state after the rollback could not be checked.
    unchecked: usize,
    /// What could not be undone, each naming its path, command or unit.
    failed: Vec<String>,
    /// Where the content before of a path that could not be restored is kept.
    kept: Vec<String>,
    /// Every action, in order (listed as `rollback: <action>`).
    actions: Vec<String>,
}

impl Undone {
    fn act(&mut self, action: String) {
        tracing::warn!(action = %action, "rollback");
        self.actions.push(action);
    }

    fn fail(&mut self, what: String) {
        tracing::warn!(failure = %what, "rollback step failed");
        self.failed.push(what);
    }

    /// Whether every undo succeeded.
    fn complete(&self) -> bool {
        self.failed.is_empty()
    }

    /// What it did, as the message's middle part.
    fn describe(&self) -> String {
        let mut parts = vec![format!(
            "{} step(s) undone, {} file(s) restored and read back",
            self.steps, self.verified_files
        )];
        if !self.rerun.is_empty() {
            parts.push(format!(
                "{} ran again over the restored files",
                self.rerun.join(", ")
            ));
        }
        parts.extend(self.units.iter().cloned());
        if self.complete() && self.unchecked == 0 {
            parts.push("the node is as before".into());
        }
        parts.join(", ")
    }
}

/// The message of a failed operation: the `cause`, then what its rollback did (`undone`;
/// none: nothing was changed), then after a failed gate what the gate says `after` it
/// ([`Effect::recheck`]). An incomplete rollback says so ([`ROLLBACK_INCOMPLETE`]) with
/// what failed, what was done and where the content before is kept.
fn rollback_message(
    cause: &str,
    undone: Option<&Undone>,
    after: Option<String>,
    originals: &str,
) -> String {
    let Some(u) = undone else {
        return format!("{cause}; nothing was changed");
    };
    let mut m = if u.complete() {
        format!("{cause}; rolled back: {}", u.describe())
    } else {
        let kept = if u.kept.is_empty() {
            String::new()
        } else {
            format!("; {}", u.kept.join("; "))
        };
        format!(
            "{cause}; {ROLLBACK_INCOMPLETE}: {}; what was done: {}{kept}; the originals of files the agent overwrote first are kept in {originals}; check the node before the next operation",
            u.failed.join("; "),
            u.describe(),
        )
    };
    if let Some(a) = after {
        m = format!("{m}; {a}");
    }
    m
}

/// The problem `status` lists for `op` (the newest operation): one whose rollback did
/// not complete, until a later operation.
pub(crate) fn rollback_problem(op: &inplace_wire::pb::Operation) -> Option<String> {
    (op.phase == Phase::Failed as i32 && op.message.contains(ROLLBACK_INCOMPLETE)).then(|| {
        format!(
            "operation {}: {ROLLBACK_INCOMPLETE}, the node is not as before: {}",
            op.id, op.message
        )
    })
}

impl Agent {
    /// The one rollback of a running operation, after `fail`: undoes the completed steps
    /// ([`Agent::undo`]); after a failed gate asks the gate again; removes the journal;
    /// then ends the operation `Failed` (nothing was changed, or the rollback did not
    /// complete) or `RolledBack`, its message the cause and what was done about it, its
    /// actions the rollback's own.
    pub(super) fn roll_back_run(&self, op: &mut Op, undo: &[Undo], fail: Fail) {
        let originals = self.state.full("/originals");
        let (message, end) = if undo.is_empty() && fail.recheck.is_none() {
            (
                rollback_message(&fail.cause, None, None, &originals),
                fail.end,
            )
        } else {
            let undone = self.undo(undo);
            for a in &undone.actions {
                op.push_action(format!("rollback: {a}"));
            }
            let after = fail
                .recheck
                .as_ref()
                .and_then(|gate| self.with_node(|node| gate.recheck(node)));
            let end = if undone.complete() {
                fail.end
            } else {
                Phase::Failed
            };
            let m = rollback_message(&fail.cause, Some(&undone), after, &originals);
            (m, end)
        };
        let _ = self.state.journal_remove(op.id());
        if end == Phase::Failed && message.contains(ROLLBACK_INCOMPLETE) {
            tracing::warn!(operation = %op.id(), message = %message, "roll-back incomplete");
        }
        // a refusal here is a bug (a failure is decided once, by where it happened):
        // logged, and the operation still ends, Failed
        let next = op.state().failed(end).or_else(|e| {
            tracing::error!(operation = %op.id(), error = %e, "ending a failed operation");
            op.state().failed(Phase::Failed)
        });
        let _ = self.publish(op, next, message);
    }

    /// Undoes the completed steps in reverse, then runs the boot-configuration commands
    /// again over the restored inputs ([`Undo::Rerun`]), `daemon-reload` again, and puts
    /// every unit acted on back ([`Agent::put_back_unit`]); says what it did.
    fn undo(&self, undo: &[Undo]) -> Undone {
        let mut done = Undone::default();
        let mut rerun = Vec::new();
        let mut daemon_reload = false;
        for u in undo.iter().rev() {
            match u {
                Undo::Rerun(cmd) => rerun.insert(0, cmd),
                Undo::Unit(_) => {}
                Undo::DaemonReload => daemon_reload = true,
                Undo::File(path, before) => {
                    done.steps += 1;
                    self.restore_file(path, before.as_ref(), &mut done);
                }
                Undo::Dir(d) => {
                    done.steps += 1;
                    match self.root.remove_dir_if_empty(d) {
                        Ok(true) => done.act(format!("removed directory {d}")),
                        Ok(false) => {}
                        Err(e) => done.fail(format!("{d}: {e}")),
                    }
                }
                Undo::Effect(u) => {
                    done.steps += 1;
                    match self.with_node(|node| u.undo(node)) {
                        Ok(()) => {
                            done.verified_files += usize::from(u.verified_file());
                            done.act(u.describe());
                        }
                        Err(e) => done.fail(e),
                    }
                }
            }
        }
        for cmd in rerun {
            match self.runner.run(cmd) {
                Ok(_) => {
                    done.act(format!("ran {}", cmd.join(" ")));
                    done.rerun.push(cmd.join(" "));
                }
                Err(e) => done.fail(format!("re-running {}: {e}", cmd.join(" "))),
            }
        }
        if daemon_reload {
            match self.services.daemon_reload() {
                Ok(()) => done.act("daemon-reload".into()),
                Err(e) => done.fail(format!("daemon-reload: {e}")),
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for u in undo {
            // the first touch of a unit holds its state before the operation
            if let Undo::Unit(t) = u
                && seen.insert(t.unit.clone())
            {
                self.put_back_unit(t, &mut done);
            }
        }
        done
    }

    /// Writes `path` back to `before` (None: removes it) and reads it back; when that
    /// fails the content before is saved under the state directory's `originals/` and
    /// named.
    fn restore_file(&self, path: &str, before: Option<&(Vec<u8>, Entry)>, done: &mut Undone) {
        let r = match before {
            Some((content, e)) => self
                .root
                .write_atomic(path, content, e.mode, e.uid, e.gid)
                .map_err(|e| e.to_string())
                .and_then(|_| match self.root.read(path) {
                    Ok(Some(back)) if back == *content => Ok(()),
                    Ok(_) => Err("written back, but reading it back differs".into()),
                    Err(e) => Err(format!("written back, but reading it back failed: {e}")),
                }),
            None => self
                .root
                .remove(path)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        };
        match (r, before) {
            (Ok(()), Some(_)) => {
                done.verified_files += 1;
                done.act(format!("restored {path}"));
            }
            (Ok(()), None) => done.act(format!("removed {path} (created by the operation)")),
            (Err(e), _) => {
                let now = crate::sections::kit::observe::observe_file(&self.root, path)
                    .map(|o| o.fingerprint())
                    .unwrap_or_else(|e| format!("unreadable ({e})"));
                done.fail(format!("{path} not restored ({e}); it is now {now}"));
                if let Some((content, _)) = before {
                    match self.state.save_original(path, content) {
                        Ok(name) => done.kept.push(format!(
                            "the content before of {path} is saved as {}",
                            self.state.full(&format!("/originals/{name}"))
                        )),
                        Err(e) => done.kept.push(format!(
                            "the content before of {path} could not be saved ({e})"
                        )),
                    }
                }
            }
        }
    }

    /// Puts a unit the operation acted on back into its state before, so it reads the
    /// restored files: restarted (reloaded, try-restarted) when it was active, stopped
    /// when it was not; then checks it within `[kubelet] health_timeout_secs`.
    fn put_back_unit(&self, t: &UnitTouched, done: &mut Undone) {
        let u = &t.unit;
        let s = &*self.services;
        let (r, verb) = match (t.active_before, t.action) {
            (Some(false), UnitAction::Restart) => (s.stop(u), "stopped"),
            // it was not running: try-restart and reload left it so
            (Some(false), _) => return,
            (_, UnitAction::Restart) => (s.restart(u), "restarted"),
            (_, UnitAction::Reload) => (s.reload(u), "reloaded"),
            (_, UnitAction::TryRestart) => (s.try_restart(u), "try-restarted"),
        };
        if let Err(e) = r {
            done.fail(format!("putting {u} back: {e}"));
            return;
        }
        done.act(format!("{verb} {u}"));
        let timeout = std::time::Duration::from_secs(self.config.kubelet.health_timeout_secs);
        let want_active = t.active_before != Some(false);
        let wait = if want_active {
            timeout
        } else {
            std::time::Duration::ZERO
        };
        match (s.wait_active(u, wait), want_active) {
            (Ok(true), true) => done.units.push(format!("{u} {verb}, active")),
            (Err(_), false) => done.units.push(format!("{u} {verb}, inactive as before")),
            (Ok(false), _) => {
                done.unchecked += 1;
                done.units.push(format!(
                    "{u} {verb} (its state is not checked: the service manager does not report it)"
                ));
            }
            (Ok(true), false) => done.fail(format!("{u} is active after the stop")),
            (Err(e), true) => done.fail(format!("{u} {verb} but not active: {e}")),
        }
    }
}

/// What the journal could not put back after a crash whose last progress marker is
/// `step` ([`Marker::not_journaled`]), prefixed with [`ROLLBACK_INCOMPLETE`]: None when
/// its pre-images and effect entries undo everything. A marker that verifies but that no
/// step writes is incomplete too: what it reached is not known. `unknown`, a marker
/// that does not verify, is a problem of its own (the units are restarted) and
/// incomplete only when the operation carried a Kubernetes upgrade (`upgrade_carried`):
/// the torn marker may have been one of its steps, which the journal can not undo.
pub(super) fn after_crash(
    step: &str,
    upgrade_carried: bool,
    config: &crate::config::Config,
) -> Option<String> {
    let backup = &config.kubernetes.backup_dir;
    let why = match Marker::parse(step) {
        Some(m) => m.not_journaled(backup)?,
        None if step == "unknown" && upgrade_carried => format!(
            "the progress marker does not verify and the operation carried a Kubernetes upgrade, which may have begun: the binaries or packages it installed and what kubeadm upgrade node rewrote are not in the journal and were not put back; the previous binaries are kept in {backup} as <binary>-<version>"
        ),
        None if step == "unknown" => return None,
        None => format!(
            "the progress marker {step:?} is not one the engine writes, so what the operation reached is not known"
        ),
    };
    Some(format!("{ROLLBACK_INCOMPLETE}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::{ROLLBACK_INCOMPLETE, Undone, after_crash, rollback_message};
    use crate::sections::kit::marker::Marker;

    /// Every marker a step writes is understood after a crash: the engine's own are
    /// undone by the journal, a Kubernetes step is not (incomplete), and a text no step
    /// writes is incomplete too.
    #[test]
    fn every_marker_has_a_meaning_after_a_crash() {
        let config = crate::config::Config::default();
        for m in Marker::examples() {
            let r = after_crash(&m.text(), false, &config);
            let want = match &m {
                Marker::Kubernetes(step) => Some(format!(
                    "{ROLLBACK_INCOMPLETE}: a Kubernetes upgrade had begun (last step: {step}): the binaries or packages it installed and what kubeadm upgrade node rewrote are not in the journal and were not put back; the previous binaries are kept in /var/lib/inplaced-kubernetes/previous as <binary>-<version>"
                )),
                _ => None,
            };
            assert_eq!(r, want, "{m:?}");
        }
        assert!(
            after_crash("rebooting", false, &config)
                .unwrap()
                .contains("\"rebooting\" is not one the engine writes")
        );
        assert_eq!(after_crash("unknown", false, &config), None);
        // a torn marker of an operation with an upgrade: it may have been the upgrade's
        assert!(
            after_crash("unknown", true, &config)
                .unwrap()
                .starts_with(&format!("{ROLLBACK_INCOMPLETE}: the progress marker does not verify and the operation carried a Kubernetes upgrade"))
        );
    }

    /// The message says what happened once: nothing changed, what was undone (and
    /// "as before" only when every unit's state was checked), or that the rollback is
    /// incomplete with what failed and where the originals are.
    #[test]
    fn the_rollback_message_is_true() {
        assert_eq!(
            rollback_message("staging: disk full", None, None, "/s/originals"),
            "staging: disk full; nothing was changed"
        );
        let mut u = Undone {
            steps: 2,
            verified_files: 2,
            units: vec!["kubelet.service restarted, active".into()],
            ..Undone::default()
        };
        assert_eq!(
            rollback_message("acting: restart failed", Some(&u), None, "/s/originals"),
            "acting: restart failed; rolled back: 2 step(s) undone, 2 file(s) restored and read back, kubelet.service restarted, active, the node is as before"
        );
        u.unchecked = 1;
        u.units = vec!["kubelet.service restarted (its state is not checked: the service manager does not report it)".into()];
        let m = rollback_message(
            "x",
            Some(&u),
            Some("the kubelet is healthy again".into()),
            "/s/originals",
        );
        assert_eq!(
            m,
            "x; rolled back: 2 step(s) undone, 2 file(s) restored and read back, kubelet.service restarted (its state is not checked: the service manager does not report it); the kubelet is healthy again"
        );
        u.failed = vec!["putting kubelet.service back: start kubelet.service: failed".into()];
        u.kept = vec!["the content before of /a is saved as /s/originals/ab".into()];
        let m = rollback_message("x", Some(&u), None, "/s/originals");
        assert_eq!(
            m,
            format!(
                "x; {ROLLBACK_INCOMPLETE}: putting kubelet.service back: start kubelet.service: failed; what was done: 2 step(s) undone, 2 file(s) restored and read back, kubelet.service restarted (its state is not checked: the service manager does not report it); the content before of /a is saved as /s/originals/ab; the originals of files the agent overwrote first are kept in /s/originals; check the node before the next operation"
            )
        );
    }
}
