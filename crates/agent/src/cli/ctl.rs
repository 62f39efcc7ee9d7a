//! `inplacectl`: the local command line client of `inplaced`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

use crate::cli::render;
use inplace_wire::pb;
use inplace_wire::pb::{Phase, RebootPolicy};

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Human-readable tables.
    Table,
    /// Tables with every reason in full (the kernel-argument backend in each row).
    Wide,
    /// proto3 JSON mapping (camelCase), for machines.
    Json,
}

/// Reboot policy of an apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Policy {
    /// Stop in REBOOT_REQUIRED; the caller drains and runs `inplacectl reboot ID`.
    Caller,
    /// The agent reboots by itself.
    Agent,
    /// Changes that need a reboot are not covered.
    Forbidden,
}

/// How the node reboots for an apply (`--reboot-method`; unset: the agent config's
/// `reboot_method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Method {
    /// `systemctl reboot`: firmware, boot loader, its default entry.
    Full,
    /// kexec into the installed kernel with the new command line: no firmware; the
    /// next cold boot uses the boot loader's default.
    Kexec,
    /// kexec where the kernel permits it, else a full reboot.
    Auto,
}

/// A try window: seconds (`90`), or a number with a unit, `s`, `m` or `h`, in
/// descending order (`90s`, `5m`, `1h30m`); 1 s to 24 h.
fn try_duration(s: &str) -> Result<u32, String> {
    let bad = || {
        format!(
            "{s:?} is not a duration: give seconds (90) or a number with s, m or h (90s, 5m, 1h30m)"
        )
    };
    let range = || format!("--try {s:?}: a try window is 1 s to 24 h (--try: 1 s to 24 h)");
    let mut total: u64 = 0;
    let mut num = String::new();
    let mut last_unit = u64::MAX;
    for c in s.trim().chars() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let unit = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return Err(bad()),
        };
        if num.is_empty() || unit >= last_unit {
            return Err(bad());
        }
        // digits only here: a number too large for u64 (or its product) is out of range
        total = num
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(unit))
            .and_then(|n| n.checked_add(total))
            .ok_or_else(range)?;
        last_unit = unit;
        num.clear();
    }
    if !num.is_empty() {
        if last_unit != u64::MAX {
            return Err(bad());
        }
        total = num.parse().map_err(|_| range())?;
    }
    if total == 0 || total > 86_400 {
        return Err(range());
    }
    Ok(total as u32)
}

/// The diff view of `coverage` and `apply --dry-run`.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct DiffArgs {
    /// Also print a unified diff of every file the change edits, computed by the agent
    /// from the plan an apply would execute (apply: with --dry-run only).
    #[arg(long)]
    pub diff: bool,
    /// Show the content of files items and drop-ins in the diff (they may be secrets;
    /// root on the local socket only). Without it they are named by SHA-256 and size.
    #[arg(long, requires = "diff")]
    pub show_content: bool,
}

impl DiffArgs {
    /// The request's diff options (None without --diff).
    fn options(self) -> Option<pb::DiffOptions> {
        self.diff.then_some(pb::DiffOptions {
            show_content: self.show_content,
        })
    }
}

/// Local client of the inplaced node agent.
#[derive(Debug, Parser)]
#[command(
    name = "inplacectl",
    version,
    about = "Local client of the inplaced node agent: validate, coverage, apply, confirm, status, history, reboot"
)]
pub struct Args {
    /// The agent's Unix socket.
    #[arg(
        long,
        global = true,
        default_value = "/run/inplaced/inplaced.sock",
        env = "INPLACED_SOCKET"
    )]
    pub socket: PathBuf,
    /// Talk to the agent's remote API (gRPC over mutual TLS) at HOST:PORT instead of the
    /// socket, as the CAPI extension does; needs --tls-ca, --tls-cert and --tls-key.
    #[arg(
        long,
        global = true,
        value_name = "HOST:PORT",
        env = "INPLACED_CONNECT"
    )]
    pub connect: Option<String>,
    /// CA bundle (PEM) that signs the agent's server certificate (with --connect).
    #[arg(long, global = true, env = "INPLACED_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate chain (PEM) on the agent's allowlist (with --connect).
    #[arg(long, global = true, env = "INPLACED_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Client private key (PEM) (with --connect).
    #[arg(long, global = true, env = "INPLACED_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Name to verify in the agent's certificate; default: the host of --connect.
    #[arg(long, global = true, env = "INPLACED_TLS_SERVER_NAME")]
    pub tls_server_name: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Agent and node status: facts, applied spec, current operation, drift.
    Status,
    /// Which changes of a NodeSpec can be applied in place, with what disruption.
    Coverage {
        /// NodeSpec YAML file ("-" for standard input).
        #[arg(short = 'f', long)]
        file: PathBuf,
        /// The reboot policy the apply would use.
        #[arg(long, value_enum, default_value_t = Policy::Caller)]
        reboot_policy: Policy,
        /// The diff view (--diff, --show-content).
        #[command(flatten)]
        diff: DiffArgs,
    },
    /// Applies a NodeSpec as an operation.
    Apply {
        /// NodeSpec YAML file ("-" for standard input).
        #[arg(short = 'f', long)]
        file: PathBuf,
        /// Operation id (idempotency key); generated if absent.
        #[arg(long, value_parser = operation_id)]
        id: Option<String>,
        /// Wait for the operation to settle, showing its progress.
        #[arg(long)]
        wait: bool,
        /// Validate and show what would change, without changing anything.
        #[arg(long)]
        dry_run: bool,
        /// Who reboots when a change needs it.
        #[arg(long, value_enum, default_value_t = Policy::Caller)]
        reboot_policy: Policy,
        /// How the node reboots when a change needs it (default: the agent config's
        /// reboot_method).
        #[arg(long, value_enum)]
        reboot_method: Option<Method>,
        /// A timed try (as Talos's `apply-config --mode try`): apply, then revert to the
        /// spec applied before unless `inplacectl confirm ID` comes within DURATION
        /// (90, 90s, 5m, 1h30m; at most 24h), counted from the start of the operation.
        /// Only for live changes (a spec that needs a reboot is refused); survives an
        /// agent restart; other applies are refused while it waits.
        #[arg(long = "try", value_name = "DURATION", value_parser = try_duration)]
        try_window: Option<u32>,
        /// The diff view (--diff, --show-content).
        #[command(flatten)]
        diff: DiffArgs,
    },
    /// Confirms a timed try (apply --try) before its deadline: its changes stay.
    /// Refused for an unknown operation, one that is not a try, and one whose deadline
    /// passed (it is reverted).
    Confirm {
        /// Operation id of the try.
        #[arg(value_parser = operation_id)]
        id: String,
    },
    /// Follows an operation until it settles.
    Watch {
        /// Operation id.
        #[arg(value_parser = operation_id)]
        id: String,
    },
    /// Shows one operation.
    Get {
        /// Operation id.
        #[arg(value_parser = operation_id)]
        id: String,
    },
    /// Operation history, newest first.
    History,
    /// Checks a NodeSpec offline, without an agent: the agent's rules and messages
    /// (exit 0 valid, 2 invalid, 3 valid but never covered: a field the
    /// KubeletConfiguration does not have). What only the node can tell is `coverage`'s.
    Validate {
        /// NodeSpec YAML file ("-" for standard input).
        #[arg(short = 'f', long)]
        file: PathBuf,
    },
    /// Reboots the node for an operation waiting in REBOOT_REQUIRED.
    Reboot {
        /// Operation id.
        #[arg(value_parser = operation_id)]
        id: String,
    },
}

/// An operation id argument, checked by the agent's own rule
/// ([`inplace_wire::names::validate_operation_id`]) before anything is sent.
fn operation_id(s: &str) -> Result<String, String> {
    inplace_wire::names::validate_operation_id(s)
        .map(|()| s.to_string())
        .map_err(|e| e.message)
}

/// Runs `inplacectl`. Exit codes: 0 success; 1 error, or a watched operation that ended
/// `Failed`/`RolledBack`; 2 invalid spec or request; 3 a spec the agent would refuse
/// (not fully covered, or refused by policy): `coverage`, `apply --dry-run` and `apply`
/// alike ([`refused`]).
pub fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("inplacectl: error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            let status = e.downcast_ref::<tonic::Status>();
            let code = match status.map(|s| s.code()) {
                Some(tonic::Code::InvalidArgument) => 2,
                _ if status.is_some_and(refused) => 3,
                _ if e.downcast_ref::<inplace_wire::names::SpecError>().is_some() => 2,
                _ => 1,
            };
            eprintln!("inplacectl: error: {}", render::error_chain(&e));
            ExitCode::from(code)
        }
    }
}

/// An `Apply` refused because the spec is not fully covered (FAILED_PRECONDITION "not
/// covered") or a policy refuses a change (PERMISSION_DENIED "refused by policy"): exit
/// code 3, as `coverage` and `apply --dry-run` of the same spec.
fn refused(s: &tonic::Status) -> bool {
    matches!(
        (s.code(), s.message()),
        (tonic::Code::FailedPrecondition, m) if m.starts_with("not covered")
    ) || matches!(
        (s.code(), s.message()),
        (tonic::Code::PermissionDenied, m) if m.starts_with("refused by policy")
    )
}

fn policy_of(p: Policy) -> RebootPolicy {
    match p {
        Policy::Caller => RebootPolicy::CallerHandles,
        Policy::Agent => RebootPolicy::AgentHandles,
        Policy::Forbidden => RebootPolicy::Forbidden,
    }
}

fn read_spec(file: &PathBuf) -> anyhow::Result<pb::NodeSpec> {
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the spec from standard input")?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    let spec = inplace_wire::yaml::parse(&text)
        .map_err(|e| anyhow::Error::new(e).context(format!("invalid spec {}", file.display())))?;
    Ok(spec)
}

/// Writes to standard output; a closed pipe (`inplacectl history | head`) ends the
/// program quietly, as it does for coreutils.
pub(crate) fn emit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("inplacectl: error: writing to standard output: {e}");
        std::process::exit(1);
    }
}

/// Prints `v` as proto3 JSON, or as the table `table` renders.
fn show<T: serde::Serialize>(json: bool, v: &T, table: fn(&T) -> String) -> anyhow::Result<()> {
    if json {
        emit(&format!("{}\n", serde_json::to_string_pretty(v)?));
    } else {
        emit(&table(v));
    }
    Ok(())
}

/// The remote API client for `--connect HOST:PORT`.
async fn connect_remote(args: &Args, addr: &str) -> anyhow::Result<Client> {
    let read = |flag: &str, p: &Option<PathBuf>| -> anyhow::Result<Vec<u8>> {
        let p = p
            .as_ref()
            .with_context(|| format!("--connect needs --{flag}"))?;
        std::fs::read(p).with_context(|| format!("reading --{flag} {}", p.display()))
    };
    let server_name = match &args.tls_server_name {
        Some(n) => n.clone(),
        None => host_of(addr).to_string(),
    };
    let id = inplace_edge::client::TlsIdentity {
        ca: read("tls-ca", &args.tls_ca)?,
        cert: read("tls-cert", &args.tls_cert)?,
        key: read("tls-key", &args.tls_key)?,
        server_name,
    };
    inplace_edge::client::connect_tls(addr, &id)
        .await
        .with_context(|| format!("connecting to inplaced at {addr}"))
}

/// The host of `HOST:PORT` (`[v6]:port` without the brackets).
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// The agent's client over the local socket or (`--connect`) mutual TLS.
type Client = inplace_wire::pb::node_agent_client::NodeAgentClient<tonic::transport::Channel>;

/// Connects to the agent: `--connect ADDR` over mutual TLS, else the local socket.
async fn connect(args: &Args) -> anyhow::Result<Client> {
    Ok(match &args.connect {
        Some(addr) => connect_remote(args, addr).await?,
        None => inplace_edge::client::connect(&args.socket)
            .await
            .with_context(|| {
                format!(
                    "connecting to inplaced at {} (is the agent running, and are you root?)",
                    args.socket.display()
                )
            })?,
    })
}

/// `coverage`: shows the answer (wide: with every item); exit code 3 when the spec is
/// not fully covered.
async fn coverage(
    client: &mut Client,
    desired: Option<pb::NodeSpec>,
    reboot_policy: Policy,
    diff: &DiffArgs,
    json: bool,
    wide: bool,
) -> anyhow::Result<ExitCode> {
    let r = client
        .get_coverage(pb::GetCoverageRequest {
            desired,
            reboot_policy: policy_of(reboot_policy) as i32,
            diff: diff.options(),
        })
        .await?
        .into_inner();
    if wide {
        show(json, &r, render::coverage_wide)?;
    } else {
        show(json, &r, render::coverage)?;
    }
    if !r.fully_covered {
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

/// `apply`: sends the request (refusing `--diff` without `--dry-run` before it is sent)
/// and returns the operation the agent started.
/// What an apply asks beyond the spec.
struct ApplyArgs<'a> {
    id: Option<String>,
    dry_run: bool,
    reboot_policy: Policy,
    reboot_method: Option<Method>,
    try_window: Option<u32>,
    diff: &'a DiffArgs,
}

async fn apply(
    client: &mut Client,
    desired: Option<pb::NodeSpec>,
    a: ApplyArgs<'_>,
) -> anyhow::Result<pb::Operation> {
    let ApplyArgs {
        id,
        dry_run,
        reboot_policy,
        reboot_method,
        try_window,
        diff,
    } = a;
    if diff.diff && !dry_run {
        return Err(inplace_wire::names::SpecError::new(
            "--diff",
            "shows what an apply would change and needs --dry-run: run `inplacectl apply --dry-run --diff -f FILE` first, then apply without them",
        )
        .into());
    }
    let policy = policy_of(reboot_policy);
    Ok(client
        .apply(pb::ApplyRequest {
            desired,
            operation_id: id.unwrap_or_default(),
            reboot_policy: policy as i32,
            dry_run,
            diff: diff.options(),
            reboot_method: match reboot_method {
                None => pb::RebootMethod::Unspecified,
                Some(Method::Full) => pb::RebootMethod::Full,
                Some(Method::Kexec) => pb::RebootMethod::Kexec,
                Some(Method::Auto) => pb::RebootMethod::Auto,
            } as i32,
            try_seconds: try_window.unwrap_or(0),
        })
        .await?
        .into_inner())
}

async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Command::Validate { file } = &args.command {
        return super::validate::run(file, args.output == Output::Json);
    }
    // parse the spec before connecting, so a bad file is reported even with no agent
    let spec = match &args.command {
        Command::Coverage { file, .. } | Command::Apply { file, .. } => Some(read_spec(file)?),
        _ => None,
    };
    let mut client = connect(&args).await?;
    let json = args.output == Output::Json;
    let wide = args.output == Output::Wide;
    match args.command {
        Command::Status => {
            let s = client
                .get_status(pb::GetStatusRequest {})
                .await?
                .into_inner();
            show(json, &s, render::status)?;
        }
        Command::Coverage {
            reboot_policy,
            diff,
            ..
        } => return coverage(&mut client, spec, reboot_policy, &diff, json, wide).await,
        Command::Apply {
            id,
            wait,
            dry_run,
            reboot_policy,
            reboot_method,
            try_window,
            diff,
            ..
        } => {
            let a = ApplyArgs {
                id,
                dry_run,
                reboot_policy,
                reboot_method,
                try_window,
                diff: &diff,
            };
            let op = apply(&mut client, spec, a).await?;
            if wait && !dry_run {
                return watch(&mut client, &op.id, json).await;
            }
            show(json, &op, render::operation)?;
            // a dry run the agent answers Failed: the apply would be refused
            if dry_run && op.phase == Phase::Failed as i32 {
                return Ok(ExitCode::from(3));
            }
        }
        Command::Watch { id } => return watch(&mut client, &id, json).await,
        Command::Get { id } => {
            let op = client
                .get_operation(pb::GetOperationRequest { id })
                .await?
                .into_inner();
            show(json, &op, render::operation)?;
        }
        Command::History => {
            let h = client
                .list_operations(pb::ListOperationsRequest {})
                .await?
                .into_inner();
            show(json, &h, |h| render::history(&h.operations))?;
        }
        Command::Confirm { id } => {
            let op = client
                .confirm(pb::ConfirmRequest { operation_id: id })
                .await?
                .into_inner();
            show(json, &op, render::operation)?;
        }
        // answered above, before connecting
        Command::Validate { .. } => {}
        Command::Reboot { id } => {
            let op = client
                .reboot(pb::RebootRequest { operation_id: id })
                .await?
                .into_inner();
            show(json, &op, render::operation)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn watch(client: &mut Client, id: &str, json: bool) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let mut stream = client
        .watch_operation(pb::WatchOperationRequest { id: id.to_string() })
        .await?
        .into_inner();
    let mut last: Option<pb::Operation> = None;
    while let Some(ev) = stream.message().await? {
        let Some(op) = ev.operation else { continue };
        if json {
            emit(&format!("{}\n", serde_json::to_string(&op)?));
        } else {
            emit(&format!(
                "[{:>5.1}s] {:<26} {}\n",
                start.elapsed().as_secs_f64(),
                render::phase(op.phase),
                inplace_edge::logging::escape_controls(&op.message)
            ));
        }
        last = Some(op);
    }
    let Some(op) = last else {
        anyhow::bail!("the agent closed the stream without an event for {id}");
    };
    if !json {
        emit(&render::operation(&op));
    }
    Ok(
        match Phase::try_from(op.phase).unwrap_or(Phase::Unspecified) {
            Phase::Succeeded
            | Phase::RebootRequired
            | Phase::Rebooting
            | Phase::AwaitingConfirmation => ExitCode::SUCCESS,
            _ => ExitCode::FAILURE,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::{host_of, try_duration};

    #[test]
    fn try_durations() {
        assert_eq!(try_duration("90"), Ok(90));
        assert_eq!(try_duration("90s"), Ok(90));
        assert_eq!(try_duration("5m"), Ok(300));
        assert_eq!(try_duration("1h30m"), Ok(5400));
        assert_eq!(try_duration("24h"), Ok(86_400));
        for bad in ["", "0", "0s", "25h", "5x", "m", "30s5m", "5m30", "-5"] {
            assert!(try_duration(bad).is_err(), "{bad:?}");
        }
        // overflow is out of range, never a panic (checked arithmetic)
        for huge in [
            "5124095576030432h",
            "18446744073709551615h",
            "99999999999999999999",
            "5124095576030432h1s",
        ] {
            let e = try_duration(huge).unwrap_err();
            assert!(
                e.contains("--try") && e.contains("1 s to 24 h"),
                "{huge}: {e}"
            );
        }
    }

    #[test]
    fn host_of_an_address() {
        assert_eq!(host_of("127.0.0.1:9443"), "127.0.0.1");
        assert_eq!(host_of("node-1.example.com:9443"), "node-1.example.com");
        assert_eq!(host_of("[::1]:9443"), "::1");
        assert_eq!(host_of("localhost"), "localhost");
    }
}
