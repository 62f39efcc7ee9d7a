//! Kernel arguments end to end: exact edits on every backend, ownership, next boot
//! vs running, the reboot round trip and limits. The real `inplaced` runs with
//! `--service-manager record`; a reboot is simulated by changing the sysroot's
//! `/proc/cmdline` and boot id and restarting the daemon.

mod common;

use common::*;

/// The change made the default before the reboot (`trial = false`): what these tests
/// check is the edit of the default itself; tests/kernel_args_trial.rs covers trials.
fn direct(node: &Node) {
    std::fs::write(&node.config, "[kernel_args]\ntrial = false\n").unwrap();
}
use inplace_wire::pb;
use inplace_wire::pb::{DisruptionLevel, Phase, RebootPolicy};

fn grub_linux(node: &Node) -> String {
    let t = node.read("/etc/default/grub");
    t.lines()
        .rfind(|l| l.starts_with("GRUB_CMDLINE_LINUX="))
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_value_is_one_edit_removing_old_adding_new() {
    let mut node = Node::new("fedora-41-bls");
    direct(&node);
    node.start();
    apply(&node, "kernelArgs: [hugepages=32]\n", "one").await;
    let r = coverage(&node, "kernelArgs: [hugepages=4]\n").await;
    assert_eq!(r.changes.len(), 1, "{:#?}", r.changes);
    let c = &r.changes[0];
    assert_eq!(c.id, "kernelArgs[hugepages]");
    assert_eq!(c.operation, pb::ChangeOperation::Update as i32);
    assert_eq!(
        (c.before.as_str(), c.after.as_str()),
        ("hugepages=32", "hugepages=4")
    );
    let op = apply(&node, "kernelArgs: [hugepages=4]\n", "two").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    let writes = op
        .actions
        .iter()
        .filter(|a| a.starts_with("wrote /boot/loader/entries/"))
        .count();
    assert_eq!(writes, 2, "one edit per entry: {:?}", op.actions);
    let t = node
        .read("/boot/loader/entries/60427531c86a90c5034f2e849abe07c5-6.15.9-201.fc41.x86_64.conf");
    let options = t.lines().find(|l| l.starts_with("options")).unwrap();
    assert!(
        options.ends_with("transparent_hugepage=madvise hugepages=4"),
        "{options}"
    );
    assert!(!options.contains("hugepages=32"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quoted_value_is_written_read_back_and_removed_exactly() {
    let mut node = Node::new("ubuntu-2404-grub");
    direct(&node);
    let grub_before = node.read("/etc/default/grub");
    node.start();
    let yaml = "kernelArgs:\n- 'dyndbg=\"file drivers/base/firmware_loader/main.c +fmp\"'\n";
    let op = apply(&node, yaml, "dyndbg").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    assert_eq!(
        grub_linux(&node),
        r#"GRUB_CMDLINE_LINUX="intel_iommu=on iommu=pt dyndbg=\"file drivers/base/firmware_loader/main.c +fmp\"""#
    );
    let text = node.read("/etc/default/grub");
    let value = inplace_formats::grub_default::read_var(&text, "GRUB_CMDLINE_LINUX")
        .unwrap()
        .unwrap();
    let args = inplace_formats::cmdline::Cmdline::parse(&value);
    assert_eq!(args.args().len(), 3);
    assert_eq!(
        args.args()[2].value(),
        Some("file drivers/base/firmware_loader/main.c +fmp")
    );
    // nothing left to do but the reboot
    assert_eq!(coverage(&node, yaml).await.changes.len(), 1);
    // it never booted: removing it needs no reboot
    let op = apply(&node, "{}\n", "drop").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(node.read("/etc/default/grub"), grub_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_flag_verified_after_boot_and_never_rebooted_again() {
    let mut node = Node::new("ubuntu-2404-grub");
    direct(&node);
    node.start();
    let op = apply(&node, "kernelArgs: [nosmt]\n", "nosmt").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32);
    // a restart in the same boot is not a reboot
    node.stop();
    node.start();
    assert_eq!(
        node.settle("nosmt").await.phase,
        Phase::RebootRequired as i32
    );
    node.boot_into(
        &format!("{UBUNTU_PROC} nosmt"),
        "33333333-3333-3333-3333-333333333333",
    );
    let op = node.settle("nosmt").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let r = coverage(&node, "kernelArgs: [nosmt]\n").await;
    assert!(r.changes.is_empty() && !r.reboot_required, "{r:#?}");
    assert!(!node.actions().iter().any(|a| a.starts_with("reboot")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_arg_after_boot_fails_naming_it_without_another_reboot() {
    let mut node = Node::new("ubuntu-2404-grub");
    direct(&node);
    node.start();
    let op = apply_with(
        &node,
        "kernelArgs: [nosmt, mitigations=off]\n",
        "agent",
        RebootPolicy::AgentHandles,
    )
    .await;
    assert_eq!(op.phase, Phase::Rebooting as i32, "{op:?}");
    assert_eq!(
        node.actions()
            .iter()
            .filter(|a| a.starts_with("reboot "))
            .count(),
        1
    );
    node.boot_into(
        &format!("{UBUNTU_PROC} nosmt"),
        "44444444-4444-4444-4444-444444444444",
    );
    let op = node.settle("agent").await;
    assert_eq!(op.phase, Phase::Failed as i32, "{op:?}");
    assert!(
        op.message.contains("lacks mitigations=off"),
        "{}",
        op.message
    );
    node.stop();
    node.start();
    assert_eq!(node.settle("agent").await.phase, Phase::Failed as i32);
    assert_eq!(
        node.actions()
            .iter()
            .filter(|a| a.starts_with("reboot "))
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positional_pairs_keep_their_order() {
    let mut node = Node::new("fedora-41-bls");
    direct(&node);
    node.start();
    let yaml = "kernelArgs: [hugepagesz=1G, hugepages=16, hugepagesz=2M, hugepages=512]\n";
    apply(&node, yaml, "pairs").await;
    for f in [
        "/etc/kernel/cmdline",
        "/boot/loader/entries/60427531c86a90c5034f2e849abe07c5-6.14.11-200.fc41.x86_64.conf",
    ] {
        assert!(
            node.read(f).contains("transparent_hugepage=madvise hugepagesz=1G hugepages=16 hugepagesz=2M hugepages=512"),
            "{f}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_keys_only_the_managed_one_goes() {
    // fedora already has console=tty1 console=ttyS0,115200n8; the agent adds a third
    let mut node = Node::new("fedora-41-bls");
    direct(&node);
    let entry = "/boot/loader/entries/60427531c86a90c5034f2e849abe07c5-6.15.9-201.fc41.x86_64.conf";
    let before = node.read(entry);
    node.start();
    apply(&node, "kernelArgs:\n- console=ttyS1,115200n8\n", "add").await;
    assert!(node.read(entry).contains("console=tty1 console=ttyS0,115200n8 systemd.firstboot=off transparent_hugepage=madvise console=ttyS1,115200n8"));
    apply(&node, "{}\n", "drop").await;
    assert_eq!(node.read(entry), before);

    // systemd-boot already has console=tty0 console=ttyS1,115200n8: managing one of them
    // claims nothing, and dropping it removes nothing
    let mut node = Node::new("systemd-boot");
    direct(&node);
    let entry =
        "/boot/efi/loader/entries/382841d297f903a743992847508b8eae-6.12.48+deb13-amd64.conf";
    let before = node.read(entry);
    node.start();
    let r = coverage(&node, "kernelArgs:\n- console=ttyS1,115200n8\n").await;
    assert!(r.changes.is_empty(), "{:#?}", r.changes);
    apply(&node, "kernelArgs:\n- console=ttyS1,115200n8\n", "claim").await;
    apply(&node, "{}\n", "unclaim").await;
    assert_eq!(node.read(entry), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installer_args_are_never_touched_and_absent_removals_are_no_ops() {
    let mut node = Node::new("ubuntu-2404-grub");
    direct(&node);
    let grub = node.read("/etc/default/grub").replace(
        "GRUB_CMDLINE_LINUX=\"intel_iommu=on iommu=pt\"",
        "GRUB_CMDLINE_LINUX=\"intel_iommu=on iommu=pt crashkernel=1G-4G:192M,4G-64G:256M\"",
    );
    std::fs::write(node.path("/etc/default/grub"), grub).unwrap();
    node.start();
    apply(&node, "kernelArgs: [crashkernel=auto, a=1, b=2]\n", "one").await;
    assert_eq!(
        grub_linux(&node),
        "GRUB_CMDLINE_LINUX=\"intel_iommu=on iommu=pt crashkernel=1G-4G:192M,4G-64G:256M crashkernel=auto a=1 b=2\""
    );
    // someone removes two managed args by hand (drift)
    let t = node
        .read("/etc/default/grub")
        .replace(" crashkernel=auto a=1", "");
    std::fs::write(node.path("/etc/default/grub"), t).unwrap();
    let s = status(&node).await;
    assert!(
        s.drift.iter().any(|d| d.id == "kernelArgs"),
        "{:?}",
        s.drift
    );
    let op = apply(&node, "kernelArgs: [c=3]\n", "two").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    assert_eq!(
        grub_linux(&node),
        "GRUB_CMDLINE_LINUX=\"intel_iommu=on iommu=pt crashkernel=1G-4G:192M,4G-64G:256M c=3\""
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grub_d_overrides_are_named_and_edits_go_where_they_take_effect() {
    let mut node = Node::new("ubuntu-2404-grub");
    direct(&node);
    node.start();
    let r = coverage(&node, "kernelArgs: [nosmt]\n").await;
    let c = &r.changes[0];
    assert!(c.covered);
    assert!(
        c.reason.contains("GRUB_CMDLINE_LINUX_DEFAULT of /etc/default/grub is overridden by /etc/default/grub.d/60-hugepages.cfg"),
        "{}",
        c.reason
    );
    assert_eq!(c.targets, vec!["/etc/default/grub".to_string()]);
    node.stop();

    // a grub.d file that reassigns GRUB_CMDLINE_LINUX literally: the edit goes there
    let mut node = Node::new("ubuntu-2404-grub");
    direct(&node);
    std::fs::write(
        node.path("/etc/default/grub.d/70-cmdline.cfg"),
        "GRUB_CMDLINE_LINUX=\"iommu=pt\"\n",
    )
    .unwrap();
    let grub_before = node.read("/etc/default/grub");
    node.start();
    let op = apply(&node, "kernelArgs: [nosmt]\n", "dropin").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    assert_eq!(
        node.read("/etc/default/grub.d/70-cmdline.cfg"),
        "GRUB_CMDLINE_LINUX=\"iommu=pt nosmt\"\n"
    );
    assert_eq!(node.read("/etc/default/grub"), grub_before);
    node.stop();

    // one that appends to itself can not be edited faithfully: not covered, named
    let mut node = Node::new("ubuntu-2404-grub");
    direct(&node);
    std::fs::write(
        node.path("/etc/default/grub.d/70-cmdline.cfg"),
        "GRUB_CMDLINE_LINUX=\"$GRUB_CMDLINE_LINUX nosmt\"\n",
    )
    .unwrap();
    node.start();
    let r = coverage(&node, "kernelArgs: [mitigations=off]\n").await;
    assert!(!r.changes[0].covered);
    assert!(
        r.changes[0]
            .reason
            .starts_with("/etc/default/grub.d/70-cmdline.cfg: line 1"),
        "{}",
        r.changes[0].reason
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rhel8_kernelopts_change_keeps_grubenv_at_1024_bytes() {
    let mut node = Node::new("rhel8-grubenv");
    direct(&node);
    node.start();
    let op = apply(&node, "kernelArgs: [intel_iommu=on]\n", "iommu").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    let env = std::fs::read(node.path("/boot/grub2/grubenv")).unwrap();
    assert_eq!(env.len(), 1024);
    assert!(
        String::from_utf8(env)
            .unwrap()
            .contains("systemd.unified_cgroup_hierarchy=1 intel_iommu=on \n")
    );
    assert!(
        !op.actions
            .iter()
            .any(|a| a.contains("9f729ae13c6cc2d5038fc425ba3fcd7e-4.18.0-553.58.1")),
        "{:?}",
        op.actions
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_and_reboot_policies() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(
        &node.config,
        "[kernel_args]\nmax_length = 220\ntrial = false\n",
    )
    .unwrap();
    node.start();
    let r = coverage(
        &node,
        "kernelArgs: [isolcpus=2-7, nohz_full=2-7, rcu_nocbs=2-7]\n",
    )
    .await;
    assert!(!r.fully_covered);
    let reason = &r.changes[0].reason;
    assert!(reason.contains("would be 232 bytes (191 now, 41 added, 0 removed), over the platform limit of 220 bytes"), "{reason}");

    let e = node
        .client()
        .await
        .apply(pb::ApplyRequest {
            desired: Some(spec("kernelArgs: [nosmt]\n")),
            reboot_policy: RebootPolicy::Forbidden as i32,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("FORBIDDEN"), "{}", e.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpm_ostree_hosts_change_args_through_rpm_ostree_kargs() {
    let mut node = Node::new("fedora-41-bls");
    direct(&node);
    // make it an ostree host: /run/ostree-booted and /boot/loader -> loader.1
    std::fs::create_dir_all(node.path("/run")).unwrap();
    std::fs::write(node.path("/run/ostree-booted"), "").unwrap();
    std::fs::rename(node.path("/boot/loader"), node.path("/boot/loader.1")).unwrap();
    std::os::unix::fs::symlink("loader.1", node.path("/boot/loader")).unwrap();
    node.start();
    let r = coverage(&node, "kernelArgs: [isolcpus=2-7]\n").await;
    assert!(r.fully_covered, "{r:#?}");
    assert!(r.facts.unwrap().kernel_args_backend.starts_with(
        "rpm-ostree: /run/ostree-booted exists; arguments read from /boot/loader.1/entries"
    ));
    let op = apply(&node, "kernelArgs: [isolcpus=2-7]\n", "ostree").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    assert_eq!(
        node.actions(),
        vec!["run rpm-ostree kargs --append-if-missing=isolcpus=2-7".to_string()]
    );
    assert!(
        !op.actions.iter().any(|a| a.starts_with("wrote")),
        "{:?}",
        op.actions
    );
}

/// A removal staged for the next boot survives a later operation in the same boot: the
/// later operation still ends in RebootRequired (reboot only), until a boot without the
/// argument; an argument that comes back from elsewhere after that boot causes no reboot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_removal_is_not_lost_by_a_later_operation() {
    let mut node = Node::new("ubuntu-2404-grub");
    direct(&node);
    node.start();
    let op = apply(&node, "kernelArgs: [nosmt]\n", "add").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32);
    node.boot_into(
        &format!("{UBUNTU_PROC} nosmt"),
        "44444444-4444-4444-4444-444444444444",
    );
    assert_eq!(node.settle("add").await.phase, Phase::Succeeded as i32);

    // remove it: staged, still running
    let op = apply(&node, "{}", "remove").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    assert!(!grub_linux(&node).contains("nosmt"));
    // another operation before the reboot: still a reboot, named
    let later = "sysctls:\n  vm.swappiness: \"10\"\n";
    let r = coverage(&node, later).await;
    let c = r
        .changes
        .iter()
        .find(|c| c.id == "kernelArgs")
        .expect("reboot-only change");
    assert_eq!(c.before, "nosmt", "{c:?}");
    assert!(r.reboot_required, "{r:#?}");
    let op = apply(&node, later, "later").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    assert_eq!(status(&node).await.pending_reboot_operation, "later");

    // after a boot without it: nothing pending; after a boot where it came back from
    // elsewhere (not the agent's doing): still nothing, no reboot loop
    node.boot_into(UBUNTU_PROC, "55555555-5555-5555-5555-555555555555");
    assert_eq!(node.settle("later").await.phase, Phase::Succeeded as i32);
    let r = coverage(&node, later).await;
    assert!(!r.reboot_required && r.changes.is_empty(), "{r:#?}");
    node.boot_into(
        &format!("{UBUNTU_PROC} nosmt"),
        "66666666-6666-6666-6666-666666666666",
    );
    let r = coverage(&node, later).await;
    assert!(!r.reboot_required, "{r:#?}");
}

/// A roll-back after `update-grub` ran runs it again over the restored files: otherwise
/// `grub.cfg` keeps the command line generated from inputs that are no longer there, and
/// the next boot loses what the node booted with before (found by an independent tester
/// with a files item that overrides `GRUB_CMDLINE_LINUX` in `grub.d` beside a kernel
/// argument, a combination now refused before anything is written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roll_back_after_update_grub_regenerates_from_the_restored_files() {
    let mut node = Node::new("ubuntu-2404-grub");
    // the trial boot's one-shot (grub-reboot), after update-grub, fails (a grub.d file of
    // the same spec that reassigns GRUB_CMDLINE_LINUX used to be the trigger; it is now
    // refused up front: tests/plan_overlay.rs)
    node.fail = Some("run grub-reboot".into());
    node.start();
    let before = std::fs::read(node.path("/etc/default/grub")).unwrap();
    let yaml = "files:\n- path: /etc/default/grub.d/99-x.cfg\n  content: \"GRUB_CMDLINE_LINUX_DEFAULT=\\\"quiet\\\"\\n\"\nkernelArgs: [isolcpus=2-7]\n";
    let op = apply(&node, yaml, "override").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{op:?}");
    assert!(
        op.message
            .contains("update-grub, grub-editenv /boot/grub/grubenv unset next_entry ran again over the restored files"),
        "{}",
        op.message
    );
    let runs: Vec<String> = node
        .actions()
        .into_iter()
        .filter(|a| a.contains("update-grub"))
        .collect();
    assert_eq!(
        runs.len(),
        2,
        "once to apply, once over the restored files: {runs:?}"
    );
    assert!(!node.path("/etc/default/grub.d/99-x.cfg").exists());
    assert_eq!(
        std::fs::read(node.path("/etc/default/grub")).unwrap(),
        before
    );
}

/// The same after a crash: killed once `update-grub` ran, the next start rolls the
/// journal back and runs `update-grub` again over the restored `/etc/default/grub`
/// (the intent records the commands).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_update_grub_is_rolled_back_and_regenerated_at_start() {
    let mut node = Node::new("ubuntu-2404-grub");
    direct(&node);
    let before = std::fs::read(node.path("/etc/default/grub")).unwrap();
    node.die_at("act", "kernelArgs: [isolcpus=2-7]\n").await;
    assert_ne!(
        std::fs::read(node.path("/etc/default/grub")).unwrap(),
        before
    );
    node.start();
    let op = node.settle("crash").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{op:?}");
    assert!(
        op.message
            .contains("ran again over the restored files: update-grub"),
        "{}",
        op.message
    );
    assert_eq!(
        std::fs::read(node.path("/etc/default/grub")).unwrap(),
        before
    );
    let runs = node
        .actions()
        .into_iter()
        .filter(|a| a.contains("update-grub"))
        .count();
    assert_eq!(
        runs, 2,
        "once to apply, once at start over the restored file"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_args_on_grub_default_file() {
    let mut node = Node::new("ubuntu-2404-grub");
    direct(&node);
    node.start();
    let yaml = include_str!("../examples/specs/kernel-args.yaml");
    let r = coverage(&node, yaml).await;
    assert!(r.fully_covered, "{r:#?}");
    assert!(r.reboot_required);
    for id in ["kernelArgs[isolcpus]", "kernelArgs[nohz_full]"] {
        let c = change(&r, id);
        assert_eq!(level(&c.disruption), DisruptionLevel::Reboot);
        assert_eq!(c.targets, vec!["/etc/default/grub".to_string()]);
    }
    let op = apply(&node, yaml, "kargs").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    let grub = node.read("/etc/default/grub");
    assert!(
        grub.contains(
            "\nGRUB_CMDLINE_LINUX=\"intel_iommu=on iommu=pt isolcpus=2-7 nohz_full=2-7\"\n"
        ),
        "{grub}"
    );
    assert_eq!(node.actions(), vec!["run update-grub".to_string()]);

    // staged, not running: a reboot and no edit
    let r = coverage(&node, yaml).await;
    assert_eq!(r.changes.len(), 1, "{:#?}", r.changes);
    assert_eq!(r.changes[0].id, "kernelArgs");
    assert!(r.reboot_required);

    // the caller reboots; after boot the agent verifies /proc/cmdline
    let o = node.ctl(&["reboot", "kargs"]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(node.actions().last().unwrap().starts_with("reboot "));
    node.stop();
    let cmdline = node.read("/proc/cmdline");
    std::fs::write(
        node.path("/proc/cmdline"),
        format!("{} isolcpus=2-7 nohz_full=2-7\n", cmdline.trim_end()),
    )
    .unwrap();
    std::fs::write(
        node.path("/proc/sys/kernel/random/boot_id"),
        "22222222-2222-2222-2222-222222222222\n",
    )
    .unwrap();
    node.start();
    let op = node.settle("kargs").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert!(coverage(&node, yaml).await.changes.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_args_on_bls_entries() {
    let mut node = Node::new("fedora-41-bls");
    direct(&node);
    let rescue = "/boot/loader/entries/60427531c86a90c5034f2e849abe07c5-0-rescue.conf";
    let rescue_before = node.read(rescue);
    node.start();
    let yaml = include_str!("../examples/specs/kernel-args.yaml");
    let r = coverage(&node, yaml).await;
    assert!(r.fully_covered, "{r:#?}");
    assert!(
        r.facts
            .unwrap()
            .kernel_args_backend
            .starts_with("bls: 2 kernel entries")
    );
    let op = apply(&node, yaml, "kargs").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    let tail = "systemd.firstboot=off transparent_hugepage=madvise isolcpus=2-7 nohz_full=2-7";
    for e in ["6.14.11-200.fc41.x86_64", "6.15.9-201.fc41.x86_64"] {
        let t = node.read(&format!(
            "/boot/loader/entries/60427531c86a90c5034f2e849abe07c5-{e}.conf"
        ));
        let options = t.lines().find(|l| l.starts_with("options ")).unwrap();
        assert!(options.ends_with(tail), "{options}");
        assert!(t.contains("grub_users $grub_users\ngrub_arg --unrestricted\ngrub_class fedora\n"));
    }
    assert_eq!(node.read(rescue), rescue_before);
    assert!(node.read("/etc/kernel/cmdline").trim_end().ends_with(tail));
    assert!(
        node.read("/etc/default/grub")
            .contains(&format!("{tail}\"\n"))
    );
    assert!(
        node.actions().is_empty(),
        "BLS needs no regeneration: {:?}",
        node.actions()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_args_on_rhel8_kernelopts_and_systemd_boot() {
    // RHEL 8: default entries say `options $kernelopts $tuned_params`; the value lives in
    // grubenv, which must stay exactly 1024 bytes; the older entry has literal options.
    let mut node = Node::new("rhel8-grubenv");
    direct(&node);
    let entries = "/boot/loader/entries/9f729ae13c6cc2d5038fc425ba3fcd7e";
    let new_entry = node.read(&format!("{entries}-4.18.0-553.58.1.el8_10.x86_64.conf"));
    node.start();
    let yaml = "kernelArgs: [hugepages=64]\n";
    let op = apply(&node, yaml, "rhel").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    let env = std::fs::read(node.path("/boot/grub2/grubenv")).unwrap();
    assert_eq!(env.len(), 1024);
    let env = String::from_utf8(env).unwrap();
    assert!(
        env.contains("kernelopts=root=/dev/mapper/rhel-root ro crashkernel=auto rd.lvm.lv=rhel/root rhgb quiet systemd.unified_cgroup_hierarchy=1 hugepages=64 \n"),
        "{env}"
    );
    assert_eq!(
        node.read(&format!("{entries}-4.18.0-553.58.1.el8_10.x86_64.conf")),
        new_entry
    );
    let old = node.read(&format!("{entries}-4.18.0-553.51.1.el8_10.x86_64.conf"));
    let options = old.lines().find(|l| l.starts_with("options")).unwrap();
    assert!(options.ends_with("hugepages=64"), "{options}");
    assert!(options.contains("$tuned_params"), "{options}");
    node.stop();

    // systemd-boot: entries on the ESP, found from the system
    let mut node = Node::new("systemd-boot");
    direct(&node);
    node.start();
    let r = coverage(&node, "kernelArgs: [isolcpus=2-7]\n").await;
    assert!(r.fully_covered, "{r:#?}");
    let backend = r.facts.as_ref().unwrap().kernel_args_backend.clone();
    assert_eq!(backend, "bls: 2 kernel entries in /boot/efi/loader/entries");
    let c = change(&r, "kernelArgs[isolcpus]");
    assert!(
        c.targets.contains(&"/etc/kernel/cmdline".to_string()),
        "{:?}",
        c.targets
    );
    let op = apply(&node, "kernelArgs: [isolcpus=2-7]\n", "sdboot").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    for e in ["6.12.41+deb13-amd64", "6.12.48+deb13-amd64"] {
        let t = node.read(&format!(
            "/boot/efi/loader/entries/382841d297f903a743992847508b8eae-{e}.conf"
        ));
        let options = t.lines().find(|l| l.starts_with("options")).unwrap();
        assert!(options.ends_with(" isolcpus=2-7"), "{options}");
        assert!(
            options.contains("systemd.machine_id=382841d297f903a743992847508b8eae"),
            "{options}"
        );
    }
}

/// GRUB puts `GRUB_CMDLINE_LINUX_DEFAULT` after `GRUB_CMDLINE_LINUX` on normal entries.
/// When the last fragment's `GRUB_CMDLINE_LINUX_DEFAULT` can not be evaluated (a `$(...)`
/// or an unset `$X`), what it adds after the agent's argument is unknown, and may set the
/// same parameter again (last one wins): unknown is not empty, so the change must not be
/// covered (it is covered, with a note that "arguments there are not seen").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unevaluable_grub_cmdline_linux_default_makes_kernel_args_not_covered() {
    for d in [
        "GRUB_CMDLINE_LINUX_DEFAULT=\"$(echo transparent_hugepage=always)\"\n",
        "GRUB_CMDLINE_LINUX_DEFAULT=\"$X\"\n",
    ] {
        let mut node = Node::new("ubuntu-2404-grub");
        direct(&node);
        std::fs::write(node.path("/etc/default/grub.d/60-hugepages.cfg"), d).unwrap();
        node.start();
        let r = coverage(&node, "kernelArgs: [transparent_hugepage=never]\n").await;
        let c = change(&r, "kernelArgs[transparent_hugepage]");
        assert!(!c.covered, "{d}: {c:?}");
    }
}

/// `GRUB_CMDLINE_LINUX_DEFAULT="transparent_hugepage=always"` (known): the agent appends
/// `transparent_hugepage=never` to `GRUB_CMDLINE_LINUX`, which the kernel reads before
/// `GRUB_CMDLINE_LINUX_DEFAULT` on normal entries, so `always` still wins at boot. "A
/// change that would have no effect is not covered" (README), but it is covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_arg_overridden_by_grub_cmdline_linux_default_is_not_covered() {
    let mut node = Node::new("ubuntu-2404-grub");
    direct(&node);
    std::fs::write(
        node.path("/etc/default/grub.d/60-hugepages.cfg"),
        "GRUB_CMDLINE_LINUX_DEFAULT=\"transparent_hugepage=always\"\n",
    )
    .unwrap();
    node.start();
    let r = coverage(&node, "kernelArgs: [transparent_hugepage=never]\n").await;
    let c = change(&r, "kernelArgs[transparent_hugepage]");
    assert!(!c.covered, "{c:?}");
}
