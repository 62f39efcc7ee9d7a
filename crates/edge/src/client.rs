//! gRPC client over the agent's Unix socket, used by `inplacectl` and the tests.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use inplace_wire::pb::node_agent_client::NodeAgentClient;

/// Interval of HTTP/2 PINGs on an idle pooled connection.
pub const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(15);
/// How long a PING may go unanswered before the connection counts as dead.
pub const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

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

/// Client identity and trust for the remote API (PEM bytes).
#[derive(Debug, Clone)]
pub struct TlsIdentity {
    /// CA bundle that signs the agent's server certificate.
    pub ca: Vec<u8>,
    /// Client certificate chain.
    pub cert: Vec<u8>,
    /// Client private key.
    pub key: Vec<u8>,
    /// Name to verify in the server certificate (DNS name or IP address).
    pub server_name: String,
}

/// Connects to the agent's TCP API with mutual TLS (rustls, ALPN h2), as the CAPI
/// extension does. Errors name what is wrong with the identity or the connection.
pub async fn connect_tls(addr: &str, id: &TlsIdentity) -> anyhow::Result<NodeAgentClient<Channel>> {
    Ok(NodeAgentClient::new(connect_tls_channel(addr, id).await?))
}

/// The channel of [`connect_tls`]: one HTTP/2 connection that multiplexes calls and
/// reconnects through the same connector (and identity) after it breaks.
pub async fn connect_tls_channel(addr: &str, id: &TlsIdentity) -> anyhow::Result<Channel> {
    connect_tls_channel_with(addr, tls_client_config(id)?, &id.server_name).await
}

/// The rustls client config of `id` (its CA bundle as the only roots, its certificate and
/// key, ALPN h2), to share between the channels of one identity: a config holds the
/// parsed roots and key and the TLS session cache (rustls' default: 256 entries, its map
/// allocated when the config is made), so a config per connection costs all of that per
/// connection. Errors name the part that does not parse.
pub fn tls_client_config(id: &TlsIdentity) -> anyhow::Result<std::sync::Arc<rustls::ClientConfig>> {
    use anyhow::Context;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&id.ca) {
        roots
            .add(c.context("CA bundle is not PEM")?)
            .context("CA bundle")?;
    }
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&id.cert)
        .collect::<Result<_, _>>()
        .context("client certificate is not PEM")?;
    let key = PrivateKeyDer::from_pem_slice(&id.key).context("client key is not PEM")?;
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|e| crate::tls::pairing_error(e, "client certificate", "client key"))?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(std::sync::Arc::new(cfg))
}

/// A channel to `addr` with the client config `cfg` ([`tls_client_config`]), verifying
/// `server_name` (DNS name or IP address) in the agent's certificate on every connect.
pub async fn connect_tls_channel_with(
    addr: &str,
    cfg: std::sync::Arc<rustls::ClientConfig>,
    server_name: &str,
) -> anyhow::Result<Channel> {
    use anyhow::Context;
    use rustls_pki_types::ServerName;
    let connector = tokio_rustls::TlsConnector::from(cfg);
    let name = ServerName::try_from(server_name.to_string())
        .with_context(|| format!("server name {server_name:?}"))?;
    let addr = addr.to_string();
    // HTTP/2 PINGs find a connection to a node that rebooted or vanished dead in
    // seconds, so a pooled channel reconnects instead of a call waiting out its deadline.
    let channel = Endpoint::try_from(format!("http://{addr}"))?
        .http2_keep_alive_interval(crate::client::KEEPALIVE)
        .keep_alive_timeout(crate::client::KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let (addr, name, connector) = (addr.clone(), name.clone(), connector.clone());
            async move {
                let tcp = tokio::net::TcpStream::connect(&addr).await?;
                // tonic sets TCP_NODELAY only on connections it dials itself: without it
                // each call waits for a delayed ACK (about 40 ms per round trip).
                tcp.set_nodelay(true)?;
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .context("connecting with mutual TLS")?;
    Ok(channel)
}
