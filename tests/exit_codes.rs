//! `inplacectl` exit codes for a spec the agent would refuse (issue 27 §5), black box:
//! `coverage`, `apply --dry-run` and `apply` of the same spec agree (3: refused, 0:
//! covered), and the refusing dry run still prints every change with its reason.

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coverage_dry_run_and_apply_agree_on_a_refused_spec() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    // --max-pods in kubeadm-flags.env overrides the field: not covered
    let refused = node.spec("refused.yaml", "kubelet:\n  config:\n    maxPods: 250\n");
    let o = node.ctl(&["coverage", "-f", &refused]);
    assert_eq!(o.status.code(), Some(3), "{}{}", out(&o), err(&o));
    let o = node.ctl(&["apply", "--dry-run", "-f", &refused]);
    assert_eq!(o.status.code(), Some(3), "{}{}", out(&o), err(&o));
    assert!(out(&o).contains("apply would be refused"), "{}", out(&o));
    assert!(out(&o).contains("--max-pods"), "{}", out(&o));
    let o = node.ctl(&["apply", "--dry-run", "-o", "json", "-f", &refused]);
    assert_eq!(o.status.code(), Some(3), "{}{}", out(&o), err(&o));
    let o = node.ctl(&["apply", "-f", &refused]);
    assert_eq!(o.status.code(), Some(3), "{}{}", out(&o), err(&o));
    assert!(err(&o).contains("not covered"), "{}", err(&o));
    assert!(node.operations().await.is_empty(), "nothing was started");

    let covered = node.spec("covered.yaml", "sysctls:\n  vm.swappiness: \"10\"\n");
    for args in [
        vec!["coverage", "-f", &covered],
        vec!["apply", "--dry-run", "-f", &covered],
        vec!["apply", "--wait", "-f", &covered],
    ] {
        let o = node.ctl(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}{}", out(&o), err(&o));
    }
}

/// What the agent can not read for its own work is a status problem, counted in
/// `inplaced_state_problems` (issue 27 §5): an unknown boot id, and a kubelet that
/// answers no version.
#[test]
fn unreadable_boot_id_and_kubelet_version_are_status_problems() {
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::remove_file(node.path("/proc/sys/kernel/random/boot_id")).unwrap();
    let kubelet = node.path("/usr/bin/kubelet");
    std::fs::create_dir_all(kubelet.parent().unwrap()).unwrap();
    std::fs::write(&kubelet, "#!/bin/sh\necho 'segmentation fault'\n").unwrap();
    std::fs::set_permissions(&kubelet, std::fs::Permissions::from_mode(0o755)).unwrap();
    node.env
        .push(("INPLACED_RECORD_EXEC".into(), "/usr/bin/kubelet".into()));
    let addr = format!("127.0.0.1:{}", common::pki::free_port());
    std::fs::write(&node.config, format!("[metrics]\nlisten = \"{addr}\"\n")).unwrap();
    node.start();
    let o = node.ctl(&["status", "-o", "json"]);
    assert!(o.status.success(), "{}", err(&o));
    let s: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    let problems: Vec<&str> = s["problems"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p.as_str()).collect())
        .unwrap_or_default();
    assert!(
        problems.contains(&"the boot id can not be read (/proc/sys/kernel/random/boot_id): an operation that needs a reboot can not be verified after it"),
        "{problems:?}"
    );
    assert!(
        problems.contains(&"the kubelet at /usr/bin/kubelet does not report a version `/usr/bin/kubelet --version` parses: Kubernetes version upgrades are not covered until it does"),
        "{problems:?}"
    );
    let mut c = std::net::TcpStream::connect(&addr).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    c.read_to_string(&mut body).unwrap();
    let gauge = body
        .lines()
        .find_map(|l| l.strip_prefix("inplaced_state_problems "))
        .map(|v| v.trim().parse::<f64>().unwrap());
    assert_eq!(gauge, Some(problems.len() as f64), "{body}");
}

/// A `--log` filter the daemon and the extension can not read (a span filter, an unknown
/// level) ends them with exit code 2 and a message naming `--log` and its syntax, before
/// anything is served; a good one starts the daemon.
#[test]
fn a_bad_log_filter_is_refused_at_start() {
    for bad in ["inplaced[op]=debug", "inplaced=loud"] {
        for bin in [
            env!("CARGO_BIN_EXE_inplaced"),
            env!("CARGO_BIN_EXE_inplace-extension"),
        ] {
            let o = std::process::Command::new(bin)
                .args(["--log", bad])
                .output()
                .unwrap();
            let e = err(&o);
            assert_eq!(o.status.code(), Some(2), "{bin} --log {bad}: {e}");
            assert!(
                e.contains(&format!("--log {bad:?}")) && e.contains("target=level"),
                "{bin}: {e}"
            );
        }
    }
    let mut node = Node::new("ubuntu-2404-grub");
    node.env.push((
        "INPLACED_LOG".into(),
        "warn,inplaced::server=debug,h2=off".into(),
    ));
    node.start();
}
