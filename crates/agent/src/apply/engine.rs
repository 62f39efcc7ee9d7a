//! The operation engine: an operation's phases as a state machine.
//!
//! [`Agent::execute`] is the whole machine: each turn persists and publishes the phase
//! entered ([`Agent::publish`], which checks [`inplace_wire::phase::allowed`]), then runs the
//! transition function of that phase, which does the phase's work and returns the next
//! phase with its message, or the failure. One function per transition:
//!
//! | phase     | function                   | next                                     |
//! |-----------|----------------------------|------------------------------------------|
//! | Staging   | [`Agent::staging`]         | Committing                               |
//! | Committing| [`Agent::committing`]      | Acting                                   |
//! | Acting    | [`Agent::acting`]          | Verifying                                |
//! | Verifying | [`Agent::verifying`]       | Succeeded, RebootRequired, Rebooting, Failed |
//! | Rebooting | [`Agent::rebooting`]       | (the reboot), RebootRequired             |
//!
//! A failure after the first write undoes the list of completed steps in reverse and
//! ends `RolledBack` with the cause ([`Agent::run`]). After a boot the agent's start
//! settles an operation waiting for it ([`Agent::recover`]: `VerifyingAfterBoot`, then
//! `Succeeded` or `Failed`); the journal's side of a crash is [`super::journal`].

use std::sync::Arc;

use super::{Agent, now};
use crate::plan;
use crate::plan::Plan;
use crate::sections::kit::Options;
use crate::sections::kit::observe::{FileObs, observe_file};
use crate::sections::kit::steps::resolve_keep;
use crate::sections::model::NodeSpec;
use crate::state::{AppliedRecord, Intent};
use inplace_node::sysroot::{Durability, Entry};
use inplace_wire::pb;
use inplace_wire::pb::RebootPolicy;
use inplace_wire::phase;
use inplace_wire::phase::{INTERRUPTED, Phase, is_settled};

/// One completed step and how to undo it.
#[derive(Debug)]
pub(super) enum Undo {
    /// A file written or removed: its previous content and metadata (None = absent).
    File(String, Option<(Vec<u8>, Entry)>),
    /// A directory created.
    Dir(String),
    /// A live sysctl changed: key, previous value.
    Sysctl(String, String),
    /// A step of a Kubernetes version upgrade.
    Kubernetes(crate::kubernetes::upgrade::Restore),
    /// A boot-configuration command that ran (`update-grub`): run again once every other
    /// step is undone, so what it generates (`grub.cfg`) follows the restored inputs.
    Rerun(Vec<String>),
}

/// What an operation carries from phase to phase.
pub(super) struct Run<'a> {
    /// The operation as published.
    pub op: &'a mut pb::Operation,
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
    /// The write-ahead intent once staged.
    pub intent: Option<Intent>,
}

/// The phase entered next, with its message, and a failpoint hit once it is persisted.
pub(super) struct Next {
    phase: Phase,
    message: String,
    failpoint: Option<&'static str>,
}

impl Next {
    fn to(phase: Phase, message: impl Into<String>) -> Self {
        Next {
            phase,
            message: message.into(),
            failpoint: None,
        }
    }
}

/// A failed transition: the phase to end in, and why.
type Fail = (Phase, String);

/// The directory of an absolute sysroot path (`/` for a path at the root).
fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
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
        mut op: pb::Operation,
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
            intent: None,
        };
        let result = self.execute(run);
        if let Err((phase, msg)) = result {
            let msg = if undo.is_empty() {
                format!("{msg}; nothing was changed")
            } else {
                format!("{msg}; {}", self.undo(&undo))
            };
            let phase = if undo.is_empty() {
                phase
            } else {
                Phase::RolledBack
            };
            let _ = self.state.journal_remove(&op.id);
            self.publish(&mut op, phase, msg);
        }
        // the durable barriers it took (the journal's fsync order, see journal.rs)
        tracing::debug!(
            operation = %op.id,
            fsyncs = inplace_node::sysroot::fsyncs_on_this_thread() - fsyncs,
            "operation settled"
        );
        if let Err(e) = self.state.prune(self.config.history.keep) {
            tracing::warn!(error = %e, "pruning history");
        }
        let mut inner = self.lock();
        if inner.running.as_deref() == Some(op.id.as_str()) {
            inner.running = None;
        }
    }

    /// The state machine: enter a phase (persist and publish it), run its transition,
    /// until a settled phase is entered.
    pub(super) fn execute(&self, mut run: Run<'_>) -> Result<(), Fail> {
        let mut next = Next::to(Phase::Staging, "writing the journal: pre-images and intent");
        loop {
            self.publish(run.op, next.phase, next.message);
            if let Some(f) = next.failpoint {
                inplace_node::failpoint::hit(f);
            }
            next = match next.phase {
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
    fn staging(&self, run: &mut Run<'_>) -> Result<Next, Fail> {
        let steps = &run.plan.steps;
        let staging = |e: String| (Phase::Failed, format!("staging: {e}"));
        if inplace_node::failpoint::triggered("stage-enospc") {
            return Err(staging("No space left on device (os error 28)".into()));
        }
        self.journal_fits(run).map_err(staging)?;
        let mut originals = false;
        for w in &steps.writes {
            if let Some(orig) = &w.save_original {
                self.state
                    .save_original(&w.path, orig)
                    .map_err(|e| staging(e.to_string()))?;
                run.op.actions.push(format!("saved original of {}", w.path));
                originals = true;
            }
        }
        let intent = self.intent(run.op, steps).map_err(staging)?;
        self.state
            .journal_intent(&intent, originals)
            .map_err(|e| staging(e.to_string()))?;
        self.state
            .journal_progress(&run.op.id, "staged")
            .map_err(|e| staging(e.to_string()))?;
        run.intent = Some(intent);
        inplace_node::failpoint::hit("stage");
        Ok(Next::to(
            Phase::Committing,
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

    /// Committing → Acting: every write and removal (each checked against what the plan
    /// saw), the directories left empty, the live sysctls.
    fn committing(&self, run: &mut Run<'_>) -> Result<Next, Fail> {
        self.upgrade_kubernetes(run)?;
        self.write_files(run)?;
        self.remove_files(run)?;
        self.set_sysctls(run)?;
        inplace_node::failpoint::hit("sysctl");
        let _ = self.state.journal_progress(&run.op.id, "written");
        Ok(Next::to(Phase::Acting, "running commands and unit actions"))
    }

    /// Each file's content is fsynced as it is written; each directory written into is
    /// fsynced once at the end, before the progress marker and long before the commit
    /// point (a power cut before that leaves some files old, which rolling back handles
    /// as it handles a crash between two writes).
    fn write_files(&self, run: &mut Run<'_>) -> Result<(), Fail> {
        let fail = |e: String| (Phase::RolledBack, e);
        let mut dirs = std::collections::BTreeSet::new();
        for w in &run.plan.steps.writes {
            let before = self.snapshot(&w.path, &w.expect).map_err(fail)?;
            let (mode, uid, gid) = resolve_keep(w, before.as_ref().map(|b| b.1));
            let created = self
                .root
                .write_atomic_with(&w.path, &w.content, mode, uid, gid, Durability::ContentOnly)
                .map_err(|e| fail(format!("committing: {e}")))?;
            dirs.insert(parent_of(&w.path));
            for d in &created {
                run.undo.push(Undo::Dir(d.clone()));
                run.op.actions.push(format!("created directory {d} (0755)"));
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
                .actions
                .push(format!("wrote {} ({mode:04o} {uid}:{gid})", w.path));
        }
        self.sync_dirs(dirs)
    }

    /// One fsync per directory of a batch of writes or removals.
    fn sync_dirs(&self, dirs: std::collections::BTreeSet<&str>) -> Result<(), Fail> {
        for d in dirs {
            self.root
                .sync_dir(d)
                .map_err(|e| (Phase::RolledBack, format!("committing: {e}")))?;
        }
        Ok(())
    }

    fn remove_files(&self, run: &mut Run<'_>) -> Result<(), Fail> {
        let fail = |e: String| (Phase::RolledBack, e);
        let steps = &run.plan.steps;
        let mut synced = std::collections::BTreeSet::new();
        for r in &steps.removes {
            let before = self.snapshot(&r.path, &r.expect).map_err(fail)?;
            if self
                .root
                .remove_deferred(&r.path)
                .map_err(|e| fail(format!("committing: {e}")))?
            {
                synced.insert(parent_of(&r.path));
                run.undo.push(Undo::File(r.path.clone(), before));
                run.op.actions.push(format!("removed {}", r.path));
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
                run.op.actions.push(format!("removed empty directory {d}"));
            }
        }
        Ok(())
    }

    fn set_sysctls(&self, run: &mut Run<'_>) -> Result<(), Fail> {
        let fail = |e: String| (Phase::RolledBack, e);
        for (k, v) in &run.plan.steps.sysctls {
            let p = inplace_formats::sysctl::sysctl_path(k);
            let old = self
                .root
                .read_string(&p)
                .ok()
                .flatten()
                .unwrap_or_default()
                .trim_end_matches('\n')
                .to_string();
            self.root
                .write_in_place(&p, format!("{v}\n").as_bytes())
                .map_err(|e| fail(format!("committing: {e}")))?;
            run.undo.push(Undo::Sysctl(k.clone(), old));
            let back = self.root.read_string(&p).ok().flatten().unwrap_or_default();
            // The value is not echoed: it may come from a files item's content (a sysctl.d
            // file the spec writes), and content never reaches responses or logs; the
            // spec's own sysctls show their values in coverage.
            if inplace_formats::sysctl::normalize(&back) != inplace_formats::sysctl::normalize(v) {
                return Err(fail(format!(
                    "sysctl {k}: the kernel does not read back the value written (it reads {:?}); give the value in the form the kernel shows",
                    back.trim_end()
                )));
            }
            run.op.actions.push(format!("set sysctl {k} (live)"));
        }
        Ok(())
    }

    /// Acting → Verifying: boot configuration commands, then daemon-reload, reloads,
    /// try-restarts, restarts and the kubelet's checkpoint reset; a pending reboot
    /// absorbs reloads and restarts.
    fn acting(&self, run: &mut Run<'_>) -> Result<Next, Fail> {
        self.act(run)
            .map_err(|e| (Phase::RolledBack, format!("acting: {e}")))?;
        let _ = self.state.journal_progress(&run.op.id, "acted");
        inplace_node::failpoint::hit("act");
        let steps = &run.plan.steps;
        let kubelet_restarted = !steps.reboot && steps.restarts.contains(&self.config.kubelet.unit);
        Ok(Next::to(
            Phase::Verifying,
            if kubelet_restarted {
                "waiting for the kubelet to be healthy, then re-reading the node"
            } else {
                "re-reading the node"
            },
        ))
    }

    fn act(&self, run: &mut Run<'_>) -> Result<(), String> {
        let steps = &run.plan.steps;
        let actions = &mut run.op.actions;
        for cmd in &steps.commands {
            // pushed before it runs: a command that fails half-way may have written its
            // output already, and running it again over restored inputs is harmless
            run.undo.push(Undo::Rerun(cmd.clone()));
            self.runner.run(cmd).map_err(|e| e.to_string())?;
            actions.push(format!("ran {}", cmd.join(" ")));
        }
        if steps.reboot {
            for u in steps.reloads.iter().chain(steps.restarts.iter()) {
                actions.push(format!(
                    "{u}: reload/restart absorbed by the pending reboot"
                ));
            }
            return Ok(());
        }
        if steps.daemon_reload {
            self.services.daemon_reload().map_err(|e| e.to_string())?;
            actions.push("daemon-reload".into());
        }
        for u in &steps.reloads {
            self.services.reload(u).map_err(|e| e.to_string())?;
            actions.push(format!("reloaded {u}"));
        }
        for u in &steps.try_restarts {
            self.services.try_restart(u).map_err(|e| e.to_string())?;
            actions.push(format!("try-restarted {u}"));
        }
        let kubelet = &self.config.kubelet.unit;
        for u in &steps.restarts {
            if u == kubelet && !steps.kubelet_state_reset.is_empty() {
                self.services.stop(u).map_err(|e| e.to_string())?;
                actions.push(format!("stopped {u}"));
                for f in &steps.kubelet_state_reset {
                    if self.root.remove(f).map_err(|e| e.to_string())? {
                        actions.push(format!("removed {f}"));
                    }
                }
                self.services.start(u).map_err(|e| e.to_string())?;
                actions.push(format!("started {u}"));
            } else {
                self.services.restart(u).map_err(|e| e.to_string())?;
                actions.push(format!("restarted {u}"));
            }
        }
        Ok(())
    }

    /// Verifying → Succeeded | RebootRequired | Rebooting (| Failed past the commit
    /// point): the kubelet's health gate, the re-plan that must find nothing left but
    /// what the boot verifies, then the commit point and the record.
    fn verifying(&self, run: &mut Run<'_>) -> Result<Next, Fail> {
        let fail = |e: String| (Phase::RolledBack, e);
        let steps = &run.plan.steps;
        if !steps.reboot && steps.restarts.contains(&self.config.kubelet.unit) {
            self.health_gate(run)?;
            run.op.actions.push("kubelet healthy".into());
        }
        let check = self
            .plan_with(run.spec, run.opts.clone(), run.record.clone())
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
        } else {
            Phase::Succeeded
        };
        // the commit point: once the journal holds the record, a crash rolls forward
        self.state
            .journal_commit(&run.op.id, run.spec_pb, &run.record, final_phase as i32)
            .map_err(|e| fail(format!("recording the applied state: {e}")))?;
        inplace_node::failpoint::hit("record");
        if inplace_node::failpoint::triggered("full-after-commit") {
            inplace_node::failpoint::set_sticky("state-full");
        }
        run.undo.clear();
        let problem = self.install(run);
        let mut next = self.settle(run, needs_reboot);
        if let Some(p) = problem {
            next.message = format!("{}; {p}", next.message);
        }
        Ok(next)
    }

    /// The kubelet's health after its restart; when it fails, everything is undone at
    /// once and the units restarted with the restored files.
    fn health_gate(&self, run: &mut Run<'_>) -> Result<(), Fail> {
        let Err(cause) = self.kubelet_health() else {
            return Ok(());
        };
        let restored = self.undo(run.undo);
        run.undo.clear();
        let units = run
            .intent
            .as_ref()
            .map(|i| i.units.as_slice())
            .unwrap_or(&[]);
        let again = self.restart_units(units);
        let after = match self.kubelet_health() {
            Ok(()) => "healthy again".to_string(),
            Err(e) => format!("still unhealthy: {e}"),
        };
        Err((
            Phase::RolledBack,
            format!(
                "kubelet health check failed: {cause}; {restored}; {again}; the kubelet is {after}"
            ),
        ))
    }

    /// Installs the committed record and the applied spec, then removes the journal and
    /// the originals no longer needed. Past the commit point a failure undoes nothing and
    /// does not make the operation `Failed` (its changes are on the node): the journal
    /// keeps the record, the next start installs it, and until then the problem is listed
    /// in status and mutations are refused. Returns that problem.
    fn install(&self, run: &mut Run<'_>) -> Option<String> {
        if let Err(e) = self.state.install_applied(&run.record, run.spec_pb) {
            let p = format!(
                "committed, but installing the applied record failed ({e}); the journal {} keeps it and the next start installs it",
                self.state.full(&format!("/journal/{}", run.op.id))
            );
            self.problem(format!("operation {}: {p}", run.op.id));
            self.set_unavailable(format!(
                "operation {}'s applied record is not installed ({e})",
                run.op.id
            ));
            return Some(p);
        }
        inplace_node::failpoint::hit("applied");
        let _ = self.state.journal_remove(&run.op.id);
        for b in &run.plan.steps.drop_originals {
            let _ = self.state.drop_original(b);
        }
        None
    }

    /// The phase a committed operation ends in: Succeeded, or waiting for the reboot
    /// (Rebooting when the agent handles it).
    fn settle(&self, run: &mut Run<'_>, needs_reboot: bool) -> Next {
        if !needs_reboot {
            return Next::to(
                Phase::Succeeded,
                format!("{} change(s) applied", run.op.changes.len()),
            );
        }
        let policy =
            RebootPolicy::try_from(run.op.reboot_policy).unwrap_or(RebootPolicy::CallerHandles);
        if policy == RebootPolicy::AgentHandles {
            run.op.actions.push("requested reboot".into());
            return Next::to(
                Phase::Rebooting,
                "rebooting to boot with the new kernel arguments",
            );
        }
        Next {
            failpoint: Some("reboot-required"),
            ..Next::to(
                Phase::RebootRequired,
                "changes staged; they take effect after a reboot: drain the node, then call Reboot",
            )
        }
    }

    /// Rebooting → (the reboot) | RebootRequired when the request fails.
    fn rebooting(&self, run: &mut Run<'_>) -> Option<Next> {
        let e = self
            .rebooter
            .reboot(&format!("inplaced operation {}", run.op.id))
            .err()?;
        Some(Next::to(
            Phase::RebootRequired,
            format!("changes staged; the reboot request failed ({e}): reboot the node"),
        ))
    }

    /// The kubelet is active (as far as the service manager can tell) and its health
    /// endpoint answers 2xx within the configured timeout.
    pub(super) fn kubelet_health(&self) -> Result<(), String> {
        let timeout = std::time::Duration::from_secs(self.config.kubelet.health_timeout_secs);
        self.services
            .wait_active(&self.config.kubelet.unit, timeout)
            .map_err(|e| e.to_string())?;
        let url = self
            .config
            .kubelet
            .healthz_url
            .clone()
            .or_else(|| self.default_healthz.clone());
        match url {
            Some(u) => inplace_node::system::http_health(&u, timeout),
            None => Ok(()),
        }
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
                Undo::Sysctl(k, v) => self
                    .root
                    .write_in_place(
                        &inplace_formats::sysctl::sysctl_path(k),
                        format!("{v}\n").as_bytes(),
                    )
                    .map_err(|e| format!("sysctl {k}: {e}")),
                Undo::Kubernetes(r) => r.undo(&self.root, &*self.services, &*self.runner),
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

impl Agent {
    /// Settles operations a previous run left behind: one waiting for a reboot is verified
    /// once the boot id changed (or, with no boot id, once `/proc/cmdline` shows its
    /// changes); one stopped mid-way is marked `Failed` (interrupted).
    pub(super) fn recover(&self) -> Result<(), super::AgentError> {
        let boot_id = self.boot_id();
        for mut op in self.state.list_operations()? {
            let phase = phase::of(&op);
            let waiting = matches!(phase, Phase::Rebooting | Phase::RebootRequired);
            let settled = if waiting && !boot_id.is_empty() && op.boot_id != boot_id {
                self.after_boot(&mut op, &boot_id);
                true
            } else if phase == Phase::Rebooting && boot_id.is_empty() {
                self.after_boot_without_id(&mut op)
            } else if !is_settled(op.phase) {
                op.phase = Phase::Failed as i32;
                op.message = format!(
                    "{INTERRUPTED} the agent stopped during {}; re-apply with the same operation id to converge",
                    phase::name(phase)
                );
                true
            } else {
                false
            };
            if settled {
                op.updated = Some(now());
                self.state.save_operation(&op)?;
            }
        }
        Ok(())
    }

    /// What the booted node lacks or still has of `op`; unknown (never "lacks
    /// everything") when `/proc/cmdline` can not be read or is empty.
    fn verify_boot(
        &self,
        op: &pb::Operation,
    ) -> Result<crate::sections::kit::AfterBoot, crate::sections::kit::observe::Unknown> {
        let running = crate::sections::kit::observe::observe_running(&self.root, "/proc/cmdline")?;
        let running = running.trim_end();
        let next_boot = crate::bootloader::detect(&self.root, self.config.kernel_args.backend)
            .map(|b| b.next_boot().render())
            .unwrap_or_default();
        let mut found = plan::verify_after_boot(&op.changes, running, &next_boot);
        // the whole applied set, whatever operation staged it (an operation superseded
        // before the reboot staged part of what this boot must show)
        let record = self.state.load_record().unwrap_or_default();
        let boot = crate::sections::kit::Boot {
            running,
            next_boot: &next_boot,
        };
        let all = crate::sections::kernel_args::verify_applied(&record, &boot, &self.boot_id());
        for m in all.missing {
            if !found.missing.contains(&m) {
                found.missing.push(m);
            }
        }
        for l in all.lingering {
            if !found.lingering.contains(&l) {
                found.lingering.push(l);
            }
        }
        Ok(found)
    }

    /// RebootRequired | Rebooting → VerifyingAfterBoot → Succeeded | Failed: the node
    /// booted (a new boot id); the running command line must show the operation and the
    /// whole applied set of kernel arguments, whatever operation staged them.
    fn after_boot(&self, op: &mut pb::Operation, boot_id: &str) {
        op.phase = Phase::VerifyingAfterBoot as i32;
        let found = match self.verify_boot(op) {
            Ok(found) => found,
            Err(u) => {
                op.phase = Phase::Failed as i32;
                op.message = format!(
                    "booted (boot id {boot_id}) but {u}: the kernel arguments could not be verified; check /proc/cmdline, then re-apply"
                );
                op.boot_id = boot_id.to_string();
                return;
            }
        };
        if found.missing.is_empty() && found.lingering.is_empty() {
            op.phase = Phase::Succeeded as i32;
            op.message = format!(
                "booted (boot id {boot_id}) with the new kernel arguments, verified in /proc/cmdline (every managed argument present, every pending removal gone)"
            );
        } else {
            let mut why = Vec::new();
            if !found.missing.is_empty() {
                why.push(format!("lacks {}", found.missing.join(" ")));
            }
            if !found.lingering.is_empty() {
                why.push(format!("still has {}", found.lingering.join(" ")));
            }
            op.phase = Phase::Failed as i32;
            op.message = format!(
                "booted (boot id {boot_id}) but /proc/cmdline {}; the boot loader did not use the edited configuration (no further reboot is requested)",
                why.join(" and ")
            );
        }
        op.boot_id = boot_id.to_string();
    }

    /// Rebooting → Succeeded on a node without a boot id, once `/proc/cmdline` shows the
    /// operation; true when it did.
    fn after_boot_without_id(&self, op: &mut pb::Operation) -> bool {
        // not verified while /proc/cmdline is unknown: it stays Rebooting
        let Ok(found) = self.verify_boot(op) else {
            return false;
        };
        if !(found.missing.is_empty() && found.lingering.is_empty()) {
            return false;
        }
        op.phase = Phase::Succeeded as i32;
        op.message = "the node has no boot id; /proc/cmdline shows the new kernel arguments".into();
        true
    }

    /// Enters `phase`: persists the operation, tells its watchers and systemd. The only
    /// way the engine changes a running operation's phase; every change is one of
    /// [`inplace_wire::phase::allowed`].
    pub(super) fn publish(&self, op: &mut pb::Operation, phase: Phase, message: impl Into<String>) {
        debug_assert!(
            phase::allowed(phase::of(op), phase)
                || (phase::of(op) == phase && !is_settled(op.phase)),
            "operation {}: {:?} -> {phase:?} is not an allowed transition",
            op.id,
            phase::of(op)
        );
        op.phase = phase as i32;
        op.message = message.into();
        op.updated = Some(now());
        let mut inner = self.lock();
        // the slot is free as soon as the operation settles: a caller that sees the final
        // phase may start the next operation at once
        if is_settled(op.phase) && inner.running.as_deref() == Some(op.id.as_str()) {
            inner.running = None;
        }
        if persisted(phase)
            && let Err(e) = self.state.save_operation(op)
        {
            tracing::error!(operation = %op.id, error = %e, "persisting operation");
        }
        tracing::info!(operation = %op.id, phase = phase.as_str_name(), message = %op.message, "operation phase");
        if let Some(live) = inner.live.get_mut(&op.id) {
            live.push(op);
            if is_settled(op.phase) {
                inner.settle(&op.id);
            }
        }
        // systemctl status shows the current operation (a no-op outside systemd)
        let status = if is_settled(op.phase) {
            format!("idle; last operation {} {}", op.id, phase::name(phase))
        } else {
            format!("operation {}: {}", op.id, phase::name(phase))
        };
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&status)]);
    }

    /// Operations waiting for a reboot are superseded by a new operation: their staged
    /// changes are replaced, so a later reboot must not be read as theirs.
    pub(super) fn supersede_waiting(&self, new_id: &str) {
        let Ok(heads) = self.state.operation_heads() else {
            return;
        };
        let waiting = heads.into_iter().filter(|h| {
            h.id != new_id
                && matches!(
                    phase::from_i32(h.phase),
                    Phase::RebootRequired | Phase::Rebooting
                )
        });
        for h in waiting {
            let Ok(Some(mut op)) = self.state.get_operation(&h.id) else {
                continue;
            };
            let msg = format!(
                "superseded by operation {new_id} before the reboot; its staged changes were replaced"
            );
            self.publish(&mut op, Phase::Failed, msg);
        }
    }

    /// Reboots for an operation waiting in `RebootRequired` (or asks again for one in
    /// `Rebooting` whose reboot has not happened). Refused while an operation runs.
    pub fn reboot(&self, id: &str) -> Result<pb::Operation, super::AgentError> {
        inplace_wire::names::validate_operation_id(id)
            .map_err(super::AgentError::InvalidRequest)?;
        self.check_available()?;
        let mut op = {
            let inner = self.lock();
            if let Some(r) = &inner.running {
                return Err(super::AgentError::Busy(r.clone()));
            }
            let op = self
                .get_operation_locked(&inner, id)?
                .ok_or_else(|| super::AgentError::NotFound(id.to_string()))?;
            if !matches!(phase::of(&op), Phase::RebootRequired | Phase::Rebooting) {
                return Err(super::AgentError::Precondition(format!(
                    "operation {id:?} is {}, not waiting for a reboot; nothing to reboot for",
                    phase::name(phase::of(&op))
                )));
            }
            op
        };
        op.actions.push("requested reboot".into());
        op.boot_id = self.boot_id();
        self.publish(&mut op, Phase::Rebooting, "rebooting; verified after boot");
        if let Err(e) = self.rebooter.reboot(&format!("inplaced operation {id}")) {
            self.publish(
                &mut op,
                Phase::RebootRequired,
                format!("the reboot request failed ({e}); reboot the node"),
            );
            return Err(super::AgentError::Internal(e.to_string()));
        }
        Ok(op)
    }
}
