//! CanUpdateMachine: translate the Machine's objects, ask its node about the desired
//! NodeSpec (one `Inspect`), answer with the patches of what the node covers.

use serde_json::Value;

use super::{Answer, Hook, refuses_spec, reply, status_only};
use crate::agent::inspect;
use crate::capi::types::{CanUpdateMachineRequest, MachineObjects, failure};
use crate::capi::{self, NodeCoverage, PreserveMode};
use crate::config::Effective;
use crate::extension::{AgentError, Extension};
use crate::resolve::MachineRef;
use inplace_wire::pb;

const HOOK: Hook = Hook::CanUpdateMachine;

impl Extension {
    /// CanUpdateMachine: translate, ask the node about the desired NodeSpec, answer patches.
    /// An unreachable agent is a `Failure` (CAPI retries), never an empty success.
    pub(crate) async fn can_update_machine(
        &self,
        mut req: CanUpdateMachineRequest,
    ) -> (Value, Answer) {
        let kind = HOOK.response_kind();
        req.redact();
        let eff = match self.settings(&req.settings) {
            Ok(e) => e,
            Err(e) => return (failure(kind, &e), Answer::Failure),
        };
        let m = MachineRef::of(&req.desired.machine);
        if let Some(e) = self.unserved(&m) {
            return (failure(kind, &e), Answer::Failure);
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
                    let msg = format!(
                        "{}: can not ask the node agent ({e}); CAPI will retry",
                        m.name
                    );
                    return (failure(kind, &msg), Answer::Failure);
                }
            }
        } else {
            None
        };
        let (mut resp, verdict) = capi::can_update_machine_with_verdict(
            &req.current,
            &req.desired,
            diff,
            cov.as_ref(),
            eff.preserve,
        );
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
        reply(HOOK, resp, Answer::of_verdict(verdict))
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
        // with [cluster], the agent's address may come from the Machine's status.addresses
        let (m, _) = self.machine_in_cluster(m).await.map_err(AgentError)?;
        let m = &m;
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
