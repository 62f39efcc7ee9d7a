//! The agent and its operation engine.
//!
//! [`Agent`] answers coverage, runs operations and reports status. An operation (DESIGN §2)
//! moves through `Validating → Staging → Committing → Acting → Verifying →
//! (RebootRequired → Rebooting → VerifyingAfterBoot) → Succeeded | Failed | RolledBack`;
//! each phase change is persisted to `operations/<id>.json` and published to watchers.
//!
//! - Staging saves the original of every pre-existing file the spec overwrites for the
//!   first time (`originals/`).
//! - Committing writes every file atomically and durably (see [`crate::node::sysroot`]),
//!   keeping an undo list (previous bytes and metadata of each path written); a failure
//!   here or in Acting restores the undo list in reverse and ends `RolledBack`.
//! - Acting runs boot configuration commands, then daemon-reload, reloads and restarts
//!   through the [`ServiceManager`]; a pending reboot absorbs reloads and restarts.
//! - Verifying re-observes the node and re-plans: nothing may remain to do but the reboot.
//!   The applied record is persisted only then.
//!
//! One operation runs at a time; an `Apply` with the id of an existing operation and the
//! same spec returns that operation (idempotency for CAPI's retried `UpdateMachine`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use crate::cmdline::{Arg, Cmdline};
use crate::config::Config;
use crate::node::facts;
use crate::node::sysroot::{Entry, Kind, Sysroot};
use crate::pb::{self, Phase, RebootPolicy};
use crate::plan::{self, Options, Plan, observe::FileObs};
use crate::spec::{NodeSpec, SpecError};
use crate::state::{AppliedRecord, StateDir, StateError};
use crate::system::{CommandRunner, Rebooter, ServiceManager};

/// A path written by an operation and its previous content and metadata (None = absent).
type Undo = (String, Option<(Vec<u8>, Entry)>);

/// Agent errors; the server maps each to a gRPC status code.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Malformed spec or request (INVALID_ARGUMENT).
    #[error("invalid spec: {0}")]
    InvalidSpec(#[from] SpecError),
    /// The spec is not fully covered (FAILED_PRECONDITION).
    #[error("not covered, nothing was changed: {0}")]
    NotCovered(String),
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
}

#[derive(Debug, Default)]
struct Inner {
    running: Option<String>,
    watchers: HashMap<String, watch::Sender<pb::Operation>>,
}

/// The node agent.
#[derive(Debug)]
pub struct Agent {
    root: Sysroot,
    state: StateDir,
    config: Config,
    facts: pb::NodeFacts,
    preservation: pb::Preservation,
    started: Instant,
    services: Arc<dyn ServiceManager>,
    rebooter: Arc<dyn Rebooter>,
    runner: Arc<dyn CommandRunner>,
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

/// Validates an operation id: 1–128 bytes of `[A-Za-z0-9._-]`, not starting with `.`.
pub fn validate_operation_id(id: &str) -> Result<(), SpecError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
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
    /// Opens the sysroot and state directory, detects node facts, and recovers operations
    /// left unfinished by a previous run.
    pub fn new(parts: AgentParts) -> Result<Arc<Agent>, AgentError> {
        let root = Sysroot::open(&parts.root).map_err(|e| AgentError::Internal(e.to_string()))?;
        let mut state = StateDir::open(&parts.state_dir)?;
        state.lock()?;
        let mut node_facts = facts::detect(&root, &parts.config.preservation.bindings);
        node_facts.kernel_args_backend =
            match crate::bootloader::detect(&root, parts.config.kernel_args.backend) {
                Ok(b) => b.reason(),
                Err(e) => format!("none: {e}"),
            };
        let preservation =
            facts::preservation(&node_facts, parts.config.preservation.hardware_bound);
        let agent = Arc::new(Agent {
            root,
            state,
            config: parts.config,
            facts: node_facts,
            preservation,
            started: Instant::now(),
            services: parts.services,
            rebooter: parts.rebooter,
            runner: parts.runner,
            inner: Mutex::new(Inner::default()),
        });
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

    /// Settles operations a previous run left behind: one waiting in `Rebooting` is verified
    /// once the boot id changed; one stopped mid-way is marked `Failed` (interrupted).
    fn recover(&self) -> Result<(), AgentError> {
        let boot_id = self.boot_id();
        for mut op in self.state.list_operations()? {
            let phase = Phase::try_from(op.phase).unwrap_or(Phase::Unspecified);
            match phase {
                Phase::Rebooting | Phase::RebootRequired if op.boot_id != boot_id => {
                    op.phase = Phase::VerifyingAfterBoot as i32;
                    let record = self.state.load_record()?;
                    let running = self
                        .root
                        .read_string("/proc/cmdline")
                        .ok()
                        .flatten()
                        .unwrap_or_default();
                    let next_boot =
                        crate::bootloader::detect(&self.root, self.config.kernel_args.backend)
                            .map(|b| b.next_boot().render())
                            .unwrap_or_default();
                    let (missing, lingering) =
                        verify_after_boot(&op, &record.kernel_args, &running, &next_boot);
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
                }
                Phase::Validating
                | Phase::Staging
                | Phase::Committing
                | Phase::Acting
                | Phase::Verifying
                | Phase::VerifyingAfterBoot => {
                    op.phase = Phase::Failed as i32;
                    op.message = format!(
                        "interrupted: the agent stopped during {}; re-apply with the same operation id to converge",
                        phase.as_str_name()
                    );
                    op.updated = Some(now());
                    self.state.save_operation(&op)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn plan_for(
        &self,
        desired: &NodeSpec,
        opts: Options,
    ) -> Result<(Plan, AppliedRecord), AgentError> {
        let record = self.state.load_record()?;
        self.plan_with(desired, opts, record)
    }

    fn plan_with(
        &self,
        desired: &NodeSpec,
        opts: Options,
        record: AppliedRecord,
    ) -> Result<(Plan, AppliedRecord), AgentError> {
        let obs = plan::observe(&self.root, &self.state, &self.config, desired, &record)?;
        let mut p = plan::plan(desired, &obs, &record, &self.config, opts);
        p.report.facts = Some(self.facts.clone());
        p.report.preservation = Some(self.preservation.clone());
        Ok((p, record))
    }

    /// Coverage of `desired` (no side effects).
    pub fn coverage(&self, desired: &pb::NodeSpec) -> Result<pb::CoverageReport, AgentError> {
        let spec = NodeSpec::from_pb(desired)?;
        Ok(self.plan_for(&spec, Options::default())?.0.report)
    }

    /// Starts an operation (see the module docs); returns its first state.
    pub fn apply(self: &Arc<Self>, req: pb::ApplyRequest) -> Result<pb::Operation, AgentError> {
        let desired = req.desired.unwrap_or_default();
        let spec = NodeSpec::from_pb(&desired)?;
        let id = if req.operation_id.is_empty() {
            uuid::Uuid::new_v4().to_string()
        } else {
            validate_operation_id(&req.operation_id)?;
            req.operation_id.clone()
        };
        let policy =
            match RebootPolicy::try_from(req.reboot_policy).unwrap_or(RebootPolicy::Unspecified) {
                RebootPolicy::Unspecified => RebootPolicy::CallerHandles,
                p => p,
            };
        let hash = spec.hash();
        let mut inner = self.lock();
        if !req.dry_run {
            if let Some(existing) = self.get_operation_locked(&inner, &id)? {
                if existing.spec_hash == hash {
                    return Ok(existing);
                }
                return Err(AgentError::AlreadyExists {
                    id,
                    existing: existing.spec_hash,
                    requested: hash,
                });
            }
            if let Some(r) = &inner.running {
                return Err(AgentError::Busy(r.clone()));
            }
        }
        let opts = Options {
            reboot_forbidden: policy == RebootPolicy::Forbidden,
        };
        let (plan, _) = self.plan_for(&spec, opts)?;
        if !plan.report.fully_covered {
            let list: Vec<String> = plan
                .report
                .changes
                .iter()
                .filter(|c| !c.covered)
                .map(|c| format!("{}: {}", c.id, c.reason))
                .collect();
            return Err(AgentError::NotCovered(list.join("; ")));
        }
        let t = now();
        let mut op = pb::Operation {
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
            dry_run: req.dry_run,
        };
        if req.dry_run {
            op.phase = Phase::Succeeded as i32;
            op.message = format!("dry run: {} change(s) would be applied", op.changes.len());
            return Ok(op);
        }
        self.state.save_operation(&op)?;
        let (tx, _) = watch::channel(op.clone());
        inner.watchers.insert(id.clone(), tx);
        inner.running = Some(id.clone());
        drop(inner);
        let agent = Arc::clone(self);
        let first = op.clone();
        std::thread::Builder::new()
            .name(format!("op-{id}"))
            .spawn(move || agent.run(op, spec, plan, opts))
            .map_err(|e| AgentError::Internal(format!("spawn operation thread: {e}")))?;
        Ok(first)
    }

    fn publish(&self, op: &mut pb::Operation, phase: Phase, message: impl Into<String>) {
        op.phase = phase as i32;
        op.message = message.into();
        op.updated = Some(now());
        if let Err(e) = self.state.save_operation(op) {
            tracing::error!(operation = %op.id, error = %e, "persisting operation");
        }
        tracing::info!(operation = %op.id, phase = phase.as_str_name(), message = %op.message, "operation phase");
        if let Some(tx) = self.lock().watchers.get(&op.id) {
            tx.send_replace(op.clone());
        }
    }

    fn run(self: Arc<Self>, mut op: pb::Operation, spec: NodeSpec, plan: Plan, opts: Options) {
        let result = self.execute(&mut op, &spec, &plan, opts);
        if let Err((phase, msg)) = result {
            self.publish(&mut op, phase, msg);
        }
        if let Err(e) = self.state.prune(self.config.history.keep) {
            tracing::warn!(error = %e, "pruning history");
        }
        self.lock().running = None;
    }

    fn execute(
        &self,
        op: &mut pb::Operation,
        spec: &NodeSpec,
        plan: &Plan,
        opts: Options,
    ) -> Result<(), (Phase, String)> {
        let steps = &plan.steps;
        self.publish(
            op,
            Phase::Staging,
            "saving originals of files overwritten for the first time",
        );
        for w in &steps.writes {
            if let Some(orig) = &w.save_original {
                self.state
                    .save_original(&w.path, orig)
                    .map_err(|e| (Phase::Failed, format!("staging: {e}; nothing was changed")))?;
                op.actions.push(format!("saved original of {}", w.path));
            }
        }
        self.publish(
            op,
            Phase::Committing,
            format!(
                "writing {} file(s)",
                steps.writes.len() + steps.removes.len()
            ),
        );
        let mut undo: Vec<Undo> = Vec::new();
        let commit = (|| -> Result<(), String> {
            for w in &steps.writes {
                let before = self.snapshot(&w.path)?;
                let (mode, uid, gid) = plan::resolve_keep(w, before.as_ref().map(|b| b.1));
                undo.push((w.path.clone(), before));
                let created = self
                    .root
                    .write_atomic(&w.path, &w.content, mode, uid, gid)
                    .map_err(|e| e.to_string())?;
                for d in created {
                    op.actions.push(format!("created directory {d} (0755)"));
                }
                op.actions
                    .push(format!("wrote {} ({mode:04o} {uid}:{gid})", w.path));
            }
            for r in &steps.removes {
                let before = self.snapshot(r)?;
                undo.push((r.clone(), before));
                if self.root.remove(r).map_err(|e| e.to_string())? {
                    op.actions.push(format!("removed {r}"));
                }
            }
            for (k, v) in &steps.sysctls {
                let p = plan::observe::sysctl_path(k);
                self.root
                    .write_in_place(&p, format!("{v}\n").as_bytes())
                    .map_err(|e| e.to_string())?;
                op.actions.push(format!("set sysctl {k} = {v}"));
            }
            Ok(())
        })();
        if let Err(e) = commit {
            let restored = self.undo(&undo);
            return Err((
                Phase::RolledBack,
                format!("committing failed: {e}; {restored}"),
            ));
        }
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
            for u in &steps.restarts {
                self.services.restart(u).map_err(|e| e.to_string())?;
                op.actions.push(format!("restarted {u}"));
            }
            Ok(())
        })();
        if let Err(e) = act {
            let restored = self.undo(&undo);
            return Err((Phase::RolledBack, format!("acting failed: {e}; {restored}")));
        }
        self.publish(op, Phase::Verifying, "re-reading the node");
        let (check, _) = self
            .plan_with(spec, opts, plan.record.clone())
            .map_err(|e| (Phase::Failed, format!("verifying: {e}")))?;
        let left: Vec<&str> = check
            .report
            .changes
            .iter()
            .filter(|c| c.id != "kernelArgs")
            .filter(|c| !(steps.kernel_args_by_command && c.id.starts_with("kernelArgs")))
            .map(|c| c.id.as_str())
            .collect();
        if !left.is_empty() {
            return Err((
                Phase::Failed,
                format!(
                    "verifying: still different after the commit: {}",
                    left.join(", ")
                ),
            ));
        }
        self.state
            .save_record(&plan.record)
            .map_err(|e| (Phase::Failed, format!("recording the applied state: {e}")))?;
        for b in &steps.drop_originals {
            let _ = self.state.drop_original(b);
        }
        if steps.reboot || check.steps.reboot {
            let policy =
                RebootPolicy::try_from(op.reboot_policy).unwrap_or(RebootPolicy::CallerHandles);
            if policy == RebootPolicy::AgentHandles {
                self.rebooter
                    .reboot(&format!("inplaced operation {}", op.id))
                    .map_err(|e| (Phase::Failed, format!("reboot: {e}")))?;
                op.actions.push("requested reboot".into());
                self.publish(
                    op,
                    Phase::Rebooting,
                    "rebooting to boot with the new kernel arguments",
                );
            } else {
                self.publish(
                    op,
                    Phase::RebootRequired,
                    "changes staged; they take effect after a reboot: drain the node, then call Reboot",
                );
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

    fn snapshot(&self, path: &str) -> Result<Option<(Vec<u8>, Entry)>, String> {
        match plan::observe::observe_file(&self.root, path).map_err(|e| e.to_string())? {
            FileObs::File { content, entry } => Ok(Some((content, entry))),
            _ => Ok(None),
        }
    }

    fn undo(&self, undo: &[Undo]) -> String {
        let mut failed = Vec::new();
        for (path, before) in undo.iter().rev() {
            let r = match before {
                Some((content, e)) if e.kind == Kind::File => self
                    .root
                    .write_atomic(path, content, e.mode, e.uid, e.gid)
                    .map(|_| ()),
                _ => self.root.remove(path).map(|_| ()),
            };
            if let Err(e) = r {
                failed.push(format!("{path}: {e}"));
            }
        }
        if failed.is_empty() {
            format!("{} file(s) restored to their previous state", undo.len())
        } else {
            format!("restoring failed for {}", failed.join("; "))
        }
    }

    fn get_operation_locked(
        &self,
        inner: &Inner,
        id: &str,
    ) -> Result<Option<pb::Operation>, AgentError> {
        if let Some(tx) = inner.watchers.get(id) {
            return Ok(Some(tx.borrow().clone()));
        }
        Ok(self.state.get_operation(id)?)
    }

    /// One operation.
    pub fn get_operation(&self, id: &str) -> Result<pb::Operation, AgentError> {
        let inner = self.lock();
        self.get_operation_locked(&inner, id)?
            .ok_or_else(|| AgentError::NotFound(id.to_string()))
    }

    /// A receiver of the operation's state; `None` for a finished operation of an earlier run.
    pub fn watch(
        &self,
        id: &str,
    ) -> Result<(pb::Operation, Option<watch::Receiver<pb::Operation>>), AgentError> {
        let inner = self.lock();
        if let Some(tx) = inner.watchers.get(id) {
            let rx = tx.subscribe();
            let cur = rx.borrow().clone();
            return Ok((cur, Some(rx)));
        }
        let op = self
            .state
            .get_operation(id)?
            .ok_or_else(|| AgentError::NotFound(id.to_string()))?;
        Ok((op, None))
    }

    /// History, newest first.
    pub fn list_operations(&self) -> Result<Vec<pb::Operation>, AgentError> {
        Ok(self.state.list_operations()?)
    }

    /// Reboots for an operation waiting in `RebootRequired`.
    pub fn reboot(&self, id: &str) -> Result<pb::Operation, AgentError> {
        let mut op = self.get_operation(id)?;
        if op.phase != Phase::RebootRequired as i32 {
            return Err(AgentError::Precondition(format!(
                "operation {id:?} is {}, not PHASE_REBOOT_REQUIRED; nothing to reboot for",
                Phase::try_from(op.phase)
                    .unwrap_or(Phase::Unspecified)
                    .as_str_name()
            )));
        }
        self.rebooter
            .reboot(&format!("inplaced operation {id}"))
            .map_err(|e| AgentError::Internal(e.to_string()))?;
        op.actions.push("requested reboot".into());
        op.boot_id = self.boot_id();
        self.publish(&mut op, Phase::Rebooting, "rebooting; verified after boot");
        Ok(op)
    }

    /// Agent and node status.
    pub fn status(&self) -> Result<pb::NodeStatus, AgentError> {
        let record = self.state.load_record()?;
        let (current, _) = {
            let inner = self.lock();
            let cur = inner
                .running
                .as_ref()
                .and_then(|id| inner.watchers.get(id).map(|tx| tx.borrow().clone()));
            (cur, ())
        };
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
            drift: self.drift(&record),
            managed_items: record.len() as u32,
            preservation: Some(self.preservation.clone()),
            root: self.root.path().display().to_string(),
        })
    }

    /// Managed items whose observed state differs from the applied record.
    pub fn drift(&self, record: &AppliedRecord) -> Vec<pb::Drift> {
        let mut out = Vec::new();
        for (path, m) in &record.files {
            let want = format!(
                "sha256:{} mode={:04o} uid={} gid={}",
                &m.sha256[7..],
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
                    id: format!("files[{path}]"),
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

/// Checks an operation after a boot: every managed argument (`owned`) must be in
/// `running` (`/proc/cmdline`), and every argument the operation removed must be gone,
/// unless the next boot's configuration still holds it from another owner. Returns
/// (missing, lingering).
pub fn verify_after_boot(
    op: &pb::Operation,
    owned: &[String],
    running: &str,
    next_boot: &str,
) -> (Vec<String>, Vec<String>) {
    let missing = missing_args(owned, running);
    let mut lingering = Vec::new();
    let run = Cmdline::parse(running);
    let config = Cmdline::parse(next_boot);
    for c in op
        .changes
        .iter()
        .filter(|c| c.id.starts_with("kernelArgs["))
    {
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
    (missing, lingering)
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
