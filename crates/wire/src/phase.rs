//! An operation's phases ([`Phase`], the wire enum): their names, their predicates and the
//! table of allowed transitions, next to the phase type so that every layer (the state
//! directory's pruning, the engine, the server, the extension) asks the same rules
//! without importing the engine.
//!
//! ```text
//! Validating → Staging → Committing → Acting → Verifying ─┬→ Succeeded
//!                                                         ├→ RebootRequired ⇄ Rebooting
//!                                                         │        └──────────┴→ VerifyingAfterBoot → Succeeded | Failed | RolledBack (a failed trial boot)
//!                                                         ├→ AwaitingConfirmation → Succeeded | RolledBack | Failed
//!                                                         └→ Failed | RolledBack
//! ```
//!
//! `AwaitingConfirmation` is a timed try's wait (`ApplyRequest.try_seconds`, after
//! Talos's `apply-config --mode try`): applied and verified, committed, and reverted
//! unless confirmed by its deadline. It is a phase of its own, not a `Succeeded` with a
//! flag, because it is settled but not terminal, like `RebootRequired`: the operation's
//! thread has ended, the agent's start must leave it waiting (never call it
//! interrupted), and it still moves on: `Succeeded` (confirmed), `RolledBack` (not
//! confirmed in time, reverted) or `Failed` (the revert failed).
//!
//! Any phase before the commit may also end `Failed` (staging fails, or an agent stop
//! interrupts it before its journal is complete, or its journal does not verify) or
//! `RolledBack` (a failure after the first write, or an agent stop whose journal the next
//! start rolls back). Recovery at start settles an interrupted operation from its journal
//! into one of [`FROM_JOURNAL`], whatever phase its file said (the journal, not the file,
//! knows how far it got: see `apply::journal`).

use crate::pb::Operation;
pub use crate::pb::Phase;

/// Prefix of the message of an operation the agent stopped in the middle of; an `Apply`
/// with its id runs it again.
pub const INTERRUPTED: &str = "interrupted:";

/// The phase of `op` (`Unspecified` for an unknown number).
pub fn of(op: &Operation) -> Phase {
    from_i32(op.phase)
}

/// The phase numbered `phase` (`Unspecified` for an unknown number).
pub fn from_i32(phase: i32) -> Phase {
    Phase::try_from(phase).unwrap_or(Phase::Unspecified)
}

/// Human name of a phase (`RebootRequired`), as inplacectl shows it.
pub fn name(p: Phase) -> String {
    match p {
        Phase::Unspecified => "Unspecified",
        Phase::Validating => "Validating",
        Phase::Staging => "Staging",
        Phase::Committing => "Committing",
        Phase::Acting => "Acting",
        Phase::Verifying => "Verifying",
        Phase::RebootRequired => "RebootRequired",
        Phase::Rebooting => "Rebooting",
        Phase::VerifyingAfterBoot => "VerifyingAfterBoot",
        Phase::Succeeded => "Succeeded",
        Phase::Failed => "Failed",
        Phase::RolledBack => "RolledBack",
        Phase::AwaitingConfirmation => "AwaitingConfirmation",
    }
    .to_string()
}

/// True for phases after which nothing happens without a new request.
pub fn is_settled(phase: i32) -> bool {
    matches!(
        from_i32(phase),
        Phase::Succeeded
            | Phase::Failed
            | Phase::RolledBack
            | Phase::RebootRequired
            | Phase::Rebooting
            | Phase::AwaitingConfirmation
    )
}

/// True for phases that end an operation for good.
pub fn is_terminal(phase: i32) -> bool {
    matches!(
        from_i32(phase),
        Phase::Succeeded | Phase::Failed | Phase::RolledBack
    )
}

/// True for an operation the agent stopped in the middle of (phase `Failed`, or
/// `RolledBack` when the next start rolled it back from its journal, with a message
/// starting with [`INTERRUPTED`]): re-applying it with the same id runs it again.
pub fn is_interrupted(op: &Operation) -> bool {
    matches!(from_i32(op.phase), Phase::Failed | Phase::RolledBack)
        && op.message.starts_with(INTERRUPTED)
}

/// The allowed transitions, `from → to`, besides `in-flight → Failed` (an interrupted
/// operation, see [`allowed`]).
pub const TRANSITIONS: &[(Phase, &[Phase])] = &[
    (Phase::Validating, &[Phase::Staging]),
    // staging fails before the first write: nothing to roll back
    (Phase::Staging, &[Phase::Committing]),
    (Phase::Committing, &[Phase::Acting, Phase::RolledBack]),
    (Phase::Acting, &[Phase::Verifying, Phase::RolledBack]),
    (
        Phase::Verifying,
        &[
            Phase::Succeeded,
            Phase::RebootRequired,
            Phase::Rebooting,
            Phase::RolledBack,
            Phase::AwaitingConfirmation,
        ],
    ),
    (
        Phase::RebootRequired,
        // a reboot asked for; after a boot; superseded by a new operation
        &[Phase::Rebooting, Phase::VerifyingAfterBoot, Phase::Failed],
    ),
    (
        Phase::Rebooting,
        // asked again; the request failed; after a boot (or, with no boot id, once
        // /proc/cmdline shows the changes); superseded
        &[
            Phase::Rebooting,
            Phase::RebootRequired,
            Phase::VerifyingAfterBoot,
            Phase::Succeeded,
            Phase::Failed,
        ],
    ),
    (
        Phase::VerifyingAfterBoot,
        // a failed trial boot: the node is back on its old command line and the staged
        // configuration is reverted (issue 26)
        &[Phase::Succeeded, Phase::Failed, Phase::RolledBack],
    ),
    (
        Phase::AwaitingConfirmation,
        // confirmed; not confirmed in time and reverted; the revert failed
        &[Phase::Succeeded, Phase::RolledBack, Phase::Failed],
    ),
];

/// The phases the journal of an interrupted operation settles it into at start, from
/// whatever phase its file said: rolled forward past the commit point, the phase the
/// journal recorded (`Succeeded`, `RebootRequired`, or a timed try's
/// `AwaitingConfirmation`); rolled back, `RolledBack`; an
/// incomplete or damaged journal, `Failed`.
pub const FROM_JOURNAL: &[Phase] = &[
    Phase::Succeeded,
    Phase::RebootRequired,
    Phase::AwaitingConfirmation,
    Phase::Failed,
    Phase::RolledBack,
];

/// True when an operation may move from `from` to `to`: a transition of
/// [`TRANSITIONS`], or an operation in flight ending `Failed`.
pub fn allowed(from: Phase, to: Phase) -> bool {
    // in flight: not settled (an unknown phase number read back counts as in flight)
    (to == Phase::Failed && !is_settled(from as i32))
        || TRANSITIONS
            .iter()
            .any(|(f, tos)| *f == from && tos.contains(&to))
}

/// Every phase, in the order of the enum (for tables and their tests).
pub const ALL: &[Phase] = &[
    Phase::Unspecified,
    Phase::Validating,
    Phase::Staging,
    Phase::Committing,
    Phase::Acting,
    Phase::Verifying,
    Phase::RebootRequired,
    Phase::Rebooting,
    Phase::VerifyingAfterBoot,
    Phase::Succeeded,
    Phase::Failed,
    Phase::RolledBack,
    Phase::AwaitingConfirmation,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_of_transitions() {
        let ok = |f, t| assert!(allowed(f, t), "{f:?} -> {t:?} must be allowed");
        let no = |f, t| assert!(!allowed(f, t), "{f:?} -> {t:?} must be refused");
        // the straight line
        ok(Phase::Validating, Phase::Staging);
        ok(Phase::Staging, Phase::Committing);
        ok(Phase::Committing, Phase::Acting);
        ok(Phase::Acting, Phase::Verifying);
        ok(Phase::Verifying, Phase::Succeeded);
        // the reboot loop
        ok(Phase::Verifying, Phase::RebootRequired);
        ok(Phase::Verifying, Phase::Rebooting);
        ok(Phase::RebootRequired, Phase::Rebooting);
        ok(Phase::Rebooting, Phase::RebootRequired);
        ok(Phase::Rebooting, Phase::VerifyingAfterBoot);
        ok(Phase::VerifyingAfterBoot, Phase::Succeeded);
        ok(Phase::VerifyingAfterBoot, Phase::Failed);
        ok(Phase::VerifyingAfterBoot, Phase::RolledBack);
        // failures
        // in flight: Unspecified (an unknown number read back) up to Verifying, and
        // VerifyingAfterBoot
        for f in ALL[..6].iter().chain([&Phase::VerifyingAfterBoot]) {
            ok(*f, Phase::Failed);
        }
        ok(Phase::Committing, Phase::RolledBack);
        ok(Phase::Verifying, Phase::RolledBack);
        no(Phase::Staging, Phase::RolledBack);
        no(Phase::Validating, Phase::Succeeded);
        no(Phase::Committing, Phase::Succeeded);
        no(Phase::Acting, Phase::RebootRequired);
        no(Phase::RebootRequired, Phase::Succeeded);
        no(Phase::RebootRequired, Phase::RolledBack);
        // a timed try: waits, then confirmed, reverted, or its revert failed
        ok(Phase::Verifying, Phase::AwaitingConfirmation);
        ok(Phase::AwaitingConfirmation, Phase::Succeeded);
        ok(Phase::AwaitingConfirmation, Phase::RolledBack);
        ok(Phase::AwaitingConfirmation, Phase::Failed);
        no(Phase::Acting, Phase::AwaitingConfirmation);
        no(Phase::AwaitingConfirmation, Phase::RebootRequired);
        no(Phase::AwaitingConfirmation, Phase::Verifying);
        // terminal phases go nowhere
        for f in [Phase::Succeeded, Phase::Failed, Phase::RolledBack] {
            for t in ALL {
                no(f, *t);
            }
        }
        // nothing goes back to Validating or Unspecified
        for f in ALL {
            no(*f, Phase::Validating);
            no(*f, Phase::Unspecified);
        }
    }

    #[test]
    fn predicates_agree_with_the_table() {
        for p in ALL {
            let leaves = ALL.iter().any(|t| allowed(*p, *t));
            assert_eq!(is_terminal(*p as i32), !leaves && *p != Phase::Unspecified);
            if is_settled(*p as i32) && !is_terminal(*p as i32) {
                // settled but not terminal: waits for a reboot or a confirmation
                assert!(matches!(
                    p,
                    Phase::RebootRequired | Phase::Rebooting | Phase::AwaitingConfirmation
                ));
            }
        }
    }

    #[test]
    fn a_journal_settles_into_a_settled_phase_not_waiting_on_an_agent_reboot() {
        for p in FROM_JOURNAL {
            assert!(is_settled(*p as i32), "{p:?}");
            // Rebooting is entered only by asking for a reboot, never from a journal
            assert_ne!(*p, Phase::Rebooting);
        }
        // the phases an engine's commit records are among them
        assert!(FROM_JOURNAL.contains(&Phase::Succeeded));
        assert!(FROM_JOURNAL.contains(&Phase::RebootRequired));
    }

    #[test]
    fn names_are_the_wire_names_in_camel_case() {
        for p in ALL {
            let wire = p
                .as_str_name()
                .trim_start_matches("PHASE_")
                .replace('_', "");
            assert_eq!(name(*p).to_uppercase(), wire);
        }
        assert_eq!(name(Phase::RebootRequired), "RebootRequired");
    }
}
