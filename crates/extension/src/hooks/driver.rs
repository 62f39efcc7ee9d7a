//! The UpdateMachine driver: a second machine over the agent's operations. Each call
//! reads the history of the update's operation id and the node's status, decides which
//! attempt to start, if any ([`choose_attempt`]), starts it ([`Extension::start`]), and
//! answers from the operation's phase ([`Extension::answer`]): done, failed, waiting, or a
//! reboot asked for.

use tonic::transport::Channel;

use super::update_machine::{RETRY_ANNOTATION, operation_id};
use super::{refuses_spec, status_only};
use crate::agent::{View, call, inspect};
use crate::capi;
use crate::capi::types::{MachineObjects, Status, UpdateMachineResponse};
use crate::cluster::MachineInfo;
use crate::cluster::drain;
use crate::cluster::events::Phase as KPhase;
use crate::cluster::flow::{Step, Target};
use crate::config::Effective;
use crate::extension::{AgentError, Extension};
use crate::resolve::MachineRef;
use crate::waiting::{CLUSTERS, MANAGEMENT_CLUSTER, WORKLOAD_CLUSTER, waiting_on};
use inplace_wire::ids::ChangeId;
use inplace_wire::pb;
use inplace_wire::pb::Phase;
use inplace_wire::pb::node_agent_client::NodeAgentClient;

/// Which attempt of update `id` to start, if any, from the node's `history` (newest
/// first) and `status`: `(start, newest)`, where `newest` is the latest attempt (`id` or
/// `id-rN`) and answers when nothing is started.
pub(crate) fn choose_attempt(
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
        // was fixed forward and is now reverted to this spec): the failure is stale. The
        // agent's own revert of this attempt's timed try (`<id>.revert`) is not such an
        // operation: it is how the try failed.
        Some(op)
            if inplace_wire::phase::is_terminal(op.phase)
                && history.first().is_some_and(|h| {
                    h.id != op.id
                        && h.id.strip_suffix(".revert") != Some(op.id.as_str())
                        && h.phase == Phase::Succeeded as i32
                }) =>
        {
            Some(next)
        }
        Some(_) => None,
    };
    (start, newest)
}

/// Removes the item a change id names (`files[p]`, `kubelet.flags[n]`, `ntp`,
/// `dropins[n]`; [`ChangeId`]); false if the id names no single item of the spec.
pub(crate) fn drop_item(spec: &mut pb::NodeSpec, id: &str) -> bool {
    match ChangeId::parse(id) {
        Ok(ChangeId::File(p)) => {
            let n = spec.files.len();
            spec.files.retain(|f| f.path != p);
            spec.files.len() < n
        }
        Ok(ChangeId::KubeletFlag(n)) => spec
            .kubelet
            .as_mut()
            .is_some_and(|k| k.flags.remove(&n).is_some()),
        Ok(ChangeId::DropIn(n)) => {
            let before = spec.dropins.len();
            spec.dropins.retain(|d| d.name != n);
            spec.dropins.len() < before
        }
        Ok(ChangeId::Ntp) => spec.ntp.take().is_some(),
        _ => false,
    }
}

/// `Success` with `retryAfterSeconds`: CAPI calls again.
fn waiting(eff: &Effective, msg: String) -> UpdateMachineResponse {
    UpdateMachineResponse::new(Status::Success, msg, eff.retry_after_seconds)
}

/// When CAPI should call again while a timed try waits for its Node: half the seconds
/// left in the try (at least 1), and never later than `retry_after`: a call after the try's
/// deadline finds it reverted, so `retryAfterSeconds` (30) longer than the try would
/// revert every try (a fresh user's finding). No deadline known: `retry_after`.
pub(crate) fn retry_within_try(retry_after: i32, secs_left: Option<i64>) -> i32 {
    match secs_left {
        Some(left) => i32::try_from(left / 2)
            .unwrap_or(i32::MAX)
            .clamp(1, retry_after.max(1)),
        None => retry_after,
    }
}

impl Extension {
    /// Drives the update of `desired` (whose bootstrap config's NodeSpec is `base`,
    /// [`capi::desired_node_spec`]) on the node: (the answer, the operation id). With a
    /// `[cluster]` table the Machine is read from the management cluster first (its
    /// addresses, Node and drain timeout) and the cluster steps of [`crate::cluster::flow`]
    /// wrap the agent's operation.
    pub(crate) async fn drive(
        &self,
        m: &MachineRef,
        eff: &Effective,
        desired: &MachineObjects,
        base: pb::NodeSpec,
    ) -> (UpdateMachineResponse, String) {
        let mut id = operation_id(m, &base);
        let (m, info) = match self.machine_in_cluster(m).await {
            Ok(x) => x,
            Err(e) => return (waiting(eff, e), id),
        };
        let resp = self.drive_spec(&m, eff, desired, base, &mut id, info).await;
        (resp, id)
    }

    /// `m` with its `status.addresses` and what the management cluster has of it, when a
    /// `[cluster]` table is configured; `Err` is the message to wait with.
    pub(crate) async fn machine_in_cluster(
        &self,
        m: &MachineRef,
    ) -> Result<(MachineRef, Option<MachineInfo>), String> {
        let Some(k) = &self.kube else {
            return Ok((m.clone(), None));
        };
        let info = waiting_on(MANAGEMENT_CLUSTER, k.machine(&m.namespace, &m.name))
            .await
            .map_err(|e| format!("waiting for the management cluster: {e}"))?;
        let mut m = m.clone();
        m.addresses = info.addresses.clone();
        if m.node_ref.is_none() {
            m.node_ref = info.node.clone();
        }
        Ok((m, Some(info)))
    }

    /// [`Extension::drive`], setting `id` to the operation id of the spec applied.
    async fn drive_spec(
        &self,
        m: &MachineRef,
        eff: &Effective,
        desired: &MachineObjects,
        base: pb::NodeSpec,
        id: &mut String,
        info: Option<MachineInfo>,
    ) -> UpdateMachineResponse {
        let guess = capi::with_version(base, desired, true);
        let (mut c, view) = match self.inspect_update(m, eff, &guess).await {
            Ok(x) => x,
            Err(r) => return r,
        };
        let (history, status) = (&view.operations, &view.status);
        let machine_version = desired
            .machine
            .pointer("/spec/version")
            .and_then(|v| v.as_str());
        let node_kubelet = match (&self.kube, &info) {
            (Some(k), Some(i)) if super::verify::needs_node(machine_version, status) => {
                waiting_on(WORKLOAD_CLUSTER, k.node_kubelet_version(&m.namespace, i)).await
            }
            _ => None,
        };
        let check = match super::verify::before_start(
            machine_version,
            status,
            version_refusal(view.coverage.as_ref()),
            node_kubelet.as_deref(),
        ) {
            Ok(c) => c,
            Err(msg) => {
                return UpdateMachineResponse::new(
                    Status::Failure,
                    format!("{}: {msg}", m.name),
                    0,
                );
            }
        };
        // verified by the Node: the Node check after the operation compares it
        let node_version = machine_version.filter(|_| check == super::verify::VersionCheck::Node);
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
        let kt = self.kube.as_ref().zip(info.map(|info| Target {
            ns: m.namespace.clone(),
            name: m.name.clone(),
            info,
            op: id.to_string(),
        }));
        let target = spec.kubernetes.as_ref().map(|k| k.version.clone());
        let (start, newest) = choose_attempt(id, history, status);
        let op = match (start, newest) {
            (None, Some(op)) => op,
            (start, _) => {
                let sid = start.unwrap_or_else(|| id.to_string());
                let mut coverage = view.coverage.clone().filter(|_| as_guessed);
                if let Some((k, t)) = &kt {
                    // the change's disruption decides the drain
                    let cov = match coverage.take() {
                        Some(cov) => cov,
                        None => coverage_of(&mut c, eff, &spec).await,
                    };
                    if needs_drain(&cov) {
                        match waiting_on(CLUSTERS, k.drain(t)).await {
                            Step::Go => {}
                            Step::Wait(msg) => return waiting(eff, msg),
                            Step::Blocked(msg, elapsed) => {
                                let after = drain::backoff(eff.retry_after_seconds, elapsed);
                                return UpdateMachineResponse::new(Status::Success, msg, after);
                            }
                            Step::Fail(msg) => {
                                waiting_on(CLUSTERS, k.failed(t, &msg)).await;
                                return UpdateMachineResponse::new(Status::Failure, msg, 0);
                            }
                        }
                    }
                    coverage = Some(cov);
                    waiting_on(MANAGEMENT_CLUSTER, k.progress(t, KPhase::Applying)).await;
                }
                // a timed try only where the Node's readiness can confirm it, and never
                // for an upgrade (its revert would be a downgrade)
                let upgrade = target.as_deref().is_some_and(|v| {
                    v.trim_start_matches('v') != status.kubernetes_version.trim_start_matches('v')
                });
                let try_seconds = if kt.is_some() && !upgrade {
                    eff.try_seconds
                } else {
                    0
                };
                match self
                    .start(&mut c, eff, spec, coverage, &sid, try_seconds)
                    .await
                {
                    Ok(op) => op,
                    Err(r) => return r,
                }
            }
        };
        let op = match &kt {
            Some((k, t)) if op.phase == Phase::AwaitingConfirmation as i32 => {
                match self
                    .confirm_when_ready(&mut c, eff, (k, t), op, target.as_deref())
                    .await
                {
                    Ok(op) => op,
                    Err(r) => return r,
                }
            }
            _ => op,
        };
        let resp = self.answer(&mut c, eff, &op, target.clone(), status).await;
        match kt {
            Some((k, t)) => {
                let version = target.as_deref().or(node_version);
                after_answer(k, &t, eff, &op, version, resp).await
            }
            None => resp,
        }
    }

    /// One round trip to the Machine's agent: the history of this update (its id or
    /// `id-rN`), the status read after it (so an operation seen settled is in the applied
    /// hash), and the coverage of `guess` (the spec as it is applied when the node reports
    /// its Kubernetes version: nearly always; otherwise it is asked about again when the
    /// operation starts). The coverage is left out while an operation runs: nothing could
    /// be started then. Before anything changes the node, the agent must be the Machine's
    /// node ([`Extension::check_node`]). `Err` is the answer to CAPI.
    async fn inspect_update(
        &self,
        m: &MachineRef,
        eff: &Effective,
        guess: &pb::NodeSpec,
    ) -> Result<(NodeAgentClient<Channel>, View), UpdateMachineResponse> {
        let wait = |msg: String| waiting(eff, msg);
        let (addr, mut c, key) = match self.agent(m, eff).await {
            Ok(x) => x,
            // During a reboot the agent is down: keep CAPI polling.
            Err(AgentError(e)) => return Err(wait(format!("waiting for the node agent: {e}"))),
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
        let wrong_node = |e: String| {
            tracing::warn!(machine = %m.key(), agent = %addr, error = %e, "UpdateMachine refused: wrong node");
            UpdateMachineResponse::new(Status::Failure, e, 0)
        };
        if self.check_node_first() {
            let v = inspect(&mut c, t, status_only()).await.map_err(trouble)?;
            self.check_node(m, &addr, &v.status).map_err(wrong_node)?;
        }
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
                return Err(UpdateMachineResponse::new(
                    Status::Failure,
                    format!("the node refuses the spec: {}", s.message()),
                    0,
                ));
            }
            Err(s) => return Err(trouble(s)),
        };
        // A resolver that uses mutable metadata (annotations, labels) could point
        // elsewhere.
        self.check_node(m, &addr, &view.status)
            .map_err(wrong_node)?;
        Ok((c, view))
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
        let wait = |msg: String| waiting(eff, msg);
        let t = eff.agent_timeout;
        let phase = Phase::try_from(op.phase).unwrap_or(Phase::Unspecified);
        match phase {
            // done only when every translated field is verified on the node (the status
            // was read after the history that holds the operation)
            Phase::Succeeded => {
                let k = target.map(|version| pb::Kubernetes { version });
                match super::verify::after_success(k.as_ref(), status) {
                    super::verify::Verdict::Verified => UpdateMachineResponse::new(
                        Status::Success,
                        format!("in-place update done: {}", changed(op)),
                        0,
                    ),
                    super::verify::Verdict::Wait(msg) => wait(msg),
                    super::verify::Verdict::Unverifiable(msg) => UpdateMachineResponse::new(
                        Status::Failure,
                        format!(
                            "in-place update not verified: {msg} (operation {}; fix the node, then set a new value of the Machine annotation {RETRY_ANNOTATION} to try again)",
                            op.id
                        ),
                        0,
                    ),
                }
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

    /// A timed try of this update waits for its confirmation: confirmed (the agent's
    /// `Confirm`) once the Node is Ready and its kubelet reported after the change
    /// ([`crate::cluster::Kube::node_ready_since`]); until then the answer waits, and if
    /// the Node never is, the agent reverts the change at the try's deadline and the
    /// operation ends `RolledBack` (a `Failure` naming the try). Returns the confirmed
    /// operation.
    async fn confirm_when_ready(
        &self,
        c: &mut NodeAgentClient<Channel>,
        eff: &Effective,
        (k, t): (&crate::cluster::Kube, &Target),
        op: pb::Operation,
        version: Option<&str>,
    ) -> Result<pb::Operation, UpdateMachineResponse> {
        let since = op.updated.as_ref().map_or(i128::MAX, |u| {
            i128::from(u.seconds) * 1_000_000_000 + i128::from(u.nanos)
        });
        if let Err(why) = k.node_ready_since(t, version, since).await {
            let now = k8s_openapi::jiff::Timestamp::now().as_second();
            let secs_left = op.try_deadline.as_ref().map(|d| (d.seconds - now).max(0));
            let left = secs_left.map_or(String::new(), |s| format!(" in {s} s"));
            let mut w = waiting(
                eff,
                format!(
                    "timed try {}: {why}; not confirmed yet (the node reverts the change{left} unless it is confirmed)",
                    op.id
                ),
            );
            w.retry_after_seconds = retry_within_try(eff.retry_after_seconds, secs_left);
            return Err(w);
        }
        let req = pb::ConfirmRequest {
            operation_id: op.id.clone(),
        };
        match call(eff.agent_timeout, "confirm", c.confirm(req)).await {
            Ok(op) => {
                tracing::info!(
                    operation = %op.id,
                    "timed try confirmed: the Node is Ready and its kubelet renewed its Lease after the change"
                );
                Ok(op)
            }
            // too late: the agent reverted it; the next call answers from its phase
            Err(s) => Err(waiting(
                eff,
                format!("confirming timed try {}: {}", op.id, s.message()),
            )),
        }
    }

    /// Starts the operation: items the node does not cover but already has as desired are
    /// left out (unchanged since provisioning); any other uncovered item is a Failure.
    /// `coverage` is the node's answer for `spec` when it came with the inspection (else
    /// it is asked for here). `try_seconds` above 0 makes a change that needs no reboot a
    /// timed try of that window ([`Extension::confirm_when_ready`]).
    async fn start(
        &self,
        c: &mut NodeAgentClient<Channel>,
        eff: &Effective,
        mut spec: pb::NodeSpec,
        coverage: Option<Result<pb::CoverageReport, tonic::Status>>,
        id: &str,
        try_seconds: u32,
    ) -> Result<pb::Operation, UpdateMachineResponse> {
        let wait = |msg: String| waiting(eff, msg);
        let fail = |msg: String| UpdateMachineResponse::new(Status::Failure, msg, 0);
        let coverage = match coverage {
            Some(cov) => cov,
            None => coverage_of(c, eff, &spec).await,
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
            // a try is for live changes: the agent refuses one that needs a reboot
            try_seconds: if report.reboot_required {
                0
            } else {
                try_seconds
            },
            ..Default::default()
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
}

/// The node's coverage of `spec` under the effective reboot policy.
async fn coverage_of(
    c: &mut NodeAgentClient<Channel>,
    eff: &Effective,
    spec: &pb::NodeSpec,
) -> Result<pb::CoverageReport, tonic::Status> {
    let req = pb::GetCoverageRequest {
        diff: None,
        desired: Some(spec.clone()),
        reboot_policy: eff.reboot_policy as i32,
    };
    call(eff.agent_timeout, "get_coverage", c.get_coverage(req)).await
}

/// Why the node's agent does not cover `kubernetes.version` in `coverage` (the path it
/// found no kubelet at), for [`super::verify::before_start`].
fn version_refusal(coverage: Option<&Result<pb::CoverageReport, tonic::Status>>) -> Option<&str> {
    let report = coverage?.as_ref().ok()?;
    report
        .changes
        .iter()
        .find(|c| c.id == inplace_wire::ids::KUBERNETES_VERSION && !c.covered)
        .map(|c| c.reason.as_str())
}

/// Whether the change disrupts the node's workloads (its coverage's highest disruption
/// is `drain` or `reboot`, or it needs a reboot): the Node is drained before it starts.
/// A coverage error drains nothing (the start answers it).
pub(crate) fn needs_drain(cov: &Result<pb::CoverageReport, tonic::Status>) -> bool {
    cov.as_ref().is_ok_and(|r| {
        r.reboot_required
            || r.max_disruption
                .as_ref()
                .is_some_and(|d| d.level >= pb::DisruptionLevel::Drain as i32)
    })
}

/// Whether operation `op` reboots the node (a change of disruption `reboot`).
fn reboots(op: &pb::Operation) -> bool {
    op.changes.iter().any(|c| {
        c.disruption
            .as_ref()
            .is_some_and(|d| d.level == pb::DisruptionLevel::Reboot as i32)
    })
}

/// The cluster steps after the agent's answer `resp` about `op`: a failure is reported
/// (phase, Event); done waits for the Node to be back and releases it
/// ([`crate::cluster::Kube::finish`]); otherwise the phase follows the operation.
async fn after_answer(
    k: &crate::cluster::Kube,
    t: &Target,
    eff: &Effective,
    op: &pb::Operation,
    version: Option<&str>,
    resp: UpdateMachineResponse,
) -> UpdateMachineResponse {
    if resp.status == Status::Failure {
        waiting_on(CLUSTERS, k.failed(t, &resp.message)).await;
        return resp;
    }
    if resp.retry_after_seconds == 0 {
        if reboots(op) {
            waiting_on(MANAGEMENT_CLUSTER, k.rebooted_unseen(t)).await;
        }
        return match waiting_on(CLUSTERS, k.finish(t, reboots(op), version)).await {
            Step::Go => resp,
            Step::Wait(msg) | Step::Blocked(msg, _) => waiting(eff, msg),
            Step::Fail(msg) => {
                k.failed(t, &msg).await;
                UpdateMachineResponse::new(Status::Failure, msg, 0)
            }
        };
    }
    let rebooting = matches!(
        Phase::try_from(op.phase),
        Ok(Phase::RebootRequired | Phase::Rebooting | Phase::VerifyingAfterBoot)
    );
    let p = if rebooting {
        KPhase::Rebooting
    } else {
        KPhase::Applying
    };
    waiting_on(MANAGEMENT_CLUSTER, k.progress(t, p)).await;
    resp
}

/// What a succeeded operation changed on the node: its actions without the bookkeeping
/// (saved originals, [`inplace_wire::ids::is_saved_original`]), or "nothing to change".
fn changed(op: &pb::Operation) -> String {
    let acts: Vec<&str> = op
        .actions
        .iter()
        .map(String::as_str)
        .filter(|a| !inplace_wire::ids::is_saved_original(a))
        .collect();
    if acts.is_empty() {
        "nothing to change".to_string()
    } else {
        acts.join(", ")
    }
}

#[cfg(test)]
mod tests;
