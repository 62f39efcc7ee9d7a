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
//! Then the same with stand-in agents at N = 100, 500, 1000 (`standin.rs`: the agent's
//! gRPC API over the agent's own mutual-TLS listener, one loopback address per Machine,
//! replaying one real agent's answers; 1000 `inplaced` processes do not fit two cores),
//! against floors measured in the same run (an mTLS `Inspect` round trip, and N of them at
//! once over new connections). BENCHMARKS.md §5b has the method and the numbers.
//!
//! `cargo bench --bench extension` (`BENCH_QUICK=1` for fewer rounds, N = 10 real and 100
//! stand-in agents only; `BENCH_FLEET=50,100` and `BENCH_STANDIN=500,1000` for those
//! fleet sizes only, empty for none; `INPLACE_EXTENSION_BIN` for another extension
//! binary in the stand-in fleet; `BENCH_HOLD=<seconds>` keeps each stand-in fleet and its
//! connections that long after printing, to attach a profiler to the extension).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "extension/standin.rs"]
mod standin;

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
    // BENCH_STANDIN=500,1000 runs only those sizes with stand-in agents
    let standins: Vec<usize> = match std::env::var("BENCH_STANDIN") {
        Ok(v) => v.split(',').filter_map(|n| n.trim().parse().ok()).collect(),
        Err(_) if quick => vec![100],
        Err(_) => vec![100, 500, 1000],
    };
    for n in standins {
        rt.block_on(fleet_standin(n));
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

/// Established TCP connections of process `pid` (its socket descriptors, matched by inode
/// in /proc/net/tcp) to any of the addresses `to` (as /proc/net/tcp writes them,
/// [`proc_addr`]): what the extension itself holds to agents. The host-wide count
/// ([`connections_to`]) also counts the bench's own connections and any row whose peer
/// has an agent's port number on another address (the kernel gives a client socket of
/// 127.0.0.1 a port number that a stand-in listens on at 127.0.0.x: at N = 1000 the
/// extension's own hook connections from the bench matched 4 agent ports in one run).
fn connections_of(pid: u32, to: &std::collections::HashSet<String>) -> usize {
    let mut inodes = std::collections::HashSet::new();
    if let Ok(d) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in d.flatten() {
            if let Ok(t) = std::fs::read_link(e.path())
                && let Some(i) = t
                    .to_str()
                    .and_then(|t| t.strip_prefix("socket:["))
                    .and_then(|t| t.strip_suffix(']'))
            {
                inodes.insert(i.to_string());
            }
        }
    }
    let t = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    t.lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 9 && f[3] == "01" && to.contains(f[2]) && inodes.contains(f[9])
        })
        .count()
}

/// An IPv4 address as /proc/net/tcp writes it (`0100007F:1F90` for 127.0.0.1:8080).
fn proc_addr(a: std::net::SocketAddr) -> String {
    match a.ip() {
        std::net::IpAddr::V4(ip) => {
            format!("{:08X}:{:04X}", u32::from_le_bytes(ip.octets()), a.port())
        }
        std::net::IpAddr::V6(_) => String::new(),
    }
}

/// `Threads` of `pid`.
fn threads(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
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
    let mut r: Value =
        serde_json::from_str(&text.replace("edge-1-cp-7xk2p", &format!("edge-1-cp-{i:03}")))
            .unwrap();
    // the fixture nodes have no kubelet to report a version, and UpdateMachine verifies
    // every field it applies (issue 27 §2): the Machines name none, as in the tests
    // (`tests/common/capi.rs`, `without_machine_version`)
    for side in ["current", "desired"] {
        if let Some(spec) = r[side]["machine"]["spec"].as_object_mut() {
            spec.remove("version");
        }
    }
    r
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

// ------------------------------------------------------------------------------------------
// The extension at fleet size with stand-in agents (N = 100, 500, 1000): see standin.rs.

/// An HTTPS client of the extension as CAPI's managers are: one rustls config, and a
/// kept-alive HTTP/1.1 connection per caller, reused across its calls (Go's transport
/// keeps idle connections), opened again when the extension closed it.
struct Capi {
    addr: String,
    cfg: Arc<rustls::ClientConfig>,
}

type Send = hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>;

impl Capi {
    fn new(ext: &common::capi::Extension) -> Capi {
        use rustls_pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls_pki_types::CertificateDer::pem_slice_iter(ext.ca.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let (cert, key) = ext.client.clone().unwrap();
        let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            rustls_pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
                .map(Result::unwrap)
                .collect(),
            rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
        )
        .unwrap();
        Capi {
            addr: ext.addr.clone(),
            cfg: Arc::new(cfg),
        }
    }

    async fn connect(&self) -> Send {
        let tcp = tokio::net::TcpStream::connect(&self.addr).await.unwrap();
        // as Go's net package does for every TCP connection
        tcp.set_nodelay(true).unwrap();
        let tls = tokio_rustls::TlsConnector::from(self.cfg.clone())
            .connect("localhost".try_into().unwrap(), tcp)
            .await
            .expect("TLS to the extension");
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(conn);
        send
    }

    /// POSTs `body` to `hook`/`handler` on `conn` (connecting first when there is none or
    /// it was closed); the answer, which must be HTTP 200.
    async fn hook(&self, conn: &mut Option<Send>, hook: &str, handler: &str, body: &[u8]) -> Value {
        use http_body_util::BodyExt;
        if conn.as_mut().is_none_or(|c| c.is_closed()) {
            *conn = Some(self.connect().await);
        }
        let send = conn.as_mut().unwrap();
        send.ready().await.unwrap();
        let req = hyper::Request::post(format!(
            "https://localhost/hooks.runtime.cluster.x-k8s.io/v1alpha1/{hook}/{handler}"
        ))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::copy_from_slice(
            body,
        )))
        .unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        let b = resp.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&b).unwrap()
    }
}

/// The extension's config for the stand-in fleet: `resolver.static` for every Machine,
/// and connection limits that admit N hooks in flight from one source (every hook comes
/// from the bench's one loopback address: each in-flight HTTP/1.1 request is a connection).
fn standin_config(
    pki: &common::capi::Pki,
    client: &(String, String),
    addr: &str,
    n: usize,
    agents: &[(String, String)],
) -> String {
    use common::pki::write;
    let d = pki.dir.path();
    let server = common::capi::Pki::localhost(&pki.ext_ca, "inplace-extension");
    let room = n + 64;
    let mut cfg = format!(
        "[server]\nlisten = \"{addr}\"\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
         max_connections = {room}\nhandshake_budget = {room}\nhandshakes_per_source = {room}\n\
         [[server.clients]]\nidentity = \"{}\"\n\
         [agent]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\ntimeout_seconds = 5\n\
         [update]\nretry_after_seconds = 30\n[resolver]\n[resolver.static]\n",
        write(d, "ext.crt", &server.0),
        write(d, "ext.key", &server.1),
        write(d, "capi-ca.crt", &pki.capi_ca.pem),
        common::capi::CAPI_ID,
        write(d, "agents-ca.crt", &pki.agent_ca.pem),
        write(d, "client.crt", &client.0),
        write(d, "client.key", &client.1),
    );
    for (m, a) in agents {
        cfg.push_str(&format!("\"{m}\" = \"{a}\"\n"));
    }
    write(d, "extension.toml", &cfg)
}

/// Starts `inplace-extension` (`INPLACE_EXTENSION_BIN`, else this build's) with `config`.
fn spawn_extension(
    pki: &common::capi::Pki,
    config: String,
    addr: String,
) -> common::capi::Extension {
    let bin = std::env::var("INPLACE_EXTENSION_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_inplace-extension").to_string());
    let log = pki.dir.path().join("extension.log");
    let child = std::process::Command::new(bin)
        .args(["--config", &config, "--log", "info"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let ext = common::capi::Extension {
        child,
        addr,
        ca: pki.ext_ca.pem.clone(),
        log,
        client: Some(pki.capi.clone()),
        config: config.into(),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(&ext.addr).is_err() {
        assert!(
            Instant::now() < deadline,
            "inplace-extension did not listen: {}",
            ext.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    ext
}

/// The floors of the stand-in fleet, measured before the hooks: one mutual-TLS `Inspect`
/// (with the Machine's spec) over an open connection, p50 of 200 in a row; and N at once,
/// each over its own new connection (TCP, TLS handshake, the call), p50 and p99: what a
/// hook that reaches its agent for the first time can not go below.
async fn standin_floors(
    n: usize,
    addrs: &[String],
    id: &inplace_edge::client::TlsIdentity,
    spec: &inplace_wire::pb::NodeSpec,
) -> (f64, f64, f64) {
    use inplace_wire::pb;
    let inspect = || pb::InspectRequest {
        desired: Some(spec.clone()),
        status: true,
        operations: true,
        skip_coverage_when_busy: true,
        ..Default::default()
    };
    let mut c = inplace_edge::client::connect_tls(
        &addrs[0],
        &TlsIdentity {
            server_name: host(&addrs[0]),
            ..id.clone()
        },
    )
    .await
    .unwrap();
    let mut one = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        c.inspect(inspect()).await.unwrap();
        one.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut tasks = Vec::new();
    for a in addrs.iter().take(n) {
        let a = a.clone();
        let id = TlsIdentity {
            server_name: host(&a),
            ..id.clone()
        };
        let req = inspect();
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let mut c = inplace_edge::client::connect_tls(&a, &id).await.unwrap();
            c.inspect(req).await.unwrap();
            t.elapsed().as_secs_f64() * 1e3
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.push(t.await.unwrap());
    }
    (pct(&mut one, 0.5), pct(&mut all, 0.5), pct(&mut all, 0.99))
}

use inplace_edge::client::TlsIdentity;
use std::sync::Arc;

fn host(addr: &str) -> String {
    addr.rsplit_once(':').unwrap().0.to_string()
}

async fn fleet_standin(n: usize) {
    let pki = common::capi::Pki::new();
    let ext_identity = "spiffe://edge/capi/extension";
    let client = common::pki::leaf(
        &pki.ext_ca,
        "capi-extension",
        vec![rcgen::SanType::URI(ext_identity.try_into().unwrap())],
    );
    // one real agent's answers for the Machine's spec
    let req0: CanUpdateMachineRequest = serde_json::from_value(machine_request(0)).unwrap();
    let spec = capi::with_version(capi::desired_node_spec(&req0.desired), &req0.desired, true);
    let mut real = common::Node::new("ubuntu-2404-grub");
    real.start();
    let rec = Arc::new(standin::Recorded::from_agent(&real.socket, spec.clone()).await);
    real.stop();
    drop(real);
    let clients_ca = common::pki::write(pki.dir.path(), "standin-clients-ca.crt", &pki.ext_ca.pem);
    let mut certs = standin::Certs {
        dir: pki.dir.path(),
        agent_ca: &pki.agent_ca,
        clients_ca,
        by_ip: Default::default(),
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut agents = Vec::new();
    let mut ports = std::collections::HashSet::new();
    let mut remotes = std::collections::HashSet::new();
    for i in 0..n {
        let m = format!("edge-1-cp-{i:03}");
        let a = standin::start(
            i,
            &m,
            rec.clone(),
            &mut certs,
            ext_identity,
            stopped.clone(),
        )
        .await;
        ports.insert(a.port());
        remotes.insert(proc_addr(a));
        agents.push((format!("site-a/{m}"), a.to_string()));
    }
    let addrs: Vec<String> = agents.iter().map(|(_, a)| a.clone()).collect();
    let id = TlsIdentity {
        ca: pki.agent_ca.pem.clone().into_bytes(),
        cert: client.0.clone().into_bytes(),
        key: client.1.clone().into_bytes(),
        server_name: String::new(),
    };
    let (floor_one, floor_n50, floor_n99) = standin_floors(n, &addrs, &id, &spec).await;
    // the floor's N connections close when their channels' tasks run: wait for that, so
    // the stand-ins serve only the extension and the counts below are the extension's
    let closing = Instant::now();
    while connections_of(std::process::id(), &remotes) > 0
        && closing.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let addr = format!("127.0.0.1:{}", common::pki::free_port());
    let config = standin_config(&pki, &client, &addr, n, &agents);
    let ext = Arc::new(spawn_extension(&pki, config, addr));
    let capi_client = Arc::new(Capi::new(&ext));
    let pid = ext.child.id();
    let (rss0, _) = rss_hwm_kib(pid);
    let bodies: Vec<(Vec<u8>, Vec<u8>)> = (0..n)
        .map(|i| {
            let r = machine_request(i);
            let upd = json!({
                "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
                "kind": "UpdateMachineRequest",
                "settings": r["settings"],
                "desired": r["desired"],
            });
            (
                serde_json::to_vec(&r).unwrap(),
                serde_json::to_vec(&upd).unwrap(),
            )
        })
        .collect();
    // each caller's connection, opened before the hooks (CAPI's are open during a rollout)
    let mut conns = Vec::new();
    for _ in 0..n {
        conns.push(Some(capi_client.connect().await));
    }
    let cpu0 = cpu_ms(pid);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for ((can, upd), mut conn) in bodies.into_iter().zip(conns) {
        let c = capi_client.clone();
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let v = c
                .hook(&mut conn, "canupdatemachine", "can-update-machine", &can)
                .await;
            assert_eq!(v["status"], "Success", "{v}");
            (t.elapsed().as_secs_f64() * 1e3, conn, upd)
        }));
    }
    let mut can = Vec::new();
    let mut next = Vec::new();
    for t in tasks {
        let (ms, conn, upd) = t.await.unwrap();
        can.push(ms);
        next.push((conn, upd));
    }
    let can_wall = t0.elapsed().as_secs_f64();
    let can_cpu = cpu_ms(pid) - cpu0;
    let held_after_can = connections_to(&ports);
    let ext_held_after_can = connections_of(pid, &remotes);
    let bench_held_after_can = connections_of(std::process::id(), &remotes);
    let (rss_can, _) = rss_hwm_kib(pid);
    let cpu1 = cpu_ms(pid);
    let t1 = Instant::now();
    let mut tasks = Vec::new();
    for (mut conn, body) in next {
        let c = capi_client.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            for _ in 0..600 {
                let t = Instant::now();
                let v = c
                    .hook(&mut conn, "updatemachine", "update-machine", &body)
                    .await;
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
    let ext_held = connections_of(pid, &remotes);
    let ext_threads = threads(pid);
    let hooks = can.len() + upd.len();
    let p = |name: &str, v: f64, unit: &str| println!("standin_{n}_{name} {v:.1} {unit}");
    p("floor_inspect_rtt_p50", floor_one, "ms");
    p("floor_connect_and_inspect_at_once_p50", floor_n50, "ms");
    p("floor_connect_and_inspect_at_once_p99", floor_n99, "ms");
    p("can_update_hooks_per_s", can.len() as f64 / can_wall, "/s");
    let (c50, c99, cmax) = (pct(&mut can, 0.5), pct(&mut can, 0.99), pct(&mut can, 1.0));
    p("can_update_p50", c50, "ms");
    p("can_update_p99", c99, "ms");
    p("can_update_max", cmax, "ms");
    println!(
        "standin_{n}_ratio_can_update_p99 {:.2} x (to the connect-and-inspect-at-once p99)",
        c99 / floor_n99
    );
    println!("standin_{n}_update_machine_calls {} calls", upd.len());
    println!(
        "standin_{n}_update_machine_all_done {upd_wall:.2} s (apply {:.0} ms per node)",
        rec.apply_time.as_secs_f64() * 1e3
    );
    let (u50, u99, umax) = (pct(&mut upd, 0.5), pct(&mut upd, 0.99), pct(&mut upd, 1.0));
    p("update_machine_p50", u50, "ms");
    p("update_machine_p99", u99, "ms");
    p("update_machine_max", umax, "ms");
    println!(
        "standin_{n}_ratio_update_machine_p99 {:.2} x (to the connect-and-inspect-at-once p99)",
        u99 / floor_n99
    );
    println!(
        "standin_{n}_extension_cpu_per_hook {:.2} ms (CanUpdate {:.2}, UpdateMachine {:.2})",
        (can_cpu + upd_cpu) / hooks as f64,
        can_cpu / can.len() as f64,
        upd_cpu / upd.len() as f64
    );
    println!("standin_{n}_extension_rss_start {rss0} KiB");
    println!("standin_{n}_extension_rss_after_can_update {rss_can} KiB");
    println!("standin_{n}_extension_rss_end {rss} KiB");
    println!("standin_{n}_extension_threads {ext_threads}");
    println!("standin_{n}_extension_rss_peak {hwm} KiB");
    println!(
        "standin_{n}_agent_connections_held {held_after_can} after CanUpdate, {held} at the end"
    );
    println!(
        "standin_{n}_agent_connections_held_by_extension {ext_held_after_can} after CanUpdate, {ext_held} at the end"
    );
    println!(
        "standin_{n}_agent_connections_held_by_the_bench {bench_held_after_can} after CanUpdate (the floor's)"
    );
    println!(
        "standin_{n}_loadavg {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    // BENCH_HOLD=<seconds>: keep the extension, its hook connections and the stand-ins as
    // they are for that long (to attach a heap profiler, or call malloc_trim with gdb)
    if let Some(s) = std::env::var("BENCH_HOLD")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        println!("standin_{n}_holding {s} s, extension pid {pid}");
        tokio::time::sleep(Duration::from_secs(s)).await;
    }
    drop(ext);
    let _ = stop.send(true);
}
