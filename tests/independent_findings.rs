//! Faults an independent tester found in the pool, the request budget, the drop-in and
//! flags reverts, symlinked sysctl.d paths and `GRUB_CMDLINE_LINUX_DEFAULT` (each test
//! asserts the right behaviour and failed on the commit it was written against, `e24052d`).

mod common;

use common::*;
use inplace_wire::pb::Phase;

const DROP_IN: &str = "/etc/sysctl.d/99-zz-inplaced.conf";

/// An admin's drop-in that sets the same key twice (systemd-sysctl applies the last): the
/// agent rewrites both lines, and the drop must give each line its own old value text back,
/// not the value of one of them on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysctl_drop_in_duplicate_key_lines_each_get_their_own_value_back() {
    for original in [
        "vm.swappiness = 10\nvm.swappiness = 20\n",
        "vm/swappiness = 10\nvm.swappiness = 20\n",
    ] {
        let mut node = Node::new("fedora-41-bls");
        std::fs::write(node.path(DROP_IN), original).unwrap();
        std::fs::create_dir_all(node.path("/proc/sys/vm")).unwrap();
        std::fs::write(node.path("/proc/sys/vm/swappiness"), "20\n").unwrap();
        node.start();
        let op = apply(&node, "sysctls:\n  vm.swappiness: \"1\"\n", "one").await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
        let op = apply(&node, "{}\n", "drop").await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
        assert_eq!(
            node.read(DROP_IN),
            original,
            "the admin's lines, byte for byte"
        );
        assert_eq!(node.read("/proc/sys/vm/swappiness"), "20\n");
    }
}

/// The spec names the key first dotted, then slashed (the same /proc/sys path): the
/// admin's old value text must survive the rename and come back on the drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysctl_drop_in_prior_survives_the_key_changing_its_spelling() {
    let mut node = Node::new("fedora-41-bls");
    let original = "# admin\nvm.swappiness = 10\n";
    std::fs::write(node.path(DROP_IN), original).unwrap();
    std::fs::create_dir_all(node.path("/proc/sys/vm")).unwrap();
    std::fs::write(node.path("/proc/sys/vm/swappiness"), "10\n").unwrap();
    node.start();
    let op = apply(&node, "sysctls:\n  vm.swappiness: \"1\"\n", "one").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let op = apply(&node, "sysctls:\n  vm/swappiness: \"5\"\n", "two").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let op = apply(&node, "{}\n", "drop").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert_eq!(node.read(DROP_IN), original);
    assert_eq!(node.read("/proc/sys/vm/swappiness"), "10\n");
}

/// A node without kubeadm-flags.env at all: the agent creates it for a flag; dropping the
/// flag must leave no file (the original state), not an empty one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_env_the_agent_created_is_gone_after_the_drop() {
    let mut node = Node::new("ubuntu-2404-grub");
    let p = "/var/lib/kubelet/kubeadm-flags.env";
    std::fs::remove_file(node.path(p)).unwrap();
    node.start();
    let yaml = "kubelet:\n  flags:\n    max-pods: \"250\"\n";
    let op = apply(&node, yaml, "one").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert!(node.read(p).contains("--max-pods=250"));
    let op = apply(&node, "{}\n", "drop").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert!(
        !node.path(p).exists(),
        "left behind: {:?}",
        std::fs::read_to_string(node.path(p))
    );
}

/// A merged-/usr node (Ubuntu 24.04, Fedora, Debian 12, RHEL 9): `/lib` is a symlink to
/// `usr/lib`, so `/lib/sysctl.d` is `/usr/lib/sysctl.d`. That is a directory systemd-sysctl
/// reads without trouble, not an unknown one: sysctls must stay covered and status must
/// not report an unknown observation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_usr_lib_symlink_is_not_an_unknown_sysctl_d() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::create_dir_all(node.path("/usr/lib/sysctl.d")).unwrap();
    let _ = std::fs::remove_dir_all(node.path("/lib"));
    std::os::unix::fs::symlink("usr/lib", node.path("/lib")).unwrap();
    node.start();
    let yaml = "sysctls:\n  vm.swappiness: \"10\"\n";
    let r = coverage(&node, yaml).await;
    let c = change(&r, "sysctls[vm.swappiness]");
    assert!(c.covered, "{c:?}");
    let op = apply(&node, yaml, "one").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    let p = status(&node).await.problems;
    assert!(p.is_empty(), "{p:?}");
}

/// A sysctl.d file that is a symlink whose target passes through a symlinked directory
/// (`/etc/sysctl.d/60-vendor.conf -> /opt/vendor/60-vendor.conf`, `/opt -> srv/opt`): the
/// node reads `/srv/opt/vendor/60-vendor.conf`; the agent must read that same file, not
/// the directory the first symlink on the way names (`/srv/opt`: reading it fails, and it
/// is reported as an unreadable sysctl.d file, so no sysctl is covered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysctl_d_symlink_through_a_symlinked_directory_is_followed_whole() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::create_dir_all(node.path("/srv/opt/vendor")).unwrap();
    std::fs::write(
        node.path("/srv/opt/vendor/60-vendor.conf"),
        "vm.max_map_count = 262144\n",
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(node.path("/opt"));
    std::os::unix::fs::symlink("srv/opt", node.path("/opt")).unwrap();
    std::fs::create_dir_all(node.path("/etc/sysctl.d")).unwrap();
    std::os::unix::fs::symlink(
        "/opt/vendor/60-vendor.conf",
        node.path("/etc/sysctl.d/60-vendor.conf"),
    )
    .unwrap();
    node.start();
    let r = coverage(&node, "sysctls:\n  vm.swappiness: \"10\"\n").await;
    let c = change(&r, "sysctls[vm.swappiness]");
    assert!(c.covered, "{c:?}");
    let p = status(&node).await.problems;
    assert!(p.is_empty(), "{p:?}");
}

/// A FIFO named like a sysctl.d file (`/etc/sysctl.d/70-x.conf`): opening it for reading
/// blocks until a writer comes. It must be an unknown observation (not covered, a status
/// problem), never a hung agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_in_sysctl_d_does_not_hang_the_agent() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::create_dir_all(node.path("/etc/sysctl.d")).unwrap();
    let fifo = node.path("/etc/sysctl.d/70-x.conf");
    let ok = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(ok.success());
    node.start();
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        coverage(&node, "sysctls:\n  vm.swappiness: \"10\"\n"),
    )
    .await;
    // unblock the agent whatever happened, so that it can be stopped
    std::thread::spawn(move || {
        let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
    });
    let r = r.expect("coverage did not answer within 10 s: the agent is stuck opening a FIFO");
    assert!(!change(&r, "sysctls[vm.swappiness]").covered);
}

/// Peak resident memory of a process (VmHWM).
fn peak_rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

/// 60 concurrent CanUpdateMachine hooks of 388 KiB each (23 MiB of bodies, well inside the
/// default 64 MiB `server.max_request_mib`), each with 98 000 JSON values (under the
/// 100 000 limit), to a node whose agent accepts and never answers (a node that hangs:
/// each hook waits its agent timeout). The byte budget counts the raw bodies, not the
/// parsed values held while the agent is asked, so with the new default of 64 places the
/// extension grew to ~1.4 GB here; it must stay within the 256 MiB the deployment gives it
/// (deploy/extension.yaml `limits.memory`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extension_memory_is_bounded_for_many_small_bodies_of_many_values() {
    use common::capi::{Extension, Pki};
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hole_addr = hole.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut keep = Vec::new();
        for s in hole.incoming() {
            keep.push(s);
        }
    });
    let pki = Pki::new();
    let ext = std::sync::Arc::new(Extension::start(
        &pki,
        &[("site-a/edge-1-cp-7xk2p", &hole_addr)],
        "",
    ));
    let pid = ext.child.id();
    let mut req = common::capi::fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    let junk: Vec<serde_json::Value> = (0..49_000).map(|_| serde_json::json!({"a": 1})).collect();
    req["desired"]["infrastructureMachine"]["spec"]["junk"] = serde_json::json!(junk);
    let body = std::sync::Arc::new(serde_json::to_vec(&req).unwrap());
    assert!(body.len() < 400 << 10);
    let mut tasks = Vec::new();
    for _ in 0..60 {
        let (ext, body) = (ext.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            ext.post_bytes(
                ext.client.as_ref(),
                "/hooks.runtime.cluster.x-k8s.io/v1alpha1/canupdatemachine/can-update-machine",
                body.to_vec(),
            )
            .await
        }));
    }
    for t in tasks {
        let _ = t.await.unwrap();
    }
    let peak = peak_rss(pid);
    eprintln!("measured: extension peak RSS {} MiB", peak >> 20);
    assert!(peak < 256 << 20, "peak RSS {} MiB", peak >> 20);
}

/// A kubelet reached through a directory symlink, the usual "current" layout
/// (`/usr/bin/kubelet -> ../../opt/kube/current/kubelet`, `/opt/kube/current -> v1.35.2`):
/// the node runs it fine and `kubelet --version` answers, but the new per-binary cache
/// stamps every link on the way with no-follow opens of the parents, fails at the
/// `current` directory link and reports no version at all (before the cache it was
/// asked and shown). An empty version makes the extension leave the Machine's version out
/// of what it applies and never see a version upgrade done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_version_through_a_directory_symlink_is_reported() {
    use std::os::unix::fs::PermissionsExt;
    let mut node = Node::new("ubuntu-2404-grub");
    common::k8s::install_standins(&mut node, "v1.34.3");
    let dir = node.path("/opt/kube/v1.35.2");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("kubelet");
    std::fs::write(
        &bin,
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Kubernetes v1.35.2'; else exit 2; fi\n",
    )
    .unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("v1.35.2", node.path("/opt/kube/current")).unwrap();
    std::fs::remove_file(node.path("/usr/bin/kubelet")).unwrap();
    std::os::unix::fs::symlink(
        "../../opt/kube/current/kubelet",
        node.path("/usr/bin/kubelet"),
    )
    .unwrap();
    let out = std::process::Command::new(node.path("/usr/bin/kubelet"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Kubernetes v1.35.2\n");
    node.start();
    assert_eq!(status(&node).await.kubernetes_version, "v1.35.2");
}

/// A node that stops answering without closing its connection (hung, or gone off the
/// network mid-reboot; here SIGSTOP): before the pool, UpdateMachine answered "waiting
/// for the node agent: ... did not answer" (the connect timed out). With the channel
/// pooled by an earlier hook, the call times out instead (DEADLINE_EXCEEDED) and the
/// answer loses the "waiting for the node agent" prefix that says the node is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_machine_says_waiting_for_the_agent_when_a_pooled_agent_hangs() {
    use common::capi::{fixture, one_agent};
    let (_pki, node, ext) = one_agent("ubuntu-2404-grub", "site-a/edge-1-cp-7xk2p", |_| {});
    let can = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    let r = ext.can_update_machine(&can).await;
    assert_eq!(r["status"], "Success", "{r}");
    let pid = node.pid().unwrap().to_string();
    let signal = |s: &str| {
        std::process::Command::new("kill")
            .args([s, &pid])
            .status()
            .unwrap()
    };
    assert!(signal("-STOP").success());
    let req = serde_json::json!({
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "kind": "UpdateMachineRequest",
        "settings": can["settings"],
        "desired": can["desired"],
    });
    let r = ext.update_machine(&req).await;
    signal("-CONT");
    assert_eq!(r["status"], "Success", "{r}");
    assert_eq!(r["retryAfterSeconds"], 30, "{r}");
    assert!(
        r["message"]
            .as_str()
            .unwrap()
            .starts_with("waiting for the node agent"),
        "{r}"
    );
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

/// Established TCP connections from this host to local port `port` (IPv4, /proc/net/tcp).
fn established_to(port: u16) -> usize {
    let t = std::fs::read_to_string("/proc/net/tcp").unwrap();
    t.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[3] == "01" && f[2].rsplit(':').next() == Some(&format!("{port:04X}"))
        })
        .count()
}

/// README: the pooled channel is "closed after 2 min unused". An entry is only dropped
/// when a later hook looks the pool up (`get` of the same key, or any `put`), so after a
/// last hook nothing closes it: the connection (kept alive by HTTP/2 PINGs every 15 s)
/// stays open until the agent's 30-minute connection age ends it. Takes ~2 min 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unused_pooled_channel_is_closed_after_two_minutes() {
    use common::capi::{fixture, one_agent};
    let (_pki, node, ext) = one_agent("ubuntu-2404-grub", "site-a/edge-1-cp-7xk2p", |_| {});
    let port: u16 = std::fs::read_to_string(&node.config)
        .unwrap()
        .split("listen = \"127.0.0.1:")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let can = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    let r = ext.can_update_machine(&can).await;
    assert_eq!(r["status"], "Success", "{r}");
    assert_eq!(established_to(port), 1, "the pooled connection");
    tokio::time::sleep(std::time::Duration::from_secs(130)).await;
    assert_eq!(
        established_to(port),
        0,
        "still connected 130 s after the last hook"
    );
}
