//! Timed tries: an operation applied, then reverted unless confirmed in time.
//!
//! The model is Talos's `talosctl apply-config --mode try` (the configuration is applied
//! and rolled back after `--timeout` unless confirmed), made to survive an agent
//! restart. An `Apply` with `try_seconds` > 0:
//!
//! 1. is refused (INVALID_ARGUMENT) when its plan needs a reboot: a try is for live
//!    changes (a reboot-level change has its trial boot instead);
//! 2. saves the spec applied before it (`StateDir::save_try_base`, the state directory's
//!    `tries/<id>.pb`, 0600: it holds file content) before anything is written, and
//!    fixes its deadline, `try_deadline` = start + `try_seconds`, on the operation
//!    (persisted when it enters Staging, before its first change);
//! 3. runs as any operation, but its commit ends in `AwaitingConfirmation` instead of
//!    `Succeeded` (the journal records that phase too, so a crash after the commit point
//!    rolls forward into the wait, never into `Succeeded`);
//! 4. waits: [`Agent::confirm`] before the deadline ends it `Succeeded` and drops the
//!    saved spec; at the deadline the timer ([`Agent::watch_try`]) applies the saved spec
//!    as the operation `<id>.revert` ([`revert_id`]): every item the try added, changed or
//!    removed goes back to what the node had, by the same journal, originals and
//!    verification as any apply (removing an item restores its original byte for byte).
//!    The try then ends `RolledBack`, its message saying it was not confirmed in time and
//!    naming the revert, or `Failed` when the revert did not succeed.
//!
//! At start ([`Agent::resume_tries`]) every operation in `AwaitingConfirmation` gets its
//! timer again: a deadline that passed while the agent was down reverts at once. A
//! revert interrupted by a crash is the same operation id and spec applied again, which
//! the idempotency of `Apply` turns into "finish it" (or "it is done").
//!
//! While a try waits, every other `Apply` is ABORTED naming it: a second operation would
//! make the revert undo more than the try.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::machine::Op;
use super::{Agent, AgentError};
use inplace_wire::names::SpecError;
use inplace_wire::pb;
use inplace_wire::phase;
use inplace_wire::phase::Phase;

/// Longest try window, seconds (a day).
pub(crate) const MAX_TRY_SECONDS: u32 = 86_400;

/// True for an operation that is a timed try.
pub(crate) fn is_try(op: &pb::Operation) -> bool {
    op.try_seconds > 0 && op.try_deadline.is_some()
}

/// The id of the operation that reverts the try `id`: `<id>.revert`, or, when that would
/// pass the 128 bytes of an operation id, `revert.<first 32 hex digits of sha256(id)>`.
pub(crate) fn revert_id(id: &str) -> String {
    let plain = format!("{id}.revert");
    if plain.len() <= 128 {
        return plain;
    }
    let hash = crate::state::sha256_of(id.as_bytes());
    let hex = hash.trim_start_matches("sha256:");
    format!("revert.{}", &hex[..32.min(hex.len())])
}

/// Unix seconds now.
fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Refuses an operation id a caller may not choose: one of the form [`revert_id`] gives
/// (`<id>.revert`, `revert.<32 hex digits>`), reserved for the agent's revert of a try.
pub(crate) fn check_not_revert_id(id: &str) -> Result<(), SpecError> {
    let hashed = id
        .strip_prefix("revert.")
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    if id.ends_with(".revert") || hashed {
        return Err(SpecError::new(
            "operation_id",
            format!(
                "{id:?} has the form of the id the agent gives the revert of a timed try (<try id>.revert); choose another id"
            ),
        ));
    }
    Ok(())
}

/// `try_seconds` of a request, checked: at most [`MAX_TRY_SECONDS`].
pub(crate) fn check_try_seconds(try_seconds: u32) -> Result<(), SpecError> {
    if try_seconds > MAX_TRY_SECONDS {
        return Err(SpecError::new(
            "try_seconds",
            format!(
                "{try_seconds} s is longer than a try may wait ({MAX_TRY_SECONDS} s); give a shorter window"
            ),
        ));
    }
    Ok(())
}

/// The try's deadline, Unix seconds (0 for an operation that is not a try).
fn deadline_of(op: &pb::Operation) -> i64 {
    op.try_deadline.as_ref().map(|t| t.seconds).unwrap_or(0)
}

/// Unix milliseconds now.
fn unix_now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The try's deadline, Unix milliseconds (its nanoseconds counted: a window compared in
/// whole seconds ended up to a second early).
fn deadline_ms_of(op: &pb::Operation) -> i64 {
    op.try_deadline
        .as_ref()
        .map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
        .unwrap_or(0)
}

/// The message of a try entering `AwaitingConfirmation`.
pub(crate) fn waiting_message(op: &pb::Operation) -> String {
    let left = (deadline_of(op) - unix_now()).max(0);
    format!(
        "{} change(s) applied as a timed try: confirm within {left} s (inplacectl confirm {}; deadline in try_deadline), else they are reverted to the spec applied before",
        op.changes.len(),
        op.id
    )
}

/// What a waiting try is in this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Window {
    /// Waiting for its confirmation or its deadline.
    Open,
    /// The deadline passed: being reverted.
    Reverting,
}

/// The tries waiting in this run, and the condition their timers wait on.
#[derive(Debug, Default)]
pub(crate) struct Tries {
    open: Mutex<HashMap<String, Window>>,
    wake: Condvar,
}

impl Tries {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Window>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The try that makes an apply of `id` wait, if any: a try other than `id` whose
    /// window is open or being reverted (its own revert passes).
    fn blocking(&self, id: &str) -> Option<String> {
        self.lock()
            .keys()
            .find(|t| t.as_str() != id && revert_id(t) != id)
            .cloned()
    }
}

impl Agent {
    /// ABORTED naming the try when another one waits for its confirmation (its own
    /// apply, repeated, and its revert pass).
    pub(super) fn check_no_try_waits(&self, id: &str) -> Result<(), AgentError> {
        if let Some(t) = self.tries.blocking(id) {
            return Err(AgentError::Aborted(format!(
                "operation {t:?} is a timed try waiting for its confirmation: confirm it (inplacectl confirm {t}) or wait until it is reverted, then apply"
            )));
        }
        Ok(())
    }

    /// After the operation thread of a try settled it: its timer when it waits for its
    /// confirmation, else (it failed or was rolled back) its saved spec goes.
    pub(super) fn try_settled(self: &Arc<Self>, op: &Op) {
        if !is_try(op.wire()) {
            return;
        }
        if op.state().phase() == Phase::AwaitingConfirmation {
            self.spawn_try_timer(op.id().to_string());
        } else {
            self.forget_try(op.id());
        }
    }

    /// For a try whose plan is ready: refuses a plan that needs a reboot, and saves the
    /// spec applied before it (what the revert applies). INVALID_ARGUMENT naming
    /// `try_seconds` for the reboot, INTERNAL when the spec can not be saved.
    pub(super) fn prepare_try(&self, id: &str, plan: &crate::plan::Plan) -> Result<(), AgentError> {
        if plan.steps.reboot {
            let reboot: Vec<&str> = plan
                .report
                .changes
                .iter()
                .filter(|c| {
                    c.disruption
                        .as_ref()
                        .is_some_and(|d| d.level == pb::DisruptionLevel::Reboot as i32)
                })
                .map(|c| c.id.as_str())
                .collect();
            return Err(AgentError::InvalidRequest(SpecError::new(
                "try_seconds",
                format!(
                    "a timed try is for live changes, and {} need(s) a reboot; apply it without a try window",
                    reboot.join(", ")
                ),
            )));
        }
        let base = match self.state.load_applied_spec()? {
            Some(s) => s,
            None if self.state.load_record()?.is_empty() => pb::NodeSpec::default(),
            None => {
                return Err(AgentError::Precondition(
                    "the spec applied last is not in the state directory (an older inplaced applied it), so a try could not be reverted; apply the current spec once without a try window, then try".into(),
                ));
            }
        };
        self.state
            .save_try_base(id, &prost::Message::encode_to_vec(&base))?;
        self.tries.lock().insert(id.to_string(), Window::Open);
        Ok(())
    }

    /// The try `id` did not reach its wait (its apply failed or was rolled back): its
    /// saved spec and its window go.
    pub(super) fn forget_try(&self, id: &str) {
        let _ = self.state.drop_try_base(id);
        self.tries.lock().remove(id);
        self.tries.wake.notify_all();
    }

    /// At start: every try waiting in `AwaitingConfirmation` gets its timer again (a
    /// deadline that passed while the agent was down reverts at once).
    pub(crate) fn resume_tries(self: &Arc<Self>) {
        let Ok(heads) = self.state.operation_heads() else {
            return;
        };
        for h in heads {
            if phase::from_i32(h.phase) == Phase::AwaitingConfirmation {
                self.tries.lock().insert(h.id.clone(), Window::Open);
                self.spawn_try_timer(h.id);
            }
        }
    }

    /// Starts the timer of the try `id` (after its operation thread settled it).
    pub(super) fn spawn_try_timer(self: &Arc<Self>, id: String) {
        let agent = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name(format!("try-{id}"))
            .spawn(move || agent.watch_try(&id));
        if let Err(e) = spawned {
            self.problem(format!("the timer of a timed try could not start: {e}"));
        }
    }

    /// The timer of the try `id`: waits until it is confirmed or its deadline passes, then
    /// reverts it.
    fn watch_try(self: &Arc<Self>, id: &str) {
        let Ok(op) = self.get_operation(id) else {
            self.tries.lock().remove(id);
            return;
        };
        if phase::of(&op) != Phase::AwaitingConfirmation {
            self.tries.lock().remove(id);
            return;
        }
        let deadline = deadline_ms_of(&op);
        let mut open = self.tries.lock();
        loop {
            if open.get(id) != Some(&Window::Open) {
                return; // confirmed (or forgotten)
            }
            let left = deadline - unix_now_ms();
            if left <= 0 {
                break;
            }
            let wait = Duration::from_millis(left as u64).min(Duration::from_secs(1));
            open = match self.tries.wake.wait_timeout(open, wait) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        open.insert(id.to_string(), Window::Reverting);
        drop(open);
        self.expire(id);
        self.tries.lock().remove(id);
        self.tries.wake.notify_all();
    }

    /// The deadline of the try `id` passed unconfirmed: applies the spec saved before it
    /// (operation [`revert_id`]), waits for that to settle, and ends the try
    /// `RolledBack` (reverted) or `Failed` (the revert did not succeed).
    fn expire(self: &Arc<Self>, id: &str) {
        let rid = revert_id(id);
        let reverted = match self.state.load_try_base(id) {
            Ok(Some(base)) => self.revert_to(&rid, base),
            Ok(None) => Err("the spec applied before it is not in the state directory".into()),
            Err(e) => Err(e.to_string()),
        };
        let Ok(wire) = self.get_operation(id) else {
            return;
        };
        let mut op = Op::read_back(wire);
        let secs = op.wire().try_seconds;
        let (ok, message) = match reverted {
            Ok(rev) if phase::of(&rev) == Phase::Succeeded => (
                true,
                format!(
                    "not confirmed within its {secs} s try window: reverted to the spec applied before it by operation {rid} ({})",
                    rev.message
                ),
            ),
            Ok(rev) => (
                false,
                format!(
                    "not confirmed within its {secs} s try window; reverting it failed: operation {rid} ended {}: {}",
                    phase::name(phase::of(&rev)),
                    rev.message
                ),
            ),
            Err(e) => (
                false,
                format!("not confirmed within its {secs} s try window; reverting it failed: {e}"),
            ),
        };
        op.push_action(format!("reverted by operation {rid}"));
        let next = op.state().expired(ok);
        // the try stops blocking applies before its end is published: a caller that sees
        // it RolledBack and applies at once must not be refused for it
        self.tries.lock().remove(id);
        self.tries.wake.notify_all();
        if self.publish(&mut op, next, message).is_ok() && ok {
            let _ = self.state.drop_try_base(id);
        }
    }

    /// Applies `base` as the operation `rid` (waiting while another operation runs) and
    /// waits until it settles; its last state.
    fn revert_to(self: &Arc<Self>, rid: &str, base: pb::NodeSpec) -> Result<pb::Operation, String> {
        let req = pb::ApplyRequest {
            desired: Some(base),
            operation_id: rid.to_string(),
            reboot_policy: pb::RebootPolicy::CallerHandles as i32,
            ..Default::default()
        };
        loop {
            match self.apply(req.clone()) {
                Ok(_) => break,
                Err(AgentError::Busy(_)) => std::thread::sleep(Duration::from_millis(500)),
                Err(e) => return Err(e.to_string()),
            }
        }
        let (events, rx) = self.watch(rid).map_err(|e| e.to_string())?;
        let mut last = events.last().cloned();
        if let Some(mut rx) = rx {
            while !last.as_ref().is_some_and(|o| phase::is_settled(o.phase)) {
                match rx.blocking_recv() {
                    Ok(o) => last = Some(o),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        last = self.get_operation(rid).ok();
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        last = self.get_operation(rid).ok();
                        break;
                    }
                }
            }
        }
        last.ok_or_else(|| format!("operation {rid} vanished"))
    }

    /// Confirms the timed try `id` (see the module docs): it ends `Succeeded` and stays.
    /// Errors: NOT_FOUND (no such operation), FAILED_PRECONDITION (not a try, still
    /// being applied, or its deadline passed: reverted or being reverted).
    pub(crate) fn confirm(&self, id: &str) -> Result<pb::Operation, AgentError> {
        inplace_wire::names::validate_operation_id_field("operation_id", id)
            .map_err(AgentError::InvalidRequest)?;
        self.check_available()?;
        let mut open = self.tries.lock();
        let wire = self.get_operation(id)?;
        if wire.try_seconds == 0 {
            return Err(AgentError::Precondition(format!(
                "operation {id:?} is not a timed try (apply --try); there is nothing to confirm"
            )));
        }
        let late = unix_now_ms() - deadline_ms_of(&wire);
        match phase::of(&wire) {
            Phase::Succeeded => return Ok(wire),
            Phase::AwaitingConfirmation if late < 0 && open.get(id) != Some(&Window::Reverting) => {
            }
            Phase::AwaitingConfirmation => {
                return Err(AgentError::Precondition(format!(
                    "operation {id:?} was not confirmed in time: its {} s try window closed {} s ago and it is being reverted; apply it again under a new operation id to try again (the same id answers with this operation)",
                    wire.try_seconds,
                    late.max(0) / 1000
                )));
            }
            Phase::RolledBack | Phase::Failed if phase::is_terminal(wire.phase) => {
                return Err(AgentError::Precondition(format!(
                    "operation {id:?} can no longer be confirmed: it ended {} ({}); apply it again under a new operation id to try again (the same id answers with this operation)",
                    phase::name(phase::of(&wire)),
                    wire.message
                )));
            }
            p => {
                return Err(AgentError::Precondition(format!(
                    "operation {id:?} is {}: it is still being applied; confirm it once it is AwaitingConfirmation",
                    phase::name(p)
                )));
            }
        }
        let mut op = Op::read_back(wire);
        op.push_action("confirmed");
        let next = op.state().confirmed();
        let message = format!(
            "confirmed {} s before its deadline; the {} change(s) stay",
            -late / 1000,
            op.wire().changes.len()
        );
        self.publish(&mut op, next, message)
            .map_err(|e| AgentError::Internal(e.to_string()))?;
        open.remove(id);
        drop(open);
        self.tries.wake.notify_all();
        let _ = self.state.drop_try_base(id);
        Ok(op.into_wire())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_may_not_choose_a_revert_id() {
        for id in ["t1.revert", &revert_id(&"x".repeat(128))] {
            let e = check_not_revert_id(id).unwrap_err().to_string();
            assert!(
                e.contains("operation_id") && e.contains("revert of a timed try"),
                "{e}"
            );
        }
        for id in ["t1", "revert", "revert.notes", "t1.reverted"] {
            assert!(check_not_revert_id(id).is_ok(), "{id}");
        }
    }

    #[test]
    fn revert_ids_are_valid_operation_ids() {
        assert_eq!(revert_id("t1"), "t1.revert");
        let long = "a".repeat(128);
        let r = revert_id(&long);
        assert!(r.starts_with("revert.") && r.len() <= 128, "{r}");
        assert_ne!(r, revert_id(&"b".repeat(128)));
        for id in ["t1", long.as_str(), &"x".repeat(121), &"x".repeat(122)] {
            inplace_wire::names::validate_operation_id(&revert_id(id)).unwrap();
        }
    }

    #[test]
    fn a_try_blocks_every_apply_but_its_own_and_its_revert() {
        let t = Tries::default();
        assert_eq!(t.blocking("x"), None);
        t.lock().insert("t1".into(), Window::Open);
        assert_eq!(t.blocking("x").as_deref(), Some("t1"));
        assert_eq!(t.blocking("t1"), None);
        assert_eq!(t.blocking("t1.revert"), None);
    }
}
