//! `inplaced`: the node agent daemon.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, ValueEnum};

use crate::apply::{Agent, AgentParts};
use crate::config::Config;
use inplace_node::system::{CommandRunner, Rebooter, Recorder, ServiceManager, Systemd};

/// How unit actions and reboots are carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ServiceManagerKind {
    /// systemctl on the live host.
    Systemd,
    /// Append each unit action, command and reboot request to <state-dir>/actions.log and
    /// report success (demo and tests, where no systemd runs). Requests starting with a
    /// prefix listed in INPLACED_RECORD_FAIL (comma-separated) fail instead. Programs
    /// listed in INPLACED_RECORD_EXEC (comma-separated, e.g. `/usr/bin/kubeadm`) are run
    /// from the root (test stand-ins for kubeadm, the kubelet, a package manager).
    Record,
}

/// On-node in-place update agent for Cluster API managed nodes.
#[derive(Debug, Parser)]
#[command(
    name = "inplaced",
    version,
    about = "On-node in-place update agent for Cluster API managed bare-metal Kubernetes nodes"
)]
pub struct Args {
    /// The node's root file system (sysroot); every host path is read and written under it.
    #[arg(long, default_value = "/", env = "INPLACED_ROOT")]
    pub root: PathBuf,
    /// State directory: applied record, operation history, saved originals.
    #[arg(long, default_value = "/var/lib/inplaced", env = "INPLACED_STATE_DIR")]
    pub state_dir: PathBuf,
    /// Unix socket of the local API (mode 0600).
    #[arg(
        long,
        default_value = "/run/inplaced/inplaced.sock",
        env = "INPLACED_SOCKET"
    )]
    pub socket: PathBuf,
    /// Agent config (TOML). A missing file at the default path means defaults.
    #[arg(
        long,
        default_value = "/etc/inplaced/config.toml",
        env = "INPLACED_CONFIG"
    )]
    pub config: PathBuf,
    /// How unit actions and reboots are carried out.
    #[arg(long, value_enum, default_value_t = ServiceManagerKind::Systemd)]
    pub service_manager: ServiceManagerKind,
    /// Log filter: a level and comma-separated target=level directives, e.g. "info" or
    /// "inplaced=debug,h2=off".
    #[arg(long, default_value = "info", env = "INPLACED_LOG")]
    pub log: String,
}

/// Runs the daemon until SIGTERM or SIGINT.
pub fn main() -> ExitCode {
    abort_on_panic_outside_requests();
    let args = Args::parse();
    if let Err(e) = inplace_edge::logging::init(&args.log) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    inplace_edge::process::exit(run(args))
}

/// The name of the async runtime's threads (its workers and its blocking pool), where
/// the gRPC requests run.
const REQUEST_THREAD: &str = "inplaced-request";

/// Makes a panic end the daemon by SIGABRT, once the default hook has printed it (to
/// stderr: the journal under the unit), unless it happened on one of the runtime's
/// [`REQUEST_THREAD`]s.
///
/// - **Our own threads** (the operation thread, a try window's, the drift watcher) hold an
///   operation or a duty no one else takes over: under unwinding alone a panicking
///   operation thread left the process serving with its operation `running` forever and
///   every later Apply refused. Ended, the daemon is a crash that the journal recovers
///   from at its next start, and systemd's `Restart=on-failure` starts it (tests/crash.rs,
///   `a_panic_mid_apply_ends_the_daemon_and_the_start_rolls_back`; VM scenario 5b).
/// - **A request's thread** unwinds: tokio ends that request's task (`blocking` answers
///   `INTERNAL`), as it would for any handler, and the daemon serves on. A request reads
///   (coverage, status) or hands its work to the operation thread, and every lock is taken
///   poison-tolerant, so a bug one caller's request reaches costs that call, not a restart
///   that would roll back another caller's running operation
///   (`a_panic_in_a_coverage_computation_fails_that_call_only`).
///
/// Unwinding is therefore the packaged build's strategy too (Cargo.toml's `node` profile).
fn abort_on_panic_outside_requests() {
    let print = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        print(info);
        if std::thread::current().name() != Some(REQUEST_THREAD) {
            std::process::abort();
        }
    }));
}

fn run(args: Args) -> anyhow::Result<()> {
    let required = args.config != std::path::Path::new("/etc/inplaced/config.toml");
    let config = Config::load(&args.config, required)?;
    trusted_state_dir(&args.state_dir)?;
    let config_drift_interval = config.drift.interval_secs;
    let (services, rebooter, runner) = seams(&args)?;
    let recoveries = crate::state::StateDir::pending_journals(&args.state_dir);
    let agent = Agent::new(AgentParts {
        root: args.root.clone(),
        state_dir: args.state_dir.clone(),
        config,
        services,
        rebooter,
        runner,
        default_healthz: (args.service_manager == ServiceManagerKind::Systemd)
            .then(|| "http://127.0.0.1:10248/healthz".to_string()),
    })
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    // journals are settled (Agent::new); converge to node.d before serving
    agent.converge_node_d();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    start_drift_watcher(&agent, config_drift_interval, &stop)?;
    // WatchdogSec=: ping at half the interval from the runtime, so a wedged runtime is
    // restarted by systemd
    let watchdog = sd_notify::watchdog_enabled();
    let facts = agent.facts();
    tracing::info!(
        root = %args.root.display(),
        platform = %facts.platform,
        kernel_args_backend = %facts.kernel_args_backend,
        "agent started"
    );
    // Descriptors for connections, journal files and helpers: systemd's default soft
    // limit (1024) is low for a server; LimitNOFILE= in the unit sets the hard one.
    match inplace_edge::accept::raise_nofile_limit() {
        Ok((soft, hard)) => tracing::debug!(soft, hard, "RLIMIT_NOFILE"),
        Err(e) => tracing::warn!(error = %e, "could not raise RLIMIT_NOFILE"),
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(REQUEST_THREAD)
        // Blocking work is planning (bounded by policy.max_concurrent_coverage), apply,
        // reads of state: a few threads; the bound keeps TasksMax= in the unit safe.
        .max_blocking_threads(32)
        // a worker going idle hands its allocator cache back (crate::allocator)
        .on_thread_park(crate::allocator::release_thread_cache)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        if let Some(every) = watchdog {
            tokio::spawn(ping_watchdog(every));
        }
        let r = serve_until_stopped(agent, &args.socket, recoveries).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
        r
    })
}

/// What carries out unit actions, reboots and commands.
type Seams = (
    Arc<dyn ServiceManager>,
    Arc<dyn Rebooter>,
    Arc<dyn CommandRunner>,
);

/// The service manager, rebooter and command runner `--service-manager` chooses; for
/// `record`, one [`Recorder`] logging to `<state-dir>/actions.log` serves as all three.
fn seams(args: &Args) -> anyhow::Result<Seams> {
    Ok(match args.service_manager {
        ServiceManagerKind::Systemd => (Arc::new(Systemd), Arc::new(Systemd), Arc::new(Systemd)),
        ServiceManagerKind::Record => {
            std::fs::create_dir_all(&args.state_dir)
                .with_context(|| format!("creating {}", args.state_dir.display()))?;
            let failing = std::env::var("INPLACED_RECORD_FAIL").unwrap_or_default();
            let exec = std::env::var("INPLACED_RECORD_EXEC").unwrap_or_default();
            let r = Arc::new(
                Recorder::with_log(args.state_dir.join("actions.log"))
                    .failing(failing.split(',').map(|s| s.trim().to_string()))
                    .exec_in(
                        args.root.clone(),
                        exec.split(',').map(|s| s.trim().to_string()),
                    ),
            );
            (r.clone(), r.clone(), r)
        }
    })
}

/// Starts the `drift` thread, which checks the node every `interval_secs` (at least 1)
/// until `stop` is set.
fn start_drift_watcher(
    agent: &Arc<Agent>,
    interval_secs: u64,
    stop: &Arc<std::sync::atomic::AtomicBool>,
) -> anyhow::Result<()> {
    let agent = agent.clone();
    let stop = stop.clone();
    let interval = std::time::Duration::from_secs(interval_secs.max(1));
    std::thread::Builder::new()
        .name("drift".into())
        .spawn(move || crate::apply::watch::run(agent, interval, stop))
        .context("starting the drift watcher")?;
    Ok(())
}

/// Pings systemd's watchdog every half `every`, for as long as the runtime runs.
async fn ping_watchdog(every: std::time::Duration) {
    let mut tick = tokio::time::interval(every / 2);
    loop {
        tick.tick().await;
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
    }
}

/// Serves the local API on `socket` (telling systemd READY once it listens) until
/// SIGTERM or SIGINT, then gives open calls [`GRACE`] to finish.
async fn serve_until_stopped(
    agent: Arc<Agent>,
    socket: &std::path::Path,
    recoveries: u64,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        inplace_edge::process::stop_requested().await;
        tracing::info!("shutting down: no new requests; open calls get {GRACE:?}");
        let _ = stop_tx.send(true);
    });
    let metrics = Arc::new(crate::metrics::NodeMetrics::new(
        agent.facts(),
        env!("CARGO_PKG_VERSION"),
        recoveries,
    ));
    let serve = crate::server::serve(
        agent,
        metrics,
        socket,
        || {
            let _ = sd_notify::notify(&[
                sd_notify::NotifyState::Ready,
                sd_notify::NotifyState::Status("idle"),
            ]);
        },
        stop_rx.clone(),
    );
    let mut rx = stop_rx;
    let deadline = async move {
        let _ = rx.wait_for(|s| *s).await;
        tokio::time::sleep(GRACE).await;
    };
    tokio::select! {
        r = serve => r,
        _ = deadline => {
            tracing::warn!("open calls did not finish within {GRACE:?}; exiting");
            let _ = std::fs::remove_file(socket);
            Ok(())
        }
    }
}

/// Creates the state directory (0700) when missing and refuses to start when it, or a
/// directory above it, could be written by another user than root: its journals and saved
/// originals decide what is written and restored as root at start-up
/// ([`inplace_node::trust`], issue 23 §3).
fn trusted_state_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating --state-dir {}", dir.display()))?;
    inplace_node::trust::check_host_dir(dir).map_err(|e| {
        anyhow::anyhow!(
            "--state-dir: {e}; inplaced does not start on state another user could have written"
        )
    })
}

/// How long open calls (e.g. a `WatchOperation` stream) may run on after SIGTERM.
const GRACE: std::time::Duration = std::time::Duration::from_secs(5);
