//! The reboot method (`reboot_method` in the agent config, `ApplyRequest.reboot_method`),
//! black box with the recording reboot seam: what is asked of the host (a full reboot,
//! or `kexec -s -l` of the installed kernel with the new command line and `systemctl
//! kexec`), `auto`'s fallback where the kernel does not permit kexec, and the report on
//! the operation (method, reason, boot ids, the time from the request to the agent's
//! start in the new boot).

mod common;
use common::*;
use inplace_wire::pb;
use inplace_wire::pb::{Phase, RebootMethod, RebootPolicy};

const RELEASE: &str = "6.8.0-90-generic";

/// Writes a node file, creating its directories.
fn put(node: &Node, path: &str, text: &str) {
    let p = node.path(path);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// The Ubuntu fixture with what kexec needs: the running kernel's release and its
/// installed image and initrd, kexec-tools, kexec permitted and no lockdown; the agent
/// config's `reboot_method` set to `method`.
fn kexec_node(method: &str) -> Node {
    let node = Node::new("ubuntu-2404-grub");
    put(&node, "/proc/sys/kernel/osrelease", &format!("{RELEASE}\n"));
    put(&node, &format!("/boot/vmlinuz-{RELEASE}"), "kernel image\n");
    put(&node, &format!("/boot/initrd.img-{RELEASE}"), "initrd\n");
    put(&node, "/usr/sbin/kexec", "kexec-tools\n");
    put(&node, "/proc/sys/kernel/kexec_load_disabled", "0\n");
    put(
        &node,
        "/sys/kernel/security/lockdown",
        "[none] integrity confidentiality\n",
    );
    put(&node, "/proc/uptime", "1000.00 900.00\n");
    std::fs::write(&node.config, format!("reboot_method = \"{method}\"\n")).unwrap();
    node
}

/// Applies `kernelArgs: [isolcpus=2-3]` as `id` with the agent rebooting by itself and
/// the request's `method`; returns the operation once it settled (Rebooting, or back in
/// RebootRequired when the request failed).
async fn apply_reboot(node: &Node, id: &str, method: RebootMethod) -> pb::Operation {
    node.client()
        .await
        .apply(pb::ApplyRequest {
            desired: Some(spec("kernelArgs: [isolcpus=2-3]\n")),
            operation_id: id.into(),
            reboot_policy: RebootPolicy::AgentHandles as i32,
            reboot_method: method as i32,
            ..Default::default()
        })
        .await
        .unwrap();
    // Rebooting is published before the request is made: wait for the request, or for
    // its failure (back in RebootRequired)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let op = node.settle(id).await;
        let asked = reboots(node)
            .iter()
            .any(|a| a.starts_with("kexec inplaced") || a.starts_with("reboot "));
        if op.phase != Phase::Rebooting as i32 || asked {
            return node.settle(id).await;
        }
        assert!(std::time::Instant::now() < deadline, "{op:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The reboot requests recorded (`kexec-load`, `kexec`, `reboot`), not the other
/// actions (`run update-grub`).
fn reboots(node: &Node) -> Vec<String> {
    node.actions()
        .into_iter()
        .filter(|a| a.starts_with("kexec") || a.starts_with("reboot "))
        .collect()
}

/// Waits until a reboot (full or kexec) was requested; the reboot requests.
async fn requested(node: &Node) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let r = reboots(node);
        if r.iter()
            .any(|a| a.starts_with("kexec inplaced") || a.starts_with("reboot "))
        {
            return r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no reboot requested: {r:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Simulates the boot the reboot asked for: the new command line, a new boot id, a
/// young kernel (`uptime` seconds), then the agent's start in it.
fn boot_into(node: &mut Node, cmdline: &str, uptime: &str) {
    node.stop();
    put(node, "/proc/cmdline", &format!("{cmdline}\n"));
    put(
        node,
        "/proc/sys/kernel/random/boot_id",
        "22222222-2222-2222-2222-222222222222\n",
    );
    put(node, "/proc/uptime", &format!("{uptime} 1.00\n"));
    node.start();
}

/// `auto` on a node that permits kexec: the installed kernel and its initrd are loaded
/// with the running command line plus the new argument, `systemctl kexec` is asked for
/// (never a full reboot), the report says so before the boot; after the boot the
/// operation is verified and the report has the boot ids and the times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_kexecs_into_the_new_command_line_and_reports_the_time() {
    let mut node = kexec_node("auto");
    node.start();
    let op = apply_reboot(&node, "k1", RebootMethod::Unspecified).await;
    assert_eq!(op.phase, Phase::Rebooting as i32, "{}", op.message);
    assert_eq!(op.reboot_method, RebootMethod::Auto as i32);
    let want = format!("{UBUNTU_PROC} isolcpus=2-3");
    let loaded = format!(
        "kexec-load -s -l /boot/vmlinuz-{RELEASE} --initrd=/boot/initrd.img-{RELEASE} --command-line={want}"
    );
    let acts = reboots(&node);
    assert!(acts.contains(&loaded), "{acts:?}");
    assert!(
        acts.contains(&"kexec inplaced operation k1".to_string()),
        "{acts:?}"
    );
    assert!(!acts.iter().any(|a| a.starts_with("reboot ")), "{acts:?}");
    let r = op.reboot.clone().expect("the reboot report");
    assert_eq!(r.method, RebootMethod::Kexec as i32);
    assert_eq!(r.reason, "reboot_method auto: the kernel permits kexec");
    assert_eq!(r.command_line, want);
    assert_eq!(r.kernel, format!("/boot/vmlinuz-{RELEASE}"));
    assert_eq!(r.from_boot_id, "11111111-1111-1111-1111-111111111111");
    assert!(r.requested.is_some() && r.to_boot_id.is_empty() && r.seconds == 0.0);

    let t = std::time::Instant::now();
    boot_into(&mut node, &r.command_line, "3.50");
    let op = node.settle("k1").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    let r = op.reboot.expect("the reboot report");
    assert_eq!(r.to_boot_id, "22222222-2222-2222-2222-222222222222");
    // from the request to the agent's start: at least the simulated downtime, less
    // than the whole test
    assert!(r.seconds > 0.0 && r.seconds < 60.0, "{}", r.seconds);
    assert!(r.seconds < t.elapsed().as_secs_f64() + 60.0);
    // the kernel's age at the agent's start: /proc/uptime less the agent's own age
    assert!(
        r.kernel_uptime_seconds > 2.0 && r.kernel_uptime_seconds <= 3.5,
        "{}",
        r.kernel_uptime_seconds
    );
    let shown = node.ctl(&["get", "k1"]);
    let text = out(&shown);
    assert!(
        text.contains("reboot:          kexec (reboot_method auto"),
        "{text}"
    );
    assert!(text.contains("reboot time:"), "{text}");
}

/// `auto` falls back to a full reboot, with the reason, where the kernel does not permit
/// kexec (each way the node can say so), and when the load fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_falls_back_to_a_full_reboot_with_the_reason() {
    let cases: [(&str, &str, &str); 5] = [
        (
            "/proc/sys/kernel/kexec_load_disabled",
            "1\n",
            "/proc/sys/kernel/kexec_load_disabled is 1",
        ),
        (
            "/sys/kernel/security/lockdown",
            "none [integrity] confidentiality\n",
            "kernel lockdown is integrity",
        ),
        (
            "/boot/vmlinuz-6.8.0-90-generic",
            "",
            "no installed kernel image /boot/vmlinuz-6.8.0-90-generic",
        ),
        ("/usr/sbin/kexec", "", "kexec-tools is not installed"),
        ("", "", "the kexec load failed"),
    ];
    for (path, text, why) in cases {
        let mut node = kexec_node("auto");
        if path.is_empty() {
            node.fail = Some("kexec-load".into());
        } else if text.is_empty() {
            std::fs::remove_file(node.path(path)).unwrap();
        } else {
            put(&node, path, text);
        }
        node.start();
        let op = apply_reboot(&node, "a1", RebootMethod::Unspecified).await;
        assert_eq!(op.phase, Phase::Rebooting as i32, "{why}: {}", op.message);
        let r = op.reboot.expect("the reboot report");
        assert_eq!(r.method, RebootMethod::Full as i32, "{why}");
        assert!(
            r.reason.starts_with("reboot_method auto: ") && r.reason.contains(why),
            "{why}: {}",
            r.reason
        );
        let acts = reboots(&node);
        assert!(
            acts.contains(&"reboot inplaced operation a1".to_string()),
            "{why}: {acts:?}"
        );
        assert!(!acts.iter().any(|a| a.starts_with("kexec ")), "{acts:?}");
    }
}

/// `kexec` asked where the kernel does not permit it: the reboot is not requested at all
/// (no silent full reboot); the operation waits in RebootRequired saying why, and the
/// caller's Reboot gets the same reason. `full` (the default) never loads a kernel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kexec_where_it_is_not_permitted_fails_the_request_and_full_never_kexecs() {
    let mut node = kexec_node("kexec");
    put(&node, "/proc/sys/kernel/kexec_load_disabled", "1\n");
    node.start();
    let op = apply_reboot(&node, "x1", RebootMethod::Unspecified).await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{}", op.message);
    assert!(
        op.message
            .contains("reboot_method kexec, but /proc/sys/kernel/kexec_load_disabled is 1"),
        "{}",
        op.message
    );
    assert!(reboots(&node).is_empty(), "{:?}", node.actions());
    let e = node
        .client()
        .await
        .reboot(pb::RebootRequest {
            operation_id: "x1".into(),
        })
        .await
        .unwrap_err();
    assert!(
        e.message().contains("kexec_load_disabled is 1"),
        "{}",
        e.message()
    );
    assert!(reboots(&node).is_empty(), "{:?}", node.actions());
    node.stop();

    // the default config: full
    let mut node = kexec_node("auto");
    std::fs::write(&node.config, "").unwrap();
    node.start();
    let op = apply_reboot(&node, "f1", RebootMethod::Unspecified).await;
    assert_eq!(op.reboot_method, RebootMethod::Full as i32);
    let r = op.reboot.expect("the reboot report");
    assert_eq!(
        (r.method, r.reason.as_str()),
        (RebootMethod::Full as i32, "reboot_method full")
    );
    assert_eq!(reboots(&node), ["reboot inplaced operation f1"]);
}

/// The request's method wins over the config's, for the caller's Reboot too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_requests_method_wins_over_the_config() {
    let mut node = kexec_node("full");
    node.start();
    node.client()
        .await
        .apply(pb::ApplyRequest {
            desired: Some(spec("kernelArgs: [isolcpus=2-3]\n")),
            operation_id: "c1".into(),
            reboot_policy: RebootPolicy::CallerHandles as i32,
            reboot_method: RebootMethod::Kexec as i32,
            ..Default::default()
        })
        .await
        .unwrap();
    let op = node.settle("c1").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{}", op.message);
    let o = node.ctl(&["reboot", "c1"]);
    assert!(o.status.success(), "{}", err(&o));
    let acts = requested(&node).await;
    assert_eq!(acts.len(), 2, "{acts:?}");
    assert!(
        acts[0].starts_with("kexec-load -s -l /boot/vmlinuz-"),
        "{acts:?}"
    );
    assert_eq!(acts[1], "kexec inplaced operation c1");
    let op = node.settle("c1").await;
    assert_eq!(op.reboot.unwrap().reason, "reboot_method kexec");
    // and inplacectl sends its flag
    let mut node = kexec_node("full");
    node.start();
    let f = node.spec("k.yaml", "kernelArgs: [isolcpus=2-3]\n");
    let o = node.ctl(&[
        "apply",
        "-f",
        &f,
        "--id",
        "c2",
        "--reboot-policy",
        "agent",
        "--reboot-method",
        "auto",
    ]);
    assert!(o.status.success(), "{}", err(&o));
    let op = node.settle("c2").await;
    assert_eq!(op.reboot_method, RebootMethod::Auto as i32);
    assert!(
        requested(&node)
            .await
            .iter()
            .any(|a| a == "kexec inplaced operation c2")
    );
}
