//! An operation's life as a typed state machine, without I/O (after zincati's
//! `update_agent` state machine).
//!
//! [`OpState`] is the state of one operation, each variant carrying the data the engine
//! needs in it: the write-ahead intent from Committing to Verifying (a rollback restarts
//! its units), the boot id a reboot must change while the operation waits for one, the
//! boot id it booted into while the boot is verified. One pure function per transition
//! ([`OpState::start`], [`OpState::staged`], [`OpState::committed`]...) returns the next
//! state as a [`Next`], or an [`IllegalTransition`] when [`inplace_wire::phase`] (the one
//! table of allowed transitions, [`phase::TRANSITIONS`], and the phases a journal settles
//! into, [`phase::FROM_JOURNAL`]) does not allow it. Nothing here panics.
//!
//! [`Op`] is an operation as the agent holds it: its state and its wire form
//! ([`pb::Operation`]). [`Op::enter`] is the only writer of the wire form's phase: it takes
//! a [`Next`] (which only the transition functions make), and writes the phase, the
//! message, the time and the boot id from the state.
//!
//! | transition                       | from                                  | to                               |
//! |----------------------------------|---------------------------------------|----------------------------------|
//! | [`OpState::start`]               | Validating                            | Staging                          |
//! | [`OpState::staged`]              | Staging                               | Committing (the intent)          |
//! | [`OpState::committed`]           | Committing                            | Acting                           |
//! | [`OpState::acted`]               | Acting                                | Verifying                        |
//! | [`OpState::verified`]            | Verifying                             | Succeeded                        |
//! | [`OpState::reboot_required`]     | Verifying, Rebooting (request failed) | RebootRequired (boot id awaited) |
//! | [`OpState::rebooting`]           | Verifying, RebootRequired, Rebooting  | Rebooting (boot id awaited)      |
//! | [`OpState::booted`]              | RebootRequired, Rebooting             | VerifyingAfterBoot (new boot id) |
//! | [`OpState::boot_verified`]       | VerifyingAfterBoot                    | Succeeded or Failed              |
//! | [`OpState::trial_rolled_back`]   | VerifyingAfterBoot                    | RolledBack (a failed trial boot) |
//! | [`OpState::verified_without_id`] | Rebooting                             | Succeeded                        |
//! | [`OpState::superseded`]          | RebootRequired, Rebooting             | Failed                           |
//! | [`OpState::failed`]              | in flight                             | Failed or RolledBack             |
//! | [`OpState::interrupted`]         | in flight (read back at start)        | Failed                           |
//! | [`OpState::settled_by_journal`]  | any (its journal is the truth)        | one of [`phase::FROM_JOURNAL`]   |
//! | [`OpState::stay`]                | in flight                             | the same (a new message)         |
//! | [`OpState::awaiting_confirmation`] | Verifying (a timed try)             | AwaitingConfirmation             |
//! | [`OpState::confirmed`]           | AwaitingConfirmation                  | Succeeded                        |
//! | [`OpState::expired`]             | AwaitingConfirmation                  | RolledBack or Failed (reverting failed) |
//!
//! What the agent does at start with an operation read back is
//! [`OpState::at_start`].

use std::sync::Arc;

use crate::state::Intent;
use inplace_wire::pb;
use inplace_wire::phase;
use inplace_wire::phase::{Phase, is_settled};

/// A transition the table does not allow: the operation stays as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} -> {} is not an allowed transition of an operation",
    phase::name(*from),
    phase::name(*to)
)]
pub(crate) struct IllegalTransition {
    /// The phase the operation is in.
    pub from: Phase,
    /// The phase asked for.
    pub to: Phase,
}

/// The state of an operation: its phase, with the data the engine needs in it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum OpState {
    /// Planned; nothing written.
    Validating,
    /// Writing the journal (originals, pre-images, intent).
    Staging,
    /// The intent is durable; files, removals and live sysctls are being written.
    Committing {
        /// The write-ahead intent (its units are restarted after a rollback).
        intent: Arc<Intent>,
    },
    /// Commands and unit actions.
    Acting {
        /// The write-ahead intent.
        intent: Arc<Intent>,
    },
    /// Health gate, re-plan, then the commit point.
    Verifying {
        /// The write-ahead intent.
        intent: Arc<Intent>,
    },
    /// Committed; waits for a reboot the caller makes.
    RebootRequired {
        /// The boot id the changes were staged in: a start with another one is the reboot.
        awaited: String,
    },
    /// Committed; a reboot was requested.
    Rebooting {
        /// The boot id the reboot was requested in.
        awaited: String,
    },
    /// Booted; the running command line is being checked.
    VerifyingAfterBoot {
        /// The boot id of the boot verified.
        booted: String,
    },
    /// Done.
    Succeeded,
    /// Ended without a change left on the node (or one it can not verify).
    Failed,
    /// Ended with every completed step undone.
    RolledBack,
    /// A timed try, committed, waiting for its confirmation until the deadline on its
    /// wire form (`try_deadline`; see `apply::try_window`).
    AwaitingConfirmation,
    /// Read back from `operations/` in a phase whose data lived only in memory (the agent
    /// stopped in the middle of it), or in an unknown phase (`Unspecified`): it can only
    /// be settled, as interrupted or from its journal.
    Stopped(Phase),
}

/// The phases that wait for a reboot.
const WAITING: &[Phase] = &[Phase::RebootRequired, Phase::Rebooting];

/// The phases in flight (not settled; `Unspecified` is an unknown phase read back).
const IN_FLIGHT: &[Phase] = &[
    Phase::Unspecified,
    Phase::Validating,
    Phase::Staging,
    Phase::Committing,
    Phase::Acting,
    Phase::Verifying,
    Phase::VerifyingAfterBoot,
];

/// What the agent's start does with an operation read back ([`OpState::at_start`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AtStart {
    /// It waited for a reboot and the boot id changed: verify the boot.
    Booted(String),
    /// It waited in Rebooting on a node without a boot id: verified once
    /// `/proc/cmdline` shows its changes.
    VerifyWithoutId,
    /// The agent stopped in the middle of it: it ends `Failed` (interrupted).
    Interrupted,
    /// Settled, or still waiting for its reboot: left as it is.
    Leave,
}

/// A state the transition table allows next; made only by the transition functions and
/// entered with [`Op::enter`].
#[derive(Debug, PartialEq)]
pub(crate) struct Next {
    from: Phase,
    to: OpState,
}

impl OpState {
    /// The wire phase of this state.
    pub(crate) fn phase(&self) -> Phase {
        match self {
            OpState::Validating => Phase::Validating,
            OpState::Staging => Phase::Staging,
            OpState::Committing { .. } => Phase::Committing,
            OpState::Acting { .. } => Phase::Acting,
            OpState::Verifying { .. } => Phase::Verifying,
            OpState::RebootRequired { .. } => Phase::RebootRequired,
            OpState::Rebooting { .. } => Phase::Rebooting,
            OpState::VerifyingAfterBoot { .. } => Phase::VerifyingAfterBoot,
            OpState::Succeeded => Phase::Succeeded,
            OpState::Failed => Phase::Failed,
            OpState::RolledBack => Phase::RolledBack,
            OpState::AwaitingConfirmation => Phase::AwaitingConfirmation,
            OpState::Stopped(p) => *p,
        }
    }

    /// The state of an operation read back (from `operations/` or from memory): its
    /// phase, with the boot id of the wire form where the state carries one. In-flight
    /// phases before the commit are [`OpState::Stopped`]: their intent is not on the
    /// wire.
    pub(crate) fn of_wire(op: &pb::Operation) -> OpState {
        let boot = || op.boot_id.clone();
        match phase::of(op) {
            Phase::RebootRequired => OpState::RebootRequired { awaited: boot() },
            Phase::Rebooting => OpState::Rebooting { awaited: boot() },
            Phase::VerifyingAfterBoot => OpState::VerifyingAfterBoot { booted: boot() },
            Phase::Succeeded => OpState::Succeeded,
            Phase::Failed => OpState::Failed,
            Phase::RolledBack => OpState::RolledBack,
            Phase::AwaitingConfirmation => OpState::AwaitingConfirmation,
            p => OpState::Stopped(p),
        }
    }

    /// The intent, in the phases that carry it.
    #[cfg(test)]
    pub(crate) fn intent(&self) -> Option<&Intent> {
        match self {
            OpState::Committing { intent }
            | OpState::Acting { intent }
            | OpState::Verifying { intent } => Some(intent),
            _ => None,
        }
    }

    /// The boot id the state carries (awaited or booted), written to the wire form.
    fn boot_id(&self) -> Option<&str> {
        match self {
            OpState::RebootRequired { awaited } | OpState::Rebooting { awaited } => Some(awaited),
            OpState::VerifyingAfterBoot { booted } => Some(booted),
            _ => None,
        }
    }

    /// `to`, when this state is one of `sources` (the transition's own precondition) and
    /// the table allows `self → to`. A [`OpState::Stopped`] operation only ends
    /// `Failed` (interrupted), and only from a phase in flight.
    fn to(&self, sources: &[Phase], to: OpState) -> Result<Next, IllegalTransition> {
        let from = self.phase();
        let stopped = matches!(self, OpState::Stopped(_))
            && (to != OpState::Failed || is_settled(from as i32));
        if sources.contains(&from) && !stopped && phase::allowed(from, to.phase()) {
            Ok(Next { from, to })
        } else {
            Err(IllegalTransition {
                from,
                to: to.phase(),
            })
        }
    }

    /// The intent this state carries, for the next (empty when it carries none: the
    /// transition is then refused anyway).
    fn carried(&self) -> Arc<Intent> {
        match self {
            OpState::Committing { intent }
            | OpState::Acting { intent }
            | OpState::Verifying { intent } => intent.clone(),
            _ => Arc::default(),
        }
    }

    /// Validating → Staging: the operation starts.
    pub(crate) fn start(&self) -> Result<Next, IllegalTransition> {
        self.to(&[Phase::Validating], OpState::Staging)
    }

    /// Staging → Committing: the intent is durable.
    pub(crate) fn staged(&self, intent: Arc<Intent>) -> Result<Next, IllegalTransition> {
        self.to(&[Phase::Staging], OpState::Committing { intent })
    }

    /// Committing → Acting: every write, removal and live sysctl is done.
    pub(crate) fn committed(&self) -> Result<Next, IllegalTransition> {
        let intent = self.carried();
        self.to(&[Phase::Committing], OpState::Acting { intent })
    }

    /// Acting → Verifying: the commands and unit actions ran.
    pub(crate) fn acted(&self) -> Result<Next, IllegalTransition> {
        let intent = self.carried();
        self.to(&[Phase::Acting], OpState::Verifying { intent })
    }

    /// Verifying → Succeeded: verified and committed, no reboot needed.
    pub(crate) fn verified(&self) -> Result<Next, IllegalTransition> {
        self.to(&[Phase::Verifying], OpState::Succeeded)
    }

    /// Verifying → RebootRequired (committed; the changes take effect after a reboot in a
    /// boot other than `boot_id`), or Rebooting → RebootRequired (the reboot request
    /// failed; the boot id awaited stays).
    pub(crate) fn reboot_required(&self, boot_id: &str) -> Result<Next, IllegalTransition> {
        let awaited = match self {
            OpState::Rebooting { awaited } => awaited.clone(),
            _ => boot_id.to_string(),
        };
        self.to(
            &[Phase::Verifying, Phase::Rebooting],
            OpState::RebootRequired { awaited },
        )
    }

    /// Verifying | RebootRequired | Rebooting → Rebooting: a reboot is requested in the
    /// boot `boot_id`.
    pub(crate) fn rebooting(&self, boot_id: &str) -> Result<Next, IllegalTransition> {
        self.to(
            &[Phase::Verifying, Phase::RebootRequired, Phase::Rebooting],
            OpState::Rebooting {
                awaited: boot_id.to_string(),
            },
        )
    }

    /// What the agent's start does with this operation, in the boot `boot_id` (empty: the
    /// node has none).
    pub(crate) fn at_start(&self, boot_id: &str) -> AtStart {
        match self {
            OpState::RebootRequired { awaited } | OpState::Rebooting { awaited }
                if !boot_id.is_empty() && awaited != boot_id =>
            {
                AtStart::Booted(boot_id.to_string())
            }
            OpState::Rebooting { .. } if boot_id.is_empty() => AtStart::VerifyWithoutId,
            s if !is_settled(s.phase() as i32) => AtStart::Interrupted,
            _ => AtStart::Leave,
        }
    }

    /// RebootRequired | Rebooting → VerifyingAfterBoot: the node booted, with boot id
    /// `boot_id`.
    pub(crate) fn booted(&self, boot_id: &str) -> Result<Next, IllegalTransition> {
        self.to(
            WAITING,
            OpState::VerifyingAfterBoot {
                booted: boot_id.to_string(),
            },
        )
    }

    /// VerifyingAfterBoot → Succeeded (the boot shows the changes) | Failed (it does not,
    /// or it could not be read).
    pub(crate) fn boot_verified(&self, shows_changes: bool) -> Result<Next, IllegalTransition> {
        let to = if shows_changes {
            OpState::Succeeded
        } else {
            OpState::Failed
        };
        self.to(&[Phase::VerifyingAfterBoot], to)
    }

    /// VerifyingAfterBoot → RolledBack: the trial boot of a kernel-argument change failed,
    /// the node runs its old default command line and the staged configuration is reverted.
    pub(crate) fn trial_rolled_back(&self) -> Result<Next, IllegalTransition> {
        self.to(&[Phase::VerifyingAfterBoot], OpState::RolledBack)
    }

    /// Rebooting → Succeeded on a node without a boot id: `/proc/cmdline` shows the
    /// changes.
    pub(crate) fn verified_without_id(&self) -> Result<Next, IllegalTransition> {
        self.to(&[Phase::Rebooting], OpState::Succeeded)
    }

    /// RebootRequired | Rebooting → Failed: a new operation committed, replacing the
    /// staged changes, before the reboot.
    pub(crate) fn superseded(&self) -> Result<Next, IllegalTransition> {
        self.to(WAITING, OpState::Failed)
    }

    /// In flight → `end` (`Failed` or `RolledBack`): a transition failed; `Failed` when
    /// nothing was changed, `RolledBack` when what was done is undone (not before
    /// Committing).
    pub(crate) fn failed(&self, end: Phase) -> Result<Next, IllegalTransition> {
        let to = match end {
            Phase::Failed => OpState::Failed,
            // after a boot only a failed trial rolls back ([`OpState::trial_rolled_back`])
            Phase::RolledBack if self.phase() != Phase::VerifyingAfterBoot => OpState::RolledBack,
            to => {
                return Err(IllegalTransition {
                    from: self.phase(),
                    to,
                });
            }
        };
        self.to(IN_FLIGHT, to)
    }

    /// In flight → Failed: read back at start, the agent stopped in the middle of it (and
    /// it has no journal to settle it from).
    pub(crate) fn interrupted(&self) -> Result<Next, IllegalTransition> {
        self.failed(Phase::Failed)
    }

    /// Any → one of [`phase::FROM_JOURNAL`]: its journal settled it at start (rolled
    /// forward into `end` as the journal recorded it, rolled back, or failed), whatever
    /// phase its file said. Rolled forward into RebootRequired, it awaits a boot other
    /// than `boot_id` (its wire form's).
    pub(crate) fn settled_by_journal(
        &self,
        end: Phase,
        boot_id: &str,
    ) -> Result<Next, IllegalTransition> {
        let from = self.phase();
        let to = match end {
            Phase::Succeeded => OpState::Succeeded,
            Phase::Failed => OpState::Failed,
            Phase::RolledBack => OpState::RolledBack,
            Phase::RebootRequired => OpState::RebootRequired {
                awaited: boot_id.to_string(),
            },
            Phase::AwaitingConfirmation => OpState::AwaitingConfirmation,
            to => return Err(IllegalTransition { from, to }),
        };
        debug_assert!(phase::FROM_JOURNAL.contains(&to.phase()));
        Ok(Next { from, to })
    }

    /// Verifying → AwaitingConfirmation: a timed try is verified and committed.
    pub(crate) fn awaiting_confirmation(&self) -> Result<Next, IllegalTransition> {
        self.to(&[Phase::Verifying], OpState::AwaitingConfirmation)
    }

    /// AwaitingConfirmation → Succeeded: the try was confirmed in time.
    pub(crate) fn confirmed(&self) -> Result<Next, IllegalTransition> {
        self.to(&[Phase::AwaitingConfirmation], OpState::Succeeded)
    }

    /// AwaitingConfirmation → RolledBack (not confirmed in time; `reverted`) | Failed
    /// (reverting it failed).
    pub(crate) fn expired(&self, reverted: bool) -> Result<Next, IllegalTransition> {
        let to = if reverted {
            OpState::RolledBack
        } else {
            OpState::Failed
        };
        self.to(&[Phase::AwaitingConfirmation], to)
    }

    /// The same state again with a new message (a step of a long phase), while in flight.
    pub(crate) fn stay(&self) -> Result<Next, IllegalTransition> {
        let from = self.phase();
        if is_settled(from as i32) {
            return Err(IllegalTransition { from, to: from });
        }
        Ok(Next {
            from,
            to: self.clone(),
        })
    }
}

/// An operation as the agent holds it: its state, and its wire form, whose phase only
/// [`Op::enter`] changes.
#[derive(Debug, Clone)]
pub(crate) struct Op {
    state: OpState,
    wire: pb::Operation,
}

impl Op {
    /// A new operation: `wire` (its phase whatever it says) in `Validating`.
    pub(crate) fn new(wire: pb::Operation) -> Op {
        let mut op = Op {
            state: OpState::Validating,
            wire,
        };
        op.write_state();
        op
    }

    /// An operation read back: its state from its wire form ([`OpState::of_wire`]).
    pub(crate) fn read_back(wire: pb::Operation) -> Op {
        Op {
            state: OpState::of_wire(&wire),
            wire,
        }
    }

    /// Its state.
    pub(crate) fn state(&self) -> &OpState {
        &self.state
    }

    /// Its wire form.
    pub(crate) fn wire(&self) -> &pb::Operation {
        &self.wire
    }

    /// Its wire form, taken.
    pub(crate) fn into_wire(self) -> pb::Operation {
        self.wire
    }

    /// Its id.
    pub(crate) fn id(&self) -> &str {
        &self.wire.id
    }

    /// Appends an action.
    pub(crate) fn push_action(&mut self, action: impl Into<String>) {
        self.wire.actions.push(action.into());
    }

    /// Records the reboot asked for (`apply::reboot_method`): the method, why, and later
    /// its time. Not a phase: the phase changes only with [`Op::enter`].
    pub(crate) fn set_reboot(&mut self, report: pb::RebootReport) {
        self.wire.reboot = Some(report);
    }

    /// Enters `next` at `at` with `message`: the only place an operation's phase changes.
    /// The wire form gets the phase, the message, the time and the boot id the state
    /// carries. Refused (nothing changes) when `next` was made from another state than
    /// the operation is in.
    pub(crate) fn enter(
        &mut self,
        next: Next,
        message: impl Into<String>,
        at: pbjson_types::Timestamp,
    ) -> Result<(), IllegalTransition> {
        if next.from != self.state.phase() {
            return Err(IllegalTransition {
                from: self.state.phase(),
                to: next.to.phase(),
            });
        }
        self.state = next.to;
        self.write_state();
        self.wire.message = message.into();
        self.wire.updated = Some(at);
        Ok(())
    }

    /// The wire form's phase and boot id from the state: the only writer of a phase,
    /// for [`Op::new`] (the first state) and [`Op::enter`] (every change).
    fn write_state(&mut self) {
        self.wire.phase = self.state.phase() as i32;
        if let Some(b) = self.state.boot_id() {
            self.wire.boot_id = b.to_string();
        }
    }
}

#[cfg(test)]
mod tests;
