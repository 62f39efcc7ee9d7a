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

/// The undo of a one-shot step leaves the one-shot as it was before the operation: over
/// a pending trial whose one-shot is set, a new trial's undo and a drop's undo set it
/// again; where it was not set, or is not known, they clear it.
#[test]
fn a_one_shot_is_undone_to_what_it_was() {
    use super::effects::{BootCommand, drop_trial_steps, trial_steps};
    use crate::bootloader::{PendingTrial, TrialMeta, TrialPlan};
    use crate::sections::kit::steps::Steps;
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let (set, clear) = (
        v(&["grub-reboot", "inplaced-trial"]),
        v(&["grub-editenv", "/boot/grub/grubenv", "unset", "next_entry"]),
    );
    let pending = |armed| PendingTrial {
        path: "/etc/grub.d/99_inplaced_trial".into(),
        meta: TrialMeta::default(),
        cleanup: vec![v(&["update-grub"]), clear.clone()],
        one_shot_pending: armed,
        set_one_shot: set.clone(),
        fingerprint: "sha256:00".into(),
    };
    let undo_of_last = |steps: &Steps| {
        let last: &BootCommand = steps.effects_of::<BootCommand>().last().unwrap();
        last.undo.clone()
    };
    for (armed, want_drop, want_trial) in [
        (Some(true), &set, &set),
        (Some(false), &clear, &clear),
        (None, &clear, &clear),
    ] {
        let mut steps = Steps::default();
        drop_trial_steps(&mut steps, &pending(armed));
        assert_eq!(undo_of_last(&steps).as_ref(), Some(want_drop), "{armed:?}");
        let mut steps = Steps::default();
        let plan = TrialPlan {
            writes: Vec::new(),
            commands: vec![v(&["update-grub"]), set.clone()],
            clear_one_shot: clear.clone(),
            how: String::new(),
        };
        trial_steps(&mut steps, plan, Some(&pending(armed)));
        assert_eq!(undo_of_last(&steps).as_ref(), Some(want_trial), "{armed:?}");
    }
    // no trial pending before: a new trial's undo clears its one-shot
    let mut steps = Steps::default();
    let plan = TrialPlan {
        writes: Vec::new(),
        commands: vec![set.clone()],
        clear_one_shot: clear.clone(),
        how: String::new(),
    };
    trial_steps(&mut steps, plan, None);
    assert_eq!(undo_of_last(&steps), Some(clear));
}

/// A copy of the fixture node `name` (tests/fixtures/nodes), with `extra` files written
/// over it and `gone` removed.
fn fixture(name: &str, extra: &[(&str, &str)], gone: &[&str]) -> (tempfile::TempDir, Sysroot) {
    fn copy(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                copy(&e.path(), &to.join(e.file_name()));
            } else if t.is_file() {
                std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/nodes")
        .join(name);
    copy(&from, dir.path());
    for (p, c) in extra {
        let full = dir.path().join(p.trim_start_matches('/'));
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(full, c).unwrap();
    }
    for p in gone {
        let full = dir.path().join(p.trim_start_matches('/'));
        if full.is_dir() {
            std::fs::remove_dir_all(full).unwrap();
        } else {
            std::fs::remove_file(full).unwrap();
        }
    }
    let root = Sysroot::open(dir.path()).unwrap();
    (dir, root)
}

/// Every layout the backends read: each source detected lies under the static prefixes
/// an apply without kernel arguments goes by (`observe::needed`), so a file item at a
/// source is never planned without the backend observed.
#[test]
fn every_backends_sources_lie_under_the_static_prefixes() {
    use crate::bootloader::{ENTRY_DIRS, SOURCE_PREFIXES, detect, may_be_source};
    let entry = "title t\nversion 6.1\nlinux /vmlinuz-6.1\noptions root=/dev/sda1 quiet\n";
    let fragment = "GRUB_CMDLINE_LINUX=\"quiet\"\n";
    let nodes: Vec<(tempfile::TempDir, Sysroot)> = vec![
        fixture("ubuntu-2404-grub", &[], &[]),
        // a fragment that assigns the variable is where it is edited
        fixture(
            "ubuntu-2404-grub",
            &[("/etc/default/grub.d/90-cmdline.cfg", fragment)],
            &[],
        ),
        fixture("fedora-41-bls", &[], &[]),
        fixture("rhel8-grubenv", &[], &[]),
        fixture("systemd-boot", &[], &[]),
        // systemd-boot with the ESP on /efi
        fixture(
            "systemd-boot",
            &[("/efi/loader/entries/a-6.1.conf", entry)],
            &["/boot/efi"],
        ),
        // rpm-ostree
        fixture(
            "fedora-41-bls",
            &[
                ("/run/ostree-booted", ""),
                ("/boot/loader/entries/ostree-1.conf", entry),
            ],
            &[],
        ),
    ];
    let mut seen = Vec::new();
    for (dir, root) in &nodes {
        let b = detect(root, BackendChoice::Auto)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.path().display()));
        assert!(!b.sources().is_empty(), "{}", b.reason());
        for s in b.sources() {
            assert!(may_be_source(&s.path), "{}: {}", b.reason(), s.path);
            seen.push(s.path.clone());
        }
    }
    for want in [
        "/etc/default/grub",
        "/etc/default/grub.d/90-cmdline.cfg",
        "/etc/kernel/cmdline",
        "/boot/grub2/grubenv",
        "/efi/loader/entries/a-6.1.conf",
    ] {
        assert!(seen.iter().any(|s| s == want), "{want} not among {seen:?}");
    }
    for d in ENTRY_DIRS {
        assert!(may_be_source(&format!("{d}/x.conf")), "{d}");
    }
    // and nothing else is taken for one
    for p in [
        "/etc/default/kubelet",
        "/etc/kernel",
        "/etc/x",
        "/efx",
        "/bo",
    ] {
        assert!(!may_be_source(p), "{p}");
    }
    assert!(SOURCE_PREFIXES.iter().all(|p| p.starts_with('/')));
}

/// The kernel arguments' side is observed only when the plan can use it: arguments
/// desired or managed, or a file item (desired or recorded) where a source may lie.
#[test]
fn the_backend_is_observed_only_when_the_plan_can_use_it() {
    use super::observe::needed;
    let rec = AppliedRecord::default();
    let files = |p: &str| spec(&format!("files:\n- path: {p}\n  content: x\n"), &[]).unwrap();
    assert!(!needed(&spec("", &[]).unwrap(), &rec));
    assert!(!needed(&files("/etc/x"), &rec));
    assert!(!needed(
        &spec("sysctls:\n  vm.swappiness: \"1\"\n", &[]).unwrap(),
        &rec
    ));
    assert!(needed(&spec("kernelArgs: [nosmt]\n", &[]).unwrap(), &rec));
    for p in [
        "/etc/default/grub",
        "/etc/default/grub.d/90-x.cfg",
        "/etc/kernel/cmdline",
        "/efi/loader/entries/a.conf",
        "/boot/x",
    ] {
        assert!(needed(&files(p), &rec), "{p}");
    }
    let empty = spec("", &[]).unwrap();
    let mut r = AppliedRecord::default();
    r.files.insert(
        "/etc/default/grub.d/90-x.cfg".into(),
        crate::state::ManagedFile {
            sha256: String::new(),
            mode: 0o644,
            uid: 0,
            gid: 0,
            original: crate::state::Original::Absent,
            created_dirs: Vec::new(),
            item: None,
        },
    );
    assert!(needed(&empty, &r), "a recorded file leaving the spec");
    for r in [
        AppliedRecord {
            kernel_args: vec!["nosmt".into()],
            ..Default::default()
        },
        AppliedRecord {
            kernel_args_removed: vec![crate::state::PendingRemoval {
                arg: "nosmt".into(),
                boot_id: "b".into(),
            }],
            ..Default::default()
        },
        AppliedRecord {
            kernel_args_staged_in: "b".into(),
            ..Default::default()
        },
        AppliedRecord {
            kernel_args_trial: Some(crate::state::StagedTrial {
                artefact: crate::bootloader::trial::GRUB_SCRIPT.into(),
            }),
            ..Default::default()
        },
    ] {
        assert!(needed(&empty, &r), "{r:?}");
    }
}

/// Planned from the node: a file item at a BLS node's `/etc/kernel/cmdline` (not under
/// `/boot`) is refused as the kernelArgs section's; one elsewhere is planned without
/// the backend observed, and covered.
#[test]
fn a_file_item_at_a_source_is_refused_without_kernel_arguments() {
    let (_dir, root) = fixture("fedora-41-bls", &[], &[]);
    let state_dir = tempfile::tempdir().unwrap();
    let state = crate::state::StateDir::open(state_dir.path()).unwrap();
    let config = crate::config::Config::default();
    let rec = AppliedRecord::default();
    for (p, refused) in [("/etc/kernel/cmdline", true), ("/etc/x", false)] {
        let desired = spec(&format!("files:\n- path: {p}\n  content: x\n"), &[]).unwrap();
        let obs = crate::plan::observe(&root, &state, &config, &desired, &rec).unwrap();
        assert_eq!(obs.kernel_args.backend.is_ok(), refused, "{p}");
        let plan = crate::plan::plan(&desired, &obs, &rec, &config, Default::default());
        let c = &plan.report.changes[0];
        assert_eq!(c.id, format!("files[{p}]"));
        assert_eq!(!c.covered, refused, "{p}: {c:?}");
        if refused {
            assert!(
                c.reason.contains("managed by the kernelArgs section"),
                "{}",
                c.reason
            );
        }
    }
}
