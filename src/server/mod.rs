//! The gRPC service (`inplace.v1.NodeAgent`) over the agent, served on a Unix socket with
//! `grpc.health.v1` and server reflection (v1).
//!
//! Agent errors map to status codes as DESIGN §4 says: a bad spec is `INVALID_ARGUMENT`, an
//! apply that is not fully covered `FAILED_PRECONDITION`, a concurrent operation `ABORTED`,
//! an id reused with another spec `ALREADY_EXISTS`, an unknown operation `NOT_FOUND`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::apply::{Agent, AgentError, is_settled};
use crate::pb;
use crate::pb::node_agent_server::{NodeAgent, NodeAgentServer};

impl From<AgentError> for Status {
    fn from(e: AgentError) -> Status {
        let msg = e.to_string();
        match e {
            AgentError::InvalidSpec(_) | AgentError::InvalidRequest(_) => {
                Status::invalid_argument(msg)
            }
            AgentError::NotCovered(_) | AgentError::Precondition(_) => {
                Status::failed_precondition(msg)
            }
            AgentError::Busy(_) => Status::aborted(msg),
            AgentError::AlreadyExists { .. } => Status::already_exists(msg),
            AgentError::NotFound(_) => Status::not_found(msg),
            AgentError::Internal(_) => Status::internal(msg),
        }
    }
}

/// The tonic service.
#[derive(Debug, Clone)]
pub struct Service {
    agent: Arc<Agent>,
}

impl Service {
    /// Wraps an agent.
    pub fn new(agent: Arc<Agent>) -> Self {
        Service { agent }
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, AgentError> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("worker: {e}")))?
        .map_err(Status::from)
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::OperationEvent, Status>> + Send>>;

#[tonic::async_trait]
impl NodeAgent for Service {
    async fn get_coverage(
        &self,
        req: Request<pb::GetCoverageRequest>,
    ) -> Result<Response<pb::CoverageReport>, Status> {
        let a = self.agent.clone();
        let r = req.into_inner();
        let desired = r.desired.unwrap_or_default();
        let policy =
            pb::RebootPolicy::try_from(r.reboot_policy).unwrap_or(pb::RebootPolicy::Unspecified);
        blocking(move || a.coverage(&desired, policy))
            .await
            .map(Response::new)
    }

    async fn apply(
        &self,
        req: Request<pb::ApplyRequest>,
    ) -> Result<Response<pb::Operation>, Status> {
        let a = self.agent.clone();
        let r = req.into_inner();
        blocking(move || a.apply(r)).await.map(Response::new)
    }

    async fn get_operation(
        &self,
        req: Request<pb::GetOperationRequest>,
    ) -> Result<Response<pb::Operation>, Status> {
        let a = self.agent.clone();
        let id = req.into_inner().id;
        blocking(move || a.get_operation(&id))
            .await
            .map(Response::new)
    }

    type WatchOperationStream = EventStream;

    async fn watch_operation(
        &self,
        req: Request<pb::WatchOperationRequest>,
    ) -> Result<Response<Self::WatchOperationStream>, Status> {
        let id = req.into_inner().id;
        let (events, rx) = self.agent.watch(&id).map_err(Status::from)?;
        let (tx, out) = tokio::sync::mpsc::channel(16);
        let agent = self.agent.clone();
        tokio::spawn(async move {
            let mut last_phase = 0;
            for op in events {
                last_phase = op.phase;
                if tx
                    .send(Ok(pb::OperationEvent {
                        operation: Some(op),
                    }))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            let Some(mut rx) = rx else { return };
            while !is_settled(last_phase) {
                let op = match rx.recv().await {
                    Ok(op) => op,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        match agent.get_operation(&id) {
                            Ok(op) => op,
                            Err(_) => break,
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                };
                last_phase = op.phase;
                if tx
                    .send(Ok(pb::OperationEvent {
                        operation: Some(op),
                    }))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }

    async fn list_operations(
        &self,
        _req: Request<pb::ListOperationsRequest>,
    ) -> Result<Response<pb::ListOperationsResponse>, Status> {
        let a = self.agent.clone();
        blocking(move || a.list_operations())
            .await
            .map(|operations| Response::new(pb::ListOperationsResponse { operations }))
    }

    async fn reboot(
        &self,
        req: Request<pb::RebootRequest>,
    ) -> Result<Response<pb::Operation>, Status> {
        let a = self.agent.clone();
        let id = req.into_inner().operation_id;
        blocking(move || a.reboot(&id)).await.map(Response::new)
    }

    async fn get_status(
        &self,
        _req: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::NodeStatus>, Status> {
        let a = self.agent.clone();
        blocking(move || a.status()).await.map(Response::new)
    }
}

/// Binds `socket` (replacing a stale socket file, creating its directory 0755, socket mode
/// 0600) and serves the API, health and reflection until `shutdown` resolves.
pub async fn serve_unix(
    agent: Arc<Agent>,
    socket: &Path,
    ready: impl FnOnce(),
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    use anyhow::Context;
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::symlink_metadata(socket) {
        Ok(m) if m.file_type().is_dir() => {
            anyhow::bail!("{} is a directory, not a socket path", socket.display())
        }
        Ok(_) => {
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                anyhow::bail!(
                    "{} is in use by a running server; stop it or choose another --socket",
                    socket.display()
                );
            }
            std::fs::remove_file(socket)
                .with_context(|| format!("removing stale {}", socket.display()))?
        }
        Err(_) => {}
    }
    let listener = tokio::net::UnixListener::bind(socket)
        .with_context(|| format!("binding {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", socket.display()))?;

    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<NodeAgentServer<Service>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the reflection service")?;
    tracing::info!(socket = %socket.display(), "serving");
    ready();
    tonic::transport::Server::builder()
        .add_service(health)
        .add_service(reflection)
        .add_service(NodeAgentServer::new(Service::new(agent)))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            shutdown,
        )
        .await
        .context("serving gRPC")?;
    let _ = std::fs::remove_file(socket);
    Ok(())
}
