//! Downloads for `source = "url"`: each binary of the target version from the
//! configured mirror of the upstream release layout
//! (`https://dl.k8s.io/release/{version}/bin/linux/{arch}/{binary}`, see
//! <https://kubernetes.io/releases/download/#binaries>), authenticated and checked
//! before anything is installed.
//!
//! - `https` only: the config refuses an `http://` template
//!   ([`KubernetesConfig::validate`]) and the client refuses any `http` request, so a
//!   redirect to `http` fails the download (ureq's `https_only`, which covers redirects).
//! - Authentic, not only intact: with `kubernetes.verify_signatures` (the default) each
//!   binary's `.cert` and `.sig` are checked ([`super::signature`]) so that the
//!   checksum does not come only from the mirror; the `.sha256` is checked too.
//! - Streamed: the body goes through a 64 KiB buffer into a file of a root-only (0700)
//!   staging directory under the agent's state directory ([`Staging`]), hashed while
//!   it is written; memory does not grow with the binary's size. The install streams
//!   from that file ([`Staged`]).
//!
//! HTTP is [`ureq`] with rustls (the built-in web PKI roots, or the configured CA
//! bundle), the configured proxy, a timeout per request and a size limit per binary.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{AtFlags, Mode, OFlags};
use sha2::{Digest, Sha256};

use super::Version;
use super::config::KubernetesConfig;
use super::signature::{self, SignatureError, TrustRoot};
use super::source;

/// A failed download or check: the URL and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FetchError {
    /// The agent config can not make a client (the CA bundle or the proxy).
    #[error("kubernetes.{key}: {message}")]
    Config {
        /// The `[kubernetes]` key.
        key: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The request failed or the server answered an error.
    #[error("GET {url}: {message}")]
    Http {
        /// The URL.
        url: String,
        /// Status or transport error.
        message: String,
    },
    /// The checksum file holds no SHA-256.
    #[error("{url} holds no SHA-256 (expected 64 hex digits as in the upstream release layout)")]
    BadChecksumFile {
        /// The checksum URL.
        url: String,
    },
    /// The binary's SHA-256 is not the published one.
    #[error(
        "{url}: SHA-256 is {actual}, its checksum file says {expected}; nothing was installed (a corrupt mirror or a wrong URL template)"
    )]
    Mismatch {
        /// The binary URL.
        url: String,
        /// Published digest.
        expected: String,
        /// Digest of the bytes downloaded.
        actual: String,
    },
    /// The signature or its certificate is not accepted.
    #[error("{0}")]
    Signature(#[from] SignatureError),
    /// The staging directory or file can not be used.
    #[error("staging {path}: {message}")]
    Staging {
        /// The staging path.
        path: String,
        /// What failed.
        message: String,
    },
}

/// What a downloaded binary is checked against.
#[derive(Debug, Clone)]
pub(crate) enum Verification {
    /// Upstream's sigstore signature (and the `.sha256`).
    Signed {
        /// The Fulcio roots and intermediates.
        root: TrustRoot,
        /// The signing identity (certificate SAN).
        identity: String,
        /// Its OIDC issuer.
        issuer: String,
    },
    /// Only the mirror's own `.sha256` (`kubernetes.verify_signatures = false`).
    ChecksumOnly,
}

impl Verification {
    /// From `[kubernetes]`: reads the trust anchor when signatures are required.
    pub(crate) fn from_config(config: &KubernetesConfig) -> Result<Verification, FetchError> {
        if !config.verify_signatures {
            return Ok(Verification::ChecksumOnly);
        }
        Ok(Verification::Signed {
            root: TrustRoot::load(&config.fulcio_roots)?,
            identity: config.signature_identity.clone(),
            issuer: config.signature_issuer.clone(),
        })
    }
}

/// What the `url` source checks, for coverage reasons and operation actions: never more
/// than [`super::signature`] verifies.
pub(crate) fn describe(config: &KubernetesConfig) -> String {
    if config.verify_signatures {
        format!(
            "each verified against a sigstore signature by {} (OIDC issuer {}, certificate chained to the Fulcio roots in {}; no transparency-log check) and its SHA-256",
            config.signature_identity, config.signature_issuer, config.fulcio_roots
        )
    } else {
        "checked only against the mirror's own .sha256, not authenticated (kubernetes.verify_signatures = false)".into()
    }
}

/// Before coverage promises an upgrade from the `url` source: the version is signed
/// upstream (v1.26.0 on) and the trust anchor loads when signatures are required, and
/// each binary's `.sha256` (and `.sig`, `.cert`) answers a `HEAD` (no side effects).
pub(crate) fn preflight(
    client: &Client,
    config: &KubernetesConfig,
    to: Version,
) -> Result<(), String> {
    if config.verify_signatures {
        if to < signature::FIRST_SIGNED {
            return Err(format!(
                "upstream signs the Kubernetes binaries from {} on, {to} has no signatures to verify (kubernetes.verify_signatures = false installs it checked only against the mirror's .sha256)",
                signature::FIRST_SIGNED
            ));
        }
        TrustRoot::load(&config.fulcio_roots).map_err(|e| e.to_string())?;
    }
    for b in config.binaries() {
        let url = source::binary_url(config, to, b);
        client.exists(&source::checksum_url(&url)).map_err(|e| {
            format!("the checksum file of {b} {to} is not available ({e}); inplaced installs only binaries it can verify")
        })?;
        if config.verify_signatures {
            for u in [source::signature_url(&url), source::certificate_url(&url)] {
                client.exists(&u).map_err(|e| {
                    format!("the signature of {b} {to} is not available ({e}); inplaced installs only binaries it can verify")
                })?;
            }
        }
    }
    Ok(())
}

/// `url` without the credentials of its user-info part (`https://user:secret@host/…` →
/// `https://…@host/…`), for messages: a mirror URL may carry them, messages never do.
/// Everything up to the last `@` before the path is cut, and a password written with an
/// unencoded `/` (not valid in RFC 3986 user-info, but typed) is cut as well: the cut
/// reaches the last `@` of the whole URL when the host part holds no `@`.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@').or_else(|| rest.rfind('@')) {
        Some(at) => format!("{scheme}://…{}", &rest[at..]),
        None => url.to_string(),
    }
}

/// An HTTP client built from `[kubernetes]`: `https` only, redirects included.
#[derive(Debug)]
pub(crate) struct Client {
    agent: ureq::Agent,
    limit: u64,
}

/// The buffer a download streams through, in bytes.
pub(crate) const STREAM_BUFFER: usize = 64 * 1024;

impl Client {
    /// A client with the config's CA bundle, proxy and timeout.
    pub(crate) fn new(config: &KubernetesConfig) -> Result<Client, FetchError> {
        let mut b = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(config.timeout_secs.max(1))))
            .http_status_as_error(false)
            .https_only(true)
            .max_redirects(5);
        if !config.proxy.is_empty() {
            let p = ureq::Proxy::new(&config.proxy).map_err(|e| FetchError::Config {
                key: "proxy",
                message: format!("{:?} is not a proxy URL: {e}", redact_url(&config.proxy)),
            })?;
            b = b.proxy(Some(p));
        } else {
            b = b.proxy(None);
        }
        if !config.ca_bundle.is_empty() {
            b = b.tls_config(tls_with_bundle(&config.ca_bundle)?);
        }
        Ok(Client {
            agent: b.build().into(),
            limit: config.max_download_bytes,
        })
    }

    /// `HEAD url` answers 2xx: the file exists (no side effects).
    pub(crate) fn exists(&self, url: &str) -> Result<(), FetchError> {
        let resp = self.agent.head(url).call().map_err(|e| transport(url, e))?;
        let status = resp.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(http(url, format!("HEAD answered {status}")))
        }
    }

    /// The size `HEAD url` gives (`Content-Length`), None when it gives none (the diff
    /// view's after size of a binary, [`crate::sections::kubernetes::diff`]).
    pub(crate) fn size(&self, url: &str) -> Result<Option<u64>, FetchError> {
        let resp = self.agent.head(url).call().map_err(|e| transport(url, e))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(http(url, format!("HEAD answered {status}")));
        }
        Ok(resp
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok()))
    }

    /// The body of `GET url`, at most `limit` bytes (the small `.sha256`, `.sig`,
    /// `.cert` files; binaries go through [`Client::download`]).
    pub(crate) fn get(&self, url: &str, limit: u64) -> Result<Vec<u8>, FetchError> {
        let mut resp = self.agent.get(url).call().map_err(|e| transport(url, e))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(http(url, format!("answered {status}")));
        }
        resp.body_mut()
            .with_config()
            .limit(limit)
            .read_to_vec()
            .map_err(|e| http(url, format!("{e} (limit {limit} bytes)")))
    }

    /// Streams the body of `GET url` into `out` through a [`STREAM_BUFFER`], hashing
    /// it; at most `kubernetes.max_download_bytes`. Returns the SHA-256 and the size.
    pub(crate) fn download(
        &self,
        url: &str,
        out: &mut dyn Write,
        out_name: &str,
    ) -> Result<([u8; 32], u64), FetchError> {
        let mut resp = self.agent.get(url).call().map_err(|e| transport(url, e))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(http(url, format!("answered {status}")));
        }
        let limit = self.limit;
        let mut reader = resp.body_mut().with_config().limit(limit).reader();
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; STREAM_BUFFER];
        let mut size = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(http(
                        url,
                        format!("{e} (limit {limit} bytes, kubernetes.max_download_bytes)"),
                    ));
                }
            };
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(|e| staging_err(out_name, format!("write: {e}")))?;
            size += n as u64;
        }
        Ok((hasher.finalize().into(), size))
    }

    /// Downloads the binary at `url` into `staging` as `name` and verifies it: the
    /// signature first when required (its certificate before the download), then the
    /// `.sha256`. Nothing is installed here.
    pub(crate) fn fetch_verified(
        &self,
        url: &str,
        staging: &mut Staging,
        name: &str,
        verification: &Verification,
    ) -> Result<Staged, FetchError> {
        let signed = match verification {
            Verification::Signed {
                root,
                identity,
                issuer,
            } => {
                let cert_url = source::certificate_url(url);
                let certs = signature::parse_cert_file(
                    &redact_url(&cert_url),
                    &self.get(&cert_url, 64 * 1024)?,
                )?;
                let signer = signature::verify_certificate(
                    &redact_url(&cert_url),
                    &certs,
                    root,
                    identity,
                    issuer,
                )?;
                let sig_url = redact_url(&source::signature_url(url));
                let sig = signature::parse_sig_file(
                    &sig_url,
                    &self.get(&source::signature_url(url), 4096)?,
                )?;
                Some((signer, sig, sig_url))
            }
            Verification::ChecksumOnly => None,
        };
        let sum_url = source::checksum_url(url);
        let text = self.get(&sum_url, 4096)?;
        let expected =
            source::parse_checksum(&String::from_utf8_lossy(&text)).ok_or_else(|| {
                FetchError::BadChecksumFile {
                    url: redact_url(&sum_url),
                }
            })?;
        let (mut file, path) = staging.create(name)?;
        let (digest, size) = self.download(url, &mut file, &path)?;
        if let Some((signer, sig, sig_url)) = &signed {
            signature::verify_digest(sig_url, signer, sig, &digest)?;
        }
        let actual = hex::encode(digest);
        if actual != expected {
            return Err(FetchError::Mismatch {
                url: redact_url(url),
                expected,
                actual,
            });
        }
        Ok(Staged {
            file,
            sha256: actual,
            size,
        })
    }
}

fn http(url: &str, message: String) -> FetchError {
    FetchError::Http {
        url: redact_url(url),
        message,
    }
}

fn transport(url: &str, e: ureq::Error) -> FetchError {
    match e {
        ureq::Error::RequireHttpsOnly(to) => http(
            url,
            format!(
                "refused {}: Kubernetes binaries are downloaded over https only (a redirect to plain http fails the download)",
                redact_url(&to)
            ),
        ),
        e => http(url, e.to_string()),
    }
}

fn staging_err(path: &str, message: String) -> FetchError {
    FetchError::Staging {
        path: path.to_string(),
        message,
    }
}

/// A verified binary in the staging directory, read back by the install.
#[derive(Debug)]
pub(crate) struct Staged {
    /// The staging file (0600), open for reading and writing.
    pub file: std::fs::File,
    /// Its SHA-256, hex.
    pub sha256: String,
    /// Its size in bytes.
    pub size: u64,
}

/// The root-only staging directory `<state dir>/kubernetes-staging` (0700, owned by the
/// agent's user): files are created `O_EXCL|O_NOFOLLOW` 0600 relative to its open
/// descriptor, so no path is followed twice; what a crashed run left is removed when it
/// is opened, and the files of this run when it is dropped.
#[derive(Debug)]
pub(crate) struct Staging {
    dir: OwnedFd,
    path: PathBuf,
    names: Vec<String>,
}

/// The staging directory's name under the state directory.
pub(crate) const STAGING_DIR: &str = "kubernetes-staging";

impl Staging {
    /// Opens (creating) the staging directory under `state_dir`, emptied.
    pub(crate) fn open(state_dir: &Path) -> Result<Staging, FetchError> {
        let path = state_dir.join(STAGING_DIR);
        let shown = path.display().to_string();
        let err = |op: &str, e: rustix::io::Errno| staging_err(&shown, format!("{op}: {e}"));
        let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let state = rustix::fs::open(state_dir, dir_flags, Mode::empty())
            .map_err(|e| err("open the state directory", e))?;
        match rustix::fs::mkdirat(&state, STAGING_DIR, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(err("mkdir", e)),
        }
        let dir = rustix::fs::openat(&state, STAGING_DIR, dir_flags, Mode::empty())
            .map_err(|e| err("open (a directory, not a symlink)", e))?;
        let st = rustix::fs::fstat(&dir).map_err(|e| err("stat", e))?;
        if st.st_uid != rustix::process::geteuid().as_raw() {
            return Err(staging_err(
                &shown,
                format!("owned by uid {}, not the agent's user", st.st_uid),
            ));
        }
        rustix::fs::fchmod(&dir, Mode::from_raw_mode(0o700)).map_err(|e| err("chmod", e))?;
        let staging = Staging {
            dir,
            path,
            names: Vec::new(),
        };
        staging.clear()?;
        Ok(staging)
    }

    fn clear(&self) -> Result<(), FetchError> {
        let shown = self.path.display().to_string();
        let dup = rustix::io::dup(&self.dir).map_err(|e| staging_err(&shown, e.to_string()))?;
        let entries = rustix::fs::Dir::read_from(dup)
            .map_err(|e| staging_err(&shown, format!("list: {e}")))?;
        for entry in entries {
            let entry = entry.map_err(|e| staging_err(&shown, format!("list: {e}")))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            rustix::fs::unlinkat(&self.dir, entry.file_name(), AtFlags::empty())
                .map_err(|e| staging_err(&shown, format!("remove a leftover: {e}")))?;
        }
        Ok(())
    }

    /// Creates the staging file `name` (0600, `O_EXCL|O_NOFOLLOW`), replacing one of
    /// this run; returns it and its path for messages.
    pub(crate) fn create(&mut self, name: &str) -> Result<(std::fs::File, String), FetchError> {
        let shown = format!("{}/{name}", self.path.display());
        match rustix::fs::unlinkat(&self.dir, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(staging_err(&shown, format!("remove: {e}"))),
        }
        let fd = rustix::fs::openat(
            &self.dir,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| staging_err(&shown, format!("create: {e}")))?;
        self.names.push(name.to_string());
        Ok((std::fs::File::from(fd), shown))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = rustix::fs::unlinkat(&self.dir, n.as_str(), AtFlags::empty());
        }
    }
}

/// TLS trusting only the certificates of the PEM bundle at `path` (a host path).
fn tls_with_bundle(path: &str) -> Result<ureq::tls::TlsConfig, FetchError> {
    let bad = |message: String| FetchError::Config {
        key: "ca_bundle",
        message,
    };
    let pem = std::fs::read(path).map_err(|e| bad(format!("{path}: {e}")))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => return Err(bad(format!("{path}: {e}"))),
        }
    }
    if certs.is_empty() {
        return Err(bad(format!("{path} holds no PEM certificate")));
    }
    Ok(ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::new_with_certs(&certs))
        .build())
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn credentials_never_reach_a_message() {
        for (url, shown) in [
            (
                "https://bob:secret@mirror.example/release/v1.35.2/kubelet",
                "https://…@mirror.example/release/v1.35.2/kubelet",
            ),
            // an unencoded `/` in the password (break-it finding: it was shown whole)
            (
                "https://bob:pa/ss@mirror.example/release/kubelet",
                "https://…@mirror.example/release/kubelet",
            ),
            (
                "https://mirror.example/release/kubelet",
                "https://mirror.example/release/kubelet",
            ),
        ] {
            assert_eq!(redact_url(url), shown);
        }
    }

    #[test]
    fn credentials_never_reach_messages() {
        assert_eq!(
            redact_url("https://bob:s3cret@mirror.example/release/v1.35.2/kubelet"),
            "https://…@mirror.example/release/v1.35.2/kubelet"
        );
        // an `@` after the first `/` can not be told apart from a password holding an
        // unencoded `/`: everything before it is cut (a message loses some of its path)
        assert_eq!(redact_url("http://127.0.0.1:8080/a@b"), "http://…@b");
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
