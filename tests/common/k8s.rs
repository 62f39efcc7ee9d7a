//! Stand-ins for the Kubernetes binaries and a loopback mirror of the release layout, for
//! the `kubernetes` section's tests (no real kubeadm or kubelet can be fetched here).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, CustomExtension, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};

use super::{Node, pki};

/// A stand-in kubeadm of `version`: `version -o short` prints it; `upgrade node` writes
/// the kubelet config (and, on a control-plane node, the manifests' image tags) the way
/// kubeadm does, or fails after touching the config when
/// `/etc/standin/kubeadm-upgrade-fails` exists; it takes as many seconds as
/// `/etc/standin/kubeadm-upgrade-sleep` says.
pub(crate) fn kubeadm(version: &str) -> Vec<u8> {
    format!(
        r##"#!/bin/sh
# stand-in kubeadm {version}
R="$INPLACED_STANDIN_ROOT"
case "$1 $2" in
"version -o") echo "{version}" ;;
"upgrade node")
  echo "[upgrade] Reading configuration from the \"kubeadm-config\" ConfigMap in namespace \"kube-system\"..."
  [ -e "$R/etc/standin/kubeadm-upgrade-sleep" ] && sleep "$(cat "$R/etc/standin/kubeadm-upgrade-sleep")"
  if [ -e "$R/etc/standin/kubeadm-upgrade-fails" ]; then
    echo "# half-written by a failing kubeadm" >> "$R/var/lib/kubelet/config.yaml"
    echo "[upgrade/kubelet-config] FATAL: unable to fetch the kubelet-config ConfigMap: connection refused" >&2
    exit 1
  fi
  echo "# kubelet-config of {version}" >> "$R/var/lib/kubelet/config.yaml"
  for f in "$R"/etc/kubernetes/manifests/kube-*.yaml; do
    [ -e "$f" ] && sed -i 's/\(image: .*kube-[a-z-]*\):v[0-9.]*/\1:{version}/' "$f"
  done
  echo "[upgrade] The configuration for this node was successfully updated!"
  ;;
*) echo "stand-in kubeadm: unexpected $*" >&2; exit 2 ;;
esac
"##
    )
    .into_bytes()
}

/// A stand-in kubelet (or kubectl) of `version`.
pub(crate) fn kubelet(name: &str, version: &str) -> Vec<u8> {
    format!(
        "#!/bin/sh\n# stand-in {name} {version}\nif [ \"$1\" = --version ]; then echo \"Kubernetes {version}\"; else exit 2; fi\n"
    )
    .into_bytes()
}

/// The C source of [`elf_standin`]: it reads what to answer from the text after
/// `\n#INPLACED-STANDIN\n` at the end of its own file (`kind=`, `version=`, `log=`).
const ELF_STANDIN_C: &str = r#"
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    static char buf[8192];
    FILE *f = fopen("/proc/self/exe", "rb");
    if (!f) return 3;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, n > 4096 ? n - 4096 : 0, SEEK_SET);
    size_t r = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[r] = 0;
    char *m = memmem(buf, r, "\n#INPLACED-STANDIN\n", 19);
    if (!m) return 3;
    char kind[32] = "", version[64] = "", log[4096] = "";
    for (char *l = strtok(m + 19, "\n"); l; l = strtok(NULL, "\n")) {
        sscanf(l, "kind=%31s", kind);
        sscanf(l, "version=%63s", version);
        sscanf(l, "log=%4095[^\n]", log);
    }
    int kubelet = !strcmp(kind, "kubelet") && argc == 2 && !strcmp(argv[1], "--version");
    int kubeadm = !strcmp(kind, "kubeadm") && argc == 4 && !strcmp(argv[1], "version")
        && !strcmp(argv[2], "-o") && !strcmp(argv[3], "short");
    if (!kubelet && !kubeadm) return 2;
    if (*log) {
        FILE *a = fopen(log, "a");
        if (a) { fputs("asked\n", a); fclose(a); }
    }
    printf(kubelet ? "Kubernetes %s\n" : "%s\n", version);
    return 0;
}
"#;

/// A compiled (ELF) stand-in for the version queries of the kubelet (`kind` "kubelet":
/// `--version`) or kubeadm ("kubeadm": `version -o short`) of `version`, appending a
/// line to `log` each time it is asked when given. The agent keeps a compiled program's
/// answer with its stamp, never a script's (a wrapper answers from what it runs), so the
/// tests of kept versions need a program that is not a script. Compiled once per test
/// process with the C compiler cargo links with (`cc`); each call's bytes differ by the
/// trailer only.
pub(crate) fn elf_standin(kind: &str, version: &str, log: Option<&std::path::Path>) -> Vec<u8> {
    static ELF: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let elf = ELF.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("standin.c");
        std::fs::write(&src, ELF_STANDIN_C).unwrap();
        let out = dir.path().join("standin");
        let st = std::process::Command::new("cc")
            .args(["-O1", "-o"])
            .arg(&out)
            .arg(&src)
            .status()
            .expect("run cc (the C compiler cargo links with)");
        assert!(st.success(), "cc of the ELF stand-in failed");
        std::fs::read(&out).unwrap()
    });
    let mut b = elf.clone();
    b.extend_from_slice(
        format!("\n#INPLACED-STANDIN\nkind={kind}\nversion={version}\n").as_bytes(),
    );
    if let Some(l) = log {
        b.extend_from_slice(format!("log={}\n", l.display()).as_bytes());
    }
    b
}

/// A stand-in kubectl: `version --client` as kubectl 1.28+ prints it.
pub(crate) fn kubectl(version: &str) -> Vec<u8> {
    format!(
        "#!/bin/sh\n# stand-in kubectl {version}\nif [ \"$1 $2\" = \"version --client\" ]; then echo \"Client Version: {version}\"; echo \"Kustomize Version: v5.7.1\"; else exit 2; fi\n"
    )
    .into_bytes()
}

pub(crate) fn binaries(version: &str) -> BTreeMap<&'static str, Vec<u8>> {
    BTreeMap::from([
        ("kubeadm", kubeadm(version)),
        ("kubelet", kubelet("kubelet", version)),
        ("kubectl", kubectl(version)),
    ])
}

/// The identity and issuer upstream's binaries are signed by (the config's defaults).
pub(crate) const IDENTITY: &str = "krel-staging@k8s-releng-prod.iam.gserviceaccount.com";
pub(crate) const ISSUER: &str = "https://accounts.google.com";
/// Fulcio's issuer extensions: V2 (DER UTF8String) and the deprecated V1 (raw bytes).
pub(crate) const OID_ISSUER_V2: &[u64] = &[1, 3, 6, 1, 4, 1, 57264, 1, 8];
pub(crate) const OID_ISSUER_V1: &[u64] = &[1, 3, 6, 1, 4, 1, 57264, 1, 1];

/// A test Fulcio: a self-signed root and an intermediate, issuing short-lived code
/// signing certificates as Fulcio does (10 minutes, in the past: upstream's are long
/// expired when a node downloads the binaries).
pub(crate) struct Fulcio {
    pub root: pki::Ca,
    pub intermediate: pki::Ca,
}

/// How a signing certificate is made (the defaults are upstream's).
#[derive(Clone)]
pub(crate) struct Leaf {
    pub sans: Vec<SanType>,
    /// (extension OID, content) of the issuer extension; None: no issuer extension.
    pub issuer: Option<(&'static [u64], Vec<u8>)>,
    pub code_signing: bool,
}

impl Leaf {
    pub(crate) fn upstream() -> Leaf {
        Leaf::identity(IDENTITY, ISSUER)
    }

    /// An e-mail SAN `identity`, issuer `issuer` in the V2 extension.
    pub(crate) fn identity(identity: &str, issuer: &str) -> Leaf {
        Leaf {
            sans: vec![SanType::Rfc822Name(identity.try_into().unwrap())],
            issuer: Some((OID_ISSUER_V2, der_utf8(issuer))),
            code_signing: true,
        }
    }
}

fn der_utf8(s: &str) -> Vec<u8> {
    assert!(s.len() < 128);
    let mut d = vec![0x0c, s.len() as u8];
    d.extend(s.as_bytes());
    d
}

impl Fulcio {
    pub(crate) fn new(name: &str) -> Fulcio {
        let root = pki::ca(&format!("{name} root"));
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} intermediate"));
        let key = KeyPair::generate().unwrap();
        let pem = params
            .signed_by(&key, &Issuer::from_params(&root.params, &root.key))
            .unwrap()
            .pem();
        Fulcio {
            root,
            intermediate: pki::Ca { params, key, pem },
        }
    }

    /// The trust anchor file's content: root and intermediate.
    pub(crate) fn roots_pem(&self) -> String {
        format!("{}{}", self.root.pem, self.intermediate.pem)
    }

    /// Signs `blob` with a fresh key certified as `leaf` says: (`.cert`, `.sig`) in
    /// upstream's form, base64 of the PEM and base64 of the DER signature.
    pub(crate) fn sign(&self, blob: &[u8], leaf: &Leaf) -> (Vec<u8>, Vec<u8>) {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = leaf.sans.clone();
        if leaf.code_signing {
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
        }
        if let Some((oid, content)) = &leaf.issuer {
            params
                .custom_extensions
                .push(CustomExtension::from_oid_content(oid, content.clone()));
        }
        params.not_before = rcgen::date_time_ymd(2025, 3, 4);
        params.not_after = params.not_before + std::time::Duration::from_secs(600);
        let key = KeyPair::generate().unwrap();
        let issuer = Issuer::from_params(&self.intermediate.params, &self.intermediate.key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signer = rustls::crypto::ring::sign::any_ecdsa_type(&der)
            .unwrap()
            .choose_scheme(&[rustls::SignatureScheme::ECDSA_NISTP256_SHA256])
            .unwrap();
        let sig = signer.sign(blob).unwrap();
        (
            b64.encode(cert.pem()).into_bytes(),
            b64.encode(sig).into_bytes(),
        )
    }
}

/// A loopback HTTPS server answering GET and HEAD from `files` (path → body) and
/// `redirects` (path → Location, a 302), 404 else; its certificate is issued by a test
/// CA (`ca_path`), and releases are signed by a test Fulcio (`fulcio_path`).
pub(crate) struct Mirror {
    pub port: u16,
    pub files: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
    pub redirects: Arc<Mutex<BTreeMap<String, String>>>,
    pub requests: Arc<Mutex<Vec<String>>>,
    pub fulcio: Fulcio,
    pub dir: tempfile::TempDir,
    pub ca_path: String,
    pub fulcio_path: String,
}

type Shared<T> = Arc<Mutex<T>>;

impl Mirror {
    pub(crate) fn start() -> Mirror {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let dir = tempfile::tempdir().unwrap();
        let ca = pki::ca("mirror test CA");
        let (cert, key) = pki::leaf(
            &ca,
            "127.0.0.1",
            vec![SanType::IpAddress("127.0.0.1".parse().unwrap())],
        );
        let ca_path = pki::write(dir.path(), "mirror-ca.pem", &ca.pem);
        let fulcio = Fulcio::new("test fulcio");
        let fulcio_path = pki::write(dir.path(), "fulcio.pem", &fulcio.roots_pem());
        let tls = Arc::new(
            rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_single_cert(
                    vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap(),
        );
        let files: Shared<BTreeMap<String, Vec<u8>>> = Arc::default();
        let redirects: Shared<BTreeMap<String, String>> = Arc::default();
        let requests: Shared<Vec<String>> = Arc::default();
        let (f, d, r) = (files.clone(), redirects.clone(), requests.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(s) = stream else { continue };
                let (tls, f, d, r) = (tls.clone(), f.clone(), d.clone(), r.clone());
                std::thread::spawn(move || serve(s, tls, &f, &d, &r));
            }
        });
        Mirror {
            port,
            files,
            redirects,
            requests,
            fulcio,
            dir,
            ca_path,
            fulcio_path,
        }
    }

    /// Serves `bytes` as `binary` of `version` with its `.sha256`, `.sig` and `.cert`
    /// (signed as `leaf` says).
    pub(crate) fn publish(&self, version: &str, binary: &str, bytes: &[u8], leaf: &Leaf) {
        let (cert, sig) = self.fulcio.sign(bytes, leaf);
        let path = self.path(version, binary);
        let mut f = self.files.lock().unwrap();
        f.insert(
            format!("{path}.sha256"),
            hex::encode(Sha256::digest(bytes)).into_bytes(),
        );
        f.insert(format!("{path}.sig"), sig);
        f.insert(format!("{path}.cert"), cert);
        f.insert(path, bytes.to_vec());
    }

    /// The mirror path of `binary` of `version`.
    pub(crate) fn path(&self, version: &str, binary: &str) -> String {
        format!("/release/{version}/bin/linux/amd64/{binary}")
    }

    /// Serves the release layout of `version`: each binary and its `.sha256`, `.sig`
    /// and `.cert`, signed as upstream signs.
    pub(crate) fn release(&self, version: &str) -> BTreeMap<&'static str, Vec<u8>> {
        let bins = binaries(version);
        for (name, bytes) in &bins {
            self.publish(version, name, bytes, &Leaf::upstream());
        }
        bins
    }

    pub(crate) fn url(&self) -> String {
        format!(
            "https://127.0.0.1:{}/release/{{version}}/bin/linux/{{arch}}/{{binary}}",
            self.port
        )
    }
}

/// Answers one request on a TLS connection (Connection: close).
fn serve(
    s: TcpStream,
    tls: Arc<rustls::ServerConfig>,
    files: &Shared<BTreeMap<String, Vec<u8>>>,
    redirects: &Shared<BTreeMap<String, String>>,
    requests: &Shared<Vec<String>>,
) {
    let Ok(conn) = rustls::ServerConnection::new(tls) else {
        return;
    };
    let mut s = rustls::StreamOwned::new(conn, s);
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16384 {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let mut parts = head.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    requests.lock().unwrap().push(format!("{method} {path}"));
    let location = redirects.lock().unwrap().get(path).cloned();
    let body = files.lock().unwrap().get(path).cloned();
    let (status, body) = match (location, body) {
        (Some(l), _) => (format!("302 Found\r\nLocation: {l}"), Vec::new()),
        (None, Some(b)) => ("200 OK".to_string(), b),
        (None, None) => ("404 Not Found".to_string(), b"not found".to_vec()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes());
    if method == "GET" {
        let _ = s.write_all(&body);
    }
    s.conn.send_close_notify();
    let _ = s.flush();
}

/// A loopback plain-HTTP listener that answers nothing and counts its connections:
/// a redirect target that must never be reached.
pub(crate) struct PlainHttp {
    pub port: u16,
    pub connections: Arc<AtomicUsize>,
}

impl PlainHttp {
    pub(crate) fn start() -> PlainHttp {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let c = connections.clone();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                c.fetch_add(1, Ordering::SeqCst);
                drop(s);
            }
        });
        PlainHttp { port, connections }
    }
}

/// Installs the stand-ins of `version` in the node's /usr/bin and makes the daemon run
/// them (`INPLACED_RECORD_EXEC`).
pub(crate) fn install_standins(node: &mut Node, version: &str) {
    for (name, bytes) in binaries(version) {
        let p = node.path(&format!("/usr/bin/{name}"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    node.env.push((
        "INPLACED_RECORD_EXEC".into(),
        "/usr/bin/kubeadm,/usr/bin/kubelet,/usr/bin/kubectl".into(),
    ));
}

/// `[kubernetes]` with the `url` source on `mirror`: its CA for TLS, its Fulcio as the
/// trust anchor, upstream's identity and issuer (the defaults).
pub(crate) fn url_config(mirror: &Mirror) -> String {
    format!(
        "[kubernetes]\nsource = \"url\"\nurl = \"{}\"\narch = \"amd64\"\ntimeout_secs = 10\nca_bundle = \"{}\"\nfulcio_roots = \"{}\"\n",
        mirror.url(),
        mirror.ca_path,
        mirror.fulcio_path
    )
}
