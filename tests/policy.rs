//! Issue 5: hostile specs refused with the rule named, local socket roles by peer
//! credentials, systemd readiness only once the socket listens.

mod common;

use common::{Node, err, snapshot};
use inplace_wire::pb;

/// (spec, what the refusal must name). Each is refused by validation (INVALID_ARGUMENT),
/// by policy (PERMISSION_DENIED on apply, not covered in coverage), or as a conflict with
/// the node (FAILED_PRECONDITION).
fn hostile() -> Vec<(String, &'static str)> {
    let mut v: Vec<(String, &'static str)> = vec![
        ("files:\n- path: ../etc/shadow\n".into(), "is relative"),
        ("files:\n- path: /etc/./shadow\n".into(), "not normalized"),
        ("files:\n- path: /etc//passwd\n".into(), "not normalized"),
        (
            "files:\n- path: /etc/shadow\n".into(),
            "denied path \"/etc/shadow*\"",
        ),
        (
            "files:\n- path: /etc/gshadow\n".into(),
            "denied path \"/etc/gshadow*\"",
        ),
        (
            "files:\n- path: /etc/sudoers\n".into(),
            "denied path \"/etc/sudoers*\"",
        ),
        (
            "files:\n- path: /etc/sudoers.d/evil\n".into(),
            "denied path \"/etc/sudoers",
        ),
        (
            "files:\n- path: /etc/passwd\n".into(),
            "denied path \"/etc/passwd*\"",
        ),
        (
            "files:\n- path: /etc/pam.d/sshd\n".into(),
            "denied path \"/etc/pam.d\"",
        ),
        (
            "files:\n- path: /etc/ssh/ssh_host_ed25519_key\n".into(),
            "denied path \"/etc/ssh/ssh_host_*\"",
        ),
        (
            "files:\n- path: /etc/inplaced/config.toml\n".into(),
            "inplaced itself",
        ),
        (
            "files:\n- path: /root/.ssh/authorized_keys\n".into(),
            "not under an allowed prefix",
        ),
        (
            "files:\n- path: /home/ops/.bashrc\n".into(),
            "not under an allowed prefix",
        ),
        (
            "files:\n- path: /usr/bin/kubelet\n".into(),
            "not under an allowed prefix",
        ),
        ("files:\n- path: /etc/evil-link/x\n".into(), "is a symlink"),
        (
            "files:\n- path: /etc/hostname-link\n".into(),
            "is a symlink",
        ),
        (
            "files:\n- path: /proc/sys/kernel/core_pattern\n".into(),
            "kernel interface",
        ),
        (
            "files:\n- path: /sys/kernel/mm/transparent_hugepage/enabled\n".into(),
            "kernel interface",
        ),
        ("files:\n- path: /dev/sda\n".into(), "kernel interface"),
        (
            "files:\n- path: /boot/grub/grub.cfg\n".into(),
            "boot configuration",
        ),
        (
            "files:\n- path: \"/etc/a\\0b\"\n".into(),
            "control character",
        ),
        (
            "files:\n- path: \"/etc/a\\nb\"\n".into(),
            "control character",
        ),
        (
            "files:\n- path: /etc/x\n  mode: \"7777777\"\n".into(),
            "not an octal mode",
        ),
        (
            "files:\n- path: /etc/x\n  owner: \"4294967295\"\n".into(),
            "(uid_t)-1",
        ),
        (
            "kernelArgs:\n- \"quiet\\nroot=/dev/sda\"\n".into(),
            "kernelArgs[0]",
        ),
        (
            "kernelArgs: [root=/dev/sdb1]\n".into(),
            "set by the installer",
        ),
        ("kernelArgs: [\"init=$(reboot)\"]\n".into(), "GRUB expands"),
        (
            "sysctls:\n  kernel/../../etc/shadow: \"1\"\n".into(),
            "is not valid",
        ),
        (
            "sysctls:\n  vm/../kernel/core_pattern: \"|/tmp/x\"\n".into(),
            "is not valid",
        ),
        (
            "sysctls:\n  kernel.core_pattern: \"a\\nb\"\n".into(),
            "single line",
        ),
        (
            "kubelet:\n  flags:\n    \"--max-pods\": \"1\"\n".into(),
            "without leading dashes",
        ),
        (
            "kubelet:\n  flags:\n    max-pods: \"1 --v=9\"\n".into(),
            "whitespace",
        ),
        (
            "kubelet:\n  config:\n    apiVersion: v1\n".into(),
            "kubelet.config.apiVersion",
        ),
    ];
    let mut many = String::from("files:\n");
    for i in 0..10_000 {
        many.push_str(&format!("- path: /etc/many/f{i}\n"));
    }
    v.push((many, "over the limit of 1000 (policy.max_files)"));
    v.push((
        format!(
            "files:\n- path: /etc/big\n  content: \"{}\"\n",
            "x".repeat(17 << 20)
        ),
        "over the limit of 16777216 (policy.max_file_bytes)",
    ));
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_specs_are_refused_with_the_rule_named_and_nothing_changes() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::os::unix::fs::symlink("/root", node.path("/etc/evil-link")).unwrap();
    std::os::unix::fs::symlink("hostname", node.path("/etc/hostname-link")).unwrap();
    let before = snapshot(&node.root);
    node.start();
    let cases = hostile();
    assert!(cases.len() >= 30);
    for (yaml, want) in cases {
        let short: String = yaml.chars().take(60).collect();
        let parsed = inplace_wire::yaml::parse(&yaml);
        let desired = match parsed {
            Err(e) => {
                assert!(e.to_string().contains(want), "{short:?}: {e}");
                continue;
            }
            Ok(p) => p,
        };
        let mut c = node.client().await;
        let cov = c
            .get_coverage(pb::GetCoverageRequest {
                desired: Some(desired.clone()),
                ..Default::default()
            })
            .await;
        match cov {
            Err(s) => {
                assert!(
                    matches!(
                        s.code(),
                        tonic::Code::InvalidArgument | tonic::Code::PermissionDenied
                    ),
                    "{short:?}: {s:?}"
                );
                assert!(s.message().contains(want), "{short:?}: {}", s.message());
            }
            Ok(r) => {
                let r = r.into_inner();
                assert!(!r.fully_covered, "{short:?}: covered");
                let reasons: Vec<&str> = r
                    .changes
                    .iter()
                    .filter(|c| !c.covered)
                    .map(|c| c.reason.as_str())
                    .collect();
                assert!(
                    reasons.iter().any(|x| x.contains(want)),
                    "{short:?}: {reasons:?}"
                );
                let e = c
                    .apply(pb::ApplyRequest {
                        desired: Some(desired),
                        ..Default::default()
                    })
                    .await
                    .unwrap_err();
                let policy = reasons.iter().any(|x| x.starts_with("policy:"));
                let expected = if policy {
                    tonic::Code::PermissionDenied
                } else {
                    tonic::Code::FailedPrecondition
                };
                assert_eq!(e.code(), expected, "{short:?}: {e:?}");
            }
        }
    }
    assert_eq!(snapshot(&node.root), before, "nothing on disk changed");
    let o = node.ctl(&["status"]);
    assert!(o.status.success(), "the daemon keeps serving: {}", err(&o));
    assert!(node.actions().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_roles_follow_peer_credentials() {
    if !rustix::process::geteuid().is_root() || which("setpriv").is_none() {
        eprintln!("skipped: needs root and setpriv");
        return;
    }
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(&node.config, "[api]\nsocket_group = \"65534\"\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(node.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    node.start();
    let m = std::fs::metadata(&node.socket).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((m.mode() & 0o777, m.gid()), (0o660, 65534));
    let spec_path = node.spec(
        "a.yaml",
        include_str!("../examples/specs/kubelet-and-sysctl.yaml"),
    );
    std::fs::set_permissions(&spec_path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let as_user = |uid: u32, gid: u32, args: &[&str]| {
        std::process::Command::new("setpriv")
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .arg("--clear-groups")
            .arg(env!("CARGO_BIN_EXE_inplacectl"))
            .arg("--socket")
            .arg(&node.socket)
            .args(args)
            .output()
            .unwrap()
    };
    // a member of the group reads
    let o = as_user(65534, 65534, &["status"]);
    assert!(o.status.success(), "{}", err(&o));
    let o = as_user(65534, 65534, &["coverage", "-f", &spec_path]);
    assert!(o.status.success(), "{}", err(&o));
    // but may not apply
    let o = as_user(65534, 65534, &["apply", "-f", &spec_path]);
    assert!(!o.status.success());
    assert!(
        err(&o).contains("PermissionDenied") && err(&o).contains("admin"),
        "{}",
        err(&o)
    );
    // anyone else can not even connect
    let o = as_user(1234, 1234, &["status"]);
    assert!(!o.status.success());
    assert!(err(&o).contains("connecting to inplaced"), "{}", err(&o));
    // root applies
    let o = node.ctl(&["apply", "-f", &spec_path, "--wait"]);
    assert!(o.status.success(), "{}", err(&o));
}

fn which(cmd: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(cmd))
        .find(|p| p.exists())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_is_sent_only_once_the_socket_listens() {
    let mut node = Node::new("ubuntu-2404-grub");
    let notify = node.dir.path().join("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let mut child = node.daemon().env("NOTIFY_SOCKET", &notify).spawn().unwrap();
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).unwrap();
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.contains("READY=1"), "{msg}");
    // at READY the API answers
    let c = std::os::unix::net::UnixStream::connect(&node.socket);
    assert!(c.is_ok(), "socket not listening at READY");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
    node.stop();
}
