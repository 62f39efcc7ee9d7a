//! The agent: coverage, operations and status over one node.
//!
//! [`Agent`] answers coverage, runs operations and reports status. An operation (DESIGN §2)
//! moves through `Validating → Staging → Committing → Acting → Verifying →
//! (RebootRequired → Rebooting → VerifyingAfterBoot) → Succeeded | Failed | RolledBack`;
//! each phase change is published to watchers, who get every phase change from the start;
//! Staging and every settled phase are persisted to `operations/<id>.json` (the phases
//! between them are settled from the journal after a crash, see `journal.rs`).
//!
//! Memory: the agent holds the running operation with every phase, and the newest settled
//! ones only while their phases fit in [`REPLAY_BYTES`]; any other operation is read from
//! `operations/` when asked for ([`crate::state`]'s operation store).
//!
//! - Staging saves the original of every pre-existing file the spec overwrites for the
//!   first time (`originals/`).
//! - Committing runs the sections' effects before the files (a Kubernetes upgrade), writes
//!   every file atomically and durably (see [`inplace_node::sysroot`]), then runs the
//!   effects after the files (live sysctls). Before each write the file must still be
//!   what the plan saw (no other writer's change is ever overwritten). Every completed
//!   write, removal and effect's change goes on an undo list.
//! - Acting runs boot configuration commands, then daemon-reload, reloads, restarts
//!   through the [`ServiceManager`] (an effect may take a unit's restart over: the
//!   kubelet's manager-checkpoint reset); a pending reboot absorbs reloads and restarts.
//! - Verifying runs the effects' gates (the kubelet's health), re-observes the node and
//!   re-plans: nothing may remain to do but the reboot. The applied record is persisted
//!   only then.
//!
//! A failure at any step after the first write undoes the list in reverse and ends
//! `RolledBack` with the cause. One operation runs at a time; an `Apply` with the id of an
//! existing operation and the same spec returns that operation (idempotency for CAPI's
//! retried `UpdateMachine`), except that an operation interrupted by a stop of the agent
//! is run again.
//!
//! The parts: `machine.rs` (an operation's state, `OpState`, and one pure
//! function per transition, checked against [`inplace_wire::phase`]'s table; the only
//! writer of a phase is `Op::enter`), `engine.rs` (the I/O of each phase
//! under the journal), `effects.rs` (the node and the operation the sections' effects run
//! with, [`crate::sections::kit::effect`]), `rollback.rs` (the one rollback of a failed operation and its
//! message), `after_boot.rs` (settling at start what a
//! reboot or a stop left; explicit reboots; supersession), `journal.rs` (the write-ahead
//! journal, its order of fsyncs, recovery after a crash), `converge.rs` (start-up
//! convergence to `/etc/inplaced/node.d`), `drift.rs` and `status.rs` (read-only views);
//! this module holds the agent, its requests and the single operation slot.

mod after_boot;
mod converge;
mod diff;
mod drift;
mod effects;
mod engine;
mod journal;
mod kept;
mod lost_record;
mod machine;
mod own_problems;
mod reboot_method;
mod rollback;
mod start;
mod status;
mod try_window;
pub(crate) mod watch;
mod workers;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast;

use crate::config::Config;
use crate::plan;
use crate::plan::Plan;
use crate::sections::kit::Options;
use crate::sections::kit::observe::ObserveError;
use crate::sections::model::NodeSpec;
use crate::state::{AppliedRecord, StateDir, StateError};
use inplace_node::facts;
use inplace_node::sysroot::Sysroot;
use inplace_node::system::{CommandRunner, Rebooter, ServiceManager};
use inplace_wire::names::{SpecError, validate_operation_id, validate_operation_id_field};
use inplace_wire::pb;
use inplace_wire::pb::{Phase, RebootPolicy};

pub(crate) use inplace_wire::phase::is_interrupted;

/// How long an `Apply` waits for a concurrent call's planning of the same operation id
/// before it is refused with ABORTED ([`Agent::claim`]): planning the largest spec the
/// limits allow takes a few seconds on a loaded node.
pub(crate) const PLANNING_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Bytes (protobuf encoding) of the phases the newest settled operations keep in memory
/// for watchers to replay. The running operation keeps every phase whatever its size; a
/// settled operation beyond this budget is dropped from memory (oldest first) and read
/// from `operations/<id>.json` when asked for, so the daemon's memory does not grow with
/// its history or with the size of past operations.
pub(crate) const REPLAY_BYTES: usize = 256 * 1024;

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
    /// Another operation holds the node in another way (ABORTED): a timed try waits.
    #[error("{0}")]
    Aborted(String),
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
    /// The state directory can not be written (full, read-only, a journal it could not
    /// settle): mutations are refused, read-only calls served (UNAVAILABLE).
    #[error("{0}")]
    Unavailable(String),
}

impl From<StateError> for AgentError {
    fn from(e: StateError) -> Self {
        AgentError::Internal(e.to_string())
    }
}

impl From<ObserveError> for AgentError {
    fn from(e: ObserveError) -> Self {
        AgentError::Internal(e.to_string())
    }
}

/// What the agent is built from.
#[derive(Debug)]
pub(crate) struct AgentParts {
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
/// Each state is one shared copy, in the replay and on the channel alike: a phase is
/// copied once when it is published (it was twice, issue 28), and once more by each
/// watcher that takes it ([`OperationEvents::recv`]).
#[derive(Debug)]
struct LiveOp {
    events: Vec<Arc<pb::Operation>>,
    tx: broadcast::Sender<Arc<pb::Operation>>,
    /// Sum of the events' protobuf encoded lengths.
    bytes: usize,
}

impl LiveOp {
    fn new(first: pb::Operation) -> LiveOp {
        let (tx, _) = broadcast::channel(64);
        LiveOp {
            bytes: prost::Message::encoded_len(&first),
            events: vec![Arc::new(first)],
            tx,
        }
    }

    /// Records `op` as the next state and sends it to the watchers (if any).
    fn push(&mut self, op: &pb::Operation) {
        self.bytes += prost::Message::encoded_len(op);
        let op = Arc::new(op.clone());
        if self.tx.receiver_count() > 0 {
            let _ = self.tx.send(op.clone());
        }
        self.events.push(op);
    }

    /// The state the operation is in now.
    fn last(&self) -> Option<&pb::Operation> {
        self.events.last().map(|o| &**o)
    }
}

/// The next states of a live operation, for one watcher ([`Agent::watch`]).
#[derive(Debug)]
pub(crate) struct OperationEvents(broadcast::Receiver<Arc<pb::Operation>>);

impl OperationEvents {
    /// The next state (a copy of it), as [`broadcast::Receiver::recv`] gives one.
    pub(crate) async fn recv(&mut self) -> Result<pb::Operation, broadcast::error::RecvError> {
        self.0.recv().await.map(Arc::unwrap_or_clone)
    }

    /// [`OperationEvents::recv`], blocking the thread (outside the runtime).
    pub(crate) fn blocking_recv(&mut self) -> Result<pb::Operation, broadcast::error::RecvError> {
        self.0.blocking_recv().map(Arc::unwrap_or_clone)
    }
}

/// The operation slot and the operations held in memory: the running one, and the
/// newest settled ones within [`REPLAY_BYTES`].
#[derive(Debug, Default)]
struct Inner {
    running: Option<String>,
    live: HashMap<String, LiveOp>,
    /// Settled operations still in `live`, oldest first.
    settled: VecDeque<String>,
}

impl Inner {
    /// `id` settled: it joins the replay set, which is trimmed to [`REPLAY_BYTES`].
    fn settle(&mut self, id: &str) {
        self.settled.retain(|o| o != id);
        // larger than the whole budget: read from disk, the others stay
        if self.live.get(id).is_some_and(|l| l.bytes > REPLAY_BYTES) {
            self.live.remove(id);
            return;
        }
        self.settled.push_back(id.to_string());
        let mut total: usize = self
            .settled
            .iter()
            .filter_map(|o| self.live.get(o))
            .map(|l| l.bytes)
            .sum();
        while total > REPLAY_BYTES {
            let Some(old) = self.settled.pop_front() else {
                break;
            };
            total -= self.live.remove(&old).map(|l| l.bytes).unwrap_or(0);
        }
    }
}

/// The node agent.
#[derive(Debug)]
pub(crate) struct Agent {
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
    /// What this start found when it quarantined the applied record or marked it lost:
    /// (the record or marker, full path; the problem), said while that file is there
    /// ([`Agent::quarantine_problems`]).
    record_problem: Option<(String, String)>,
    /// Problems that come and go, by what they are about ([`Agent::set_problem`]).
    live_problems: Mutex<std::collections::BTreeMap<String, String>>,
    /// Why mutations are refused (the state directory can not be written), if they are.
    unavailable: Mutex<Option<String>>,
    drift_lock: Mutex<()>,
    /// Version queries' answers, kept while their programs stay the same ([`kept`]).
    versions: kept::KeptVersions,
    inner: Mutex<Inner>,
    /// Signalled when a claimed operation's planning ends ([`Agent::register`] or the
    /// release of its slot): a concurrent call with the same id waits for it in
    /// [`Agent::claim`].
    planned: std::sync::Condvar,
    /// The timed tries waiting in this run ([`try_window`]).
    tries: try_window::Tries,
    /// Coverage answers kept while the node stays the same ([`kept`]).
    kept: kept::KeptCoverage,
    /// False only while no operation can be waiting for a reboot: cleared by
    /// [`Agent::supersede_waiting`] when its scan of the history found none, set whenever
    /// an operation is saved in RebootRequired or Rebooting ([`Agent::save_op`]). Saves
    /// every apply a read of every operation file's head (issue 28).
    maybe_waiting: std::sync::atomic::AtomicBool,
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

/// An `Apply` request, checked.
#[derive(Debug)]
struct Request {
    id: String,
    spec: NodeSpec,
    /// The spec's wire form, recorded as the last applied spec.
    spec_pb: Vec<u8>,
    hash: String,
    policy: RebootPolicy,
    opts: Options,
    dry_run: bool,
    /// A dry run's diff view ([`pb::ApplyRequest::diff`]).
    diff: Option<pb::DiffOptions>,
    /// The reboot method (the request's, else the config's).
    method: pb::RebootMethod,
    /// A timed try's window, seconds (0: not a try).
    try_seconds: u32,
}

/// Refuses a plan that is not fully covered: PERMISSION_DENIED when the policy refuses
/// a change, else FAILED_PRECONDITION; the error lists every change not covered.
fn refuse_uncovered(plan: &Plan) -> Result<(), AgentError> {
    if plan.report.fully_covered {
        return Ok(());
    }
    let refused: Vec<&pb::Change> = plan.report.changes.iter().filter(|c| !c.covered).collect();
    let list: Vec<String> = refused
        .iter()
        .map(|c| format!("{}: {}", c.id, c.reason))
        .collect();
    if refused.iter().any(|c| c.reason.starts_with("policy:")) {
        return Err(AgentError::PermissionDenied(list.join("; ")));
    }
    Err(AgentError::NotCovered(list.join("; ")))
}

impl Agent {
    /// Opens the sysroot and state directory (locking it), detects node facts, and settles
    /// operations left unfinished by a previous run.
    pub(crate) fn new(parts: AgentParts) -> Result<Arc<Agent>, AgentError> {
        let root = Sysroot::open(&parts.root).map_err(|e| AgentError::Internal(e.to_string()))?;
        let mut state = StateDir::open(&parts.state_dir)?;
        state.lock()?;
        // a read-only state directory keeps its temporary files (reported below)
        let stale = state.remove_stale_temps().err();
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
        // a record quarantined or marked lost, now or by an earlier start, is said as
        // such (status: Agent::quarantine_problems), not as a plain missing record
        // (StateDir::check)
        let markers = state.quarantined_records();
        let quarantined = problem.is_some() || !markers.is_empty();
        if let Some(p) = &problem {
            tracing::warn!("{}", p.message);
        }
        // what this start found about a record it quarantined or marked is said while
        // the record or marker is there; what it found otherwise, for good
        let (record_problem, mut problems) = match problem {
            Some(crate::state::RecordProblem {
                file: Some(file),
                message,
            }) => (Some((file, message)), Vec::new()),
            Some(p) => (None, vec![p.message]),
            None => (None, Vec::new()),
        };
        problems.extend(stale.map(|e| format!("removing temporary files: {e}")));
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
            problems: Mutex::new(problems),
            record_problem,
            live_problems: Mutex::default(),
            unavailable: Mutex::new(None),
            drift_lock: Mutex::new(()),
            versions: kept::KeptVersions::default(),
            inner: Mutex::new(Inner::default()),
            planned: std::sync::Condvar::new(),
            tries: try_window::Tries::default(),
            kept: kept::KeptCoverage::from_env(),
            maybe_waiting: std::sync::atomic::AtomicBool::new(true),
        });
        agent.recover_journals();
        // the state as the journals left it: the record a roll-forward installed
        let record = agent.state.load_record().unwrap_or_default();
        for p in agent.state.check(&record, quarantined) {
            agent.problem(p);
        }
        if let Err(e) = agent.state.probe_writable() {
            agent.problem(format!("the state directory can not be written: {e}"));
            agent.set_unavailable(e.to_string());
        }
        if let Err(e) = agent.recover() {
            agent.problem(format!("settling the operations of the previous run: {e}"));
        }
        agent.resume_tries();
        Ok(agent)
    }

    /// From now on mutations are refused with `UNAVAILABLE`, naming the state directory
    /// and `why`; read-only calls are still served.
    fn set_unavailable(&self, why: String) {
        let mut u = self.unavailable.lock().unwrap_or_else(|p| p.into_inner());
        if u.is_none() {
            *u = Some(format!(
                "the state directory {} can not be written: {why}; changes are refused until it can (free space or make it writable, then restart inplaced)",
                self.state.path().display()
            ));
        }
    }

    /// `UNAVAILABLE` when the state directory can not be written.
    fn check_available(&self) -> Result<(), AgentError> {
        match &*self.unavailable.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(why) => Err(AgentError::Unavailable(why.clone())),
            None => Ok(()),
        }
    }

    /// The node's current boot id (`/proc/sys/kernel/random/boot_id` in the sysroot).
    pub(crate) fn boot_id(&self) -> String {
        self.root
            .read_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .flatten()
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// Node facts detected at start.
    pub(crate) fn facts(&self) -> &pb::NodeFacts {
        &self.facts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The command runner for observation: version queries answered from
    /// [`kept::KeptVersions`] while their programs stay the same.
    fn version_queries(&self) -> kept::VersionQueries<'_> {
        kept::VersionQueries {
            inner: self.runner.as_ref(),
            root: &self.root,
            kept: &self.versions,
        }
    }

    fn options(&self, policy: RebootPolicy) -> Options {
        Options {
            reboot_forbidden: policy == RebootPolicy::Forbidden,
            reserved: self.reserved.clone(),
            leave_files: Vec::new(),
        }
    }

    fn plan_for(&self, desired: &NodeSpec, opts: Options) -> Result<Plan, AgentError> {
        let record = self.state.read_record()?;
        self.plan_with(desired, opts, &record)
    }

    fn plan_with(
        &self,
        desired: &NodeSpec,
        opts: Options,
        record: &AppliedRecord,
    ) -> Result<Plan, AgentError> {
        let queries = self.version_queries();
        let runner: Option<&dyn CommandRunner> = Some(&queries);
        let obs = plan::observe::observe_with(
            &self.root,
            &self.state,
            &self.config,
            desired,
            record,
            runner,
        )?;
        let mut p = plan::plan(desired, &obs, record, &self.config, opts);
        plan::writable::refuse_unwritable(&mut p, &self.root);
        self.lost_record_not_covered(desired, &mut p);
        p.report.facts = Some(self.facts.clone());
        p.report.preservation = Some(self.preservation.clone());
        Ok(p)
    }

    /// Checks the spec against the size limits of the policy: `INVALID_ARGUMENT`, like every
    /// other property of a spec (the counts were checked on the raw message already, see
    /// `server::limits`; this covers specs from node.d).
    fn check_limits(&self, spec: &NodeSpec) -> Result<(), AgentError> {
        let p = &self.config.policy;
        if spec.files.len() > p.max_files {
            return Err(AgentError::InvalidSpec(SpecError::new(
                "files",
                format!(
                    "{} files, over the limit of {} (policy.max_files); split the spec or raise the limit",
                    spec.files.len(),
                    p.max_files
                ),
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
            return Err(AgentError::InvalidSpec(SpecError::new(
                "desired",
                format!(
                    "{total} bytes of content, over the limit of {} (policy.max_spec_bytes); split the spec or raise the limit",
                    p.max_spec_bytes
                ),
            )));
        }
        Ok(())
    }

    /// The agent config.
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// The state directory's path (kept out of what callers who are not root see).
    pub(crate) fn state_path(&self) -> &std::path::Path {
        self.state.path()
    }

    /// The kept answer of this coverage request when the node is unchanged since it was
    /// computed ([`kept`]: one look per path the answer read, no parse nor plan: cheap
    /// enough for the server to ask on its async worker), else what
    /// [`Agent::coverage_computed_keeping`] needs to compute it.
    pub(crate) fn kept_coverage(
        &self,
        desired: &pb::NodeSpec,
        policy: RebootPolicy,
        diff: Option<&pb::DiffOptions>,
    ) -> Lookup {
        let Some(key) = kept::key(desired, policy, diff) else {
            return Lookup::Compute(None);
        };
        match self.kept.get(&key, &[&self.root, self.state.sysroot()]) {
            Some(r) => Lookup::Kept(Box::new(r)),
            None => Lookup::Compute(Some(key)),
        }
    }

    /// Coverage of `desired` under `policy` (no side effects), with `diff` the report's
    /// `diffs` of every file the plan writes or removes ([`crate::plan::diff`]; the caller
    /// has checked that it may see confidential content when `diff.show_content` is set),
    /// computed, and kept under `key` (from [`Agent::kept_coverage`]) while every file it
    /// read stays the same.
    pub(crate) fn coverage_computed_keeping(
        &self,
        key: Option<kept::Key>,
        desired: &pb::NodeSpec,
        policy: RebootPolicy,
        diff: Option<&pb::DiffOptions>,
    ) -> Result<pb::CoverageReport, AgentError> {
        let compute = || self.coverage_computed(desired, policy, diff);
        match key {
            Some(key) => self
                .kept
                .compute(key, &[&self.root, self.state.sysroot()], compute),
            None => compute(),
        }
    }

    /// [`Agent::coverage_computed_keeping`], without keeping.
    fn coverage_computed(
        &self,
        desired: &pb::NodeSpec,
        policy: RebootPolicy,
        diff: Option<&pb::DiffOptions>,
    ) -> Result<pb::CoverageReport, AgentError> {
        inplace_node::failpoint::hit("coverage");
        let desired = self.resolve_kept(desired)?;
        let spec = NodeSpec::from_pb(&desired)?;
        self.check_limits(&spec)?;
        let record = self.state.read_record()?;
        let plan = self.plan_with(&spec, self.options(policy), &record)?;
        let diffs = match diff {
            Some(d) => self.diffs(&plan, &spec, &record, d.show_content)?,
            None => Vec::new(),
        };
        Ok(pb::CoverageReport {
            diffs,
            ..plan.report
        })
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
            inplace_wire::names::validate_dropin_name(&field, &d.name)?;
            if !d.content.is_empty() {
                return Err(SpecError::new(field, "give content or keep, not both").into());
            }
            let path = format!("{}/{}", inplace_wire::names::DROPIN_DIR, d.name);
            // the node's copy is obeyed as root: only when no other user could write it
            let text = match self.root.read_trusted(&path) {
                Ok(Some(bytes)) => String::from_utf8(bytes).ok(),
                Err(e @ inplace_node::trust::TrustError::Untrusted(_)) => {
                    return Err(SpecError::new(field, format!("not kept: {e}")).into());
                }
                _ => None,
            };
            match text {
                Some(text) => d.content = text,
                None => {
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
    pub(crate) fn apply(
        self: &Arc<Self>,
        req: pb::ApplyRequest,
    ) -> Result<pb::Operation, AgentError> {
        self.apply_leaving(req, Vec::new())
    }

    /// The request, checked: the spec (drop-ins kept from the node filled in, the
    /// policy's limits), the operation id (a new one when empty), the reboot policy.
    fn request(&self, req: pb::ApplyRequest, leave: Vec<String>) -> Result<Request, AgentError> {
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
        if req.diff.is_some() && !req.dry_run {
            return Err(AgentError::InvalidRequest(SpecError::new(
                "diff",
                "a diff is computed only for a dry run; set dry_run too (inplacectl apply --dry-run --diff)",
            )));
        }
        let mut opts = self.options(policy);
        opts.leave_files = leave;
        try_window::check_try_seconds(req.try_seconds).map_err(AgentError::InvalidRequest)?;
        let method = match pb::RebootMethod::try_from(req.reboot_method)
            .unwrap_or(pb::RebootMethod::Unspecified)
        {
            pb::RebootMethod::Unspecified => self.config.reboot_method.to_pb(),
            m => m,
        };
        Ok(Request {
            method,
            try_seconds: req.try_seconds,
            id,
            hash: spec.hash(),
            spec_pb: prost::Message::encode_to_vec(&desired),
            spec,
            policy,
            opts,
            dry_run: req.dry_run,
            diff: req.diff,
        })
    }

    /// A dry run: the operation as it would go, nothing changed.
    fn dry_run(&self, r: Request) -> Result<pb::Operation, AgentError> {
        let record = self.state.read_record()?;
        let plan = self.plan_with(&r.spec, r.opts, &record)?;
        let diffs = match &r.diff {
            Some(d) => self.diffs(&plan, &r.spec, &record, d.show_content)?,
            None => Vec::new(),
        };
        let t = now();
        let covered = plan.report.fully_covered;
        Ok(pb::Operation {
            id: r.id,
            phase: if covered {
                Phase::Succeeded as i32
            } else {
                Phase::Failed as i32
            },
            message: if covered {
                format!(
                    "dry run: {} change(s) would be applied",
                    plan.report.changes.len()
                )
            } else {
                "dry run: not fully covered; apply would be refused".into()
            },
            spec_hash: r.hash,
            reboot_policy: r.policy as i32,
            created: Some(t),
            updated: Some(t),
            changes: plan.report.changes,
            actions: vec![],
            boot_id: self.boot_id(),
            dry_run: true,
            diffs,
            reboot_method: r.method as i32,
            try_seconds: r.try_seconds,
            ..Default::default()
        })
    }

    /// Claims the single operation slot for `r`; the existing operation of that id and
    /// spec when there is one (and it was not interrupted), which is the answer.
    ///
    /// A concurrent call with the same id that is still planning it may yet be refused, so
    /// this call waits for its outcome (at most [`PLANNING_WAIT`]) and answers as a call
    /// made after it would: the accepted operation, or a slot of its own to plan in.
    ///
    /// Errors: [`AgentError::Aborted`] when that planning takes longer than
    /// [`PLANNING_WAIT`]; [`AgentError::Busy`] while another operation holds the slot;
    /// [`AgentError::AlreadyExists`] for the same id with another spec.
    fn claim(&self, r: &Request) -> Result<Option<pb::Operation>, AgentError> {
        let mut inner = self.lock();
        // claimed by a concurrent call that is still planning it: it may yet be refused,
        // so this call learns the outcome before it answers
        let until = std::time::Instant::now() + PLANNING_WAIT;
        while inner.running.as_ref() == Some(&r.id) && !inner.live.contains_key(&r.id) {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(AgentError::Aborted(format!(
                    "operation {:?} is still being planned by another call; retry to learn whether it was accepted",
                    r.id
                )));
            }
            inner = match self.planned.wait_timeout(inner, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        if let Some(existing) = self.get_operation_locked(&inner, &r.id)? {
            if existing.spec_hash != r.hash {
                return Err(AgentError::AlreadyExists {
                    id: r.id.clone(),
                    existing: existing.spec_hash,
                    requested: r.hash.clone(),
                });
            }
            if !is_interrupted(&existing) {
                return Ok(Some(existing));
            }
        }
        if let Some(running) = &inner.running {
            return Err(AgentError::Busy(running.clone()));
        }
        // The operation exists for callers, watchers and the history only once it is
        // planned and accepted ([`Agent::register`]): until then it may still be refused.
        inner.running = Some(r.id.clone());
        inner.settled.retain(|o| o != &r.id);
        inner.live.remove(&r.id);
        Ok(None)
    }

    /// Makes the accepted operation's first state visible to callers and watchers (it is
    /// written to `operations/` when it enters Staging, before its first change).
    fn register(&self, op: &pb::Operation) {
        self.lock()
            .live
            .insert(op.id.clone(), LiveOp::new(op.clone()));
        self.planned.notify_all();
    }

    fn get_operation_locked(
        &self,
        inner: &Inner,
        id: &str,
    ) -> Result<Option<pb::Operation>, AgentError> {
        if let Some(live) = inner.live.get(id)
            && let Some(last) = live.last()
        {
            return Ok(Some(last.clone()));
        }
        Ok(self.state.get_operation(id)?)
    }

    /// One operation; INVALID_ARGUMENT for an id that is not one
    /// ([`validate_operation_id`]).
    pub(crate) fn get_operation(&self, id: &str) -> Result<pb::Operation, AgentError> {
        validate_operation_id_field("id", id).map_err(AgentError::InvalidRequest)?;
        let inner = self.lock();
        self.get_operation_locked(&inner, id)?
            .ok_or_else(|| AgentError::NotFound(id.to_string()))
    }

    /// Every state the operation went through in this run (or its last state, for one of an
    /// earlier run), and a receiver of the next ones while it is not settled.
    pub(crate) fn watch(
        &self,
        id: &str,
    ) -> Result<(Vec<pb::Operation>, Option<OperationEvents>), AgentError> {
        validate_operation_id_field("id", id).map_err(AgentError::InvalidRequest)?;
        let inner = self.lock();
        if let Some(live) = inner.live.get(id) {
            let events = live.events.iter().map(|o| (**o).clone()).collect();
            return Ok((events, Some(OperationEvents(live.tx.subscribe()))));
        }
        let op = self
            .state
            .get_operation(id)?
            .ok_or_else(|| AgentError::NotFound(id.to_string()))?;
        Ok((vec![op], None))
    }

    /// History, newest first: the operation files, with the running operation as it is
    /// now (its phases between Staging and the settled one are not written to disk).
    pub(crate) fn list_operations(&self) -> Result<Vec<pb::Operation>, AgentError> {
        let mut ops = self.state.list_operations()?;
        let inner = self.lock();
        if let Some(now) = inner
            .running
            .as_ref()
            .and_then(|id| inner.live.get(id))
            .and_then(|l| l.last())
        {
            match ops.iter_mut().find(|o| o.id == now.id) {
                Some(o) => *o = now.clone(),
                None => ops.insert(0, now.clone()),
            }
        }
        Ok(ops)
    }

    /// The node's preservation recommendation (from its facts, fixed at start-up).
    pub(crate) fn preservation(&self) -> pb::Preservation {
        self.preservation.clone()
    }

    /// True while an operation runs.
    pub(crate) fn is_busy(&self) -> bool {
        self.lock().running.is_some()
    }

    /// The sysroot.
    pub(crate) fn root(&self) -> &Sysroot {
        &self.root
    }
}

/// What [`Agent::kept_coverage`] found.
pub(crate) enum Lookup {
    /// The kept answer.
    Kept(Box<pb::CoverageReport>),
    /// None kept: compute it (and keep it under this key, when it has one).
    Compute(Option<kept::Key>),
}

#[cfg(test)]
mod tests {
    use super::{Inner, LiveOp, REPLAY_BYTES, pb};

    /// An operation of `changes` changes of about 100 bytes each, in `phase`.
    fn op(id: &str, changes: usize, phase: pb::Phase) -> pb::Operation {
        pb::Operation {
            id: id.into(),
            phase: phase as i32,
            changes: (0..changes)
                .map(|i| pb::Change {
                    id: format!("file:/etc/bench/f{i:04}.conf"),
                    before: "sha256:".to_string() + &"a".repeat(64),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Memory is bounded by bytes, not by the number of operations: after any history,
    /// the settled operations held sum to at most REPLAY_BYTES, the newest small ones
    /// are kept with every phase, and one larger than the budget is not held at all.
    #[test]
    fn the_settled_operations_held_are_bounded_by_bytes() {
        let mut inner = Inner::default();
        for k in 0..300 {
            let id = format!("op{k}");
            let mut live = LiveOp::new(op(&id, 200, pb::Phase::Validating));
            for p in [
                pb::Phase::Staging,
                pb::Phase::Committing,
                pb::Phase::Acting,
                pb::Phase::Verifying,
                pb::Phase::Succeeded,
            ] {
                live.push(&op(&id, 200, p));
            }
            inner.live.insert(id.clone(), live);
            inner.settle(&id);
            let held: usize = inner.live.values().map(|l| l.bytes).sum();
            assert!(held <= REPLAY_BYTES, "{held} bytes held after {k}");
        }
        let one = LiveOp::new(op("x", 200, pb::Phase::Succeeded)).bytes;
        assert!(
            one * 6 > REPLAY_BYTES / 4,
            "the test's operations are not small: {one}"
        );
        assert!(inner.live.len() < 300 && inner.settled.len() == inner.live.len());
        // small operations: the newest are kept whole
        for k in 0..50 {
            let id = format!("small{k}");
            let mut live = LiveOp::new(op(&id, 1, pb::Phase::Validating));
            live.push(&op(&id, 1, pb::Phase::Succeeded));
            inner.live.insert(id.clone(), live);
            inner.settle(&id);
        }
        assert_eq!(inner.live["small49"].events.len(), 2);
        // one operation larger than the whole budget is dropped at once
        let mut big = LiveOp::new(op("big", 5000, pb::Phase::Validating));
        big.push(&op("big", 5000, pb::Phase::Succeeded));
        assert!(big.bytes > REPLAY_BYTES);
        inner.live.insert("big".into(), big);
        inner.settle("big");
        assert!(!inner.live.contains_key("big"));
        assert_eq!(inner.live["small49"].events.len(), 2, "the others stay");
        assert!(inner.live.values().map(|l| l.bytes).sum::<usize>() <= REPLAY_BYTES);
    }
}
