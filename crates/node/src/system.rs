//! What the agent does to the running system beyond writing files: unit actions, commands
//! and reboots. One trait per backend family, each with a systemd implementation and a
//! recording one.
//!
//! The recording implementation ([`Recorder`]) appends each request as one line to a log
//! (`restart kubelet.service`, `run update-grub`, `reboot <reason>`) and reports success, so
//! the demo and black-box tests run where no systemd runs; `inplaced --service-manager
//! record` writes that log to `<state-dir>/actions.log`.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// A failed system action, with the command and its output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{action}: {detail}")]
pub struct SystemError {
    /// The action, e.g. `systemctl restart kubelet.service`.
    pub action: String,
    /// Exit status and output, or the spawn error.
    pub detail: String,
}

/// Controls systemd units (mirrors `systemctl restart|reload|daemon-reload|is-active`).
pub trait ServiceManager: Send + Sync + std::fmt::Debug {
    /// Restarts `unit` and waits for the job to finish.
    fn restart(&self, unit: &str) -> Result<(), SystemError>;
    /// Reloads `unit`.
    fn reload(&self, unit: &str) -> Result<(), SystemError>;
    /// Reloads the manager's unit files.
    fn daemon_reload(&self) -> Result<(), SystemError>;
    /// Restarts `unit` only if it is running (`systemctl try-restart`).
    fn try_restart(&self, unit: &str) -> Result<(), SystemError>;
    /// Stops `unit`.
    fn stop(&self, unit: &str) -> Result<(), SystemError>;
    /// Starts `unit`.
    fn start(&self, unit: &str) -> Result<(), SystemError>;
    /// Waits until `unit` is active (`systemctl is-active`), up to `timeout`. Implementations
    /// with no unit state to check (the recorder) return `Ok(false)`: "not checked".
    fn wait_active(&self, unit: &str, timeout: std::time::Duration) -> Result<bool, SystemError>;
}

/// Checks an HTTP health endpoint (the kubelet's `healthz`): `GET url` must answer 2xx
/// within `timeout`, polling every 500 ms. An unreachable endpoint is a failure, never a
/// pass. Errors name the URL, the last status or connection error and the time waited.
pub fn http_health(url: &str, timeout: std::time::Duration) -> Result<(), String> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| format!("health check URL {url:?} is not valid: {e}"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("health check runtime: {e}"))?;
    rt.block_on(async {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<http_body_util::Empty<bytes::Bytes>>();
        let start = std::time::Instant::now();
        let mut last;
        loop {
            let attempt =
                tokio::time::timeout(std::time::Duration::from_secs(5), client.get(uri.clone()))
                    .await;
            last = match attempt {
                Ok(Ok(resp)) if resp.status().is_success() => return Ok(()),
                Ok(Ok(resp)) => format!("answered {}", resp.status()),
                Ok(Err(e)) => format!("unreachable ({e})"),
                Err(_) => "did not answer within 5s".to_string(),
            };
            if start.elapsed() >= timeout {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        Err(format!(
            "GET {url} {last} (checked for {:.1}s)",
            start.elapsed().as_secs_f64()
        ))
    })
}

/// A kernel for a kexec reboot: paths as the host sees them (the agent passes node paths
/// under its `--root`), and the whole command line the new kernel gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KexecImage {
    /// The kernel image (`/boot/vmlinuz-6.1.0-28-amd64`).
    pub kernel: String,
    /// The initrd, when the kernel has one (`/boot/initrd.img-6.1.0-28-amd64`).
    pub initrd: Option<String>,
    /// The command line, as `/proc/cmdline` will show it.
    pub cmdline: String,
}

/// Reboots the node: a full reboot, or a kexec into a loaded kernel.
///
/// kexec goes through kexec-tools and systemd rather than the raw syscalls: `kexec -s -l`
/// is `kexec_file_load(2)` (the kernel reads and, under lockdown or with
/// `CONFIG_KEXEC_SIG`, verifies the image itself; the older `kexec_load(2)` is what
/// lockdown forbids; run by PID 1 with `systemd-run`, as the agent's unit has no
/// `CAP_SYS_BOOT`), and `systemctl kexec` stops the units and unmounts the file systems
/// as `systemctl reboot` does before the kernel jumps (`reboot(LINUX_REBOOT_CMD_KEXEC)`
/// straight from the agent would skip that orderly shutdown). See kexec(8),
/// kexec_file_load(2) and systemctl(1) `kexec`.
pub trait Rebooter: Send + Sync + std::fmt::Debug {
    /// Requests a reboot; `reason` is logged by the system.
    fn reboot(&self, reason: &str) -> Result<(), SystemError>;
    /// Loads `image` for the next kexec (`kexec -s -l KERNEL --initrd=INITRD
    /// --command-line=CMDLINE`). Errors carry kexec's output (a refused signature, a
    /// kernel built without `CONFIG_KEXEC_FILE`, `kexec_load_disabled`).
    fn kexec_load(&self, image: &KexecImage) -> Result<(), SystemError>;
    /// Reboots into the loaded kernel without firmware (`systemctl kexec`); `reason` is
    /// logged.
    fn kexec(&self, reason: &str) -> Result<(), SystemError>;
}

/// The argv of `kexec -s -l` for `image` (kexec-tools; `-s` is `kexec_file_load`).
pub fn kexec_load_argv(image: &KexecImage) -> Vec<String> {
    let mut argv = vec![
        "kexec".to_string(),
        "-s".into(),
        "-l".into(),
        image.kernel.clone(),
    ];
    if let Some(i) = &image.initrd {
        argv.push(format!("--initrd={i}"));
    }
    argv.push(format!("--command-line={}", image.cmdline));
    argv
}

/// Runs host commands such as `update-grub`.
pub trait CommandRunner: Send + Sync + std::fmt::Debug {
    /// Runs `argv` to completion; returns its combined output.
    fn run(&self, argv: &[String]) -> Result<String, SystemError>;

    /// Runs a read-only command (`kubelet --version`, `apt-mark showhold`) for its
    /// output: what observation asks, never recorded as an action.
    fn query(&self, argv: &[String]) -> Result<String, SystemError> {
        crate::sysroot::trace::poison(&format!("ran {}", argv.join(" ")));
        self.run(argv)
    }
}

fn run_command(argv: &[String]) -> Result<String, SystemError> {
    run_command_env(argv, &[])
}

fn run_command_env(
    argv: &[String],
    env: &[(&str, &std::path::Path)],
) -> Result<String, SystemError> {
    let action = argv.join(" ");
    let Some((prog, args)) = argv.split_first() else {
        return Err(SystemError {
            action,
            detail: "empty command".into(),
        });
    };
    let out = Command::new(prog)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .output()
        .map_err(|e| SystemError {
            action: action.clone(),
            detail: e.to_string(),
        })?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(SystemError {
            action,
            detail: format!("{}: {}", out.status, text.trim()),
        })
    }
}

/// The real system: `systemctl` and `systemctl reboot`, commands run as given.
#[derive(Debug, Default)]
pub struct Systemd;

impl ServiceManager for Systemd {
    fn restart(&self, unit: &str) -> Result<(), SystemError> {
        run_command(&["systemctl".into(), "restart".into(), unit.into()]).map(|_| ())
    }
    fn reload(&self, unit: &str) -> Result<(), SystemError> {
        run_command(&["systemctl".into(), "reload".into(), unit.into()]).map(|_| ())
    }
    fn daemon_reload(&self) -> Result<(), SystemError> {
        run_command(&["systemctl".into(), "daemon-reload".into()]).map(|_| ())
    }
    fn try_restart(&self, unit: &str) -> Result<(), SystemError> {
        run_command(&["systemctl".into(), "try-restart".into(), unit.into()]).map(|_| ())
    }
    fn stop(&self, unit: &str) -> Result<(), SystemError> {
        run_command(&["systemctl".into(), "stop".into(), unit.into()]).map(|_| ())
    }
    fn start(&self, unit: &str) -> Result<(), SystemError> {
        run_command(&["systemctl".into(), "start".into(), unit.into()]).map(|_| ())
    }
    fn wait_active(&self, unit: &str, timeout: std::time::Duration) -> Result<bool, SystemError> {
        let start = std::time::Instant::now();
        loop {
            let out = run_command(&["systemctl".into(), "is-active".into(), unit.into()]);
            match out {
                Ok(_) => return Ok(true),
                Err(e) if start.elapsed() >= timeout => {
                    return Err(SystemError {
                        action: format!("systemctl is-active {unit}"),
                        detail: format!(
                            "not active after {:.0}s: {}",
                            timeout.as_secs_f64(),
                            e.detail
                        ),
                    });
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(500)),
            }
        }
    }
}

impl Rebooter for Systemd {
    fn reboot(&self, reason: &str) -> Result<(), SystemError> {
        tracing::warn!(reason, "rebooting");
        run_command(&["systemctl".into(), "reboot".into()]).map(|_| ())
    }
    /// Runs `kexec -s -l` as a transient unit of PID 1 (`systemd-run --wait --pipe`): the
    /// agent's unit keeps `CAP_SYS_BOOT` out of its bounding set (its reboots go through
    /// PID 1 too), and `kexec_file_load(2)` needs it.
    fn kexec_load(&self, image: &KexecImage) -> Result<(), SystemError> {
        let mut argv: Vec<String> = [
            "systemd-run",
            "--quiet",
            "--wait",
            "--pipe",
            "--collect",
            "--description=inplaced: kexec load",
            "--",
        ]
        .map(String::from)
        .to_vec();
        argv.extend(kexec_load_argv(image));
        run_command(&argv).map(|_| ())
    }
    fn kexec(&self, reason: &str) -> Result<(), SystemError> {
        tracing::warn!(reason, "rebooting with kexec");
        run_command(&["systemctl".into(), "kexec".into()]).map(|_| ())
    }
}

impl CommandRunner for Systemd {
    fn run(&self, argv: &[String]) -> Result<String, SystemError> {
        crate::sysroot::trace::poison(&format!("ran {}", argv.join(" ")));
        run_command(argv)
    }
}

/// Records every request (in memory, and in a log file when given) and reports success,
/// except for requests that start with one of the `failing` prefixes, which are recorded
/// and fail (fault injection for tests and demos: `INPLACED_RECORD_FAIL="restart kubelet"`).
///
/// Programs named in [`Recorder::exec_in`] (stand-ins for kubeadm, the kubelet or a
/// package manager, installed in a test's sysroot) are also run, from the sysroot, so
/// that their output and effects are what the agent sees.
#[derive(Debug, Default)]
pub struct Recorder {
    log: Option<PathBuf>,
    calls: Mutex<Vec<String>>,
    failing: Vec<String>,
    exec: Option<(PathBuf, Vec<String>)>,
}

impl Recorder {
    /// A recorder that also appends to `log` (one line per call, fsynced).
    pub fn with_log(log: PathBuf) -> Self {
        Recorder {
            log: Some(log),
            calls: Mutex::new(Vec::new()),
            failing: Vec::new(),
            exec: None,
        }
    }

    /// Runs the `programs` (argv[0] as the agent names them: `/usr/bin/kubeadm`, or a
    /// bare name found in the sysroot's `/usr/bin`) from the sysroot `root`, with
    /// `INPLACED_STANDIN_ROOT=<root>` in their environment (`INPLACED_RECORD_EXEC`).
    pub fn exec_in(mut self, root: PathBuf, programs: impl IntoIterator<Item = String>) -> Self {
        let p: Vec<String> = programs.into_iter().filter(|p| !p.is_empty()).collect();
        if !p.is_empty() {
            self.exec = Some((root, p));
        }
        self
    }

    /// The stand-in run for `argv` from the sysroot, when its program is listed.
    fn exec(&self, argv: &[String]) -> Option<Result<String, SystemError>> {
        let (root, programs) = self.exec.as_ref()?;
        let prog = argv.first()?;
        if !programs.iter().any(|p| p == prog) {
            return None;
        }
        let rel = if prog.starts_with('/') {
            prog.trim_start_matches('/').to_string()
        } else {
            format!("usr/bin/{prog}")
        };
        let mut full = vec![root.join(rel).display().to_string()];
        full.extend(argv[1..].iter().cloned());
        Some(
            run_command_env(&full, &[("INPLACED_STANDIN_ROOT", root)]).map_err(|e| SystemError {
                action: argv.join(" "),
                detail: e.detail,
            }),
        )
    }

    /// Makes requests starting with any of `prefixes` fail (after being recorded).
    pub fn failing(mut self, prefixes: impl IntoIterator<Item = String>) -> Self {
        self.failing = prefixes.into_iter().filter(|p| !p.is_empty()).collect();
        self
    }

    /// The calls recorded so far, e.g. `["restart kubelet.service"]`.
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    fn record(&self, line: String) -> Result<(), SystemError> {
        if let Some(path) = &self.log {
            let write = || -> std::io::Result<()> {
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?;
                writeln!(f, "{line}")?;
                f.sync_all()
            };
            write().map_err(|e| SystemError {
                action: line.clone(),
                detail: format!("{}: {e}", path.display()),
            })?;
        }
        let fails = self.failing.iter().any(|p| line.starts_with(p.as_str()));
        if let Ok(mut c) = self.calls.lock() {
            c.push(line.clone());
        }
        if fails {
            return Err(SystemError {
                action: line,
                detail: "failed on purpose (INPLACED_RECORD_FAIL)".into(),
            });
        }
        Ok(())
    }
}

impl ServiceManager for Recorder {
    fn restart(&self, unit: &str) -> Result<(), SystemError> {
        self.record(format!("restart {unit}"))
    }
    fn reload(&self, unit: &str) -> Result<(), SystemError> {
        self.record(format!("reload {unit}"))
    }
    fn daemon_reload(&self) -> Result<(), SystemError> {
        self.record("daemon-reload".into())
    }
    fn try_restart(&self, unit: &str) -> Result<(), SystemError> {
        self.record(format!("try-restart {unit}"))
    }
    fn stop(&self, unit: &str) -> Result<(), SystemError> {
        self.record(format!("stop {unit}"))
    }
    fn start(&self, unit: &str) -> Result<(), SystemError> {
        self.record(format!("start {unit}"))
    }
    fn wait_active(&self, _unit: &str, _timeout: std::time::Duration) -> Result<bool, SystemError> {
        Ok(false)
    }
}

impl Rebooter for Recorder {
    fn reboot(&self, reason: &str) -> Result<(), SystemError> {
        self.record(format!("reboot {reason}"))
    }
    /// Recorded as `kexec-load <kexec -s -l argv after "kexec">`; fails like any request
    /// with `INPLACED_RECORD_FAIL="kexec-load"` (a kernel that refuses the image).
    fn kexec_load(&self, image: &KexecImage) -> Result<(), SystemError> {
        self.record(format!(
            "kexec-load {}",
            kexec_load_argv(image)[1..].join(" ")
        ))
    }
    fn kexec(&self, reason: &str) -> Result<(), SystemError> {
        self.record(format!("kexec {reason}"))
    }
}

impl CommandRunner for Recorder {
    fn run(&self, argv: &[String]) -> Result<String, SystemError> {
        crate::sysroot::trace::poison(&format!("ran {}", argv.join(" ")));
        self.record(format!("run {}", argv.join(" ")))?;
        self.exec(argv).unwrap_or(Ok(String::new()))
    }

    /// Stand-ins are run, unrecorded; any other query fails (there is no host to ask).
    fn query(&self, argv: &[String]) -> Result<String, SystemError> {
        crate::sysroot::trace::poison(&format!("ran {}", argv.join(" ")));
        self.exec(argv).unwrap_or_else(|| {
            Err(SystemError {
                action: argv.join(" "),
                detail:
                    "not run by the recording service manager (list it in INPLACED_RECORD_EXEC)"
                        .into(),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_logs_in_order() {
        let d = tempfile::tempdir().unwrap();
        let r = Recorder::with_log(d.path().join("actions.log"));
        r.restart("kubelet.service").unwrap();
        r.run(&["update-grub".into()]).unwrap();
        assert_eq!(
            r.calls(),
            vec!["restart kubelet.service", "run update-grub"]
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join("actions.log")).unwrap(),
            "restart kubelet.service\nrun update-grub\n"
        );
    }

    #[test]
    fn kexec_is_recorded_as_kexec_tools_would_be_called() {
        let r = Recorder::default().failing(["kexec-load".to_string()]);
        let image = KexecImage {
            kernel: "/boot/vmlinuz-6.1.0-28-amd64".into(),
            initrd: Some("/boot/initrd.img-6.1.0-28-amd64".into()),
            cmdline: "root=UUID=1 ro quiet".into(),
        };
        assert!(r.kexec_load(&image).is_err());
        r.kexec("op x").unwrap();
        assert_eq!(
            r.calls(),
            vec![
                "kexec-load -s -l /boot/vmlinuz-6.1.0-28-amd64 --initrd=/boot/initrd.img-6.1.0-28-amd64 --command-line=root=UUID=1 ro quiet",
                "kexec op x"
            ]
        );
    }

    #[test]
    fn failing_command_reports_status_and_output() {
        let e =
            run_command(&["sh".into(), "-c".into(), "echo boom >&2; exit 3".into()]).unwrap_err();
        assert!(e.detail.contains("boom") && e.detail.contains('3'), "{e}");
    }
}
