//! Authenticity of the Kubernetes release binaries: cosign keyless (sigstore) blob
//! signatures, verified offline against an explicit trust anchor.
//!
//! # What upstream publishes
//!
//! Since v1.26 the release process signs every binary artifact with cosign's keyless
//! signing and publishes `<binary>.sig` and `<binary>.cert` beside each binary on
//! `dl.k8s.io` (blog "Kubernetes 1.26: We're now signing our binary release artifacts!",
//! <https://kubernetes.io/blog/2022/12/12/kubernetes-release-artifact-signing/>). The
//! documented check is (<https://kubernetes.io/docs/tasks/administer-cluster/verify-signed-artifacts/>):
//!
//! ```text
//! cosign verify-blob kubectl --signature kubectl.sig --certificate kubectl.cert \
//!   --certificate-identity krel-staging@k8s-releng-prod.iam.gserviceaccount.com \
//!   --certificate-oidc-issuer https://accounts.google.com
//! ```
//!
//! The binaries are signed by `krel sign blobs` running as the
//! `krel-staging@k8s-releng-prod.iam.gserviceaccount.com` service account
//! (kubernetes/release `gcb/release/cloudbuild.yaml`: `GOOGLE_SERVICE_ACCOUNT_NAME` and
//! `--certificate-identity=krel-staging@… --certificate-oidc-issuer=https://accounts.google.com`;
//! `cmd/krel/cmd/sign_blobs.go` writes `<file>.sig` and `<file>.cert`);
//! `krel-trust@…` is the identity of the promoted container *images*, not of the
//! binaries. `.sig` is the base64 of a DER ECDSA signature, `.cert` the base64 of the
//! PEM of the Fulcio-issued leaf certificate (both are also accepted raw here). The
//! signature is ECDSA P-256 over the SHA-256 of the binary, so it is checked against
//! the digest computed while the binary streams to disk ([`verify_digest`]).
//!
//! # What is verified here, and what is not
//!
//! Verified, for each binary:
//! - the `.cert` chains (path building and signatures by rustls-webpki, ECDSA P-256/P-384)
//!   to a self-signed root in the configured PEM file `kubernetes.fulcio_roots`, through
//!   the intermediates in that file, every certificate valid at the leaf's own
//!   `notBefore`, the leaf's extended key usage includes code signing (1.3.6.1.5.5.7.3.3);
//! - a subject alternative name (e-mail or URI) equals `kubernetes.signature_identity`
//!   exactly;
//! - the OIDC issuer extension equals `kubernetes.signature_issuer` exactly: Fulcio's
//!   1.3.6.1.4.1.57264.1.8 (a DER UTF8String), else the deprecated
//!   1.3.6.1.4.1.57264.1.1 (raw bytes), per sigstore/fulcio `docs/oid-info.md`;
//! - the `.sig` is a valid ECDSA P-256 signature by the leaf's key over the SHA-256 of
//!   the bytes written to the staging file.
//!
//! Not verified (no network access to Rekor, no TUF client here):
//! - that the signature was made while the ~10 minute certificate was valid: cosign
//!   proves this with the Rekor transparency-log entry (its signed entry timestamp);
//!   here the chain is checked as of the certificate's `notBefore`, so a leaked
//!   ephemeral key of a genuine certificate could sign other bytes later;
//! - the certificate's SCTs (its inclusion in the CT log) and revocation;
//! - the freshness of the trust anchor: `kubernetes.fulcio_roots` is whatever the
//!   operator put there (sigstore distributes it through TUF, `trusted_root.json`).
//!
//! A mirror that serves another binary with a `.sha256` of its own fails here: it has
//! no signature by the identity over those bytes.
//!
//! # Why not the `sigstore` crate
//!
//! `sigstore` 0.14 calls itself experimental ("its API can change at any time"); its
//! `cert` feature switches rustls-webpki to aws-lc-rs (a C build next to the ring this
//! agent uses) and its `cosign` feature brings oci-client and reqwest. The check above
//! needs only a chain check (rustls-webpki, already linked through rustls) and an ECDSA
//! verification of a prehashed digest, which ring does not offer (it hashes the whole
//! message itself, so the binary would have to be in memory): `p256` does it.

use std::time::Duration;

use p256::ecdsa::signature::hazmat::PrehashVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use super::Version;

/// The identity that signs the release binaries (the SAN of their certificates).
pub(crate) const DEFAULT_IDENTITY: &str = "krel-staging@k8s-releng-prod.iam.gserviceaccount.com";
/// The OIDC issuer of that identity.
pub(crate) const DEFAULT_ISSUER: &str = "https://accounts.google.com";
/// The default path of the Fulcio root (and intermediate) PEM file.
pub(crate) const DEFAULT_FULCIO_ROOTS: &str = "/etc/inplaced/sigstore/fulcio.pem";
/// The first release whose binaries upstream signs.
pub(crate) const FIRST_SIGNED: Version = Version {
    major: 1,
    minor: 26,
    patch: 0,
};

/// Fulcio's OIDC issuer extension (V2, a DER UTF8String).
const OID_ISSUER_V2: &str = "1.3.6.1.4.1.57264.1.8";
/// Fulcio's deprecated OIDC issuer extension (raw bytes of the URL).
const OID_ISSUER_V1: &str = "1.3.6.1.4.1.57264.1.1";
/// id-kp-codeSigning, 1.3.6.1.5.5.7.3.3, DER content octets.
const EKU_CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];

/// Why a binary's signature is not accepted; each names the file and the key to check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SignatureError {
    /// The trust anchor file can not be used.
    #[error("kubernetes.fulcio_roots: {path}: {message}")]
    TrustAnchor {
        /// The configured path.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The `.sig` or `.cert` is not in the upstream format.
    #[error("{url}: {message}")]
    Format {
        /// The file's URL.
        url: String,
        /// What is wrong.
        message: String,
    },
    /// The certificate does not chain to the trust anchor.
    #[error(
        "{url}: the certificate is not issued by the Fulcio roots in {roots} (kubernetes.fulcio_roots): {message}"
    )]
    Chain {
        /// The certificate's URL.
        url: String,
        /// The trust anchor path.
        roots: String,
        /// The chain error.
        message: String,
    },
    /// No SAN equals the configured identity.
    #[error("{url}: the certificate is for {found}, not {want} (kubernetes.signature_identity)")]
    Identity {
        /// The certificate's URL.
        url: String,
        /// The SANs found.
        found: String,
        /// The configured identity.
        want: String,
    },
    /// The OIDC issuer is not the configured one.
    #[error(
        "{url}: the certificate's OIDC issuer is {found}, not {want} (kubernetes.signature_issuer)"
    )]
    Issuer {
        /// The certificate's URL.
        url: String,
        /// The issuer found (or "none").
        found: String,
        /// The configured issuer.
        want: String,
    },
    /// The signature is not by the certificate's key over these bytes.
    #[error(
        "{url}: the signature is not {identity}'s over the downloaded bytes (SHA-256 {digest}); nothing was installed (a mirror serving another binary, or a corrupt download)"
    )]
    Signature {
        /// The signature's URL.
        url: String,
        /// The certificate's identity.
        identity: String,
        /// The digest of the downloaded bytes.
        digest: String,
    },
}

/// The trust anchor: the self-signed Fulcio roots and the intermediates of one PEM file.
#[derive(Debug, Clone)]
pub(crate) struct TrustRoot {
    path: String,
    roots: Vec<CertificateDer<'static>>,
    intermediates: Vec<CertificateDer<'static>>,
}

impl TrustRoot {
    /// Reads the PEM file at `path` (a host path): self-signed certificates are roots,
    /// the others intermediates. Errors name `kubernetes.fulcio_roots`.
    pub(crate) fn load(path: &str) -> Result<TrustRoot, SignatureError> {
        let bad = |message: String| SignatureError::TrustAnchor {
            path: path.to_string(),
            message,
        };
        let pem = std::fs::read(path).map_err(|e| {
            bad(format!(
                "{e}; put the Fulcio root and intermediate certificates there (sigstore's trusted_root.json, or `cosign initialize`), or set kubernetes.verify_signatures = false"
            ))
        })?;
        let mut root = TrustRoot {
            path: path.to_string(),
            roots: Vec::new(),
            intermediates: Vec::new(),
        };
        for c in CertificateDer::pem_slice_iter(&pem) {
            let c = c.map_err(|e| bad(format!("not PEM certificates: {e}")))?;
            let (_, x) = X509Certificate::from_der(&c)
                .map_err(|e| bad(format!("a certificate does not parse: {e}")))?;
            if x.subject() == x.issuer() {
                root.roots.push(c);
            } else {
                root.intermediates.push(c);
            }
        }
        if root.roots.is_empty() {
            return Err(bad("holds no self-signed root certificate".into()));
        }
        Ok(root)
    }
}

/// A certificate that passed [`verify_certificate`]: its key checks signatures.
#[derive(Debug, Clone)]
pub(crate) struct Signer {
    key: p256::ecdsa::VerifyingKey,
    identity: String,
}

/// Decodes a `.cert` file: PEM, or base64 of PEM (upstream's form). The first
/// certificate is the leaf, any others are offered as intermediates.
pub(crate) fn parse_cert_file(
    url: &str,
    text: &[u8],
) -> Result<Vec<CertificateDer<'static>>, SignatureError> {
    let bad = |message: &str| SignatureError::Format {
        url: url.to_string(),
        message: message.to_string(),
    };
    let pem = if text.windows(5).any(|w| w == b"-----") {
        text.to_vec()
    } else {
        decode_base64(text).ok_or_else(|| bad("neither PEM nor base64 of PEM"))?
    };
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|_| bad("holds no readable PEM certificate"))?;
    if certs.is_empty() {
        return Err(bad("holds no PEM certificate"));
    }
    Ok(certs)
}

/// Decodes a `.sig` file: base64 of a DER ECDSA signature (upstream's form), or raw DER.
pub(crate) fn parse_sig_file(
    url: &str,
    text: &[u8],
) -> Result<p256::ecdsa::Signature, SignatureError> {
    let der = if text.first() == Some(&0x30) {
        text.to_vec()
    } else {
        decode_base64(text).ok_or_else(|| SignatureError::Format {
            url: url.to_string(),
            message: "not base64".into(),
        })?
    };
    p256::ecdsa::Signature::from_der(&der).map_err(|_| SignatureError::Format {
        url: url.to_string(),
        message: "not a DER ECDSA P-256 signature".into(),
    })
}

fn decode_base64(text: &[u8]) -> Option<Vec<u8>> {
    use base64::Engine;
    let compact: Vec<u8> = text
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(compact)
        .ok()
}

/// Checks the certificate chain `certs` (leaf first) against `root`, its identity and
/// its OIDC issuer (see the module doc for exactly what is and is not checked).
pub(crate) fn verify_certificate(
    url: &str,
    certs: &[CertificateDer<'static>],
    root: &TrustRoot,
    identity: &str,
    issuer: &str,
) -> Result<Signer, SignatureError> {
    let format = |message: String| SignatureError::Format {
        url: url.to_string(),
        message,
    };
    let leaf_der = certs
        .first()
        .ok_or_else(|| format("no certificate".into()))?;
    let (_, leaf) = X509Certificate::from_der(leaf_der)
        .map_err(|e| format(format!("the certificate does not parse: {e}")))?;
    verify_chain(url, leaf_der, &leaf, &certs[1..], root)?;
    check_identity(url, &leaf, identity)?;
    check_issuer(url, &leaf, issuer)?;
    let spki = leaf.public_key();
    let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(&spki.subject_public_key.data)
        .map_err(|_| format("the certificate's key is not an ECDSA P-256 key".into()))?;
    Ok(Signer {
        key,
        identity: identity.to_string(),
    })
}

fn verify_chain(
    url: &str,
    leaf_der: &CertificateDer<'static>,
    leaf: &X509Certificate<'_>,
    extra: &[CertificateDer<'static>],
    root: &TrustRoot,
) -> Result<(), SignatureError> {
    let chain = |message: String| SignatureError::Chain {
        url: url.to_string(),
        roots: root.path.clone(),
        message,
    };
    let anchors = root
        .roots
        .iter()
        .map(|c| webpki::anchor_from_trusted_cert(c).map(|a| a.to_owned()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| chain(format!("a root is not usable as a trust anchor: {e}")))?;
    let mut intermediates = root.intermediates.clone();
    intermediates.extend(extra.iter().cloned());
    let ee = webpki::EndEntityCert::try_from(leaf_der)
        .map_err(|e| chain(format!("the certificate is not usable: {e}")))?;
    // Fulcio certificates live ~10 minutes: without Rekor's timestamp the chain is
    // checked as of the certificate's own notBefore (see the module doc).
    let at = leaf.validity().not_before.timestamp().max(0) as u64;
    let algs = rustls::crypto::ring::default_provider().signature_verification_algorithms;
    ee.verify_for_usage(
        algs.all,
        &anchors,
        &intermediates,
        UnixTime::since_unix_epoch(Duration::from_secs(at)),
        // required_if_present: webpki applies it to every certificate of the path, and
        // an intermediate without the extension is not restricted (RFC 5280 4.2.1.12);
        // the leaf's own code-signing EKU is required below
        webpki::KeyUsage::required_if_present(EKU_CODE_SIGNING),
        None,
        None,
    )
    .map_err(|e| chain(format!("{e:?}")))?;
    match leaf.extended_key_usage() {
        Ok(Some(eku)) if eku.value.code_signing => Ok(()),
        _ => Err(chain(
            "the certificate is not for code signing (no extended key usage 1.3.6.1.5.5.7.3.3)"
                .into(),
        )),
    }
}

fn check_identity(
    url: &str,
    leaf: &X509Certificate<'_>,
    identity: &str,
) -> Result<(), SignatureError> {
    let mut found = Vec::new();
    if let Ok(Some(san)) = leaf.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::RFC822Name(s) | GeneralName::URI(s) => found.push(s.to_string()),
                _ => {}
            }
        }
    }
    if found.iter().any(|s| s == identity) {
        return Ok(());
    }
    Err(SignatureError::Identity {
        url: url.to_string(),
        found: if found.is_empty() {
            "no e-mail or URI identity".into()
        } else {
            found.join(", ")
        },
        want: identity.to_string(),
    })
}

fn check_issuer(url: &str, leaf: &X509Certificate<'_>, issuer: &str) -> Result<(), SignatureError> {
    // RFC 5280 §4.2: "A certificate MUST NOT include more than one instance of a
    // particular extension" (Go's x509, and so cosign, refuses such a certificate); the
    // issuer is read only from a certificate that has at most one of each
    let count = |oid: &str| {
        leaf.extensions()
            .iter()
            .filter(|e| e.oid.to_id_string() == oid)
            .count()
    };
    if count(OID_ISSUER_V2) > 1 || count(OID_ISSUER_V1) > 1 {
        return Err(SignatureError::Issuer {
            url: url.to_string(),
            found: "a duplicated Fulcio issuer extension (RFC 5280 §4.2 allows one)".into(),
            want: issuer.to_string(),
        });
    }
    let ext = |oid: &str| {
        leaf.extensions()
            .iter()
            .find(|e| e.oid.to_id_string() == oid)
            .map(|e| e.value.to_vec())
    };
    let found = match (ext(OID_ISSUER_V2), ext(OID_ISSUER_V1)) {
        (Some(v2), _) => der_utf8(&v2),
        (None, Some(v1)) => String::from_utf8(v1).ok(),
        (None, None) => None,
    };
    match found {
        Some(f) if f == issuer => Ok(()),
        f => Err(SignatureError::Issuer {
            url: url.to_string(),
            found: f.unwrap_or_else(|| "none (no Fulcio issuer extension)".into()),
            want: issuer.to_string(),
        }),
    }
}

/// The string of a DER UTF8String (tag 12) with a short or long length.
fn der_utf8(der: &[u8]) -> Option<String> {
    let (&tag, rest) = der.split_first()?;
    if tag != 0x0c {
        return None;
    }
    let (&len0, rest) = rest.split_first()?;
    let (len, body) = if len0 < 0x80 {
        (len0 as usize, rest)
    } else {
        let n = (len0 & 0x7f) as usize;
        if n == 0 || n > 2 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, b| (a << 8) | *b as usize);
        (len, &rest[n..])
    };
    (body.len() == len)
        .then(|| String::from_utf8(body.to_vec()).ok())
        .flatten()
}

/// Checks `sig` over the SHA-256 `digest` of the downloaded bytes with `signer`'s key.
pub(crate) fn verify_digest(
    url: &str,
    signer: &Signer,
    sig: &p256::ecdsa::Signature,
    digest: &[u8; 32],
) -> Result<(), SignatureError> {
    signer
        .key
        .verify_prehash(digest, sig)
        .map_err(|_| SignatureError::Signature {
            url: url.to_string(),
            identity: signer.identity.clone(),
            digest: hex::encode(digest),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The anchor the packages install at [`DEFAULT_FULCIO_ROOTS`]: sigstore's current
    /// Fulcio root (self-signed) and its intermediate, both usable.
    #[test]
    fn the_shipped_fulcio_anchor_loads() {
        let p = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../packaging/sigstore/fulcio.pem"
        );
        let t = TrustRoot::load(p).unwrap();
        assert_eq!((t.roots.len(), t.intermediates.len()), (1, 1));
        let (_, root) = X509Certificate::from_der(&t.roots[0]).unwrap();
        assert_eq!(root.subject().to_string(), "O=sigstore.dev, CN=sigstore");
        let (_, mid) = X509Certificate::from_der(&t.intermediates[0]).unwrap();
        assert_eq!(mid.issuer().to_string(), "O=sigstore.dev, CN=sigstore");
    }

    /// A leaf with the issuer extension twice is refused, whichever value comes first
    /// (RFC 5280 §4.2; break-it finding: the first one won).
    #[test]
    fn a_duplicated_issuer_extension_is_refused() {
        let utf8 = |s: &str| {
            let mut d = vec![0x0c, s.len() as u8];
            d.extend(s.as_bytes());
            d
        };
        let oid: Vec<u64> = vec![1, 3, 6, 1, 4, 1, 57264, 1, 8];
        let leaf = |values: &[&str]| {
            let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            for v in values {
                p.custom_extensions
                    .push(rcgen::CustomExtension::from_oid_content(&oid, utf8(v)));
            }
            let key = rcgen::KeyPair::generate().unwrap();
            p.self_signed(&key).unwrap().der().to_vec()
        };
        let good = leaf(&[DEFAULT_ISSUER]);
        let (_, x) = X509Certificate::from_der(&good).unwrap();
        check_issuer("u.cert", &x, DEFAULT_ISSUER).unwrap();
        for values in [
            [DEFAULT_ISSUER, "https://issuer.evil.example"],
            ["https://issuer.evil.example", DEFAULT_ISSUER],
        ] {
            let der = leaf(&values);
            let Ok((_, x)) = X509Certificate::from_der(&der) else {
                continue; // a parser that refuses duplicates refuses it too
            };
            let e = check_issuer("u.cert", &x, DEFAULT_ISSUER).unwrap_err();
            assert!(e.to_string().contains("duplicated"), "{e}");
        }
    }

    #[test]
    fn der_utf8_strings() {
        assert_eq!(der_utf8(b"\x0c\x03abc"), Some("abc".into()));
        assert_eq!(der_utf8(b"\x0c\x04abc"), None);
        assert_eq!(der_utf8(b"\x13\x03abc"), None);
        let long = "x".repeat(200);
        let mut d = vec![0x0c, 0x81, 200];
        d.extend(long.as_bytes());
        assert_eq!(der_utf8(&d), Some(long));
    }

    #[test]
    fn sig_and_cert_files_are_decoded_or_refused() {
        assert!(matches!(
            parse_sig_file("u.sig", b"not base64!"),
            Err(SignatureError::Format { .. })
        ));
        assert!(matches!(
            parse_cert_file("u.cert", b"bm90IGEgY2VydA=="),
            Err(SignatureError::Format { .. })
        ));
    }
}
