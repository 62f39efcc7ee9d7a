//! `inplace-extension`: the CAPI Runtime Extension that answers the in-place update hooks
//! from node coverage (HTTPS with rustls; agents over mutual-TLS gRPC).
//!
//! Routes (Runtime SDK, `POST`, JSON): `/hooks.runtime.cluster.x-k8s.io/v1alpha1/discovery`,
//! `.../canupdatemachine/can-update-machine`, `.../canupdatemachineset/can-update-machineset`,
//! `.../updatemachine/update-machine`; `GET /healthz`.
//!
//! Secrets: every bootstrap config is redacted ([`crate::capi::translate::redact`]) right
//! after parsing, before anything is logged or sent; request bodies are never logged; file
//! contents go to the agent only, never into messages.

mod agent;
pub mod budget;
pub mod capi;
pub mod cli;
pub mod config;
mod http;
pub mod metrics;
pub mod pool;
pub mod resolve;

pub use http::{
    BODY_READ_TIMEOUT, Endpoint, HEADER_READ_TIMEOUT, MAX_CONNECTION_LIFE, allowlist, serve,
    serve_metrics, tls_config,
};

use std::time::Duration;

use hyper::StatusCode;
use prost::Message;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tonic::transport::Channel;

use crate::capi::types::{
    API_VERSION, CanUpdateMachineRequest, CanUpdateMachineSetRequest, MachineObjects, Status,
    UpdateMachineRequest, UpdateMachineResponse, discovery, failure,
};
use crate::capi::{NodeCoverage, PreserveMode};
use agent::{HOOK, call, inspect};
use config::{Config, Effective};
use inplace_edge::client::TlsIdentity;
use inplace_edge::logging::escape_controls as esc;
use inplace_wire::pb;
use inplace_wire::pb::Phase;
use inplace_wire::pb::node_agent_client::NodeAgentClient;
use resolve::{AgentResolver, Chain, MachineRef, StaticResolver, TemplateResolver};

/// The extension: configuration and agent resolver.
#[derive(Debug)]
pub struct Extension {
    config: Config,
    resolver: Box<dyn AgentResolver>,
    /// One mutual-TLS channel per agent, reused across hooks.
    pool: std::sync::Arc<pool::Pool>,
}

/// Why an agent could not be asked.
#[derive(Debug)]
struct AgentError(String);

/// Which attempt of update `id` to start, if any, from the node's `history` (newest
/// first) and `status`: `(start, newest)`, where `newest` is the latest attempt (`id` or
/// `id-rN`) and answers when nothing is started.
fn choose_attempt(
    id: &str,
    history: &[pb::Operation],
    status: &pb::NodeStatus,
) -> (Option<String>, Option<pb::Operation>) {
    let attempt = |o: &pb::Operation| -> Option<u32> {
        if o.id == id {
            return Some(0);
        }
        o.id.strip_prefix(id)?.strip_prefix("-r")?.parse().ok()
    };
    let next = format!(
        "{id}-r{}",
        history.iter().filter_map(attempt).max().unwrap_or(0) + 1
    );
    let newest = history.iter().find(|o| attempt(o).is_some()).cloned();
    // Which attempt to start, if any; otherwise `newest` answers.
    let start = match &newest {
        None => Some(id.to_string()),
        // Stopped mid-way by a crash or stop of the agent (and rolled back from its
        // journal): the agent runs it again when applied with the same id.
        Some(op) if inplace_wire::phase::is_interrupted(op) => Some(op.id.clone()),
        // Done once, but the node has applied something else since (the update was
        // reverted to an earlier spec, or its node.d changed): apply it again.
        Some(op) if op.phase == Phase::Succeeded as i32 => {
            (status.applied_spec_hash != op.spec_hash).then_some(next)
        }
        // Failed, but another operation succeeded on the node after it (the update
        // was fixed forward and is now reverted to this spec): the failure is stale.
        Some(op)
            if inplace_wire::phase::is_terminal(op.phase)
                && history
                    .first()
                    .is_some_and(|h| h.id != op.id && h.phase == Phase::Succeeded as i32) =>
        {
            Some(next)
        }
        Some(_) => None,
    };
    (start, newest)
}

/// Whether the agent refused the spec itself (invalid, or over one of its limits:
/// `INVALID_ARGUMENT`, or `RESOURCE_EXHAUSTED` for the message size): a property of the
/// desired KubeadmConfig, so "not covered" with the node's reason, never a retry.
fn refuses_spec(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted
    )
}

/// An `Inspect` that asks the node's status alone (no spec is sent).
fn status_only() -> pb::InspectRequest {
    pb::InspectRequest {
        status: true,
        ..Default::default()
    }
}

fn hook_prefix() -> String {
    format!("/{API_VERSION}/")
}

impl Extension {
    /// An extension with the resolvers the config names (`resolver.static` first, then
    /// `resolver.template`).
    pub fn new(config: Config) -> Extension {
        let mut chain: Vec<Box<dyn AgentResolver>> = Vec::new();
        if !config.resolver.fixed.is_empty() {
            chain.push(Box::new(StaticResolver(config.resolver.fixed.clone())));
        }
        if let Some(t) = &config.resolver.template {
            chain.push(Box::new(TemplateResolver(t.clone())));
        }
        Extension {
            config,
            resolver: Box::new(Chain(chain)),
            pool: std::sync::Arc::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The effective settings of a request; unknown setting names are logged (a typo in
    /// the ExtensionConfig would otherwise silently change nothing).
    fn settings(
        &self,
        settings: &std::collections::BTreeMap<String, String>,
    ) -> Result<Effective, String> {
        let eff = self.config.effective(settings)?;
        for k in &eff.unknown {
            tracing::warn!(setting = %k, known = ?config::SETTINGS, "unknown ExtensionConfig setting ignored");
        }
        Ok(eff)
    }

    /// Closes the pool's idle channels every [`pool::PRUNE_EVERY`] until the extension
    /// is dropped; [`serve`] runs it.
    pub fn prune_pool(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        pool::Pool::prune_forever(std::sync::Arc::downgrade(&self.pool))
    }

    /// A client for the Machine's agent: its pooled channel when there is one for the
    /// address and the identity files as they read now, else a new mutual-TLS
    /// connection, pooled ([`pool`]). Returns the address, the client and the pool key
    /// (for [`pool::Pool::evict`] after a failed call).
    async fn agent(
        &self,
        m: &MachineRef,
        eff: &Effective,
    ) -> Result<(String, NodeAgentClient<Channel>, pool::Key), AgentError> {
        let addr = self.resolver.resolve(m).map_err(AgentError)?;
        let a = &self.config.agent;
        let read = |p: &std::path::Path, key: &str| {
            std::fs::read(p).map_err(|e| AgentError(format!("agent.{key} {}: {e}", p.display())))
        };
        let server_name = resolve::expand(&a.server_name, m, &[("host", resolve::host_of(&addr))])
            .map_err(|e| AgentError(format!("agent.server_name: {e}")))?;
        let id = TlsIdentity {
            ca: read(&a.ca, "ca")?,
            cert: read(&a.cert, "cert")?,
            key: read(&a.key, "key")?,
            server_name,
        };
        let key = pool::Key::new(&addr, &id);
        if let Some(channel) = self.pool.get(&key) {
            return Ok((addr, NodeAgentClient::new(channel), key));
        }
        let channel = tokio::time::timeout(
            eff.agent_timeout,
            inplace_edge::client::connect_tls_channel(&addr, &id),
        )
        .await
        .map_err(|_| {
            AgentError(format!(
                "agent at {addr} did not answer within {:?}",
                eff.agent_timeout
            ))
        })?
        .map_err(|e| AgentError(format!("agent at {addr}: {e:#}")))?;
        self.pool.put(key.clone(), channel.clone());
        Ok((addr, NodeAgentClient::new(channel), key))
    }

    /// CanUpdateMachine: translate, ask the node about the desired NodeSpec, answer patches.
    /// An unreachable agent is a `Failure` (CAPI retries), never an empty success.
    pub async fn can_update_machine(&self, mut req: CanUpdateMachineRequest) -> Value {
        const KIND: &str = "CanUpdateMachineResponse";
        req.redact();
        let eff = match self.settings(&req.settings) {
            Ok(e) => e,
            Err(e) => return failure(KIND, &e),
        };
        let m = MachineRef::of(&req.desired.machine);
        if let Some(e) = self.unserved(&m) {
            return failure(KIND, &e);
        }
        let diff = capi::machine_diff(&req.current, &req.desired);
        // The node is asked even when no node item changes: UpdateMachine applies the
        // whole desired NodeSpec, so drift of an unchanged item must make this answer "not
        // covered" too (both hooks decide from the same facts), and the node decides
        // preservation.
        let has_node_spec = req
            .desired
            .bootstrap_config
            .as_ref()
            .is_some_and(|b| b.get("spec").is_some_and(Value::is_object));
        let any_blocked = diff.units.iter().any(|u| u.blocked.is_some());
        let ask = has_node_spec
            || diff.delta != pb::NodeSpec::default()
            || (eff.preserve == PreserveMode::Auto && any_blocked);
        let cov = if ask {
            match self.ask_coverage(&m, &eff, &req.desired, &diff).await {
                Ok(c) => Some(c),
                Err(AgentError(e)) => {
                    tracing::warn!(machine = %m.key(), error = %e, "CanUpdateMachine: agent unreachable");
                    return failure(
                        KIND,
                        &format!(
                            "{}: can not ask the node agent ({e}); CAPI will retry",
                            m.name
                        ),
                    );
                }
            }
        } else {
            None
        };
        let mut resp =
            capi::can_update_machine(&req.current, &req.desired, diff, cov.as_ref(), eff.preserve);
        if resp.affects_availability.is_some() && eff.affects_availability.is_some() {
            resp.affects_availability = eff.affects_availability;
        }
        tracing::info!(
            machine = %m.key(),
            covered = resp.bootstrap_config_patch.is_some(),
            preserve = resp.preserve_on_insufficient_coverage.unwrap_or(false),
            "CanUpdateMachine: {}",
            resp.message
        );
        serde_json::to_value(resp).unwrap_or_else(|e| failure(KIND, &e.to_string()))
    }

    /// Asks the node about the whole desired NodeSpec, exactly what UpdateMachine will
    /// apply (one `Inspect`): an earlier apply makes the agent revert items a partial spec
    /// would leave out, and drift on an unchanged item must block too. A spec the agent
    /// refuses as invalid (or too large) makes every node change of `diff` not covered (a
    /// property of the desired KubeadmConfig, not a reason for CAPI to retry), with the
    /// node's preservation recommendation.
    async fn ask_coverage(
        &self,
        m: &MachineRef,
        eff: &Effective,
        desired: &MachineObjects,
        diff: &capi::translate::Analysis,
    ) -> Result<NodeCoverage, AgentError> {
        let (addr, mut c, key) = self.agent(m, eff).await?;
        let unreachable = |s: tonic::Status| {
            self.pool.evict(&key);
            AgentError(format!("agent at {addr}: coverage: {}", s.message()))
        };
        if self.check_node_first() {
            let v = inspect(&mut c, eff.agent_timeout, status_only())
                .await
                .map_err(unreachable)?;
            self.check_node(m, &addr, &v.status).map_err(AgentError)?;
        }
        let t = eff.agent_timeout;
        // over the extension's decoded budget: refused here, as the node would refuse a
        // spec over its limits; the node is asked only for its recommendation
        let mut spec = match capi::desired_node_spec_checked(desired) {
            Ok(s) => s,
            Err(e) => {
                let v = inspect(&mut c, t, pb::InspectRequest::default())
                    .await
                    .map_err(unreachable)?;
                return Ok(refused_coverage(diff, &e, v.preservation));
            }
        };
        // a version change is asked about too (UpdateMachine applies it)
        spec.kubernetes = diff.delta.kubernetes.clone();
        let req = pb::InspectRequest {
            desired: Some(spec),
            reboot_policy: eff.reboot_policy as i32,
            ..Default::default()
        };
        let (refused, preservation) = match inspect(&mut c, t, req).await {
            Ok(v) => match v.coverage {
                Some(Ok(r)) => return Ok(NodeCoverage::from_report(&r)),
                Some(Err(s)) if refuses_spec(&s) => (s, v.preservation),
                Some(Err(s)) => return Err(unreachable(s)),
                None => {
                    return Err(unreachable(tonic::Status::internal(
                        "no coverage in the answer",
                    )));
                }
            },
            // The message itself over the agent's limit: ask again without the spec for
            // the recommendation.
            Err(s) if refuses_spec(&s) => {
                let v = inspect(&mut c, t, pb::InspectRequest::default())
                    .await
                    .map_err(unreachable)?;
                (s, v.preservation)
            }
            Err(s) => return Err(unreachable(s)),
        };
        Ok(refused_coverage(
            diff,
            &format!("the node refuses the spec: {}", refused.message()),
            preservation,
        ))
    }

    /// CanUpdateMachineSet: deterministic, from the translation and the declared
    /// capabilities (no node is asked; CAPI caches the answer for 24 h).
    pub fn can_update_machine_set(&self, req: CanUpdateMachineSetRequest) -> Value {
        const KIND: &str = "CanUpdateMachineSetResponse";
        // Diffed as CAPI diffs it: the MachineDeployment path compares the raw template
        // specs (only KCP's PrepareKubeadmConfigsForDiff blanks joinConfiguration.discovery),
        // so a change there is a unit of its own, not covered (a joined node never reads it,
        // and a patch would carry the bootstrap secret). The objects are neither logged nor
        // forwarded, and the message names paths, never values.
        let eff = match self.settings(&req.settings) {
            Ok(e) => e,
            Err(e) => return failure(KIND, &e),
        };
        let mut resp = capi::can_update_machine_set(
            &req.current,
            &req.desired,
            &self.config.machine_set.capabilities,
            eff.preserve,
            &self.config.preservation.hardware_bound_kinds,
        );
        if resp.affects_availability.is_some() && eff.affects_availability.is_some() {
            resp.affects_availability = eff.affects_availability;
        }
        tracing::info!(
            preserve = resp.preserve_on_insufficient_coverage.unwrap_or(false),
            "CanUpdateMachineSet: {}",
            resp.message
        );
        serde_json::to_value(resp).unwrap_or_else(|e| failure(KIND, &e.to_string()))
    }

    /// UpdateMachine: idempotent. The operation id is derived from the Machine and the
    /// desired NodeSpec, so every call of one update maps to the same agent operation.
    pub async fn update_machine(&self, mut req: UpdateMachineRequest) -> UpdateMachineResponse {
        req.redact();
        let eff = match self.settings(&req.settings) {
            Ok(e) => e,
            Err(e) => return UpdateMachineResponse::new(Status::Failure, e, 0),
        };
        let m = MachineRef::of(&req.desired.machine);
        if let Some(e) = self.unserved(&m) {
            return UpdateMachineResponse::new(Status::Failure, e, 0);
        }
        if !req
            .desired
            .bootstrap_config
            .as_ref()
            .is_some_and(|b| b.get("spec").is_some_and(Value::is_object))
        {
            // Nothing of the node is described; applying an empty NodeSpec would revert
            // everything the agent manages.
            return UpdateMachineResponse::new(
                Status::Success,
                "no bootstrap config spec: nothing to apply on the node",
                0,
            );
        }
        if let Some(e) = req
            .desired
            .bootstrap_config
            .as_ref()
            .and_then(capi::translate::kubeadm_api_version_problem)
        {
            return UpdateMachineResponse::new(
                Status::Failure,
                format!("{}: nothing was applied: {e}", m.name),
                0,
            );
        }
        // the files are decoded once for the whole hook, within the config's budget
        let base = match capi::desired_node_spec_checked(&req.desired) {
            Ok(s) => s,
            Err(e) => {
                return UpdateMachineResponse::new(
                    Status::Failure,
                    format!("{}: nothing was applied: {e}", m.name),
                    0,
                );
            }
        };
        let (resp, id) = self.drive(&m, &eff, &req.desired, base).await;
        tracing::info!(machine = %m.key(), operation = %id, status = ?resp.status, retry = resp.retry_after_seconds, "UpdateMachine: {}", resp.message);
        resp
    }

    /// Drives the update of `desired` (whose bootstrap config's NodeSpec is `base`,
    /// [`capi::desired_node_spec`]) on the node: (the answer, the operation id).
    async fn drive(
        &self,
        m: &MachineRef,
        eff: &Effective,
        desired: &MachineObjects,
        base: pb::NodeSpec,
    ) -> (UpdateMachineResponse, String) {
        let mut id = operation_id(m, &base);
        let resp = self.drive_spec(m, eff, desired, base, &mut id).await;
        (resp, id)
    }

    async fn drive_spec(
        &self,
        m: &MachineRef,
        eff: &Effective,
        desired: &MachineObjects,
        base: pb::NodeSpec,
        id: &mut String,
    ) -> UpdateMachineResponse {
        let wait =
            |msg: String| UpdateMachineResponse::new(Status::Success, msg, eff.retry_after_seconds);
        let (addr, mut c, key) = match self.agent(m, eff).await {
            Ok(x) => x,
            // During a reboot the agent is down: keep CAPI polling.
            Err(AgentError(e)) => return wait(format!("waiting for the node agent: {e}")),
        };
        let t = eff.agent_timeout;
        let trouble = |s: tonic::Status| {
            self.pool.evict(&key);
            // a pooled channel finds a rebooting or hung agent at the call, not the connect
            let down = if matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
            ) {
                "waiting for the node agent: "
            } else {
                ""
            };
            wait(format!("{down}agent at {addr}: {}", s.message()))
        };
        // One round trip: the history of this update (`id` or `id-rN`), the status read
        // after it (so an operation seen settled is in the applied hash), and the coverage
        // of the spec as it is applied when the node reports its Kubernetes version
        // (nearly always; otherwise it is asked about again below). The coverage is left
        // out while an operation runs: nothing could be started then.
        if self.check_node_first() {
            let v = match inspect(&mut c, t, status_only()).await {
                Ok(v) => v,
                Err(s) => return trouble(s),
            };
            if let Err(e) = self.check_node(m, &addr, &v.status) {
                tracing::warn!(machine = %m.key(), agent = %addr, error = %e, "UpdateMachine refused: wrong node");
                return UpdateMachineResponse::new(Status::Failure, e, 0);
            }
        }
        let guess = capi::with_version(base, desired, true);
        let req = pb::InspectRequest {
            desired: Some(guess.clone()),
            reboot_policy: eff.reboot_policy as i32,
            status: true,
            operations: true,
            skip_coverage_when_busy: true,
        };
        let view = match inspect(&mut c, t, req).await {
            Ok(v) => v,
            Err(s) if refuses_spec(&s) => {
                return UpdateMachineResponse::new(
                    Status::Failure,
                    format!("the node refuses the spec: {}", s.message()),
                    0,
                );
            }
            Err(s) => return trouble(s),
        };
        let (history, status) = (&view.operations, &view.status);
        // Before anything changes the node: is this agent the Machine's node? A resolver
        // that uses mutable metadata (annotations, labels) could point elsewhere.
        if let Err(e) = self.check_node(m, &addr, status) {
            tracing::warn!(machine = %m.key(), agent = %addr, error = %e, "UpdateMachine refused: wrong node");
            return UpdateMachineResponse::new(Status::Failure, e, 0);
        }
        // the Machine's version joins the spec when the node reports its own
        // (the guess is moved, not copied: its files may be megabytes)
        let reports_version = !status.kubernetes_version.is_empty();
        let as_guessed = reports_version || guess.kubernetes.is_none();
        let mut spec = guess;
        if !reports_version {
            spec.kubernetes = None;
        }
        *id = operation_id(m, &spec);
        let id = id.as_str();
        let target = spec.kubernetes.as_ref().map(|k| k.version.clone());
        let (start, newest) = choose_attempt(id, history, status);
        let op = match (start, newest) {
            (None, Some(op)) => op,
            (start, _) => {
                let sid = start.unwrap_or_else(|| id.to_string());
                let coverage = view.coverage.clone().filter(|_| as_guessed);
                match self.start(&mut c, eff, spec, coverage, &sid).await {
                    Ok(op) => op,
                    Err(r) => return r,
                }
            }
        };
        self.answer(&mut c, eff, &op, target, status).await
    }

    /// The UpdateMachine answer for the operation `op` of this update: done (only once the
    /// node reports the `target` Kubernetes version, if any), failed, waiting, or a reboot
    /// asked for when the operation waits for one.
    async fn answer(
        &self,
        c: &mut NodeAgentClient<Channel>,
        eff: &Effective,
        op: &pb::Operation,
        target: Option<String>,
        status: &pb::NodeStatus,
    ) -> UpdateMachineResponse {
        let wait =
            |msg: String| UpdateMachineResponse::new(Status::Success, msg, eff.retry_after_seconds);
        let t = eff.agent_timeout;
        let phase = Phase::try_from(op.phase).unwrap_or(Phase::Unspecified);
        match phase {
            // done only when the node runs the target version
            // (the status was read after the history that holds the operation)
            Phase::Succeeded
                if target
                    .as_ref()
                    .is_some_and(|v| !capi::same_version(v, &status.kubernetes_version)) =>
            {
                wait(format!(
                    "waiting for the node to report Kubernetes {} (it reports {:?})",
                    target.unwrap_or_default(),
                    status.kubernetes_version
                ))
            }
            Phase::Succeeded => {
                // What changed on the node, without the bookkeeping (saved originals).
                let acts: Vec<&str> = op
                    .actions
                    .iter()
                    .map(String::as_str)
                    .filter(|a| !a.starts_with("saved original"))
                    .collect();
                let done = if acts.is_empty() {
                    "nothing to change".to_string()
                } else {
                    acts.join(", ")
                };
                UpdateMachineResponse::new(
                    Status::Success,
                    format!("in-place update done: {done}"),
                    0,
                )
            }
            Phase::Failed | Phase::RolledBack => UpdateMachineResponse::new(
                Status::Failure,
                format!(
                    "in-place update {}: {} (operation {}; fix the node, then set a new value of the Machine annotation {RETRY_ANNOTATION} to try again)",
                    inplace_wire::phase::name(phase),
                    op.message,
                    op.id
                ),
                0,
            ),
            Phase::RebootRequired => {
                // Caller-handled reboot (an operation started by someone else's policy):
                // ask the agent to reboot now, as the update can not finish otherwise.
                let req = pb::RebootRequest {
                    operation_id: op.id.clone(),
                };
                match call(t, "reboot", c.reboot(req)).await {
                    Ok(_) => wait("rebooting the node to finish the update".into()),
                    // The agent may go down with the reboot before it answers.
                    Err(s) if s.code() == tonic::Code::DeadlineExceeded => {
                        wait("rebooting the node to finish the update".into())
                    }
                    Err(s) => wait(format!(
                        "reboot required; the agent refused the reboot: {}",
                        s.message()
                    )),
                }
            }
            _ => {
                let detail = if op.message.is_empty() {
                    String::new()
                } else {
                    format!(": {}", op.message)
                };
                wait(format!("{}{detail}", inplace_wire::phase::name(phase)))
            }
        }
    }

    /// Whether the node check must pass before any spec is sent: the address may come
    /// from Machine annotations or labels (`resolver.template`), which a Machine editor
    /// can point at any agent, and a desired spec carries file contents. Otherwise the
    /// address is the operator's (static map, or a template over name and namespace) and
    /// UpdateMachine checks the node in its first round trip.
    fn check_node_first(&self) -> bool {
        self.config
            .resolver
            .template
            .as_deref()
            .is_some_and(resolve::uses_metadata)
    }

    /// `Failure` text for a Machine whose namespace `resolver.namespaces` does not list.
    fn unserved(&self, m: &MachineRef) -> Option<String> {
        let ns = &self.config.resolver.namespaces;
        (!ns.is_empty() && !ns.contains(&m.namespace)).then(|| {
            format!(
                "Machine {} is in a namespace this extension does not serve (resolver.namespaces: {ns:?}): no node was asked",
                esc(&m.key())
            )
        })
    }

    /// Checks that the agent at `addr` reports the node Machine `m` runs on
    /// ([`resolve::expected_node_name`]); the error names both names and the fix.
    fn check_node(
        &self,
        m: &MachineRef,
        addr: &str,
        status: &pb::NodeStatus,
    ) -> Result<(), String> {
        let r = &self.config.resolver;
        let want = resolve::expected_node_name(m, r.node_name.as_deref(), r.trust_node_ref)?;
        let have = status
            .facts
            .as_ref()
            .map(|f| f.node_name.as_str())
            .unwrap_or("");
        if have.is_empty() {
            return Err(format!(
                "the agent at {addr} reports no node name, so it can not be checked to be Machine {}'s node {want:?}; give the node a hostname or the kubelet --hostname-override",
                m.key()
            ));
        }
        if have != want {
            return Err(format!(
                "the agent at {addr} is node {have:?}, not Machine {}'s node {want:?}: nothing was changed; fix the resolver (resolver.static, resolver.template) or resolver.node_name",
                m.key()
            ));
        }
        Ok(())
    }

    /// Starts the operation: items the node does not cover but already has as desired are
    /// left out (unchanged since provisioning); any other uncovered item is a Failure.
    /// `coverage` is the node's answer for `spec` when it came with the inspection (else
    /// it is asked for here).
    async fn start(
        &self,
        c: &mut NodeAgentClient<Channel>,
        eff: &Effective,
        mut spec: pb::NodeSpec,
        coverage: Option<Result<pb::CoverageReport, tonic::Status>>,
        id: &str,
    ) -> Result<pb::Operation, UpdateMachineResponse> {
        let wait =
            |msg: String| UpdateMachineResponse::new(Status::Success, msg, eff.retry_after_seconds);
        let fail = |msg: String| UpdateMachineResponse::new(Status::Failure, msg, 0);
        let coverage = match coverage {
            Some(c) => c,
            None => {
                let req = pb::GetCoverageRequest {
                    diff: None,
                    desired: Some(spec.clone()),
                    reboot_policy: eff.reboot_policy as i32,
                };
                call(eff.agent_timeout, "get_coverage", c.get_coverage(req)).await
            }
        };
        let report = match coverage {
            Ok(r) => r,
            Err(s) if s.code() == tonic::Code::Aborted => {
                return Err(wait(format!("waiting: {}", s.message())));
            }
            Err(s) if refuses_spec(&s) => {
                return Err(fail(format!("the node refuses the spec: {}", s.message())));
            }
            Err(s) => return Err(wait(format!("coverage: {}", s.message()))),
        };
        let mut refused = Vec::new();
        for ch in report.changes.iter().filter(|c| !c.covered) {
            if capi::already_in_place(ch) && drop_item(&mut spec, &ch.id) {
                continue;
            }
            refused.push(format!("{}: {}", ch.id, ch.reason));
        }
        if !refused.is_empty() {
            return Err(fail(format!(
                "not applicable in place on this node: {}",
                refused.join("; ")
            )));
        }
        let req = pb::ApplyRequest {
            desired: Some(spec),
            operation_id: id.into(),
            reboot_policy: eff.reboot_policy as i32,
            dry_run: false,
            diff: None,
        };
        match call(eff.agent_timeout, "apply", c.apply(req)).await {
            Ok(op) => Ok(op),
            Err(s) if s.code() == tonic::Code::Aborted => {
                Err(wait(format!("waiting: {}", s.message())))
            }
            Err(s) if refuses_spec(&s) || s.code() == tonic::Code::FailedPrecondition => Err(fail(
                format!("the node refuses the update: {}", s.message()),
            )),
            // Including no answer in time: the next poll finds the operation if it started.
            Err(s) => Err(wait(format!("apply: {}", s.message()))),
        }
    }

    /// The deadline of one hook call: CAPI's `?timeout=` query parameter (a Go duration,
    /// which upstream's runtime client adds from the handler's `timeoutSeconds`) when
    /// present, else `server.handler_timeout_seconds`, less [`DEADLINE_MARGIN`] for the
    /// answer to travel back.
    pub fn deadline(&self, query: Option<&str>) -> Duration {
        let advertised =
            Duration::from_secs(self.config.server.handler_timeout_seconds.max(1) as u64);
        let asked = query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .find_map(|kv| kv.strip_prefix("timeout="))
            .and_then(|v| config::parse_duration(v).ok())
            .filter(|d| !d.is_zero());
        let budget = asked.map_or(advertised, |a| a.min(advertised));
        budget.saturating_sub(DEADLINE_MARGIN.min(budget / 4))
    }

    /// Routes one request: (HTTP status, JSON body). A hook that has not answered by
    /// `deadline` gets the answer CAPI can act on: UpdateMachine `Success` with
    /// `retryAfterSeconds` (the operation, if it started, goes on on the node, and the next
    /// call finds it), a CanUpdate hook `Failure` with the reason (CAPI retries).
    /// `values` is [`budget::check`] of `body`, made once by the caller (which reserves
    /// memory by it) and not walked again here.
    pub async fn handle(
        &self,
        method: &str,
        path: &str,
        deadline: Duration,
        body: &[u8],
        values: &Result<usize, String>,
    ) -> (StatusCode, Value) {
        let hook = metrics::hook_of(path);
        let t = std::time::Instant::now();
        let r = HOOK
            .scope(
                hook,
                self.answer_in_time(method, path, deadline, body, values),
            )
            .await;
        if r.0 == StatusCode::OK {
            metrics::get().hook(
                hook,
                metrics::answer_of(hook, &r.1),
                t.elapsed().as_secs_f64(),
            );
        }
        r
    }

    async fn answer_in_time(
        &self,
        method: &str,
        path: &str,
        deadline: Duration,
        body: &[u8],
        values: &Result<usize, String>,
    ) -> (StatusCode, Value) {
        match tokio::time::timeout(deadline, self.route(method, path, body, values)).await {
            Ok(r) => r,
            Err(_) => {
                metrics::get().deadline_missed(metrics::hook_of(path));
                let why = format!(
                    "the node agent did not answer within the hook's deadline ({deadline:?})"
                );
                tracing::warn!(path, "{why}");
                let v = if path.ends_with("/update-machine") {
                    serde_json::to_value(UpdateMachineResponse::new(
                        Status::Success,
                        format!("waiting: {why}"),
                        self.config.update.retry_after_seconds,
                    ))
                    .unwrap_or_default()
                } else if path.ends_with("/can-update-machineset") {
                    failure(
                        "CanUpdateMachineSetResponse",
                        &format!("{why}; CAPI will retry"),
                    )
                } else {
                    failure(
                        "CanUpdateMachineResponse",
                        &format!("{why}; CAPI will retry"),
                    )
                };
                (StatusCode::OK, v)
            }
        }
    }

    async fn route(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
        values: &Result<usize, String>,
    ) -> (StatusCode, Value) {
        if method == "GET" && path == "/healthz" {
            return (StatusCode::OK, serde_json::json!({"status": "ok"}));
        }
        let Some(rest) = path.strip_prefix(&hook_prefix()) else {
            return (
                StatusCode::NOT_FOUND,
                serde_json::json!({"message": format!("no route {path}")}),
            );
        };
        if method != "POST" {
            return (
                StatusCode::METHOD_NOT_ALLOWED,
                serde_json::json!({"message": "use POST"}),
            );
        }
        macro_rules! parse {
            ($t:ty, $kind:expr) => {{
                if let Err(e) = values {
                    return (
                        StatusCode::PAYLOAD_TOO_LARGE,
                        failure($kind, &format!("request refused: {e}")),
                    );
                }
                match serde_path_to_error::deserialize::<_, $t>(
                    &mut serde_json::Deserializer::from_slice(body),
                ) {
                    Ok(r) => r,
                    Err(e) => {
                        return (
                            StatusCode::BAD_REQUEST,
                            failure(
                                $kind,
                                &format!(
                                    "malformed {} request: {}",
                                    $kind.trim_end_matches("Response"),
                                    json_error(&e)
                                ),
                            ),
                        );
                    }
                }
            }};
        }
        let v = match rest {
            "discovery" => {
                serde_json::to_value(discovery(self.config.server.handler_timeout_seconds))
                    .unwrap_or_default()
            }
            "canupdatemachine/can-update-machine" => {
                self.can_update_machine(parse!(CanUpdateMachineRequest, "CanUpdateMachineResponse"))
                    .await
            }
            "canupdatemachineset/can-update-machineset" => self.can_update_machine_set(parse!(
                CanUpdateMachineSetRequest,
                "CanUpdateMachineSetResponse"
            )),
            "updatemachine/update-machine" => {
                let r = self
                    .update_machine(parse!(UpdateMachineRequest, "UpdateMachineResponse"))
                    .await;
                serde_json::to_value(r).unwrap_or_default()
            }
            _ => {
                return (
                    StatusCode::NOT_FOUND,
                    serde_json::json!({"message": format!("no handler {path}")}),
                );
            }
        };
        (StatusCode::OK, v)
    }
}

/// The coverage of a spec refused as a whole (by the node for its limits, or by the
/// extension's decoded budget): every node change of `diff` not covered for `why`, with
/// the node's preservation recommendation.
fn refused_coverage(
    diff: &capi::translate::Analysis,
    why: &str,
    preservation: pb::Preservation,
) -> NodeCoverage {
    let mut cov = NodeCoverage {
        preserve: preservation.preserve,
        preserve_reasons: preservation.reasons,
        ..Default::default()
    };
    for id in diff.units.iter().flat_map(|u| &u.ids) {
        cov.changes.insert(id.clone(), Err(why.to_string()));
    }
    cov
}

/// A request parse error with its JSON path, without the offending value: serde quotes a
/// string it did not expect (`invalid type: string "…", expected …`), and a request may
/// carry a token or file content in any field.
fn json_error(e: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let inner = e.inner().to_string();
    let inner = match (inner.split_once(": "), inner.split_once(", expected ")) {
        (Some((kind @ ("invalid type" | "invalid value"), _)), Some((_, rest))) => {
            format!("{kind}, expected {rest}")
        }
        _ => inner,
    };
    format!("{}: {inner}", e.path())
}

/// Removes the item a change id names (`files[p]`, `kubelet.flags[n]`, `ntp`,
/// `dropins[n]`); false if the id names no single item of the spec.
fn drop_item(spec: &mut pb::NodeSpec, id: &str) -> bool {
    let inner = |p: &str| {
        id.strip_prefix(p)
            .and_then(|r| r.strip_suffix(']'))
            .map(String::from)
    };
    if let Some(p) = inner("files[") {
        let n = spec.files.len();
        spec.files.retain(|f| f.path != p);
        return spec.files.len() < n;
    }
    if let Some(n) = inner("kubelet.flags[") {
        return spec
            .kubelet
            .as_mut()
            .is_some_and(|k| k.flags.remove(&n).is_some());
    }
    if let Some(n) = inner("dropins[") {
        let before = spec.dropins.len();
        spec.dropins.retain(|d| d.name != n);
        return spec.dropins.len() < before;
    }
    if id == "ntp" {
        return spec.ntp.take().is_some();
    }
    false
}

/// Machine annotation whose value is mixed into the operation id: after a failed update
/// (which UpdateMachine keeps reporting for the same desired spec), an operator fixes the
/// node and sets a new value to make the next UpdateMachine call start a new attempt.
pub const RETRY_ANNOTATION: &str = "inplaced.io/retry";

/// The operation id of an update: `capi-<namespace>-<name>-<16 hex of SHA-256 of the
/// NodeSpec's protobuf encoding and the [`RETRY_ANNOTATION`] value>`, sanitised to
/// `[A-Za-z0-9._-]` and at most 128 bytes.
pub fn operation_id(m: &MachineRef, spec: &pb::NodeSpec) -> String {
    let mut h = Sha256::new();
    h.update(spec.encode_to_vec());
    if let Some(attempt) = m.annotations.get(RETRY_ANNOTATION) {
        h.update(b"\0retry\0");
        h.update(attempt.as_bytes());
    }
    let hash = hex::encode(h.finalize());
    let clean: String = format!("{}-{}", m.namespace, m.name)
        .chars()
        .map(|c| {
            if inplace_wire::names::is_name_char(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    // Room for "-r<attempt>" (see `drive`).
    let budget = 128 - "capi--".len() - 16 - 8;
    let clean = &clean[..clean.len().min(budget)];
    format!("capi-{clean}-{}", &hash[..16])
}

/// Time kept back from a hook's deadline for the answer to reach CAPI (at most a quarter
/// of the deadline).
pub const DEADLINE_MARGIN: Duration = Duration::from_millis(1500);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids_are_stable_and_valid() {
        let m = MachineRef {
            name: "edge-1-md-0-5f8c7d9b4x-k2v9w".into(),
            namespace: "site-a".into(),
            ..Default::default()
        };
        let spec = pb::NodeSpec {
            sysctls: [("vm.x".to_string(), "1".to_string())].into(),
            ..Default::default()
        };
        let a = operation_id(&m, &spec);
        assert_eq!(a, operation_id(&m, &spec));
        let prefix = "capi-site-a-edge-1-md-0-5f8c7d9b4x-k2v9w-";
        assert!(a.starts_with(prefix) && a.len() == prefix.len() + 16, "{a}");
        assert_ne!(a, operation_id(&m, &pb::NodeSpec::default()));
        let mut retried = m.clone();
        retried
            .annotations
            .insert(RETRY_ANNOTATION.into(), "1".into());
        assert_ne!(a, operation_id(&retried, &spec));
        let long = MachineRef {
            name: "x".repeat(300),
            ..m
        };
        let id = operation_id(&long, &spec);
        assert!(id.len() <= 128);
        inplace_wire::names::validate_operation_id(&id).unwrap();
    }

    #[test]
    fn parse_errors_name_the_path_not_the_value() {
        let body = br#"{"current": "2llldv.b7bn3izenrsfazb2", "desired": {}}"#;
        let e = serde_path_to_error::deserialize::<_, CanUpdateMachineRequest>(
            &mut serde_json::Deserializer::from_slice(body),
        )
        .unwrap_err();
        let m = json_error(&e);
        assert!(!m.contains("b7bn3izenrsfazb2"), "{m}");
        assert!(
            m.starts_with("current: invalid type, expected struct MachineObjects"),
            "{m}"
        );
    }

    #[test]
    fn attempts_restart_only_when_the_node_moved_on() {
        let op = |id: &str, phase: Phase, hash: &str| pb::Operation {
            id: id.into(),
            phase: phase as i32,
            spec_hash: hash.into(),
            ..Default::default()
        };
        let st = |hash: &str| pb::NodeStatus {
            applied_spec_hash: hash.into(),
            ..Default::default()
        };
        assert_eq!(choose_attempt("u", &[], &st("")).0.as_deref(), Some("u"));
        let done = [op("u", Phase::Succeeded, "h")];
        assert_eq!(choose_attempt("u", &done, &st("h")).0, None);
        assert_eq!(
            choose_attempt("u", &done, &st("other")).0.as_deref(),
            Some("u-r1")
        );
        // a stale failure, fixed forward by another operation since
        let stale = [
            op("x", Phase::Succeeded, "x"),
            op("u-r1", Phase::Failed, "h"),
        ];
        assert_eq!(
            choose_attempt("u", &stale, &st("x")).0.as_deref(),
            Some("u-r2")
        );
        let failed = [op("u", Phase::Failed, "h")];
        let (start, newest) = choose_attempt("u", &failed, &st("h"));
        assert_eq!((start, newest.map(|o| o.id)), (None, Some("u".to_string())));
    }

    #[test]
    fn drop_item_names_single_items() {
        let mut s = pb::NodeSpec {
            files: vec![pb::File {
                path: "/etc/a".into(),
                ..Default::default()
            }],
            ntp: Some(pb::Ntp {
                servers: vec!["n".into()],
            }),
            ..Default::default()
        };
        assert!(drop_item(&mut s, "files[/etc/a]"));
        assert!(s.files.is_empty());
        assert!(drop_item(&mut s, "ntp"));
        assert!(!drop_item(&mut s, "sysctls[vm.x]"));
    }
}
