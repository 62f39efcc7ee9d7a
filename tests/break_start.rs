//! Breaking the start of an operation (merge 564d28a), black box: `Apply` is checked and
//! planned on the operation thread that then runs it, and answered through a oneshot
//! before it runs (`crates/agent/src/apply/start.rs`); the operation heads read while
//! racily clean are kept while their stamp holds (`state/operations.rs`
//! `operation_heads`); the history is pruned from one stamped listing
//! (`Sysroot::list_dir_stamped`).
//!
//! Concurrent applies (one runs, the rest are ABORTED, the slot is freed after every
//! refusal and planning error), a client that goes away before the answer, a bad spec
//! (INVALID_ARGUMENT naming the field, nothing written), applies racing coverage and
//! watchers, revert ids, a SIGKILL right after the accepted answer, back-to-back
//! operations with status and history between them, operation files edited in place,
//! removed or replaced, and entries of other kinds in `operations/`.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use inplace_wire::pb;
use inplace_wire::pb::Phase;

/// A spec of one file with `tag` in its content (each tag a different change).
fn one_file(tag: &str) -> String {
    format!("files:\n- path: /etc/break-start/{tag}.conf\n  content: \"{tag}\\n\"\n")
}

fn req(yaml: &str, id: &str) -> pb::ApplyRequest {
    pb::ApplyRequest {
        desired: Some(spec(yaml)),
        operation_id: id.into(),
        ..Default::default()
    }
}

fn keep(node: &Node, n: usize) {
    std::fs::write(&node.config, format!("[history]\nkeep = {n}\n")).unwrap();
}

/// The operation files (names) in the state directory, sorted.
fn op_files(node: &Node) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(node.state.join("operations"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The agent takes a new operation and runs it to Succeeded (its slot is free).
async fn slot_is_free(node: &Node, tag: &str) {
    let op = apply(node, &one_file(tag), tag).await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{tag}: {}", op.message);
    assert_eq!(
        node.read(&format!("/etc/break-start/{tag}.conf")),
        format!("{tag}\n")
    );
}

/// Waits until the agent has no current operation (status), up to 30 s.
async fn idle(node: &Node) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(node).await.current_operation.is_some() {
        assert!(Instant::now() < deadline, "the agent stays busy");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Many applies with different ids at once: each is either accepted (and then runs to
/// Succeeded) or refused ABORTED naming the running operation; never another code, never
/// two running at once (the node ends with every accepted file and nothing else), and the
/// slot is free afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_applies_one_runs_the_rest_aborted_slot_freed() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    for round in 0..3 {
        let mut calls = Vec::new();
        for i in 0..12 {
            let mut c = node.client().await;
            let id = format!("r{round}-{i}");
            let r = req(&one_file(&id), &id);
            calls.push(tokio::spawn(async move { (id, c.apply(r).await) }));
        }
        let mut accepted = Vec::new();
        for c in calls {
            let (id, r) = c.await.unwrap();
            match r {
                Ok(op) => {
                    let op = op.into_inner();
                    assert_eq!(op.id, id);
                    assert!(
                        !inplace_wire::phase::is_settled(op.phase)
                            || op.phase == Phase::Succeeded as i32,
                        "{op:?}"
                    );
                    accepted.push(id);
                }
                Err(e) => {
                    assert_eq!(e.code(), tonic::Code::Aborted, "{id}: {e:?}");
                    assert!(e.message().contains("is running"), "{}", e.message());
                }
            }
        }
        assert!(!accepted.is_empty(), "round {round}: none accepted");
        for id in &accepted {
            assert_eq!(node.settle(id).await.phase, Phase::Succeeded as i32, "{id}");
        }
        // each spec is the whole desired state: the accepted ones ran one after the
        // other, and the last to run (the newest in the history) left its file alone
        let newest = node.operations().await[0].id.clone();
        assert!(
            accepted.contains(&newest),
            "{newest} not accepted: {accepted:?}"
        );
        for i in 0..12 {
            let id = format!("r{round}-{i}");
            assert_eq!(
                node.path(&format!("/etc/break-start/{id}.conf")).exists(),
                id == newest,
                "{id}: only the last accepted operation's file is there ({accepted:?})"
            );
        }
        idle(&node).await;
    }
    slot_is_free(&node, "after").await;
}

/// Bad specs, alone and racing good applies: a spec that does not parse is
/// INVALID_ARGUMENT naming the field, an uncovered one is refused after planning; nothing
/// is written to the node or the state directory, and the slot is freed each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_planning_error_names_the_field_writes_nothing_and_frees_the_slot() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    slot_is_free(&node, "first").await;
    idle(&node).await;
    let root = snapshot(&node.root);
    let state = snapshot(&node.state);
    let relative = "files:\n- path: etc/relative.conf\n  content: \"x\\n\"\n";
    let e = apply_refused(&node, relative, "bad-path").await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("files[0].path"), "{}", e.message());
    let uncovered = "sysctls:\n  vm.nosuch: \"1\"\n";
    let e = apply_refused(&node, uncovered, "uncovered").await;
    assert_ne!(e.code(), tonic::Code::Ok);
    assert!(e.message().contains("vm.nosuch"), "{e:?}");
    let e = apply_refused(&node, &one_file("x"), "x.revert").await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("operation_id"), "{}", e.message());
    let hashed = format!("revert.{}", "0a".repeat(16));
    let e = apply_refused(&node, &one_file("x"), &hashed).await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // a try of a reboot-level change: refused after planning, naming try_seconds
    let e = node
        .client()
        .await
        .apply(pb::ApplyRequest {
            try_seconds: 30,
            ..req("kernelArgs: [nosmt]\n", "reboot-try")
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("try_seconds"), "{}", e.message());
    for id in ["bad-path", "uncovered", "x.revert", "reboot-try"] {
        let r = node
            .client()
            .await
            .get_operation(pb::GetOperationRequest { id: id.into() })
            .await;
        assert_eq!(r.unwrap_err().code(), tonic::Code::NotFound, "{id}");
    }
    assert!(snapshot(&node.root) == root, "the node changed");
    assert!(
        snapshot(&node.state) == state,
        "the state directory changed"
    );
    // bad and good at once: the bad ones never take the slot from a good one for good
    let mut calls = Vec::new();
    for i in 0..10 {
        let mut c = node.client().await;
        let (yaml, id) = match i % 3 {
            0 => (relative.to_string(), format!("bad-{i}")),
            1 => (uncovered.to_string(), format!("unc-{i}")),
            _ => (one_file(&format!("good-{i}")), format!("good-{i}")),
        };
        let r = req(&yaml, &id);
        calls.push(tokio::spawn(async move { (id, c.apply(r).await) }));
    }
    for c in calls {
        let (id, r) = c.await.unwrap();
        if id.starts_with("bad") {
            assert_eq!(r.unwrap_err().code(), tonic::Code::InvalidArgument, "{id}");
        } else if id.starts_with("unc") {
            let e = r.unwrap_err();
            assert!(
                e.code() == tonic::Code::Aborted || e.message().contains("vm.nosuch"),
                "{id}: {e:?}"
            );
        } else if let Ok(op) = r {
            assert_eq!(
                node.settle(&op.into_inner().id).await.phase,
                Phase::Succeeded as i32
            );
        } else {
            assert_eq!(r.unwrap_err().code(), tonic::Code::Aborted, "{id}");
        }
    }
    idle(&node).await;
    slot_is_free(&node, "last").await;
}

/// Clients that go away before their answer (the call dropped at once, or after a few
/// ms): the daemon keeps answering, an operation it took runs to its end, none is left
/// half-started holding the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_goes_away_before_the_answer_leaves_no_stuck_slot() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    for (i, wait_us) in [0u64, 50, 200, 1000, 3000, 10000].into_iter().enumerate() {
        let id = format!("gone-{i}");
        let mut c = node.client().await;
        let r = req(&one_file(&id), &id);
        let call = tokio::spawn(async move { c.apply(r).await });
        tokio::time::sleep(Duration::from_micros(wait_us)).await;
        call.abort();
        let _ = call.await;
        // the operation either never started or runs to its end
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = node
                .client()
                .await
                .get_operation(pb::GetOperationRequest { id: id.clone() })
                .await;
            match r {
                Ok(op) if inplace_wire::phase::is_settled(op.get_ref().phase) => {
                    assert_eq!(op.into_inner().phase, Phase::Succeeded as i32, "{id}");
                    break;
                }
                Err(e)
                    if e.code() == tonic::Code::NotFound
                        && status(&node).await.current_operation.is_none() =>
                {
                    // not started (or not yet visible): it must not appear later
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let again = node
                        .client()
                        .await
                        .get_operation(pb::GetOperationRequest { id: id.clone() })
                        .await;
                    if let Ok(op) = again {
                        assert_eq!(
                            node.settle(&op.into_inner().id).await.phase,
                            Phase::Succeeded as i32
                        );
                    }
                    break;
                }
                _ => {}
            }
            assert!(Instant::now() < deadline, "{id} never settled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        idle(&node).await;
    }
    slot_is_free(&node, "after").await;
}

/// An apply racing coverage of the same spec and a watcher of its id: coverage always
/// answers (never an error from the running operation), the watcher (once the id is
/// known) replays to the end, and the apply succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_apply_racing_coverage_and_watchers() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    for round in 0..3 {
        let id = format!("race-{round}");
        let yaml = workload().replace("new content", &format!("content of {id}"));
        let mut cov = Vec::new();
        for _ in 0..4 {
            let mut c = node.client().await;
            let s = spec(&yaml);
            cov.push(tokio::spawn(async move {
                c.get_coverage(pb::GetCoverageRequest {
                    desired: Some(s),
                    ..Default::default()
                })
                .await
            }));
        }
        let watch = {
            let mut c = node.client().await;
            let id = id.clone();
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    match c
                        .watch_operation(pb::WatchOperationRequest { id: id.clone() })
                        .await
                    {
                        Ok(s) => {
                            let mut s = s.into_inner();
                            let mut last = 0;
                            while let Some(ev) = s.message().await.unwrap() {
                                last = ev.operation.unwrap().phase;
                            }
                            return last;
                        }
                        Err(e) => {
                            assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
                            assert!(Instant::now() < deadline);
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                    }
                }
            })
        };
        let op = apply(&node, &yaml, &id).await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
        for c in cov {
            c.await.unwrap().expect("coverage during an apply answers");
        }
        assert_eq!(
            watch.await.unwrap(),
            Phase::Succeeded as i32,
            "{id}: watcher's last phase"
        );
    }
}

/// An apply refused while a timed try waits, and the try's revert id refused even while
/// the try runs; a confirm racing the try's start never confirms before it waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revert_ids_and_applies_during_a_try() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let mut c = node.client().await;
    let first = c
        .apply(pb::ApplyRequest {
            try_seconds: 30,
            ..req(&one_file("tried"), "tried")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.id, "tried");
    // the revert id is refused at once, whatever the try's state
    let e = apply_refused(&node, &one_file("rv"), "tried.revert").await;
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("operation_id"), "{}", e.message());
    // confirm as soon as possible
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match c
            .confirm(pb::ConfirmRequest {
                operation_id: "tried".into(),
            })
            .await
        {
            Ok(_) => break,
            Err(e) => {
                assert!(Instant::now() < deadline, "never confirmable: {e:?}");
                // while it is not yet waiting, another apply is refused
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
    let op = node.settle("tried").await;
    assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
    assert_eq!(node.read("/etc/break-start/tried.conf"), "tried\n");
    idle(&node).await;
    slot_is_free(&node, "after-try").await;
}

/// SIGKILL right after the accepted answer, at several delays: the next start settles the
/// operation per the journal (every file entirely old or entirely new, the operation
/// settled or never written), and the agent takes the next operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_right_after_the_accepted_answer_recovers_per_the_journal() {
    stopped_right_after_the_accepted_answer(nix::sys::signal::Signal::SIGKILL).await;
}

/// The same with SIGTERM (the daemon stops serving and exits while the operation it just
/// accepted runs on its own thread).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminated_right_after_the_accepted_answer_recovers_per_the_journal() {
    stopped_right_after_the_accepted_answer(nix::sys::signal::Signal::SIGTERM).await;
}

async fn stopped_right_after_the_accepted_answer(signal: nix::sys::signal::Signal) {
    use std::os::unix::process::ExitStatusExt;
    let yaml = workload();
    for delay_ms in [0u64, 1, 3, 10] {
        let mut node = Node::new("ubuntu-2404-grub");
        let before = snapshot(&node.root);
        node.start();
        let pid = node.pid().unwrap() as i32;
        let op = node
            .client()
            .await
            .apply(req(&yaml, "killed"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(op.id, "killed");
        if delay_ms > 0 {
            std::thread::sleep(Duration::from_millis(delay_ms));
        }
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal).unwrap();
        let st = node.wait_exit(Duration::from_secs(10)).expect("died");
        if signal == nix::sys::signal::Signal::SIGKILL {
            assert_eq!(st.signal(), Some(9));
        }
        eprintln!("{signal:?} after {delay_ms} ms: exit {st:?}");
        node.start();
        let settled = match node
            .client()
            .await
            .get_operation(pb::GetOperationRequest {
                id: "killed".into(),
            })
            .await
        {
            Ok(_) => Some(node.settle("killed").await),
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::NotFound, "{delay_ms} ms: {e:?}");
                None
            }
        };
        eprintln!(
            "{signal:?} after {delay_ms} ms: {:?}",
            settled
                .as_ref()
                .map(|o| (Phase::try_from(o.phase), o.message.clone()))
        );
        let after = snapshot(&node.root);
        let done = std::fs::read_to_string(node.path("/etc/crash/f00.conf")).ok()
            == Some("new content 0\n".to_string());
        for i in 0..20 {
            let p = node.path(&format!("/etc/crash/f{i:02}.conf"));
            let new = std::fs::read_to_string(&p).ok() == Some(format!("new content {i}\n"));
            assert_eq!(
                new, done,
                "{delay_ms} ms: f{i:02} differs from f00 ({settled:?})"
            );
        }
        match &settled {
            None => assert!(
                after == before,
                "{delay_ms} ms: unknown operation but the node changed"
            ),
            Some(op) if op.phase == Phase::Succeeded as i32 => assert!(done, "{op:?}"),
            Some(op) => {
                assert!(!done, "{delay_ms} ms: {op:?} with the new files");
                assert!(
                    after == before,
                    "{delay_ms} ms: {op:?} but the node changed"
                );
            }
        }
        // the slot is free, and the same id runs (again or at last) to its end
        let op = apply(&node, &yaml, "killed").await;
        assert_eq!(
            op.phase,
            Phase::Succeeded as i32,
            "{delay_ms} ms: {}",
            op.message
        );
        slot_is_free(&node, &format!("after-{delay_ms}")).await;
    }
}

/// Operations back to back with status and history read between them (heads read while
/// racily clean): every status and history is right at once, and the history is pruned to
/// `keep`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_operations_with_status_and_history_between() {
    let mut node = Node::new("ubuntu-2404-grub");
    keep(&node, 3);
    node.start();
    let mut ids = Vec::new();
    for i in 0..8 {
        let id = format!("b2b-{i}");
        // kernel args every third: waits for a reboot (the status must name it at once)
        let yaml = if i % 3 == 2 {
            format!("kernelArgs: [\"b2b={i}\"]\n")
        } else {
            one_file(&id)
        };
        let op = apply(&node, &yaml, &id).await;
        let s = status(&node).await;
        if i % 3 == 2 {
            assert_eq!(op.phase, Phase::RebootRequired as i32, "{}", op.message);
            assert_eq!(s.pending_reboot_operation, id, "status right after {id}");
        } else {
            assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
            assert_eq!(
                s.pending_reboot_operation, "",
                "status right after {id}: superseded"
            );
        }
        ids.push(id.clone());
        let hist: Vec<String> = node.operations().await.into_iter().map(|o| o.id).collect();
        assert_eq!(hist.first(), Some(&id), "{hist:?}");
    }
    let want: Vec<String> = ids.iter().rev().take(3).cloned().collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let hist: Vec<String> = node.operations().await.into_iter().map(|o| o.id).collect();
        if hist == want {
            break;
        }
        assert!(Instant::now() < deadline, "history {hist:?}, want {want:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `v` as JSON of exactly `len` bytes: compact, its `message` cut short while longer
/// (a phase's name may be longer than the one it replaces), then padded with spaces.
fn to_len(mut v: serde_json::Value, len: usize) -> Vec<u8> {
    let mut b = serde_json::to_vec(&v).unwrap();
    while b.len() > len {
        let mut m = v["message"].as_str().expect("a message to cut").to_string();
        assert!(m.pop().is_some(), "nothing left to cut to {len} bytes");
        v["message"] = m.into();
        b = serde_json::to_vec(&v).unwrap();
    }
    b.resize(len, b' ');
    b
}

/// Rewrites operation `id`'s file in place (same inode, same size) with phase `phase`
/// (the agent writes compact JSON; the edit keeps the length).
fn rewrite_in_place(state: &Path, id: &str, phase: Phase) {
    use std::io::{Seek, Write};
    let p = state.join("operations").join(format!("{id}.json"));
    let old = std::fs::read(&p).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&old).unwrap();
    v["phase"] = phase.as_str_name().into();
    let new = to_len(v, old.len());
    serde_json::from_slice::<serde_json::Value>(&new).expect("still JSON");
    let mut f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.seek(std::io::SeekFrom::Start(0)).unwrap();
    f.write_all(&new).unwrap();
}

/// An operation file edited in place (same size, same inode) while its head is racily
/// clean (right after the operation, while the status had just read it): the status shows
/// the file's phase once the racy window has passed, and again after every edit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_file_edited_in_place_in_the_racy_window_is_seen() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    for round in 0..4 {
        let id = format!("edit-{round}");
        let op = apply(&node, &one_file(&id), &id).await;
        assert_eq!(op.phase, Phase::Succeeded as i32);
        // read while racily clean, then edited at once
        assert_eq!(status(&node).await.pending_reboot_operation, "");
        rewrite_in_place(&node.state, &id, Phase::RebootRequired);
        let _ = status(&node).await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(
            status(&node).await.pending_reboot_operation,
            id,
            "round {round}: the in-place edit is not seen"
        );
        // and back, past the window (the head now kept): the edit changes the stamp
        rewrite_in_place(&node.state, &id, Phase::Succeeded);
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(
            status(&node).await.pending_reboot_operation,
            "",
            "round {round}: the edit back is not seen"
        );
    }
}

/// Operation files removed, replaced (by a rename) and truncated under the agent: status
/// and history keep answering and show what is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operation_files_removed_or_replaced_under_the_agent() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    for i in 0..3 {
        let id = format!("rm-{i}");
        assert_eq!(
            apply(&node, &one_file(&id), &id).await.phase,
            Phase::Succeeded as i32
        );
        let _ = status(&node).await;
    }
    let ops = node.state.join("operations");
    std::fs::remove_file(ops.join("rm-1.json")).unwrap();
    let s = status(&node).await;
    assert_eq!(s.pending_reboot_operation, "");
    let hist: Vec<String> = node.operations().await.into_iter().map(|o| o.id).collect();
    assert_eq!(hist, ["rm-2", "rm-0"]);
    // rm-2 replaced by a rename with a copy in RebootRequired
    let mut v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ops.join("rm-2.json")).unwrap()).unwrap();
    v["phase"] = Phase::RebootRequired.as_str_name().into();
    std::fs::write(
        ops.join(".tmp-rm-2"),
        serde_json::to_vec_pretty(&v).unwrap(),
    )
    .unwrap();
    std::fs::rename(ops.join(".tmp-rm-2"), ops.join("rm-2.json")).unwrap();
    assert_eq!(status(&node).await.pending_reboot_operation, "rm-2");
    // truncated to nothing: skipped, never an error
    std::fs::write(ops.join("rm-2.json"), "").unwrap();
    let s = status(&node).await;
    assert_eq!(s.pending_reboot_operation, "");
    let hist: Vec<String> = node.operations().await.into_iter().map(|o| o.id).collect();
    assert_eq!(hist, ["rm-0"]);
    slot_is_free(&node, "after").await;
}

/// Files appearing and vanishing in `operations/` while status and history are asked and
/// operations run (entries gone between the listing and the stat or the read): never an
/// error.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn entries_vanishing_mid_listing_are_never_an_error() {
    let mut node = Node::new("ubuntu-2404-grub");
    keep(&node, 2);
    node.start();
    assert_eq!(
        apply(&node, &one_file("seed"), "seed").await.phase,
        Phase::Succeeded as i32
    );
    let ops = node.state.join("operations");
    let template: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ops.join("seed.json")).unwrap()).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (ops, stop) = (ops.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for j in 0..20 {
                    let id = format!("churn-{j}");
                    let mut v = template.clone();
                    v["id"] = id.clone().into();
                    v["created"] = "2020-01-01T00:00:00Z".into();
                    let p = ops.join(format!("{id}.json"));
                    let _ = std::fs::write(&p, serde_json::to_vec(&v).unwrap());
                }
                for j in 0..20 {
                    let _ = std::fs::remove_file(ops.join(format!("churn-{j}.json")));
                }
                n += 1;
            }
            n
        })
    };
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut i = 0;
    while Instant::now() < deadline {
        node.client()
            .await
            .get_status(pb::GetStatusRequest {})
            .await
            .expect("status while entries vanish");
        node.client()
            .await
            .list_operations(pb::ListOperationsRequest {})
            .await
            .expect("history while entries vanish");
        if i % 5 == 0 {
            let id = format!("churned-{i}");
            let op = apply(&node, &one_file(&id), &id).await;
            assert_eq!(op.phase, Phase::Succeeded as i32, "{}", op.message);
        }
        i += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(churn.join().unwrap() > 0);
    status(&node).await;
    slot_is_free(&node, "after").await;
}

/// An entry of another kind named like an operation file in `operations/`.
fn odd_entry(ops: &Path, kind: &str) {
    let p = ops.join(format!("odd-{kind}.json"));
    match kind {
        "dir" => std::fs::create_dir(&p).unwrap(),
        "symlink" => std::os::unix::fs::symlink("/etc/hostname", &p).unwrap(),
        "dangling" => std::os::unix::fs::symlink("/nonexistent/x.json", &p).unwrap(),
        "fifo" => nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap(),
        "plain-dir" => std::fs::create_dir(ops.join("odd-dir-no-suffix")).unwrap(),
        _ => unreachable!(),
    }
}

/// An entry of another kind in `operations/` (`kind`): status, history, applies and the
/// prune keep working; the entry is left alone.
async fn odd_entry_case(kind: &str) {
    let mut node = Node::new("ubuntu-2404-grub");
    keep(&node, 2);
    node.start();
    assert_eq!(
        apply(&node, &one_file("pre"), "pre").await.phase,
        Phase::Succeeded as i32
    );
    let ops = node.state.join("operations");
    odd_entry(&ops, kind);
    // every symptom is collected, then named at once
    let mut faults = Vec::new();
    for i in 0..4 {
        let id = format!("{kind}-{i}");
        let op = apply(&node, &one_file(&id), &id).await;
        if op.phase != Phase::Succeeded as i32 {
            faults.push(format!("apply {id}: {:?} {}", op.phase, op.message));
        }
    }
    let s = node
        .client()
        .await
        .get_status(pb::GetStatusRequest {})
        .await;
    if let Err(e) = s {
        faults.push(format!("status: {:?} {}", e.code(), e.message()));
    }
    let h = node
        .client()
        .await
        .list_operations(pb::ListOperationsRequest {})
        .await;
    match h {
        Ok(h) => {
            let ids: Vec<String> = h
                .into_inner()
                .operations
                .into_iter()
                .map(|o| o.id)
                .collect();
            if ids.len() < 2 || ids[..2] != [format!("{kind}-3"), format!("{kind}-2")] {
                faults.push(format!("history: {ids:?}"));
            }
        }
        Err(e) => faults.push(format!("history: {:?} {}", e.code(), e.message())),
    }
    // pruned to 2 operation files beside the odd entry
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let files: Vec<String> = op_files(&node)
            .into_iter()
            .filter(|n| !n.starts_with("odd"))
            .collect();
        if files == [format!("{kind}-2.json"), format!("{kind}-3.json")] {
            break;
        }
        if Instant::now() > deadline {
            faults.push(format!("not pruned to keep = 2: {files:?}"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !op_files(&node).iter().any(|n| n.starts_with("odd")) {
        faults.push("the odd entry was removed".into());
    }
    // a restart works too, and the status then
    node.stop();
    node.start();
    if let Err(e) = node
        .client()
        .await
        .get_status(pb::GetStatusRequest {})
        .await
    {
        faults.push(format!(
            "status after a restart: {:?} {}",
            e.code(),
            e.message()
        ));
    }
    let tail: String = faults
        .iter()
        .map(|f| f.replace(&node.state.display().to_string(), "<state>"))
        .collect::<Vec<_>>()
        .join("\n  ");
    assert!(faults.is_empty(), "{kind}:\n  {tail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_without_the_suffix_in_operations_is_ignored() {
    odd_entry_case("plain-dir").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_named_like_an_operation_file_is_skipped() {
    odd_entry_case("dir").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_named_like_an_operation_file_is_skipped() {
    odd_entry_case("symlink").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dangling_symlink_named_like_an_operation_file_is_skipped() {
    odd_entry_case("dangling").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_named_like_an_operation_file_is_skipped() {
    odd_entry_case("fifo").await;
}

/// The default `history.keep` (50) with more files than that: 55 operation files (the
/// oldest 52 planted, ended), then two operations: pruned to the newest 50, the newest
/// first in the history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_operation_files_are_pruned_to_the_default_keep() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    assert_eq!(
        apply(&node, &one_file("tpl"), "tpl").await.phase,
        Phase::Succeeded as i32
    );
    let ops = node.state.join("operations");
    let template: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ops.join("tpl.json")).unwrap()).unwrap();
    for j in 0..52 {
        let mut v = template.clone();
        let id = format!("old-{j:02}");
        v["id"] = id.clone().into();
        v["created"] = format!("2020-01-01T00:{:02}:00Z", j).into();
        std::fs::write(
            ops.join(format!("{id}.json")),
            serde_json::to_vec_pretty(&v).unwrap(),
        )
        .unwrap();
    }
    for id in ["new-0", "new-1"] {
        assert_eq!(
            apply(&node, &one_file(id), id).await.phase,
            Phase::Succeeded as i32
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let files = op_files(&node);
        if files.len() == 50 {
            // the oldest five (old-00..old-04) went
            for j in 0..5 {
                assert!(!files.contains(&format!("old-{j:02}.json")), "{files:?}");
            }
            assert!(files.contains(&"new-1.json".to_string()));
            assert!(files.contains(&"tpl.json".to_string()));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} files: {files:?}",
            files.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let hist: Vec<String> = node.operations().await.into_iter().map(|o| o.id).collect();
    assert_eq!(hist.len(), 50);
    assert_eq!(hist[..3], ["new-1", "new-0", "tpl"]);
}

/// Concurrent applies with one id and a spec that is refused after planning (a large spec
/// whose last item is not covered): every caller is refused, or, when one is answered, the
/// operation it was given exists and settles. A caller must never be told "accepted" for
/// an operation that then never exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_applies_of_one_refused_spec_never_answer_a_ghost() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let yaml = refused_after_planning();
    let mut ghosts = Vec::new();
    for round in 0..10 {
        let id = format!("ghost-{round}");
        let mut calls = Vec::new();
        for _ in 0..6 {
            let mut c = node.client().await;
            let r = req(&yaml, &id);
            calls.push(tokio::spawn(async move { c.apply(r).await }));
        }
        for c in calls {
            match c.await.unwrap() {
                Err(e) => assert!(
                    e.message().contains("vm.nosuch") || e.code() == tonic::Code::Aborted,
                    "{e:?}"
                ),
                Ok(op) => {
                    let op = op.into_inner();
                    let found = node
                        .client()
                        .await
                        .get_operation(pb::GetOperationRequest { id: op.id.clone() })
                        .await;
                    if let Err(e) = found {
                        ghosts.push(format!(
                            "{id}: answered {:?} {:?}, then GetOperation {:?}",
                            Phase::try_from(op.phase),
                            op.message,
                            e.code()
                        ));
                    }
                }
            }
        }
        idle(&node).await;
    }
    assert!(
        node.path("/etc/ghost").read_dir().is_err(),
        "nothing written"
    );
    assert!(
        ghosts.is_empty(),
        "accepted, never existed:\n{}",
        ghosts.join("\n")
    );
    slot_is_free(&node, "after").await;
}

/// Applies racing a timed try: while it runs or waits for its confirmation every other
/// apply is ABORTED (naming the running operation or the waiting try); at its deadline
/// the revert runs under the revert id, and applies racing the revert are refused until
/// it ended; the node is back as before the try.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn applies_racing_a_try_and_its_revert() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    slot_is_free(&node, "base").await;
    idle(&node).await;
    let first = node
        .client()
        .await
        .apply(pb::ApplyRequest {
            try_seconds: 1,
            ..req(
                &format!(
                    "{}{}",
                    one_file("base").trim_end(),
                    "\n- path: /etc/break-start/t1.conf\n  content: \"t1\\n\"\n"
                ),
                "t1",
            )
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.id, "t1");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 0;
    let mut accepted = Vec::new();
    loop {
        let op = node
            .client()
            .await
            .get_operation(pb::GetOperationRequest { id: "t1".into() })
            .await
            .unwrap()
            .into_inner();
        if op.phase == Phase::RolledBack as i32 || op.phase == Phase::Failed as i32 {
            break;
        }
        assert!(Instant::now() < deadline, "the try never ended: {op:?}");
        let id = format!("spam-{n}");
        n += 1;
        match node.client().await.apply(req(&one_file(&id), &id)).await {
            Ok(op) => {
                // the try may have ended between the look and this apply
                accepted.push(op.into_inner().id);
                break;
            }
            Err(e) => assert_eq!(e.code(), tonic::Code::Aborted, "{id}: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t1 = node.settle("t1").await;
    assert_eq!(t1.phase, Phase::RolledBack as i32, "{}", t1.message);
    let revert = node.settle("t1.revert").await;
    assert_eq!(revert.phase, Phase::Succeeded as i32, "{}", revert.message);
    let at = |t: &Option<pbjson_types::Timestamp>| t.as_ref().map(|t| (t.seconds, t.nanos));
    // an apply accepted in the race ran only after the revert had ended
    for id in &accepted {
        let op = node.settle(id).await;
        assert_eq!(op.phase, Phase::Succeeded as i32, "{id}: {}", op.message);
        assert!(
            at(&op.created) >= at(&revert.updated),
            "{id} (created {:?}) was accepted before the revert ended ({:?})",
            op.created,
            revert.updated
        );
    }
    assert!(!node.path("/etc/break-start/t1.conf").exists(), "reverted");
    if accepted.is_empty() {
        assert_eq!(node.read("/etc/break-start/base.conf"), "base\n");
    }
    idle(&node).await;
    slot_is_free(&node, "after").await;
}

/// A watcher of an id whose apply is still planning, when the planning is refused: its
/// stream must end in a settled phase or with an error, never end OK at "planning" (a
/// watcher, like `inplacectl apply --wait`, would take it for an operation that stopped
/// without an outcome).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watcher_of_a_refused_apply_never_ends_at_planning() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let yaml = refused_after_planning();
    let mut endings = Vec::new();
    for round in 0..10 {
        let id = format!("watched-{round}");
        let watch = {
            let mut c = node.client().await;
            let id = id.clone();
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(5);
                while Instant::now() < deadline {
                    if let Ok(s) = c
                        .watch_operation(pb::WatchOperationRequest { id: id.clone() })
                        .await
                    {
                        let mut s = s.into_inner();
                        let mut last = None;
                        loop {
                            match s.message().await {
                                Ok(Some(ev)) => last = ev.operation,
                                Ok(None) => return Some(Ok(last)),
                                Err(e) => return Some(Err(e.code())),
                            }
                        }
                    }
                    tokio::task::yield_now().await;
                }
                None
            })
        };
        tokio::time::sleep(Duration::from_millis(2)).await;
        let e = apply_refused(&node, &yaml, &id).await;
        assert!(e.message().contains("vm.nosuch"), "{e:?}");
        watch.abort();
        if let Ok(Some(Ok(Some(op)))) = watch.await
            && !inplace_wire::phase::is_settled(op.phase)
        {
            endings.push(format!(
                "{id}: stream ended OK at {:?} {:?}",
                Phase::try_from(op.phase),
                op.message
            ));
        }
        idle(&node).await;
    }
    assert!(endings.is_empty(), "{}", endings.join("\n"));
}

/// A spec refused only after planning: 300 files of 200 bytes (planning takes a while),
/// then a sysctl no node has (`vm.nosuch`), which is not covered.
fn refused_after_planning() -> String {
    let mut yaml = String::from("files:\n");
    for i in 0..300 {
        yaml.push_str(&format!(
            "- path: /etc/ghost/f{i:03}.conf\n  content: \"{}\\n\"\n",
            "x".repeat(200)
        ));
    }
    yaml.push_str("sysctls:\n  vm.nosuch: \"1\"\n");
    yaml
}
