//! Cost of the extension's own work per hook call, without I/O: parse the request, redact,
//! translate, decide and build the patches (`inplace_extension::capi`), against the floor of
//! parsing and re-serialising the same request with serde_json. Prints `name value unit`
//! lines; asserts nothing (benchmarks are not tests).
//!
//! Then the extension at fleet size: N real `inplaced` agents (N = 10, 50, 100; 10 with
//! `BENCH_QUICK`), each on its own copy of the `ubuntu-2404-grub` fixture serving mTLS on
//! loopback, and one `inplace-extension` resolving Machine `site-a/edge-1-cp-NNN` to
//! agent NNN. CanUpdateMachine (scenario a) is fired for every Machine at once, then
//! UpdateMachine for every Machine at once, each polled every 200 ms until done. Printed:
//! hooks per second, p50/p99/max per hook (CAPI's deadline is 10 s), the extension's RSS
//! and CPU per hook (utime+stime from `/proc/<pid>/stat`), and the TCP connections to
//! agents it holds.
//!
//! `cargo bench --bench extension` (`BENCH_QUICK=1` for fewer rounds and N = 10 only;
//! `BENCH_FLEET=50,100` for those fleet sizes only).

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use inplace_extension::capi;
use inplace_extension::capi::types::CanUpdateMachineRequest;
use inplace_extension::capi::{NodeCoverage, PreserveMode};
use serde_json::{Value, json};

fn fixture(rel: &str) -> Vec<u8> {
    std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/capi")
            .join(rel),
    )
    .unwrap()
}

/// The largest KubeadmConfig CAPI allows: 200 files of 10 KiB (CRD limits), all changed.
fn big_request() -> Vec<u8> {
    let mut req: Value = serde_json::from_slice(&fixture(
        "a-kubelet-args-and-sysctl/canupdatemachine-request.json",
    ))
    .unwrap();
    for (side, tag) in [("current", 'a'), ("desired", 'b')] {
        let files: Vec<Value> = (0..200)
            .map(|i| json!({"path": format!("/etc/bench/f{i:03}.conf"), "owner": "root:root", "permissions": "0644",
                            "content": format!("{tag}{}", "x".repeat(10 * 1024 - 1))}))
            .collect();
        req[side]["bootstrapConfig"]["spec"]["files"] = Value::Array(files);
    }
    serde_json::to_vec(&req).unwrap()
}

fn answer(body: &[u8], cov: &NodeCoverage) -> Vec<u8> {
    let mut req: CanUpdateMachineRequest = serde_json::from_slice(body).unwrap();
    req.redact();
    let _spec = capi::desired_node_spec(&req.desired);
    let resp = capi::can_update_machine(
        &req.current,
        &req.desired,
        capi::machine_diff(&req.current, &req.desired),
        Some(cov),
        PreserveMode::Auto,
    );
    serde_json::to_vec(&resp).unwrap()
}

fn floor(body: &[u8]) -> Vec<u8> {
    let v: Value = serde_json::from_slice(body).unwrap();
    serde_json::to_vec(&v).unwrap()
}

fn p50(mut xs: Vec<Duration>) -> f64 {
    xs.sort();
    xs[xs.len() / 2].as_secs_f64() * 1e6
}

fn main() {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let rounds = if quick { 50 } else { 500 };
    let cov = NodeCoverage::default();
    for (name, body) in [
        (
            "fixture_a",
            fixture("a-kubelet-args-and-sysctl/canupdatemachine-request.json"),
        ),
        ("files_200x10KiB", big_request()),
    ] {
        let (mut ours, mut base) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t = Instant::now();
            black_box(answer(black_box(&body), &cov));
            ours.push(t.elapsed());
            let t = Instant::now();
            black_box(floor(black_box(&body)));
            base.push(t.elapsed());
        }
        let (a, b) = (p50(ours), p50(base));
        println!("can_update_machine_{name}_p50 {a:.1} us");
        println!("floor_json_roundtrip_{name}_p50 {b:.1} us");
        println!("ratio_{name} {:.2} x ({} bytes)", a / b, body.len());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // BENCH_FLEET=50,100 runs only those fleet sizes
    let sizes: Vec<usize> = match std::env::var("BENCH_FLEET") {
        Ok(v) => v.split(',').filter_map(|n| n.trim().parse().ok()).collect(),
        Err(_) if quick => vec![10],
        Err(_) => vec![10, 50, 100],
    };
    for n in sizes {
        rt.block_on(fleet(n));
    }
}

// ------------------------------------------------------------------------------------------
// The extension at fleet size: N real agents over mTLS on loopback, one extension.

/// utime+stime of `pid` in ms (clock ticks at 100 Hz).
fn cpu_ms(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // fields 14 and 15 of stat are 12 and 13 after the ')' (state is field 3)
    (t(11) + t(12)) * 10.0
}

/// `VmRSS` and `VmHWM` of `pid` in KiB.
fn rss_hwm_kib(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let get = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (get("VmRSS:"), get("VmHWM:"))
}

/// Established TCP connections from the machine to any of `ports` (the agents'): the
/// connections the extension holds to agents (nothing else connects to them here).
fn connections_to(ports: &std::collections::HashSet<u16>) -> usize {
    let t = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    t.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let remote = f
                .get(2)
                .and_then(|r| r.split_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            f.get(3) == Some(&"01") && remote.is_some_and(|p| ports.contains(&p))
        })
        .count()
}

fn pct(xs: &mut [f64], q: f64) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[((xs.len() as f64 - 1.0) * q).round() as usize]
}

/// The scenario-a request for Machine `i` (its name replaced everywhere).
fn machine_request(i: usize) -> Value {
    let text = String::from_utf8(fixture(
        "a-kubelet-args-and-sysctl/canupdatemachine-request.json",
    ))
    .unwrap();
    serde_json::from_str(&text.replace("edge-1-cp-7xk2p", &format!("edge-1-cp-{i:03}"))).unwrap()
}

async fn fleet(n: usize) {
    let pki = common::capi::Pki::new();
    let mut nodes = Vec::new();
    let mut agents = Vec::new();
    let mut ports = std::collections::HashSet::new();
    for i in 0..n {
        let mut node = common::Node::new("ubuntu-2404-grub");
        // each node is its Machine's node (the extension checks the agent's node name)
        for f in ["/etc/hostname", "/var/lib/kubelet/kubeadm-flags.env"] {
            let text = node
                .read(f)
                .replace("edge-1-cp-7xk2p", &format!("edge-1-cp-{i:03}"));
            std::fs::write(node.path(f), text).unwrap();
        }
        let addr = pki.agent(&node);
        ports.insert(addr.rsplit_once(':').unwrap().1.parse::<u16>().unwrap());
        node.start();
        agents.push((format!("site-a/edge-1-cp-{i:03}"), addr));
        nodes.push(node);
    }
    let refs: Vec<(&str, &str)> = agents
        .iter()
        .map(|(m, a)| (m.as_str(), a.as_str()))
        .collect();
    let ext = std::sync::Arc::new(common::capi::Extension::start_logging(
        &pki, &refs, "", "info",
    ));
    let pid = ext.child.id();
    let (rss0, _) = rss_hwm_kib(pid);
    let reqs: Vec<Value> = (0..n).map(machine_request).collect();
    // CanUpdateMachine for every Machine at once
    let cpu0 = cpu_ms(pid);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for r in reqs.clone() {
        let ext = ext.clone();
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let v = ext.hook("canupdatemachine", "can-update-machine", &r).await;
            assert_eq!(v["status"], "Success", "{v}");
            t.elapsed().as_secs_f64() * 1e3
        }));
    }
    let mut can = Vec::new();
    for t in tasks {
        can.push(t.await.unwrap());
    }
    let can_wall = t0.elapsed().as_secs_f64();
    let can_cpu = cpu_ms(pid) - cpu0;
    let held_after_can = connections_to(&ports);
    // UpdateMachine for every Machine at once, each polled until done
    let cpu1 = cpu_ms(pid);
    let t1 = Instant::now();
    let mut tasks = Vec::new();
    for r in &reqs {
        let ext = ext.clone();
        let body = json!({
            "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
            "kind": "UpdateMachineRequest",
            "settings": r["settings"],
            "desired": r["desired"],
        });
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            for _ in 0..600 {
                let t = Instant::now();
                let v = ext.hook("updatemachine", "update-machine", &body).await;
                lat.push(t.elapsed().as_secs_f64() * 1e3);
                assert_eq!(v["status"], "Success", "{v}");
                if v["retryAfterSeconds"] == 0 {
                    return lat;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            panic!("UpdateMachine did not finish");
        }));
    }
    let mut upd = Vec::new();
    for t in tasks {
        upd.extend(t.await.unwrap());
    }
    let upd_wall = t1.elapsed().as_secs_f64();
    let upd_cpu = cpu_ms(pid) - cpu1;
    let (rss, hwm) = rss_hwm_kib(pid);
    let held = connections_to(&ports);
    let hooks = can.len() + upd.len();
    println!(
        "fleet_{n}_can_update_hooks_per_s {:.1} /s",
        can.len() as f64 / can_wall
    );
    println!("fleet_{n}_can_update_p50 {:.1} ms", pct(&mut can, 0.5));
    println!("fleet_{n}_can_update_p99 {:.1} ms", pct(&mut can, 0.99));
    println!("fleet_{n}_can_update_max {:.1} ms", pct(&mut can, 1.0));
    println!("fleet_{n}_update_machine_calls {} calls", upd.len());
    println!("fleet_{n}_update_machine_all_done {upd_wall:.2} s");
    println!("fleet_{n}_update_machine_p50 {:.1} ms", pct(&mut upd, 0.5));
    println!("fleet_{n}_update_machine_p99 {:.1} ms", pct(&mut upd, 0.99));
    println!("fleet_{n}_update_machine_max {:.1} ms", pct(&mut upd, 1.0));
    println!(
        "fleet_{n}_extension_cpu_per_hook {:.2} ms (CanUpdate {:.2}, UpdateMachine {:.2})",
        (can_cpu + upd_cpu) / hooks as f64,
        can_cpu / can.len() as f64,
        upd_cpu / upd.len() as f64
    );
    println!("fleet_{n}_extension_rss_start {rss0} KiB");
    println!("fleet_{n}_extension_rss_end {rss} KiB");
    println!("fleet_{n}_extension_rss_peak {hwm} KiB");
    println!(
        "fleet_{n}_agent_connections_held {held_after_can} after CanUpdate, {held} at the end"
    );
    drop(ext);
    for mut node in nodes {
        node.stop();
    }
}
