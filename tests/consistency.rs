//! A consistent read under concurrent change: coverage asked from several
//! clients while operations create and delete many files never fails. A file that
//! disappears between two reads is a state of the node (absent), not an internal error.

mod common;

use common::{Node, spec};
use inplace_wire::pb;

/// Files in each apply.
const FILES: usize = 120;
/// Apply-then-remove rounds.
const ROUNDS: usize = 4;
/// Concurrent coverage clients.
const CLIENTS: usize = 4;

fn many_files() -> String {
    let mut y = String::from("files:\n");
    for i in 0..FILES {
        y.push_str(&format!(
            "- path: /etc/stress/f{i:03}.conf\n  content: \"value {i}\\n\"\n"
        ));
    }
    y
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coverage_during_applies_and_removals_of_many_files_never_errs() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let yaml = many_files();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (mut c, stop, desired) = (node.client().await, stop.clone(), spec(&yaml));
        clients.push(tokio::spawn(async move {
            let (mut calls, mut errors) = (0u64, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = c
                    .get_coverage(pb::GetCoverageRequest {
                        desired: Some(desired.clone()),
                        ..Default::default()
                    })
                    .await;
                calls += 1;
                if let Err(e) = r {
                    errors.push(format!("{:?}: {}", e.code(), e.message()));
                }
            }
            (calls, errors)
        }));
    }
    for round in 0..ROUNDS {
        let op = common::apply(&node, &yaml, &format!("fill-{round}")).await;
        assert_eq!(op.phase, pb::Phase::Succeeded as i32, "{op:?}");
        let op = common::apply(&node, "{}\n", &format!("empty-{round}")).await;
        assert_eq!(op.phase, pb::Phase::Succeeded as i32, "{op:?}");
        assert!(!node.path("/etc/stress/f000.conf").exists());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = 0;
    for c in clients {
        let (calls, errors) = c.await.unwrap();
        assert!(
            errors.is_empty(),
            "{} of {calls} calls failed: {errors:?}",
            errors.len()
        );
        total += calls;
    }
    assert!(total >= CLIENTS as u64, "the clients ran: {total} calls");
}
