//! The remote API: gRPC over TCP with mutual TLS (rustls), client identities mapped to
//! roles by an allowlist, and certificates reloaded when their files change.
//!
//! - The server presents `api.tcp.cert`/`api.tcp.key` and requires a client certificate
//!   signed by `api.tcp.client_ca` (rustls' `WebPkiClientVerifier`); ALPN is `h2`.
//! - A verified client's identities are its URI SANs, DNS SANs and subject CN (in that
//!   order); the first that appears in `[[api.tcp.clients]]` gives its role. A valid
//!   certificate that is not on the allowlist gets `PERMISSION_DENIED`.
//! - Before each handshake the three files' modification times are compared with the
//!   loaded ones; a change reloads them (rotation without restart). A reload that fails
//!   keeps the previous configuration and logs why.
//! - Plain TCP is refused, except `api.tcp.insecure_loopback = true` on a loopback address
//!   (for local tests), whose callers get `api.tcp.insecure_loopback_role`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::SystemTime;

use anyhow::Context as _;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::Role;
use crate::config::TcpConfig;

/// Who is on the other end of a TCP connection.
#[derive(Debug, Clone)]
pub struct TlsPeer {
    /// Remote address.
    pub remote: Option<SocketAddr>,
    /// Identities from the client certificate (URI SANs, DNS SANs, CN); empty for plain
    /// loopback connections.
    pub identities: Vec<String>,
    /// The role the allowlist gives, or None when no identity is listed.
    pub role: Option<Role>,
}

/// A TCP connection after the TLS handshake (or a plain loopback one).
#[derive(Debug)]
pub enum Conn {
    /// Mutual TLS.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>, TlsPeer),
    /// Plain TCP on loopback (insecure_loopback).
    Plain(TcpStream, TlsPeer),
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = TlsPeer;
    fn connect_info(&self) -> TlsPeer {
        match self {
            Conn::Tls(_, p) | Conn::Plain(_, p) => p.clone(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Tls(s, _) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Conn::Plain(s, _) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Tls(s, _) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Conn::Plain(s, _) => Pin::new(s).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Tls(s, _) => Pin::new(s.as_mut()).poll_flush(cx),
            Conn::Plain(s, _) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Tls(s, _) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Conn::Plain(s, _) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// The rustls crypto provider every TLS endpoint of this crate uses (ring).
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate chain and its private key from PEM files; errors name the config keys
/// (`section` `.cert` / `.key`, e.g. `api.tcp`) and the file.
pub fn load_identity(
    section: &str,
    cert: &Path,
    key: &Path,
) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("{section}.cert {}", cert.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("{section}.cert {}: not PEM certificates", cert.display()))?;
    if certs.is_empty() {
        anyhow::bail!(
            "{section}.cert {}: no certificate in the file",
            cert.display()
        );
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("{section}.key {}: no PEM private key", key.display()))?;
    Ok((certs, key))
}

/// Builds the rustls server config from the three PEM files.
pub fn server_config(cert: &Path, key: &Path, client_ca: &Path) -> anyhow::Result<ServerConfig> {
    let (certs, key) = load_identity("api.tcp", cert, key)?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(client_ca)
        .with_context(|| format!("api.tcp.client_ca {}", client_ca.display()))?
    {
        roots
            .add(c.with_context(|| format!("api.tcp.client_ca {}: not PEM", client_ca.display()))?)
            .with_context(|| format!("api.tcp.client_ca {}", client_ca.display()))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .context("building the client certificate verifier")?;
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .context("api.tcp.cert and api.tcp.key do not match")?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// Identities of a client certificate: URI SANs, DNS SANs, then the subject CN.
pub fn identities(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::URI(u) = n {
                out.push(u.to_string());
            }
        }
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                out.push(d.to_string());
            }
        }
    }
    for cn in cert.subject().iter_common_name() {
        if let Ok(s) = cn.as_str() {
            out.push(s.to_string());
        }
    }
    out
}

struct Loaded {
    config: Arc<ServerConfig>,
    stamps: Vec<Option<SystemTime>>,
}

/// Builds a rustls server config from the files an [`Acceptor`] watches.
pub type Builder = fn(&[PathBuf]) -> anyhow::Result<ServerConfig>;

/// The TLS acceptor with reload on change: the config is rebuilt when a watched file's
/// mtime changes (cert-manager and similar rotate files in place), and a rebuild that
/// fails keeps the previous config.
pub struct Acceptor {
    files: Vec<PathBuf>,
    build: Builder,
    loaded: Mutex<Loaded>,
}

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor")
            .field("files", &self.files)
            .finish()
    }
}

fn stamps(files: &[PathBuf]) -> Vec<Option<SystemTime>> {
    files
        .iter()
        .map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok())
        .collect()
}

impl Acceptor {
    /// Loads the certificates; errors name the config key and the file.
    pub fn new(cfg: &TcpConfig) -> anyhow::Result<Acceptor> {
        let files = vec![
            PathBuf::from(&cfg.cert),
            PathBuf::from(&cfg.key),
            PathBuf::from(&cfg.client_ca),
        ];
        Acceptor::with_builder(files, |f| server_config(&f[0], &f[1], &f[2]))
    }

    /// An acceptor over `files`, built (and rebuilt on change) by `build`.
    pub fn with_builder(files: Vec<PathBuf>, build: Builder) -> anyhow::Result<Acceptor> {
        let config = Arc::new(build(&files)?);
        Ok(Acceptor {
            loaded: Mutex::new(Loaded {
                config,
                stamps: stamps(&files),
            }),
            files,
            build,
        })
    }

    /// The current config, reloaded first if a file changed.
    pub fn current(&self) -> Arc<ServerConfig> {
        let mut l = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        let now = stamps(&self.files);
        if now != l.stamps {
            match (self.build)(&self.files) {
                Ok(c) => {
                    tracing::info!("TLS certificates reloaded");
                    l.config = Arc::new(c);
                    l.stamps = now;
                }
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "TLS certificates changed but do not load; keeping the previous ones");
                }
            }
        }
        l.config.clone()
    }
}

/// Role of a set of identities per the allowlist.
pub fn role_for(cfg: &TcpConfig, ids: &[String]) -> Option<Role> {
    ids.iter().find_map(|id| {
        cfg.clients
            .iter()
            .find(|c| &c.identity == id)
            .map(|c| match c.role {
                crate::config::ClientRole::Admin => Role::Admin,
                crate::config::ClientRole::Reader => Role::Reader,
            })
    })
}

/// Accepts TCP connections on `listener`, performs the TLS handshake (concurrently, with a
/// 10 s limit) and yields ready connections.
pub fn incoming(
    listener: tokio::net::TcpListener,
    cfg: TcpConfig,
    acceptor: Option<Arc<Acceptor>>,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<Conn>> {
    let (tx, rx) = tokio::sync::mpsc::channel(32);
    tokio::spawn(async move {
        loop {
            let (stream, remote) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a TCP connection");
                    continue;
                }
            };
            let tx = tx.clone();
            let cfg = cfg.clone();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let conn = match acceptor {
                    None => {
                        let role = Some(match cfg.insecure_loopback_role {
                            crate::config::ClientRole::Admin => Role::Admin,
                            crate::config::ClientRole::Reader => Role::Reader,
                        });
                        Conn::Plain(
                            stream,
                            TlsPeer {
                                remote: Some(remote),
                                identities: vec![],
                                role,
                            },
                        )
                    }
                    Some(a) => {
                        let tls = tokio_rustls::TlsAcceptor::from(a.current());
                        let hs = tokio::time::timeout(
                            std::time::Duration::from_secs(10),
                            tls.accept(stream),
                        )
                        .await;
                        let s = match hs {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                tracing::info!(%remote, error = %e, "TLS handshake refused");
                                return;
                            }
                            Err(_) => {
                                tracing::info!(%remote, "TLS handshake timed out");
                                return;
                            }
                        };
                        let ids = s
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .map(|c| identities(c.as_ref()))
                            .unwrap_or_default();
                        let role = role_for(&cfg, &ids);
                        Conn::Tls(
                            Box::new(s),
                            TlsPeer {
                                remote: Some(remote),
                                identities: ids,
                                role,
                            },
                        )
                    }
                };
                let _ = tx.send(Ok(conn)).await;
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
