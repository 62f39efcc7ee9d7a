//! Crash safety (issue 4): the agent killed with SIGKILL at every failpoint, health-gated
//! commit, quarantine of a corrupt record, concurrent idempotent applies, drift.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;

use common::{Node, apply, coverage, snapshot, spec, status};
use inplace_wire::pb;
use inplace_wire::pb::Phase;

/// 20 files, a kubelet config change and a sysctl (the crash workload).
fn workload() -> String {
    let mut y = String::from("files:\n");
    for i in 0..20 {
        y.push_str(&format!(
            "- path: /etc/crash/f{i:02}.conf\n  content: \"new content {i}\\n\"\n"
        ));
    }
    y.push_str(
        "- path: /etc/sysctl.d/90-tuning.conf\n  content: \"vm.max_map_count = 262144\\n\"\n",
    );
    y.push_str(
        "kubelet:\n  config:\n    serializeImagePulls: false\nsysctls:\n  vm.swappiness: \"10\"\n",
    );
    y
}

fn temp_files(root: &Path) -> Vec<String> {
    snapshot(root)
        .into_iter()
        .map(|(p, _, _)| p.display().to_string())
        .filter(|p| p.contains(".inplaced-") && p.ends_with(".tmp"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_every_failpoint_recovers_to_old_or_new() {
    let yaml = workload();
    let failpoints = [
        "stage",
        "write-temp",
        "write",
        "write:7",
        "write:22",
        "sysctl",
        "act",
        "record",
        "applied",
    ];
    // the new state, from a run without a crash
    let mut clean = Node::new("ubuntu-2404-grub");
    clean.start();
    assert_eq!(
        apply(&clean, &yaml, "crash").await.phase,
        Phase::Succeeded as i32
    );
    let new: BTreeMap<_, _> = snapshot(&clean.root)
        .into_iter()
        .map(|(p, c, m)| (p.strip_prefix(&clean.root).unwrap().to_path_buf(), (c, m)))
        .collect();
    clean.stop();

    for fp in failpoints {
        let mut node = Node::new("ubuntu-2404-grub");
        let old: BTreeMap<_, _> = snapshot(&node.root)
            .into_iter()
            .map(|(p, c, m)| (p.strip_prefix(&node.root).unwrap().to_path_buf(), (c, m)))
            .collect();
        node.die_at(fp, &yaml).await;
        node.start();
        let op = node.settle("crash").await;
        let after: BTreeMap<_, _> = snapshot(&node.root)
            .into_iter()
            .map(|(p, c, m)| (p.strip_prefix(&node.root).unwrap().to_path_buf(), (c, m)))
            .collect();
        assert!(
            temp_files(&node.root).is_empty(),
            "{fp}: temp files left: {:?}",
            temp_files(&node.root)
        );
        match Phase::try_from(op.phase).unwrap() {
            // stopped before its intent was complete: nothing to roll back
            Phase::Failed => {
                assert!(
                    op.message.starts_with("interrupted:")
                        && op.message.contains("nothing was changed"),
                    "{fp}: {}",
                    op.message
                );
                assert_eq!(after, old, "{fp}: the old state exactly");
            }
            // rolled back from the journal at start: the phase says so (issue 20 §5)
            Phase::RolledBack => {
                assert!(
                    op.message.starts_with("interrupted:")
                        && op
                            .message
                            .contains("rolled back from the write-ahead journal"),
                    "{fp}: {}",
                    op.message
                );
                assert_eq!(after, old, "{fp}: rolled back to the old state exactly");
            }
            Phase::Succeeded => {
                assert_eq!(after, new, "{fp}: rolled forward to the new state exactly");
            }
            p => panic!("{fp}: unexpected phase {p:?}: {}", op.message),
        }
        // every file is entirely old or entirely new (a stricter restatement of the above)
        for (path, content) in &after {
            assert!(
                old.get(path) == Some(content) || new.get(path) == Some(content),
                "{fp}: {} is neither old nor new",
                path.display()
            );
        }
        // re-applying with the same id converges
        let op = apply(&node, &yaml, "crash").await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{fp}: {op:?}");
        assert!(
            coverage(&node, &yaml).await.changes.is_empty(),
            "{fp}: not converged"
        );
        // ownership survived: dropping the spec removes what the agent created
        assert_eq!(
            apply(&node, "{}\n", "drop").await.phase,
            Phase::Succeeded as i32
        );
        assert!(
            !node.path("/etc/crash/f00.conf").exists(),
            "{fp}: created file not owned"
        );
        assert!(
            !node.path("/etc/crash").exists(),
            "{fp}: created directory left"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_reboot_required_stays_reboot_required() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.die_at("reboot-required", "kernelArgs: [nosmt]\n")
        .await;
    node.start();
    let op = node.settle("crash").await;
    assert_eq!(op.phase, Phase::RebootRequired as i32, "{op:?}");
    node.stop();
    node.start();
    assert_eq!(
        node.settle("crash").await.phase,
        Phase::RebootRequired as i32
    );
    assert!(!node.actions().iter().any(|a| a.starts_with("reboot")));
}

/// A one-route HTTP server answering `status` to every request, for `n` requests at most.
fn fake_healthz(status: u16) -> (String, std::thread::JoinHandle<()>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/healthz", l.local_addr().unwrap());
    let h = std::thread::spawn(move || {
        for s in l.incoming().take(50) {
            let Ok(mut s) = s else { break };
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let reason = if status == 200 {
                "OK"
            } else {
                "Internal Server Error"
            };
            let _ = write!(
                s,
                "HTTP/1.1 {status} {reason}\r\ncontent-length: 2\r\nconnection: close\r\n\r\nno"
            );
        }
    });
    (url, h)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhealthy_kubelet_rolls_back_and_restarts_again() {
    let (url, _server) = fake_healthz(500);
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(
        &node.config,
        format!("[kubelet]\nhealthz_url = \"{url}\"\nhealth_timeout_secs = 1\n"),
    )
    .unwrap();
    let config_before = node.read("/var/lib/kubelet/config.yaml");
    let flags_before = node.read("/var/lib/kubelet/kubeadm-flags.env");
    node.start();
    let op = apply(
        &node,
        "kubelet:\n  config:\n    serializeImagePulls: false\n  flags:\n    max-pods: \"250\"\n",
        "sick",
    )
    .await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{op:?}");
    // the whole message, the times the checks took aside: the cause, the undo, the
    // restart and the kubelet's health after it, and nothing that contradicts them
    let parts: Vec<&str> = op.message.split("(checked for ").collect();
    let timeless = parts[1..].iter().fold(parts[0].to_string(), |m, p| {
        format!(
            "{m}(checked for _s){}",
            p.split_once("s)").map_or(*p, |(_, r)| r)
        )
    });
    let unhealthy = format!("GET {url} answered 500 Internal Server Error (checked for _s)");
    assert_eq!(
        timeless,
        format!(
            "kubelet health check failed: {unhealthy}; 2 step(s) undone, the node is as before; kubelet.service restarted; the kubelet is still unhealthy: {unhealthy}"
        ),
        "{}",
        op.message
    );
    assert_eq!(node.read("/var/lib/kubelet/config.yaml"), config_before);
    assert_eq!(
        node.read("/var/lib/kubelet/kubeadm-flags.env"),
        flags_before
    );
    assert_eq!(
        node.actions(),
        vec!["restart kubelet.service", "restart kubelet.service"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_healthz_is_a_failure_and_a_healthy_one_passes() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(
        &node.config,
        "[kubelet]\nhealthz_url = \"http://127.0.0.1:9/healthz\"\nhealth_timeout_secs = 1\n",
    )
    .unwrap();
    node.start();
    let op = apply(&node, "kubelet:\n  flags:\n    max-pods: \"250\"\n", "down").await;
    assert_eq!(op.phase, Phase::RolledBack as i32, "{op:?}");
    assert!(op.message.contains("unreachable"), "{}", op.message);
    node.stop();

    let (url, _server) = fake_healthz(200);
    std::fs::write(
        &node.config,
        format!("[kubelet]\nhealthz_url = \"{url}\"\n"),
    )
    .unwrap();
    node.start();
    let op = apply(&node, "kubelet:\n  flags:\n    max-pods: \"250\"\n", "up").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
    assert!(
        op.actions.contains(&"kubelet healthy".to_string()),
        "{:?}",
        op.actions
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_record_is_moved_aside_and_named_in_status() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    apply(&node, "kubelet:\n  flags:\n    max-pods: \"250\"\n", "one").await;
    node.stop();
    let p = node.state.join("applied.json");
    let text = std::fs::read(&p).unwrap();
    std::fs::write(&p, &text[..text.len() / 2]).unwrap();
    node.start();
    let s = status(&node).await;
    assert_eq!(s.problems.len(), 1, "{s:?}");
    assert!(
        s.problems[0].contains("did not parse") && s.problems[0].contains("applied.json.corrupt-"),
        "{}",
        s.problems[0]
    );
    let moved = std::fs::read_dir(&node.state)
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("applied.json.corrupt-")
        });
    assert!(moved);
    let op = apply(&node, "kubelet:\n  flags:\n    max-pods: \"300\"\n", "two").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{op:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_concurrent_applies_with_one_id_run_once() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let yaml = workload();
    let mut calls = Vec::new();
    for _ in 0..5 {
        let mut c = node.client().await;
        let s = spec(&yaml);
        calls.push(tokio::spawn(async move {
            c.apply(pb::ApplyRequest {
                desired: Some(s),
                operation_id: "same".into(),
                ..Default::default()
            })
            .await
        }));
    }
    for c in calls {
        let op = c.await.unwrap().unwrap().into_inner();
        assert_eq!(op.id, "same");
    }
    assert_eq!(node.settle("same").await.phase, Phase::Succeeded as i32);
    assert_eq!(
        node.actions(),
        vec!["restart kubelet.service"],
        "exactly one run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_is_reported_counted_across_restarts_and_never_repaired() {
    let mut node = Node::new("ubuntu-2404-grub");
    std::fs::write(&node.config, "[drift]\ninterval_secs = 1\n").unwrap();
    node.start();
    apply(&node, "files:\n- path: /etc/managed.conf\n  content: \"a\\n\"\nkubelet:\n  flags:\n    max-pods: \"250\"\n", "one").await;
    // another writer rewrites a managed file and the flags file
    std::fs::write(node.path("/etc/managed.conf"), "b\n").unwrap();
    let flags = node
        .read("/var/lib/kubelet/kubeadm-flags.env")
        .replace("--max-pods=250", "--max-pods=120");
    std::fs::write(node.path("/var/lib/kubelet/kubeadm-flags.env"), flags).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let seen = loop {
        let s = status(&node).await;
        if s.drift.len() == 2 || std::time::Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    let ids: Vec<&str> = seen.drift.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, ["files[/etc/managed.conf]", "kubelet.flags[max-pods]"]);
    assert!(seen.drift.iter().all(|d| d.since.is_some()));
    assert_eq!(seen.drift_detections, 2);
    // the watcher saw it and did nothing about it
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(node.read("/etc/managed.conf"), "b\n");
    assert_eq!(
        node.actions(),
        vec!["restart kubelet.service"],
        "no repair, no restart loop"
    );
    node.stop();
    node.start();
    let s = status(&node).await;
    assert_eq!(s.drift_detections, 2, "counted across restarts, not again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_during_staging_fails_cleanly() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.failpoints = Some("stage-enospc".into());
    let before = snapshot(&node.root);
    node.start();
    let op = apply(&node, &workload(), "full").await;
    assert_eq!(op.phase, Phase::Failed as i32, "{op:?}");
    assert!(
        op.message.contains("No space left on device")
            && op.message.contains("nothing was changed"),
        "{}",
        op.message
    );
    assert_eq!(snapshot(&node.root), before);
    assert!(!node.state.join("journal/full").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_successive_kubelet_changes_restart_after_the_last_write() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    apply(
        &node,
        "kubelet:\n  flags:\n    max-pods: \"200\"\n",
        "first",
    )
    .await;
    let op = apply(
        &node,
        "kubelet:\n  flags:\n    max-pods: \"210\"\n",
        "second",
    )
    .await;
    let w = op
        .actions
        .iter()
        .position(|a| a.starts_with("wrote /var/lib/kubelet/kubeadm-flags.env"))
        .unwrap();
    let r = op
        .actions
        .iter()
        .position(|a| a == "restarted kubelet.service")
        .unwrap();
    assert!(w < r, "{:?}", op.actions);
    assert_eq!(
        node.actions(),
        vec!["restart kubelet.service", "restart kubelet.service"]
    );
    assert!(
        node.read("/var/lib/kubelet/kubeadm-flags.env")
            .contains("--max-pods=210")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_applies_with_different_ids_run_one_and_abort_the_rest() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let yaml = workload();
    let mut calls = Vec::new();
    for i in 0..10 {
        let mut c = node.client().await;
        let s = spec(&yaml);
        calls.push(tokio::spawn(async move {
            c.apply(pb::ApplyRequest {
                desired: Some(s),
                operation_id: format!("op-{i}"),
                ..Default::default()
            })
            .await
        }));
    }
    let mut started = Vec::new();
    let mut aborted = 0;
    for c in calls {
        match c.await.unwrap() {
            Ok(op) => started.push(op.into_inner().id),
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::Aborted, "{e:?}");
                assert!(e.message().contains("is running"), "{}", e.message());
                aborted += 1;
            }
        }
    }
    // the first runs; a later one may start after it finished (then it finds nothing to do)
    assert!(!started.is_empty() && aborted + started.len() == 10);
    for id in &started {
        assert_eq!(node.settle(id).await.phase, Phase::Succeeded as i32);
    }
    assert_eq!(node.actions(), vec!["restart kubelet.service"]);
}
