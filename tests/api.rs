//! The local API, black box: the real `inplaced` on a temporary socket over a copy of a
//! fixture node, driven by `inplacectl` and a gRPC client: the scenario of the README,
//! byte-identical and camelCase coverage reports, gRPC health and reflection, socket roles
//! by peer credentials, and systemd readiness only once the socket listens.

mod common;
use common::*;
use inplace_wire::pb;
use inplace_wire::pb::{ChangeOperation, DisruptionLevel, Phase};
use prost::Message;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_a_kubelet_flag_and_sysctl_file_on_ubuntu() {
    let mut node = Node::new("ubuntu-2404-grub");
    let config_before = std::fs::read(node.path("/var/lib/kubelet/config.yaml")).unwrap();
    node.start();

    let r = coverage(&node, SCENARIO_A).await;
    assert!(r.fully_covered, "{r:#?}");
    assert!(!r.reboot_required);
    let max = r.max_disruption.clone().unwrap();
    assert_eq!(max.level, DisruptionLevel::Restart as i32);
    assert_eq!(max.units, vec!["kubelet.service".to_string()]);
    assert_eq!(r.changes.len(), 2, "{r:#?}");
    let flag = change(&r, "kubelet.flags[max-pods]");
    assert_eq!((flag.before.as_str(), flag.after.as_str()), ("110", "250"));
    assert_eq!(flag.operation, ChangeOperation::Update as i32);
    let file = change(&r, "files[/etc/sysctl.d/90-tuning.conf]");
    assert_eq!(level(&file.disruption), DisruptionLevel::None);
    assert!(
        !file.after.contains("262144"),
        "file content must never be echoed"
    );
    let facts = r.facts.as_ref().unwrap();
    assert_eq!(facts.platform, "bare-metal");
    let p = r.preservation.as_ref().unwrap();
    assert!(p.preserve);
    assert!(
        p.reasons
            .contains(&"bare metal: Dell Inc. PowerEdge R650".to_string()),
        "{p:?}"
    );

    // apply through the CLI and wait
    let path = node.spec("a.yaml", SCENARIO_A);
    let o = node.ctl(&["apply", "-f", &path, "--id", "scenario-a", "--wait"]);
    assert!(o.status.success(), "{}{}", out(&o), err(&o));
    assert!(out(&o).contains("Succeeded"), "{}", out(&o));

    assert_eq!(
        node.read("/var/lib/kubelet/kubeadm-flags.env"),
        "KUBELET_KUBEADM_ARGS=\"--max-pods=250 --node-labels=metal3.io/uuid=7a710f31-7879-4f17-bf4d-646881d6af6a --pod-infra-container-image=registry.k8s.io/pause:3.10.1 --provider-id=metal3://site-a/host-03/edge-1-cp-7xk2p\"\n"
    );
    assert_eq!(
        std::fs::read(node.path("/var/lib/kubelet/config.yaml")).unwrap(),
        config_before,
        "config.yaml must stay byte-identical"
    );
    assert_eq!(
        node.read("/etc/sysctl.d/90-tuning.conf"),
        "vm.max_map_count = 262144\n"
    );
    assert_eq!(node.actions(), vec!["restart kubelet.service".to_string()]);

    let o = node.ctl(&["status"]);
    assert!(o.status.success(), "{}", err(&o));
    let s = status(&node).await;
    assert_eq!(s.applied_spec_hash, r.spec_hash);
    assert!(s.drift.is_empty(), "{:?}", s.drift);
    let h = node.ctl(&["history"]);
    assert!(
        out(&h).contains("scenario-a") && out(&h).contains("Succeeded"),
        "{}",
        out(&h)
    );
    let op = node
        .client()
        .await
        .get_operation(pb::GetOperationRequest {
            id: "scenario-a".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(op.phase, Phase::Succeeded as i32);

    // the same spec again: nothing to do
    let again = coverage(&node, SCENARIO_A).await;
    assert!(again.changes.is_empty(), "{:#?}", again.changes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coverage_is_deterministic_and_json_is_camel_case() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let yaml = include_str!("../examples/specs/full.yaml");
    let a = coverage(&node, yaml).await.encode_to_vec();
    let b = coverage(&node, yaml).await.encode_to_vec();
    assert_eq!(a, b);
    let p = node.spec("full.yaml", yaml);
    let o1 = node.ctl(&["-o", "json", "coverage", "-f", &p]);
    let o2 = node.ctl(&["-o", "json", "coverage", "-f", &p]);
    assert!(o1.status.success(), "{}", err(&o1));
    assert_eq!(o1.stdout, o2.stdout);
    let v: serde_json::Value = serde_json::from_slice(&o1.stdout).unwrap();
    assert_eq!(v["fullyCovered"], serde_json::json!(true), "{v:#}");
    assert_eq!(v["changes"][0]["id"], "files[/etc/etcd-defrag/defrag.env]");
    assert_eq!(v["changes"][0]["operation"], "CHANGE_OPERATION_UPDATE");
    assert!(
        v["maxDisruption"]["level"]
            .as_str()
            .unwrap()
            .starts_with("DISRUPTION_LEVEL_")
    );
    assert_eq!(v["facts"]["platform"], "bare-metal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_are_served() {
    let mut node = Node::new("systemd-boot");
    node.start();
    let ch = inplace_edge::client::channel(&node.socket).await.unwrap();
    let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
    let r = h
        .check(tonic_health::pb::HealthCheckRequest {
            service: "inplace.v1.NodeAgent".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

fn which(cmd: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(cmd))
        .find(|p| p.exists())
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

/// Each binary names itself and says what it is in `--help` and `--version` (the man
/// pages are made from the same text): not the description of the library crate it is
/// built from.
#[test]
fn each_binary_says_what_it_is() {
    for (bin, about) in [
        (
            env!("CARGO_BIN_EXE_inplaced"),
            "On-node in-place update agent for Cluster API managed bare-metal Kubernetes nodes",
        ),
        (
            env!("CARGO_BIN_EXE_inplacectl"),
            "Local client of the inplaced node agent: validate, coverage, apply, confirm, status, history, reboot",
        ),
        (
            env!("CARGO_BIN_EXE_inplace-extension"),
            "Cluster API Runtime Extension that answers the in-place update hooks from node coverage",
        ),
    ] {
        let help = std::process::Command::new(bin)
            .arg("--help")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
        assert_eq!(help.lines().next(), Some(about), "{bin}: {help}");
        let version = std::process::Command::new(bin)
            .arg("--version")
            .output()
            .unwrap();
        let name = std::path::Path::new(bin)
            .file_name()
            .unwrap()
            .to_string_lossy();
        assert_eq!(
            String::from_utf8_lossy(&version.stdout).trim(),
            format!("{name} {}", env!("CARGO_PKG_VERSION"))
        );
    }
}
