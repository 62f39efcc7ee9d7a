//! Harness for black-box tests: a copy of a fixture node in a temp dir, the real `inplaced`
//! binary on a temporary socket with `--service-manager record`, `inplacectl` and a gRPC
//! client against it.
#![allow(dead_code)]

pub(crate) mod capi;
pub(crate) mod k8s;
pub(crate) mod kept;
pub(crate) mod pki;
pub(crate) mod scrape;
mod tree;
pub(crate) mod upstream;

pub(crate) use tree::copy_tree;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use inplace_wire::pb;
use inplace_wire::pb::node_agent_client::NodeAgentClient;
use tonic::transport::Channel;

/// Vendored fixture nodes.
pub(crate) fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/nodes")
        .join(name)
}

/// Every regular file under `dir` with its bytes and mode, for "nothing changed" checks.
pub(crate) fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap()).collect();
        entries.sort_by_key(|e| e.path());
        for e in entries {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
                out.push((e.path(), Vec::new(), m.permissions().mode()));
            } else if m.is_file() {
                out.push((
                    e.path(),
                    std::fs::read(e.path()).unwrap(),
                    m.permissions().mode(),
                ));
            }
        }
    }
    out.sort();
    out
}

/// A temporary directory inplaced trusts its config in: it and every directory above it
/// owned by root or the test's uid and not group- or other-writable (inplaced's
/// StrictModes rule, `src/node/trust.rs`; `/tmp` is world-writable, so not there). Under
/// `$INPLACED_TEST_TMPDIR` when set (a checkout whose directories break the rule needs
/// it), else cargo's `CARGO_TARGET_TMPDIR`.
pub(crate) fn tempdir() -> tempfile::TempDir {
    let base = std::env::var_os("INPLACED_TEST_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::tempdir_in(base).unwrap()
}

/// A node copy plus a running daemon.
pub(crate) struct Node {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub state: PathBuf,
    pub socket: PathBuf,
    pub config: PathBuf,
    child: Option<Child>,
    pub umask: Option<u32>,
    /// INPLACED_RECORD_FAIL for the daemon.
    pub fail: Option<String>,
    /// INPLACED_FAILPOINTS for the daemon.
    pub failpoints: Option<String>,
    /// Send the daemon's log here (at debug level) instead of the test's stderr.
    pub log_file: Option<PathBuf>,
    /// RLIMIT_NOFILE (soft and hard) for the daemon.
    pub nofile: Option<u64>,
    /// More environment for the daemon (`INPLACED_RECORD_EXEC`).
    pub env: Vec<(String, String)>,
}

impl Node {
    /// Copies fixture `name` and adds the `/proc/sys` entries the tests use.
    pub(crate) fn new(name: &str) -> Node {
        let dir = tempdir();
        let root = dir.path().join("root");
        copy_tree(&fixture(name), &root);
        // the kernel parameters the tests use, then those the node's sysctl.d files set,
        // with the values they set (as after boot)
        let mut params = vec![
            ("vm.max_map_count".to_string(), "65530".to_string()),
            ("vm.swappiness".to_string(), "60".to_string()),
            (
                "fs.inotify.max_user_instances".to_string(),
                "128".to_string(),
            ),
            (
                "kernel.random.boot_id".to_string(),
                "11111111-1111-1111-1111-111111111111".to_string(),
            ),
        ];
        if let Ok(dir) = std::fs::read_dir(root.join("etc/sysctl.d")) {
            let mut names: Vec<_> = dir.map(|e| e.unwrap().path()).collect();
            names.sort();
            for f in names {
                let text = std::fs::read_to_string(f).unwrap();
                params.extend(inplace_formats::sysctl::parse_sysctl_conf(&text));
            }
        }
        for (k, v) in params {
            let p = root.join("proc/sys").join(k.replace('.', "/"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, format!("{v}\n")).unwrap();
        }
        let config = dir.path().join("config.toml");
        std::fs::write(&config, "").unwrap();
        Node {
            state: dir.path().join("state"),
            socket: dir.path().join("run/inplaced.sock"),
            config,
            root,
            dir,
            child: None,
            umask: None,
            fail: None,
            failpoints: None,
            log_file: None,
            nofile: None,
            env: Vec::new(),
        }
    }

    /// Path of a node file.
    pub(crate) fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    /// Reads a node file as text.
    pub(crate) fn read(&self, p: &str) -> String {
        std::fs::read_to_string(self.path(p)).unwrap()
    }

    /// `inplaced` with this node's root, state directory, socket and config, recording unit
    /// actions.
    pub(crate) fn daemon(&self) -> Command {
        self.daemon_with(&self.state, &self.socket)
    }

    /// `inplaced` on this node's root and config with another state directory and socket.
    pub(crate) fn daemon_with(&self, state: &Path, socket: &Path) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_inplaced"));
        c.arg("--root")
            .arg(&self.root)
            .arg("--state-dir")
            .arg(state)
            .arg("--socket")
            .arg(socket)
            .arg("--config")
            .arg(&self.config)
            .args(["--service-manager", "record", "--log", "warn"]);
        c
    }

    /// Starts `inplaced` and waits until it answers.
    pub(crate) fn start(&mut self) {
        let bin = env!("CARGO_BIN_EXE_inplaced");
        let mut prefix = String::new();
        if let Some(u) = self.umask {
            prefix.push_str(&format!("umask {u:03o}; "));
        }
        if let Some(n) = self.nofile {
            prefix.push_str(&format!("ulimit -n {n}; "));
        }
        let mut cmd = if prefix.is_empty() {
            Command::new(bin)
        } else {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("{prefix}exec \"$0\" \"$@\""))
                .arg(bin);
            c
        };
        cmd.arg("--root")
            .arg(&self.root)
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--config")
            .arg(&self.config)
            .arg("--service-manager")
            .arg("record")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        match &self.log_file {
            Some(f) => {
                let file = std::fs::File::create(f).unwrap();
                cmd.args(["--log", "debug"]).stderr(file);
            }
            None => {
                let filter = self
                    .env
                    .iter()
                    .find(|(k, _)| k == "INPLACED_LOG")
                    .map_or("warn", |(_, v)| v.as_str());
                cmd.args(["--log", filter]).stderr(Stdio::inherit());
            }
        }
        if let Some(f) = &self.fail {
            cmd.env("INPLACED_RECORD_FAIL", f);
        }
        if let Some(f) = &self.failpoints {
            cmd.env("INPLACED_FAILPOINTS", f);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let child = cmd.spawn().expect("spawn inplaced");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!("inplaced exited early: {status}");
            }
            if self.socket.exists() && std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "inplaced did not start listening on {}",
            self.socket.display()
        );
    }

    /// The daemon's pid, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The daemon's log so far (`log_file` must be set before `start`).
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.log_file.as_ref().expect("log_file is set"))
            .unwrap_or_default()
    }

    /// Starts the daemon with `failpoint` (`INPLACED_FAILPOINTS`), applies `yaml` as
    /// operation `crash`, and asserts the daemon dies there by SIGKILL.
    pub(crate) async fn die_at(&mut self, failpoint: &str, yaml: &str) {
        self.failpoints = Some(failpoint.to_string());
        self.start();
        assert_eq!(
            self.apply_until_exit(yaml, "crash").await,
            Some(9),
            "{failpoint}: the agent must die by SIGKILL"
        );
        self.failpoints = None;
    }

    /// Applies `yaml` as operation `id` on the running daemon and waits (20 s at most)
    /// for the daemon to exit: the signal that ended it, None if it did not exit or exited
    /// by itself.
    pub(crate) async fn apply_until_exit(&mut self, yaml: &str, id: &str) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        let _ = self
            .client()
            .await
            .apply(pb::ApplyRequest {
                desired: Some(spec(yaml)),
                operation_id: id.into(),
                ..Default::default()
            })
            .await;
        self.wait_exit(Duration::from_secs(20))
            .and_then(|s| s.signal())
    }

    /// Waits for the daemon to exit by itself (e.g. at a failpoint); None on timeout.
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        let c = self.child.as_mut()?;
        loop {
            if let Ok(Some(s)) = c.try_wait() {
                self.child = None;
                return Some(s);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the daemon with SIGTERM and waits for it.
    pub(crate) fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        let pid = nix::unistd::Pid::from_raw(c.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(s)) = c.try_wait() {
                return Some(s);
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                return c.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A simulated boot: stops the daemon, makes `/proc/cmdline` `cmdline` and the boot
    /// id `boot_id`, and starts the daemon again (the agent's start in the new boot).
    pub(crate) fn boot_into(&mut self, cmdline: &str, boot_id: &str) {
        self.stop();
        std::fs::write(self.path("/proc/cmdline"), format!("{cmdline}\n")).unwrap();
        std::fs::write(
            self.path("/proc/sys/kernel/random/boot_id"),
            format!("{boot_id}\n"),
        )
        .unwrap();
        self.start();
    }

    /// Runs `inplacectl --socket <sock> args...`.
    pub(crate) fn ctl(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_inplacectl"))
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run inplacectl")
    }

    /// Writes a spec file into the temp dir and returns its path.
    pub(crate) fn spec(&self, name: &str, yaml: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, yaml).unwrap();
        p.display().to_string()
    }

    /// The recorded unit actions and reboots.
    pub(crate) fn actions(&self) -> Vec<String> {
        std::fs::read_to_string(self.state.join("actions.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// A gRPC client.
    pub(crate) async fn client(&self) -> NodeAgentClient<Channel> {
        inplace_edge::client::connect(&self.socket).await.unwrap()
    }

    /// Waits until operation `id` settles and returns it.
    /// The operation history, newest first.
    pub(crate) async fn operations(&self) -> Vec<pb::Operation> {
        self.client()
            .await
            .list_operations(pb::ListOperationsRequest {})
            .await
            .unwrap()
            .into_inner()
            .operations
    }

    /// Starts the daemon after a crash and waits for operation `id`, which must have been
    /// rolled back from the write-ahead journal at the start; returns it.
    pub(crate) async fn start_after_crash(&mut self, id: &str) -> pb::Operation {
        self.start();
        let op = self.settle(id).await;
        assert_eq!(op.phase, pb::Phase::RolledBack as i32, "{}", op.message);
        assert!(
            op.message
                .contains("rolled back from the write-ahead journal"),
            "{}",
            op.message
        );
        op
    }

    pub(crate) async fn settle(&self, id: &str) -> pb::Operation {
        let mut c = self.client().await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let op = c
                .get_operation(pb::GetOperationRequest { id: id.into() })
                .await
                .unwrap()
                .into_inner();
            if inplace_wire::phase::is_settled(op.phase) {
                return op;
            }
            assert!(
                Instant::now() < deadline,
                "operation {id} did not settle: {op:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Parses a YAML spec into the wire form.
/// `/proc/cmdline` of the `ubuntu-2404-grub` fixture node.
#[allow(dead_code)]
pub(crate) const UBUNTU_PROC: &str = "BOOT_IMAGE=/boot/vmlinuz-6.8.0-90-generic root=UUID=9074757c-80e3-4fbb-85eb-30ac5d8144a1 ro intel_iommu=on iommu=pt console=tty1 console=ttyS0 default_hugepagesz=1G hugepagesz=1G hugepages=16";

pub(crate) fn spec(yaml: &str) -> pb::NodeSpec {
    inplace_wire::yaml::parse(yaml).unwrap()
}

/// stdout as text.
pub(crate) fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// stderr as text.
pub(crate) fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Coverage of a YAML spec (reboot policy CALLER_HANDLES).
pub(crate) async fn coverage(node: &Node, yaml: &str) -> pb::CoverageReport {
    node.client()
        .await
        .get_coverage(pb::GetCoverageRequest {
            desired: Some(spec(yaml)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

/// Applies a YAML spec under `id` with `policy` and waits until the operation settles.
pub(crate) async fn apply_with(
    node: &Node,
    yaml: &str,
    id: &str,
    policy: pb::RebootPolicy,
) -> pb::Operation {
    let op = node
        .client()
        .await
        .apply(pb::ApplyRequest {
            diff: None,
            desired: Some(spec(yaml)),
            operation_id: id.into(),
            reboot_policy: policy as i32,
            dry_run: false,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("apply {id}: {e:?}"))
        .into_inner();
    node.settle(&op.id).await
}

/// Applies a YAML spec under `id` (CALLER_HANDLES) and waits until it settles.
pub(crate) async fn apply(node: &Node, yaml: &str, id: &str) -> pb::Operation {
    apply_with(node, yaml, id, pb::RebootPolicy::CallerHandles).await
}

/// The change `id` of a report.
pub(crate) fn change<'a>(r: &'a pb::CoverageReport, id: &str) -> &'a pb::Change {
    r.changes
        .iter()
        .find(|c| c.id == id)
        .unwrap_or_else(|| panic!("no change {id} in {:#?}", r.changes))
}

/// The agent's status.
pub(crate) async fn status(node: &Node) -> pb::NodeStatus {
    node.client()
        .await
        .get_status(pb::GetStatusRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// Applies `yaml` as operation `id` and returns the gRPC error (the call must be refused).
pub(crate) async fn apply_refused(node: &Node, yaml: &str, id: &str) -> tonic::Status {
    node.client()
        .await
        .apply(pb::ApplyRequest {
            desired: Some(spec(yaml)),
            operation_id: id.into(),
            ..Default::default()
        })
        .await
        .expect_err("apply must be refused")
}

/// Applies and returns the refusal's code and message.
pub(crate) async fn refusal(node: &Node, yaml: &str) -> (tonic::Code, String) {
    let e = apply_refused(node, yaml, "odd").await;
    (e.code(), e.message().to_string())
}

/// The ids of a status's drift entries.
pub(crate) fn drift_ids(s: &pb::NodeStatus) -> Vec<String> {
    s.drift.iter().map(|d| d.id.clone()).collect()
}

/// The README's scenario A: a kubelet flag, a KubeletConfiguration field and a sysctl file.
pub(crate) const SCENARIO_A: &str = include_str!("../../examples/specs/kubelet-and-sysctl.yaml");

/// 20 files, a kubelet config change and a sysctl (the crash workload).
pub(crate) fn workload() -> String {
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

/// The level of a disruption that must be there.
pub(crate) fn level(d: &Option<pb::Disruption>) -> pb::DisruptionLevel {
    pb::DisruptionLevel::try_from(d.as_ref().unwrap().level).unwrap()
}

/// Peak resident memory of a process, bytes (`VmHWM`).
pub(crate) fn peak_rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// The applied record as the agent reads it from `state` (the state directory): the
/// record of the pending commit (`journal/<op>.commit`) with the highest generation,
/// else `applied.json`; None when there is neither. The commit's seal is not checked
/// (only files the agent wrote are read here).
pub(crate) fn applied_record(state: &Path) -> Option<serde_json::Value> {
    let mut best: Option<(u64, serde_json::Value)> = None;
    for e in std::fs::read_dir(state.join("journal"))
        .into_iter()
        .flatten()
    {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !name.ends_with(".commit") {
            continue;
        }
        let b = std::fs::read(e.path()).unwrap();
        // the seal's header line, then the commit's JSON line, then the spec
        let mut lines = b.splitn(3, |c| *c == b'\n');
        let (_, Some(head)) = (lines.next(), lines.next()) else {
            continue;
        };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(head) else {
            continue;
        };
        let g = v["generation"].as_u64().unwrap_or(0);
        if best.as_ref().is_none_or(|(b, _)| g > *b) {
            best = Some((g, v["record"].clone()));
        }
    }
    best.map(|(_, r)| r).or_else(|| {
        let b = std::fs::read(state.join("applied.json")).ok()?;
        serde_json::from_slice(&b).ok()
    })
}

/// `body` sealed as the agent seals a state file: a header line with its SHA-256 and
/// length (`inplaced-sealed sha256:<hex> len=<bytes>`), then the body.
pub(crate) fn sealed(body: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    let mut out = format!(
        "inplaced-sealed sha256:{:x} len={}\n",
        sha2::Sha256::digest(body),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}
