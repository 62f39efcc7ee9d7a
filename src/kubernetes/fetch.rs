//! Downloads for `source = "url"`: each binary of the target version from the
//! configured mirror of the upstream release layout
//! (`https://dl.k8s.io/release/{version}/bin/linux/{arch}/{binary}`, whose checksum is
//! the same URL plus `.sha256`, see
//! <https://kubernetes.io/releases/download/#binaries>), checked against its SHA-256
//! before anything is installed.
//!
//! HTTP is [`ureq`] with rustls (the built-in web PKI roots, or the configured CA
//! bundle), the configured proxy, a timeout per request and a size limit per binary.

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::config::KubernetesConfig;
use super::source;

/// A failed download or check: the URL and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
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
}

/// `url` without the credentials of its user-info part (`https://user:secret@host/…` →
/// `https://…@host/…`), for messages: a mirror URL may carry them, messages never do.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://…{}", &rest[at..]),
        None => url.to_string(),
    }
}

/// An HTTP client built from `[kubernetes]`.
#[derive(Debug)]
pub struct Client {
    agent: ureq::Agent,
    limit: u64,
}

impl Client {
    /// A client with the config's CA bundle, proxy and timeout.
    pub fn new(config: &KubernetesConfig) -> Result<Client, FetchError> {
        let mut b = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(config.timeout_secs.max(1))))
            .http_status_as_error(false)
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

    /// `HEAD url` answers 2xx: the checksum file of a version exists (no side effects).
    pub fn exists(&self, url: &str) -> Result<(), FetchError> {
        let http = |message: String| FetchError::Http {
            url: redact_url(url),
            message,
        };
        let resp = self
            .agent
            .head(url)
            .call()
            .map_err(|e| http(e.to_string()))?;
        let status = resp.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(http(format!("HEAD answered {status}")))
        }
    }

    /// The body of `GET url`, at most `limit` bytes.
    pub fn get(&self, url: &str, limit: u64) -> Result<Vec<u8>, FetchError> {
        let http = |message: String| FetchError::Http {
            url: redact_url(url),
            message,
        };
        let mut resp = self
            .agent
            .get(url)
            .call()
            .map_err(|e| http(e.to_string()))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(http(format!("answered {status}")));
        }
        resp.body_mut()
            .with_config()
            .limit(limit)
            .read_to_vec()
            .map_err(|e| {
                http(format!(
                    "{e} (limit {limit} bytes, kubernetes.max_download_bytes)"
                ))
            })
    }

    /// Downloads the binary at `url` and checks it against `url.sha256`.
    pub fn fetch_checked(&self, url: &str) -> Result<Vec<u8>, FetchError> {
        let sum_url = source::checksum_url(url);
        let text = self.get(&sum_url, 4096)?;
        let expected =
            source::parse_checksum(&String::from_utf8_lossy(&text)).ok_or_else(|| {
                FetchError::BadChecksumFile {
                    url: sum_url.clone(),
                }
            })?;
        let bytes = self.get(url, self.limit)?;
        let actual = hex::encode(Sha256::digest(&bytes));
        if actual != expected {
            return Err(FetchError::Mismatch {
                url: redact_url(url),
                expected,
                actual,
            });
        }
        Ok(bytes)
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
    fn credentials_never_reach_messages() {
        assert_eq!(
            redact_url("https://bob:s3cret@mirror.example/release/v1.35.2/kubelet"),
            "https://…@mirror.example/release/v1.35.2/kubelet"
        );
        assert_eq!(
            redact_url("http://127.0.0.1:8080/a@b"),
            "http://127.0.0.1:8080/a@b"
        );
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
