//! StrictModes, black box: nothing the agent obeys as root may be writable by
//! another user (sshd `StrictModes`: the file and every directory up to `/` owned by root
//! or the agent's uid, not group- or other-writable), and the metrics textfile is written
//! like every node file (under `--root`, `O_NOFOLLOW`, a unique `O_EXCL` temporary).
//!
//! The expected owner is the agent's effective uid or root, so these tests hold whether
//! they run as root (CI) or not; the "owned by another user" members need root to chown
//! and are checked only then.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use common::pki::free_port;
use common::{Node, status};
use inplace_wire::pb;

const DROP_IN: &str = "sysctls:\n  vm.max_map_count: \"262144\"\n";
const TEXTFILE: &str = "/var/lib/node_exporter/textfile_collector/inplaced.prom";

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Runs the daemon that must refuse to start: its output once it exits, within 20 s (a
/// daemon that starts instead is killed and the test fails).
fn refused(node: &Node) -> std::process::Output {
    let mut child = node
        .daemon()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!("inplaced started: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// Polls the status (at most 15 s) until a problem satisfies `pred`; returns it.
async fn problem_where(node: &Node, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let problems = status(node).await.problems;
        if let Some(p) = problems.iter().find(|p| pred(p)) {
            return p.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no such problem in {problems:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How a node.d drop-in is made untrusted, and which path the problem must name.
struct Case {
    what: &'static str,
    /// Makes `/etc/inplaced/node.d/10-maps.yaml` (already written 0644) untrusted.
    spoil: fn(&Node),
    /// The node path the problem names.
    named: &'static str,
    /// The mode the problem shows.
    mode: &'static str,
    /// The untrusted drop-in is in a directory the trusted sibling shares: nothing is
    /// applied at all.
    whole_dir: bool,
}

fn cases() -> Vec<Case> {
    let mut v = vec![
        Case {
            what: "world-writable file",
            spoil: |n| chmod(&n.path("/etc/inplaced/node.d/10-maps.yaml"), 0o666),
            named: "/etc/inplaced/node.d/10-maps.yaml: untrusted file",
            mode: "mode 0666",
            whole_dir: false,
        },
        Case {
            what: "group-writable file",
            spoil: |n| chmod(&n.path("/etc/inplaced/node.d/10-maps.yaml"), 0o664),
            named: "/etc/inplaced/node.d/10-maps.yaml: untrusted file",
            mode: "mode 0664",
            whole_dir: false,
        },
        Case {
            what: "world-writable node.d",
            spoil: |n| chmod(&n.path("/etc/inplaced/node.d"), 0o777),
            named: "/etc/inplaced/node.d: untrusted directory",
            mode: "mode 0777",
            whole_dir: true,
        },
        Case {
            what: "sticky world-writable /etc/inplaced above node.d",
            spoil: |n| chmod(&n.path("/etc/inplaced"), 0o1777),
            named: "/etc/inplaced: untrusted directory",
            mode: "mode 1777",
            whole_dir: true,
        },
    ];
    if is_root() {
        v.push(Case {
            what: "file owned by another user",
            spoil: |n| {
                std::os::unix::fs::chown(
                    n.path("/etc/inplaced/node.d/10-maps.yaml"),
                    Some(65534),
                    None,
                )
                .unwrap()
            },
            named: "/etc/inplaced/node.d/10-maps.yaml: untrusted file",
            mode: "owner uid 65534",
            whole_dir: false,
        });
    }
    v
}

/// An untrusted node.d drop-in (the file, node.d, or a directory above) is not applied at
/// start-up, `status` names it with its owner and mode, its mode is left as it was (it
/// used to be reset to 0644), and a trusted sibling is still applied when only the file
/// is untrusted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_node_d_drop_ins_are_not_applied_and_keep_their_mode() {
    for case in cases() {
        let mut node = Node::new("ubuntu-2404-grub");
        let dir = node.path("/etc/inplaced/node.d");
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("10-maps.yaml");
        std::fs::write(&bad, DROP_IN).unwrap();
        std::fs::write(
            dir.join("20-ok.yaml"),
            "sysctls:\n  vm.swappiness: \"10\"\n",
        )
        .unwrap();
        chmod(&bad, 0o644);
        chmod(&dir.join("20-ok.yaml"), 0o644);
        (case.spoil)(&node);
        let named = node.path(case.named.split(':').next().unwrap());
        let (mode_before, uid_before) = (mode_of(&named), std::fs::metadata(&named).unwrap().uid());
        node.start();
        let ops = node.operations().await;
        if case.whole_dir {
            assert!(ops.is_empty(), "{}: {ops:?}", case.what);
            assert_eq!(
                node.read("/proc/sys/vm/swappiness").trim(),
                "60",
                "{}",
                case.what
            );
        } else {
            assert_eq!(ops.len(), 1, "{}: {ops:?}", case.what);
            let op = node.settle(&ops[0].id).await;
            assert_eq!(
                op.phase,
                pb::Phase::Succeeded as i32,
                "{}: {op:?}",
                case.what
            );
            assert_eq!(
                node.read("/proc/sys/vm/swappiness").trim(),
                "10",
                "{}",
                case.what
            );
        }
        assert_eq!(
            node.read("/proc/sys/vm/max_map_count").trim(),
            "65530",
            "{}",
            case.what
        );
        let persisted = node.path("/etc/sysctl.d/99-zz-inplaced.conf");
        assert!(
            !persisted.exists()
                || !node
                    .read("/etc/sysctl.d/99-zz-inplaced.conf")
                    .contains("max_map_count"),
            "{}",
            case.what
        );
        let p = problem_where(&node, |p| p.contains(case.named)).await;
        assert!(p.contains(case.mode), "{}: {p}", case.what);
        assert!(
            p.contains("owner uid") && p.contains("mode "),
            "{}: {p}",
            case.what
        );
        assert!(p.contains("not applied"), "{}: {p}", case.what);
        // left as it was: not "repaired" to 0644 root, content untouched
        node.stop();
        assert_eq!(mode_of(&named), mode_before, "{}", case.what);
        assert_eq!(
            std::fs::metadata(&named).unwrap().uid(),
            uid_before,
            "{}",
            case.what
        );
        assert_eq!(
            std::fs::read_to_string(&bad).unwrap(),
            DROP_IN,
            "{}",
            case.what
        );
    }
}

/// A drop-in the agent applied (kept 0644 in node.d), then made world-writable and edited:
/// at the next start the edit is not applied, the last applied version stays in effect,
/// and the file keeps its mode and the edit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_drop_in_made_writable_keeps_its_last_applied_version() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let spec = pb::NodeSpec {
        dropins: vec![pb::DropIn {
            name: "10-maps.yaml".into(),
            content: DROP_IN.into(),
            keep: false,
        }],
        ..Default::default()
    };
    let op = node
        .client()
        .await
        .apply(pb::ApplyRequest {
            desired: Some(spec),
            operation_id: "first".into(),
            reboot_policy: pb::RebootPolicy::CallerHandles as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(node.settle(&op.id).await.phase, pb::Phase::Succeeded as i32);
    node.stop();
    let f = node.path("/etc/inplaced/node.d/10-maps.yaml");
    assert_eq!(mode_of(&f), 0o644);
    let edited = "sysctls:\n  vm.max_map_count: \"1\"\n";
    std::fs::write(&f, edited).unwrap();
    chmod(&f, 0o666);
    node.start();
    assert_eq!(node.operations().await.len(), 1, "no start-up operation");
    let p = problem_where(&node, |p| p.contains("10-maps.yaml: untrusted file")).await;
    assert!(
        p.contains("mode 0666") && p.contains("stays in effect"),
        "{p}"
    );
    assert_eq!(node.read("/proc/sys/vm/max_map_count").trim(), "262144");
    node.stop();
    assert_eq!(mode_of(&f), 0o666);
    assert_eq!(std::fs::read_to_string(&f).unwrap(), edited);
}

/// A drop-in marked `keep` takes the node's copy only when it is trusted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_drop_in_must_be_trusted() {
    let mut node = Node::new("ubuntu-2404-grub");
    let dir = node.path("/etc/inplaced/node.d");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("20-x.yaml"), "sysctls:\n  vm.swappiness: \"5\"\n").unwrap();
    chmod(&dir.join("20-x.yaml"), 0o646);
    node.start();
    let e = node
        .client()
        .await
        .get_coverage(pb::GetCoverageRequest {
            desired: Some(pb::NodeSpec {
                dropins: vec![pb::DropIn {
                    name: "20-x.yaml".into(),
                    content: String::new(),
                    keep: true,
                }],
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let m = e.message();
    assert!(
        m.contains("dropins[20-x.yaml].keep")
            && m.contains("mode 0646")
            && m.contains("untrusted file"),
        "{m}"
    );
}

/// A config file another user could write refuses the start, naming the path, owner and
/// mode: the file itself (world- and group-writable), and a directory above it.
#[test]
fn an_untrusted_config_refuses_to_start() {
    let mut node = Node::new("ubuntu-2404-grub");
    // trusted: it starts
    node.start();
    node.stop();
    let cfg = node.config.clone();
    let dir = cfg.parent().unwrap().to_path_buf();
    let me = rustix::process::geteuid().as_raw();
    // (what, the path spoiled, its mode, its owner, what the error shows)
    let mut cases = vec![
        ("world-writable config", &cfg, 0o666, me, "mode 0666"),
        ("group-writable config", &cfg, 0o620, me, "mode 0620"),
        ("world-writable directory", &dir, 0o777, me, "mode 0777"),
    ];
    if is_root() {
        cases.push((
            "config of another user",
            &cfg,
            0o644,
            65534,
            "owner uid 65534",
        ));
    }
    for (what, spoiled, mode, owner, shown) in cases {
        chmod(&cfg, 0o644);
        chmod(&dir, 0o700);
        chmod(spoiled, mode);
        std::os::unix::fs::chown(spoiled, Some(owner), None).unwrap();
        let out = refused(&node);
        std::os::unix::fs::chown(spoiled, Some(me), None).unwrap();
        assert!(!out.status.success(), "{what}");
        let e = String::from_utf8_lossy(&out.stderr);
        let kind = if spoiled == &dir { "directory" } else { "file" };
        assert!(
            e.contains(&format!("{}: untrusted {kind}", spoiled.display())),
            "{what}: {e}"
        );
        assert!(
            e.contains(shown) && e.contains(&format!("owner uid {owner}")),
            "{what}: {e}"
        );
        assert!(!node.socket.exists(), "{what}: nothing is served");
    }
    chmod(&cfg, 0o644);
    chmod(&dir, 0o700);
}

/// Writes a `[metrics]` config with a loopback listener and the textfile; returns the
/// listener's address.
fn metrics_config(node: &Node) -> String {
    let addr = format!("127.0.0.1:{}", free_port());
    std::fs::write(
        &node.config,
        format!("[metrics]\nlisten = \"{addr}\"\ntextfile = \"{TEXTFILE}\"\n"),
    )
    .unwrap();
    addr
}

fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn state_problems(addr: &str) -> f64 {
    scrape(addr)
        .lines()
        .find_map(|l| l.strip_prefix("inplaced_state_problems ")?.parse().ok())
        .unwrap()
}

/// Waits (at most 15 s) until the textfile under the root holds metrics.
fn wait_textfile(p: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let t = std::fs::read_to_string(p).unwrap_or_default();
        if t.contains("inplaced_build_info") {
            return t;
        }
        assert!(Instant::now() < deadline, "{} never written", p.display());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The textfile is written under `--root`; a symlink planted at the old fixed temporary
/// name is not followed (a unique `O_EXCL` temporary is used), nor one at the target (a
/// status problem, the link left); the links' target keeps its content and mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_textfile_is_written_under_the_root_and_never_through_a_symlink() {
    let mut node = Node::new("ubuntu-2404-grub");
    let target = node.path(TEXTFILE);
    let tdir = target.parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&tdir).unwrap();
    let victim = node.dir.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    chmod(&victim, 0o600);
    std::os::unix::fs::symlink(&victim, tdir.join(".inplaced.prom.tmp")).unwrap();
    metrics_config(&node);
    node.start();
    let text = wait_textfile(&target);
    // whole (the last family is there) and in the text format node_exporter reads
    let last = text.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("inplaced_tls_handshakes_refused_total{"),
        "{text}"
    );
    assert!(!text.contains("# EOF"), "{text}");
    assert_eq!(mode_of(&target), 0o644);
    assert!(std::fs::symlink_metadata(&target).unwrap().is_file());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert_eq!(mode_of(&victim), 0o600);
    node.stop();

    // a symlink at the target itself
    std::fs::remove_file(&target).unwrap();
    std::os::unix::fs::symlink(&victim, &target).unwrap();
    node.start();
    let p = problem_where(&node, |p| p.contains("metrics.textfile")).await;
    assert!(p.contains(TEXTFILE) && p.contains("symlink"), "{p}");
    node.stop();
    assert!(std::fs::symlink_metadata(&target).unwrap().is_symlink());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert_eq!(mode_of(&victim), 0o600);
}

/// A textfile directory that is missing, or writable by others or by its group, is a
/// status problem naming it (with owner and mode) and counted in
/// `inplaced_state_problems`; nothing is written or created there; fixed, the file is
/// written and the problem goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_open_textfile_directory_is_a_status_problem() {
    let mut node = Node::new("ubuntu-2404-grub");
    let target = node.path(TEXTFILE);
    let tdir = target.parent().unwrap().to_path_buf();
    let addr = metrics_config(&node);
    node.start();
    let p = problem_where(&node, |p| p.contains("metrics.textfile")).await;
    assert!(
        p.contains("does not exist") && p.contains("/var/lib/node_exporter"),
        "{p}"
    );
    assert!(state_problems(&addr) >= 1.0);
    assert!(!tdir.exists(), "the directory is not created");
    node.stop();

    for (mode, shown) in [
        (0o777, "mode 0777"),
        (0o775, "mode 0775"),
        (0o1777, "mode 1777"),
    ] {
        std::fs::create_dir_all(&tdir).unwrap();
        chmod(&tdir, mode);
        node.start();
        let p = problem_where(&node, |p| p.contains("metrics.textfile")).await;
        assert!(
            p.contains("/var/lib/node_exporter/textfile_collector: untrusted directory")
                && p.contains(shown)
                && p.contains("owner uid"),
            "{p}"
        );
        assert!(state_problems(&addr) >= 1.0);
        assert!(!target.exists());
        assert_eq!(mode_of(&tdir), mode, "its mode is left as it is");
        node.stop();
    }

    // fixed while running: written, and the problem goes
    chmod(&tdir, 0o777);
    node.start();
    problem_where(&node, |p| p.contains("metrics.textfile")).await;
    chmod(&tdir, 0o755);
    wait_textfile(&target);
    let deadline = Instant::now() + Duration::from_secs(15);
    while status(&node)
        .await
        .problems
        .iter()
        .any(|p| p.contains("metrics.textfile"))
    {
        assert!(Instant::now() < deadline, "the problem stays");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    node.stop();
}

/// A node whose config serves `[api.tcp]` on a free loopback port with a server
/// certificate and key (`server.crt`, `server.key`) from `server_ca` and a clients CA
/// `client_ca` (`clients.crt`), all written in the node's temporary directory; not started.
struct TlsNode {
    server_ca: common::pki::Ca,
    client_ca: common::pki::Ca,
    cert: String,
    key: String,
    port: u16,
}

fn tls_node() -> (Node, TlsNode) {
    use common::pki::{ca, leaf, write};
    let node = Node::new("ubuntu-2404-grub");
    let d = node.dir.path().to_path_buf();
    let server_ca = ca("server CA");
    let (cert_pem, key_pem) = leaf(&server_ca, "node-1", vec![]);
    let client_ca = ca("clients CA");
    let cert = write(&d, "server.crt", &cert_pem);
    let key = write(&d, "server.key", &key_pem);
    let cca = write(&d, "clients.crt", &client_ca.pem);
    let port = free_port();
    std::fs::write(
        &node.config,
        format!(
            "[api.tcp]\nlisten = \"127.0.0.1:{port}\"\ncert = \"{cert}\"\nkey = \"{key}\"\nclient_ca = \"{cca}\"\n"
        ),
    )
    .unwrap();
    (
        node,
        TlsNode {
            server_ca,
            client_ca,
            cert,
            key,
            port,
        },
    )
}

/// A TLS key another user could write is not used: the remote API is not served, the
/// status names the key file with its mode, and the local socket keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_tls_key_is_not_used_and_the_socket_serves() {
    let (mut node, tls) = tls_node();
    let (key, port) = (tls.key.clone(), tls.port);
    chmod(Path::new(&key), 0o666);
    node.start();
    let p = problem_where(&node, |p| p.contains("api.tcp.listen")).await;
    assert!(
        p.contains(&format!("api.tcp.key {key}: untrusted file")) && p.contains("mode 0666"),
        "{p}"
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "not served"
    );
    assert_eq!(mode_of(Path::new(&key)), 0o666);
    node.stop();
}

/// A rotation to a certificate or key another user could write is not loaded: the agent
/// keeps serving with the files it had, says why in its log, and leaves the files as they
/// are (the rule holds at every reload, not only at start-up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_to_an_untrusted_key_is_not_loaded() {
    use common::pki::{leaf, write};
    let (mut node, tls) = tls_node();
    let d = node.dir.path().to_path_buf();
    let (server_ca, cert, key, port) =
        (&tls.server_ca, tls.cert.clone(), tls.key.clone(), tls.port);
    let client_ca = &tls.client_ca;
    node.log_file = Some(d.join("agent.log"));
    node.start();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(std::time::Instant::now() < deadline, "served");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // the rotation: a new pair, the key left world-writable (or a group-writable cert)
    for (path, mode, what) in [(&key, 0o666, "api.tcp.key"), (&cert, 0o664, "api.tcp.cert")] {
        let (c2, k2) = leaf(server_ca, "node-1", vec![]);
        std::thread::sleep(std::time::Duration::from_millis(20));
        write(&d, "server.crt", &c2);
        write(&d, "server.key", &k2);
        chmod(Path::new(path), mode);
        // a handshake (its ClientHello) makes the acceptor look at the files
        let client = leaf(client_ca, "someone", vec![]);
        let _ = inplace_edge::client::connect_tls(
            &format!("127.0.0.1:{port}"),
            &inplace_edge::client::TlsIdentity {
                ca: server_ca.pem.clone().into_bytes(),
                cert: client.0.into_bytes(),
                key: client.1.into_bytes(),
                server_name: "node-1".into(),
            },
        )
        .await;
        let want = format!("{what} {path}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let log = node.log();
            if log.contains("keeping the previous one")
                && log.contains(&want)
                && log.contains("untrusted file")
            {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{want}: {log}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_eq!(mode_of(Path::new(path)), mode, "left as it is");
        chmod(Path::new(path), 0o600);
    }
    node.stop();
}

/// The state directory (journals and saved originals, restored as root at start-up) is
/// obeyed like the config: writable by others or by its group, the start is refused
/// naming it with owner and mode; a missing one is created 0700.
#[test]
fn an_untrusted_state_directory_refuses_to_start() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    node.stop();
    assert_eq!(mode_of(&node.state), 0o700, "created 0700");
    for mode in [0o777, 0o770, 0o1777] {
        chmod(&node.state, mode);
        let out = refused(&node);
        assert!(!out.status.success(), "{mode:o}");
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(
            e.contains(&format!(
                "--state-dir: {}: untrusted directory",
                node.state.display()
            )) && e.contains(&format!("mode {mode:04o}")),
            "{e}"
        );
        assert_eq!(mode_of(&node.state), mode, "left as it is");
    }
    chmod(&node.state, 0o700);
    node.start();
    node.stop();
}

/// A trusted drop-in of the operator's with a mode other than 0644 (0600, 0640) is applied
/// at start-up and keeps its mode: the agent does not "repair" a file it did not write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_drop_in_is_applied_and_keeps_its_mode() {
    for mode in [0o600, 0o640, 0o400] {
        let mut node = Node::new("ubuntu-2404-grub");
        let dir = node.path("/etc/inplaced/node.d");
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("10-maps.yaml");
        std::fs::write(&f, DROP_IN).unwrap();
        chmod(&f, mode);
        node.start();
        let ops = node.operations().await;
        assert_eq!(ops.len(), 1, "{ops:?}");
        let op = node.settle(&ops[0].id).await;
        assert_eq!(op.phase, pb::Phase::Succeeded as i32, "{op:?}");
        assert_eq!(node.read("/proc/sys/vm/max_map_count").trim(), "262144");
        let st = status(&node).await;
        assert!(st.drift.is_empty(), "{:?}", st.drift);
        node.stop();
        assert_eq!(mode_of(&f), mode, "{mode:o}");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), DROP_IN);
    }
}
