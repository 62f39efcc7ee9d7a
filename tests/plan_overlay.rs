//! Coverage approves only what the apply can do (issue 27 §3), black box: a spec whose
//! `files` item writes a file that another section's consumer reads (a grub.d fragment, a
//! sysctl.d file, the kubelet's `KUBELET_EXTRA_ARGS` file or `--config-dir` drop-in or a
//! unit drop-in, a chrony `confdir` file, a timesyncd drop-in) is planned against the node
//! as the `files` step leaves it. Where the item overrides the managed value the change is
//! not covered, naming both items, and the apply is refused before anything is written;
//! where it does not, the combination is covered and the apply succeeds (never a
//! "changed since the plan" or a rollback).

mod common;
use common::*;
use inplace_wire::pb::Phase;

const GRUB_D: &str = "/etc/default/grub.d/90-site.cfg";

/// The files item's fragment reassigns `GRUB_CMDLINE_LINUX`: the kernel argument would
/// be edited in `/etc/default/grub` and then replaced by the item's file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grub_d_item_that_reassigns_the_command_line_refuses_the_kernel_args() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let yaml = format!(
        "files:\n- path: {GRUB_D}\n  content: \"GRUB_CMDLINE_LINUX=\\\"quiet\\\"\\n\"\nkernelArgs: [mitigations=off]\n"
    );
    let r = coverage(&node, &yaml).await;
    let k = change(&r, "kernelArgs[mitigations]");
    assert!(!k.covered);
    assert_eq!(
        k.reason,
        format!(
            "{GRUB_D} (written by files[{GRUB_D}] in this spec) assigns GRUB_CMDLINE_LINUX, and grub-mkconfig sources it after /etc/default/grub: it replaces the value the kernel arguments are edited in, so the next boot would not get them; set the arguments under kernelArgs only"
        )
    );
    let (code, msg) = refusal(&node, &yaml).await;
    assert_eq!(code, tonic::Code::FailedPrecondition, "{msg}");
    assert!(msg.contains("kernelArgs[mitigations]"), "{msg}");
    assert!(!node.path(GRUB_D).exists());
    // the item alone: once written, the fragment is where GRUB_CMDLINE_LINUX takes effect,
    // which the kernelArgs section owns; it is not covered (it was applied, then refused
    // by the verifying re-plan and rolled back)
    let alone =
        format!("files:\n- path: {GRUB_D}\n  content: \"GRUB_CMDLINE_LINUX=\\\"quiet\\\"\\n\"\n");
    let r = coverage(&node, &alone).await;
    let f = change(&r, &format!("files[{GRUB_D}]"));
    assert!(!f.covered);
    assert_eq!(
        f.reason,
        format!(
            "{GRUB_D} would assign GRUB_CMDLINE_LINUX after /etc/default/grub, which makes it the file the kernel command line takes effect from, managed by the kernelArgs section; set the arguments under kernelArgs (or assign GRUB_CMDLINE_LINUX_DEFAULT) instead"
        )
    );
    node.stop();
}

/// A `GRUB_CMDLINE_LINUX_DEFAULT` in the item's fragment: another key is covered and
/// applied (the arguments reach the boot configuration), the same key with another
/// value is not covered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grub_d_item_with_the_default_line_blocks_only_its_own_keys() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let item = |v: &str| {
        format!(
            "files:\n- path: {GRUB_D}\n  content: \"GRUB_CMDLINE_LINUX_DEFAULT=\\\"{v}\\\"\\n\"\nkernelArgs: [mitigations=off]\n"
        )
    };
    let r = coverage(&node, &item("quiet mitigations=auto")).await;
    let k = change(&r, "kernelArgs[mitigations]");
    assert!(!k.covered);
    assert_eq!(
        k.reason,
        format!(
            "{GRUB_D} (written by files[{GRUB_D}] in this spec) sets mitigations=auto in GRUB_CMDLINE_LINUX_DEFAULT, which grub-mkconfig places after GRUB_CMDLINE_LINUX on the kernel command line at the next boot, so it would win over the managed mitigations; drop mitigations from one of the two items"
        )
    );
    let yaml = item("quiet splash");
    let r = coverage(&node, &yaml).await;
    let k = change(&r, "kernelArgs[mitigations]");
    assert!(k.covered, "{}", k.reason);
    let op = apply(&node, &yaml, "grub-d-default").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    // staged as a trial boot: the trial entry carries the argument
    assert!(
        node.read("/etc/grub.d/99_inplaced_trial")
            .contains("mitigations=off")
    );
    assert!(node.read(GRUB_D).contains("quiet splash"));
    node.stop();
}

/// sysctl.d: the item's file sorts after the agent's drop-in and sets the key: not
/// covered naming both; one that sorts before it is covered, applied, and the managed
/// value is live and persists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sysctl_d_item_that_wins_at_boot_refuses_the_key() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let yaml = |name: &str| {
        format!(
            "files:\n- path: /etc/sysctl.d/{name}\n  content: \"vm.swappiness = 10\\n\"\nsysctls:\n  vm.swappiness: \"20\"\n"
        )
    };
    let r = coverage(&node, &yaml("99-zzz-site.conf")).await;
    let s = change(&r, "sysctls[vm.swappiness]");
    assert!(!s.covered);
    assert_eq!(
        s.reason,
        "/etc/sysctl.d/99-zzz-site.conf (written by files[/etc/sysctl.d/99-zzz-site.conf] in this spec) sets vm.swappiness = 10 and is applied after /etc/sysctl.d/99-zz-inplaced.conf at boot, so the value would not persist: keep vm.swappiness in one of the two items"
    );
    let (code, _) = refusal(&node, &yaml("99-zzz-site.conf")).await;
    assert_eq!(code, tonic::Code::FailedPrecondition);
    let early = yaml("10-site.conf");
    assert!(change(&coverage(&node, &early).await, "sysctls[vm.swappiness]").covered);
    let op = apply(&node, &early, "sysctl-early").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(node.read("/proc/sys/vm/swappiness").trim(), "20");
    node.stop();
}

/// The kubelet's `KUBELET_EXTRA_ARGS` file written by the same spec: its flag wins over
/// kubeadm-flags.env, so the managed flag is not covered, naming the item and the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_extra_args_item_refuses_the_flag_it_overrides() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let yaml = "files:\n- path: /etc/default/kubelet\n  content: \"# site\\nKUBELET_EXTRA_ARGS=\\\"--max-pods=300\\\"\\n\"\nkubelet:\n  flags:\n    max-pods: \"250\"\n";
    let r = coverage(&node, yaml).await;
    let f = change(&r, "kubelet.flags[max-pods]");
    assert!(!f.covered);
    assert_eq!(
        f.reason,
        "--max-pods=300 in /etc/default/kubelet (written by files[/etc/default/kubelet] in this spec) (KUBELET_EXTRA_ARGS) at line 2 comes later on the kubelet command line and overrides kubeadm-flags.env; change or remove it there"
    );
    // the same flag value: nothing overrides it, covered and applied
    let same = yaml.replace("--max-pods=300", "--max-pods=250");
    let op = apply(&node, &same, "extra-same").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert!(
        node.read("/var/lib/kubelet/kubeadm-flags.env")
            .contains("--max-pods=250")
    );
    node.stop();
}

/// A `--config-dir` drop-in and a unit drop-in written by the same spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_drop_in_items_refuse_what_they_override() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(
        node.path("/etc/default/kubelet"),
        "KUBELET_EXTRA_ARGS=--config-dir=/etc/kubernetes/kubelet.conf.d\n",
    )
    .unwrap();
    node.start();
    let dropin = "/etc/kubernetes/kubelet.conf.d/50-site.conf";
    let yaml = format!(
        "files:\n- path: {dropin}\n  content: \"apiVersion: kubelet.config.k8s.io/v1beta1\\nkind: KubeletConfiguration\\nimageGCHighThresholdPercent: 90\\n\"\nkubelet:\n  config:\n    imageGCHighThresholdPercent: 85\n    clusterDomain: edge.local\n"
    );
    let r = coverage(&node, &yaml).await;
    let gc = change(&r, "kubelet.config.imageGCHighThresholdPercent");
    assert!(!gc.covered);
    assert_eq!(
        gc.reason,
        format!(
            "KubeletConfiguration drop-in {dropin} (written by files[{dropin}] in this spec) (kubelet --config-dir) sets imageGCHighThresholdPercent, and the kubelet merges its drop-ins over /var/lib/kubelet/config.yaml (a later drop-in wins): the value stays {dropin}'s; change it there"
        )
    );
    assert!(change(&r, "kubelet.config.clusterDomain").covered);
    let unit = "/etc/systemd/system/kubelet.service.d/20-local.conf";
    let yaml = format!(
        "files:\n- path: {unit}\n  content: \"[Service]\\nExecStart=\\nExecStart=/usr/bin/kubelet $KUBELET_KUBEADM_ARGS --node-ip=192.0.2.9\\n\"\nkubelet:\n  flags:\n    node-ip: 192.0.2.5\n"
    );
    let r = coverage(&node, &yaml).await;
    let ip = change(&r, "kubelet.flags[node-ip]");
    assert!(!ip.covered);
    assert_eq!(
        ip.reason,
        format!(
            "--node-ip=192.0.2.9 in the effective ExecStart of {unit} (written by files[{unit}] in this spec) comes after $KUBELET_KUBEADM_ARGS on the kubelet command line and overrides kubeadm-flags.env; change or remove it there"
        )
    );
    node.stop();
}

const NTP: &str = "ntp:\n  servers: [ntp1.example.invalid, ntp2.example.invalid]\n";

/// chrony: a `confdir` file written by the same spec with a pool; timesyncd: a drop-in
/// with `NTP=` written by the same spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_daemon_items_that_add_sources_refuse_ntp() {
    let mut node = Node::new("rhel8-grubenv");
    let conf = node.read("/etc/chrony.conf");
    std::fs::write(
        node.path("/etc/chrony.conf"),
        format!("{conf}confdir /etc/chrony/conf.d\n"),
    )
    .unwrap();
    node.start();
    let f = "/etc/chrony/conf.d/10-site.conf";
    let r = coverage(
        &node,
        &format!("files:\n- path: {f}\n  content: \"pool site.example.invalid iburst\\n\"\n{NTP}"),
    )
    .await;
    let c = change(&r, "ntp");
    assert!(!c.covered);
    assert_eq!(
        c.reason,
        format!(
            "{f} (written by files[{f}] in this spec) (chrony `confdir` in /etc/chrony.conf) adds time sources site.example.invalid: chrony uses them alongside the managed servers, so they would stay; remove them there, or manage the file under files"
        )
    );
    // an item with no source there: covered
    let r = coverage(
        &node,
        &format!("files:\n- path: {f}\n  content: \"makestep 1 3\\n\"\n{NTP}"),
    )
    .await;
    assert!(change(&r, "ntp").covered, "{}", change(&r, "ntp").reason);
    node.stop();

    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(node.path("/usr/lib/systemd/systemd-timesyncd"), "").unwrap();
    node.start();
    let d = "/etc/systemd/timesyncd.conf.d/50-site.conf";
    let r = coverage(
        &node,
        &format!("files:\n- path: {d}\n  content: \"[Time]\\nNTP=site.example.invalid\\n\"\n{NTP}"),
    )
    .await;
    let c = change(&r, "ntp");
    assert!(!c.covered);
    assert_eq!(
        c.reason,
        format!(
            "{d} (written by files[{d}] in this spec) sets NTP=site.example.invalid: systemd-timesyncd adds the NTP= lists of its files, so these servers would stay alongside the managed ones in /etc/systemd/timesyncd.conf.d/inplaced-ntp.conf; remove them there"
        )
    );
    node.stop();
}

/// A node symlink in sysctl.d that sorts after the agent's drop-in points at a file the
/// spec's own `files` item writes: systemd-sysctl reads the target, so the sysctl is not
/// covered, naming the link and the item (found by the session-7 break-it tester: it was
/// covered, then the apply rolled back as "still different after the commit").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sysctl_d_symlink_to_a_file_the_spec_writes_is_named() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::create_dir_all(node.path("/etc/site")).unwrap();
    std::fs::write(node.path("/etc/site/sysctl.conf"), "# site\n").unwrap();
    std::os::unix::fs::symlink(
        "/etc/site/sysctl.conf",
        node.path("/etc/sysctl.d/99-zzz-site.conf"),
    )
    .unwrap();
    node.start();
    let y = "files:\n- path: /etc/site/sysctl.conf\n  content: \"vm.swappiness = 10\\n\"\nsysctls:\n  vm.swappiness: \"20\"\n";
    let r = coverage(&node, y).await;
    let c = change(&r, "sysctls[vm.swappiness]");
    assert!(
        !c.covered,
        "covered, though the link's target is written with 10"
    );
    assert!(
        c.reason.starts_with(
            "/etc/sysctl.d/99-zzz-site.conf (written by files[/etc/site/sysctl.conf] in this spec) sets vm.swappiness = 10"
        ),
        "{}",
        c.reason
    );
    // without the item the link's target sets nothing: covered
    let r = coverage(&node, "sysctls:\n  vm.swappiness: \"20\"\n").await;
    assert!(change(&r, "sysctls[vm.swappiness]").covered);
}

/// The same through a symlinked directory: `/run/sysctl.d` is a link to a directory
/// whose file the spec's own `files` item writes. The file's name is no link, its
/// directory is: the resolution still finds the item's path (issue 28 checks for a link
/// with one `stat` first, which must see the directory's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sysctl_d_file_under_a_symlinked_directory_the_spec_writes_is_named() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::create_dir_all(node.path("/etc/site.d")).unwrap();
    std::fs::write(node.path("/etc/site.d/99-zzz-site.conf"), "# site\n").unwrap();
    std::fs::create_dir_all(node.path("/run")).unwrap();
    std::os::unix::fs::symlink("/etc/site.d", node.path("/run/sysctl.d")).unwrap();
    node.start();
    let y = "files:\n- path: /etc/site.d/99-zzz-site.conf\n  content: \"vm.swappiness = 10\\n\"\nsysctls:\n  vm.swappiness: \"20\"\n";
    let r = coverage(&node, y).await;
    let c = change(&r, "sysctls[vm.swappiness]");
    assert!(
        !c.covered,
        "covered, though the file under the linked directory is written with 10"
    );
    assert!(
        c.reason.starts_with(
            "/run/sysctl.d/99-zzz-site.conf (written by files[/etc/site.d/99-zzz-site.conf] in this spec) sets vm.swappiness = 10"
        ),
        "{}",
        c.reason
    );
    let r = coverage(&node, "sysctls:\n  vm.swappiness: \"20\"\n").await;
    assert!(change(&r, "sysctls[vm.swappiness]").covered);
}
