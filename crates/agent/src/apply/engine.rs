//! The operation engine: the I/O of an operation's phases, under the journal.
//!
//! [`Agent::execute`] runs the machine ([`super::machine`]): each turn enters and publishes
//! the state the last transition returned ([`Agent::publish`], the only way an operation's
//! phase changes), then runs the function of that phase, which does the phase's work and
//! asks the machine for the next state, or fails. One function per phase:
//!
//! | phase     | function                   | next                                     |
//! |-----------|----------------------------|------------------------------------------|
//! | Staging   | [`Agent::staging`]         | Committing                               |
//! | Committing| [`Agent::committing`]      | Acting                                   |
//! | Acting    | [`Agent::acting`]          | Verifying                                |
//! | Verifying | [`Agent::verifying`]       | Succeeded, RebootRequired, Rebooting, Failed |
//! | Rebooting | [`Agent::rebooting`]       | (the reboot), RebootRequired             |
//!
//! A failed phase function returns a [`Fail`]; [`Agent::run`] then hands it to the one
//! rollback of a running operation ([`super::rollback`]): the list of completed steps
//! undone in reverse (after a failed gate, the units restarted and the gate asked again),
//! ending `RolledBack` with the cause, or `Failed` when nothing
//! was changed. The after-boot half is [`super::after_boot`]; the journal's side of a
//! crash is [`super::journal`].

use std::sync::Arc;

use super::machine::{IllegalTransition, Next, Op};
use super::rollback::{Fail, Undo};
use super::{Agent, now};
use crate::plan;
use crate::plan::Plan;
use crate::sections::kit::Options;
use crate::sections::kit::effect::{Effect, Stage, UnitAction, UnitTouched};
use crate::sections::kit::marker::Marker;
use crate::sections::kit::observe::{FileObs, observe_file};
use crate::sections::kit::steps::{Steps, resolve_keep};
use crate::sections::model::NodeSpec;
use crate::state::AppliedRecord;
use inplace_node::sysroot::{Durability, Entry};
use inplace_wire::pb::RebootPolicy;
use inplace_wire::phase;
use inplace_wire::phase::{Phase, is_settled};

/// What an operation carries from phase to phase.
pub(super) struct Run<'a> {
    /// The operation: its state and its wire form as published.
    pub op: &'a mut Op,
    /// The spec applied, and its wire form (recorded as the last applied spec).
    pub spec: &'a NodeSpec,
    pub spec_pb: &'a [u8],
    /// The plan, and its options (the verification re-plans with them).
    pub plan: &'a Plan,
    pub opts: Options,
    /// Completed steps, undone in reverse on failure.
    pub undo: &'a mut Vec<Undo>,
    /// The record to commit (directories created are added to it).
    pub record: AppliedRecord,
    /// An effect wrote its own progress marker ([`Marker::Kubernetes`]): the engine's
    /// later markers would hide what recovery must know (that the journal can not undo
    /// that step), so they are not written.
    pub marked: bool,
}

/// The state entered next (as the machine returned it), with its message, and a
/// failpoint hit once it is persisted.
pub(super) struct Step {
    next: Result<Next, IllegalTransition>,
    message: String,
    failpoint: Option<&'static str>,
}

impl Step {
    fn to(next: Result<Next, IllegalTransition>, message: impl Into<String>) -> Self {
        Step {
            next,
            message: message.into(),
            failpoint: None,
        }
    }
}

/// The directory of an absolute sysroot path (`/` for a path at the root).
fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// The gates the verification runs ([`Stage::Gate`]): none when a reboot is pending
/// (it absorbs the restarts they follow).
fn gates(steps: &Steps) -> impl Iterator<Item = &std::sync::Arc<dyn Effect>> {
    steps.at(&Stage::Gate).filter(|_| !steps.reboot)
}

/// Whether entering `phase` is written to `operations/<id>.json`. The phases between
/// Staging and the settled phase are published to watchers (and shown in history from
/// memory) but not written: a crash in them is settled from the journal, which overwrites
/// the operation's phase whatever the file said, so the file only needs the Staging
/// state (durable before the first change) and the settled one.
fn persisted(phase: Phase) -> bool {
    !matches!(
        phase,
        Phase::Validating | Phase::Committing | Phase::Acting | Phase::Verifying
    )
}

impl Agent {
    /// Runs an operation to its end (in its own thread): the state machine, then the
    /// rollback of whatever it completed when a transition failed.
    pub(super) fn run(
        self: Arc<Self>,
        mut op: Op,
        spec: NodeSpec,
        spec_pb: Vec<u8>,
        plan: Plan,
        opts: Options,
    ) {
        let fsyncs = inplace_node::sysroot::fsyncs_on_this_thread();
        let mut undo = Vec::new();
        let run = Run {
            op: &mut op,
            spec: &spec,
            spec_pb: &spec_pb,
            record: plan.record.clone(),
            plan: &plan,
            opts,
            undo: &mut undo,
            marked: false,
        };
        if let Err(fail) = self.execute(run) {
            self.roll_back_run(&mut op, &undo, fail);
        }
        // the settled phase is durable (a committed operation's journal keeps its commit)
        inplace_node::failpoint::hit("settled");
        // the durable barriers it took (the journal's fsync order, see journal.rs)
        tracing::debug!(
            operation = %op.id(),
            fsyncs = inplace_node::sysroot::fsyncs_on_this_thread() - fsyncs,
            "operation settled"
        );
        if let Err(e) = self.state.prune(self.config.history.keep) {
            tracing::warn!(error = %e, "pruning history");
        }
        let mut inner = self.lock();
        if inner.running.as_deref() == Some(op.id()) {
            inner.running = None;
        }
        drop(inner);
        self.try_settled(&op);
    }

    /// The state machine: enter a phase (persist and publish it), run its transition,
    /// until a settled phase is entered.
    pub(super) fn execute(&self, mut run: Run<'_>) -> Result<(), Fail> {
        let mut step = Step::to(
            run.op.state().start(),
            "writing the journal: pre-images and intent",
        );
        loop {
            self.publish(run.op, step.next, step.message)?;
            if let Some(f) = step.failpoint {
                inplace_node::failpoint::hit(f);
            }
            step = match run.op.state().phase() {
                Phase::Staging => self.staging(&mut run)?,
                Phase::Committing => self.committing(&mut run)?,
                Phase::Acting => self.acting(&mut run)?,
                Phase::Verifying => self.verifying(&mut run)?,
                Phase::Rebooting => match self.rebooting(&mut run) {
                    Some(next) => next,
                    None => return Ok(()),
                },
                _ => return Ok(()),
            };
        }
    }

    /// Staging → Committing: saves the originals of first overwrites, writes the
    /// journal's pre-images and intent.
    fn staging(&self, run: &mut Run<'_>) -> Result<Step, Fail> {
        let steps = &run.plan.steps;
        let staging = |e: String| Fail::failed(format!("staging: {e}"));
        if inplace_node::failpoint::triggered("stage-enospc") {
            return Err(staging("No space left on device (os error 28)".into()));
        }
        self.journal_fits(run).map_err(staging)?;
        // nothing taken as the node's own that a quarantined journal leaves in doubt
        let touched = steps
            .writes
            .iter()
            .map(|w| (w.path.as_str(), w.expect.as_str()));
        let removed = steps
            .removes
            .iter()
            .map(|r| (r.path.as_str(), r.expect.as_str()));
        self.state
            .check_claims(touched.chain(removed), &run.record)
            .map_err(|e| staging(e.to_string()))?;
        // the plan said so already (lost_record.rs); a record quarantined since is
        // refused here, before any write
        if !self.state.quarantined_records().is_empty() {
            self.state
                .check_record_claims(&run.spec.item_ids(), super::lost_record::applied_ids)
                .map_err(|e| staging(e.to_string()))?;
        }
        let mut originals = false;
        for w in &steps.writes {
            if let Some(orig) = &w.save_original {
                self.state
                    .save_original(&w.path, orig)
                    .map_err(|e| staging(e.to_string()))?;
                run.op
                    .push_action(inplace_wire::ids::saved_original_action(&w.path));
                originals = true;
            }
        }
        let intent = self.intent(run.op.wire(), steps).map_err(staging)?;
        self.state
            .journal_intent(&intent, originals)
            .map_err(|e| staging(e.to_string()))?;
        // the witness that the intent was complete: an intent missing beside it is
        // damage (quarantined), not a crash before the intent (tests/journal.rs)
        self.state
            .journal_progress(run.op.id(), &Marker::Staged.text())
            .map_err(|e| staging(e.to_string()))?;
        let next = run.op.state().staged(Arc::new(intent));
        inplace_node::failpoint::hit("stage");
        Ok(Step::to(
            next,
            format!(
                "writing {} file(s)",
                steps.writes.len() + steps.removes.len()
            ),
        ))
    }

    /// The journal (originals, pre-images, intent) and the bookkeeping after the commit
    /// (journal record and spec, applied record and spec) fit in the state directory;
    /// else nothing is written and the error says how much is needed and where.
    fn journal_fits(&self, run: &Run<'_>) -> Result<(), String> {
        let steps = &run.plan.steps;
        let paths: Vec<&str> = steps
            .writes
            .iter()
            .map(|w| w.path.as_str())
            .chain(steps.removes.iter().map(|r| r.path.as_str()))
            .collect();
        let pre: u64 = paths
            .iter()
            .filter_map(|p| self.root.stat(p).ok().flatten())
            .filter(|e| e.kind == inplace_node::sysroot::Kind::File)
            .map(|e| e.len)
            .sum();
        let originals: u64 = steps
            .writes
            .iter()
            .filter_map(|w| w.save_original.as_ref())
            .map(|o| o.len() as u64)
            .sum();
        let needed = pre
            + originals
            + crate::state::StateDir::bookkeeping_bytes(paths.len(), run.spec_pb, &run.record);
        let free = self.state.free_bytes().map_err(|e| e.to_string())?;
        if needed > free {
            return Err(format!(
                "the state directory {} needs {needed} bytes for this operation's journal and records, and {free} are free; free space there (or shrink the spec) and re-apply",
                self.state.path().display()
            ));
        }
        Ok(())
    }

    /// Committing → Acting: the effects before the files (a Kubernetes upgrade), every
    /// write and removal (each checked against what the plan saw), the directories left
    /// empty, the effects after the files (live values).
    fn committing(&self, run: &mut Run<'_>) -> Result<Step, Fail> {
        self.run_effects(run, &Stage::BeforeFiles)?;
        self.write_files(run)?;
        self.remove_files(run)?;
        self.run_effects(run, &Stage::AfterFiles)?;
        // named after the live sysctls, the effects after the files
        inplace_node::failpoint::hit("sysctl");
        if !run.marked {
            let _ = self
                .state
                .journal_progress(run.op.id(), &Marker::Written.text());
        }
        Ok(Step::to(
            run.op.state().committed(),
            "running commands and unit actions",
        ))
    }

    /// Each file's content is fsynced as it is written; each directory written into is
    /// fsynced once at the end, before the progress marker and long before the commit
    /// point (a power cut before that leaves some files old, which rolling back handles
    /// as it handles a crash between two writes).
    fn write_files(&self, run: &mut Run<'_>) -> Result<(), Fail> {
        let fail = Fail::rolled_back;
        let mut dirs = std::collections::BTreeSet::new();
        for w in &run.plan.steps.writes {
            let before = self.snapshot(&w.path, &w.expect).map_err(fail)?;
            let (mode, uid, gid) = resolve_keep(w, before.as_ref().map(|b| b.1));
            let created = self
                .root
                .write_atomic_with(&w.path, &w.content, mode, uid, gid, Durability::ContentOnly)
                .map_err(|e| fail(format!("committing: {}", self.why_not_written(&w.path, e))))?;
            dirs.insert(parent_of(&w.path));
            for d in &created {
                run.undo.push(Undo::Dir(d.clone()));
                run.op.push_action(format!("created directory {d} (0755)"));
            }
            run.undo.push(Undo::File(w.path.clone(), before));
            inplace_node::failpoint::hit("write");
            if w.managed_file
                && !created.is_empty()
                && let Some(m) = run.record.files.get_mut(&w.path)
            {
                m.created_dirs = created.clone();
            }
            run.op
                .push_action(format!("wrote {} ({mode:04o} {uid}:{gid})", w.path));
        }
        self.sync_dirs(dirs)
    }

    /// One fsync per directory of a batch of writes or removals.
    fn sync_dirs(&self, dirs: std::collections::BTreeSet<&str>) -> Result<(), Fail> {
        for d in dirs {
            self.root
                .sync_dir(d)
                .map_err(|e| Fail::rolled_back(format!("committing: {e}")))?;
        }
        Ok(())
    }

    fn remove_files(&self, run: &mut Run<'_>) -> Result<(), Fail> {
        let fail = Fail::rolled_back;
        let steps = &run.plan.steps;
        let mut synced = std::collections::BTreeSet::new();
        for r in &steps.removes {
            let before = self.snapshot(&r.path, &r.expect).map_err(fail)?;
            if self
                .root
                .remove_deferred(&r.path)
                .map_err(|e| fail(format!("committing: {}", self.why_not_written(&r.path, e))))?
            {
                synced.insert(parent_of(&r.path));
                run.undo.push(Undo::File(r.path.clone(), before));
                run.op.push_action(format!("removed {}", r.path));
                // killed between two removals (tests/crash_removal.rs)
                inplace_node::failpoint::hit("remove");
            }
        }
        // each directory once, before its now empty subdirectories are removed
        self.sync_dirs(synced)?;
        // directories the agent created, deepest first, once every file in them is gone
        let mut dirs: Vec<&String> = steps.removes.iter().flat_map(|r| r.dirs.iter()).collect();
        dirs.sort_by_key(|d| std::cmp::Reverse(d.matches('/').count()));
        dirs.dedup();
        for d in dirs {
            if self.root.remove_dir_if_empty(d).unwrap_or(false) {
                run.op.push_action(format!("removed empty directory {d}"));
            }
        }
        Ok(())
    }

    /// Acting → Verifying: the effects before the units (boot configuration commands),
    /// then daemon-reload, reloads,
    /// try-restarts, restarts (an effect of [`Stage::Restart`] in place of its unit's);
    /// a pending reboot absorbs reloads and restarts.
    fn acting(&self, run: &mut Run<'_>) -> Result<Step, Fail> {
        self.act(run)
            .map_err(|e| Fail::rolled_back(format!("acting: {e}")))?;
        let steps = &run.plan.steps;
        // `acted` and `written` mean the same to recovery (the units are restarted either
        // way); `acted` is written only when there was something to act on, to word the
        // message of a roll-back
        let acted = steps.at(&Stage::BeforeUnits).next().is_some()
            || steps.daemon_reload
            || !steps.reloads.is_empty()
            || !steps.try_restarts.is_empty()
            || !steps.restarts.is_empty();
        if acted && !run.marked {
            let _ = self
                .state
                .journal_progress(run.op.id(), &Marker::Acted.text());
        }
        inplace_node::failpoint::hit("act");
        let gates = gates(steps)
            .filter_map(|g| g.announce())
            .collect::<Vec<_>>();
        let message = if gates.is_empty() {
            "re-reading the node".to_string()
        } else {
            format!("{}, then re-reading the node", gates.join(", "))
        };
        Ok(Step::to(run.op.state().acted(), message))
    }

    fn act(&self, run: &mut Run<'_>) -> Result<(), String> {
        let plan = run.plan;
        let steps = &plan.steps;
        self.run_effects(run, &Stage::BeforeUnits)
            .map_err(|f| f.cause().to_string())?;
        if steps.reboot {
            for u in steps.reloads.iter().chain(steps.restarts.iter()) {
                run.op.push_action(format!(
                    "{u}: reload/restart absorbed by the pending reboot"
                ));
            }
            return Ok(());
        }
        if steps.daemon_reload {
            run.undo.push(Undo::DaemonReload);
            self.services.daemon_reload().map_err(|e| e.to_string())?;
            run.op.push_action("daemon-reload");
        }
        let touch = |u: &str, a| Undo::Unit(UnitTouched::probe(&*self.services, u, a));
        for u in &steps.reloads {
            run.undo.push(touch(u, UnitAction::Reload));
            self.services.reload(u).map_err(|e| e.to_string())?;
            run.op.push_action(format!("reloaded {u}"));
        }
        for u in &steps.try_restarts {
            run.undo.push(touch(u, UnitAction::TryRestart));
            self.services.try_restart(u).map_err(|e| e.to_string())?;
            run.op.push_action(format!("try-restarted {u}"));
        }
        for u in &steps.restarts {
            // an effect may restart the unit itself (stop, change, start), and then
            // reports the unit's state before itself
            let instead = Stage::Restart(u.clone());
            if steps.at(&instead).next().is_some() {
                self.run_effects(run, &instead)
                    .map_err(|f| f.cause().to_string())?;
            } else {
                run.undo.push(touch(u, UnitAction::Restart));
                self.services.restart(u).map_err(|e| e.to_string())?;
                run.op.push_action(format!("restarted {u}"));
            }
        }
        Ok(())
    }

    /// Verifying → Succeeded | RebootRequired | Rebooting (| Failed past the commit
    /// point): the gates ([`Stage::Gate`], the kubelet's health), the re-plan that must find nothing left but
    /// what the boot verifies, then the commit point and the record.
    fn verifying(&self, run: &mut Run<'_>) -> Result<Step, Fail> {
        let fail = Fail::rolled_back;
        let steps = &run.plan.steps;
        if gates(steps).next().is_some() {
            self.run_effects(run, &Stage::Gate)?;
        }
        // the sections the plan touched, observed again through the memo (issue 28 §2)
        let host = plan::verify::Host {
            root: &self.root,
            state: &self.state,
            config: &self.config,
            runner: Some(self.runner.as_ref()),
        };
        let check =
            plan::verify::replan_touched(host, run.plan, run.spec, &run.record, run.opts.clone())
                .map_err(|e| fail(format!("verifying: {e}")))?;
        let left: Vec<&str> = check
            .report
            .changes
            .iter()
            .filter(|c| !plan::verified_after_boot(c, steps))
            .map(|c| c.id.as_str())
            .collect();
        if !left.is_empty() {
            return Err(fail(format!(
                "verifying: still different after the commit: {}",
                left.join(", ")
            )));
        }
        let needs_reboot = steps.reboot || check.steps.reboot;
        let final_phase = if needs_reboot {
            Phase::RebootRequired
        } else if super::try_window::is_try(run.op.wire()) {
            Phase::AwaitingConfirmation
        } else {
            Phase::Succeeded
        };
        // the commit point: once the journal holds the record, a crash rolls forward
        self.state
            .journal_commit(run.op.wire(), run.spec_pb, &run.record, final_phase as i32)
            .map_err(|e| fail(format!("recording the applied state: {e}")))?;
        inplace_node::failpoint::hit("record");
        if inplace_node::failpoint::triggered("full-after-commit") {
            inplace_node::failpoint::set_sticky("state-full");
        }
        run.undo.clear();
        // committed: the staged changes of the operations waiting for a reboot are
        // replaced now, not before (a roll-back or a refusal before this point leaves
        // them pending, with their trial boot as it was); a crash before it is saved
        // is superseded by the roll-forward at the next start (journal.rs)
        self.supersede_waiting(run.op.id());
        let problem = self.install(run);
        let mut next = self.settle(run, needs_reboot);
        if let Some(p) = problem {
            next.message = format!("{}; {p}", next.message);
        }
        Ok(next)
    }

    /// Ends the operation's use of its journal past the commit point (the journal keeps
    /// the commit, which is the applied state from now on, and drops the rest of it and
    /// the previous operation's commit), then removes the originals no longer needed.
    /// Past the commit point a failure undoes nothing and does not make the operation
    /// `Failed` (its changes are on the node): the commit holds the record, the next start
    /// installs it, and until then the problem is listed in status and mutations are
    /// refused. Returns that problem.
    fn install(&self, run: &mut Run<'_>) -> Option<String> {
        // nothing installed, no fsync: the commit is the applied state (crate::state,
        // journal_v2.rs)
        let retired = self.state.retire_journal(run.op.id());
        if let Err(e) = retired {
            let p = format!(
                "committed, but removing its spent journal files failed ({e}); the journal {} keeps the applied record and the next start installs it",
                self.state.full(&format!("/journal/{}.commit", run.op.id()))
            );
            self.problem(format!("operation {}: {p}", run.op.id()));
            self.set_unavailable(format!(
                "operation {}'s journal could not be tidied ({e})",
                run.op.id()
            ));
            return Some(p);
        }
        inplace_node::failpoint::hit("applied");
        for b in &run.plan.steps.drop_originals {
            let _ = self.state.drop_original(b);
        }
        None
    }

    /// The phase a committed operation ends in: Succeeded, or waiting for the reboot
    /// (Rebooting when the agent handles it) in the boot it was applied in.
    fn settle(&self, run: &mut Run<'_>, needs_reboot: bool) -> Step {
        let op = &run.op;
        if !needs_reboot && super::try_window::is_try(op.wire()) {
            return Step::to(
                op.state().awaiting_confirmation(),
                super::try_window::waiting_message(op.wire()),
            );
        }
        if !needs_reboot {
            return Step::to(
                op.state().verified(),
                format!("{} change(s) applied", op.wire().changes.len()),
            );
        }
        let boot_id = &op.wire().boot_id;
        let policy =
            RebootPolicy::try_from(op.wire().reboot_policy).unwrap_or(RebootPolicy::CallerHandles);
        if policy == RebootPolicy::AgentHandles {
            let boot_id = boot_id.clone();
            if let Err(e) = self.prepare_reboot(run.op) {
                return Step::to(
                    run.op.state().reboot_required(&boot_id),
                    format!("changes staged; the reboot request failed ({e}): reboot the node"),
                );
            }
            let next = run.op.state().rebooting(&boot_id);
            run.op.push_action("requested reboot");
            return Step::to(next, "rebooting to boot with the new kernel arguments");
        }
        Step {
            failpoint: Some("reboot-required"),
            ..Step::to(
                op.state().reboot_required(boot_id),
                "changes staged; they take effect after a reboot: drain the node, then call Reboot",
            )
        }
    }

    /// Rebooting → (the reboot) | RebootRequired when the request fails.
    fn rebooting(&self, run: &mut Run<'_>) -> Option<Step> {
        let e = self.request_reboot(run.op).err()?;
        Some(Step::to(
            run.op.state().reboot_required(&run.op.wire().boot_id),
            format!("changes staged; the reboot request failed ({e}): reboot the node"),
        ))
    }

    /// A write or removal error of `path`, with what stops it when the node says
    /// ([`inplace_node::sysroot::Sysroot::write_blocker`]: the attribute, the read-only
    /// mount), not only `EPERM` or `EROFS`.
    fn why_not_written(&self, path: &str, e: impl std::fmt::Display) -> String {
        match self.root.write_blocker(path, 0) {
            Ok(Some(why)) => format!("{e}: {why}"),
            _ => e.to_string(),
        }
    }

    /// The current content of `path` if it still has the fingerprint the plan saw.
    fn snapshot(&self, path: &str, expect: &str) -> Result<Option<(Vec<u8>, Entry)>, String> {
        let obs = observe_file(&self.root, path).map_err(|e| e.to_string())?;
        let seen = obs.fingerprint();
        if seen != expect {
            return Err(format!(
                "{path} changed since the plan (another writer?): it is now {seen}; nothing more is written, re-run the operation"
            ));
        }
        match obs {
            FileObs::File { content, entry } => Ok(Some((content, entry))),
            _ => Ok(None),
        }
    }

    /// Enters `next` ([`Op::enter`]: the only writer of an operation's phase), then
    /// persists the operation, tells its watchers and systemd. A transition the machine
    /// refused (`next` is an error, or was made from another state) changes, persists and
    /// publishes nothing: it is logged and returned.
    /// Persists `op` (`StateDir::save_operation`), noting when it waits for a reboot
    /// (see `Agent::maybe_waiting`). Every save of an operation goes through here.
    pub(super) fn save_op(
        &self,
        op: &inplace_wire::pb::Operation,
    ) -> Result<(), crate::state::StateError> {
        if matches!(phase::of(op), Phase::RebootRequired | Phase::Rebooting) {
            self.maybe_waiting
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        self.state.save_operation(op)
    }

    pub(super) fn publish(
        &self,
        op: &mut Op,
        next: Result<Next, IllegalTransition>,
        message: impl Into<String>,
    ) -> Result<(), IllegalTransition> {
        if let Err(e) = next.and_then(|n| op.enter(n, message, now())) {
            tracing::error!(operation = %op.id(), error = %e, "refused an operation's phase change");
            return Err(e);
        }
        let (op, phase) = (op.wire(), op.state().phase());
        let mut inner = self.lock();
        // the slot is free as soon as the operation settles: a caller that sees the final
        // phase may start the next operation at once
        if is_settled(op.phase) && inner.running.as_deref() == Some(op.id.as_str()) {
            inner.running = None;
        }
        let mut unsaved = None;
        if persisted(phase)
            && let Err(e) = self.save_op(op)
        {
            tracing::error!(operation = %op.id, error = %e, "persisting operation");
            unsaved = is_settled(op.phase).then_some(e);
        }
        tracing::info!(operation = %op.id, phase = phase.as_str_name(), message = %op.message, "operation phase");
        if let Some(live) = inner.live.get_mut(&op.id) {
            live.push(op);
            if is_settled(op.phase) {
                inner.settle(&op.id);
            }
        }
        drop(inner);
        // a settled operation the state directory did not take (full, read-only) is said
        // where it is seen and refuses changes, as a record that can not be installed
        // does: its file still says an earlier phase, which the next start settles (from
        // the journal past a commit point)
        if let Some(e) = unsaved {
            let why = format!(
                "operation {} ended {} but could not be recorded ({e})",
                op.id,
                phase::name(phase)
            );
            self.problem(format!(
                "{why}; the next start settles it from what its journal and file hold"
            ));
            self.set_unavailable(why);
        }
        // systemctl status shows the current operation (a no-op outside systemd)
        let status = if is_settled(op.phase) {
            format!("idle; last operation {} {}", op.id, phase::name(phase))
        } else {
            format!("operation {}: {}", op.id, phase::name(phase))
        };
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&status)]);
        Ok(())
    }
}
