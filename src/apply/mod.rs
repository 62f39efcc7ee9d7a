//! The agent and its operation engine.
//!
//! [`Agent`] answers coverage, runs operations and reports status. An operation (DESIGN §2)
//! moves through `Validating → Staging → Committing → Acting → Verifying →
//! (RebootRequired → Rebooting → VerifyingAfterBoot) → Succeeded | Failed | RolledBack`;
//! each phase change is persisted to `operations/<id>.json` and published to watchers,
//! who get every phase change from the start.
//!
//! - Staging saves the original of every pre-existing file the spec overwrites for the
//!   first time (`originals/`).
//! - Committing writes every file atomically and durably (see [`crate::node::sysroot`]).
//!   Before each write the file must still be what the plan saw (no other writer's change
//!   is ever overwritten). Every completed write, removal and live sysctl goes on an undo
//!   list.
//! - Acting runs boot configuration commands, then daemon-reload, reloads, restarts and
//!   the kubelet's manager-checkpoint reset through the [`ServiceManager`]; a pending
//!   reboot absorbs reloads and restarts.
//! - Verifying re-observes the node and re-plans: nothing may remain to do but the reboot.
//!   The applied record is persisted only then.
//!
//! A failure at any step after the first write undoes the list in reverse and ends
//! `RolledBack` with the cause.
//!
//! ## Write-ahead journal and the order of fsyncs
//!
//! A crash (power cut, SIGKILL) at any instant leaves every managed file entirely old or
//! entirely new, and the next start settles the operation:
//!
//! 1. `originals/<hash>` for first overwrites, then `journal/<op>/pre/<n>` (the pre-image of
//!    every path the operation writes or removes), then `journal/<op>/intent.json` (paths,
//!    pre-image metadata, directories to be created, prior sysctl values, units): each
//!    written to a temporary file, fsynced, renamed, directory fsynced. Failpoint `stage`.
//! 2. Each file: temporary file, write, fchown, fchmod, fsync, rename, fsync of the
//!    directory (failpoints `write-temp`, `write`); then live sysctls (`sysctl`);
//!    `journal/<op>/progress` = `written`.
//! 3. Commands and unit actions; `progress` = `acted` (failpoint `act`); the kubelet's
//!    health gate; verification by re-planning.
//! 4. The commit point: `journal/<op>/record.json` then the empty `journal/<op>/committed`,
//!    each fsynced (failpoint `record`); then `applied.json` (failpoint `applied`); then the
//!    journal is removed and the final phase persisted (failpoint `reboot-required`).
//!
//! At start: a journal with `committed` is rolled forward (its record installed, the
//! operation ends in the phase it recorded); any other is rolled back (pre-images
//! restored, files that were absent removed with the directories created for them,
//! temporary files removed, sysctls restored, units restarted again if `progress` says it
//! had written) and the operation ends `Failed` (`interrupted`); re-applying it with the
//! same id runs it again. One operation runs at a time; an `Apply` with the id of an
//! existing operation and the same spec returns that operation (idempotency for CAPI's
//! retried `UpdateMachine`), except that an operation interrupted by a stop of the agent
//! is run again.

pub mod watch;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast;

use crate::cmdline::{Arg, Cmdline};
use crate::config::Config;
use crate::node::facts;
use crate::node::sysroot::{Entry, Sysroot};
use crate::pb::{self, Phase, RebootPolicy};
use crate::plan::{self, Options, Plan, observe::FileObs};
use crate::spec::{NodeSpec, SpecError};
use crate::state::{AppliedRecord, StateDir, StateError};
use crate::system::{CommandRunner, Rebooter, ServiceManager};

/// How many of the newest operations keep every phase for watchers to replay.
const LIVE_REPLAY: usize = 4;

/// Prefix of the message of an operation the agent stopped in the middle of; an `Apply`
/// with its id runs it again.
pub const INTERRUPTED: &str = "interrupted:";

/// True for an operation the agent stopped in the middle of (phase Failed, message
/// starting with [`INTERRUPTED`]): re-applying it with the same id runs it again.
pub fn is_interrupted(op: &pb::Operation) -> bool {
    op.phase == Phase::Failed as i32 && op.message.starts_with(INTERRUPTED)
}

/// One completed step and how to undo it.
#[derive(Debug)]
enum Undo {
    /// A file written or removed: its previous content and metadata (None = absent).
    File(String, Option<(Vec<u8>, Entry)>),
    /// A directory created.
    Dir(String),
    /// A live sysctl changed: key, previous value.
    Sysctl(String, String),
}

/// Agent errors; the server maps each to a gRPC status code.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Malformed spec (INVALID_ARGUMENT).
    #[error("invalid spec: {0}")]
    InvalidSpec(#[from] SpecError),
    /// Malformed request outside the spec (INVALID_ARGUMENT).
    #[error("invalid request: {0}")]
    InvalidRequest(SpecError),
    /// The spec is not fully covered (FAILED_PRECONDITION).
    #[error("not covered, nothing was changed: {0}")]
    NotCovered(String),
    /// The write policy or a limit refuses the spec (PERMISSION_DENIED).
    #[error("refused by policy, nothing was changed: {0}")]
    PermissionDenied(String),
    /// Another operation runs (ABORTED).
    #[error("operation {0:?} is running; wait for it to finish (inplacectl watch {0})")]
    Busy(String),
    /// Same id, different spec (ALREADY_EXISTS).
    #[error(
        "operation {id:?} already exists for spec {existing}, this request has spec {requested}; use a new operation id"
    )]
    AlreadyExists {
        /// Operation id.
        id: String,
        /// Its spec hash.
        existing: String,
        /// The request's spec hash.
        requested: String,
    },
    /// Unknown operation (NOT_FOUND).
    #[error("no operation {0:?}; list them with inplacectl history")]
    NotFound(String),
    /// Wrong state for the request (FAILED_PRECONDITION).
    #[error("{0}")]
    Precondition(String),
    /// Node or state I/O failed (INTERNAL).
    #[error("{0}")]
    Internal(String),
}

impl From<StateError> for AgentError {
    fn from(e: StateError) -> Self {
        AgentError::Internal(e.to_string())
    }
}

impl From<plan::observe::ObserveError> for AgentError {
    fn from(e: plan::observe::ObserveError) -> Self {
        AgentError::Internal(e.to_string())
    }
}

/// What the agent is built from.
#[derive(Debug)]
pub struct AgentParts {
    /// The node's root.
    pub root: PathBuf,
    /// State directory.
    pub state_dir: PathBuf,
    /// Agent config.
    pub config: Config,
    /// Unit control.
    pub services: Arc<dyn ServiceManager>,
    /// Reboots.
    pub rebooter: Arc<dyn Rebooter>,
    /// Host commands.
    pub runner: Arc<dyn CommandRunner>,
    /// Kubelet health endpoint used when the config names none (the systemd deployment's
    /// `http://127.0.0.1:10248/healthz`; none for the recorder).
    pub default_healthz: Option<String>,
}

/// An operation of this run: every state it went through, and a channel for watchers.
#[derive(Debug)]
struct LiveOp {
    events: Vec<pb::Operation>,
    tx: broadcast::Sender<pb::Operation>,
}

#[derive(Debug, Default)]
struct Inner {
    running: Option<String>,
    live: HashMap<String, LiveOp>,
    order: VecDeque<String>,
}

/// The node agent.
#[derive(Debug)]
pub struct Agent {
    root: Sysroot,
    state: StateDir,
    config: Config,
    facts: pb::NodeFacts,
    preservation: pb::Preservation,
    reserved: Vec<(String, String)>,
    started: Instant,
    services: Arc<dyn ServiceManager>,
    rebooter: Arc<dyn Rebooter>,
    runner: Arc<dyn CommandRunner>,
    default_healthz: Option<String>,
    problems: Mutex<Vec<String>>,
    drift_lock: Mutex<()>,
    inner: Mutex<Inner>,
}

fn now() -> pbjson_types::Timestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    pbjson_types::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

fn phase_of(op: &pb::Operation) -> Phase {
    Phase::try_from(op.phase).unwrap_or(Phase::Unspecified)
}

/// Human name of a phase (`RebootRequired`), as inplacectl shows it.
pub fn phase_name(p: Phase) -> String {
    crate::cli::render::phase(p as i32)
}

/// True for phases after which nothing happens without a new request.
pub fn is_settled(phase: i32) -> bool {
    matches!(
        Phase::try_from(phase).unwrap_or(Phase::Unspecified),
        Phase::Succeeded
            | Phase::Failed
            | Phase::RolledBack
            | Phase::RebootRequired
            | Phase::Rebooting
    )
}

/// True for phases that end an operation for good.
pub fn is_terminal(phase: i32) -> bool {
    matches!(
        Phase::try_from(phase).unwrap_or(Phase::Unspecified),
        Phase::Succeeded | Phase::Failed | Phase::RolledBack
    )
}

/// Validates an operation id: 1–128 bytes of `[A-Za-z0-9._-]`, not starting with `.`.
pub fn validate_operation_id(id: &str) -> Result<(), SpecError> {
    if crate::spec::is_safe_name(id, 128) {
        Ok(())
    } else {
        Err(SpecError::new(
            "operationId",
            format!(
                "{id:?} is not a valid operation id; use 1-128 characters of A-Z a-z 0-9 . _ -"
            ),
        ))
    }
}

impl Agent {
    /// Opens the sysroot and state directory (locking it), detects node facts, and settles
    /// operations left unfinished by a previous run.
    pub fn new(parts: AgentParts) -> Result<Arc<Agent>, AgentError> {
        let root = Sysroot::open(&parts.root).map_err(|e| AgentError::Internal(e.to_string()))?;
        let mut state = StateDir::open(&parts.state_dir)?;
        state.lock()?;
        state.remove_stale_temps()?;
        let mut node_facts = facts::detect(&root, &parts.config.preservation.bindings);
        node_facts.kernel_args_backend =
            match crate::bootloader::detect(&root, parts.config.kernel_args.backend) {
                Ok(b) => b.reason(),
                Err(e) => format!("none: {e}"),
            };
        let preservation =
            facts::preservation(&node_facts, parts.config.preservation.hardware_bound);
        // the agent's own files, when they lie inside the sysroot, are not for the spec
        let mut reserved = Vec::new();
        let root_abs = std::fs::canonicalize(&parts.root).unwrap_or(parts.root.clone());
        let state_abs = std::fs::canonicalize(&parts.state_dir).unwrap_or(parts.state_dir.clone());
        if let Ok(rel) = state_abs.strip_prefix(&root_abs) {
            reserved.push((
                format!("/{}", rel.display()),
                "inplaced itself (its state directory)".to_string(),
            ));
        }
        reserved.push((
            "/etc/inplaced".to_string(),
            "inplaced itself (its configuration)".to_string(),
        ));
        let (_, problem) = state.load_record_or_quarantine()?;
        let agent = Arc::new(Agent {
            root,
            state,
            config: parts.config,
            facts: node_facts,
            preservation,
            reserved,
            started: Instant::now(),
            services: parts.services,
            rebooter: parts.rebooter,
            runner: parts.runner,
            default_healthz: parts.default_healthz,
            problems: Mutex::new(problem.into_iter().collect()),
            drift_lock: Mutex::new(()),
            inner: Mutex::new(Inner::default()),
        });
        agent.recover_journals()?;
        agent.recover()?;
        Ok(agent)
    }

    /// The node's current boot id (`/proc/sys/kernel/random/boot_id` in the sysroot).
    pub fn boot_id(&self) -> String {
        self.root
            .read_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .flatten()
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// Node facts detected at start.
    pub fn facts(&self) -> &pb::NodeFacts {
        &self.facts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Settles operations a previous run left behind: one waiting for a reboot is verified
    /// once the boot id changed (or, with no boot id, once `/proc/cmdline` shows its
    /// changes); one stopped mid-way is marked `Failed` (interrupted).
    fn recover(&self) -> Result<(), AgentError> {
        let boot_id = self.boot_id();
        for mut op in self.state.list_operations()? {
            let phase = phase_of(&op);
            let waiting = matches!(phase, Phase::Rebooting | Phase::RebootRequired);
            let running = self
                .root
                .read_string("/proc/cmdline")
                .ok()
                .flatten()
                .unwrap_or_default();
            let next_boot = || {
                crate::bootloader::detect(&self.root, self.config.kernel_args.backend)
                    .map(|b| b.next_boot().render())
                    .unwrap_or_default()
            };
            if waiting && !boot_id.is_empty() && op.boot_id != boot_id {
                op.phase = Phase::VerifyingAfterBoot as i32;
                let (missing, lingering) = verify_after_boot(&op, &running, &next_boot());
                if missing.is_empty() && lingering.is_empty() {
                    op.phase = Phase::Succeeded as i32;
                    op.message = format!(
                        "booted (boot id {boot_id}) with the new kernel arguments, verified in /proc/cmdline"
                    );
                } else {
                    let mut why = Vec::new();
                    if !missing.is_empty() {
                        why.push(format!("lacks {}", missing.join(" ")));
                    }
                    if !lingering.is_empty() {
                        why.push(format!("still has {}", lingering.join(" ")));
                    }
                    op.phase = Phase::Failed as i32;
                    op.message = format!(
                        "booted (boot id {boot_id}) but /proc/cmdline {}; the boot loader did not use the edited configuration (no further reboot is requested)",
                        why.join(" and ")
                    );
                }
                op.boot_id = boot_id.clone();
                op.updated = Some(now());
                self.state.save_operation(&op)?;
            } else if phase == Phase::Rebooting && boot_id.is_empty() {
                let (missing, lingering) = verify_after_boot(&op, &running, &next_boot());
                if missing.is_empty() && lingering.is_empty() {
                    op.phase = Phase::Succeeded as i32;
                    op.message =
                        "the node has no boot id; /proc/cmdline shows the new kernel arguments"
                            .into();
                    op.updated = Some(now());
                    self.state.save_operation(&op)?;
                }
            } else if !is_settled(op.phase) {
                op.phase = Phase::Failed as i32;
                op.message = format!(
                    "{INTERRUPTED} the agent stopped during {}; re-apply with the same operation id to converge",
                    phase_name(phase)
                );
                op.updated = Some(now());
                self.state.save_operation(&op)?;
            }
        }
        Ok(())
    }

    fn options(&self, policy: RebootPolicy) -> Options {
        Options {
            reboot_forbidden: policy == RebootPolicy::Forbidden,
            reserved: self.reserved.clone(),
            leave_files: Vec::new(),
        }
    }

    fn plan_for(&self, desired: &NodeSpec, opts: Options) -> Result<Plan, AgentError> {
        let record = self.state.load_record()?;
        self.plan_with(desired, opts, record)
    }

    fn plan_with(
        &self,
        desired: &NodeSpec,
        opts: Options,
        record: AppliedRecord,
    ) -> Result<Plan, AgentError> {
        let obs = plan::observe(&self.root, &self.state, &self.config, desired, &record)?;
        let mut p = plan::plan(desired, &obs, &record, &self.config, opts);
        p.report.facts = Some(self.facts.clone());
        p.report.preservation = Some(self.preservation.clone());
        Ok(p)
    }

    /// Checks the spec against the size limits of the policy.
    fn check_limits(&self, spec: &NodeSpec) -> Result<(), AgentError> {
        let p = &self.config.policy;
        if spec.files.len() > p.max_files {
            return Err(AgentError::PermissionDenied(format!(
                "files: {} files, over the limit of {} (policy.max_files)",
                spec.files.len(),
                p.max_files
            )));
        }
        let total: u64 = spec
            .files
            .iter()
            .map(|f| f.content.len() as u64 + f.path.len() as u64)
            .sum::<u64>()
            + spec.kernel_args.iter().map(|a| a.len() as u64).sum::<u64>()
            + spec
                .dropins
                .iter()
                .map(|d| d.content.len() as u64 + d.name.len() as u64)
                .sum::<u64>();
        if total > p.max_spec_bytes {
            return Err(AgentError::PermissionDenied(format!(
                "spec: {total} bytes, over the limit of {} (policy.max_spec_bytes)",
                p.max_spec_bytes
            )));
        }
        Ok(())
    }

    /// The agent config.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Coverage of `desired` under `policy` (no side effects).
    pub fn coverage(
        &self,
        desired: &pb::NodeSpec,
        policy: RebootPolicy,
    ) -> Result<pb::CoverageReport, AgentError> {
        let desired = self.resolve_kept(desired)?;
        let spec = NodeSpec::from_pb(&desired)?;
        self.check_limits(&spec)?;
        Ok(self.plan_for(&spec, self.options(policy))?.report)
    }

    /// Fills the drop-ins marked `keep` with the node's copy in `/etc/inplaced/node.d`
    /// (their rendered content exists only there). Errors: an invalid name, or no such
    /// file on the node (INVALID_ARGUMENT naming `dropins[<name>].keep`).
    fn resolve_kept<'a>(
        &self,
        desired: &'a pb::NodeSpec,
    ) -> Result<std::borrow::Cow<'a, pb::NodeSpec>, AgentError> {
        if !desired.dropins.iter().any(|d| d.keep) {
            return Ok(std::borrow::Cow::Borrowed(desired));
        }
        let mut out = desired.clone();
        for d in out.dropins.iter_mut().filter(|d| d.keep) {
            let field = format!("dropins[{}].keep", d.name);
            crate::spec::validate_dropin_name(&field, &d.name)?;
            if !d.content.is_empty() {
                return Err(SpecError::new(field, "give content or keep, not both").into());
            }
            let path = format!("{}/{}", crate::spec::DROPIN_DIR, d.name);
            match self.root.read_string(&path) {
                Ok(Some(text)) => d.content = text,
                _ => {
                    return Err(SpecError::new(
                        field,
                        format!("the node has no readable {path} to keep"),
                    )
                    .into());
                }
            }
            d.keep = false;
        }
        Ok(std::borrow::Cow::Owned(out))
    }

    /// Starts an operation (see the module docs); returns its first state.
    pub fn apply(self: &Arc<Self>, req: pb::ApplyRequest) -> Result<pb::Operation, AgentError> {
        self.apply_leaving(req, Vec::new())
    }

    /// [`Agent::apply`], leaving the node.d files `leave` as they are
    /// ([`Options::leave_files`]).
    fn apply_leaving(
        self: &Arc<Self>,
        req: pb::ApplyRequest,
        leave: Vec<String>,
    ) -> Result<pb::Operation, AgentError> {
        let desired = self
            .resolve_kept(&req.desired.unwrap_or_default())?
            .into_owned();
        let spec = NodeSpec::from_pb(&desired)?;
        self.check_limits(&spec)?;
        let id = if req.operation_id.is_empty() {
            uuid::Uuid::new_v4().to_string()
        } else {
            validate_operation_id(&req.operation_id).map_err(AgentError::InvalidRequest)?;
            req.operation_id.clone()
        };
        let policy =
            match RebootPolicy::try_from(req.reboot_policy).unwrap_or(RebootPolicy::Unspecified) {
                RebootPolicy::Unspecified => RebootPolicy::CallerHandles,
                p => p,
            };
        let hash = spec.hash();
        let spec_pb = prost::Message::encode_to_vec(&desired);
        let mut opts = self.options(policy);
        opts.leave_files = leave;
        if req.dry_run {
            let plan = self.plan_for(&spec, opts)?;
            let t = now();
            return Ok(pb::Operation {
                id,
                phase: if plan.report.fully_covered {
                    Phase::Succeeded as i32
                } else {
                    Phase::Failed as i32
                },
                message: if plan.report.fully_covered {
                    format!(
                        "dry run: {} change(s) would be applied",
                        plan.report.changes.len()
                    )
                } else {
                    "dry run: not fully covered; apply would be refused".into()
                },
                spec_hash: hash,
                reboot_policy: policy as i32,
                created: Some(t),
                updated: Some(t),
                changes: plan.report.changes,
                actions: vec![],
                boot_id: self.boot_id(),
                dry_run: true,
            });
        }
        // claim the single operation slot, then plan without holding the lock
        {
            let mut inner = self.lock();
            if let Some(existing) = self.get_operation_locked(&inner, &id)? {
                if existing.spec_hash != hash {
                    return Err(AgentError::AlreadyExists {
                        id,
                        existing: existing.spec_hash,
                        requested: hash,
                    });
                }
                if !is_interrupted(&existing) {
                    return Ok(existing);
                }
            }
            if let Some(r) = &inner.running {
                return Err(AgentError::Busy(r.clone()));
            }
            inner.running = Some(id.clone());
            // concurrent calls with the same id and spec get this operation
            let t = now();
            let (tx, _) = broadcast::channel(64);
            inner.live.insert(
                id.clone(),
                LiveOp {
                    events: vec![pb::Operation {
                        id: id.clone(),
                        phase: Phase::Validating as i32,
                        message: "planning".into(),
                        spec_hash: hash.clone(),
                        reboot_policy: policy as i32,
                        created: Some(t),
                        updated: Some(t),
                        boot_id: self.boot_id(),
                        ..Default::default()
                    }],
                    tx,
                },
            );
        }
        let release = |e: AgentError| {
            let mut inner = self.lock();
            inner.running = None;
            inner.live.remove(&id);
            e
        };
        let plan = self.plan_for(&spec, opts.clone()).map_err(release)?;
        if !plan.report.fully_covered {
            let refused: Vec<&pb::Change> =
                plan.report.changes.iter().filter(|c| !c.covered).collect();
            let list: Vec<String> = refused
                .iter()
                .map(|c| format!("{}: {}", c.id, c.reason))
                .collect();
            if refused.iter().any(|c| c.reason.starts_with("policy:")) {
                return Err(release(AgentError::PermissionDenied(list.join("; "))));
            }
            return Err(release(AgentError::NotCovered(list.join("; "))));
        }
        self.supersede_waiting(&id);
        let t = now();
        let op = pb::Operation {
            id: id.clone(),
            phase: Phase::Validating as i32,
            message: format!("{} change(s) to apply", plan.report.changes.len()),
            spec_hash: hash,
            reboot_policy: policy as i32,
            created: Some(t),
            updated: Some(t),
            changes: plan.report.changes.clone(),
            actions: vec![],
            boot_id: self.boot_id(),
            dry_run: false,
        };
        self.state
            .save_operation(&op)
            .map_err(|e| release(e.into()))?;
        // one journal line per change, so `journalctl OPERATION=<id> ITEM=<change id>`
        // finds it (before/after are summaries: a hash for file content, never content)
        for c in &op.changes {
            tracing::info!(operation = %id, item = %c.id, before = %c.before, after = %c.after, "change");
        }
        {
            let mut inner = self.lock();
            if let Some(live) = inner.live.get_mut(&id) {
                live.events = vec![op.clone()];
                let _ = live.tx.send(op.clone());
            }
            inner.order.retain(|o| o != &id);
            inner.order.push_back(id.clone());
            while inner.order.len() > self.config.history.keep.max(1) {
                if let Some(old) = inner.order.pop_front() {
                    inner.live.remove(&old);
                }
            }
            // every phase is replayed to watchers of the few newest operations; older
            // settled ones keep their last state only (memory stays flat with history)
            let n = inner.order.len();
            let older: Vec<String> = inner
                .order
                .iter()
                .take(n.saturating_sub(LIVE_REPLAY))
                .cloned()
                .collect();
            for o in older {
                if let Some(live) = inner.live.get_mut(&o)
                    && live.events.last().is_some_and(|e| is_settled(e.phase))
                    && live.events.len() > 1
                {
                    let last = live.events.pop();
                    live.events = last.into_iter().collect();
                }
            }
        }
        let agent = Arc::clone(self);
        let first = op.clone();
        std::thread::Builder::new()
            .name(format!("op-{id}"))
            .spawn(move || agent.run(op, spec, spec_pb, plan, opts))
            .map_err(|e| release(AgentError::Internal(format!("spawn operation thread: {e}"))))?;
        Ok(first)
    }

    /// Start-up convergence to the NodeSpec drop-ins in `/etc/inplaced/node.d` (called
    /// after journal recovery, before serving). Reads the `*.yaml` files there, sorted by
    /// name; when there are any and they differ from the drop-ins of the last applied spec
    /// (`applied-spec.pb`), starts operation `startup-<first 8 hex digits of the spec
    /// hash>`, or `-2`, `-3`... when that id is in the history (reboot policy
    /// CALLER_HANDLES) applying the last applied spec with its
    /// drop-ins replaced by those on disk. A drop-in that can not be read or does not parse
    /// is not applied: it is logged with the file and the field and listed in
    /// `NodeStatus.problems`; a last applied version of it stays in effect and its file is
    /// left as it is. Returns the operation started (or the existing one of that id), if
    /// any; every reason not to converge is logged and listed in the problems.
    pub fn converge_node_d(self: &Arc<Self>) -> Option<pb::Operation> {
        use crate::spec::{DROPIN_DIR, parse_dropin, validate_dropin_name};
        let note = |msg: String| {
            self.problems
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(msg);
        };
        let problem = |msg: String| {
            tracing::warn!("{msg}");
            note(msg);
        };
        let names = match self.root.list_dir(DROPIN_DIR) {
            Ok(Some(n)) => n,
            Ok(None) => return None,
            Err(e) => {
                problem(format!("node.d drop-ins not read: {e}"));
                return None;
            }
        };
        let mut good = Vec::new();
        let mut broken = Vec::new();
        for name in names {
            if !name.ends_with(".yaml") || name.starts_with('.') {
                continue;
            }
            let path = format!("{DROPIN_DIR}/{name}");
            let parsed = validate_dropin_name("name", &name)
                .map_err(|e| e.to_string())
                .and_then(|()| match self.root.read_string(&path) {
                    Ok(Some(text)) => Ok(text),
                    Ok(None) => Err("vanished while reading".to_string()),
                    Err(e) => Err(e.to_string()),
                })
                .and_then(|text| {
                    parse_dropin(&name, &text)
                        .map(|_| text)
                        .map_err(|e| e.to_string())
                });
            match parsed {
                Ok(content) => good.push(pb::DropIn {
                    name,
                    content,
                    keep: false,
                }),
                Err(e) => {
                    tracing::warn!(file = %path, error = %e, "node.d drop-in not applied");
                    broken.push((name, path, e));
                }
            }
        }
        if good.is_empty() && broken.is_empty() {
            return None;
        }
        let applied = match self.state.load_applied_spec() {
            Ok(Some(s)) => s,
            Ok(None)
                if self
                    .state
                    .load_record()
                    .map(|r| r.is_empty())
                    .unwrap_or(false) =>
            {
                pb::NodeSpec::default()
            }
            Ok(None) => {
                problem(
                    "node.d drop-ins not applied at start-up: the last applied spec is not known (applied by an older inplaced), so converging would revert it; they are applied with the next Apply that carries them"
                        .to_string(),
                );
                return None;
            }
            Err(e) => {
                problem(format!("node.d drop-ins not applied at start-up: {e}"));
                return None;
            }
        };
        let mut leave = Vec::new();
        for (name, path, e) in &broken {
            let kept = applied.dropins.iter().find(|d| &d.name == name);
            if let Some(d) = kept {
                good.push(d.clone());
                leave.push(path.clone());
            }
            // logged with the file above
            note(format!(
                "{path}: {e}; not applied{}",
                if kept.is_some() {
                    " (its last applied version stays in effect)"
                } else {
                    ""
                }
            ));
        }
        good.sort_by(|a, b| a.name.cmp(&b.name));
        let mut before = applied.dropins.clone();
        before.sort_by(|a, b| a.name.cmp(&b.name));
        if good == before {
            return None;
        }
        let desired = pb::NodeSpec {
            dropins: good,
            ..applied
        };
        let hash = match NodeSpec::from_pb(&desired) {
            Ok(s) => s.hash(),
            Err(e) => {
                problem(format!(
                    "node.d drop-ins not applied at start-up: {e} (merged with the last applied spec)"
                ));
                return None;
            }
        };
        let hex = hash.trim_start_matches("sha256:");
        // A new id each time this state is converged to: an earlier operation of the same
        // spec (applied, then replaced by another apply) must not answer for this one.
        let base = format!("startup-{}", &hex[..hex.len().min(8)]);
        let taken: std::collections::HashSet<String> = self
            .state
            .list_operations()
            .unwrap_or_default()
            .into_iter()
            .map(|o| o.id)
            .collect();
        let id = std::iter::once(base.clone())
            .chain((2..).map(|n| format!("{base}-{n}")))
            .find(|c| !taken.contains(c))
            .unwrap_or(base);
        match self.apply_leaving(
            pb::ApplyRequest {
                desired: Some(desired),
                operation_id: id.clone(),
                reboot_policy: RebootPolicy::CallerHandles as i32,
                dry_run: false,
            },
            leave,
        ) {
            Ok(op) => {
                tracing::info!(operation = %id, "converging to the node.d drop-ins");
                Some(op)
            }
            Err(e) => {
                problem(format!(
                    "node.d drop-ins not applied at start-up (operation {id}): {e}"
                ));
                None
            }
        }
    }

    /// Operations waiting for a reboot are superseded by a new operation: their staged
    /// changes are replaced, so a later reboot must not be read as theirs.
    fn supersede_waiting(&self, new_id: &str) {
        let Ok(ops) = self.state.list_operations() else {
            return;
        };
        for mut op in ops {
            if op.id != new_id && matches!(phase_of(&op), Phase::RebootRequired | Phase::Rebooting)
            {
                let msg = format!(
                    "superseded by operation {new_id} before the reboot; its staged changes were replaced"
                );
                self.publish(&mut op, Phase::Failed, msg);
            }
        }
    }

    fn publish(&self, op: &mut pb::Operation, phase: Phase, message: impl Into<String>) {
        op.phase = phase as i32;
        op.message = message.into();
        op.updated = Some(now());
        let mut inner = self.lock();
        // the slot is free as soon as the operation settles: a caller that sees the final
        // phase may start the next operation at once
        if is_settled(op.phase) && inner.running.as_deref() == Some(op.id.as_str()) {
            inner.running = None;
        }
        if let Err(e) = self.state.save_operation(op) {
            tracing::error!(operation = %op.id, error = %e, "persisting operation");
        }
        tracing::info!(operation = %op.id, phase = phase.as_str_name(), message = %op.message, "operation phase");
        if let Some(live) = inner.live.get_mut(&op.id) {
            live.events.push(op.clone());
            let _ = live.tx.send(op.clone());
        }
        // systemctl status shows the current operation (a no-op outside systemd)
        let status = if is_settled(op.phase) {
            format!("idle; last operation {} {}", op.id, phase_name(phase))
        } else {
            format!("operation {}: {}", op.id, phase_name(phase))
        };
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&status)]);
    }

    fn run(
        self: Arc<Self>,
        mut op: pb::Operation,
        spec: NodeSpec,
        spec_pb: Vec<u8>,
        plan: Plan,
        opts: Options,
    ) {
        let mut undo = Vec::new();
        let result = self.execute(&mut op, &spec, &spec_pb, &plan, opts, &mut undo);
        if let Err((phase, msg)) = result {
            let msg = if undo.is_empty() {
                format!("{msg}; nothing was changed")
            } else {
                format!("{msg}; {}", self.undo(&undo))
            };
            let phase = if undo.is_empty() {
                phase
            } else {
                Phase::RolledBack
            };
            let _ = self.state.journal_remove(&op.id);
            self.publish(&mut op, phase, msg);
        }
        if let Err(e) = self.state.prune(self.config.history.keep) {
            tracing::warn!(error = %e, "pruning history");
        }
        let mut inner = self.lock();
        if inner.running.as_deref() == Some(op.id.as_str()) {
            inner.running = None;
        }
    }

    fn execute(
        &self,
        op: &mut pb::Operation,
        spec: &NodeSpec,
        spec_pb: &[u8],
        plan: &Plan,
        opts: Options,
        undo: &mut Vec<Undo>,
    ) -> Result<(), (Phase, String)> {
        let steps = &plan.steps;
        let mut record = plan.record.clone();
        self.publish(
            op,
            Phase::Staging,
            "writing the journal: pre-images and intent",
        );
        let staging = |e: String| (Phase::Failed, format!("staging: {e}"));
        if crate::failpoint::triggered("stage-enospc") {
            return Err(staging("No space left on device (os error 28)".into()));
        }
        for w in &steps.writes {
            if let Some(orig) = &w.save_original {
                self.state
                    .save_original(&w.path, orig)
                    .map_err(|e| staging(e.to_string()))?;
                op.actions.push(format!("saved original of {}", w.path));
            }
        }
        let intent = self.intent(op, steps).map_err(staging)?;
        self.state
            .journal_intent(&intent)
            .map_err(|e| staging(e.to_string()))?;
        self.state
            .journal_progress(&op.id, "staged")
            .map_err(|e| staging(e.to_string()))?;
        crate::failpoint::hit("stage");
        self.publish(
            op,
            Phase::Committing,
            format!(
                "writing {} file(s)",
                steps.writes.len() + steps.removes.len()
            ),
        );
        let fail = |e: String| (Phase::RolledBack, e);
        for w in &steps.writes {
            let before = self.snapshot(&w.path, &w.expect).map_err(fail)?;
            let (mode, uid, gid) = plan::resolve_keep(w, before.as_ref().map(|b| b.1));
            let created = self
                .root
                .write_atomic(&w.path, &w.content, mode, uid, gid)
                .map_err(|e| fail(format!("committing: {e}")))?;
            for d in &created {
                undo.push(Undo::Dir(d.clone()));
                op.actions.push(format!("created directory {d} (0755)"));
            }
            undo.push(Undo::File(w.path.clone(), before));
            crate::failpoint::hit("write");
            if w.managed_file
                && !created.is_empty()
                && let Some(m) = record.files.get_mut(&w.path)
            {
                m.created_dirs = created.clone();
            }
            op.actions
                .push(format!("wrote {} ({mode:04o} {uid}:{gid})", w.path));
        }
        for r in &steps.removes {
            let before = self.snapshot(&r.path, &r.expect).map_err(fail)?;
            if self
                .root
                .remove(&r.path)
                .map_err(|e| fail(format!("committing: {e}")))?
            {
                undo.push(Undo::File(r.path.clone(), before));
                op.actions.push(format!("removed {}", r.path));
            }
        }
        // directories the agent created, deepest first, once every file in them is gone
        let mut dirs: Vec<&String> = steps.removes.iter().flat_map(|r| r.dirs.iter()).collect();
        dirs.sort_by_key(|d| std::cmp::Reverse(d.matches('/').count()));
        dirs.dedup();
        for d in dirs {
            if self.root.remove_dir_if_empty(d).unwrap_or(false) {
                op.actions.push(format!("removed empty directory {d}"));
            }
        }
        for (k, v) in &steps.sysctls {
            let p = plan::observe::sysctl_path(k);
            let old = self
                .root
                .read_string(&p)
                .ok()
                .flatten()
                .unwrap_or_default()
                .trim_end_matches('\n')
                .to_string();
            self.root
                .write_in_place(&p, format!("{v}\n").as_bytes())
                .map_err(|e| fail(format!("committing: {e}")))?;
            undo.push(Undo::Sysctl(k.clone(), old));
            let back = self.root.read_string(&p).ok().flatten().unwrap_or_default();
            let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
            if norm(&back) != norm(v) {
                return Err(fail(format!(
                    "sysctl {k}: wrote {v:?} but the kernel reads back {:?}; give the value in the form the kernel shows",
                    back.trim_end()
                )));
            }
            op.actions.push(format!("set sysctl {k} = {v}"));
        }
        crate::failpoint::hit("sysctl");
        let _ = self.state.journal_progress(&op.id, "written");
        self.publish(op, Phase::Acting, "running commands and unit actions");
        let act = (|| -> Result<(), String> {
            for cmd in &steps.commands {
                self.runner.run(cmd).map_err(|e| e.to_string())?;
                op.actions.push(format!("ran {}", cmd.join(" ")));
            }
            if steps.reboot {
                for u in steps.reloads.iter().chain(steps.restarts.iter()) {
                    op.actions.push(format!(
                        "{u}: reload/restart absorbed by the pending reboot"
                    ));
                }
                return Ok(());
            }
            if steps.daemon_reload {
                self.services.daemon_reload().map_err(|e| e.to_string())?;
                op.actions.push("daemon-reload".into());
            }
            for u in &steps.reloads {
                self.services.reload(u).map_err(|e| e.to_string())?;
                op.actions.push(format!("reloaded {u}"));
            }
            for u in &steps.try_restarts {
                self.services.try_restart(u).map_err(|e| e.to_string())?;
                op.actions.push(format!("try-restarted {u}"));
            }
            let kubelet = &self.config.kubelet.unit;
            for u in &steps.restarts {
                if u == kubelet && !steps.kubelet_state_reset.is_empty() {
                    self.services.stop(u).map_err(|e| e.to_string())?;
                    op.actions.push(format!("stopped {u}"));
                    for f in &steps.kubelet_state_reset {
                        if self.root.remove(f).map_err(|e| e.to_string())? {
                            op.actions.push(format!("removed {f}"));
                        }
                    }
                    self.services.start(u).map_err(|e| e.to_string())?;
                    op.actions.push(format!("started {u}"));
                } else {
                    self.services.restart(u).map_err(|e| e.to_string())?;
                    op.actions.push(format!("restarted {u}"));
                }
            }
            Ok(())
        })();
        act.map_err(|e| fail(format!("acting: {e}")))?;
        let _ = self.state.journal_progress(&op.id, "acted");
        crate::failpoint::hit("act");
        let kubelet_restarted = !steps.reboot && steps.restarts.contains(&self.config.kubelet.unit);
        self.publish(
            op,
            Phase::Verifying,
            if kubelet_restarted {
                "waiting for the kubelet to be healthy, then re-reading the node"
            } else {
                "re-reading the node"
            },
        );
        if kubelet_restarted {
            if let Err(cause) = self.kubelet_health() {
                let restored = self.undo(undo);
                undo.clear();
                let again = self.restart_units(&intent.units);
                let after = match self.kubelet_health() {
                    Ok(()) => "healthy again".to_string(),
                    Err(e) => format!("still unhealthy: {e}"),
                };
                return Err((
                    Phase::RolledBack,
                    format!(
                        "kubelet health check failed: {cause}; {restored}; {again}; the kubelet is {after}"
                    ),
                ));
            }
            op.actions.push("kubelet healthy".into());
        }
        let check = self
            .plan_with(spec, opts, record.clone())
            .map_err(|e| fail(format!("verifying: {e}")))?;
        let left: Vec<&str> = check
            .report
            .changes
            .iter()
            .filter(|c| c.id != "kernelArgs")
            .filter(|c| !(steps.kernel_args_by_command && c.id.starts_with("kernelArgs")))
            .map(|c| c.id.as_str())
            .collect();
        if !left.is_empty() {
            return Err(fail(format!(
                "verifying: still different after the commit: {}",
                left.join(", ")
            )));
        }
        let needs_reboot = steps.reboot || check.steps.reboot;
        let final_phase = if needs_reboot {
            Phase::RebootRequired
        } else {
            Phase::Succeeded
        };
        // the commit point: once the journal holds the record, a crash rolls forward
        self.state
            .journal_commit(&op.id, spec_pb, &record, final_phase as i32)
            .map_err(|e| fail(format!("recording the applied state: {e}")))?;
        crate::failpoint::hit("record");
        undo.clear();
        if let Err(e) = self
            .state
            .save_record(&record)
            .and_then(|()| self.state.save_applied_spec(spec_pb))
        {
            // past the commit point: the journal keeps the record and the next start
            // installs it, so the journal stays and nothing is undone
            self.publish(
                op,
                Phase::Failed,
                format!(
                    "installing the applied record failed ({e}); the changes are committed in the journal and the record is installed at the next start"
                ),
            );
            return Ok(());
        }
        crate::failpoint::hit("applied");
        let _ = self.state.journal_remove(&op.id);
        for b in &steps.drop_originals {
            let _ = self.state.drop_original(b);
        }
        if needs_reboot {
            let policy =
                RebootPolicy::try_from(op.reboot_policy).unwrap_or(RebootPolicy::CallerHandles);
            if policy == RebootPolicy::AgentHandles {
                op.actions.push("requested reboot".into());
                self.publish(
                    op,
                    Phase::Rebooting,
                    "rebooting to boot with the new kernel arguments",
                );
                if let Err(e) = self
                    .rebooter
                    .reboot(&format!("inplaced operation {}", op.id))
                {
                    self.publish(
                        op,
                        Phase::RebootRequired,
                        format!("changes staged; the reboot request failed ({e}): reboot the node"),
                    );
                }
            } else {
                self.publish(
                    op,
                    Phase::RebootRequired,
                    "changes staged; they take effect after a reboot: drain the node, then call Reboot",
                );
                crate::failpoint::hit("reboot-required");
            }
        } else {
            self.publish(
                op,
                Phase::Succeeded,
                format!("{} change(s) applied", op.changes.len()),
            );
        }
        Ok(())
    }

    /// The write-ahead intent of `steps`: a pre-image of every path (written to the
    /// journal), the directories writes will create, the prior value of every sysctl.
    fn intent(
        &self,
        op: &pb::Operation,
        steps: &plan::Steps,
    ) -> Result<crate::state::Intent, String> {
        use crate::node::sysroot::Parents;
        use crate::state::{IntentEntry, PreImage};
        let mut entries = Vec::new();
        let paths = steps
            .writes
            .iter()
            .map(|w| w.path.as_str())
            .chain(steps.removes.iter().map(|r| r.path.as_str()));
        for (n, path) in paths.enumerate() {
            let pre =
                match plan::observe::observe_file(&self.root, path).map_err(|e| e.to_string())? {
                    FileObs::File { content, entry } => {
                        let file = self
                            .state
                            .journal_pre_image(&op.id, n, &content)
                            .map_err(|e| e.to_string())?;
                        Some(PreImage {
                            file,
                            mode: entry.mode,
                            uid: entry.uid,
                            gid: entry.gid,
                        })
                    }
                    _ => None,
                };
            let mut missing_dirs = Vec::new();
            if let Ok(Parents::Missing(first)) = self.root.parents(path) {
                let mut d = String::new();
                for c in crate::node::sysroot::components(path).map_err(|e| e.to_string())? {
                    d.push('/');
                    d.push_str(c);
                    if d.len() >= first.len() && d.as_str() != path {
                        missing_dirs.push(d.clone());
                    }
                }
            }
            entries.push(IntentEntry {
                path: path.to_string(),
                pre,
                missing_dirs,
            });
        }
        let mut sysctls = Vec::new();
        for (k, _) in &steps.sysctls {
            let prior = self
                .root
                .read_string(&plan::observe::sysctl_path(k))
                .ok()
                .flatten()
                .unwrap_or_default()
                .trim_end_matches('\n')
                .to_string();
            sysctls.push((k.clone(), prior));
        }
        let units = steps
            .restarts
            .iter()
            .chain(steps.try_restarts.iter())
            .chain(steps.reloads.iter())
            .cloned()
            .collect();
        Ok(crate::state::Intent {
            operation: op.id.clone(),
            entries,
            sysctls,
            units,
        })
    }

    /// The kubelet is active (as far as the service manager can tell) and its health
    /// endpoint answers 2xx within the configured timeout.
    fn kubelet_health(&self) -> Result<(), String> {
        let timeout = std::time::Duration::from_secs(self.config.kubelet.health_timeout_secs);
        self.services
            .wait_active(&self.config.kubelet.unit, timeout)
            .map_err(|e| e.to_string())?;
        let url = self
            .config
            .kubelet
            .healthz_url
            .clone()
            .or_else(|| self.default_healthz.clone());
        match url {
            Some(u) => crate::system::http_health(&u, timeout),
            None => Ok(()),
        }
    }

    /// Restarts `units` after a rollback so they run with the restored files.
    fn restart_units(&self, units: &[String]) -> String {
        let mut done = Vec::new();
        for u in units {
            match self.services.restart(u) {
                Ok(()) => done.push(format!("{u} restarted")),
                Err(e) => done.push(format!("{u} restart failed: {e}")),
            }
        }
        if done.is_empty() {
            "no unit to restart".into()
        } else {
            done.join(", ")
        }
    }

    /// Settles the journal of every operation a crash interrupted: a committed one is
    /// rolled forward (its record installed), any other rolled back from its pre-images
    /// (temporary files removed, created directories removed, sysctls restored, units
    /// restarted again if it had acted).
    fn recover_journals(&self) -> Result<(), AgentError> {
        for (id, j) in self.state.journals()? {
            let mut op = self.state.get_operation(&id)?;
            if let Some((record, phase)) = &j.committed {
                self.state.save_record(record)?;
                if let Some(spec) = &j.spec {
                    self.state.save_applied_spec(spec)?;
                }
                if let Some(op) = op.as_mut() {
                    op.phase = *phase;
                    op.message = if *phase == Phase::RebootRequired as i32 {
                        "changes committed (completed after an agent restart); they take effect after a reboot: drain the node, then call Reboot".into()
                    } else {
                        "changes committed; completed after an agent restart".into()
                    };
                    op.updated = Some(now());
                    self.state.save_operation(op)?;
                }
                self.state.journal_remove(&id)?;
                continue;
            }
            let mut restored = 0;
            let mut problems = Vec::new();
            if let Some(intent) = &j.intent {
                for e in intent.entries.iter().rev() {
                    let _ = self.root.remove_stale_temps(&e.path);
                    let r = match &e.pre {
                        Some(pre) => match self.state.journal_read_pre(&id, &pre.file)? {
                            Some(bytes) => self
                                .root
                                .write_atomic(&e.path, &bytes, pre.mode, pre.uid, pre.gid)
                                .map(|_| ()),
                            None => {
                                problems.push(format!("{}: pre-image missing", e.path));
                                Ok(())
                            }
                        },
                        None => self.root.remove(&e.path).map(|_| ()),
                    };
                    match r {
                        Ok(()) => restored += 1,
                        Err(err) => problems.push(format!("{}: {err}", e.path)),
                    }
                    for d in e.missing_dirs.iter().rev() {
                        let _ = self.root.remove_dir_if_empty(d);
                    }
                }
                for (k, v) in &intent.sysctls {
                    let _ = self.root.write_in_place(
                        &plan::observe::sysctl_path(k),
                        format!("{v}\n").as_bytes(),
                    );
                }
                if j.progress == "written" || j.progress == "acted" {
                    let _ = self.restart_units(&intent.units);
                }
            }
            if let Some(op) = op.as_mut() {
                op.phase = Phase::Failed as i32;
                op.message = format!(
                    "{INTERRUPTED} the agent stopped (last step: {}); rolled back from the write-ahead journal, {restored} file(s) restored{}; re-apply with the same operation id to converge",
                    j.progress,
                    if problems.is_empty() {
                        String::new()
                    } else {
                        format!(", problems: {}", problems.join("; "))
                    }
                );
                op.updated = Some(now());
                self.state.save_operation(op)?;
            }
            tracing::warn!(operation = %id, restored, "rolled back an interrupted operation");
            self.state.journal_remove(&id)?;
        }
        Ok(())
    }

    /// The current content of `path` if it still has the fingerprint the plan saw.
    fn snapshot(&self, path: &str, expect: &str) -> Result<Option<(Vec<u8>, Entry)>, String> {
        let obs = plan::observe::observe_file(&self.root, path).map_err(|e| e.to_string())?;
        let seen = obs.fingerprint();
        if seen != expect {
            return Err(format!(
                "{path} changed since the plan (another writer?): it is now {seen}; nothing more is written, re-run the operation"
            ));
        }
        match obs {
            FileObs::File { content, entry } => Ok(Some((content, entry))),
            _ => Ok(None),
        }
    }

    fn undo(&self, undo: &[Undo]) -> String {
        let mut failed = Vec::new();
        for u in undo.iter().rev() {
            let r = match u {
                Undo::File(path, Some((content, e))) => self
                    .root
                    .write_atomic(path, content, e.mode, e.uid, e.gid)
                    .map(|_| ())
                    .map_err(|e| format!("{path}: {e}")),
                Undo::File(path, None) => self
                    .root
                    .remove(path)
                    .map(|_| ())
                    .map_err(|e| format!("{path}: {e}")),
                Undo::Dir(d) => self
                    .root
                    .remove_dir_if_empty(d)
                    .map(|_| ())
                    .map_err(|e| format!("{d}: {e}")),
                Undo::Sysctl(k, v) => self
                    .root
                    .write_in_place(&plan::observe::sysctl_path(k), format!("{v}\n").as_bytes())
                    .map_err(|e| format!("sysctl {k}: {e}")),
            };
            if let Err(e) = r {
                failed.push(e);
            }
        }
        if failed.is_empty() {
            format!("{} step(s) undone, the node is as before", undo.len())
        } else {
            format!("undoing failed for {}", failed.join("; "))
        }
    }

    fn get_operation_locked(
        &self,
        inner: &Inner,
        id: &str,
    ) -> Result<Option<pb::Operation>, AgentError> {
        if let Some(live) = inner.live.get(id)
            && let Some(last) = live.events.last()
        {
            return Ok(Some(last.clone()));
        }
        Ok(self.state.get_operation(id)?)
    }

    /// One operation.
    pub fn get_operation(&self, id: &str) -> Result<pb::Operation, AgentError> {
        let inner = self.lock();
        self.get_operation_locked(&inner, id)?
            .ok_or_else(|| AgentError::NotFound(id.to_string()))
    }

    /// Every state the operation went through in this run (or its last state, for one of an
    /// earlier run), and a receiver of the next ones while it is not settled.
    pub fn watch(
        &self,
        id: &str,
    ) -> Result<
        (
            Vec<pb::Operation>,
            Option<broadcast::Receiver<pb::Operation>>,
        ),
        AgentError,
    > {
        let inner = self.lock();
        if let Some(live) = inner.live.get(id) {
            return Ok((live.events.clone(), Some(live.tx.subscribe())));
        }
        let op = self
            .state
            .get_operation(id)?
            .ok_or_else(|| AgentError::NotFound(id.to_string()))?;
        Ok((vec![op], None))
    }

    /// History, newest first.
    pub fn list_operations(&self) -> Result<Vec<pb::Operation>, AgentError> {
        Ok(self.state.list_operations()?)
    }

    /// Reboots for an operation waiting in `RebootRequired` (or asks again for one in
    /// `Rebooting` whose reboot has not happened). Refused while an operation runs.
    pub fn reboot(&self, id: &str) -> Result<pb::Operation, AgentError> {
        let mut op = {
            let inner = self.lock();
            if let Some(r) = &inner.running {
                return Err(AgentError::Busy(r.clone()));
            }
            let op = self
                .get_operation_locked(&inner, id)?
                .ok_or_else(|| AgentError::NotFound(id.to_string()))?;
            if !matches!(phase_of(&op), Phase::RebootRequired | Phase::Rebooting) {
                return Err(AgentError::Precondition(format!(
                    "operation {id:?} is {}, not waiting for a reboot; nothing to reboot for",
                    phase_name(phase_of(&op))
                )));
            }
            op
        };
        op.actions.push("requested reboot".into());
        op.boot_id = self.boot_id();
        self.publish(&mut op, Phase::Rebooting, "rebooting; verified after boot");
        if let Err(e) = self.rebooter.reboot(&format!("inplaced operation {id}")) {
            self.publish(
                &mut op,
                Phase::RebootRequired,
                format!("the reboot request failed ({e}); reboot the node"),
            );
            return Err(AgentError::Internal(e.to_string()));
        }
        Ok(op)
    }

    /// Agent and node status.
    pub fn status(&self) -> Result<pb::NodeStatus, AgentError> {
        let record = self.state.load_record()?;
        let current = {
            let inner = self.lock();
            inner
                .running
                .as_ref()
                .and_then(|id| inner.live.get(id))
                .and_then(|l| l.events.last().cloned())
        };
        let (drift, drift_detections) = self.scan_drift_with(&record);
        let ops = self.state.list_operations()?;
        let pending = ops
            .iter()
            .find(|o| o.phase == Phase::RebootRequired as i32 || o.phase == Phase::Rebooting as i32)
            .map(|o| o.id.clone())
            .unwrap_or_default();
        Ok(pb::NodeStatus {
            version: env!("CARGO_PKG_VERSION").to_string(),
            agent_uptime_seconds: self.started.elapsed().as_secs(),
            boot_id: self.boot_id(),
            facts: Some(self.facts.clone()),
            applied_spec_hash: record.spec_hash.clone(),
            current_operation: current,
            pending_reboot_operation: pending,
            drift,
            managed_items: record.len() as u32,
            preservation: Some(self.preservation.clone()),
            root: self.root.path().display().to_string(),
            problems: self
                .problems
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            drift_detections,
        })
    }

    /// Scans for drift now, records new detections (with the time first seen) in
    /// `drift.json`, and returns the drift list and the total count of detections. Drift is
    /// only reported: the agent never repairs it by itself.
    pub fn scan_drift(&self) -> (Vec<pb::Drift>, u64) {
        match self.state.load_record() {
            Ok(r) => self.scan_drift_with(&r),
            Err(_) => (Vec::new(), 0),
        }
    }

    fn scan_drift_with(&self, record: &AppliedRecord) -> (Vec<pb::Drift>, u64) {
        let _guard = self.drift_lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut drift = self.drift(record);
        let mut book = self.state.load_drift();
        let now_s = now().seconds;
        let mut changed = false;
        for d in &drift {
            if !book.seen.contains_key(&d.id) {
                book.seen.insert(d.id.clone(), now_s);
                book.detections += 1;
                changed = true;
                tracing::warn!(item = %d.id, expected = %d.expected, observed = %d.observed, "drift detected");
            }
        }
        let before = book.seen.len();
        book.seen.retain(|id, _| drift.iter().any(|d| &d.id == id));
        changed |= before != book.seen.len();
        if changed {
            let _ = self.state.save_drift(&book);
        }
        for d in &mut drift {
            d.since = book.seen.get(&d.id).map(|s| pbjson_types::Timestamp {
                seconds: *s,
                nanos: 0,
            });
        }
        (drift, book.detections)
    }

    /// Directories holding managed items, for the drift watcher (inotify).
    pub fn watched_dirs(&self) -> Vec<String> {
        let mut dirs = std::collections::BTreeSet::new();
        let parent = |p: &str| {
            p.rsplit_once('/').map(|(d, _)| {
                if d.is_empty() {
                    "/".to_string()
                } else {
                    d.to_string()
                }
            })
        };
        if let Ok(r) = self.state.load_record() {
            for p in r.files.keys() {
                dirs.extend(parent(p));
            }
            if !r.kubelet_config.is_empty() || !r.kubelet_flags.is_empty() {
                dirs.extend(parent(&self.config.kubelet.config_path));
                dirs.extend(parent(&self.config.kubelet.flags_path));
            }
            if !r.kernel_args.is_empty()
                && let Ok(b) =
                    crate::bootloader::detect(&self.root, self.config.kernel_args.backend)
            {
                for s in b.sources() {
                    dirs.extend(parent(&s.path));
                }
            }
        }
        dirs.into_iter().collect()
    }

    /// True while an operation runs.
    pub fn is_busy(&self) -> bool {
        self.lock().running.is_some()
    }

    /// The sysroot.
    pub fn root(&self) -> &Sysroot {
        &self.root
    }

    /// Managed items whose observed state differs from the applied record.
    pub fn drift(&self, record: &AppliedRecord) -> Vec<pb::Drift> {
        let mut out = Vec::new();
        for (path, m) in &record.files {
            let want = format!(
                "sha256:{} mode={:04o} uid={} gid={}",
                m.sha256.strip_prefix("sha256:").unwrap_or(&m.sha256),
                m.mode,
                m.uid,
                m.gid
            );
            let seen = match plan::observe::observe_file(&self.root, path) {
                Ok(FileObs::File { content, entry }) => format!(
                    "sha256:{} mode={:04o} uid={} gid={}",
                    crate::spec::sha256_hex(&content),
                    entry.mode,
                    entry.uid,
                    entry.gid
                ),
                Ok(FileObs::Absent) => "absent".into(),
                Ok(FileObs::Conflict(c)) => c,
                Err(e) => e.to_string(),
            };
            if want != seen {
                out.push(pb::Drift {
                    since: None,
                    id: m.item.clone().unwrap_or_else(|| format!("files[{path}]")),
                    expected: want,
                    observed: seen,
                });
            }
        }
        if !record.kubelet_config.is_empty()
            && let Ok(Some(text)) = self.root.read_string(&self.config.kubelet.config_path)
            && let Ok(doc) = crate::kubelet::config::parse(&text)
        {
            for (id, f) in &record.kubelet_config {
                let seen = crate::kubelet::config::get(&doc, &f.path).cloned();
                if seen.as_ref() != Some(&f.value.value) {
                    out.push(pb::Drift {
                        since: None,
                        id: id.clone(),
                        expected: f.value.value.to_string(),
                        observed: seen
                            .map(|v| v.to_string())
                            .unwrap_or_else(|| "absent".into()),
                    });
                }
            }
        }
        if !record.kubelet_flags.is_empty() {
            let text = self
                .root
                .read_string(&self.config.kubelet.flags_path)
                .ok()
                .flatten()
                .unwrap_or_default();
            let flags = crate::kubelet::flags::parse(&text, "KUBELET_KUBEADM_ARGS")
                .ok()
                .flatten()
                .unwrap_or_default();
            for (name, m) in &record.kubelet_flags {
                let seen = flags
                    .iter()
                    .rev()
                    .find(|f| &f.name == name)
                    .map(|f| f.value.clone().unwrap_or_default());
                if seen.as_deref() != Some(m.value.as_str()) {
                    out.push(pb::Drift {
                        since: None,
                        id: format!("kubelet.flags[{name}]"),
                        expected: m.value.clone(),
                        observed: seen.unwrap_or_else(|| "absent".into()),
                    });
                }
            }
        }
        if !record.kernel_args.is_empty()
            && let Ok(b) = crate::bootloader::detect(&self.root, self.config.kernel_args.backend)
        {
            let missing = missing_args(&record.kernel_args, &b.next_boot().render());
            if !missing.is_empty() {
                out.push(pb::Drift {
                    since: None,
                    id: "kernelArgs".into(),
                    expected: record.kernel_args.join(" "),
                    observed: format!("next boot lacks {}", missing.join(" ")),
                });
            }
        }
        for (key, m) in &record.sysctls {
            let seen = self
                .root
                .read_string(&plan::observe::sysctl_path(key))
                .ok()
                .flatten()
                .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "));
            let want = m.value.split_whitespace().collect::<Vec<_>>().join(" ");
            if seen.as_deref() != Some(want.as_str()) {
                out.push(pb::Drift {
                    since: None,
                    id: format!("sysctls[{key}]"),
                    expected: want,
                    observed: seen.unwrap_or_else(|| "absent".into()),
                });
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }
}

/// Checks an operation after a boot against the running command line: every argument
/// the operation added (or staged) must be in `running`, and every argument it removed
/// must be gone unless the next boot's configuration still holds it from another owner.
/// Returns (missing, lingering).
pub fn verify_after_boot(
    op: &pb::Operation,
    running: &str,
    next_boot: &str,
) -> (Vec<String>, Vec<String>) {
    let mut wanted = Vec::new();
    let mut lingering = Vec::new();
    let run = Cmdline::parse(running);
    let config = Cmdline::parse(next_boot);
    for c in op.changes.iter().filter(|c| c.id.starts_with("kernelArgs")) {
        wanted.extend(
            Cmdline::parse(&c.after)
                .args()
                .iter()
                .map(|a| a.as_str().to_string()),
        );
        for r in Cmdline::parse(&c.before).args() {
            let n_run = run.args().iter().filter(|a| a.matches_exactly(r)).count();
            let n_cfg = config
                .args()
                .iter()
                .filter(|a| a.matches_exactly(r))
                .count();
            if n_run > n_cfg {
                lingering.push(r.as_str().to_string());
            }
        }
    }
    (missing_args(&wanted, running), lingering)
}

/// Args of `wanted` missing from `cmdline` (exact matches, duplicates counted).
pub fn missing_args(wanted: &[String], cmdline: &str) -> Vec<String> {
    let mut have: Vec<Arg> = Cmdline::parse(cmdline).args().to_vec();
    let mut missing = Vec::new();
    for w in wanted {
        let Ok(a) = Arg::parse_one(w) else { continue };
        if let Some(i) = have.iter().position(|h| h.matches_exactly(&a)) {
            have.remove(i);
        } else {
            missing.push(w.clone());
        }
    }
    missing
}
