//! Stand-ins for the Kubernetes binaries and a loopback mirror of the release layout, for
//! the `kubernetes` section's tests (no real kubeadm or kubelet can be fetched here).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use super::Node;

/// A stand-in kubeadm of `version`: `version -o short` prints it; `upgrade node` writes
/// the kubelet config (and, on a control-plane node, the manifests' image tags) the way
/// kubeadm does, or fails after touching the config when
/// `/etc/standin/kubeadm-upgrade-fails` exists; it takes as many seconds as
/// `/etc/standin/kubeadm-upgrade-sleep` says.
pub fn kubeadm(version: &str) -> Vec<u8> {
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
pub fn kubelet(name: &str, version: &str) -> Vec<u8> {
    format!(
        "#!/bin/sh\n# stand-in {name} {version}\nif [ \"$1\" = --version ]; then echo \"Kubernetes {version}\"; else exit 2; fi\n"
    )
    .into_bytes()
}

pub fn binaries(version: &str) -> BTreeMap<&'static str, Vec<u8>> {
    BTreeMap::from([
        ("kubeadm", kubeadm(version)),
        ("kubelet", kubelet("kubelet", version)),
        ("kubectl", kubelet("kubectl", version)),
    ])
}

/// A loopback HTTP server answering GET and HEAD from `files` (path → body), 404 else.
pub struct Mirror {
    pub port: u16,
    pub files: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
    pub requests: Arc<Mutex<Vec<String>>>,
}

impl Mirror {
    pub fn start() -> Mirror {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let files: Arc<Mutex<BTreeMap<String, Vec<u8>>>> = Arc::default();
        let requests: Arc<Mutex<Vec<String>>> = Arc::default();
        let (f, r) = (files.clone(), requests.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let mut reader = BufReader::new(s.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
                        break;
                    }
                }
                let mut parts = line.split_whitespace();
                let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                r.lock().unwrap().push(format!("{method} {path}"));
                let body = f.lock().unwrap().get(path).cloned();
                let head = match &body {
                    Some(b) => format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        b.len()
                    ),
                    None => {
                        "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\n"
                            .to_string()
                    }
                };
                let _ = s.write_all(head.as_bytes());
                if method == "GET" {
                    let _ = s.write_all(body.as_deref().unwrap_or(b"not found"));
                }
                let _ = s.flush();
                let _ = reader.read(&mut [0u8; 0]);
            }
        });
        Mirror {
            port,
            files,
            requests,
        }
    }

    /// Serves the release layout of `version`: each binary and its `.sha256`.
    pub fn release(&self, version: &str) -> BTreeMap<&'static str, Vec<u8>> {
        let bins = binaries(version);
        let mut f = self.files.lock().unwrap();
        for (name, bytes) in &bins {
            let path = format!("/release/{version}/bin/linux/amd64/{name}");
            f.insert(
                format!("{path}.sha256"),
                hex::encode(Sha256::digest(bytes)).into_bytes(),
            );
            f.insert(path, bytes.clone());
        }
        bins
    }

    pub fn url(&self) -> String {
        format!(
            "http://127.0.0.1:{}/release/{{version}}/bin/linux/{{arch}}/{{binary}}",
            self.port
        )
    }
}

/// Installs the stand-ins of `version` in the node's /usr/bin and makes the daemon run
/// them (`INPLACED_RECORD_EXEC`).
pub fn install_standins(node: &mut Node, version: &str) {
    for (name, bytes) in binaries(version) {
        let p = node.path(&format!("/usr/bin/{name}"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    node.env.push((
        "INPLACED_RECORD_EXEC".into(),
        "/usr/bin/kubeadm,/usr/bin/kubelet".into(),
    ));
}

/// `[kubernetes]` with the `url` source on `mirror`.
pub fn url_config(mirror: &Mirror) -> String {
    format!(
        "[kubernetes]\nsource = \"url\"\nurl = \"{}\"\narch = \"amd64\"\ntimeout_secs = 10\n",
        mirror.url()
    )
}
