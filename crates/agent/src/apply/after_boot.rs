//! The after-boot half of an operation and the transitions the API or the agent's start
//! make outside the engine's run: settling at start the operations a previous run left
//! behind ([`Agent::recover`]: after a boot, `VerifyingAfterBoot` then `Succeeded` or
//! `Failed`; an interrupted one `Failed`), an explicit reboot ([`Agent::reboot`]), and the
//! supersession of operations waiting for a reboot by an operation that committed
//! ([`Agent::supersede_waiting`]). Each
//! phase change is a transition of [`super::machine`].

use super::machine::{AtStart, IllegalTransition, Next, Op};
use super::{Agent, now};
use crate::bootloader::{KernelArgsBackend, PendingTrial};
use crate::plan;
use inplace_wire::pb;
use inplace_wire::phase;
use inplace_wire::phase::{INTERRUPTED, Phase};

/// Enters `next` in an operation read back at start (persisted by the caller); false,
/// logged, when the machine refuses it.
fn enter_now(op: &mut Op, next: Result<Next, IllegalTransition>, message: String) -> bool {
    match next.and_then(|n| op.enter(n, message, now())) {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(operation = %op.id(), error = %e, "settling an operation at start");
            false
        }
    }
}

impl Agent {
    /// Settles operations a previous run left behind: one waiting for a reboot is verified
    /// once the boot id changed (or, with no boot id, once `/proc/cmdline` shows its
    /// changes); one stopped mid-way is marked `Failed` (interrupted).
    pub(super) fn recover(&self) -> Result<(), super::AgentError> {
        let boot_id = self.boot_id();
        for wire in self.state.list_operations()? {
            let mut op = Op::read_back(wire);
            let settled = match op.state().at_start(&boot_id) {
                AtStart::Booted(booted) => self.after_boot(&mut op, &booted),
                AtStart::VerifyWithoutId => self.after_boot_without_id(&mut op),
                AtStart::Interrupted => {
                    let message = format!(
                        "{INTERRUPTED} the agent stopped during {}; re-apply with the same operation id to converge",
                        phase::name(op.state().phase())
                    );
                    let next = op.state().interrupted();
                    enter_now(&mut op, next, message)
                }
                AtStart::Leave => false,
            };
            if settled {
                self.save_op(op.wire())?;
            }
        }
        self.orphan_trial_entries()?;
        Ok(())
    }

    /// Lists in `NodeStatus.problems` every trial entry left on the node while no
    /// operation waits for a reboot (the state directory was reset, or an operation's
    /// record was lost): no operation will commit or remove it, and a one-shot still
    /// pointing at it boots a command line no spec names. Reported, not removed: what
    /// the entry carries is not the agent's to judge without its operation. Checked at
    /// start only.
    fn orphan_trial_entries(&self) -> Result<(), super::AgentError> {
        let waiting = self.state.operation_heads()?.iter().any(|h| {
            matches!(
                phase::from_i32(h.phase),
                Phase::RebootRequired | Phase::Rebooting
            )
        });
        for path in crate::bootloader::trial::artefact_paths() {
            let exists = self.root.stat(&path).ok().flatten().is_some();
            let problem = (exists && !waiting).then(|| {
                format!(
                    "{path}: a kernel-argument trial entry no pending operation owns (left by an earlier run whose state is gone); it may boot once if the boot loader's one-shot points at it; remove it with `rm {path}`, then regenerate the boot configuration (update-grub or grub2-mkconfig for /etc/grub.d) and clear the one-shot (grub-editenv <grubenv> unset next_entry, or bootctl set-oneshot \"\"); this problem is listed until the agent's next start"
                )
            });
            self.set_problem(&path, problem);
        }
        Ok(())
    }

    /// What the booted node lacks or still has of `op`; unknown (never "lacks
    /// everything") when `/proc/cmdline` can not be read or is empty.
    fn verify_boot(
        &self,
        op: &pb::Operation,
    ) -> Result<crate::sections::kit::AfterBoot, crate::sections::kit::observe::Unknown> {
        self.boot_view(op).map(|(_, found)| found)
    }

    /// The running command line and what it lacks or still has of `op` and of the whole
    /// applied set of kernel arguments, whatever operation staged them (an operation
    /// superseded before the reboot staged part of what this boot must show).
    pub(super) fn boot_view(
        &self,
        op: &pb::Operation,
    ) -> Result<(String, crate::sections::kit::AfterBoot), crate::sections::kit::observe::Unknown>
    {
        let (running, next_boot) = crate::sections::kit::read_boot(&self.root, &self.config)?;
        let mut found = plan::verify_after_boot(&op.changes, &running, &next_boot);
        let record = self.state.load_record().unwrap_or_default();
        let boot = crate::sections::kit::Boot {
            running: &running,
            next_boot: &next_boot,
        };
        let all = crate::sections::verify_applied_after_boot(&record, &boot, &self.boot_id());
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
        Ok((running, found))
    }

    /// RebootRequired | Rebooting → VerifyingAfterBoot → Succeeded | Failed: the node
    /// booted (a new boot id); the running command line must show the operation and the
    /// whole applied set of kernel arguments, whatever operation staged them. True once
    /// settled (the caller saves it).
    fn after_boot(&self, op: &mut Op, boot_id: &str) -> bool {
        self.reboot_finished(op, boot_id);
        if let Some((backend, trial)) = self.pending_trial() {
            return self.end_trial(op, boot_id, backend.as_ref(), &trial);
        }
        // the operation staged a trial but its artefact is gone or unreadable: nothing
        // carries what to commit, so the boot is never read as a plain reboot's success
        let staged = self
            .state
            .load_record()
            .ok()
            .and_then(|r| r.kernel_args_trial);
        if let Some(t) = staged {
            return self.lost_trial(op, boot_id, &t.artefact);
        }
        let next = op.state().booted(boot_id);
        if !enter_now(op, next, format!("booted (boot id {boot_id}); verifying")) {
            return false;
        }
        let (verified, message) = match self.verify_boot(op.wire()) {
            Err(u) => (
                false,
                format!(
                    "booted (boot id {boot_id}) but {u}: the kernel arguments could not be verified; check /proc/cmdline, then re-apply"
                ),
            ),
            Ok(found) if found.missing.is_empty() && found.lingering.is_empty() => (
                true,
                format!(
                    "booted (boot id {boot_id}) with the new kernel arguments, verified in /proc/cmdline (every managed argument present, every pending removal gone)"
                ),
            ),
            Ok(found) => {
                let mut why = Vec::new();
                if !found.missing.is_empty() {
                    why.push(format!("lacks {}", found.missing.join(" ")));
                }
                if !found.lingering.is_empty() {
                    why.push(format!("still has {}", found.lingering.join(" ")));
                }
                (
                    false,
                    format!(
                        "booted (boot id {boot_id}) but /proc/cmdline {}; the boot loader did not use the edited configuration (no further reboot is requested)",
                        why.join(" and ")
                    ),
                )
            }
        };
        let next = op.state().boot_verified(verified);
        enter_now(op, next, message);
        true
    }

    /// RebootRequired | Rebooting → VerifyingAfterBoot → Failed: the operation staged a
    /// trial boot, but its trial entry (`entry`) is missing or has lost its metadata
    /// line, so nothing says what to commit: whatever booted, the default boot
    /// configuration does not carry the change, and the operation says so, naming the
    /// entry (never `Succeeded`: the next boot would lose the arguments). True (settled).
    fn lost_trial(&self, op: &mut Op, boot_id: &str, entry: &str) -> bool {
        let next = op.state().booted(boot_id);
        if !enter_now(op, next, format!("booted (boot id {boot_id}); verifying")) {
            return false;
        }
        let booted = match self.verify_boot(op.wire()) {
            Ok(f) if f.missing.is_empty() && f.lingering.is_empty() => {
                "/proc/cmdline shows the trial's arguments (the trial entry booted once)"
            }
            Ok(_) => "/proc/cmdline lacks the trial's arguments (the old default booted)",
            Err(_) => "/proc/cmdline can not be read",
        };
        let message = format!(
            "booted (boot id {boot_id}) after a trial boot, but the trial entry {entry} is missing or damaged (its metadata line is gone): the change could not be committed, the default boot configuration does not carry it, and the next boot runs without it; {booted}; remove {entry} if it is left (then regenerate the boot configuration) and re-apply"
        );
        let next = op.state().boot_verified(false);
        enter_now(op, next, message);
        true
    }

    /// Rebooting → Succeeded on a node without a boot id, once `/proc/cmdline` shows the
    /// operation; true when it did.
    fn after_boot_without_id(&self, op: &mut Op) -> bool {
        // not verified while /proc/cmdline is unknown: it stays Rebooting
        let Ok(found) = self.verify_boot(op.wire()) else {
            return false;
        };
        if !(found.missing.is_empty() && found.lingering.is_empty()) {
            return false;
        }
        let next = op.state().verified_without_id();
        enter_now(
            op,
            next,
            "the node has no boot id; /proc/cmdline shows the new kernel arguments".into(),
        )
    }

    /// Operations waiting for a reboot are superseded by the operation `new_id` once it
    /// committed (past its commit point, or rolled forward at start): their staged
    /// changes are replaced, so a later reboot must not be read as theirs. Not before:
    /// an operation that fails, rolls back or is refused before its commit point put the
    /// node back as it was, the waiting operation's trial entry and one-shot included,
    /// so that operation still waits (status, history and the boot loader agree).
    ///
    /// The history is read only while an operation may be waiting (`Agent::maybe_waiting`:
    /// always after a start, then only after an operation was saved waiting); the flag is
    /// cleared before the read, so a waiting operation saved meanwhile sets it again.
    pub(super) fn supersede_waiting(&self, new_id: &str) {
        use std::sync::atomic::Ordering;
        if !self.maybe_waiting.swap(false, Ordering::SeqCst) {
            return;
        }
        let Ok(heads) = self.state.operation_heads() else {
            self.maybe_waiting.store(true, Ordering::SeqCst);
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
            let Ok(Some(wire)) = self.state.get_operation(&h.id) else {
                // not superseded: look again next time
                self.maybe_waiting.store(true, Ordering::SeqCst);
                continue;
            };
            let mut op = Op::read_back(wire);
            let msg = format!(
                "superseded by operation {new_id} before the reboot; its staged changes were replaced"
            );
            let next = op.state().superseded();
            if self.publish(&mut op, next, msg).is_err() {
                self.maybe_waiting.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Reboots for an operation waiting in `RebootRequired` (or asks again for one in
    /// `Rebooting` whose reboot has not happened). Refused while an operation runs.
    pub(crate) fn reboot(&self, id: &str) -> Result<pb::Operation, super::AgentError> {
        inplace_wire::names::validate_operation_id(id)
            .map_err(super::AgentError::InvalidRequest)?;
        self.check_available()?;
        let op = {
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
        let mut op = Op::read_back(op);
        self.prepare_reboot(&mut op).map_err(|e| {
            super::AgentError::Precondition(format!(
                "the reboot for operation {id:?} was not requested: {e}"
            ))
        })?;
        op.push_action("requested reboot");
        let next = op.state().rebooting(&self.boot_id());
        self.publish(&mut op, next, "rebooting; verified after boot")
            .map_err(|e| super::AgentError::Internal(e.to_string()))?;
        if let Err(e) = self.request_reboot(&op) {
            let next = op.state().reboot_required("");
            let _ = self.publish(
                &mut op,
                next,
                format!("the reboot request failed ({e}); reboot the node"),
            );
            return Err(super::AgentError::Internal(e.to_string()));
        }
        Ok(op.into_wire())
    }
}

/// The action that records a trial boot which was not healthy in time (the agent then
/// reboots into the old default); the rollback after that boot names it as the fallback.
const HEALTH_DEADLINE: &str = "trial boot not healthy within the deadline";

/// `WDIOF_CARDRESET` in a watchdog's `bootstatus`: the last reboot was the watchdog's
/// (linux/watchdog.h).
const WDIOF_CARDRESET: u64 = 0x20;

impl Agent {
    /// The kernel-argument trial pending on the node (its artefact exists), with the
    /// backend that found it.
    fn pending_trial(&self) -> Option<(Box<dyn KernelArgsBackend>, PendingTrial)> {
        let backend =
            crate::bootloader::detect(&self.root, self.config.kernel_args.backend).ok()?;
        let trial = backend.pending_trial()?;
        Some((backend, trial))
    }

    /// The end of a trial boot, at the first start after a boot: the trial's command line
    /// runs and the node is healthy → committed as the default, `Succeeded`; it runs but
    /// the kubelet is not healthy within its timeout → the agent reboots into the old
    /// default (the one-shot is consumed); the old command line runs → the trial failed
    /// (panic, watchdog, the agent's reboot, or the boot loader did not boot it): the
    /// staged configuration is reverted and the operation ends `RolledBack` with the
    /// evidence. True once the operation changed (the caller saves it).
    /// The trial's boot, with `/proc/cmdline` unknown (`why`): the operation ends
    /// `Failed` saying so; the default stays the old command line and the trial entry
    /// stays for the operator (a `status` problem at the next start), since neither a
    /// commit nor a revert can be justified.
    fn trial_unknown(&self, op: &mut Op, boot_id: &str, trial: &PendingTrial, why: &str) -> bool {
        let next = op.state().booted(boot_id);
        if !enter_now(
            op,
            next,
            format!("booted (boot id {boot_id}); verifying the trial"),
        ) {
            return false;
        }
        let next = op.state().boot_verified(false);
        enter_now(
            op,
            next,
            format!(
                "booted (boot id {boot_id}) but {why}: the kernel arguments could not be verified, so the trial of {} was neither committed nor reverted (the default is the old command line; the trial entry stays); check /proc/cmdline, then re-apply",
                trial.meta.append.join(" ")
            ),
        );
        true
    }

    fn end_trial(
        &self,
        op: &mut Op,
        boot_id: &str,
        backend: &dyn KernelArgsBackend,
        trial: &PendingTrial,
    ) -> bool {
        let running = self
            .root
            .read_string("/proc/cmdline")
            .ok()
            .flatten()
            .unwrap_or_default();
        let running = running.trim();
        let verified = self.verify_boot(op.wire());
        if let Err(u) = &verified {
            // which command line booted can not be told: neither commit nor revert
            return self.trial_unknown(op, boot_id, trial, &u.to_string());
        }
        let shows = matches!(verified, Ok(f) if f.missing.is_empty() && f.lingering.is_empty());
        if shows && !running.is_empty() {
            let health = self.with_node(|n| n.kubelet_health());
            if let Err(why) = health {
                return self.trial_unhealthy(op, boot_id, &why);
            }
            let next = op.state().booted(boot_id);
            if !enter_now(
                op,
                next,
                format!(
                    "trial boot (boot id {boot_id}) healthy; committing its command line as the default"
                ),
            ) {
                return false;
            }
            let (ok, message) = match self.commit_trial(backend, trial) {
                Ok(done) => (
                    true,
                    format!(
                        "trial boot (boot id {boot_id}) healthy: /proc/cmdline shows {} and the kubelet is healthy; committed as the default ({})",
                        trial.meta.append.join(" "),
                        done.join("; ")
                    ),
                ),
                Err(e) => (
                    false,
                    format!(
                        "trial boot (boot id {boot_id}) healthy, but making it the default failed: {e}; the next boot uses the old default; re-apply"
                    ),
                ),
            };
            let next = op.state().boot_verified(ok);
            enter_now(op, next, message);
            return true;
        }
        let fallback = self.fallback_fired(op, trial);
        let next = op.state().booted(boot_id);
        if !enter_now(
            op,
            next,
            format!("booted (boot id {boot_id}) on the old command line; reverting the trial"),
        ) {
            return false;
        }
        let reverted = self.revert_trial(trial).and_then(|mut done| {
            done.push(self.restore_record(trial)?);
            Ok(done)
        });
        let what = if trial.meta.remove.is_empty() {
            trial.meta.append.join(" ")
        } else {
            format!(
                "{} (removing {})",
                trial.meta.append.join(" "),
                trial.meta.remove.join(" ")
            )
        };
        let message = format!(
            "kernel-argument trial failed, rolled back: the trial of {what} did not come up healthy and the node booted its old default command line (boot id {boot_id}, /proc/cmdline: {running}); fallback: {fallback}; the trial's command line was: {}; staged configuration reverted: {}",
            trial.meta.cmdline,
            match reverted {
                Ok(done) => done.join("; "),
                Err(e) => format!(
                    "incompletely ({e}); remove {} and check the boot configuration",
                    trial.path
                ),
            }
        );
        let next = op.state().trial_rolled_back();
        enter_now(op, next, message);
        true
    }

    /// The trial boot is not healthy within the kubelet's health timeout: recorded, then
    /// a reboot into the old default. True (the operation changed, and is saved here
    /// before the reboot).
    fn trial_unhealthy(&self, op: &mut Op, boot_id: &str, why: &str) -> bool {
        op.push_action(format!("{HEALTH_DEADLINE} (boot id {boot_id}): {why}"));
        let next = op.state().rebooting(boot_id);
        let message =
            format!("{HEALTH_DEADLINE} (boot id {boot_id}: {why}); rebooting into the old default");
        if !enter_now(op, next, message) {
            return false;
        }
        if let Err(e) = self.save_op(op.wire()) {
            tracing::error!(operation = %op.id(), error = %e, "saving the operation before the trial's reboot back");
        }
        tracing::warn!(operation = %op.id(), "{HEALTH_DEADLINE}: rebooting into the old default");
        if let Err(e) = self.rebooter.reboot(&format!(
            "inplaced: trial of operation {} unhealthy",
            op.id()
        )) {
            op.push_action(format!("the reboot back failed: {e}; reboot the node"));
        }
        true
    }

    /// Which fallback brought the node back: the agent's reboot after the health
    /// deadline, the hardware watchdog (`bootstatus`), the boot loader not booting the
    /// trial entry at all, or else a panic or reset before the agent ran.
    fn fallback_fired(&self, op: &Op, trial: &PendingTrial) -> String {
        if let Some(a) = op
            .wire()
            .actions
            .iter()
            .rev()
            .find(|a| a.starts_with(HEALTH_DEADLINE))
        {
            return format!("the agent rebooted back ({a})");
        }
        let status = self
            .root
            .read_string("/sys/class/watchdog/watchdog0/bootstatus")
            .ok()
            .flatten()
            .and_then(|s| s.trim().parse::<u64>().ok());
        if status.is_some_and(|s| s & WDIOF_CARDRESET != 0) {
            return "the hardware watchdog reset the hung trial boot (/sys/class/watchdog/watchdog0/bootstatus has WDIOF_CARDRESET)".into();
        }
        if trial.one_shot_pending == Some(true) {
            return "none: the boot loader did not boot the trial entry (its one-shot is still set)".into();
        }
        "the trial boot never reached the agent: a kernel panic (the trial's panic= reboots into the old default) or a reset".into()
    }

    /// Makes the trial's change the default: the backend's edits of its sources, the
    /// artefact removed, the regeneration. Returns what was done.
    fn commit_trial(
        &self,
        backend: &dyn KernelArgsBackend,
        trial: &PendingTrial,
    ) -> Result<Vec<String>, String> {
        let edits = backend.edit(&trial.meta.remove_args(), &trial.meta.append_args())?;
        let mut done = Vec::new();
        for e in edits {
            let (mode, uid, gid) = match self.root.stat(&e.path).map_err(|x| x.to_string())? {
                Some(m) => (m.mode, m.uid, m.gid),
                None => (0o644, 0, 0),
            };
            self.root
                .write_atomic(&e.path, &e.content, mode, uid, gid)
                .map_err(|x| x.to_string())?;
            done.push(format!("wrote {}", e.path));
        }
        done.extend(self.revert_trial(trial)?);
        Ok(done)
    }

    /// The applied record and spec as before the trial: the kernel arguments the agent
    /// owned then (its removals no longer pending), so nothing reports them as drift or
    /// converges to them again.
    fn restore_record(&self, trial: &PendingTrial) -> Result<String, String> {
        let meta = &trial.meta;
        let (previous, never_booted) = self.booted_previous(&meta.previous);
        let mut r = self.state.load_record().map_err(|e| e.to_string())?;
        r.kernel_args = previous.clone();
        r.kernel_args_removed
            .retain(|p| !meta.remove.contains(&p.arg));
        r.kernel_args_staged_in.clear();
        r.kernel_args_trial = None;
        self.state.save_record(&r).map_err(|e| e.to_string())?;
        if let Ok(Some(mut spec)) = self.state.load_applied_spec() {
            spec.kernel_args = previous.clone();
            let bytes = prost::Message::encode_to_vec(&spec);
            self.state
                .save_applied_spec(&bytes)
                .map_err(|e| e.to_string())?;
        }
        let dropped = if never_booted.is_empty() {
            String::new()
        } else {
            format!(
                " (the old default booted without {}, staged by an earlier trial that never booted; dropped from the record)",
                never_booted.join(" ")
            )
        };
        Ok(format!(
            "the applied record's kernel arguments set to [{}], those the booted default shows{dropped}",
            previous.join(" ")
        ))
    }

    /// `previous` split into the arguments the running command line (the old default, just
    /// booted) shows and those it lacks: an earlier trial this one replaced staged the
    /// latter, and they never booted. All of `previous` when `/proc/cmdline` is unknown.
    fn booted_previous(&self, previous: &[String]) -> (Vec<String>, Vec<String>) {
        use inplace_formats::cmdline::{Arg, Cmdline};
        let running = self
            .root
            .read_string("/proc/cmdline")
            .ok()
            .flatten()
            .unwrap_or_default();
        if running.trim().is_empty() {
            return (previous.to_vec(), Vec::new());
        }
        let mut have = Cmdline::parse(running.trim()).args().to_vec();
        let (mut kept, mut lost) = (Vec::new(), Vec::new());
        for p in previous {
            let found = Arg::parse_one(p)
                .ok()
                .and_then(|a| have.iter().position(|h| h.matches_exactly(&a)));
            match found {
                Some(i) => {
                    have.remove(i);
                    kept.push(p.clone());
                }
                None => lost.push(p.clone()),
            }
        }
        (kept, lost)
    }

    /// Removes the trial's artefact and runs its cleanup (regeneration, the one-shot
    /// cleared). Returns what was done.
    fn revert_trial(&self, trial: &PendingTrial) -> Result<Vec<String>, String> {
        let mut done = Vec::new();
        if self.root.remove(&trial.path).map_err(|e| e.to_string())? {
            done.push(format!("removed {}", trial.path));
        }
        for argv in &trial.cleanup {
            self.runner.run(argv).map_err(|e| e.to_string())?;
            done.push(format!("ran {}", argv.join(" ")));
        }
        Ok(done)
    }
}
