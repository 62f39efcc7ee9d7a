//! The remote API: gRPC over TCP with mutual TLS (rustls), client identities mapped to
//! roles by an allowlist, and certificates reloaded when their files change.
//!
//! - The server presents `api.tcp.cert`/`api.tcp.key` and requires a client certificate
//!   signed by `api.tcp.client_ca` (rustls' `WebPkiClientVerifier`); ALPN is `h2`.
//! - A verified client's names are its URI SANs, DNS SANs and subject CN; the first entry
//!   of `[[api.tcp.clients]]` that matches gives its role ([`CertNames::matches`]: an
//!   entry is compared with one kind of name, URI for an identity with a scheme, else DNS,
//!   and the CN only when it says `match = "cn"`). A valid certificate that is not on the
//!   allowlist is disconnected right after the handshake.
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

use super::closer::{Closer, Side};
use super::handshakes::Ticket;
use super::refusals::Reason;
use crate::listener::Role;
use crate::listener::TcpConfig;

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
    /// The identity of the `[[api.tcp.clients]]` entry that admitted the connection (the
    /// first that matches its certificate, which gives its role); None on plain loopback.
    pub entry: Option<String>,
    /// A reader identity's calls in flight (`api.tcp.calls_per_reader`, shared by its
    /// connections; [`crate::calls::ReaderCallsLayer`]); None for admins.
    pub calls: Option<Arc<tokio::sync::Semaphore>>,
    /// Closes this connection ([`crate::closer`]).
    pub closer: crate::closer::Closer,
}

/// A TCP connection after the TLS handshake (or a plain loopback one), holding its
/// descriptor's permit and its place ([`super::places`]) until it closes; its reads and
/// writes fail once its peer's [`TlsPeer::closer`] closes it.
#[derive(Debug)]
pub struct Conn {
    io: Io,
    peer: TlsPeer,
    _held: (
        tokio::sync::OwnedSemaphorePermit,
        Option<super::places::Place>,
    ),
}

#[derive(Debug)]
enum Io {
    /// Mutual TLS.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// Plain TCP on loopback (insecure_loopback).
    Plain(TcpStream),
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = TlsPeer;
    fn connect_info(&self) -> TlsPeer {
        self.peer.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        this.peer.closer.check(Side::Read, cx)?;
        match &mut this.io {
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        this.peer.closer.check(Side::Write, cx)?;
        match &mut this.io {
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        this.peer.closer.check(Side::Write, cx)?;
        match &mut this.io {
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        this.peer.closer.check(Side::Write, cx)?;
        match &mut this.io {
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
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

/// A rustls server config that presents `cert`/`key` and requires a client certificate
/// signed by a CA of the PEM bundle `client_ca` (rustls' `WebPkiClientVerifier`: chain,
/// validity and the clientAuth extended key usage); `section` names the config keys in
/// errors (`api.tcp`, `server`), `alpn` the protocol served.
pub fn mutual_tls_config(
    section: &str,
    cert: &Path,
    key: &Path,
    client_ca: &Path,
    alpn: &[u8],
) -> anyhow::Result<ServerConfig> {
    let (certs, key) = load_identity(section, cert, key)?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(client_ca)
        .with_context(|| format!("{section}.client_ca {}", client_ca.display()))?
    {
        roots
            .add(
                c.with_context(|| format!("{section}.client_ca {}: not PEM", client_ca.display()))?,
            )
            .with_context(|| format!("{section}.client_ca {}", client_ca.display()))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .with_context(|| format!("{section}.client_ca {}: no usable CA", client_ca.display()))?;
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| pairing_error(e, &format!("{section}.cert"), &format!("{section}.key")))?;
    cfg.alpn_protocols = vec![alpn.to_vec()];
    Ok(cfg)
}

/// Words rustls' refusal of a certificate chain with its private key (`cert` and `key` name
/// them as the user gave them). rustls refuses the pair for two different reasons, which
/// were reported as one: a key that is not the certificate's (`InconsistentKeys`), and an
/// end-entity certificate webpki can not parse, most often an X.509 v1 certificate
/// (`UnsupportedCertVersion`), which `openssl x509 -req` makes when the extensions are not
/// given with `-extfile` (it copies none from the request).
pub(crate) fn pairing_error(e: rustls::Error, cert: &str, key: &str) -> anyhow::Error {
    match e {
        rustls::Error::InconsistentKeys(_) => {
            anyhow::anyhow!("{cert} and {key} do not match: the key is not the certificate's")
        }
        rustls::Error::InvalidCertificate(c) => anyhow::anyhow!(
            "{cert} is not a usable certificate ({c:?}): it must be X.509 v3 with its \
             extensions (subjectAltName, extendedKeyUsage); `openssl x509 -req` copies none \
             from the request, so give them with -extfile"
        ),
        other => anyhow::anyhow!("{cert} with {key}: {other}"),
    }
}

/// `[api.tcp]`'s certificate, key and client CA.
fn tcp_files(cfg: &TcpConfig) -> Vec<PathBuf> {
    vec![
        PathBuf::from(&cfg.cert),
        PathBuf::from(&cfg.key),
        PathBuf::from(&cfg.client_ca),
    ]
}

/// The StrictModes rule ([`inplace_node::trust`]) over `[api.tcp]`'s three files, at every
/// load, reloads included: a certificate or key another user could have swapped in is
/// never used (a failed reload keeps the previous config and logs why).
fn trusted(files: &[PathBuf]) -> anyhow::Result<()> {
    for (p, key) in files
        .iter()
        .zip(["api.tcp.cert", "api.tcp.key", "api.tcp.client_ca"])
    {
        inplace_node::trust::read_host(p).with_context(|| format!("{key} {}", p.display()))?;
    }
    Ok(())
}

/// Builds the agent's rustls server config from the three PEM files (ALPN `h2`).
pub fn server_config(cert: &Path, key: &Path, client_ca: &Path) -> anyhow::Result<ServerConfig> {
    mutual_tls_config("api.tcp", cert, key, client_ca, b"h2")
}

/// The names a client certificate carries, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertNames {
    /// URI SANs (SPIFFE IDs).
    pub uris: Vec<String>,
    /// DNS SANs.
    pub dns: Vec<String>,
    /// Subject common names.
    pub cns: Vec<String>,
}

impl CertNames {
    /// The names of a DER certificate (none when it does not parse).
    pub fn of(der: &[u8]) -> CertNames {
        let mut out = CertNames::default();
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
            return out;
        };
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for n in &san.value.general_names {
                match n {
                    x509_parser::extensions::GeneralName::URI(u) => out.uris.push(u.to_string()),
                    x509_parser::extensions::GeneralName::DNSName(d) => out.dns.push(d.to_string()),
                    _ => {}
                }
            }
        }
        for cn in cert.subject().iter_common_name() {
            if let Ok(s) = cn.as_str() {
                out.cns.push(s.to_string());
            }
        }
        out
    }

    /// Every name, URI SANs first, then DNS SANs, then CNs (for messages and logs).
    pub fn all(&self) -> Vec<String> {
        [&self.uris, &self.dns, &self.cns]
            .into_iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// Whether the allowlist entry `identity` (with its declared `match` kind) names this
    /// certificate. The entry's kind ([`IdentityKind::of_entry`]: declared, else URI when
    /// the text has a scheme, else DNS) picks the one list of names compared; a
    /// certificate with no name of that kind never matches. So a certificate whose subject
    /// CN is the text of a URI or DNS entry, and which carries no such SAN, is refused: CN
    /// is free text that issuers commonly let the requester pick, and only an entry
    /// declared `match = "cn"` reads it (RFC 6125 §6.4.4 likewise does not read the CN as
    /// an identifier once SANs are the identity's kind; SPIFFE X.509-SVID §2 puts the ID in
    /// exactly one URI SAN).
    ///
    /// [`IdentityKind::of_entry`]: crate::listener::IdentityKind::of_entry
    pub fn matches(&self, identity: &str, kind: Option<crate::listener::IdentityKind>) -> bool {
        use crate::listener::IdentityKind;
        match IdentityKind::of_entry(identity, kind) {
            IdentityKind::Uri => self.uris.iter().any(|n| n == identity),
            // RFC 5280 §7.2 / RFC 6125 §6.4.1: DNS names compare case-insensitively, and
            // the absolute form (a trailing dot) names the same host
            IdentityKind::Dns => {
                let bare = |n: &str| n.strip_suffix('.').unwrap_or(n).to_ascii_lowercase();
                self.dns.iter().any(|n| bare(n) == bare(identity))
            }
            // RFC 6125 §6.4.4: the most specific (last) CN of the subject is the one read
            IdentityKind::Cn => self.cns.last().is_some_and(|n| n == identity),
        }
    }

    /// A hint for a refused certificate: the entries that its CN equals but that are not
    /// declared `match = "cn"` (so an allowlist written for the old rule, where a CN-only
    /// certificate matched an entry without `match`, says what to change). Empty when none.
    pub fn cn_hint<'a>(
        &self,
        entries: impl IntoIterator<Item = (&'a str, Option<crate::listener::IdentityKind>)>,
    ) -> String {
        use crate::listener::IdentityKind;
        let named: Vec<&str> = entries
            .into_iter()
            .filter(|(id, kind)| {
                IdentityKind::of_entry(id, *kind) != IdentityKind::Cn
                    && self.cns.iter().any(|c| c == id)
            })
            .map(|(id, _)| id)
            .collect();
        if named.is_empty() {
            return String::new();
        }
        format!(
            "; its subject CN equals the allowlist entries {named:?}, which compare SANs only: a CN is matched only by an entry with match = \"cn\" (and only for a CA that does not let requesters choose it)"
        )
    }
}

struct Loaded<T> {
    value: Arc<T>,
    stamps: Vec<Option<SystemTime>>,
}

/// Builds a value (a rustls config, an allowlist) from the files a [`Reloading`] watches.
pub type Builder<T> = fn(&[PathBuf]) -> anyhow::Result<T>;

/// A value built from files and rebuilt when one of them changes: before each use the
/// files' modification times are compared with the loaded ones (cert-manager, kubelet
/// ConfigMap and Secret mounts replace files in place or swap a symlink), and a rebuild
/// that fails keeps the previous value and logs why.
pub struct Reloading<T> {
    what: &'static str,
    files: Vec<PathBuf>,
    build: Builder<T>,
    loaded: Mutex<Loaded<T>>,
}

/// The TLS acceptor with reload on change.
pub type Acceptor = Reloading<ServerConfig>;

impl<T> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("what", &self.what)
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
        Acceptor::with_builder(tcp_files(cfg), |f| {
            trusted(f)?;
            server_config(&f[0], &f[1], &f[2])
        })
    }

    /// The acceptor of the agent's off-loopback metrics listener: the same files and
    /// rules as [`Acceptor::new`], ALPN `http/1.1` (it serves HTTP/1.1; the `h2`-only
    /// acceptor it shared made curl and Prometheus fail the handshake with "no
    /// application protocol").
    pub fn for_metrics(cfg: &TcpConfig) -> anyhow::Result<Acceptor> {
        Acceptor::with_builder(tcp_files(cfg), |f| {
            trusted(f)?;
            mutual_tls_config("api.tcp", &f[0], &f[1], &f[2], b"http/1.1")
        })
    }

    /// A TLS acceptor over `files`, built (and rebuilt on change) by `build`.
    pub fn with_builder(
        files: Vec<PathBuf>,
        build: Builder<ServerConfig>,
    ) -> anyhow::Result<Acceptor> {
        Reloading::watch("TLS certificates", files, build)
    }
}

impl<T> Reloading<T> {
    /// Builds the value from `files` (`what` names it in logs); the first build's error
    /// is returned as is.
    pub fn watch(
        what: &'static str,
        files: Vec<PathBuf>,
        build: Builder<T>,
    ) -> anyhow::Result<Self> {
        let value = Arc::new(build(&files)?);
        Ok(Reloading {
            what,
            loaded: Mutex::new(Loaded {
                value,
                stamps: stamps(&files),
            }),
            files,
            build,
        })
    }

    /// The current value, rebuilt first if a file changed.
    pub fn current(&self) -> Arc<T> {
        let mut l = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        let now = stamps(&self.files);
        if now != l.stamps {
            match (self.build)(&self.files) {
                Ok(c) => {
                    tracing::info!(what = self.what, "reloaded");
                    l.value = Arc::new(c);
                    l.stamps = now;
                }
                // Stamps stay old: a rotation caught half-way (key written, certificate
                // not yet) is retried on the next use.
                Err(e) => {
                    tracing::warn!(what = self.what, error = %format!("{e:#}"), "changed but does not load; keeping the previous one");
                }
            }
        }
        l.value.clone()
    }
}

/// Role of a certificate per the allowlist: the first entry that matches it
/// ([`CertNames::matches`]) gives the role.
pub fn role_for(cfg: &TcpConfig, names: &CertNames) -> Option<Role> {
    cfg.clients
        .iter()
        .find(|c| names.matches(&c.identity, c.kind))
        .map(|c| c.role)
}

/// How long a client has, from its connection, to send its ClientHello (one packet, sent
/// right after the TCP handshake; the time leaves room for retransmissions).
pub const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a TLS handshake may take in all, from the connection.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A connection dropped before it was served, and why.
#[derive(Debug)]
pub struct Refused {
    /// Why, for the metric.
    pub reason: Reason,
    /// Details for the log.
    pub error: String,
}

impl Refused {
    fn new(reason: Reason, error: impl Into<String>) -> Refused {
        Refused {
            reason,
            error: error.into(),
        }
    }

    fn of(e: &std::io::Error) -> Refused {
        Refused::new(Reason::of_handshake_error(e), e.to_string())
    }

    /// Counts it and logs it at the bounded rate of [`super::refusals`] (`listener` names
    /// the config section: `api.tcp`, `server`, `metrics.listen`).
    pub fn report(&self, listener: &'static str, remote: SocketAddr) {
        super::refusals::get().refused(listener, self.reason, "", || {
            tracing::info!(listener, %remote, reason = self.reason.label(), error = %self.error, "TLS handshake refused");
        });
    }
}

/// The server side of a TLS handshake on `stream` with the acceptor's current config
/// (read once the ClientHello is in, so an idle socket costs no file check): the stream
/// and the verified client certificate's names. Refused when the ClientHello does not
/// come within [`HELLO_TIMEOUT`], the handshake does not finish within
/// [`HANDSHAKE_TIMEOUT`], rustls refuses it, or `ticket` is dropped from the handshake
/// budget for a newer handshake ([`super::handshakes`]).
pub async fn handshake(
    acceptor: &Acceptor,
    stream: TcpStream,
    ticket: &mut Ticket,
) -> Result<(tokio_rustls::server::TlsStream<TcpStream>, CertNames), Refused> {
    let started = tokio::time::Instant::now();
    let tls = async {
        let hello =
            tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream);
        let start = match tokio::time::timeout(HELLO_TIMEOUT, hello).await {
            Err(_) => {
                return Err(Refused::new(
                    Reason::Timeout,
                    format!("no ClientHello within {HELLO_TIMEOUT:?}"),
                ));
            }
            Ok(r) => r.map_err(|e| Refused::of(&e))?,
        };
        let accept = start.into_stream(acceptor.current());
        match tokio::time::timeout_at(started + HANDSHAKE_TIMEOUT, accept).await {
            Err(_) => Err(Refused::new(
                Reason::Timeout,
                format!("handshake unfinished after {HANDSHAKE_TIMEOUT:?}"),
            )),
            Ok(r) => {
                let s = r.map_err(|e| Refused::of(&e))?;
                let names = peer_names(&s);
                Ok((s, names))
            }
        }
    };
    tokio::select! {
        r = tls => r,
        why = ticket.evicted() => Err(Refused::new(why, "dropped for a newer handshake")),
    }
}

/// The verified client certificate's names of a server-side TLS stream.
pub fn peer_names<IO>(s: &tokio_rustls::server::TlsStream<IO>) -> CertNames {
    s.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| CertNames::of(c.as_ref()))
        .unwrap_or_default()
}

/// Reports a verified certificate no allowlist entry matches (`key` names the list, e.g.
/// `api.tcp.clients`; `hint` is [`CertNames::cn_hint`] over its entries), with the message
/// the log has always had.
pub fn refuse_unlisted(
    listener: &'static str,
    key: &str,
    remote: SocketAddr,
    names: &CertNames,
    hint: &str,
) {
    let all = names.all();
    super::refusals::get().refused(listener, Reason::NotAllowlisted, &all.join(","), || {
        tracing::warn!(%remote, identities = ?all, "client certificate not on the allowlist ({key}): disconnected{hint}");
    });
}

/// [`CertNames::cn_hint`] over the agent's `[[api.tcp.clients]]`.
pub fn agent_hint(cfg: &TcpConfig, names: &CertNames) -> String {
    names.cn_hint(cfg.clients.iter().map(|c| (c.identity.as_str(), c.kind)))
}

/// Reports an authenticated connection refused for `reason` (a cap, [`super::places`]).
pub fn refuse_place(listener: &'static str, reason: Reason, remote: SocketAddr, names: &CertNames) {
    let all = names.all();
    super::refusals::get().refused(listener, reason, &all.join(","), || {
        tracing::warn!(listener, %remote, identities = ?all, reason = reason.label(), "no connection place for an authenticated client: disconnected");
    });
}

/// Accepts TCP connections on `listener` and yields them ready to serve, under the rules
/// of [`super::handshakes`] (before the handshake: `api.tcp.handshake_budget`,
/// `api.tcp.handshakes_per_source`, [`HELLO_TIMEOUT`], [`HANDSHAKE_TIMEOUT`]) and
/// [`super::places`] (after it: `api.tcp.max_connections`, `admin_connections`,
/// `connections_per_reader`, `calls_per_reader`). A verified certificate that no
/// `[[api.tcp.clients]]` entry matches is disconnected right after the handshake, before
/// any request (health and reflection included) is read. Open descriptors are bounded by
/// a [`super::accept::Gate`] of `handshake_budget + 2 × max_connections` (every pending
/// handshake, every place and as many waiting for one); plain loopback connections
/// (`insecure_loopback`) take `max_connections` places before they are accepted.
pub fn incoming(
    listener: tokio::net::TcpListener,
    cfg: TcpConfig,
    acceptor: Option<Arc<Acceptor>>,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<Conn>> {
    let (tx, rx) = tokio::sync::mpsc::channel(32);
    let places = super::places::Places::new(super::places::Limits {
        max_connections: cfg.max_connections,
        admin_connections: cfg.admin_connections,
        connections_per_reader: cfg.connections_per_reader,
        calls_per_reader: cfg.calls_per_reader,
    });
    let handshakes =
        super::handshakes::Handshakes::new(cfg.handshake_budget, cfg.handshakes_per_source);
    let gate = super::accept::Gate::new(match acceptor {
        None => cfg.max_connections,
        Some(_) => cfg.handshake_budget + 2 * cfg.max_connections,
    });
    tokio::spawn(async move {
        let mut backoff = super::accept::Backoff::default();
        loop {
            let a = super::accept::accept(&listener, &gate, &mut backoff, "api.tcp").await;
            // admitted here, in accept order, so eviction sees every pending handshake
            let ticket = acceptor.as_ref().map(|_| handshakes.admit(a.remote.ip()));
            let (tx, cfg, acceptor, places) =
                (tx.clone(), cfg.clone(), acceptor.clone(), places.clone());
            tokio::spawn(async move {
                if let Some(c) = connect(a, ticket, &cfg, acceptor.as_deref(), &places).await {
                    let _ = tx.send(Ok(c)).await;
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// One accepted connection made ready: handshake, allowlist, place; None when refused
/// (reported).
async fn connect(
    a: super::accept::Accepted,
    ticket: Option<Ticket>,
    cfg: &TcpConfig,
    acceptor: Option<&Acceptor>,
    places: &Arc<super::places::Places>,
) -> Option<Conn> {
    use super::places::Holder;
    let remote = a.remote;
    let (Some(acc), Some(mut ticket)) = (acceptor, ticket) else {
        let peer = TlsPeer {
            remote: Some(remote),
            identities: vec![],
            role: Some(cfg.insecure_loopback_role),
            entry: None,
            calls: None,
            closer: Closer::new(),
        };
        return Some(Conn {
            io: Io::Plain(a.stream),
            peer,
            _held: (a.permit, None),
        });
    };
    let handshaken = handshake(acc, a.stream, &mut ticket).await;
    drop(ticket);
    let (s, names) = handshaken.map_err(|r| r.report("api.tcp", remote)).ok()?;
    let Some(role) = role_for(cfg, &names) else {
        refuse_unlisted(
            "api.tcp",
            "api.tcp.clients",
            remote,
            &names,
            &agent_hint(cfg, &names),
        );
        return None;
    };
    // a reader's caps are its allowlist entry's (the first that matches, as role_for)
    let entry = cfg
        .clients
        .iter()
        .find(|c| names.matches(&c.identity, c.kind))
        .map_or(String::new(), |c| c.identity.clone());
    let who = match role {
        Role::Admin => Holder::Admin,
        Role::Reader => Holder::Reader(&entry),
    };
    let (place, calls) = match places.take(who).await {
        Ok(p) => p,
        Err(reason) => {
            refuse_place("api.tcp", reason, remote, &names);
            return None;
        }
    };
    let peer = TlsPeer {
        remote: Some(remote),
        identities: names.all(),
        role: Some(role),
        entry: Some(entry),
        calls,
        closer: Closer::new(),
    };
    Some(Conn {
        io: Io::Tls(Box::new(s)),
        peer,
        _held: (a.permit, Some(place)),
    })
}

#[cfg(test)]
mod tests {
    use super::CertNames;
    use crate::listener::IdentityKind;

    #[test]
    fn a_refused_pair_is_worded_by_its_reason() {
        let mismatch = super::pairing_error(
            rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch),
            "client certificate",
            "client key",
        );
        assert_eq!(
            mismatch.to_string(),
            "client certificate and client key do not match: the key is not the certificate's"
        );
        let v1 = super::pairing_error(
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding),
            "[api.tcp].cert",
            "[api.tcp].key",
        )
        .to_string();
        assert!(
            v1.starts_with(
                "[api.tcp].cert is not a usable certificate (BadEncoding): it must be X.509 v3"
            ),
            "{v1}"
        );
        assert!(
            v1.contains("-extfile") && !v1.contains("do not match"),
            "{v1}"
        );
    }

    fn names(uris: &[&str], dns: &[&str], cns: &[&str]) -> CertNames {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect();
        CertNames {
            uris: v(uris),
            dns: v(dns),
            cns: v(cns),
        }
    }

    #[test]
    fn an_entry_reads_one_kind_of_name() {
        let id = "spiffe://mgmt/ns/capi-system/sa/capi-manager";
        // a CN never passes for a URI or DNS entry
        assert!(!names(&[], &[], &[id]).matches(id, None));
        assert!(!names(&[], &["ops.example.com"], &[id]).matches(id, None));
        assert!(!names(&[], &[], &["ops.example.com"]).matches("ops.example.com", None));
        assert!(names(&[id], &[], &["x"]).matches(id, None));
        // URIs compare exactly (SPIFFE paths are case-sensitive)
        assert!(!names(&[&id.to_uppercase()], &[], &[]).matches(id, None));
        assert!(!names(&[&format!("{id}/")], &[], &[]).matches(id, None));
        // DNS names compare case-insensitively, the absolute form included (RFC 5280 §7.2)
        for san in ["OPS.example.com", "ops.example.com.", "ops.EXAMPLE.com"] {
            assert!(
                names(&[], &[san], &[]).matches("ops.example.com", None),
                "{san}"
            );
        }
        assert!(names(&[], &["ops.example.com"], &[]).matches("Ops.Example.com", None));
        assert!(!names(&[], &["*.example.com"], &[]).matches("ops.example.com", None));
        // a CN entry reads the last (most specific) CN only (RFC 6125 §6.4.4)
        let cn = Some(IdentityKind::Cn);
        assert!(names(&[], &[], &["a", "monitoring"]).matches("monitoring", cn));
        assert!(!names(&[], &[], &["monitoring", "stranger"]).matches("monitoring", cn));
        assert!(!names(&[], &["monitoring"], &[]).matches("monitoring", cn));
    }
}
