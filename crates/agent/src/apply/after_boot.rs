//! The after-boot half of an operation and the transitions the API or the agent's start
//! make outside the engine's run: settling at start the operations a previous run left
//! behind ([`Agent::recover`]: after a boot, `VerifyingAfterBoot` then `Succeeded` or
//! `Failed`; an interrupted one `Failed`), an explicit reboot ([`Agent::reboot`]), and the
//! supersession of operations waiting for a reboot ([`Agent::supersede_waiting`]). Each
//! phase change is a transition of [`super::machine`].

use super::machine::{AtStart, IllegalTransition, Next, Op};
use super::{Agent, now};
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
                self.state.save_operation(op.wire())?;
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
        let (running, next_boot) = crate::sections::kit::read_boot(&self.root, &self.config)?;
        let mut found = plan::verify_after_boot(&op.changes, &running, &next_boot);
        // the whole applied set, whatever operation staged it (an operation superseded
        // before the reboot staged part of what this boot must show)
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
        Ok(found)
    }

    /// RebootRequired | Rebooting → VerifyingAfterBoot → Succeeded | Failed: the node
    /// booted (a new boot id); the running command line must show the operation and the
    /// whole applied set of kernel arguments, whatever operation staged them. True once
    /// settled (the caller saves it).
    fn after_boot(&self, op: &mut Op, boot_id: &str) -> bool {
        self.reboot_finished(op, boot_id);
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
            let Ok(Some(wire)) = self.state.get_operation(&h.id) else {
                continue;
            };
            let mut op = Op::read_back(wire);
            let msg = format!(
                "superseded by operation {new_id} before the reboot; its staged changes were replaced"
            );
            let next = op.state().superseded();
            let _ = self.publish(&mut op, next, msg);
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
