//! The machine without a node: no I/O, no clock, no state directory (after zincati's
//! `state_machine_happy_path` and friends).

use super::*;

use inplace_wire::phase::ALL;

fn at(seconds: i64) -> pbjson_types::Timestamp {
    pbjson_types::Timestamp { seconds, nanos: 0 }
}

fn intent() -> Arc<Intent> {
    Arc::new(Intent {
        operation: "op-1".into(),
        units: vec!["kubelet.service".into()],
        ..Default::default()
    })
}

/// An operation as `apply` makes it, applied in boot `boot-a`.
fn new_op() -> Op {
    Op::new(pb::Operation {
        id: "op-1".into(),
        message: "1 change(s) to apply".into(),
        boot_id: "boot-a".into(),
        // whatever the wire says, a new operation is Validating
        phase: Phase::Succeeded as i32,
        ..Default::default()
    })
}

/// Enters `next` or fails the test.
fn go(op: &mut Op, t: impl Fn(&OpState) -> Result<Next, IllegalTransition>, message: &str) {
    let next = t(op.state()).unwrap_or_else(|e| panic!("{e}"));
    op.enter(next, message, at(1)).unwrap();
    assert_eq!(op.wire().phase, op.state().phase() as i32);
    assert_eq!(op.wire().message, message);
}

/// An operation at Verifying, its intent carried.
fn verifying() -> Op {
    let mut op = new_op();
    go(&mut op, |s| s.start(), "staging");
    go(&mut op, |s| s.staged(intent()), "committing");
    go(&mut op, |s| s.committed(), "acting");
    go(&mut op, |s| s.acted(), "verifying");
    op
}

/// A state of each phase, with data; `Unspecified` is an unknown phase read back.
fn sample(p: Phase) -> OpState {
    match p {
        Phase::Validating => OpState::Validating,
        Phase::Staging => OpState::Staging,
        Phase::Committing => OpState::Committing { intent: intent() },
        Phase::Acting => OpState::Acting { intent: intent() },
        Phase::Verifying => OpState::Verifying { intent: intent() },
        Phase::RebootRequired => OpState::RebootRequired {
            awaited: "boot-a".into(),
        },
        Phase::Rebooting => OpState::Rebooting {
            awaited: "boot-a".into(),
        },
        Phase::VerifyingAfterBoot => OpState::VerifyingAfterBoot {
            booted: "boot-b".into(),
        },
        Phase::Succeeded => OpState::Succeeded,
        Phase::Failed => OpState::Failed,
        Phase::RolledBack => OpState::RolledBack,
        Phase::AwaitingConfirmation => OpState::AwaitingConfirmation,
        Phase::Unspecified => OpState::Stopped(Phase::Unspecified),
    }
}

/// Every state: one per phase, and every phase read back stopped.
fn states() -> Vec<OpState> {
    ALL.iter()
        .map(|p| sample(*p))
        .chain(ALL.iter().map(|p| OpState::Stopped(*p)))
        .collect()
}

/// Every transition of the engine (not the journal's), applied to `s`, by name.
fn transitions(s: &OpState) -> Vec<(&'static str, Result<Next, IllegalTransition>)> {
    vec![
        ("start", s.start()),
        ("staged", s.staged(intent())),
        ("committed", s.committed()),
        ("acted", s.acted()),
        ("verified", s.verified()),
        ("reboot_required", s.reboot_required("boot-a")),
        ("rebooting", s.rebooting("boot-a")),
        ("booted", s.booted("boot-b")),
        ("boot_verified", s.boot_verified(true)),
        ("boot_not_verified", s.boot_verified(false)),
        ("verified_without_id", s.verified_without_id()),
        ("trial_rolled_back", s.trial_rolled_back()),
        ("superseded", s.superseded()),
        ("failed", s.failed(Phase::Failed)),
        ("rolled_back", s.failed(Phase::RolledBack)),
        ("failed_into_succeeded", s.failed(Phase::Succeeded)),
        ("interrupted", s.interrupted()),
        ("awaiting_confirmation", s.awaiting_confirmation()),
        ("confirmed", s.confirmed()),
        ("expired_reverted", s.expired(true)),
        ("expired_revert_failed", s.expired(false)),
    ]
}

/// A timed try: Verifying → AwaitingConfirmation, then confirmed (Succeeded), or
/// expired (RolledBack when reverted, Failed when the revert failed); read back at
/// start it is left waiting, never interrupted.
#[test]
fn a_timed_try_waits_then_is_confirmed_or_expires() {
    let waiting = |_: ()| {
        let mut op = verifying();
        go(
            &mut op,
            |s| s.awaiting_confirmation(),
            "confirm within 60 s",
        );
        assert_eq!(op.wire().phase, Phase::AwaitingConfirmation as i32);
        op
    };
    let mut op = waiting(());
    assert_eq!(op.state().at_start("boot-b"), AtStart::Leave);
    assert_eq!(OpState::of_wire(op.wire()), OpState::AwaitingConfirmation);
    go(&mut op, |s| s.confirmed(), "confirmed");
    assert_eq!(op.state(), &OpState::Succeeded);
    let mut op = waiting(());
    go(&mut op, |s| s.expired(true), "not confirmed");
    assert_eq!(op.state(), &OpState::RolledBack);
    let mut op = waiting(());
    go(&mut op, |s| s.expired(false), "revert failed");
    assert_eq!(op.state(), &OpState::Failed);
    // only a waiting try is confirmed or expires
    assert!(verifying().state().confirmed().is_err());
    assert!(OpState::Succeeded.expired(true).is_err());
}

#[test]
fn happy_path_to_succeeded() {
    let mut op = new_op();
    assert_eq!(op.state(), &OpState::Validating);
    assert_eq!(op.wire().phase, Phase::Validating as i32);
    go(&mut op, |s| s.start(), "writing the journal");
    assert_eq!(op.state(), &OpState::Staging);
    go(&mut op, |s| s.staged(intent()), "writing 1 file(s)");
    assert_eq!(op.state().intent(), Some(&*intent()));
    go(&mut op, |s| s.committed(), "running commands");
    assert_eq!(op.state().intent(), Some(&*intent()), "carried into Acting");
    go(&mut op, |s| s.acted(), "re-reading the node");
    assert_eq!(
        op.state().intent(),
        Some(&*intent()),
        "carried into Verifying"
    );
    go(&mut op, |s| s.verified(), "1 change(s) applied");
    assert_eq!(op.state(), &OpState::Succeeded);
    assert_eq!(op.state().intent(), None);
    let wire = op.wire();
    assert_eq!(
        (wire.phase, wire.boot_id.as_str(), wire.updated),
        (Phase::Succeeded as i32, "boot-a", Some(at(1)))
    );
    // settled: nothing moves it any more
    for (name, r) in transitions(op.state()) {
        assert!(r.is_err(), "{name} from Succeeded");
    }
    assert!(op.state().stay().is_err());
}

#[test]
fn reboot_required_then_rebooting_then_verified_after_boot() {
    for shows in [true, false] {
        let mut op = verifying();
        go(&mut op, |s| s.reboot_required("boot-a"), "changes staged");
        assert_eq!(
            op.state(),
            &OpState::RebootRequired {
                awaited: "boot-a".into()
            }
        );
        // a start in the same boot leaves it waiting; Reboot asks for the reboot
        assert_eq!(op.state().at_start("boot-a"), AtStart::Leave);
        go(&mut op, |s| s.rebooting("boot-a"), "rebooting");
        // the request failed: back to RebootRequired, awaiting the same boot to change
        go(&mut op, |s| s.reboot_required("ignored"), "request failed");
        assert_eq!(op.wire().boot_id, "boot-a");
        go(&mut op, |s| s.rebooting("boot-a"), "rebooting");
        // the next start is in another boot
        let AtStart::Booted(booted) = op.state().at_start("boot-b") else {
            panic!("{:?}", op.state().at_start("boot-b"));
        };
        go(&mut op, |s| s.booted(&booted), "verifying the boot");
        assert_eq!(op.wire().boot_id, "boot-b", "the boot verified");
        assert_eq!(op.state().at_start("boot-b"), AtStart::Interrupted);
        go(&mut op, |s| s.boot_verified(shows), "verified");
        let end = if shows {
            Phase::Succeeded
        } else {
            Phase::Failed
        };
        assert_eq!(op.state().phase(), end);
        assert_eq!(op.wire().boot_id, "boot-b");
        assert_eq!(op.state().at_start("boot-c"), AtStart::Leave);
    }
}

#[test]
fn the_agent_handles_the_reboot() {
    let mut op = verifying();
    go(&mut op, |s| s.rebooting("boot-a"), "rebooting");
    assert_eq!(op.state().at_start("boot-a"), AtStart::Leave);
    assert_eq!(
        op.state().at_start("boot-b"),
        AtStart::Booted("boot-b".into())
    );
    // a node without a boot id: verified from /proc/cmdline alone, Rebooting only
    assert_eq!(op.state().at_start(""), AtStart::VerifyWithoutId);
    go(&mut op, |s| s.verified_without_id(), "no boot id");
    assert_eq!(op.state(), &OpState::Succeeded);
    let required = sample(Phase::RebootRequired);
    assert_eq!(required.at_start(""), AtStart::Leave);
    assert!(required.verified_without_id().is_err());
}

#[test]
fn a_failure_in_each_phase_ends_failed_or_rolled_back() {
    for p in ALL {
        let s = sample(*p);
        let failed = s.failed(Phase::Failed);
        let rolled_back = s.failed(Phase::RolledBack);
        match p {
            // nothing written yet: only Failed
            Phase::Unspecified | Phase::Validating | Phase::Staging => {
                assert_eq!(failed.unwrap().to, OpState::Failed, "{p:?}");
                assert_eq!(
                    rolled_back.unwrap_err(),
                    IllegalTransition {
                        from: *p,
                        to: Phase::RolledBack
                    }
                );
            }
            Phase::Committing | Phase::Acting | Phase::Verifying => {
                assert_eq!(failed.unwrap().to, OpState::Failed, "{p:?}");
                assert_eq!(rolled_back.unwrap().to, OpState::RolledBack, "{p:?}");
            }
            // the boot is verified: Failed, nothing to roll back
            Phase::VerifyingAfterBoot => {
                assert!(failed.is_ok() && rolled_back.is_err());
            }
            // settled (waiting ones end Failed only when superseded)
            _ => assert!(failed.is_err() && rolled_back.is_err(), "{p:?}"),
        }
        // a failure ends Failed or RolledBack, nothing else
        for end in ALL
            .iter()
            .filter(|e| !matches!(e, Phase::Failed | Phase::RolledBack))
        {
            assert!(s.failed(*end).is_err(), "{p:?} failing into {end:?}");
        }
    }
}

#[test]
fn supersession_only_while_waiting_for_a_reboot() {
    for s in states() {
        let waiting = matches!(
            s,
            OpState::RebootRequired { .. } | OpState::Rebooting { .. }
        );
        assert_eq!(s.superseded().is_ok(), waiting, "{s:?}");
    }
}

#[test]
fn recovery_of_an_interrupted_journal() {
    // the file says Staging (the phase written before the first change): read back
    // without the intent, it can only be settled
    let wire = pb::Operation {
        phase: Phase::Staging as i32,
        ..verifying().into_wire()
    };
    let op = Op::read_back(wire.clone());
    assert_eq!(op.state(), &OpState::Stopped(Phase::Staging));
    assert!(op.state().staged(intent()).is_err());
    assert!(OpState::Stopped(Phase::Committing).committed().is_err());
    assert_eq!(op.state().at_start("boot-a"), AtStart::Interrupted);
    // the journal settles it, whatever the file said, into one of FROM_JOURNAL
    for end in phase::FROM_JOURNAL {
        let mut op = Op::read_back(wire.clone());
        let next = op
            .state()
            .settled_by_journal(*end, &op.wire().boot_id.clone());
        op.enter(next.unwrap(), "settled", at(2)).unwrap();
        assert_eq!(op.state().phase(), *end);
        assert_eq!(op.wire().updated, Some(at(2)));
        if *end == Phase::RebootRequired {
            // rolled forward into RebootRequired: a boot other than the apply's settles it
            assert_eq!(op.state().at_start("boot-a"), AtStart::Leave);
            assert_eq!(
                op.state().at_start("boot-b"),
                AtStart::Booted("boot-b".into())
            );
        }
    }
    for s in states() {
        for end in ALL {
            let r = s.settled_by_journal(*end, "boot-a");
            assert_eq!(
                r.is_ok(),
                phase::FROM_JOURNAL.contains(end),
                "{s:?} {end:?}"
            );
        }
    }
    // without a journal: interrupted
    let mut op = Op::read_back(wire);
    go(&mut op, |s| s.interrupted(), "interrupted: ...");
    assert_eq!(op.state(), &OpState::Failed);
}

#[test]
fn an_operation_read_back_keeps_its_state() {
    let mut op = verifying();
    go(&mut op, |s| s.reboot_required("boot-a"), "staged");
    let back = Op::read_back(op.wire().clone());
    assert_eq!(back.state(), op.state());
    for p in ALL {
        let wire = pb::Operation {
            phase: *p as i32,
            boot_id: "boot-a".into(),
            ..Default::default()
        };
        let s = OpState::of_wire(&wire);
        assert_eq!(s.phase(), *p);
        let carries_data = matches!(p, Phase::Committing | Phase::Acting | Phase::Verifying);
        assert_eq!(
            matches!(s, OpState::Stopped(_)),
            carries_data || matches!(p, Phase::Unspecified | Phase::Validating | Phase::Staging)
        );
    }
    // an unknown phase number reads back as a stopped, unspecified one
    let wire = pb::Operation {
        phase: 99,
        ..Default::default()
    };
    assert_eq!(
        OpState::of_wire(&wire),
        OpState::Stopped(Phase::Unspecified)
    );
}

/// Every (state, transition) pair: an allowed result is in the table (its own phase
/// for `stay`), a refusal names the phase it was asked from; and every transition of
/// the table is made by some function.
#[test]
fn the_functions_and_the_table_agree() {
    for s in states() {
        let from = s.phase();
        for (name, r) in transitions(&s) {
            match r {
                Ok(next) => {
                    assert!(
                        phase::allowed(from, next.to.phase()),
                        "{name}: {s:?} -> {:?} is not in the table",
                        next.to
                    );
                    assert_eq!(next.from, from);
                }
                Err(e) => assert_eq!(e.from, from, "{name}"),
            }
        }
        match s.stay() {
            Ok(next) => {
                assert!(!is_settled(from as i32));
                assert_eq!(next.to, s);
            }
            Err(e) => {
                assert!(is_settled(from as i32));
                assert_eq!((e.from, e.to), (from, from));
            }
        }
        // a stopped operation only settles
        if let OpState::Stopped(_) = s {
            for (name, r) in transitions(&s) {
                if let Ok(n) = r {
                    assert_eq!(n.to, OpState::Failed, "{name} from {s:?}");
                }
            }
        }
    }
    for f in ALL {
        for t in ALL {
            let made = transitions(&sample(*f))
                .into_iter()
                .any(|(_, r)| r.is_ok_and(|n| n.to.phase() == *t));
            assert_eq!(
                made,
                phase::allowed(*f, *t),
                "{f:?} -> {t:?}: the functions and the table disagree"
            );
        }
    }
}

#[test]
fn enter_refuses_a_next_made_from_another_state() {
    let mut op = new_op();
    let stale = op.state().start().unwrap();
    go(&mut op, |s| s.start(), "staging");
    let before = op.wire().clone();
    let e = op.enter(stale, "again", at(9)).unwrap_err();
    assert_eq!(
        e,
        IllegalTransition {
            from: Phase::Staging,
            to: Phase::Staging
        }
    );
    assert_eq!(op.wire(), &before, "nothing changed");
    assert_eq!(
        e.to_string(),
        "Staging -> Staging is not an allowed transition of an operation"
    );
}

#[test]
fn the_wire_form_is_written_from_the_state() {
    let mut op = verifying();
    op.push_action("wrote /etc/x");
    op.push_action("ran update-grub");
    go(&mut op, |s| s.stay(), "a step of a long phase");
    assert_eq!(op.state().phase(), Phase::Verifying);
    go(&mut op, |s| s.rebooting("boot-z"), "rebooting");
    let w = op.wire();
    assert_eq!(
        (w.phase, w.boot_id.as_str(), w.actions.len()),
        (Phase::Rebooting as i32, "boot-z", 2)
    );
    assert_eq!(op.id(), "op-1");
}
