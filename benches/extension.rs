//! Cost of the extension's own work per hook call, without I/O: parse the request, redact,
//! translate, decide and build the patches (`inplaced::capi`), against the floor of
//! parsing and re-serialising the same request with serde_json. Prints `name value unit`
//! lines; asserts nothing (benchmarks are not tests).
//!
//! `cargo bench --bench extension` (`BENCH_QUICK=1` for fewer rounds).

use std::hint::black_box;
use std::time::{Duration, Instant};

use inplaced::capi::types::CanUpdateMachineRequest;
use inplaced::capi::{self, NodeCoverage, PreserveMode};
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
}
