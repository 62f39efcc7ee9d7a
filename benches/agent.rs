//! Benchmarks of the real `inplaced` daemon (release build) on temp copies of
//! `examples/node`, started with `--service-manager record`.
//!
//! Run: `cargo bench --bench agent` (full, ~3 minutes) or `BENCH_QUICK=1 cargo bench --bench
//! agent` (smoke run: 5 s idle window, fewer calls). Every figure is printed on stdout as one
//! line `name value unit`; the floors and the ratios come last. Progress goes to stderr.
//! This is a benchmark, not a test: nothing here asserts on timing. See BENCHMARKS.md.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inplace_wire::pb;
use inplace_wire::pb::node_agent_client::NodeAgentClient;
use sha2::{Digest, Sha256};
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

// ------------------------------------------------------------------------------------------
// Output

/// Figures printed at the end (floors and ratios), after the measured figures.
#[derive(Default)]
struct Report {
    tail: Vec<String>,
}

impl Report {
    fn fig(&self, name: &str, value: f64, unit: &str) {
        println!("{name} {} {unit}", fmt(value));
    }
    fn floor(&mut self, name: &str, value: f64, unit: &str) {
        self.tail.push(format!("{name} {} {unit}", fmt(value)));
    }
    fn ratio(&mut self, name: &str, num: f64, den: f64) {
        self.tail.push(format!(
            "{name} {:.2} x",
            if den > 0.0 { num / den } else { 0.0 }
        ));
    }
}

fn fmt(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn note(msg: impl AsRef<str>) {
    eprintln!("[bench] {}", msg.as_ref());
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Nearest-rank percentile of `xs` (sorted here), p in 0..=100.
fn pct(xs: &[Duration], p: f64) -> Duration {
    let mut v = xs.to_vec();
    v.sort();
    let n = v.len();
    if n == 0 {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    v[rank.clamp(1, n) - 1]
}

// ------------------------------------------------------------------------------------------
// Node copies and the daemon

// The tests' tree copy.
#[path = "../tests/common/tree.rs"]
mod tree;
use tree::copy_tree;

#[path = "agent/coverage_full.rs"]
mod coverage_full;

fn example(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(rel)
}

/// The example spec the coverage figures and the memory clients call with
/// (`examples/specs/kubelet-and-sysctl.yaml`: 2 changes, fully covered on the example node).
fn example_spec() -> pb::NodeSpec {
    inplace_wire::yaml::parse(
        &std::fs::read_to_string(example("specs/kubelet-and-sysctl.yaml")).unwrap(),
    )
    .unwrap()
}

/// The environment variable `name` parsed, when set and valid (the `BENCH_*` knobs).
fn env_knob<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Where the daemons' directories (node root, state, socket) and the floors' files go:
/// `BENCH_DIR` when set, else the target directory's `tmp`. `BENCH_DIR` on a tmpfs (a
/// directory only root may write, as the daemon requires) takes the disk out of the
/// figures: its fsyncs return at once, so an apply's CPU there is the daemon's own work
/// (BENCHMARKS.md, "Apply CPU without the disk").
fn bench_dir() -> PathBuf {
    std::env::var_os("BENCH_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")), PathBuf::from)
}

/// A temp copy of examples/node and a daemon on it.
struct Daemon {
    dir: tempfile::TempDir,
    root: PathBuf,
    socket: PathBuf,
    child: Option<Child>,
    /// More environment for the daemon (after the unit's).
    env: Vec<(String, String)>,
}

impl Daemon {
    /// Copies examples/node into a new temp dir (nothing started yet).
    fn new(tag: &str) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix(&format!("inplaced-bench-{tag}-"))
            // not under /tmp: inplaced refuses a config in a directory others can write
            .tempdir_in(bench_dir())
            .unwrap();
        let root = dir.path().join("root");
        copy_tree(&example("node"), &root);
        std::fs::copy(example("config.toml"), dir.path().join("config.toml")).unwrap();
        Daemon {
            socket: dir.path().join("run/inplaced.sock"),
            root,
            dir,
            child: None,
            env: Vec::new(),
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Spawns the daemon; returns the time from spawn until a Health Check answers SERVING.
    async fn start(&mut self) -> Duration {
        let mut cmd = Command::new(daemon_binary());
        cmd.arg("--root")
            .arg(&self.root)
            .arg("--state-dir")
            .arg(self.dir.path().join("state"))
            .arg("--socket")
            .arg(&self.socket)
            .arg("--config")
            .arg(self.dir.path().join("config.toml"))
            .arg("--service-manager")
            .arg("record")
            .arg("--log")
            .arg("warn")
            .envs(unit_environment())
            .envs(self.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let t0 = Instant::now();
        self.child = Some(cmd.spawn().expect("spawn inplaced"));
        let deadline = t0 + Duration::from_secs(20);
        loop {
            if let Ok(Some(s)) = self.child.as_mut().unwrap().try_wait() {
                panic!("inplaced exited early: {s}");
            }
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
                && let Ok(ch) = inplace_edge::client::channel(&self.socket).await
                && health(&ch).await
            {
                return t0.elapsed();
            }
            assert!(Instant::now() < deadline, "inplaced did not become ready");
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
    }

    /// SIGTERM, then waits (yielding to the client runtime, so that the client's
    /// connections can answer the server's GOAWAY and close).
    async fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(c.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        note("inplaced did not stop within 10 s of SIGTERM; killing it");
        let _ = c.kill();
        let _ = c.wait();
    }

    fn kill(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(c.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// The `Environment=` settings of `systemd/inplaced.service` (none today), so that
/// every bench daemon runs as the unit runs it.
fn unit_environment() -> Vec<(String, String)> {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/inplaced.service"),
    )
    .unwrap();
    unit.lines()
        .filter_map(|l| l.trim().strip_prefix("Environment="))
        .flat_map(|v| v.split_whitespace())
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn health(ch: &Channel) -> bool {
    HealthClient::new(ch.clone())
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(|r| r.into_inner().status == ServingStatus::Serving as i32)
        .unwrap_or(false)
}

// ------------------------------------------------------------------------------------------
// /proc

/// VmRSS of `pid`, KiB.
fn rss_kib(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0)
}

/// RssAnon of `pid` (heap, stacks: what the daemon's own allocations hold; VmRSS adds
/// the binary's file-backed pages), KiB.
fn rss_anon_kib(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0)
}

/// Threads of `pid` now.
fn threads(pid: u32) -> f64 {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count()) as f64
}

/// utime + stime of `pid` (all threads), in ms (from clock ticks).
fn cpu_ms(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // fields 14 and 15 of stat(5); `rest` starts at field 3
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    ticks * 1000.0 / hz
}

/// Per thread of `pid`: CPU time from schedstat (ns precision) and context switches
/// (voluntary + involuntary), by thread id.
type Sched = std::collections::HashMap<String, (u64, u64)>;

fn sched(pid: u32) -> Sched {
    let mut out = Sched::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in rd.flatten() {
            let ns = std::fs::read_to_string(t.path().join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0);
            let mut switches = 0;
            if let Ok(s) = std::fs::read_to_string(t.path().join("status")) {
                for l in s.lines() {
                    if let Some(v) = l
                        .strip_prefix("voluntary_ctxt_switches:")
                        .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                    {
                        switches += v.trim().parse::<u64>().unwrap_or(0);
                    }
                }
            }
            out.insert(t.file_name().to_string_lossy().into_owned(), (ns, switches));
        }
    }
    out
}

/// CPU ms and context switches between two samples: threads alive at the end, minus what
/// they had at the start (threads that exited in between, e.g. idle blocking-pool threads,
/// are left out; their work in the window is lost, which for idle threads is nothing).
fn sched_delta(a: &Sched, b: &Sched) -> (f64, u64) {
    let mut ns = 0u64;
    let mut sw = 0u64;
    for (tid, (n1, s1)) in b {
        let (n0, s0) = a.get(tid).copied().unwrap_or((0, 0));
        ns += n1.saturating_sub(n0);
        sw += s1.saturating_sub(s0);
    }
    (ns as f64 / 1e6, sw)
}

// ------------------------------------------------------------------------------------------
// Specs

const FILE_DIR: &str = "/etc/bench";

fn file_path(i: usize) -> String {
    format!("{FILE_DIR}/d{:02}/f{i:04}.conf", i / 100)
}

/// Content of bench file `i` (~256 bytes); `changed` gives a different content.
fn file_content(i: usize, changed: bool) -> Vec<u8> {
    let mut s = format!(
        "# bench file {i}{}\n",
        if changed { " (changed)" } else { "" }
    );
    let mut k = 0;
    while s.len() < 256 {
        s.push_str(&format!("key{k}.{i} = value-{}\n", (i * 31 + k) % 997));
        k += 1;
    }
    s.into_bytes()
}

/// Creates bench files 0..n in the node copy, as a previous apply would have left them.
fn create_files(root: &Path, n: usize) {
    for i in 0..n {
        let p = root.join(file_path(i).trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, file_content(i, false)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
}

/// A spec of files 0..n, the first `changed` of them with a new content.
fn files_spec(n: usize, changed: usize) -> pb::NodeSpec {
    pb::NodeSpec {
        files: (0..n)
            .map(|i| pb::File {
                path: file_path(i),
                content: file_content(i, i < changed),
                mode: Some(0o644),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// A spec of `n` new small files `/etc/bench-apply/<tag>-NNN.conf`.
fn new_files_spec(tag: &str, n: usize) -> pb::NodeSpec {
    pb::NodeSpec {
        files: (0..n)
            .map(|i| pb::File {
                path: format!("/etc/bench-apply/{tag}-{i:03}.conf"),
                content: file_content(i, false),
                mode: Some(0o644),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// A partial KubeletConfiguration of `n` featureGates (none set on the node yet).
fn kubelet_spec(n: usize) -> pb::NodeSpec {
    let mut y = String::from("kubelet:\n  config:\n    featureGates:\n");
    for i in 0..n {
        y.push_str(&format!("      BenchGate{i:04}: {}\n", i % 2 == 0));
    }
    inplace_wire::yaml::parse(&y).unwrap()
}

// ------------------------------------------------------------------------------------------
// Kubelet config fields: µs per field at 10 / 100 / 1000 featureGates

/// Median of `reps` runs of `f`.
fn median_of(reps: usize, mut f: impl FnMut()) -> Duration {
    let mut ts: Vec<Duration> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    ts.sort();
    ts[ts.len() / 2]
}

/// Issue 16 §2: the per-field cost of kubelet config edits must be flat in the number of
/// fields. The library's `edit` of N new featureGates into the example node's
/// config.yaml, against a floor measured in the same run (one parse of the edited
/// document: the least a faithful editor must do); then GetCoverage of the same N-field
/// partial config through the daemon. Run alone with `BENCH_ONLY=kubelet`.
async fn kubelet_fields_scaling(rep: &mut Report, quick: bool) {
    use inplace_formats::kubelet::config as kcfg;
    let base =
        std::fs::read_to_string(example("node/var/lib/kubelet/config.yaml")).expect("config.yaml");
    let mut per_field = Vec::new();
    for nk in [10usize, 100, 1000] {
        let edits: Vec<kcfg::LeafEdit> = (0..nk)
            .map(|i| {
                kcfg::LeafEdit::Set(
                    vec!["featureGates".into(), format!("BenchGate{i:04}")],
                    serde_json::Value::Bool(i % 2 == 0),
                )
            })
            .collect();
        let out = kcfg::edit(&base, &edits).expect("edit");
        assert!(out.faithful);
        let reps = if quick { 5 } else { 21 };
        let t_edit = median_of(reps, || {
            std::hint::black_box(kcfg::edit(&base, &edits).unwrap());
        });
        let t_parse = median_of(reps, || {
            std::hint::black_box(kcfg::parse(&out.text).unwrap());
        });
        let pf = us(t_edit) / nk as f64;
        rep.fig(&format!("kubelet_edit_fields_{nk}_per_field"), pf, "us");
        rep.fig(&format!("kubelet_edit_fields_{nk}_total"), ms(t_edit), "ms");
        rep.floor(
            &format!("floor_kubelet_parse_{nk}_fields"),
            us(t_parse),
            "us",
        );
        rep.ratio(
            &format!("ratio_kubelet_edit_{nk}_vs_parse_floor"),
            us(t_edit),
            us(t_parse),
        );
        per_field.push(pf);
    }
    rep.ratio(
        "ratio_kubelet_edit_per_field_1000_vs_10",
        per_field[2],
        per_field[0],
    );
    rep.ratio(
        "ratio_kubelet_edit_per_field_100_vs_10",
        per_field[1],
        per_field[0],
    );

    let mut cov = Daemon::new("kcov");
    cov.start().await;
    let ch = inplace_edge::client::channel(&cov.socket).await.unwrap();
    let mut c = NodeAgentClient::new(ch.clone());
    let mut per_field = Vec::new();
    for (nk, calls) in [(10usize, 100usize), (100, 50), (1000, 20)] {
        let calls = if quick {
            calls.div_ceil(4).max(3)
        } else {
            calls
        };
        let spec = kubelet_spec(nk);
        let r = coverage(&mut c, &spec).await;
        assert_eq!(r.changes.len(), nk, "{nk} featureGates");
        let mut ts = Vec::new();
        for _ in 0..calls {
            ts.push(timed_coverage(&mut c, &spec).await);
        }
        let p50 = pct(&ts, 50.0);
        let pf = us(p50) / nk as f64;
        rep.fig(&format!("coverage_kubelet_only_{nk}_p50"), us(p50), "us");
        rep.fig(&format!("coverage_kubelet_only_{nk}_per_field"), pf, "us");
        per_field.push(pf);
    }
    rep.ratio(
        "ratio_coverage_kubelet_per_field_1000_vs_10",
        per_field[2],
        per_field[0],
    );
    rep.ratio(
        "ratio_coverage_kubelet_per_field_100_vs_10",
        per_field[1],
        per_field[0],
    );
    drop(c);
    drop(ch);
    cov.stop().await;
}

// ------------------------------------------------------------------------------------------
// Calls

async fn coverage(c: &mut NodeAgentClient<Channel>, spec: &pb::NodeSpec) -> pb::CoverageReport {
    c.get_coverage(pb::GetCoverageRequest {
        diff: None,
        desired: Some(spec.clone()),
        reboot_policy: 0,
    })
    .await
    .expect("GetCoverage")
    .into_inner()
}

/// Time of one GetCoverage call; the request is built before the clock starts.
async fn timed_coverage(c: &mut NodeAgentClient<Channel>, spec: &pb::NodeSpec) -> Duration {
    let req = pb::GetCoverageRequest {
        diff: None,
        desired: Some(spec.clone()),
        reboot_policy: 0,
    };
    let t = Instant::now();
    let r = c.get_coverage(req).await.expect("GetCoverage");
    let d = t.elapsed();
    drop(r);
    d
}

async fn timed_health(h: &mut HealthClient<Channel>) -> Duration {
    let t = Instant::now();
    let r = h
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("Health/Check");
    let d = t.elapsed();
    assert_eq!(r.into_inner().status, ServingStatus::Serving as i32);
    d
}

/// Apply calls refused ABORTED right after the previous operation settled.
static ABORTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Applies `spec` as operation `id` and waits (WatchOperation) until it settles; the time
/// from the Apply call to the settled event.
async fn timed_apply(c: &mut NodeAgentClient<Channel>, spec: &pb::NodeSpec, id: &str) -> Duration {
    let req = pb::ApplyRequest {
        diff: None,
        desired: Some(spec.clone()),
        operation_id: id.into(),
        reboot_policy: 0,
        dry_run: false,
        ..Default::default()
    };
    let t = Instant::now();
    // An Apply right after the previous operation's settled event can be refused ABORTED
    // (the daemon frees its operation slot after publishing the final phase): retry, and
    // count it (see BENCHMARKS.md).
    let first = loop {
        match c.apply(req.clone()).await {
            Ok(r) => break r.into_inner(),
            Err(e) if e.code() == tonic::Code::Aborted => {
                ABORTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            Err(e) => panic!("apply {id}: {e:?}"),
        }
    };
    let mut last = first;
    if !inplace_wire::phase::is_settled(last.phase) {
        let mut s = c
            .watch_operation(pb::WatchOperationRequest { id: id.into() })
            .await
            .expect("WatchOperation")
            .into_inner();
        while let Some(ev) = s.message().await.expect("WatchOperation stream") {
            if let Some(op) = ev.operation {
                let settled = inplace_wire::phase::is_settled(op.phase);
                last = op;
                if settled {
                    break;
                }
            }
        }
    }
    let d = t.elapsed();
    assert_eq!(
        last.phase,
        pb::Phase::Succeeded as i32,
        "operation {id} did not succeed: {}",
        last.message
    );
    d
}

/// fsync + fdatasync calls of `pid` (all threads) while `f` runs, from `strace -c`; None
/// when strace is not installed or may not trace.
async fn fsyncs<T>(pid: u32, f: impl std::future::Future<Output = T>) -> Option<u64> {
    let out = tempfile::NamedTempFile::new().ok()?;
    let mut st = Command::new("strace")
        .args(["-f", "-c", "-e", "trace=fsync,fdatasync", "-o"])
        .arg(out.path())
        .args(["-p", &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    // strace attaches to every thread before it reports anything
    tokio::time::sleep(Duration::from_millis(500)).await;
    f.await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(st.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    st.wait().ok()?;
    let text = std::fs::read_to_string(out.path()).ok()?;
    let n = text
        .lines()
        .filter(|l| l.ends_with(" fsync") || l.ends_with(" fdatasync"))
        .filter_map(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok())
        .sum();
    Some(n)
}

// ------------------------------------------------------------------------------------------
// Floors

/// The durable work of writing `files` in `dir`, plainly: a temporary file in the same
/// directory, write, fchmod, fsync, rename, fsync of the directory.
fn plain_durable(dir: &Path, files: &[(String, Vec<u8>)]) -> Duration {
    let t = Instant::now();
    let d = File::open(dir).unwrap();
    for (name, content) in files {
        let tmp = dir.join(format!(".{name}.tmp"));
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .unwrap();
        f.write_all(content).unwrap();
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o644))
            .unwrap();
        f.sync_all().unwrap();
        drop(f);
        std::fs::rename(&tmp, dir.join(name)).unwrap();
        d.sync_all().unwrap();
    }
    t.elapsed()
}

/// The CPU time of this thread so far, in ms (`/proc/thread-self/schedstat`, ns).
fn thread_cpu_ms() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1e6
}

/// The floor of a 1-file apply's CPU: the file-system work a write-ahead-logged apply of
/// one file can not avoid, plainly, in this thread. Four durable atomic writes (an intent
/// of 1 KiB, the file, a commit of 1 KiB, the settled operation of 512 bytes: each a new
/// temporary file, write, fsync, rename, directory fsync: 8 fsyncs, the agent's own
/// count), then the intent and commit unlinked as a journal removes them. Its CPU time in
/// ms (schedstat of this thread, so the kernel's share of the writes is in it, on the
/// same file system as the agent's state).
fn plain_apply_cpu(dir: &Path, op: &str, file: &[u8]) -> f64 {
    let c0 = thread_cpu_ms();
    let parts: [(String, Vec<u8>); 4] = [
        (format!("{op}.intent"), vec![b'i'; 1024]),
        (format!("{op}.conf"), file.to_vec()),
        (format!("{op}.commit"), vec![b'c'; 1024]),
        (format!("{op}.json"), vec![b'o'; 512]),
    ];
    plain_durable(dir, &parts);
    for name in [&parts[0].0, &parts[2].0] {
        std::fs::remove_file(dir.join(name)).unwrap();
    }
    let cpu = thread_cpu_ms() - c0;
    for name in [&parts[1].0, &parts[3].0] {
        std::fs::remove_file(dir.join(name)).unwrap();
    }
    cpu
}

/// The durable removal of `files` from `dir`, plainly: unlink each, then one fsync of the
/// directory; returns its time.
fn plain_cleanup(dir: &Path, files: &[(String, Vec<u8>)]) -> Duration {
    let t = Instant::now();
    for (name, _) in files {
        let _ = std::fs::remove_file(dir.join(name));
    }
    File::open(dir).unwrap().sync_all().unwrap();
    t.elapsed()
}

/// Reading and hashing `paths` in a plain loop.
fn plain_hash(paths: &[PathBuf]) -> Duration {
    let t = Instant::now();
    let mut acc = 0u8;
    for p in paths {
        let b = std::fs::read(p).unwrap();
        acc ^= Sha256::digest(&b)[0];
    }
    std::hint::black_box(acc);
    t.elapsed()
}

// ------------------------------------------------------------------------------------------

struct Counts {
    startups: usize,
    apply_reps_200: usize,
    apply_reps_1: usize,
    idle: Duration,
    /// Coverage calls of the example spec, each paired with an empty call: 20 000 in a
    /// whole run, so that the p99 is the 200th slowest call of each kind. With 2000 (up
    /// to session 15) it was the 20th, and one build's p99 ratio moved between 1.0x and
    /// 3.2x from run to run (BENCHMARKS.md, "How many calls a p99 needs").
    example_calls: usize,
    /// The coverage calls the daemon has answered when its RSS is read (the example's
    /// calls and their warm-up included).
    memory_calls: usize,
    big_calls: usize,
}

/// The daemon measured: `INPLACED_BENCH_BIN`, else the `inplaced` the packages ship,
/// built here with Cargo.toml's `node` profile (the release profile with the dependencies
/// optimised for size) into this bench's target directory. `cargo bench` itself builds
/// the binaries with the bench profile, which inherits the release profile's settings.
fn daemon_binary() -> String {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(b) = std::env::var("INPLACED_BENCH_BIN") {
            return b;
        }
        // <target>/release/deps/agent-<hash>
        let exe = std::env::current_exe().unwrap();
        let target = exe.ancestors().nth(3).unwrap().to_path_buf();
        note(format!(
            "building the node profile's inplaced into {}",
            target.display()
        ));
        let st = Command::new(env!("CARGO"))
            .args(["build", "--locked", "--quiet", "--profile", "node"])
            .args(["--bin", "inplaced"])
            .env("CARGO_TARGET_DIR", &target)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(
            st.success(),
            "cargo build --profile node --bin inplaced failed"
        );
        target.join("node/inplaced").display().to_string()
    })
    .clone()
}

fn main() {
    let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
    let n = if quick {
        Counts {
            startups: 3,
            apply_reps_200: 2,
            apply_reps_1: 5,
            idle: Duration::from_secs(5),
            example_calls: 1000,
            memory_calls: 2000,
            big_calls: 50,
        }
    } else {
        Counts {
            startups: 7,
            apply_reps_200: 7,
            apply_reps_1: 25,
            idle: Duration::from_secs(60),
            example_calls: 20_000,
            memory_calls: 30_000,
            big_calls: 50,
        }
    };
    // the client side on one thread: the daemon gets the other core
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(quick, n));
}

async fn run(quick: bool, n: Counts) {
    let mut rep = Report::default();
    if std::env::var("BENCH_ONLY").is_ok_and(|v| v == "kubelet") {
        kubelet_fields_scaling(&mut rep, quick).await;
        for l in &rep.tail {
            println!("{l}");
        }
        return;
    }
    if std::env::var("BENCH_ONLY").is_ok_and(|v| v == "coverage") {
        coverage_full::only(&mut rep, quick).await;
        for l in &rep.tail {
            println!("{l}");
        }
        return;
    }
    if std::env::var("BENCH_ONLY").is_ok_and(|v| v == "example") {
        note(format!("binary {} quick={quick}", daemon_binary()));
        let mut cov = Daemon::new("cov");
        cov.start().await;
        let idle = env_knob("BENCH_IDLE_S").unwrap_or(5);
        tokio::time::sleep(Duration::from_secs(idle)).await;
        let calls = env_knob("BENCH_EXAMPLE_CALLS").unwrap_or(n.example_calls);
        let ch = inplace_edge::client::channel(&cov.socket).await.unwrap();
        let (mut c, mut h) = (NodeAgentClient::new(ch.clone()), HealthClient::new(ch));
        coverage_example(&mut rep, &mut c, &mut h, &example_spec(), calls).await;
        cov.stop().await;
        for l in &rep.tail {
            println!("{l}");
        }
        return;
    }
    if std::env::var("BENCH_ONLY").is_ok_and(|v| v == "apply") {
        note(format!("binary {} quick={quick}", daemon_binary()));
        // more 1-file applies for a steadier CPU figure or a profile of them
        let mut n = n;
        if let Some(reps) = env_knob("BENCH_APPLY_REPS_1") {
            n.apply_reps_1 = reps;
        }
        let mut app = Daemon::new("apply");
        std::fs::create_dir_all(app.path("/etc/bench-apply")).unwrap();
        app.start().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        rep.fig("rss_idle_apply_node", rss_kib(app.pid()), "KiB");
        let (ca, ch) = apply_block(&app, &mut rep, &n).await;
        drop(ca);
        drop(ch);
        app.stop().await;
        for l in &rep.tail {
            println!("{l}");
        }
        return;
    }
    if std::env::var("BENCH_ONLY").is_ok_and(|v| v == "memory") {
        note(format!("binary {} quick={quick}", daemon_binary()));
        memory_under_operations(quick, &mut rep).await;
        for l in &rep.tail {
            println!("{l}");
        }
        return;
    }
    note(format!(
        "binary {} quick={quick} nproc={}",
        daemon_binary(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    ));

    // ---- 4b. start-up time to READY (fresh node copy each time)
    let mut starts = Vec::new();
    for i in 0..n.startups {
        let mut d = Daemon::new("start");
        starts.push(d.start().await);
        d.stop().await;
        note(format!("start {i}: {:.1} ms", ms(starts[i])));
    }
    rep.fig("startup_ready_first", ms(starts[0]), "ms");
    rep.fig("startup_ready_p50", ms(pct(&starts, 50.0)), "ms");
    rep.fig("startup_ready_max", ms(pct(&starts, 100.0)), "ms");

    // ---- the two long-lived daemons: C (coverage) and A (apply)
    let mut cov = Daemon::new("cov");
    create_files(&cov.root, 5000);
    // the default policy.max_files is 1000; the scaling series goes to 5000
    let mut cfg = OpenOptions::new()
        .append(true)
        .open(cov.dir.path().join("config.toml"))
        .unwrap();
    writeln!(cfg, "\n[policy]\nmax_files = 10000").unwrap();
    let mut app = Daemon::new("apply");
    std::fs::create_dir_all(app.path("/etc/bench-apply")).unwrap();
    let t_cov = cov.start().await;
    rep.fig("startup_ready_5000_extra_files", ms(t_cov), "ms");
    app.start().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_idle_cov = rss_kib(cov.pid());
    let rss_idle_app = rss_kib(app.pid());
    rep.fig("rss_idle", rss_idle_cov, "KiB");
    rep.fig("rss_idle_apply_node", rss_idle_app, "KiB");

    let (mut ca, ch_a) = apply_block(&app, &mut rep, &n).await;

    // leave 200 managed files on A, so its idle window includes the drift watcher's work
    timed_apply(&mut ca, &new_files_spec("managed", 200), "managed").await;
    drop(ca);
    drop(ch_a);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // ---- 4a. idle cost: C (fresh, nothing applied) and A (200 managed files), same window
    note(format!("idle window {:?}", n.idle));
    let (c0, a0) = (cpu_ms(cov.pid()), cpu_ms(app.pid()));
    let (sc0, sa0) = (sched(cov.pid()), sched(app.pid()));
    let t = Instant::now();
    tokio::time::sleep(n.idle).await;
    let secs = t.elapsed().as_secs_f64();
    let (c1, a1c) = (cpu_ms(cov.pid()), cpu_ms(app.pid()));
    let (sc1, sa1) = (sched(cov.pid()), sched(app.pid()));
    let scale = 60.0 / secs;
    rep.fig("idle_window", secs, "s");
    rep.fig("idle_cpu_per_60s", (c1 - c0) * scale, "ms");
    let (dc, dcw) = sched_delta(&sc0, &sc1);
    let (da, daw) = sched_delta(&sa0, &sa1);
    rep.fig("idle_cpu_per_60s_schedstat", dc * scale, "ms");
    rep.fig("idle_wakeups_per_s", dcw as f64 / secs, "1/s");
    rep.fig("idle_cpu_per_60s_200_managed", (a1c - a0) * scale, "ms");
    rep.fig("idle_cpu_per_60s_200_managed_schedstat", da * scale, "ms");
    rep.fig("idle_wakeups_per_s_200_managed", daw as f64 / secs, "1/s");
    rep.fig("rss_idle_200_managed", rss_kib(app.pid()), "KiB");
    app.stop().await;

    // ---- 1. coverage latency of the example spec vs an empty call, interleaved
    let ch = inplace_edge::client::channel(&cov.socket).await.unwrap();
    let mut c = NodeAgentClient::new(ch.clone());
    let mut h = HealthClient::new(ch.clone());
    let example_spec = example_spec();
    coverage_example(&mut rep, &mut c, &mut h, &example_spec, n.example_calls).await;

    // ---- 3. memory after N coverage calls of the example spec
    let done = 100 + n.example_calls + 1;
    let rss_warm = rss_kib(cov.pid());
    let (s0, t0) = (sched(cov.pid()), Instant::now());
    for _ in done..n.memory_calls {
        coverage(&mut c, &example_spec).await;
    }
    let calls = n.memory_calls.saturating_sub(done).max(1) as f64;
    rep.fig(
        "coverage_example_daemon_cpu_per_call",
        sched_delta(&s0, &sched(cov.pid())).0 * 1e3 / calls,
        "us",
    );
    rep.fig(
        "coverage_example_wall_per_call",
        us(t0.elapsed()) / calls,
        "us",
    );
    let rss_after = rss_kib(cov.pid());
    rep.fig(
        &format!("rss_after_{}_coverage_calls", n.memory_calls),
        rss_after,
        "KiB",
    );
    rep.fig(
        &format!("rss_growth_idle_to_{}_calls", n.memory_calls),
        rss_after - rss_idle_cov,
        "KiB",
    );
    rep.fig(
        &format!("rss_growth_{done}_to_{}_calls", n.memory_calls),
        rss_after - rss_warm,
        "KiB",
    );

    // ---- 1c (after 3: the memory figures count example calls only). Every section
    // (examples/specs/full.yaml): daemon CPU per call against the empty call
    coverage_full::coverage_full(
        &mut rep,
        "full",
        &cov.socket.clone(),
        cov.pid(),
        if quick { 4 } else { coverage_full::BLOCKS },
    )
    .await;

    // ---- 1b. 1000 files (990 identical, 10 changed) vs reading + hashing them
    let big = files_spec(1000, 10);
    let r = coverage(&mut c, &big).await;
    note(format!(
        "1000 files: {} change(s), fully covered {}",
        r.changes.len(),
        r.fully_covered
    ));
    let paths: Vec<PathBuf> = (0..1000).map(|i| cov.path(&file_path(i))).collect();
    for _ in 0..3 {
        timed_coverage(&mut c, &big).await;
        plain_hash(&paths);
    }
    let mut tb = Vec::new();
    let mut fb = Vec::new();
    for _ in 0..n.big_calls {
        fb.push(plain_hash(&paths));
        tb.push(timed_coverage(&mut c, &big).await);
    }
    latency_against_floor(
        &mut rep,
        ("coverage_1000_files", &tb),
        ("read_hash_1000_files", &fb),
        "floor",
    );
    // the same after a change: one of the files rewritten (same content) before each
    // call, so the answer is computed afresh, not kept (crates/agent/src/apply/kept.rs)
    let (mut tk, mut fk) = (Vec::new(), Vec::new());
    for k in 0..n.big_calls {
        let p = &paths[(k * 7) % paths.len()];
        let same = std::fs::read(p).unwrap();
        std::fs::write(p, same).unwrap();
        fk.push(plain_hash(&paths));
        tk.push(timed_coverage(&mut c, &big).await);
    }
    let (kp50, fkp50) = (pct(&tk, 50.0), pct(&fk, 50.0));
    rep.fig("coverage_1000_files_computed_p50", us(kp50), "us");
    rep.floor(
        "floor_read_hash_1000_files_computed_run_p50",
        us(fkp50),
        "us",
    );
    rep.ratio(
        "ratio_coverage_1000_files_computed_p50_vs_floor",
        us(kp50),
        us(fkp50),
    );

    // ---- 5. scaling: files (all identical to the node) and kubelet featureGates
    for (nf, calls) in [(10usize, 200usize), (100, 100), (1000, 30), (5000, 10)] {
        let calls = if quick {
            calls.div_ceil(4).max(3)
        } else {
            calls
        };
        let spec = files_spec(nf, 0);
        let r = coverage(&mut c, &spec).await;
        assert!(r.fully_covered && r.changes.is_empty(), "{nf} files: {r:?}");
        let mut ts = Vec::new();
        for _ in 0..calls {
            ts.push(timed_coverage(&mut c, &spec).await);
        }
        let p50 = pct(&ts, 50.0);
        rep.fig(&format!("coverage_files_{nf}_p50"), us(p50), "us");
        rep.fig(
            &format!("coverage_files_{nf}_per_file"),
            us(p50) / nf as f64,
            "us",
        );
    }
    for (nk, calls) in [(10usize, 300usize), (300, 100)] {
        let calls = if quick { calls / 4 } else { calls };
        let spec = kubelet_spec(nk);
        let r = coverage(&mut c, &spec).await;
        note(format!(
            "kubelet {nk} featureGates: {} change(s), fully covered {}",
            r.changes.len(),
            r.fully_covered
        ));
        let mut ts = Vec::new();
        for _ in 0..calls {
            ts.push(timed_coverage(&mut c, &spec).await);
        }
        let p50 = pct(&ts, 50.0);
        rep.fig(&format!("coverage_kubelet_fields_{nk}_p50"), us(p50), "us");
        rep.fig(
            &format!("coverage_kubelet_fields_{nk}_per_field"),
            us(p50) / nk as f64,
            "us",
        );
        rep.fig(
            &format!("coverage_kubelet_fields_{nk}_changes"),
            r.changes.len() as f64,
            "changes",
        );
        rep.fig(
            &format!("coverage_kubelet_fields_{nk}_covered"),
            r.fully_covered as u8 as f64,
            "bool",
        );
    }
    drop(c);
    drop(h);
    drop(ch);
    cov.stop().await;
    memory_under_operations(quick, &mut rep).await;
    rep.fig(
        "apply_aborted_retries",
        ABORTED.load(std::sync::atomic::Ordering::Relaxed) as f64,
        "calls",
    );

    for l in &rep.tail {
        println!("{l}");
    }
}

/// Coverage latency of `spec` (the example) against an empty call (`Health/Check`),
/// interleaved: 100 warm-up pairs, then `calls` pairs; p50 and p99 of each and their
/// ratios. Run alone, on a fresh daemon idle for `BENCH_IDLE_S` seconds (default 5),
/// with `BENCH_ONLY=example` (`BENCH_EXAMPLE_CALLS` sets `calls`).
async fn coverage_example(
    rep: &mut Report,
    c: &mut NodeAgentClient<Channel>,
    h: &mut HealthClient<Channel>,
    example_spec: &pb::NodeSpec,
    calls: usize,
) {
    let r = coverage(c, example_spec).await;
    note(format!(
        "example: {} change(s), fully covered {}",
        r.changes.len(),
        r.fully_covered
    ));
    for _ in 0..100 {
        timed_coverage(c, example_spec).await;
        timed_health(h).await;
    }
    let mut tc = Vec::new();
    let mut te = Vec::new();
    for _ in 0..calls {
        te.push(timed_health(h).await);
        tc.push(timed_coverage(c, example_spec).await);
    }
    latency_against_floor(rep, ("coverage_example", &tc), ("empty_call", &te), "empty");
}

/// The p50 and p99 of `xs` (`<what>_p50`, `<what>_p99`, `<what>_calls`) and of its floor
/// `ys` (`floor_<floor>_p50`, `_p99`), and their ratios (`ratio_<what>_p50_vs_<vs>`, `_p99`).
fn latency_against_floor(
    rep: &mut Report,
    (what, xs): (&str, &[Duration]),
    (floor, ys): (&str, &[Duration]),
    vs: &str,
) {
    let (x50, x99) = (pct(xs, 50.0), pct(xs, 99.0));
    let (y50, y99) = (pct(ys, 50.0), pct(ys, 99.0));
    rep.fig(&format!("{what}_p50"), us(x50), "us");
    rep.fig(&format!("{what}_p99"), us(x99), "us");
    rep.fig(&format!("{what}_calls"), xs.len() as f64, "calls");
    rep.floor(&format!("floor_{floor}_p50"), us(y50), "us");
    rep.floor(&format!("floor_{floor}_p99"), us(y99), "us");
    rep.ratio(&format!("ratio_{what}_p50_vs_{vs}"), us(x50), us(y50));
    rep.ratio(&format!("ratio_{what}_p99_vs_{vs}"), us(x99), us(y99));
}

// ------------------------------------------------------------------------------------------
// 6. Memory under operations (issue 16 section 1)

/// The apply section on daemon A: 200-file applies and their removals against the plain
/// loops, 1-file applies with the daemon's CPU, the fsyncs of one operation. Alone with
/// `BENCH_ONLY=apply`.
async fn apply_block(
    app: &Daemon,
    rep: &mut Report,
    n: &Counts,
) -> (NodeAgentClient<Channel>, Channel) {
    // ---- 2. durable apply throughput (on A), interleaved with the plain loop
    let plain_dir = app.dir.path().join("plain");
    std::fs::create_dir_all(&plain_dir).unwrap();
    let ch_a = inplace_edge::client::channel(&app.socket).await.unwrap();
    let mut ca = NodeAgentClient::new(ch_a.clone());
    let empty = pb::NodeSpec::default();
    let mut revert = 0usize;
    // warm-up: one apply and revert
    timed_apply(&mut ca, &new_files_spec("warm", 10), "warm").await;
    revert += 1;
    timed_apply(&mut ca, &empty, &format!("revert-{revert}")).await;
    let mut t200 = Vec::new();
    let mut p200 = Vec::new();
    // the removal of the 200 files (the revert), and its floor: unlink, one directory fsync
    let (mut r200, mut u200) = (Vec::new(), Vec::new());
    for k in 0..n.apply_reps_200 {
        let spec = new_files_spec(&format!("r{k}"), 200);
        let plain: Vec<(String, Vec<u8>)> = spec
            .files
            .iter()
            .map(|f| {
                (
                    Path::new(&f.path)
                        .file_name()
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                    f.content.clone(),
                )
            })
            .collect();
        p200.push(plain_durable(&plain_dir, &plain));
        u200.push(plain_cleanup(&plain_dir, &plain));
        t200.push(timed_apply(&mut ca, &spec, &format!("apply200-{k}")).await);
        revert += 1;
        r200.push(timed_apply(&mut ca, &empty, &format!("revert-{revert}")).await);
        note(format!(
            "apply 200 files {k}: {:.1} ms, plain {:.1} ms",
            ms(t200[k]),
            ms(p200[k])
        ));
    }
    let mut t1 = Vec::new();
    let mut p1 = Vec::new();
    // daemon CPU (schedstat, all threads) over the block of 1-file applies
    let mut cpu1 = 0.0;
    // the same from /proc/<pid>/stat (utime + stime, clock ticks): it includes threads that
    // exited during the apply (one per operation until issue 28 session 8), which the
    // schedstat sum of the threads alive at the end leaves out
    let mut cpu1_all = 0.0;
    let mut anon = Vec::new();
    // the floor of the daemon's CPU per 1-file apply, interleaved with the applies
    let mut cpu_floor = 0.0;
    note("1-file applies begin");
    for k in 0..n.apply_reps_1 {
        let spec = new_files_spec(&format!("one{k}"), 1);
        let plain = vec![(format!("one{k}.conf"), spec.files[0].content.clone())];
        p1.push(plain_durable(&plain_dir, &plain));
        plain_cleanup(&plain_dir, &plain);
        cpu_floor += plain_apply_cpu(&plain_dir, &format!("floor{k}"), &spec.files[0].content);
        let s0 = sched(app.pid());
        let c0 = cpu_ms(app.pid());
        t1.push(timed_apply(&mut ca, &spec, &format!("apply1-{k}")).await);
        cpu1 += sched_delta(&s0, &sched(app.pid())).0;
        cpu1_all += cpu_ms(app.pid()) - c0;
        anon.push(rss_anon_kib(app.pid()));
        revert += 1;
        timed_apply(&mut ca, &empty, &format!("revert-{revert}")).await;
    }
    let (a200, f200) = (pct(&t200, 50.0), pct(&p200, 50.0));
    let (a1, f1) = (pct(&t1, 50.0), pct(&p1, 50.0));
    rep.fig("apply_200_files_p50", ms(a200), "ms");
    rep.fig("apply_200_files_min", ms(pct(&t200, 0.0)), "ms");
    rep.fig("apply_200_files_per_file", us(a200) / 200.0, "us");
    rep.fig("apply_1_file_p50", ms(a1), "ms");
    rep.fig("apply_1_file_min", ms(pct(&t1, 0.0)), "ms");
    rep.fig("apply_fixed_overhead_p50", ms(a1.saturating_sub(f1)), "ms");
    rep.fig("apply_1_file_daemon_cpu", cpu1 / t1.len() as f64, "ms");
    rep.fig(
        "apply_1_file_daemon_cpu_all_threads",
        cpu1_all / t1.len() as f64,
        "ms",
    );
    let floor_cpu1 = cpu_floor / t1.len() as f64;
    rep.floor("floor_apply_1_file_cpu", floor_cpu1, "ms");
    rep.ratio(
        "ratio_apply_1_file_daemon_cpu_vs_floor",
        cpu1 / t1.len() as f64,
        floor_cpu1,
    );
    rep.fig(
        "rss_anon_after_1_file_applies",
        anon.last().copied().unwrap_or(0.0),
        "KiB",
    );
    let (rm200, fu200) = (pct(&r200, 50.0), pct(&u200, 50.0));
    rep.fig("remove_200_files_p50", ms(rm200), "ms");
    rep.floor("floor_unlink_200_files_p50", ms(fu200), "ms");
    rep.ratio("ratio_remove_200_vs_floor_p50", ms(rm200), ms(fu200));
    rep.floor("floor_durable_200_files_p50", ms(f200), "ms");
    rep.floor("floor_durable_200_files_min", ms(pct(&p200, 0.0)), "ms");
    rep.floor("floor_durable_1_file_p50", ms(f1), "ms");
    rep.ratio("ratio_apply_200_vs_floor_p50", ms(a200), ms(f200));
    rep.ratio(
        "ratio_apply_200_vs_floor_min",
        ms(pct(&t200, 0.0)),
        ms(pct(&p200, 0.0)),
    );
    rep.ratio("ratio_apply_1_vs_floor_p50", ms(a1), ms(f1));

    // the durable barriers of one operation, counted by strace (when it is installed)
    for (label, n_files) in [("1_file", 1usize), ("200_files", 200)] {
        let spec = new_files_spec(&format!("fs{n_files}"), n_files);
        let pid = app.pid();
        let applied = fsyncs(pid, timed_apply(&mut ca, &spec, &format!("fsync-{label}"))).await;
        revert += 1;
        let removed = fsyncs(
            pid,
            timed_apply(&mut ca, &empty, &format!("revert-{revert}")),
        )
        .await;
        if let (Some(a), Some(r)) = (applied, removed) {
            rep.fig(&format!("fsyncs_apply_{label}"), a as f64, "fsyncs");
            rep.fig(&format!("fsyncs_remove_{label}"), r as f64, "fsyncs");
        }
    }

    (ca, ch_a)
}

/// RSS of a daemon that ran 200 operations of 200 files (100 applies of 200 new files,
/// each followed by the removal of all of them), idle afterwards; then, on the same
/// daemon, 8 clients calling `GetCoverage` of the example spec in a loop while operations
/// run back to back, RSS sampled every second: the peak, and the growth over the last half
/// of the run (the highest sample of the last half minus the sample at half time).
async fn memory_under_operations(quick: bool, rep: &mut Report) {
    let (ops, window) = if quick {
        (40usize, Duration::from_secs(20))
    } else {
        (200, Duration::from_secs(120))
    };
    let mut d = Daemon::new("mem");
    std::fs::create_dir_all(d.path("/etc/bench-apply")).unwrap();
    d.start().await;
    let ch = inplace_edge::client::channel(&d.socket).await.unwrap();
    let mut c = NodeAgentClient::new(ch.clone());
    let empty = pb::NodeSpec::default();
    for k in 0..ops / 2 {
        timed_apply(
            &mut c,
            &new_files_spec(&format!("m{k}"), 200),
            &format!("m{k}"),
        )
        .await;
        timed_apply(&mut c, &empty, &format!("m{k}-rm")).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    rep.fig(
        &format!("rss_idle_after_{ops}_operations_of_200_files"),
        rss_kib(d.pid()),
        "KiB",
    );
    rep.fig(
        &format!("rss_anon_idle_after_{ops}_operations_of_200_files"),
        rss_anon_kib(d.pid()),
        "KiB",
    );
    rep.fig("threads_idle_after_operations", threads(d.pid()), "threads");
    note(format!(
        "memory: {ops} operations done; {window:?} of coverage clients and operations"
    ));
    let example_spec = example_spec();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (mut c, spec, stop) = (
            NodeAgentClient::new(ch.clone()),
            example_spec.clone(),
            stop.clone(),
        );
        clients.push(tokio::spawn(async move {
            // errors are counted, not fatal: a file removed between two reads of the
            // node's observation was an INTERNAL error (issue 16 section 4)
            let (mut calls, mut errors) = (0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let req = pb::GetCoverageRequest {
                    desired: Some(spec.clone()),
                    reboot_policy: 0,
                    diff: None,
                };
                if c.get_coverage(req).await.is_err() {
                    errors += 1;
                }
                calls += 1;
            }
            (calls, errors)
        }));
    }
    let pid = d.pid();
    let sampler = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut xs, mut anon, mut th) = (Vec::new(), 0.0f64, 0.0f64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                xs.push(rss_kib(pid));
                anon = anon.max(rss_anon_kib(pid));
                th = th.max(threads(pid));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            (xs, anon, th)
        })
    };
    let t = Instant::now();
    let mut k = 0;
    while t.elapsed() < window {
        timed_apply(
            &mut c,
            &new_files_spec(&format!("w{k}"), 200),
            &format!("w{k}"),
        )
        .await;
        timed_apply(&mut c, &empty, &format!("w{k}-rm")).await;
        k += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut calls, mut errors) = (0, 0);
    for cl in clients {
        let (c, e) = cl.await.unwrap();
        calls += c;
        errors += e;
    }
    let (xs, anon_peak, threads_peak) = sampler.await.unwrap();
    rep.fig(
        "rss_anon_peak_8_coverage_clients_and_operations",
        anon_peak,
        "KiB",
    );
    rep.fig("threads_peak_under_load", threads_peak, "threads");
    let half = xs.len() / 2;
    let peak = xs.iter().cloned().fold(0.0, f64::max);
    let last_half = xs[half..].iter().cloned().fold(0.0, f64::max);
    rep.fig("memory_window", t.elapsed().as_secs_f64(), "s");
    rep.fig("memory_window_operations", (2 * k) as f64, "operations");
    rep.fig("memory_window_coverage_calls", calls as f64, "calls");
    rep.fig("memory_window_coverage_errors", errors as f64, "calls");
    rep.fig("rss_peak_8_coverage_clients_and_operations", peak, "KiB");
    rep.fig("rss_growth_last_half", last_half - xs[half], "KiB");
    rep.fig("rss_end", rss_kib(pid), "KiB");
    drop(c);
    drop(ch);
    d.stop().await;
}
