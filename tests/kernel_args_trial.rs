//! Trial boots of kernel-argument changes (issue 26), per backend, with the real
//! `inplaced` on fixture nodes (`--service-manager record`: commands and reboots are
//! recorded, not run). A boot is simulated by changing the sysroot's `/proc/cmdline` and
//! boot id and restarting the daemon: the trial's command line (the one-shot entry was
//! booted and came up) or the old one (the trial panicked, hung or was rebooted back).

mod common;

use common::*;
use inplace_wire::pb::Phase;

const SCRIPT: &str = "/etc/grub.d/99_inplaced_trial";

fn exists(node: &Node, p: &str) -> bool {
    node.path(p).exists()
}

/// GRUB (Ubuntu 24.04's real generated grub.cfg honours next_entry): the change is staged
/// as a /etc/grub.d script and grub-reboot, /etc/default/grub untouched.
async fn grub_trial_staged(node: &mut Node) -> String {
    node.start();
    let before = node.read("/etc/default/grub");
    let r = coverage(node, "kernelArgs: [inplaced.e2e=1]\n").await;
    let c = &r.changes[0];
    assert!(c.covered, "{c:?}");
    assert!(
        c.reason.contains("trial boot: /etc/grub.d/99_inplaced_trial emits the trial entry inplaced-trial, `grub-reboot inplaced-trial`"),
        "{}",
        c.reason
    );
    let op = apply(node, "kernelArgs: [inplaced.e2e=1]\n", "trial").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    assert_eq!(
        node.read("/etc/default/grub"),
        before,
        "the default is not touched"
    );
    let script = node.read(SCRIPT);
    assert!(script.starts_with("#!/bin/sh\n"), "{script}");
    assert!(
        script.contains("GRUB_CMDLINE_LINUX='intel_iommu=on iommu=pt console=tty1 console=ttyS0 default_hugepagesz=1G hugepagesz=1G hugepages=16 inplaced.e2e=1'")
            || script.contains("inplaced.e2e=1'\n"),
        "{script}"
    );
    assert!(
        script.contains("'panic=10 systemd.watchdog_sec=60'"),
        "{script}"
    );
    let mode = std::fs::metadata(node.path(SCRIPT)).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o755
    );
    let acts = node.actions();
    let ug = acts
        .iter()
        .position(|a| a == "run update-grub")
        .expect("update-grub");
    let gr = acts
        .iter()
        .position(|a| a == "run grub-reboot inplaced-trial")
        .expect("grub-reboot");
    assert!(ug < gr, "{acts:?}");
    before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grub_trial_healthy_boot_commits_the_default() {
    let mut node = Node::new("ubuntu-2404-grub");
    let before = grub_trial_staged(&mut node).await;
    node.boot_into(
        &format!("{UBUNTU_PROC} inplaced.e2e=1 panic=10 systemd.watchdog_sec=60"),
        "22222222-2222-2222-2222-222222222222",
    );
    let op = node.settle("trial").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert!(
        op.message
            .contains("trial boot (boot id 22222222-2222-2222-2222-222222222222) healthy"),
        "{}",
        op.message
    );
    assert!(
        op.message.contains("committed as the default"),
        "{}",
        op.message
    );
    let grub = node.read("/etc/default/grub");
    assert_ne!(grub, before);
    assert!(
        grub.contains("GRUB_CMDLINE_LINUX=\"intel_iommu=on iommu=pt inplaced.e2e=1\""),
        "{grub}"
    );
    assert!(
        !exists(&node, SCRIPT),
        "the trial entry is gone once committed"
    );
    let acts = node.actions();
    assert_eq!(
        acts.iter().filter(|a| *a == "run update-grub").count(),
        2,
        "{acts:?}"
    );
    assert!(
        acts.iter()
            .any(|a| a == "run grub-editenv /boot/grub/grubenv unset next_entry"),
        "{acts:?}"
    );
    // nothing left to do, and no drift
    let r = coverage(&node, "kernelArgs: [inplaced.e2e=1]\n").await;
    assert!(r.changes.is_empty(), "{r:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grub_trial_that_falls_back_rolls_back_with_the_evidence() {
    let mut node = Node::new("ubuntu-2404-grub");
    let before = grub_trial_staged(&mut node).await;
    // the trial panicked (panic=10) and the old default booted: /proc/cmdline is the old one
    node.boot_into(UBUNTU_PROC, "33333333-3333-3333-3333-333333333333");
    let op = node.settle("trial").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{op:?}");
    for want in [
        "the trial of inplaced.e2e=1",
        "boot id 33333333-3333-3333-3333-333333333333",
        &format!("/proc/cmdline: {UBUNTU_PROC})"),
        "fallback: the trial boot never reached the agent: a kernel panic",
        "the trial's command line was: intel_iommu=on iommu=pt inplaced.e2e=1 console=tty1",
        "hugepages=16 panic=10 systemd.watchdog_sec=60;",
        "removed /etc/grub.d/99_inplaced_trial",
        "ran update-grub",
    ] {
        assert!(op.message.contains(want), "{want:?} not in {}", op.message);
    }
    assert_eq!(
        node.read("/etc/default/grub"),
        before,
        "the default never changed"
    );
    assert!(!exists(&node, SCRIPT));
    // the record is as before: the change is still to be made (a new trial)
    let r = coverage(&node, "kernelArgs: [inplaced.e2e=1]\n").await;
    assert_eq!(r.changes.len(), 1, "{r:#?}");
    assert!(
        r.changes[0].reason.contains("trial boot"),
        "{:?}",
        r.changes[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_reset_is_named_as_the_fallback() {
    let mut node = Node::new("ubuntu-2404-grub");
    grub_trial_staged(&mut node).await;
    std::fs::create_dir_all(node.path("/sys/class/watchdog/watchdog0")).unwrap();
    std::fs::write(
        node.path("/sys/class/watchdog/watchdog0/bootstatus"),
        "32\n",
    )
    .unwrap();
    node.boot_into(UBUNTU_PROC, "33333333-3333-3333-3333-333333333334");
    let op = node.settle("trial").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{op:?}");
    assert!(
        op.message
            .contains("fallback: the hardware watchdog reset the hung trial boot"),
        "{}",
        op.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_boot_trial_entry_is_booted_once_with_a_one_shot() {
    let mut node = Node::new("systemd-boot");
    node.start();
    let dir = "/boot/efi/loader/entries";
    let entries = |node: &Node| {
        let mut v: Vec<String> = std::fs::read_dir(node.path(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    let (names, texts): (Vec<String>, Vec<String>) = {
        let n = entries(&node);
        let t = n.iter().map(|f| node.read(&format!("{dir}/{f}"))).collect();
        (n, t)
    };
    let op = apply(&node, "kernelArgs: [inplaced.e2e=1]\n", "sdb").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    for (n, t) in names.iter().zip(&texts) {
        assert_eq!(&node.read(&format!("{dir}/{n}")), t, "{n} untouched");
    }
    let trial = node.read(&format!("{dir}/inplaced-trial.conf"));
    assert!(trial.contains("version 0~inplaced.trial\n"), "{trial}");
    let opts = trial.lines().find(|l| l.starts_with("options ")).unwrap();
    assert!(
        opts.ends_with(" inplaced.e2e=1 panic=10 systemd.watchdog_sec=60"),
        "{opts}"
    );
    assert!(trial.lines().any(|l| l.starts_with("linux ")), "{trial}");
    assert!(
        node.actions()
            .iter()
            .any(|a| a == "run bootctl set-oneshot inplaced-trial.conf"),
        "{:?}",
        node.actions()
    );
    // the old default boots: rolled back, the trial entry removed, the one-shot cleared
    let old = node.read("/proc/cmdline");
    node.boot_into(old.trim(), "55555555-5555-5555-5555-555555555555");
    let op = node.settle("sdb").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{op:?}");
    assert!(!exists(&node, &format!("{dir}/inplaced-trial.conf")));
    assert!(
        node.actions()
            .iter()
            .any(|a| a == "run bootctl set-oneshot "),
        "{:?}",
        node.actions()
    );
    assert_eq!(entries(&node), names);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rhel8_trial_entry_has_its_own_options_and_grubenv_waits_for_the_commit() {
    let mut node = Node::new("rhel8-grubenv");
    node.start();
    let env = std::fs::read(node.path("/boot/grub2/grubenv")).unwrap();
    let op = apply(&node, "kernelArgs: [inplaced.e2e=1]\n", "r8").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    assert_eq!(
        std::fs::read(node.path("/boot/grub2/grubenv")).unwrap(),
        env,
        "kernelopts untouched"
    );
    let trial = node.read("/boot/loader/entries/inplaced-trial.conf");
    let opts = trial.lines().find(|l| l.starts_with("options ")).unwrap();
    assert!(!opts.contains("$kernelopts"), "expanded: {opts}");
    assert!(
        opts.contains("root=") && opts.contains(" inplaced.e2e=1 panic=10 systemd.watchdog_sec=60"),
        "{opts}"
    );
    assert!(
        node.actions()
            .iter()
            .any(|a| a == "run grub2-reboot inplaced-trial"),
        "{:?}",
        node.actions()
    );
    // the trial boots with its command line and the node is healthy: kernelopts edited
    let run = format!(
        "{} inplaced.e2e=1 panic=10 systemd.watchdog_sec=60",
        node.read("/proc/cmdline").trim()
    );
    node.boot_into(&run, "66666666-6666-6666-6666-666666666666");
    let op = node.settle("r8").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let env = std::fs::read(node.path("/boot/grub2/grubenv")).unwrap();
    assert_eq!(env.len(), 1024);
    let kernelopts = String::from_utf8_lossy(&env)
        .lines()
        .find(|l| l.starts_with("kernelopts="))
        .unwrap()
        .to_string();
    assert!(
        kernelopts.trim_end().ends_with(" inplaced.e2e=1"),
        "{kernelopts}"
    );
    assert!(!exists(&node, "/boot/loader/entries/inplaced-trial.conf"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhealthy_trial_boot_reboots_back_and_then_rolls_back() {
    let mut node = Node::new("ubuntu-2404-grub");
    // the kubelet's health endpoint never answers: the trial boot is not healthy in time
    std::fs::write(
        &node.config,
        "[kubelet]\nhealthz_url = \"http://127.0.0.1:1/healthz\"\nhealth_timeout_secs = 1\n",
    )
    .unwrap();
    grub_trial_staged(&mut node).await;
    let reboots = |node: &Node| {
        node.actions()
            .iter()
            .filter(|a| a.starts_with("reboot"))
            .count()
    };
    let before = reboots(&node);
    node.boot_into(
        &format!("{UBUNTU_PROC} inplaced.e2e=1 panic=10 systemd.watchdog_sec=60"),
        "77777777-7777-7777-7777-777777777777",
    );
    let op = node.settle("trial").await;
    assert_eq!(op.phase, Phase::Rebooting as i32, "{op:?}");
    assert!(
        op.message
            .contains("trial boot not healthy within the deadline"),
        "{}",
        op.message
    );
    assert_eq!(
        reboots(&node),
        before + 1,
        "the agent reboots back: {:?}",
        node.actions()
    );
    assert!(
        exists(&node, SCRIPT),
        "nothing is reverted before the old default runs"
    );
    node.boot_into(UBUNTU_PROC, "88888888-8888-8888-8888-888888888888");
    let op = node.settle("trial").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{op:?}");
    assert!(
        op.message.contains("fallback: the agent rebooted back (trial boot not healthy within the deadline (boot id 77777777-7777-7777-7777-777777777777)"),
        "{}",
        op.message
    );
    assert!(!exists(&node, SCRIPT));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bls_with_grub_boots_the_trial_entry_with_grub2_reboot() {
    let mut node = Node::new("fedora-41-bls");
    // GRUB reads the entries (blscfg): its grub.cfg beside them
    std::fs::create_dir_all(node.path("/boot/grub2")).unwrap();
    std::fs::copy(
        fixture("rhel8-grubenv").join("boot/grub2/grub.cfg"),
        node.path("/boot/grub2/grub.cfg"),
    )
    .unwrap();
    node.start();
    let op = apply(&node, "kernelArgs: [inplaced.e2e=1]\n", "f41").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    let acts = node.actions();
    assert!(
        acts.iter().any(|a| a == "run grub2-reboot inplaced-trial"),
        "{acts:?}"
    );
    assert!(
        !acts
            .iter()
            .any(|a| a.starts_with("wrote /boot/loader/entries/6")),
        "{acts:?}"
    );
    let trial = node.read("/boot/loader/entries/inplaced-trial.conf");
    assert!(trial.contains("\nversion 0~inplaced.trial\n"), "{trial}");
    let r = coverage(&node, "kernelArgs: [inplaced.e2e=1]\n").await;
    // the re-plan while the trial is pending: still to be committed, and no drift
    assert!(r.changes.iter().all(|c| c.covered), "{r:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpm_ostree_says_it_is_covered_without_a_trial() {
    let mut node = Node::new("fedora-41-bls");
    std::fs::create_dir_all(node.path("/run")).unwrap();
    std::fs::write(node.path("/run/ostree-booted"), "").unwrap();
    node.start();
    let r = coverage(&node, "kernelArgs: [inplaced.e2e=1]\n").await;
    let c = &r.changes[0];
    assert!(c.covered, "{c:?}");
    assert!(
        c.reason.contains("covered without a trial boot (made the default before the reboot): rpm-ostree has no one-shot boot of a deployment"),
        "{}",
        c.reason
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_trial_no_longer_wanted_is_dropped_before_it_boots() {
    let mut node = Node::new("ubuntu-2404-grub");
    let before = grub_trial_staged(&mut node).await;
    // the same spec again renews it, with nothing else
    let op = apply(&node, "kernelArgs: [inplaced.e2e=1]\n", "again").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    assert!(exists(&node, SCRIPT));
    // the argument dropped before the reboot: the trial entry and the one-shot go, no reboot
    let op = apply(&node, "{}", "drop").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert!(!exists(&node, SCRIPT), "{:?}", op.actions);
    assert!(
        op.actions
            .iter()
            .any(|a| a == "ran grub-editenv /boot/grub/grubenv unset next_entry"),
        "{:?}",
        op.actions
    );
    assert_eq!(node.read("/etc/default/grub"), before);
}
