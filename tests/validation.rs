//! Every entry point validates the same way (issue 20 §3): each identifier that becomes a
//! file name (operation ids, drop-in names) is checked by one rule in every RPC and
//! `inplacectl` command that takes it, answered `INVALID_ARGUMENT` naming the rule; and
//! no error shows the state directory's path to a caller who is not root on the node.

mod common;

use common::{Node, err, spec};
use inplace_wire::pb;
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
