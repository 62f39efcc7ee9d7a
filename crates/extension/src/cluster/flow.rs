//! The cluster steps around the agent's operation, each idempotent and resumable from the
//! state in the API (the Node's annotations, [`super::node`]; the Machine's phase,
//! [`super::events`]), so any replica answering any poll continues where the last one
//! stopped:
//!
//! 1. [`Kube::drain`], before a change whose disruption is `drain` or `reboot` is
//!    started: cordon (recording whether the Node was cordoned already), evict the Pods
//!    [`super::drain::classify`] says to, until none is left, or fail after the deadline
//!    naming the Pods left and the budgets blocking them;
//! 2. [`Kube::progress`], while the agent works: the phase (Applying, Rebooting);
//! 3. [`Kube::finish`], when the agent reports the operation done: wait until the Node is
//!    back ([`super::node::back`]), then uncordon if this extension cordoned, remove the
//!    state;
//! 4. [`Kube::failed`]: the phase Failed and a Warning Event naming the cause and the
//!    state the Node is left in (cordoned, with the state annotations, when it was
//!    drained: nothing is scheduled on a node whose change failed).

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::client::Body;

use super::drain::{self, Evicted, PodAction, Progress};
use super::events::{self, Phase, Subject};
use super::node;
use super::{Kube, MachineInfo, Workload};

/// The Machine an update is for, as the management cluster has it, and the update's
/// operation id (the drain's owner).
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The Machine's namespace.
    pub ns: String,
    /// The Machine's name.
    pub name: String,
    /// What the Machine object says.
    pub info: MachineInfo,
    /// The update's operation id ([`crate::hooks::update_machine::operation_id`]).
    pub op: String,
}

/// What a step answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Done: go on.
    Go,
    /// Not yet: the message for the `Success` with `retryAfterSeconds`.
    Wait(String),
    /// A budget (or a Pod the rules refuse) blocks the drain: the message, and the
    /// seconds since the drain started ([`drain::backoff`]).
    Blocked(String, i64),
    /// Can not finish: the message for `Failure`.
    Fail(String),
}

impl Target {
    fn machine_subject(&self) -> Subject {
        Subject {
            kind: "Machine",
            api_version: "cluster.x-k8s.io/v1beta2",
            namespace: Some(self.ns.clone()),
            name: self.name.clone(),
            uid: self.info.uid.clone(),
        }
    }
}

fn node_subject(n: &Node) -> Subject {
    Subject {
        kind: "Node",
        api_version: "v1",
        namespace: None,
        name: n.metadata.name.clone().unwrap_or_default(),
        uid: n.metadata.uid.clone().unwrap_or_default(),
    }
}

/// Node patches name the extension's field manager ([`node::FIELD_MANAGER`]).
fn node_patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(node::FIELD_MANAGER.into()),
        ..Default::default()
    }
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl Kube {
    /// An Event on the Machine and, when given, the Node.
    async fn report(
        &self,
        t: &Target,
        wl: Option<(&Workload, &Node)>,
        reason: &str,
        msg: &str,
        warning: bool,
    ) {
        if let Ok(m) = self.management().await {
            events::emit(&m, &t.machine_subject(), &t.op, reason, msg, warning).await;
        }
        if let Some((w, n)) = wl {
            events::emit(&w.client, &node_subject(n), &t.op, reason, msg, warning).await;
        }
    }

    /// Sets the Machine's phase; true when it changed (the caller reports the step).
    async fn phase(&self, t: &Target, p: Phase) -> bool {
        let m = match self.management().await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(machine = %t.name, error = %e, "no management cluster client");
                return false;
            }
        };
        match events::set_phase(&m, &t.ns, &t.name, &t.info.annotations, &t.op, p).await {
            Ok(changed) => changed,
            Err(e) => {
                tracing::warn!(machine = %t.name, error = %e, "could not set the phase annotation");
                false
            }
        }
    }

    /// The workload cluster's client and the Machine's Node; `Err` is the answer.
    async fn node_of(&self, t: &Target) -> Result<Option<(Workload, Node)>, Step> {
        let Some(name) = &t.info.node else {
            return Ok(None);
        };
        let wl = self
            .workload(&t.ns, &t.info.cluster)
            .await
            .map_err(|e| Step::Wait(format!("waiting for the workload cluster: {e}")))?;
        let n = Api::<Node>::all(wl.client.clone())
            .get(name)
            .await
            .map_err(|e| Step::Wait(format!("waiting for Node {name}: {e}")))?;
        Ok(Some((wl, n)))
    }

    /// The kubelet version the Machine's Node reports (`status.nodeInfo.kubeletVersion`),
    /// for a node whose agent finds no kubelet ([`crate::hooks::verify::before_start`]);
    /// None when the Machine has no Node or it can not be read now.
    pub(crate) async fn node_kubelet_version(
        &self,
        ns: &str,
        info: &MachineInfo,
    ) -> Option<String> {
        let name = info.node.as_ref()?;
        let wl = self.workload(ns, &info.cluster).await.ok()?;
        let n = Api::<Node>::all(wl.client.clone()).get(name).await.ok()?;
        n.status?.node_info.map(|i| i.kubelet_version)
    }

    /// Step 1: cordon and drain the Machine's Node for `t.op`. A Machine without
    /// `status.nodeRef` has no Node to drain: `Fail`, nothing is changed.
    pub(crate) async fn drain(&self, t: &Target) -> Step {
        let timeout = t
            .info
            .drain_timeout
            .unwrap_or(self.cfg.drain_timeout_seconds);
        let (wl, n) = match self.node_of(t).await {
            Ok(Some(x)) => x,
            Ok(None) => {
                return Step::Fail(format!(
                    "Machine {}/{} has no status.nodeRef: its Node can not be drained, nothing was changed",
                    t.ns, t.name
                ));
            }
            Err(s) => return self.bound_unreachable(t, timeout, s).await,
        };
        let name = n.metadata.name.clone().unwrap_or_default();
        let resumed = node::drain_state(&n, &t.op);
        let mut state = match resumed.clone() {
            Some(s) => s,
            None => match self.cordon(t, &wl, &n).await {
                Ok(s) => s,
                Err(step) => return step,
            },
        };
        // `n` is as read before this call's cordon: only a resumed drain's Node is checked
        if resumed.is_some() && !node::unschedulable(&n) {
            if let Err(step) = self.recordon(t, &wl, &n).await {
                return step;
            }
            state.cordoned_by_us = true;
        }
        let progress = match self.evict_pods(&wl, &name).await {
            Ok(p) => p,
            Err(e) => return Step::Wait(format!("draining Node {name}: {e}")),
        };
        if progress.done() {
            self.report(
                t,
                Some((&wl, &n)),
                "Drained",
                &format!("drained Node {name}"),
                false,
            )
            .await;
            return Step::Go;
        }
        let now = k8s_openapi::jiff::Timestamp::now();
        let Some(elapsed) = node::drain_elapsed(&state.started, now) else {
            return self.restart_clock(&wl, &name, &n, now).await;
        };
        let summary = progress.summary();
        if elapsed >= timeout as i64 {
            let msg = format!(
                "drain of Node {name} did not finish within {timeout} s: {summary} (the Node stays cordoned; nothing was changed on it)"
            );
            return Step::Fail(msg);
        }
        self.report(
            t,
            Some((&wl, &n)),
            "Draining",
            &format!("draining Node {name}: {summary}"),
            false,
        )
        .await;
        let msg = format!("draining Node {name} ({elapsed} s of {timeout} s): {summary}");
        if progress.blocked.is_empty() {
            Step::Wait(msg)
        } else {
            Step::Blocked(msg, elapsed)
        }
    }

    /// Starts the drain of Node `n` for `t.op`: cordons it (unless cordoned already) and
    /// records the state ([`node::cordon_patch`]); reports it. `Err` is the answer (a
    /// conflict with another replica's patch: wait).
    async fn cordon(&self, t: &Target, wl: &Workload, n: &Node) -> Result<node::DrainState, Step> {
        let name = n.metadata.name.clone().unwrap_or_default();
        let nodes: Api<Node> = Api::all(wl.client.clone());
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let p = node::cordon_patch(n, &t.op, &now);
        match nodes
            .patch(&name, &node_patch_params(), &Patch::Merge(&p))
            .await
        {
            Ok(_) => {}
            Err(e) if conflict(&e) => {
                return Err(Step::Wait(format!(
                    "Node {name} changed while cordoning it; trying again"
                )));
            }
            Err(e) => return Err(Step::Wait(format!("cordoning Node {name}: {e}"))),
        }
        // ours when this patch set the cordon or took over our own earlier one
        let ours = p["metadata"]["annotations"][node::CORDONED] == t.op.as_str();
        self.phase(t, Phase::Draining).await;
        let msg = if ours {
            format!("cordoned Node {name} for in-place update {}", t.op)
        } else {
            format!(
                "Node {name} was cordoned already (not by inplace-extension): it stays cordoned after in-place update {}",
                t.op
            )
        };
        self.report(t, Some((wl, n)), "Cordoned", &msg, false).await;
        Ok(node::DrainState {
            started: now,
            cordoned_by_us: ours,
            boot_id: node::boot_id(n),
        })
    }

    /// Someone uncordoned the Node in the middle of `t.op`'s drain. It is cordoned again
    /// (and the cordon claimed for `t.op`, since it is set now), with a Warning Event:
    /// this is what CAPI's Machine drain does (it cordons again at every reconcile before
    /// evicting, `internal/controllers/machine/drain/drain.go` `CordonNode`), and a drain
    /// must not go on evicting from a Node the scheduler fills again; failing instead
    /// would leave the update stuck on an operator's routine `kubectl uncordon`.
    async fn recordon(&self, t: &Target, wl: &Workload, n: &Node) -> Result<(), Step> {
        let name = n.metadata.name.clone().unwrap_or_default();
        let p = node::recordon_patch(n, &t.op);
        match Api::<Node>::all(wl.client.clone())
            .patch(&name, &node_patch_params(), &Patch::Merge(&p))
            .await
        {
            Ok(_) => {}
            Err(e) if conflict(&e) => {
                return Err(Step::Wait(format!(
                    "Node {name} changed while cordoning it again; trying again"
                )));
            }
            Err(e) => return Err(Step::Wait(format!("cordoning Node {name} again: {e}"))),
        }
        let msg = format!(
            "Node {name} was uncordoned during the drain for in-place update {}: cordoned it again (it is uncordoned when the update ends)",
            t.op
        );
        tracing::warn!(node = %name, op = %t.op, "Node uncordoned mid-drain; cordoned again");
        self.report(t, Some((wl, n)), "Recordoned", &msg, true)
            .await;
        Ok(())
    }

    /// The Node's `inplaced.io/drain-started` is not a time (or lies in the future): the
    /// deadline's clock restarts now (the annotation is rewritten), so a drain always
    /// ends; the answer names the annotation.
    async fn restart_clock(
        &self,
        wl: &Workload,
        name: &str,
        n: &Node,
        now: k8s_openapi::jiff::Timestamp,
    ) -> Step {
        let p = serde_json::json!({"metadata": {
            "resourceVersion": n.metadata.resource_version,
            "annotations": {node::DRAIN_STARTED: now.to_string()},
        }});
        if let Err(e) = Api::<Node>::all(wl.client.clone())
            .patch(name, &node_patch_params(), &Patch::Merge(&p))
            .await
        {
            return Step::Wait(format!(
                "Node {name}: annotation {} is not an RFC 3339 time in the past; rewriting it failed: {e}",
                node::DRAIN_STARTED
            ));
        }
        tracing::warn!(node = %name, "drain-started annotation was not a time; the drain deadline restarts now");
        Step::Wait(format!(
            "Node {name}: annotation {} was not an RFC 3339 time in the past; the drain deadline restarts now",
            node::DRAIN_STARTED
        ))
    }

    /// Bounds the wait for the workload cluster or the Node before the cordon (a missing
    /// `<cluster>-kubeconfig` Secret, a cluster not answering) by the drain deadline,
    /// counted from the first such answer for `t.op` on the Machine's clock
    /// [`events::WAITING_FOR_CLUSTER`] (every replica counts the same one): then `Fail`
    /// with the cause (it names the Secret). Nothing was changed on the Node.
    async fn bound_unreachable(&self, t: &Target, timeout: u64, s: Step) -> Step {
        let Step::Wait(msg) = s else { return s };
        let waited = self.clock(t, events::WAITING_FOR_CLUSTER).await;
        if waited >= timeout {
            return Step::Fail(format!(
                "{msg}; gave up after {waited} s (the drain deadline, {timeout} s); nothing was changed on the Node"
            ));
        }
        Step::Wait(format!("{msg} ({waited} s of {timeout} s)"))
    }

    /// Seconds `t.op` has waited on the Machine's clock `key` (an annotation of
    /// [`events::waiting_since`]'s format). The first call of an operation starts the
    /// clock (0); so does one whose time lies more than a minute ahead (tampered).
    async fn clock(&self, t: &Target, key: &str) -> u64 {
        let now = k8s_openapi::jiff::Timestamp::now();
        let since = events::waiting_since(&t.info.annotations, key, &t.op)
            .filter(|s| s.as_second() <= now.as_second() + 60);
        if let Some(since) = since {
            return (now.as_second() - since.as_second()).max(0) as u64;
        }
        if let Ok(m) = self.management().await
            && let Err(e) = events::mark_waiting(&m, &t.ns, &t.name, key, &t.op).await
        {
            tracing::warn!(machine = %t.name, clock = key, error = %e, "could not start the clock of a wait");
        }
        0
    }

    /// One pass over the Node's Pods: evicts what [`drain::classify`] says to.
    async fn evict_pods(&self, wl: &Workload, node: &str) -> Result<Progress, String> {
        let pods: Api<Pod> = Api::all(wl.client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let list = pods
            .list(&lp)
            .await
            .map_err(|e| format!("listing Pods: {e}"))?;
        let mut p = Progress::default();
        for pod in &list.items {
            let ns = pod.metadata.namespace.clone().unwrap_or_default();
            let name = pod.metadata.name.clone().unwrap_or_default();
            let key = format!("{ns}/{name}");
            let orphan = match drain::daemon_set_of(pod) {
                Some(ds) => self.daemon_set_gone(wl, &ns, ds).await,
                None => false,
            };
            match drain::classify(pod, self.cfg.evict_local_storage, orphan) {
                PodAction::Skip(why) => {
                    tracing::debug!(pod = %key, why, "not evicted");
                }
                PodAction::Wait(_) => p.left.push(key),
                PodAction::Refuse(why) => {
                    p.blocked.push(format!("{key}: {why}"));
                    p.left.push(key);
                }
                PodAction::Evict => match self.evict(wl, &ns, &name).await {
                    Evicted::Gone => {}
                    Evicted::Yes => {
                        p.evicted += 1;
                        p.left.push(key);
                    }
                    Evicted::Blocked(why) | Evicted::Error(why) => {
                        p.blocked.push(format!("{key}: {why}"));
                        p.left.push(key);
                    }
                },
            }
        }
        p.left.sort();
        Ok(p)
    }

    /// Whether DaemonSet `ns/name` is gone (a 404). Any other error counts as present:
    /// the Pod is left, as for a live DaemonSet, and the error logged.
    async fn daemon_set_gone(&self, wl: &Workload, ns: &str, name: &str) -> bool {
        let api: Api<DaemonSet> = Api::namespaced(wl.client.clone(), ns);
        match api.get_opt(name).await {
            Ok(found) => found.is_none(),
            Err(e) => {
                tracing::warn!(daemon_set = %format!("{ns}/{name}"), error = %e, "could not read the DaemonSet of a Pod on the drained Node; its Pod is left");
                false
            }
        }
    }

    /// Posts the Eviction of Pod `ns/name` (`policy/<wl.eviction>`).
    async fn evict(&self, wl: &Workload, ns: &str, name: &str) -> Evicted {
        let body = drain::eviction_body(wl.eviction, ns, name);
        let req = http::Request::post(format!("/api/v1/namespaces/{ns}/pods/{name}/eviction"))
            .header("content-type", "application/json")
            .body(Body::from(body.to_string().into_bytes()));
        let req = match req {
            Ok(r) => r,
            Err(e) => return Evicted::Error(e.to_string()),
        };
        match wl.client.send(req).await {
            Ok(resp) => {
                let code = resp.status().as_u16();
                let text = match resp.into_body().collect_bytes().await {
                    Ok(b) => String::from_utf8_lossy(&b).into_owned(),
                    Err(e) => e.to_string(),
                };
                let out = drain::eviction_outcome(code, &text);
                tracing::info!(pod = %format!("{ns}/{name}"), outcome = ?out, "eviction");
                out
            }
            Err(e) => Evicted::Error(e.to_string()),
        }
    }

    /// Step 2: the phase while the agent works (Applying, Rebooting), reported once (the
    /// Event's name is the step's, so a report again creates nothing).
    pub(crate) async fn progress(&self, t: &Target, p: Phase) {
        if self.phase(t, p).await {
            let (reason, what) = match p {
                Phase::Rebooting => ("Rebooting", "the node reboots to finish"),
                _ => ("Applying", "the node agent applies"),
            };
            let msg = format!("{what} in-place update {}", t.op);
            self.report(t, None, reason, &msg, false).await;
        }
    }

    /// Step 2 after the fact: the agent's operation is done and rebooted the node, but no
    /// poll saw it rebooting (a fast reboot, kexec, or polls further apart than the
    /// reboot): the Rebooting step is reported now, once, so the Machine's phase and
    /// Events still show it. Nothing when a poll already moved past Applying.
    pub(crate) async fn rebooted_unseen(&self, t: &Target) {
        let a = &t.info.annotations;
        let same_op = a.get(events::PHASE_OPERATION).map(String::as_str) == Some(t.op.as_str());
        let phase = a.get(events::PHASE).map(String::as_str);
        if !same_op || phase.is_none() || phase == Some(Phase::Applying.name()) {
            self.progress(t, Phase::Rebooting).await;
        }
    }

    /// Step 3: the Node is back (Ready; a new boot id when `rebooted`; kubelet `version`
    /// when given), then the release (uncordon only an own cordon). A Machine without a
    /// Node: `Go`. The wait is bounded by `cluster.node_back_timeout_seconds`
    /// ([`Kube::bound_node_back`]).
    pub(crate) async fn finish(&self, t: &Target, rebooted: bool, version: Option<&str>) -> Step {
        match self.node_back(t, rebooted, version).await {
            Step::Wait(msg) => self.bound_node_back(t, msg).await,
            s => s,
        }
    }

    /// Whether a timed try on the Machine's Node may be confirmed: the Node is Ready (with
    /// kubelet `version` when given) and its kubelet reached the API server after the
    /// change, at `since` (Unix nanoseconds: the operation's last update, by the node's clock, which is also
    /// the kubelet's): its Lease (`kube-node-lease/<node>`, renewed every 10 s by default)
    /// was renewed after it, or, without a Lease, the Ready condition's heartbeat is
    /// newer. A Ready condition alone is not enough: the node controller marks a silent
    /// Node NotReady only after its grace period (40 s by default). A Machine without a
    /// Node has nothing to wait for. `Err` says what is waited for.
    pub(crate) async fn node_ready_since(
        &self,
        t: &Target,
        version: Option<&str>,
        since: i128,
    ) -> Result<(), String> {
        let (wl, n) = match self.node_of(t).await {
            Ok(Some(x)) => x,
            Ok(None) => return Ok(()),
            Err(Step::Wait(m) | Step::Fail(m) | Step::Blocked(m, _)) => return Err(m),
            Err(Step::Go) => return Ok(()),
        };
        let name = n.metadata.name.clone().unwrap_or_default();
        node::back(&n, None, version).map_err(|why| format!("Node {name}: {why}"))?;
        let leases: Api<Lease> = Api::namespaced(wl.client.clone(), "kube-node-lease");
        let seen = match leases.get_opt(&name).await {
            Ok(Some(l)) => l
                .spec
                .and_then(|s| s.renew_time)
                .map(|t| t.0.as_nanosecond()),
            Ok(None) => node::ready_heartbeat(&n).map(|s| i128::from(s) * 1_000_000_000),
            Err(e) => return Err(format!("reading the Lease of Node {name}: {e}")),
        };
        match seen {
            Some(at) if at > since => Ok(()),
            _ => Err(format!(
                "Node {name}: waiting for its kubelet to report after the change (a Lease renewal or heartbeat after it)"
            )),
        }
    }

    /// Bounds the wait of [`Kube::finish`]: the clock starts at its first wait for `t.op`
    /// (the Machine annotation [`events::WAITING_FOR_NODE`], so every replica and a
    /// restarted extension count the same one; a time more than a minute ahead restarts
    /// it). Past `cluster.node_back_timeout_seconds`: `Fail` naming what is still waited
    /// for; the Node stays cordoned. A Node that comes back later is still released by
    /// the next UpdateMachine call of the same operation.
    async fn bound_node_back(&self, t: &Target, msg: String) -> Step {
        let limit = self.cfg.node_back_timeout_seconds;
        let waited = self.clock(t, events::WAITING_FOR_NODE).await;
        if waited >= limit {
            return Step::Fail(format!(
                "{msg}: the Node was not back within {limit} s after the node agent finished (cluster.node_back_timeout_seconds); the change is on the node (see `inplacectl status` there)"
            ));
        }
        self.phase(t, Phase::WaitingForNode).await;
        Step::Wait(format!("{msg} ({waited} s of {limit} s)"))
    }

    /// [`Kube::finish`] without the deadline.
    async fn node_back(&self, t: &Target, rebooted: bool, version: Option<&str>) -> Step {
        let (wl, n) = match self.node_of(t).await {
            Ok(Some(x)) => x,
            Ok(None) => return Step::Go,
            Err(s) => return s,
        };
        let name = n.metadata.name.clone().unwrap_or_default();
        let state = node::drain_state(&n, &t.op);
        let before = state
            .as_ref()
            .filter(|_| rebooted)
            .map(|s| s.boot_id.as_str());
        if let Err(why) = node::back(&n, before, version) {
            return Step::Wait(format!("Node {name}: {why}"));
        }
        if let Some(p) = node::release_patch(&n, &t.op) {
            let nodes: Api<Node> = Api::all(wl.client.clone());
            match nodes
                .patch(&name, &node_patch_params(), &Patch::Merge(&p))
                .await
            {
                Ok(_) => {}
                Err(e) if conflict(&e) => {
                    return Step::Wait(format!(
                        "Node {name} changed while uncordoning it; trying again"
                    ));
                }
                Err(e) => return Step::Wait(format!("uncordoning Node {name}: {e}")),
            }
        }
        if self.phase(t, Phase::Done).await {
            self.report(
                t,
                Some((&wl, &n)),
                "NodeReady",
                &format!("Node {name} is Ready after in-place update {}", t.op),
                false,
            )
            .await;
            let (reason, msg) = match &state {
                Some(s) if s.cordoned_by_us => ("Uncordoned", format!("uncordoned Node {name}")),
                Some(_) => (
                    "LeftCordoned",
                    format!(
                        "Node {name} stays cordoned: it was cordoned before the update, not by inplace-extension"
                    ),
                ),
                None => return Step::Go,
            };
            self.report(t, Some((&wl, &n)), reason, &msg, false).await;
        }
        Step::Go
    }

    /// Step 4: the phase Failed and a Warning Event with `cause` and the Node's state.
    pub(crate) async fn failed(&self, t: &Target, cause: &str) {
        if !self.phase(t, Phase::Failed).await {
            return;
        }
        let node = self.node_of(t).await.ok().flatten();
        let left = match &node {
            Some((_, n)) if node::drain_state(n, &t.op).is_some() => format!(
                "; Node {} is left cordoned with the drain annotations (uncordon it after fixing the node, or set a new value of the Machine annotation inplaced.io/retry)",
                n.metadata.name.as_deref().unwrap_or("")
            ),
            _ => String::new(),
        };
        // the cause is shortened, never the Node's state: an Event message is cut at
        // events::MESSAGE_CHARS, and a trial boot's evidence alone can fill that
        let head = format!("in-place update {} failed: ", t.op);
        let room =
            events::MESSAGE_CHARS.saturating_sub(head.chars().count() + left.chars().count());
        let msg = format!("{head}{}{left}", events::shorten(cause, room));
        self.report(
            t,
            node.as_ref().map(|(w, n)| (w, n)),
            "UpdateFailed",
            &msg,
            true,
        )
        .await;
    }
}
