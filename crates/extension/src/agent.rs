//! The extension's calls to a node agent: each bounded in time and counted per hook
//! (`inplace_extension_agent_rpcs_total{hook,rpc}`), and [`inspect`], one round trip for
//! the status, the history and the coverage a hook needs.
//!
//! Per hook, against an agent that serves `Inspect`: CanUpdateMachine makes one RPC
//! (`Inspect` with the desired spec); UpdateMachine one while it polls (`Inspect`: status,
//! history; the coverage is left out while an operation runs) and two when it starts an
//! attempt (`Inspect` with the coverage, then `Apply`), plus `Reboot` when the node waits
//! for one, or a `GetCoverage` when the spec to apply is not the one inspected (a node
//! that reports no Kubernetes version). CanUpdateMachineSet asks no agent. An older agent
//! answers `Inspect` with `UNIMPLEMENTED`; the same parts then come from `ListOperations`,
//! `GetStatus` and `GetCoverage`, as before `Inspect` existed.

use std::time::Duration;

use tonic::transport::Channel;

use super::metrics;
use inplace_wire::pb;
use inplace_wire::pb::node_agent_client::NodeAgentClient;

tokio::task_local! {
    /// The hook being answered, for the per-hook RPC count (set by `Extension::handle`).
    pub static HOOK: &'static str;
}

/// An agent call named `rpc` (snake case, for the metrics), bounded by `t`; no answer in
/// time is reported as `DEADLINE_EXCEEDED`.
pub(crate) async fn call<T>(
    t: Duration,
    rpc: &'static str,
    f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, tonic::Status> {
    let hook = HOOK.try_with(|h| *h).unwrap_or("none");
    metrics::get().agent_rpc(hook, rpc);
    let r = match tokio::time::timeout(t, f).await {
        Ok(r) => r.map(tonic::Response::into_inner),
        Err(_) => Err(tonic::Status::deadline_exceeded(format!(
            "no answer within {t:?}"
        ))),
    };
    metrics::get().agent_call(r.as_ref().map(|_| ()).map_err(tonic::Status::code));
    r
}

/// What [`inspect`] found: the parts asked for.
#[derive(Debug, Default)]
pub(crate) struct View {
    /// The node's status (when asked).
    pub status: pb::NodeStatus,
    /// The operation history, newest first (when asked).
    pub operations: Vec<pb::Operation>,
    /// The coverage of the spec (when asked): the report, or the status GetCoverage
    /// returned (`ABORTED` when left out because an operation runs).
    pub coverage: Option<Result<pb::CoverageReport, tonic::Status>>,
    /// The node's preservation recommendation.
    pub preservation: pb::Preservation,
}

/// The status (if `status`), the history (if `operations`) and the coverage of `desired`
/// (if set) in one `Inspect` call, each bounded by `t`; against an agent without
/// `Inspect`, from the older calls. `Err` is a failure of the call itself (the agent is
/// unreachable, or refuses the message).
pub(crate) async fn inspect(
    c: &mut NodeAgentClient<Channel>,
    t: Duration,
    req: pb::InspectRequest,
) -> Result<View, tonic::Status> {
    match call(t, "inspect", c.inspect(req.clone())).await {
        Ok(r) => Ok(View {
            status: r.status.unwrap_or_default(),
            operations: r.operations,
            coverage: match (r.coverage, r.coverage_error) {
                (Some(c), _) => Some(Ok(c)),
                (None, Some(e)) => Some(Err(tonic::Status::new(e.code.into(), e.message))),
                (None, None) => None,
            },
            preservation: r.preservation.unwrap_or_default(),
        }),
        Err(s) if s.code() == tonic::Code::Unimplemented => inspect_old(c, t, req).await,
        Err(s) => Err(s),
    }
}

/// [`inspect`] from `ListOperations`, `GetStatus` and `GetCoverage` (agents that predate
/// `Inspect`).
async fn inspect_old(
    c: &mut NodeAgentClient<Channel>,
    t: Duration,
    req: pb::InspectRequest,
) -> Result<View, tonic::Status> {
    let mut v = View::default();
    if req.operations {
        v.operations = call(
            t,
            "list_operations",
            c.list_operations(pb::ListOperationsRequest {}),
        )
        .await?
        .operations;
    }
    if req.status || req.skip_coverage_when_busy {
        v.status = call(t, "get_status", c.get_status(pb::GetStatusRequest {})).await?;
        v.preservation = v.status.preservation.clone().unwrap_or_default();
    }
    let Some(desired) = req.desired else {
        return Ok(v);
    };
    if req.skip_coverage_when_busy && v.status.current_operation.is_some() {
        v.coverage = Some(Err(tonic::Status::aborted(
            "an operation is running on the node",
        )));
        return Ok(v);
    }
    let r = call(
        t,
        "get_coverage",
        c.get_coverage(pb::GetCoverageRequest {
            diff: None,
            desired: Some(desired),
            reboot_policy: req.reboot_policy,
        }),
    )
    .await;
    match r {
        Ok(report) => {
            if let Some(p) = &report.preservation {
                v.preservation = p.clone();
            }
            v.coverage = Some(Ok(report));
        }
        // The spec refused: the recommendation then comes from the status, as `Inspect`
        // always carries one.
        Err(s) if matches!(s.code(), tonic::Code::InvalidArgument) => {
            if !req.status {
                let st = call(t, "get_status", c.get_status(pb::GetStatusRequest {})).await?;
                v.preservation = st.preservation.unwrap_or_default();
            }
            v.coverage = Some(Err(s));
        }
        Err(s) => return Err(s),
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use inplace_wire::pb::node_agent_server::{NodeAgent, NodeAgentServer};
    use tonic::{Request, Response, Status};

    /// An agent from before `Inspect`: status, history and coverage only; the spec with a
    /// sysctl `bad` is refused as GetCoverage refuses an invalid one.
    struct OldAgent {
        busy: bool,
    }

    fn unimplemented<T>() -> Result<Response<T>, Status> {
        Err(Status::unimplemented("not in this agent"))
    }

    #[tonic::async_trait]
    impl NodeAgent for OldAgent {
        async fn get_coverage(
            &self,
            r: Request<pb::GetCoverageRequest>,
        ) -> Result<Response<pb::CoverageReport>, Status> {
            let d = r.into_inner().desired.unwrap_or_default();
            if d.sysctls.contains_key("bad") {
                return Err(Status::invalid_argument("sysctls[bad]: no such key"));
            }
            Ok(Response::new(pb::CoverageReport {
                fully_covered: true,
                spec_hash: "sha256:c".into(),
                preservation: Some(pb::Preservation {
                    preserve: true,
                    reasons: vec!["from coverage".into()],
                }),
                ..Default::default()
            }))
        }
        async fn apply(
            &self,
            _: Request<pb::ApplyRequest>,
        ) -> Result<Response<pb::Operation>, Status> {
            unimplemented()
        }
        async fn get_operation(
            &self,
            _: Request<pb::GetOperationRequest>,
        ) -> Result<Response<pb::Operation>, Status> {
            unimplemented()
        }
        type WatchOperationStream = tokio_stream::Empty<Result<pb::OperationEvent, Status>>;
        async fn watch_operation(
            &self,
            _: Request<pb::WatchOperationRequest>,
        ) -> Result<Response<Self::WatchOperationStream>, Status> {
            unimplemented()
        }
        async fn list_operations(
            &self,
            _: Request<pb::ListOperationsRequest>,
        ) -> Result<Response<pb::ListOperationsResponse>, Status> {
            Ok(Response::new(pb::ListOperationsResponse {
                operations: vec![pb::Operation {
                    id: "op".into(),
                    ..Default::default()
                }],
            }))
        }
        async fn reboot(
            &self,
            _: Request<pb::RebootRequest>,
        ) -> Result<Response<pb::Operation>, Status> {
            unimplemented()
        }
        async fn confirm(
            &self,
            _: Request<pb::ConfirmRequest>,
        ) -> Result<Response<pb::Operation>, Status> {
            unimplemented()
        }
        async fn get_status(
            &self,
            _: Request<pb::GetStatusRequest>,
        ) -> Result<Response<pb::NodeStatus>, Status> {
            Ok(Response::new(pb::NodeStatus {
                boot_id: "b".into(),
                current_operation: self.busy.then(pb::Operation::default),
                preservation: Some(pb::Preservation {
                    preserve: true,
                    reasons: vec!["from status".into()],
                }),
                ..Default::default()
            }))
        }
        async fn inspect(
            &self,
            _: Request<pb::InspectRequest>,
        ) -> Result<Response<pb::InspectResponse>, Status> {
            unimplemented()
        }
    }

    async fn old_agent(busy: bool) -> NodeAgentClient<Channel> {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(NodeAgentServer::new(OldAgent { busy }))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l)),
        );
        NodeAgentClient::connect(format!("http://{addr}"))
            .await
            .unwrap()
    }

    fn spec(key: &str) -> pb::NodeSpec {
        pb::NodeSpec {
            sysctls: [(key.to_string(), "1".to_string())].into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn an_agent_without_inspect_is_asked_the_old_way() {
        let t = Duration::from_secs(5);
        let mut c = old_agent(false).await;
        let all = pb::InspectRequest {
            desired: Some(spec("vm.x")),
            status: true,
            operations: true,
            skip_coverage_when_busy: true,
            ..Default::default()
        };
        let v = inspect(&mut c, t, all.clone()).await.unwrap();
        assert_eq!(v.status.boot_id, "b");
        assert_eq!(v.operations[0].id, "op");
        let report = v.coverage.unwrap().unwrap();
        assert_eq!(report.spec_hash, "sha256:c");
        assert_eq!(v.preservation.reasons, ["from coverage"]);
        // a refused spec: the status, and the recommendation from the status
        let refused = pb::InspectRequest {
            desired: Some(spec("bad")),
            ..Default::default()
        };
        let v = inspect(&mut c, t, refused).await.unwrap();
        let e = v.coverage.unwrap().unwrap_err();
        assert_eq!(
            (e.code(), e.message()),
            (tonic::Code::InvalidArgument, "sysctls[bad]: no such key")
        );
        assert_eq!(v.preservation.reasons, ["from status"]);
        // busy: no coverage asked
        let mut c = old_agent(true).await;
        let v = inspect(&mut c, t, all).await.unwrap();
        assert_eq!(
            v.coverage.unwrap().unwrap_err().code(),
            tonic::Code::Aborted
        );
    }
}
