//! Every entry point validates the same way: each identifier that becomes a
//! file name (operation ids, drop-in names) is checked by one rule in every RPC and
//! `inplacectl` command that takes it, answered `INVALID_ARGUMENT` naming the rule; and
//! no error shows the state directory's path to a caller who is not root on the node.

mod common;

use common::*;
use inplace_wire::pb;
use inplace_wire::pb::Phase;
use tonic::Code;

/// The operation-id rule as every refusal states it.
const ID_RULE: &str =
    "an operation id is 1-128 characters of A-Z a-z 0-9 . _ -, not starting with '.' or '-'";

/// Invalid forms of an identifier: empty, dot-dot, slash, a path, NUL, over-long,
/// non-ASCII, a leading `-` and a leading `.`.
fn invalid_ids() -> Vec<String> {
    vec![
        String::new(),
        "..".into(),
        "/".into(),
        "../../applied".into(),
        "a/b".into(),
        "a\0b".into(),
        "x".repeat(129),
        "opération".into(),
        "-rf".into(),
        ".hidden".into(),
    ]
}

fn assert_refused(
    what: &str,
    id: &str,
    r: Result<impl std::fmt::Debug, tonic::Status>,
    node: &Node,
) {
    let e = r.expect_err(&format!("{what} {id:?} must be refused"));
    assert_eq!(e.code(), Code::InvalidArgument, "{what} {id:?}: {e:?}");
    assert!(
        e.message().contains(ID_RULE),
        "{what} {id:?}: {}",
        e.message()
    );
    let state = node.state.display().to_string();
    assert!(
        !e.message().contains(&state),
        "{what} {id:?}: {}",
        e.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_that_takes_an_operation_id_refuses_the_invalid_forms() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    // an operation and a file next to the history, that a path-like id could reach
    let op = common::apply(&node, "{}\n", "ok-1").await;
    assert_eq!(op.phase, pb::Phase::Succeeded as i32);
    let mut c = node.client().await;
    for id in invalid_ids() {
        let r = c
            .get_operation(pb::GetOperationRequest { id: id.clone() })
            .await;
        assert_refused("GetOperation", &id, r, &node);
        let r = c
            .watch_operation(pb::WatchOperationRequest { id: id.clone() })
            .await;
        assert_refused("WatchOperation", &id, r.map(|_| ()), &node);
        let r = c
            .reboot(pb::RebootRequest {
                operation_id: id.clone(),
            })
            .await;
        assert_refused("Reboot", &id, r, &node);
        if id.is_empty() {
            continue; // Apply generates an id when none is given
        }
        for dry_run in [false, true] {
            let r = c
                .apply(pb::ApplyRequest {
                    desired: Some(spec("{}\n")),
                    operation_id: id.clone(),
                    dry_run,
                    ..Default::default()
                })
                .await;
            assert_refused("Apply", &id, r, &node);
        }
    }
    // the valid forms still work, and nothing was recorded for the refused ones
    let got = c
        .get_operation(pb::GetOperationRequest { id: "ok-1".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.phase, pb::Phase::Succeeded as i32);
    let e = c
        .get_operation(pb::GetOperationRequest {
            id: "no-such-op".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert_eq!(node.operations().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_that_takes_a_dropin_name_refuses_the_invalid_forms() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let mut c = node.client().await;
    let mut names = invalid_ids();
    names.extend(["x.yml".to_string(), ".yaml".into(), "-x.yaml".into()]);
    for name in names {
        for keep in [false, true] {
            let desired = pb::NodeSpec {
                dropins: vec![pb::DropIn {
                    name: name.clone(),
                    content: if keep { String::new() } else { "{}\n".into() },
                    keep,
                }],
                ..Default::default()
            };
            let check = |what: &str, r: Result<(), tonic::Status>| {
                let e = r.expect_err(&format!("{what} drop-in {name:?} (keep {keep})"));
                assert_eq!(e.code(), Code::InvalidArgument, "{what} {name:?}: {e:?}");
                assert!(
                    e.message().contains("is not a valid drop-in name")
                        && e.message()
                            .contains("not starting with '.' or '-', ending in .yaml"),
                    "{what} {name:?}: {}",
                    e.message()
                );
            };
            let r = c
                .get_coverage(pb::GetCoverageRequest {
                    desired: Some(desired.clone()),
                    ..Default::default()
                })
                .await;
            check("GetCoverage", r.map(|_| ()));
            let r = c
                .apply(pb::ApplyRequest {
                    desired: Some(desired),
                    operation_id: "dropin-op".into(),
                    ..Default::default()
                })
                .await;
            check("Apply", r.map(|_| ()));
        }
    }
    assert!(node.operations().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inplacectl_checks_operation_ids_by_the_same_rule() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let file = node.spec("empty.yaml", "{}\n");
    for id in ["..", "a/b", "opération", &"x".repeat(129)] {
        for args in [
            vec!["get", id],
            vec!["watch", id],
            vec!["reboot", id],
            vec!["apply", "-f", &file, "--id", id],
        ] {
            let o = node.ctl(&args);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {}", err(&o));
            assert!(err(&o).contains(ID_RULE), "{args:?}: {}", err(&o));
        }
    }
    assert!(node.operations().await.is_empty());
}

/// An internal error naming a state-directory file (a damaged operation record) reaches
/// root on the socket as it is, and a remote caller without the path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_directory_paths_reach_only_root_on_the_node() {
    let mut node = Node::new("ubuntu-2404-grub");
    let port = common::pki::free_port();
    std::fs::write(
        &node.config,
        format!("[api.tcp]\nlisten = \"127.0.0.1:{port}\"\ninsecure_loopback = true\n"),
    )
    .unwrap();
    node.start();
    let op = common::apply(&node, "{}\n", "damaged").await;
    assert_eq!(op.phase, pb::Phase::Succeeded as i32);
    // after a restart the operation is read from its file, damaged under the agent
    node.stop();
    node.start();
    std::fs::write(node.state.join("operations/damaged.json"), "{not json").unwrap();
    let state = node.state.display().to_string();

    let local = node
        .client()
        .await
        .get_operation(pb::GetOperationRequest {
            id: "damaged".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(local.code(), Code::Internal, "{local:?}");
    assert!(local.message().contains(&state), "{}", local.message());

    let ch = tonic::transport::Endpoint::try_from(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut remote = pb::node_agent_client::NodeAgentClient::new(ch);
    let e = remote
        .get_operation(pb::GetOperationRequest {
            id: "damaged".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{e:?}");
    assert!(!e.message().contains(&state), "{}", e.message());
    assert!(
        e.message()
            .contains("<state directory>/operations/damaged.json"),
        "{}",
        e.message()
    );
    let e = remote
        .list_operations(pb::ListOperationsRequest {})
        .await
        .map(|r| format!("{:?}", r.into_inner()))
        .unwrap_or_else(|e| e.message().to_string());
    assert!(!e.contains(&state), "{e}");

    // answers carry paths too: a damaged applied record is a status problem naming the
    // file and where it was moved (found by a fresh tester through a remote `status`)
    node.stop();
    std::fs::write(node.state.join("applied.json"), "{not json").unwrap();
    node.start();
    let local = common::status(&node).await;
    assert!(
        local.problems.iter().any(|p| p.contains(&state)),
        "{:?}",
        local.problems
    );
    let ch = tonic::transport::Endpoint::try_from(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut remote = pb::node_agent_client::NodeAgentClient::new(ch);
    let st = remote
        .get_status(pb::GetStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(
        st.problems
            .iter()
            .any(|p| p.contains("<state directory>/applied.json")),
        "{:?}",
        st.problems
    );
    assert!(!format!("{st:?}").contains(&state), "{st:?}");
}

/// A file name over NAME_MAX (the 256 bytes, and one of 1000), a path over
/// PATH_MAX: INVALID_ARGUMENT naming the limit, not an internal stat error; 255 bytes is
/// fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_long_file_names_and_paths_are_invalid_arguments() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let file = |p: &str| format!("files:\n- path: {p}\n  content: \"x\\n\"\n");
    for n in [256, 1000] {
        let (code, msg) = refusal(&node, &file(&format!("/etc/{}", "n".repeat(n)))).await;
        assert_eq!(code, tonic::Code::InvalidArgument, "{n}: {msg}");
        assert!(
            msg.contains("files[0].path")
                && msg.contains(&format!("is {n} bytes, over the 255-byte file name limit"))
                && msg.contains("NAME_MAX"),
            "{n}: {msg}"
        );
    }
    let deep = format!("/etc{}", "/d".repeat(2100));
    let (code, msg) = refusal(&node, &file(&deep)).await;
    assert_eq!(code, tonic::Code::InvalidArgument, "{msg}");
    assert!(
        msg.contains("4096-byte path limit") && msg.contains("PATH_MAX"),
        "{msg}"
    );
    let ok = format!("/etc/{}", "n".repeat(255));
    let op = apply(&node, &file(&ok), "long").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
}

/// (spec, what the refusal must name). Each is refused by validation (INVALID_ARGUMENT),
/// by policy (PERMISSION_DENIED on apply, not covered in coverage), or as a conflict with
/// the node (FAILED_PRECONDITION).
fn hostile() -> Vec<(String, &'static str)> {
    let mut v: Vec<(String, &'static str)> = vec![
        ("files:\n- path: ../etc/shadow\n".into(), "is relative"),
        ("files:\n- path: /etc/./shadow\n".into(), "not normalized"),
        ("files:\n- path: /etc//passwd\n".into(), "not normalized"),
        // a KubeletConfiguration nested deeper than the decoder may go (it was INTERNAL)
        (
            {
                let mut y = String::from("kubelet:\n  config:\n");
                for i in 0..30 {
                    y.push_str(&format!("{}k{i}:\n", "  ".repeat(i + 2)));
                }
                y.push_str(&format!("{}x: 1\n", "  ".repeat(32)));
                y
            },
            "desired.kubelet.config: maps and lists nested",
        ),
        // one item's path a directory above another's: no apply could write both
        (
            "files:\n- path: /etc/a\n  content: \"1\"\n- path: /etc/a/b\n  content: \"2\"\n".into(),
            "/etc/a/b and /etc/a (files[0]) can not both be files",
        ),
        (
            "files:\n- path: /etc/a/b/c\n- path: /etc/a\n".into(),
            "/etc/a and /etc/a/b/c (files[0]) can not both be files",
        ),
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
async fn malformed_specs_name_the_field_without_a_backtrace() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    for (yaml, want) in [
        ("filez: []\n", "filez"),
        ("files:\n- path: /etc/x\n  mode: 644\n", "files[0].mode"),
        ("files:\n- path: \"\"\n", "files[0].path: path is empty"),
        (
            "files:\n- path: etc/x\n",
            "files[0].path: path \"etc/x\" is relative",
        ),
    ] {
        let p = node.spec("bad.yaml", yaml);
        for cmd in ["coverage", "apply"] {
            let o = node.ctl(&[cmd, "-f", &p]);
            assert_eq!(o.status.code(), Some(2), "{cmd} {yaml}: {}", err(&o));
            let e = err(&o);
            let first = e.lines().next().unwrap_or_default();
            assert!(
                first.starts_with("inplacectl: error: ") && first.contains(want),
                "{cmd} {yaml}: {e}"
            );
            assert!(
                !e.contains("panicked") && !e.contains("RUST_BACKTRACE"),
                "{e}"
            );
        }
    }
    // the server says INVALID_ARGUMENT for a bad wire spec
    let bad = pb::NodeSpec {
        files: vec![pb::File {
            path: "relative/x".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let e = node
        .client()
        .await
        .get_coverage(pb::GetCoverageRequest {
            desired: Some(bad),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("files[0].path"), "{}", e.message());
}
