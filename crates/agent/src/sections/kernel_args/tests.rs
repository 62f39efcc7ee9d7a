//! The `kernelArgs` section: its spec part (arguments the kernel and the boot loader take
//! as written, the spec's list kept as written, drop-ins adding what it lacks) and its
//! planning over a GRUB backend, as a pure function of desired, observed and applied.

use super::KernelArgs;
use super::observe::KernelArgsObs;
use crate::bootloader::NoBackend;
use crate::config::BackendChoice;
use crate::sections::kit::tests::{ids, plan, spec};
use crate::sections::kit::{Boot, Section};
use crate::sections::model::Observed;
use crate::state::AppliedRecord;
use inplace_node::sysroot::Sysroot;
use inplace_wire::pb;
use inplace_wire::pb::{ChangeOperation, DisruptionLevel};

#[test]
fn argument_errors_name_the_field() {
    for (args, field, says) in [
        (
            "[quiet, root=/dev/sda1]",
            "kernelArgs[1]",
            "set by the installer",
        ),
        (
            "[BOOT_IMAGE=/vmlinuz]",
            "kernelArgs[0]",
            "set by the installer",
        ),
        ("[\"a=$x\"]", "kernelArgs[0]", "which GRUB expands"),
        ("[\"a=\\\"b c\"]", "kernelArgs[0]", ""),
        ("[\"a b\"]", "kernelArgs[0]", ""),
    ] {
        let e = spec(&format!("kernelArgs: {args}\n"), &[]).unwrap_err();
        assert_eq!(e.field, field, "{args}: {e}");
        assert!(e.message.contains(says), "{e}");
    }
}

#[test]
fn the_specs_list_is_kept_as_written_and_dropins_add_what_it_lacks() {
    let s = spec(
        "kernelArgs: [a=1, a=1, b]\n",
        &[("x.yaml", "kernelArgs: [b, c=2, a=1]\n")],
    )
    .unwrap();
    assert_eq!(s.kernel_args, ["a=1", "a=1", "b", "c=2"]);
    // order is part of the spec (and of its hash)
    let ab = spec("kernelArgs: [a, b]\n", &[]).unwrap();
    let ba = spec("kernelArgs: [b, a]\n", &[]).unwrap();
    assert_ne!(ab.hash(), ba.hash());
}

/// A node whose boot configuration is `/etc/default/grub` with `GRUB_CMDLINE_LINUX` =
/// `cmdline`, running `running`.
fn grub_node(cmdline: &str, running: &str) -> (tempfile::TempDir, Observed) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("etc/default")).unwrap();
    std::fs::write(
        dir.path().join("etc/default/grub"),
        format!("GRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX=\"{cmdline}\"\n"),
    )
    .unwrap();
    let root = Sysroot::open(dir.path()).unwrap();
    let mut obs = Observed::empty();
    obs.kernel_args = KernelArgsObs {
        backend: crate::bootloader::detect(&root, BackendChoice::Grub),
        proc_cmdline: Ok(running.into()),
        boot_id: Some("boot-1".into()),
    };
    assert!(
        obs.kernel_args.backend.is_ok(),
        "{:?}",
        obs.kernel_args.backend
    );
    (dir, obs)
}

#[test]
fn a_new_argument_is_appended_to_the_boot_configuration_for_the_next_boot() {
    let desired = spec("kernelArgs: [isolcpus=2-3]\n", &[]).unwrap();
    let (_dir, obs) = grub_node("quiet", "BOOT_IMAGE=/vmlinuz quiet");
    let p = plan(&[&KernelArgs], &desired, &obs, &AppliedRecord::default());
    assert_eq!(ids(&p), ["kernelArgs[isolcpus]"]);
    let c = &p.report.changes[0];
    assert!(c.covered, "{}", c.reason);
    assert_eq!(c.operation, ChangeOperation::Create as i32);
    assert_eq!(
        c.disruption.as_ref().unwrap().level,
        DisruptionLevel::Reboot as i32
    );
    let w = p
        .steps
        .writes
        .iter()
        .find(|w| w.path == "/etc/default/grub")
        .unwrap();
    let t = String::from_utf8(w.content.clone()).unwrap();
    assert!(
        t.contains("GRUB_CMDLINE_LINUX=\"quiet isolcpus=2-3\""),
        "{t}"
    );
    assert!(t.contains("GRUB_TIMEOUT=5"), "{t}");
    assert_eq!(p.record.kernel_args, ["isolcpus=2-3"]);
    // the file edit is followed by the regeneration, an effect before the unit actions
    // whose journal entry is the command to run again
    let cmds: Vec<&super::effects::BootCommand> = p.steps.effects_of().collect();
    assert_eq!(cmds.len(), 1);
    assert!(!cmds[0].edits_args);
    assert_eq!(
        p.steps
            .at(&crate::sections::kit::effect::Stage::BeforeUnits)
            .count(),
        1
    );
    // a file edit is verified by the re-plan, the reboot into it after the boot
    assert!(!KernelArgs.verified_after_boot(c, &p.steps));
}

#[test]
fn an_argument_the_node_has_already_is_not_the_agents() {
    let desired = spec("kernelArgs: [quiet]\n", &[]).unwrap();
    let (_dir, obs) = grub_node("quiet", "BOOT_IMAGE=/vmlinuz quiet");
    let p = plan(&[&KernelArgs], &desired, &obs, &AppliedRecord::default());
    assert!(p.report.changes.is_empty(), "{:?}", p.report.changes);
    assert!(p.steps.writes.is_empty());
    assert!(p.record.kernel_args.is_empty());
}

#[test]
fn no_backend_is_not_covered_and_keeps_the_record() {
    let desired = spec("kernelArgs: [isolcpus=2-3]\n", &[]).unwrap();
    let mut obs = Observed::empty();
    obs.kernel_args.backend = Err(NoBackend("no supported boot configuration found".into()));
    let record = AppliedRecord {
        kernel_args: vec!["hugepages=16".into()],
        ..Default::default()
    };
    let p = plan(&[&KernelArgs], &desired, &obs, &record);
    assert_eq!(ids(&p), ["kernelArgs[isolcpus]"]);
    assert!(!p.report.changes[0].covered);
    assert_eq!(
        p.report.changes[0].reason,
        "no supported boot configuration found"
    );
    assert_eq!(p.record.kernel_args, record.kernel_args);
}

#[test]
fn after_the_boot_an_added_argument_must_be_running() {
    let change = pb::Change {
        id: "kernelArgs[isolcpus]".into(),
        before: String::new(),
        after: "isolcpus=2-3".into(),
        ..Default::default()
    };
    let booted = Boot {
        running: "quiet isolcpus=2-3",
        next_boot: "quiet isolcpus=2-3",
    };
    let a = KernelArgs.verify_after_boot(std::slice::from_ref(&change), &booted);
    assert!(a.missing.is_empty() && a.lingering.is_empty(), "{a:?}");
    let not_yet = Boot {
        running: "quiet",
        next_boot: "quiet isolcpus=2-3",
    };
    let a = KernelArgs.verify_after_boot(&[change], &not_yet);
    assert_eq!(a.missing, ["isolcpus=2-3"]);
}

#[test]
fn an_unobserved_node_has_no_backend_and_an_unknown_command_line() {
    let obs = KernelArgsObs::empty();
    assert!(obs.backend.is_err());
    assert_eq!(obs.proc_cmdline.unwrap_err().source, "/proc/cmdline");
}

/// A boot-configuration command reports its rerun before it runs (so a failure half-way
/// still regenerates over the restored inputs), and is journaled as the command.
#[test]
fn a_boot_command_is_rerun_on_undo_and_journaled() {
    use super::effects::BootCommand;
    use crate::sections::kit::effect::{Effect, EffectError, UndoEntry};
    use crate::sections::kit::tests::{Reported, sysroot, with_node};
    use crate::state::EffectEntry;
    let (_dir, root) = sysroot(&[]);
    let cmd = BootCommand {
        argv: vec!["update-grub".into()],
        edits_args: false,
        undo: None,
    };
    let rec = inplace_node::system::Recorder::default();
    assert_eq!(
        with_node(&root, &rec, |n| cmd.journal_entry(n)),
        Some(EffectEntry::Rerun(vec!["update-grub".into()]))
    );
    let mut r = Reported::default();
    with_node(&root, &rec, |n| cmd.apply(n, &mut r)).unwrap();
    assert_eq!(rec.calls(), ["run update-grub"]);
    assert_eq!(r.actions, ["ran update-grub"]);
    assert!(matches!(&r.undo[..], [UndoEntry::Rerun(a)] if a == &cmd.argv));

    let failing = inplace_node::system::Recorder::default().failing(["run".to_string()]);
    let mut r = Reported::default();
    let err = with_node(&root, &failing, |n| cmd.apply(n, &mut r)).unwrap_err();
    assert!(matches!(err, EffectError::RolledBack(_)), "{err:?}");
    assert!(r.actions.is_empty());
    assert!(matches!(&r.undo[..], [UndoEntry::Rerun(_)]));
}
