//! `Inspect`, black box on a fixture copy: the parts asked for, each what `GetStatus`,
//! `ListOperations` and `GetCoverage` return; a spec the agent refuses comes back as
//! `coverage_error` with GetCoverage's status, next to the rest; the wire limits of
//! `GetCoverage` and `Apply` apply to it too.

mod common;

use common::{Node, apply, status};
use inplace_wire::pb;

const SPEC: &str = "sysctls:\n  vm.max_map_count: \"262144\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_returns_what_the_three_calls_return() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let mut c = node.client().await;
    let desired = common::spec(SPEC);

    // nothing asked: only the recommendation
    let r = c
        .inspect(pb::InspectRequest::default())
        .await
        .unwrap()
        .into_inner();
    let st = status(&node).await;
    assert_eq!(r.status, None);
    assert!(r.operations.is_empty() && r.coverage.is_none() && r.coverage_error.is_none());
    assert_eq!(r.preservation, st.preservation);

    apply(&node, "sysctls:\n  vm.swappiness: \"10\"\n", "first").await;
    let r = c
        .inspect(pb::InspectRequest {
            desired: Some(desired.clone()),
            status: true,
            operations: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let report = common::coverage(&node, SPEC).await;
    assert_eq!(r.coverage.as_ref(), Some(&report));
    assert_eq!(r.operations, node.operations().await);
    assert_eq!(r.operations[0].id, "first");
    let (got, want) = (r.status.unwrap(), status(&node).await);
    assert_eq!(
        (&got.boot_id, &got.applied_spec_hash, &got.facts),
        (&want.boot_id, &want.applied_spec_hash, &want.facts)
    );
    assert_eq!(got.applied_spec_hash, r.operations[0].spec_hash);
    assert_eq!(r.preservation, report.preservation);

    // a spec the agent refuses: GetCoverage's status, inside the answer
    let bad = pb::NodeSpec {
        files: vec![pb::File {
            path: "etc/relative".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let want = c
        .get_coverage(pb::GetCoverageRequest {
            desired: Some(bad.clone()),
            reboot_policy: 0,
            diff: None,
        })
        .await
        .unwrap_err();
    let r = c
        .inspect(pb::InspectRequest {
            desired: Some(bad),
            status: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let e = r.coverage_error.expect("a coverage error");
    assert_eq!(
        (e.code, e.message.as_str()),
        (tonic::Code::InvalidArgument as i32, want.message())
    );
    assert!(r.coverage.is_none() && r.status.is_some() && r.preservation.is_some());

    // the wire limits hold: the whole call is refused before it is decoded
    let many = pb::NodeSpec {
        files: (0..1001)
            .map(|i| pb::File {
                path: format!("/etc/f{i}"),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let e = c
        .inspect(pb::InspectRequest {
            desired: Some(many),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("(policy.max_files)"),
        "{}",
        e.message()
    );
    node.stop();
}
