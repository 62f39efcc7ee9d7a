//! The write-ahead journal of an operation: what is written before the first change
//! (the intent), and how the next start settles an operation a crash interrupted.
//!
//! ## The order of writes and fsyncs (journal format 2)
//!
//! A crash (power cut, SIGKILL) at any instant leaves every managed file entirely old or
//! entirely new, and the next start settles the operation. Every file is written to a
//! temporary file and renamed over its target; the journal is flat files in `journal/`
//! (layout and version rule: `crate::state`, `journal_v2.rs`); the barriers are:
//!
//! 0. `operations/<id>.json` in phase Staging, without an fsync: the intent holds a copy
//!    of it (a power cut before the intent is durable changed nothing on the node).
//!    Validating, Committing, Acting and Verifying are published to watchers only: a
//!    crash in them is settled from the journal, which sets the operation's phase.
//! 1. `originals/<hash>` for first overwrites and `journal/<op>.pre-<n>` (the pre-image
//!    of every path the operation or its effects write or remove, except a file that
//!    still has the content of a file item of the applied spec: its pre-image names the
//!    spec, whose durable copy already holds the bytes, see `PRE_FROM_APPLIED_SPEC`):
//!    each file's content fsynced, then `originals/` fsynced once; then `journal/<op>.intent` (paths,
//!    pre-image metadata, directories to be created, prior sysctl values, units, the
//!    Staging operation): content, then `journal/` fsynced, which makes the pre-images'
//!    names durable too.
//!    Failpoint `stage`. `progress` = `staged`, a new file, not fsynced: the witness
//!    that the intent was complete (an intent missing beside it is damage).
//! 2. Each file: temporary file, write, fchown, fchmod, fsync, rename (failpoints
//!    `write-temp`, `write`); removals unlink; then each directory written into or
//!    removed from is fsynced once; then live sysctls (`sysctl`); `progress` = `written`.
//! 3. Commands and unit actions; `progress` = `acted` when there were any (failpoint
//!    `act`); the kubelet's health gate; verification by re-planning. The engine's own
//!    markers are never fsynced: they only word the message of a roll-back (which
//!    restarts the units whenever a path went back, or the marker is past `staged`); a
//!    power cut can leave an earlier step, or a marker that does not verify, which
//!    recovery reports and handles. An effect's marker (a Kubernetes upgrade's step,
//!    which the journal can not undo) is written durably, so no power cut brings back
//!    an earlier one, and `written` and `acted` are not written over it; one that does
//!    not verify in an operation carrying an upgrade is an incomplete roll-back.
//! 4. The commit point: `journal/<op>.commit`, one sealed file with the record, the phase
//!    to end in and the spec: content, then `journal/` fsynced (failpoint `record`).
//! 5. The intent, progress and pre-images and the previous operation's commit removed
//!    without an fsync (failpoint `applied`); nothing is installed: the commit stays as
//!    the applied state (the readers take the highest pending commit that verifies before
//!    `applied.json` and `applied-spec.pb`) until something newer is durable, and a start
//!    installs it (with fsyncs) before removing it. Up to c649bfd both files were written
//!    here, without an fsync, at every operation.
//! 6. The settled operation: file and `operations/` fsynced (failpoints
//!    `reboot-required`, then `settled`).
//!
//! A 1-file apply of a new file into an existing directory does 8 fsyncs (2 + 2 + 2 + 2:
//! intent, file, commit, settled operation; 18 in format 1); each further file adds one
//! (its content), each further directory one, each pre-image or original one; removing
//! n managed files that are still what the spec gave them does 7 (the intent, one per
//! directory, the commit, the settled operation: no pre-image is copied; 21 for one file
//! in format 1, 8 + n while every pre-image was copied). The first operation on a fresh
//! state directory adds 4 (creating `operations/` and `journal/`).
//!
//! Format 1 (`journal/<op>/`, inplaced up to 43048f4: the intent, `pre/<n>`, `progress`,
//! then `spec.pb` and `record.json` and the empty `committed` marker, the installed
//! record with fsyncs and the journal removed before the settled operation) is no longer
//! written; a format-1 journal found at start is settled exactly as that agent did.
//!
//! At start ([`Agent::recover_journals`]): a journal with a commit is rolled forward (its
//! record installed, the operation ends in the phase it recorded; in format 2 an
//! operation whose file is already past Staging, i.e. settled after its commit, is left as
//! it is: only its record is installed again; otherwise the operations waiting for a
//! reboot are superseded then, as its run does just past the commit point); any other is
//! rolled back and the operation ends `RolledBack` (`interrupted`, naming every path put
//! back), and an operation waiting for a reboot still waits. When a path
//! went back, the units the intent names are restarted and each is checked active again
//! (a unit that does not restart or is not active is named in the message and status,
//! and the operation ends `Failed`: the node is not as before). One that never completed
//! its intent, or whose journal does not verify, ends `Failed`. Re-applying either with
//! the same id runs it again.
//!
//! The paths an effect removes (the kubelet's CPU and memory manager checkpoints, reset
//! with a policy change) are intent entries too, with their pre-images: a rollback writes
//! each back over whatever is there then, since the restarted kubelet may have written a
//! checkpoint of the new policy, which the old one refuses. The pre-image is the
//! checkpoint at Staging (the reset needs a drained node, so it does not change before
//! the reset).
//!
//! ## What the journal guarantees
//!
//! Every journal file is verified before it is trusted: the intent, `progress`, the
//! commit (format 1: `record.json` and `spec.pb`) carry a header with their SHA-256 and length
//! ([`crate::state::seal`]); each pre-image's SHA-256 and length are in the intent,
//! written after it. Rolling back restores a pre-image only when it verifies and only
//! over a file that is no longer what it was (same hash, mode and owner as the pre-image:
//! left alone); a file the operation created is removed only while it still has the
//! content the operation wrote; a file that is neither the pre-image nor the new content
//! (another writer) is left and named. Every restored and removed path is named in the
//! operation's message and in the log. A journal that does not verify (a damaged intent,
//! pre-image or progress marker, a committed record that does not verify and no intent
//! to roll back with) is moved aside whole to `quarantine/<op>-<time>`: nothing is
//! restored from it, and each file it names is listed in `status` problems with its
//! pre-image hash, the new hash and what is on disk now. The agent starts and serves in
//! every case; when it cannot write its state directory it refuses mutations
//! (`UNAVAILABLE`) and says why.
//!
//! The file primitives (temporary file, fsync, rename, directory fsync) are
//! [`inplace_node::sysroot`]'s and [`crate::state`]'s; this module decides what goes into
//! the journal and in which order it is read back.

use super::machine::Op;
use super::{Agent, now};
use crate::sections::kit::effect::UndoEntry;
use crate::sections::kit::marker::Marker;
use crate::sections::kit::observe::{FileObs, observe_file};
use crate::sections::kit::steps::Steps;
use crate::state::{Committed, Intent, IntentEntry, JournalState, Sealed, sha256_of};
use inplace_wire::pb;
use inplace_wire::phase;
use inplace_wire::phase::{INTERRUPTED, Phase};

/// How long a unit restarted after a rollback from the journal may take to be active.
const UNIT_ACTIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How the journal of one operation was settled at start.
struct Settled {
    /// The phase the operation ends in (one of [`phase::FROM_JOURNAL`]).
    end: Phase,
    /// Its message: what was restored, removed, left, and why.
    message: String,
    /// The journal is done with and is removed (false: kept or quarantined).
    remove: bool,
}

/// What rolling back did, path by path.
#[derive(Default)]
struct RolledBack {
    restored: Vec<String>,
    removed: Vec<String>,
    untouched: usize,
    /// Boot-configuration commands run again over the restored inputs.
    rerun: Vec<String>,
    /// Units that failed to restart or were not active after it: what and why.
    units_down: Vec<String>,
    problems: Vec<String>,
}

impl Agent {
    /// The write-ahead intent of `steps`: a pre-image of every path (written to the
    /// journal), including the paths effects remove ([`crate::sections::kit::effect::Effect::journaled_removals`]:
    /// the kubelet's manager checkpoints), the directories writes will create, each
    /// effect's journal entry (the prior value of a live sysctl), the boot-configuration
    /// commands.
    pub(super) fn intent(&self, op: &pb::Operation, steps: &Steps) -> Result<Intent, String> {
        use crate::state::IntentEntry;
        use inplace_node::sysroot::Parents;
        let mut entries = Vec::new();
        // the effects' removals (the kubelet's manager checkpoints) last: put back over
        // whatever the service wrote since
        let removals: Vec<String> = steps
            .effects
            .iter()
            .flat_map(|e| e.journaled_removals())
            .collect();
        let paths = steps
            .writes
            .iter()
            .map(|w| {
                (
                    w.path.as_str(),
                    Some(crate::state::sha256_of(&w.content)),
                    false,
                )
            })
            .chain(steps.removes.iter().map(|r| (r.path.as_str(), None, false)))
            .chain(removals.iter().map(|p| (p.as_str(), None, true)));
        let applied = std::cell::OnceCell::new();
        for (n, (path, new_sha256, restore_over_any)) in paths.enumerate() {
            let from_spec = (!restore_over_any).then_some(&applied);
            let pre = self.pre_image(&op.id, n, path, from_spec)?;
            let mut missing_dirs = Vec::new();
            if let Ok(Parents::Missing(first)) = self.root.parents(path) {
                let mut d = String::new();
                for c in inplace_node::sysroot::components(path).map_err(|e| e.to_string())? {
                    d.push('/');
                    d.push_str(c);
                    if d.len() >= first.len() && d.as_str() != path {
                        missing_dirs.push(d.clone());
                    }
                }
            }
            if restore_over_any {
                missing_dirs.clear();
            }
            entries.push(IntentEntry {
                path: path.to_string(),
                pre,
                missing_dirs,
                new_sha256,
                restore_over_any,
            });
        }
        let effects = steps
            .effects
            .iter()
            .filter_map(|e| self.with_node(|node| e.journal_entry(node)))
            .collect();
        let units = steps
            .restarts
            .iter()
            .chain(steps.try_restarts.iter())
            .chain(steps.reloads.iter())
            .cloned()
            .collect();
        Ok(Intent {
            version: crate::state::JOURNAL_VERSION,
            operation: op.id.clone(),
            entries,
            effects,
            units,
            staged: serde_json::to_value(op).ok(),
        })
    }

    /// The pre-image of `path` (None: absent), written to the journal as operation
    /// `op`'s `n`th; or, when `applied` is given and a durable copy of the applied spec
    /// has a file item with exactly this content (a managed file removed or overwritten
    /// that is still what the agent wrote), named as the spec's
    /// ([`crate::state::PRE_FROM_APPLIED_SPEC`]): no copy and no fsync. Either way the
    /// file is read now, and its SHA-256, length, mode and owner are the ones it has now:
    /// a rollback restores exactly those, from the spec's copy after verifying it.
    fn pre_image(
        &self,
        op: &str,
        n: usize,
        path: &str,
        applied: Option<&std::cell::OnceCell<crate::state::AppliedContents>>,
    ) -> Result<Option<crate::state::PreImage>, String> {
        Ok(
            match observe_file(&self.root, path).map_err(|e| e.to_string())? {
                FileObs::File { content, entry } => {
                    let sha256 = crate::state::sha256_of(&content);
                    let in_spec = applied.is_some_and(|a| {
                        a.get_or_init(|| self.state.applied_contents())
                            .get(content.len() as u64, &sha256)
                            .is_some_and(|b| b == content.as_slice())
                    });
                    let file = if in_spec {
                        crate::state::PRE_FROM_APPLIED_SPEC.to_string()
                    } else {
                        self.state
                            .journal_pre_image(op, n, &content)
                            .map_err(|e| e.to_string())?
                    };
                    Some(crate::state::PreImage {
                        file,
                        sha256,
                        len: content.len() as u64,
                        mode: entry.mode,
                        uid: entry.uid,
                        gid: entry.gid,
                    })
                }
                _ => None,
            },
        )
    }

    /// Settles the journal of every operation a crash interrupted (see the module docs).
    /// Never fails: what can not be settled is listed in the status problems, and when
    /// the state directory could not be written the agent refuses mutations.
    pub(super) fn recover_journals(&self) {
        for (path, report) in self.state.quarantined() {
            self.note(format!(
                "{path}: a quarantined journal; nothing was restored from it; check the files it names, then remove it: {}",
                report.trim_end()
            ));
        }
        let journals = match self.state.journals() {
            Ok(j) => j,
            Err(e) => {
                self.problem(format!("reading the journals: {e}"));
                self.set_unavailable(format!("its journals could not be read ({e})"));
                return;
            }
        };
        for (id, j) in journals {
            let settled = self.settle_journal(&id, &j);
            self.finish_journal(&id, &j, settled);
        }
    }

    /// Decides from what verifies: roll forward past the commit point, roll back from a
    /// verified intent, or quarantine.
    fn settle_journal(&self, id: &str, j: &JournalState) -> Settled {
        match (&j.committed, &j.intent) {
            (Some(Sealed::Valid(c)), _) => {
                self.report_unused_damage(id, j);
                self.roll_forward(id, c)
            }
            (Some(Sealed::Damaged(why)), Sealed::Valid(intent)) => self.roll_back(
                id,
                j,
                intent,
                Some(format!(
                    "its committed record does not verify ({why}), so it is rolled back instead"
                )),
            ),
            (None, Sealed::Valid(intent)) => self.roll_back(id, j, intent, None),
            (None, Sealed::Absent) if j.progress == Sealed::Absent => Settled {
                end: Phase::Failed,
                message: format!(
                    "{INTERRUPTED} the agent stopped before the operation's journal was complete; nothing was changed; re-apply with the same operation id to converge"
                ),
                remove: true,
            },
            (_, Sealed::Damaged(why)) => self.quarantine(id, j, why),
            // format 2: a commit outlives its operation's intent (retired once the commit
            // was durable), so this is an ended operation's commit, damaged since
            (Some(Sealed::Damaged(why)), Sealed::Absent) if j.version != 1 => self.quarantine(
                id,
                j,
                &format!(
                    "its commit does not verify ({why}); the operation had ended and the applied state it committed is lost: the record falls back to the newest state that verifies, so re-apply the desired spec to converge"
                ),
            ),
            (_, Sealed::Absent) => self.quarantine(
                id,
                j,
                &format!(
                    "{}: missing although the journal has progress or a commit",
                    self.state.journal_file(j.version, id, "intent")
                ),
            ),
            (Some(Sealed::Absent), _) => self.quarantine(id, j, "the committed record is missing"),
        }
    }

    /// Past the commit point the intent and the pre-images are not needed; damage to
    /// them is still reported.
    /// In format 2 the intent, progress and pre-images are removed once the commit is
    /// installed: their absence is not damage.
    fn report_unused_damage(&self, id: &str, j: &JournalState) {
        let mut bad = Vec::new();
        let v1 = j.version == 1;
        match &j.intent {
            Sealed::Damaged(why) => bad.push(why.clone()),
            Sealed::Valid(intent) => {
                // a pre-image read from the applied spec is no file of this journal
                for pre in intent
                    .entries
                    .iter()
                    .filter_map(|e| e.pre.as_ref())
                    .filter(|p| v1 || !p.is_from_applied_spec())
                {
                    if let Err(why) = self.state.journal_read_pre(j.version, id, pre) {
                        bad.push(why);
                    }
                }
            }
            Sealed::Absent if v1 => bad.push(format!(
                "{}: missing although the operation committed",
                self.state.journal_file(1, id, "intent")
            )),
            Sealed::Absent => {}
        }
        match &j.progress {
            Sealed::Damaged(why) => bad.push(why.clone()),
            Sealed::Absent if v1 => bad.push(format!(
                "{}: missing although the operation committed",
                self.state.journal_file(1, id, "progress")
            )),
            Sealed::Absent | Sealed::Valid(_) => {}
        }
        if !bad.is_empty() {
            self.problem(format!(
                "operation {id}: committed, rolled forward; parts of its journal it did not need do not verify: {}",
                bad.join("; ")
            ));
        }
    }

    /// Ends the operation in the phase `settled` says ([`super::machine::OpState::settled_by_journal`],
    /// whatever phase its file said; an operation file that does not parse is moved aside,
    /// and a phase the machine refuses left as it was, with the outcome listed in the
    /// problems), then removes the journal when it is done with.
    fn finish_journal(&self, id: &str, j: &JournalState, settled: Settled) {
        // format 2 writes the Staging operation without an fsync: the journal has a copy
        // (the commit's, else the intent's)
        let copy = journal_copy(id, j);
        let mut read = self.state.get_operation(id);
        if let (Ok(Some(wire)), Some(c)) = (&read, &copy)
            && wire.created != c.created
        {
            // an earlier run of the same id: this run's Staging write was lost
            read = Ok(None);
        }
        if j.version != 1
            && let Ok(Some(wire)) = &read
            && !pre_commit(wire.phase)
        {
            // this run settled after its journal was done with (the commit a settled
            // operation keeps, installed again above): the operation is left as it is
            tracing::debug!(operation = %id, "settled journal of a settled operation");
            self.remove_journal(id, &settled);
            return;
        }
        tracing::warn!(operation = %id, message = %settled.message, "settled an interrupted operation");
        let staged = copy;
        let read = match (read, staged) {
            (Ok(None), Some(op)) => Ok(Some(op)),
            (Err(e), Some(op)) => {
                let moved = self
                    .state
                    .operation_quarantine(id)
                    .map(|p| format!("moved to {p}"))
                    .unwrap_or_else(|e| format!("not moved: {e}"));
                self.problem(format!(
                    "{e} ({moved}); the operation is settled from the copy in its journal: {}",
                    settled.message
                ));
                Ok(Some(op))
            }
            (r, _) => r,
        };
        self.enter_settled(id, read, &settled);
        // rolled forward: the operation committed, so the operations waiting for a
        // reboot whose staged changes it replaced are superseded now, as its run would
        // have just past the commit point had it not stopped there (engine.rs)
        if matches!(j.committed, Some(Sealed::Valid(_))) {
            self.supersede_waiting(id);
        }
        self.remove_journal(id, &settled);
    }

    /// Enters the phase `settled` says in the operation `read` back (its file, or the
    /// copy in its journal) and saves it; what can not be read or saved is a problem
    /// naming the outcome.
    fn enter_settled(
        &self,
        id: &str,
        read: Result<Option<pb::Operation>, crate::state::StateError>,
        settled: &Settled,
    ) {
        match read {
            Ok(Some(wire)) => {
                let mut op = Op::read_back(wire);
                let next = op
                    .state()
                    .settled_by_journal(settled.end, &op.wire().boot_id);
                let saved = next
                    .and_then(|n| op.enter(n, settled.message.clone(), now()))
                    .map_err(|e| e.to_string())
                    .and_then(|()| self.save_op(op.wire()).map_err(|e| e.to_string()));
                if let Err(e) = saved {
                    self.problem(format!("operation {id}: {} ({e})", settled.message));
                }
            }
            Ok(None) => self.problem(format!(
                "operation {id} (no operation file): {}",
                settled.message
            )),
            Err(e) => {
                let moved = self
                    .state
                    .operation_quarantine(id)
                    .map(|p| format!("moved to {p}"))
                    .unwrap_or_else(|e| format!("not moved: {e}"));
                self.problem(format!(
                    "{e} ({moved}); the operation's outcome: {}",
                    settled.message
                ));
            }
        }
    }

    /// Removes the journal of `id` when `settled` is done with it; a failure is a problem
    /// and refuses mutations.
    fn remove_journal(&self, id: &str, settled: &Settled) {
        if settled.remove
            && let Err(e) = self.state.journal_remove(id)
        {
            self.problem(format!(
                "operation {id}: its journal could not be removed: {e}"
            ));
            self.set_unavailable(format!(
                "the journal of operation {id} could not be removed ({e})"
            ));
        }
    }

    /// Past the commit point: the record and the spec the journal holds are installed
    /// and the operation ends in the phase it recorded. When they can not be installed
    /// the journal is kept for the next start and mutations are refused meanwhile.
    fn roll_forward(&self, id: &str, c: &Committed) -> Settled {
        let installed = self.state.install_applied(&c.record, &c.spec);
        let reboot = c.phase == Phase::RebootRequired as i32;
        let committed = if reboot {
            "changes committed (completed after an agent restart); they take effect after a reboot: drain the node, then call Reboot"
        } else {
            "changes committed; completed after an agent restart"
        };
        match installed {
            Ok(()) => Settled {
                end: phase::from_i32(c.phase),
                message: committed.into(),
                remove: true,
            },
            Err(e) => {
                let why = format!(
                    "operation {id} is committed but its applied record could not be installed ({e}); the journal is kept and installed at the next start"
                );
                self.problem(why.clone());
                self.set_unavailable(why.clone());
                Settled {
                    end: phase::from_i32(c.phase),
                    message: format!("{committed}; {why}"),
                    remove: false,
                }
            }
        }
    }

    /// Before the commit point, from a verified intent: every pre-image verified first
    /// (one that does not: the journal is quarantined), then each path settled
    /// ([`Agent::roll_back_entry`]) in reverse, the effects' journal entries undone (live
    /// sysctls restored), then, if a path went back or the progress marker is past
    /// `staged`, the commands run again and the units restarted.
    fn roll_back(
        &self,
        id: &str,
        j: &JournalState,
        intent: &Intent,
        note: Option<String>,
    ) -> Settled {
        let pres = match self.verified_pre_images(id, j, intent) {
            Ok(p) => p,
            Err(why) => return self.quarantine(id, j, &why),
        };
        let mut done = RolledBack::default();
        for (e, pre) in intent.entries.iter().zip(pres).rev() {
            let _ = self.root.remove_stale_temps(&e.path);
            self.roll_back_entry(id, e, pre.as_deref(), &mut done);
            for d in e.missing_dirs.iter().rev() {
                let _ = self.root.remove_dir_if_empty(d);
            }
        }
        // the effects' undos (live values) once the paths are back; their reruns below
        let mut rerun = Vec::new();
        for e in &intent.effects {
            match crate::sections::journaled_undo(e) {
                UndoEntry::Step(u) => {
                    let _ = self.with_node(|node| u.undo(node));
                }
                UndoEntry::Rerun(cmd) => rerun.push(cmd),
                UndoEntry::Unit(_) => {}
            }
        }
        let step = match &j.progress {
            Sealed::Valid(p) => p.clone(),
            Sealed::Absent => "staged".into(),
            Sealed::Damaged(why) => {
                done.problems.push(format!(
                    "the progress marker does not verify ({why}): units restarted in case"
                ));
                "unknown".into()
            }
        };
        // the units read what is on disk now: restarted whenever a path went back, and
        // whenever the operation may have acted (a marker past `staged`, or one that does
        // not verify): an earlier start may have put every path back and died before
        // its reruns and restarts, so "nothing went back" does not mean the units and the
        // generated files are as before
        let may_have_acted = step != Marker::Staged.text();
        if !done.restored.is_empty() || !done.removed.is_empty() || may_have_acted {
            // what the commands generate from the restored inputs (grub.cfg from
            // /etc/default/grub) goes back too, before the units read anything
            for cmd in &rerun {
                match self.runner.run(cmd) {
                    Ok(_) => done.rerun.push(cmd.join(" ")),
                    Err(e) => done
                        .problems
                        .push(format!("re-running {} failed: {e}", cmd.join(" "))),
                }
            }
            done.units_down = self.restart_and_check(&intent.units);
        }
        // the phase says what happened (issue 20 §5): the journal's pre-images were put
        // back, whatever the step reached; RolledBack only when they undo everything
        // the step reached (issue 27 §1)
        let incomplete = super::rollback::after_crash(&step, carries_upgrade(intent), &self.config);
        done.problems.extend(incomplete.iter().cloned());
        // a unit that did not come back is not the node as before: Failed, named
        let units_down = !done.units_down.is_empty();
        for u in std::mem::take(&mut done.units_down) {
            self.problem(format!(
                "operation {id}: after rolling back from the journal, {u}"
            ));
            done.problems.push(u);
        }
        Settled {
            end: if incomplete.is_some() || units_down {
                Phase::Failed
            } else {
                Phase::RolledBack
            },
            message: rolled_back_message(&step, &done, note),
            remove: true,
        }
    }

    /// Restarts `units` after a rollback from the journal and checks that each is active
    /// again (up to [`UNIT_ACTIVE_TIMEOUT`]); returns those that failed to restart or
    /// were not active after it, each with why. A service manager with no unit state to
    /// ask (the recorder) is "not checked", not a failure.
    fn restart_and_check(&self, units: &[String]) -> Vec<String> {
        let mut down = Vec::new();
        for u in units {
            let checked = self
                .services
                .restart(u)
                .map_err(|e| format!("{u} did not restart: {e}"))
                .and_then(|()| {
                    self.services
                        .wait_active(u, UNIT_ACTIVE_TIMEOUT)
                        .map_err(|e| format!("{u} is not active after its restart: {e}"))
                });
            match checked {
                Ok(true) => {
                    tracing::info!(unit = %u, "restarted after a rollback from the journal; active")
                }
                Ok(false) => {
                    tracing::info!(unit = %u, "restarted after a rollback from the journal; its state not checked")
                }
                Err(why) => {
                    tracing::warn!(unit = %u, why = %why, "a unit did not come back after a rollback from the journal");
                    down.push(why);
                }
            }
        }
        down
    }

    /// Every pre-image the intent names, verified (None: the path was absent); else why
    /// not, each that does not verify named.
    fn verified_pre_images(
        &self,
        id: &str,
        j: &JournalState,
        intent: &Intent,
    ) -> Result<Vec<Option<Vec<u8>>>, String> {
        let mut pres = Vec::new();
        let mut bad = Vec::new();
        let applied = std::cell::OnceCell::new();
        for e in &intent.entries {
            match &e.pre {
                Some(pre) => match self
                    .state
                    .journal_read_pre_with(j.version, id, pre, &applied)
                {
                    Ok(b) => pres.push(Some(b)),
                    Err(why) => bad.push(why),
                },
                None => pres.push(None),
            }
        }
        if bad.is_empty() {
            Ok(pres)
        } else {
            Err(bad.join("; "))
        }
    }

    /// One path back to its verified pre-image `pre` (None: it was absent), only if it
    /// is no longer what it was and is still what the operation left there.
    fn roll_back_entry(
        &self,
        id: &str,
        e: &IntentEntry,
        pre: Option<&[u8]>,
        done: &mut RolledBack,
    ) {
        let path = &e.path;
        let now = match observe_file(&self.root, path) {
            Ok(o) => o,
            Err(err) => {
                done.problems.push(format!("{path}: left as it is: {err}"));
                return;
            }
        };
        if e.restore_over_any {
            return self.put_back_over_any(id, e, pre, &now, done);
        }
        let new = e.new_sha256.as_deref();
        let r = match (&e.pre, pre, &now) {
            (Some(p), Some(bytes), FileObs::File { content, entry }) => {
                let same_content = sha256_of(content) == p.sha256;
                if same_content && (entry.mode, entry.uid, entry.gid) == (p.mode, p.uid, p.gid) {
                    done.untouched += 1;
                    return;
                }
                if !same_content && Some(sha256_of(content).as_str()) != new {
                    done.problems.push(format!(
                        "{path}: left as it is: it is {}, neither its pre-image {} nor what the operation wrote",
                        sha256_of(content),
                        p.sha256
                    ));
                    return;
                }
                self.root
                    .write_atomic(path, bytes, p.mode, p.uid, p.gid)
                    .map(|_| &mut done.restored)
            }
            (Some(p), Some(bytes), FileObs::Absent) => self
                .root
                .write_atomic(path, bytes, p.mode, p.uid, p.gid)
                .map(|_| &mut done.restored),
            (None, _, FileObs::Absent) => {
                done.untouched += 1;
                return;
            }
            (None, _, FileObs::File { content, .. })
                if Some(sha256_of(content).as_str()) == new =>
            {
                self.root.remove(path).map(|_| &mut done.removed)
            }
            (_, _, obs) => {
                done.problems.push(format!(
                    "{path}: left as it is: it is {}, not what the operation wrote",
                    obs.fingerprint()
                ));
                return;
            }
        };
        record_settled(id, path, r, &mut done.problems);
    }

    /// A path an effect removed (a manager checkpoint): back to its verified pre-image
    /// `pre`, or removed when it was absent, over whatever is there now (`now`).
    fn put_back_over_any(
        &self,
        id: &str,
        e: &IntentEntry,
        pre: Option<&[u8]>,
        now: &FileObs,
        done: &mut RolledBack,
    ) {
        let path = &e.path;
        let r = match (&e.pre, pre, now) {
            (Some(p), _, FileObs::File { content, entry })
                if sha256_of(content) == p.sha256
                    && (entry.mode, entry.uid, entry.gid) == (p.mode, p.uid, p.gid) =>
            {
                done.untouched += 1;
                return;
            }
            (Some(p), Some(bytes), _) => self
                .root
                .write_atomic(path, bytes, p.mode, p.uid, p.gid)
                .map(|_| &mut done.restored),
            (None, _, FileObs::File { .. }) => self.root.remove(path).map(|_| &mut done.removed),
            _ => {
                done.untouched += 1;
                return;
            }
        };
        record_settled(id, path, r, &mut done.problems);
    }

    /// Moves the journal aside whole: nothing is restored from it; each file it names is
    /// listed in the problems with what is known of it.
    fn quarantine(&self, id: &str, j: &JournalState, why: &str) -> Settled {
        let intent = match &j.intent {
            Sealed::Valid(i) => Some(i),
            _ => j.unverified_intent.as_ref(),
        };
        let mut files: Vec<String> = intent
            .map(|i| i.entries.iter().map(|e| self.describe_entry(e)).collect())
            .unwrap_or_default();
        if intent.is_none() {
            files.push("the files it names are not known (its intent does not parse): see the operation's changes".into());
        }
        let report = format!("{why}\n{}\n", files.join("\n"));
        let (where_, remove) = match self.state.journal_quarantine(j.version, id, &report) {
            Ok(p) => (format!("moved whole to {p}"), false),
            Err(e) => {
                self.set_unavailable(format!(
                    "the damaged journal of operation {id} could not be moved aside ({e})"
                ));
                (format!("could not be moved aside ({e}); kept"), false)
            }
        };
        self.problem(format!(
            "operation {id}: its journal does not verify ({why}); {where_}; nothing was restored from it"
        ));
        for f in &files {
            self.problem(format!("operation {id}: {f}"));
        }
        Settled {
            end: Phase::Failed,
            message: format!(
                "{INTERRUPTED} the agent stopped and the operation's journal does not verify ({why}); it was {where_} and nothing was restored from it: {}; check these files, then re-apply",
                files.join("; ")
            ),
            remove,
        }
    }

    /// `<path>: not restored; pre-image <hash>, new <hash>, on disk now <hash> (= ...)`.
    fn describe_entry(&self, e: &IntentEntry) -> String {
        let pre = e
            .pre
            .as_ref()
            .map(|p| p.sha256.clone())
            .unwrap_or_else(|| "absent".into());
        let new = e.new_sha256.clone().unwrap_or_else(|| "removed".into());
        let now = match observe_file(&self.root, &e.path) {
            Ok(o) => o.fingerprint(),
            Err(err) => err.to_string(),
        };
        let which = if now == pre {
            "the pre-image"
        } else if now == new || (now == "absent" && new == "removed") {
            "the new content"
        } else {
            "neither"
        };
        format!(
            "{}: not restored; before the operation {pre}, the operation writes {new}, on disk now {now} ({which})",
            e.path
        )
    }
}

/// Records how putting `path` back went: the list the step names (`restored`, `removed`)
/// gets the path, logged at WARN; an error is a problem naming the path.
fn record_settled(
    id: &str,
    path: &str,
    r: Result<&mut Vec<String>, inplace_node::sysroot::SysrootError>,
    problems: &mut Vec<String>,
) {
    match r {
        Ok(list) => {
            tracing::warn!(operation = %id, path = %path, "rolled back from the journal");
            list.push(path.to_string());
        }
        Err(err) => problems.push(format!("{path}: {err}")),
    }
}

/// The copy of operation `id` a format-2 journal holds: the commit's (the operation at
/// its commit point), else the intent's (in Staging).
fn journal_copy(id: &str, j: &JournalState) -> Option<pb::Operation> {
    let from_commit = match &j.committed {
        Some(Sealed::Valid(c)) => c.operation.clone(),
        _ => None,
    };
    let from_intent = match &j.intent {
        Sealed::Valid(i) => i.staged.clone(),
        _ => None,
    };
    from_commit
        .or(from_intent)
        .and_then(|v| serde_json::from_value::<pb::Operation>(v).ok())
        .filter(|o| o.id == id)
}

/// Whether an operation file in `phase` was written before its commit (Staging is the
/// only such phase written to disk; the others are listed for completeness).
fn pre_commit(phase: i32) -> bool {
    [
        Phase::Unspecified,
        Phase::Validating,
        Phase::Staging,
        Phase::Committing,
        Phase::Acting,
        Phase::Verifying,
    ]
    .iter()
    .any(|p| *p as i32 == phase)
}

/// The message of an operation rolled back at start: every restored and removed path
/// named.
fn rolled_back_message(step: &str, done: &RolledBack, note: Option<String>) -> String {
    let mut parts = Vec::new();
    if let Some(n) = note {
        parts.push(n);
    }
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    parts.push(format!(
        "restored from the journal's pre-images: {}",
        list(&done.restored)
    ));
    parts.push(format!(
        "removed (created by the operation): {}",
        list(&done.removed)
    ));
    parts.push(format!(
        "{} path(s) were still as before and were not touched",
        done.untouched
    ));
    if !done.rerun.is_empty() {
        parts.push(format!(
            "ran again over the restored files: {}",
            done.rerun.join(", ")
        ));
    }
    if !done.problems.is_empty() {
        parts.push(format!("problems: {}", done.problems.join("; ")));
    }
    format!(
        "{INTERRUPTED} the agent stopped (last step: {step}); rolled back from the write-ahead journal: {}; re-apply with the same operation id to converge",
        parts.join("; ")
    )
}

/// Whether the operation of `intent` carried a Kubernetes upgrade: a change
/// `kubernetes.version` in its Staging copy (`Intent::staged`, proto3 JSON of the
/// `Operation`). An intent of format 1 has no copy: false, as that agent read it.
fn carries_upgrade(intent: &Intent) -> bool {
    intent
        .staged
        .as_ref()
        .and_then(|op| op.get("changes"))
        .and_then(|c| c.as_array())
        .is_some_and(|changes| {
            changes.iter().any(|c| {
                c.get("id").and_then(|i| i.as_str()) == Some(inplace_wire::ids::KUBERNETES_VERSION)
            })
        })
}
