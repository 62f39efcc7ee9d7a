//! gRPC client over the agent's Unix socket, used by `inplacectl` and the tests.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::pb::node_agent_client::NodeAgentClient;

/// Connects to the agent's socket. The URI is a placeholder; the connector dials `socket`.
///
/// Errors: the socket is missing or refuses (agent not running, or no permission: the
/// socket is root-only).
pub async fn connect(socket: &Path) -> Result<NodeAgentClient<Channel>, tonic::transport::Error> {
    let channel = channel(socket).await?;
    Ok(NodeAgentClient::new(channel))
}

/// A channel to the agent's socket (for the health client too).
pub async fn channel(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = socket.to_path_buf();
    Endpoint::try_from("http://[::]:50051")?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
}
