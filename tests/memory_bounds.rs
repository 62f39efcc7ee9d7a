//! Memory no caller can make the agent or the extension take: the real
//! `inplaced` and `inplace-extension` binaries, given the largest requests their limits
//! admit, concurrently, with their peak resident memory (`VmHWM`) measured against the
//! bounds their deployments set: the unit's `MemoryMax=768M` (systemd/inplaced.service)
//! and the Deployment's `memory: 256Mi` (deploy/). Requests on loopback only, every burst
//! bounded in count and time.

mod common;

use base64::Engine as _;
use common::capi::{fixture, one_agent};
use common::*;
use inplace_wire::pb;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A process's `/proc/<pid>/status` field, bytes (`VmHWM`, `VmRSS`).
fn status_bytes(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    kb * 1024
}

fn mib(b: u64) -> u64 {
    b >> 20
}

/// The `Environment=` assignments of the agent's unit (none today: the allocator's
/// settings are built in), so the daemon under test runs as deployed.
fn unit_environment() -> Vec<(String, String)> {
    let unit = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/inplaced.service"),
    )
    .unwrap();
    unit.lines()
        .filter_map(|l| l.strip_prefix("Environment="))
        .flat_map(|l| l.split_whitespace())
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The unit's `MemoryMax=`, bytes.
fn unit_memory_max() -> u64 {
    let unit = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/inplaced.service"),
    )
    .unwrap();
    let v = unit
        .lines()
        .find_map(|l| l.strip_prefix("MemoryMax="))
        .expect("MemoryMax= in the unit");
    let n: u64 = v.trim_end_matches('M').parse().unwrap();
    n << 20
}

/// A NodeSpec of `n` sysctls (`net.x.k000000: "1"`, 16 bytes each on the wire: 3.2 MB for
/// 199 000, under `policy.max_spec_elements` 200 000 and `policy.max_spec_bytes`).
fn sysctls(n: usize) -> pb::NodeSpec {
    pb::NodeSpec {
        sysctls: (0..n)
            .map(|i| (format!("net.x.k{i:06}"), "1".to_string()))
            .collect(),
        ..Default::default()
    }
}

/// `n` GetCoverage calls of `spec` at once on their own connections; every answer.
async fn coverage_burst(
    node: &Node,
    spec: &pb::NodeSpec,
    n: usize,
) -> Vec<Result<pb::CoverageReport, tonic::Status>> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let mut c = node
            .client()
            .await
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20);
        let req = pb::GetCoverageRequest {
            desired: Some(spec.clone()),
            ..Default::default()
        };
        tasks.push(tokio::spawn(async move {
            c.get_coverage(req).await.map(|r| r.into_inner())
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(
            tokio::time::timeout(Duration::from_secs(300), t)
                .await
                .expect("coverage answered within 300 s")
                .unwrap(),
        );
    }
    out
}

/// Four in-limit specs of 199 000 sysctls at once (as many as
/// `policy.max_concurrent_coverage` plans): each is answered, the agent's peak stays
/// well under the unit's `MemoryMax` (before the memory reservation: 936 MB, over the
/// 768M at which systemd kills it), and after the burst its resident memory returns
/// near what it was (the daemon's allocator, see README "Security").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_largest_specs_at_once_stay_under_memory_max() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.env = unit_environment();
    node.start();
    let pid = node.pid().unwrap();
    let spec = sysctls(199_000);
    assert!(spec.sysctls.len() < 200_000);
    // one spec alone first: what one costs
    let base = status_bytes(pid, "VmRSS");
    let t = Instant::now();
    for r in coverage_burst(&node, &spec, 1).await {
        let r = r.expect("an in-limit spec is answered");
        assert_eq!(r.changes.len(), 199_000, "one change per sysctl");
    }
    let one = status_bytes(pid, "VmHWM");
    eprintln!(
        "measured: agent idle {} MiB, one 199 000-sysctl spec peaks at {} MiB ({:?})",
        mib(base),
        mib(one),
        t.elapsed()
    );
    let t = Instant::now();
    for r in coverage_burst(&node, &spec, 4).await {
        assert_eq!(r.expect("answered").changes.len(), 199_000);
    }
    let peak = status_bytes(pid, "VmHWM");
    eprintln!(
        "measured: four at once peak at {} MiB ({:?})",
        mib(peak),
        t.elapsed()
    );
    let max = unit_memory_max();
    assert!(
        peak < max / 2,
        "peak {} MiB: over half of the unit's MemoryMax {} MiB",
        mib(peak),
        mib(max)
    );
    // memory returns: with the unit's allocator settings most of what the burst freed goes
    // back to the kernel once the runtime's idle blocking threads have exited (10 s);
    // glibc keeps freed memory below chunks still in use at the top of its heaps (see
    // README "Security"), which the next request reuses
    let deadline = Instant::now() + Duration::from_secs(30);
    let bound = base + (peak - base) / 2;
    let mut after = status_bytes(pid, "VmRSS");
    while after > bound && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        after = status_bytes(pid, "VmRSS");
    }
    eprintln!(
        "measured: resident after the burst {} MiB (idle before {} MiB)",
        mib(after),
        mib(base)
    );
    assert!(
        after <= bound,
        "resident memory {} MiB after the burst: over half way from idle ({} MiB) to the peak ({} MiB)",
        mib(after),
        mib(base),
        mib(peak)
    );
}

/// The other shapes of a spec at its limits, four at once each: 1000 files of 63 KiB
/// (62 MiB of content, at `policy.max_spec_bytes`: the bytes-heavy member) and 199 000
/// NTP servers (strings in a list). Each is answered and the agent's peak stays under half
/// of the unit's `MemoryMax`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn other_largest_specs_at_once_stay_under_memory_max() {
    let content = vec![b'#'; 63 << 10];
    let files = pb::NodeSpec {
        files: (0..1000)
            .map(|i| pb::File {
                path: format!("/etc/bulk/{i}.conf"),
                content: content.clone(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let ntp = pb::NodeSpec {
        ntp: Some(pb::Ntp {
            servers: (0..199_000)
                .map(|i| format!("ntp{i}.example.invalid"))
                .collect(),
        }),
        ..Default::default()
    };
    for (what, spec) in [
        ("1000 files of 63 KiB", files),
        ("199 000 NTP servers", ntp),
    ] {
        // an agent of its own: VmHWM is the process's peak so far
        let mut node = Node::new("ubuntu-2404-grub");
        node.env = unit_environment();
        node.start();
        let pid = node.pid().unwrap();
        let t = Instant::now();
        for r in coverage_burst(&node, &spec, 4).await {
            r.unwrap_or_else(|e| panic!("{what}: {e:?}"));
        }
        let peak = status_bytes(pid, "VmHWM");
        eprintln!(
            "measured: four specs of {what} at once: agent peak {} MiB ({:?})",
            mib(peak),
            t.elapsed()
        );
        assert!(
            peak < unit_memory_max() / 2,
            "{what}: peak {} MiB",
            mib(peak)
        );
    }
}

/// A caller who may not make a call has not a byte of its message read: a reader's
/// `Apply` of a spec over `policy.max_spec_elements` is refused for its role (it used to
/// be decoded, and refused for its size), and four readers' `Apply` of the largest
/// in-limit spec, and four strangers' GetCoverage, cost the agent nothing measurable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_role_is_checked_before_the_message_is_read() {
    let mut node = Node::new("ubuntu-2404-grub");
    let port = common::pki::free_port();
    std::fs::write(
        &node.config,
        format!("[api.tcp]\nlisten = \"127.0.0.1:{port}\"\ninsecure_loopback = true\n"),
    )
    .unwrap();
    node.start();
    let pid = node.pid().unwrap();
    let reader = || async {
        let ch = tonic::transport::Endpoint::try_from(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        pb::node_agent_client::NodeAgentClient::new(ch).max_encoding_message_size(128 << 20)
    };
    let apply = |spec: pb::NodeSpec| pb::ApplyRequest {
        desired: Some(spec),
        operation_id: "not-yours".into(),
        ..Default::default()
    };
    // over the limit: refused for the role, not for the size
    let e = reader()
        .await
        .apply(apply(sysctls(250_000)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("needs the admin role"), "{e:?}");
    let before = status_bytes(pid, "VmHWM");
    let spec = Arc::new(sysctls(199_000));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (mut c, spec) = (reader().await, spec.clone());
        let req = apply((*spec).clone());
        tasks.push(tokio::spawn(async move { c.apply(req).await }));
    }
    for t in tasks {
        let e = t.await.unwrap().unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    }
    let after = status_bytes(pid, "VmHWM");
    eprintln!(
        "measured: agent peak {} MiB before, {} MiB after four refused 199 000-sysctl applies",
        mib(before),
        mib(after)
    );
    assert!(
        after < before + (16 << 20),
        "refused calls raised the peak from {} to {} MiB",
        mib(before),
        mib(after)
    );
    // a reader's coverage of the same spec is served
    let r = reader()
        .await
        .max_decoding_message_size(256 << 20)
        .get_coverage(pb::GetCoverageRequest {
            desired: Some(sysctls(1000)),
            ..Default::default()
        })
        .await
        .expect("a reader may ask for coverage");
    assert_eq!(r.into_inner().changes.len(), 1000);
    assert!(node.operations().await.is_empty(), "nothing was applied");
}

/// `n` cloud-init `files` entries, each 15 MiB of zeros gzipped and base64-encoded (about
/// 20 KB each: under the extension's 16 MiB per file, together far over a config's
/// decoded budget).
fn gzip_bombs(n: usize) -> Vec<Value> {
    use std::io::Write as _;
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    z.write_all(&vec![0u8; 15 << 20]).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(z.finish().unwrap());
    (0..n)
        .map(|i| json!({"path": format!("/etc/bombs/{i}.conf"), "encoding": "gzip+base64", "content": b64}))
        .collect()
}

fn add_files(files: &mut Value, more: &[Value]) {
    files.as_array_mut().unwrap().extend(more.iter().cloned());
}

/// The extension given small requests full of gzip bombs (twelve files of 15 MiB
/// inflated each, 240 KB of request), on each of the three hooks, four of each at once:
/// each answer names the limit on a bootstrap config's decoded files (CanUpdate: not
/// covered; UpdateMachine: nothing applied), and the extension's peak stays well under
/// the Deployment's `memory: 256Mi` (before the budget: 534 MB for a 181 KB request).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gzip_bombs_are_bounded_per_request() {
    let (_pki, node, ext) = one_agent("ubuntu-2404-grub", "site-a/edge-1-cp-7xk2p", |_| {});
    let ext = Arc::new(ext);
    let pid = ext.child.id();
    let bombs = gzip_bombs(12);
    let mut can = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    add_files(
        &mut can["desired"]["bootstrapConfig"]["spec"]["files"],
        &bombs,
    );
    let mut set = fixture("e-machineset-worker-template/canupdatemachineset-request.json");
    add_files(
        &mut set["desired"]["bootstrapConfigTemplate"]["spec"]["template"]["spec"]["files"],
        &bombs,
    );
    let update = json!({
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "kind": "UpdateMachineRequest",
        "settings": can["settings"],
        "desired": can["desired"],
    });
    let size = serde_json::to_vec(&update).unwrap().len();
    assert!(size < 300_000, "{size} bytes");
    let before = status_bytes(pid, "VmHWM");
    let hooks = [
        ("canupdatemachine/can-update-machine", can),
        ("canupdatemachineset/can-update-machineset", set),
        ("updatemachine/update-machine", update),
    ];
    let mut tasks = Vec::new();
    for (path, body) in hooks {
        for _ in 0..4 {
            let (ext, path, body) = (ext.clone(), path.to_string(), body.clone());
            tasks.push(tokio::spawn(async move {
                let r = tokio::time::timeout(
                    Duration::from_secs(120),
                    ext.post(
                        &format!("/hooks.runtime.cluster.x-k8s.io/v1alpha1/{path}"),
                        &body,
                    ),
                )
                .await
                .expect("answered within 120 s");
                (path, r)
            }));
        }
    }
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    let peak = status_bytes(pid, "VmHWM");
    eprintln!(
        "measured: extension peak {} MiB before, {} MiB after 12 requests of 12 gzip bombs",
        mib(before),
        mib(peak)
    );
    for (path, (status, v)) in answers {
        assert_eq!(status, 200, "{path}: {v}");
        let msg = v["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(
                "decode to more than 16777216 bytes in all (the extension's limit of decoded content per bootstrap config)"
            ),
            "{path}: {v}"
        );
        if path.starts_with("updatemachine") {
            assert_eq!(v["status"], "Failure", "{v}");
            assert!(msg.contains("nothing was applied"), "{v}");
        } else {
            assert_eq!(v["status"], "Success", "not covered, not an error: {v}");
            assert!(msg.contains("not covered"), "{v}");
        }
    }
    assert!(
        peak < 192 << 20,
        "peak {} MiB: the Deployment allows 256 MiB",
        mib(peak)
    );
    assert!(node.operations().await.is_empty(), "nothing was applied");
}

/// A bootstrap config whose files fit the budget together is decoded and covered as
/// before: eight 1 MiB gzip'd files (8 MiB in all) are asked about and answered without
/// the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_within_the_budget_are_decoded() {
    use std::io::Write as _;
    let (_pki, _node, ext) = one_agent("ubuntu-2404-grub", "site-a/edge-1-cp-7xk2p", |_| {});
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    z.write_all(&vec![b'#'; 1 << 20]).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(z.finish().unwrap());
    let files: Vec<Value> = (0..8)
        .map(|i| json!({"path": format!("/etc/bulk/{i}.conf"), "encoding": "gzip+base64", "content": b64}))
        .collect();
    let mut can = fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    add_files(
        &mut can["desired"]["bootstrapConfig"]["spec"]["files"],
        &files,
    );
    let v = ext
        .hook("canupdatemachine", "can-update-machine", &can)
        .await;
    let msg = v["message"].as_str().unwrap();
    assert!(!msg.contains("limit of decoded content"), "{v}");
    assert!(
        msg.contains("/etc/bulk") || msg.contains("spec.files"),
        "{v}"
    );
}

/// 60 concurrent CanUpdateMachine hooks of 388 KiB each (23 MiB of bodies, well inside the
/// default 64 MiB `server.max_request_mib`), each with 98 000 JSON values (under the
/// 100 000 limit), to a node whose agent accepts and never answers (a node that hangs:
/// each hook waits its agent timeout). The byte budget counts the raw bodies, not the
/// parsed values held while the agent is asked, so with the new default of 64 places the
/// extension grew to ~1.4 GB here; it must stay within the 256 MiB the deployment gives it
/// (deploy/extension.yaml `limits.memory`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extension_memory_is_bounded_for_many_small_bodies_of_many_values() {
    use common::capi::{Extension, Pki};
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hole_addr = hole.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut keep = Vec::new();
        for s in hole.incoming() {
            keep.push(s);
        }
    });
    let pki = Pki::new();
    let ext = std::sync::Arc::new(Extension::start(
        &pki,
        &[("site-a/edge-1-cp-7xk2p", &hole_addr)],
        "",
    ));
    let pid = ext.child.id();
    let mut req = common::capi::fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json");
    let junk: Vec<serde_json::Value> = (0..49_000).map(|_| serde_json::json!({"a": 1})).collect();
    req["desired"]["infrastructureMachine"]["spec"]["junk"] = serde_json::json!(junk);
    let body = std::sync::Arc::new(serde_json::to_vec(&req).unwrap());
    assert!(body.len() < 400 << 10);
    let mut tasks = Vec::new();
    for _ in 0..60 {
        let (ext, body) = (ext.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            ext.post_bytes(
                ext.client.as_ref(),
                "/hooks.runtime.cluster.x-k8s.io/v1alpha1/canupdatemachine/can-update-machine",
                body.to_vec(),
            )
            .await
        }));
    }
    for t in tasks {
        let _ = t.await.unwrap();
    }
    let peak = peak_rss(pid);
    eprintln!("measured: extension peak RSS {} MiB", peak >> 20);
    assert!(peak < 256 << 20, "peak RSS {} MiB", peak >> 20);
}

/// The daemon allocates with jemalloc under the settings `crates/agent/src/allocator.rs`
/// chose: jemalloc starts its background thread (`jemalloc_bg_thd`, which gives unused
/// pages back) only when it read `background_thread:true` from the `malloc_conf` the
/// binary exports, and exactly one with `max_background_threads:1`. With glibc's malloc,
/// or jemalloc without those settings, there is none.
#[test]
fn the_daemon_allocates_with_jemalloc_under_its_settings() {
    let mut node = Node::new("ubuntu-2404-grub");
    node.start();
    let pid = node.pid().unwrap();
    let names = || -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|n| n.trim().to_string())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = names();
    while !seen.iter().any(|n| n == "jemalloc_bg_thd") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        seen = names();
    }
    let bg = seen.iter().filter(|n| *n == "jemalloc_bg_thd").count();
    assert_eq!(bg, 1, "jemalloc's background threads among {seen:?}");
}
