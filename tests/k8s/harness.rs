//! A real Kubernetes control plane for the tests in `tests/k8s_*.rs`: etcd (Debian's
//! `etcd-server`), kube-apiserver and kube-controller-manager v1.20 (built from Debian's
//! source package by `tests/k8s/build-apiserver.sh`), on loopback with free ports, in a
//! fresh directory per [`Cluster`].
//!
//! The API server authenticates by a static token file (`admin`, group `system:masters`;
//! `inplace-extension`, bound to the ClusterRole of `deploy/extension-rbac.yaml` and to
//! nothing else, so the extension's requests prove the shipped RBAC is enough), authorizes
//! with RBAC, signs service-account tokens (the three flags v1.20 requires) and serves
//! TLS with a certificate of a test CA. The ServiceAccount admission plugin is off (no
//! token controller runs, so Pods could not be created with it). The controller manager
//! runs only the `disruption` controller: it computes PodDisruptionBudget status, which
//! the Eviction API checks. No kubelet runs: the tests play it at the API boundary
//! (Node status, Pod status, the removal of evicted Pods).
//!
//! The binaries are found through `INPLACED_K8S_BIN` (set by `tests/k8s/run.sh`), else
//! under the default cache `/var/cache/inplaced-k8s/*/bin`; without them [`Cluster::start`]
//! panics with the command that builds them: these tests never skip silently.

#![allow(dead_code)] // each test file uses a part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::{ApiResource, pinned_kind};
use rcgen::{KeyPair, SanType};
use serde_json::Value;

use crate::common::pki;

/// The token of the `admin` user (group `system:masters`).
pub(crate) const ADMIN_TOKEN: &str = "admin-token-for-tests-only";
/// The token of the `inplace-extension` user (RBAC: `deploy/extension-rbac.yaml`).
pub(crate) const EXTENSION_TOKEN: &str = "extension-token-for-tests-only";

/// A running etcd + kube-apiserver + kube-controller-manager; stopped on drop.
pub(crate) struct Cluster {
    /// Certificates, token file, kubeconfigs, etcd data and logs.
    pub dir: tempfile::TempDir,
    children: Vec<(&'static str, Child, PathBuf)>,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// The API server's CA (PEM).
    pub ca_pem: String,
    /// A kubeconfig of the `admin` user.
    pub admin_kubeconfig: PathBuf,
    /// A kubeconfig of the `inplace-extension` user.
    pub ext_kubeconfig: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, c, _) in self.children.iter_mut().rev() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Where the binaries are: `INPLACED_K8S_BIN`, else the newest default cache entry.
fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("INPLACED_K8S_BIN") {
        return PathBuf::from(d);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/var/cache/inplaced-k8s")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("kube-apiserver").exists())
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!(
            "no kube-apiserver: run these tests with tests/k8s/run.sh (it builds or reuses the binaries and sets INPLACED_K8S_BIN)"
        )
    })
}

/// A kubeconfig for `url` trusting `ca` with bearer `token`.
pub(crate) fn kubeconfig(url: &str, ca_pem: &str, user: &str, token: &str) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\n\
         users:\n- name: {user}\n  user:\n    token: {token}\n\
         contexts:\n- name: test\n  context:\n    cluster: test\n    user: {user}\ncurrent-context: test\n"
    )
}

impl Cluster {
    /// Starts the three processes and waits until the API server is ready, the Machine
    /// CRD is established and the extension's RBAC is applied (about 5 s).
    pub(crate) async fn start() -> Cluster {
        let t0 = Instant::now();
        let bin = bin_dir();
        for b in ["kube-apiserver", "kube-controller-manager"] {
            assert!(
                bin.join(b).exists(),
                "{} missing: run tests/k8s/run.sh",
                bin.join(b).display()
            );
        }
        let dir = crate::common::tempdir();
        let d = dir.path().to_path_buf();
        let ca = pki::ca("k8s-test-ca");
        let api_port = pki::free_port();
        let url = format!("https://127.0.0.1:{api_port}");
        let mut c = Cluster {
            children: Vec::new(),
            url: url.clone(),
            ca_pem: ca.pem.clone(),
            admin_kubeconfig: d.join("admin.kubeconfig"),
            ext_kubeconfig: d.join("extension.kubeconfig"),
            dir,
        };
        let etcd = c.start_etcd();
        let args = apiserver_args(&d, &ca, &etcd, api_port);
        c.spawn(
            "kube-apiserver",
            Command::new(bin.join("kube-apiserver")).args(&args),
        );
        std::fs::write(
            &c.admin_kubeconfig,
            kubeconfig(&url, &ca.pem, "admin", ADMIN_TOKEN),
        )
        .unwrap();
        std::fs::write(
            &c.ext_kubeconfig,
            kubeconfig(&url, &ca.pem, "inplace-extension", EXTENSION_TOKEN),
        )
        .unwrap();
        c.wait_ready().await;
        c.spawn(
            "kube-controller-manager",
            Command::new(bin.join("kube-controller-manager")).args([
                &format!("--kubeconfig={}", c.admin_kubeconfig.display()),
                "--controllers=disruption",
                "--leader-elect=false",
                "--port=0",
                "--secure-port=0",
            ]),
        );
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        c.apply_file(&root.join("tests/k8s/machine-crd.yaml"), &[])
            .await;
        // the shipped ClusterRoles themselves (the ServiceAccount and the policy/v1
        // budget are for a real deployment)
        c.apply_file(&root.join("deploy/extension-rbac.yaml"), &["ClusterRole"])
            .await;
        c.apply_file(&root.join("tests/k8s/extension-user.yaml"), &[])
            .await;
        c.wait_machines_served().await;
        eprintln!("k8s harness: control plane ready in {:?}", t0.elapsed());
        c
    }

    /// Starts etcd on free loopback ports; returns its client URL. A port taken between
    /// its pick and etcd's bind (another process here, or the kernel handing out the
    /// same free port twice) is retried with new ports, three times at most.
    fn start_etcd(&mut self) -> String {
        for attempt in 1..=3 {
            let (etcd_port, peer_port) = two_free_ports();
            let etcd = format!("http://127.0.0.1:{etcd_port}");
            let peer = format!("http://127.0.0.1:{peer_port}");
            let data = self.dir.path().join(format!("etcd-{attempt}"));
            self.spawn(
                "etcd",
                Command::new("etcd").args([
                    "--name=test",
                    &format!("--data-dir={}", data.display()),
                    &format!("--listen-client-urls={etcd}"),
                    &format!("--advertise-client-urls={etcd}"),
                    &format!("--listen-peer-urls={peer}"),
                    &format!("--initial-advertise-peer-urls={peer}"),
                    &format!("--initial-cluster=test={peer}"),
                ]),
            );
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if std::net::TcpStream::connect(("127.0.0.1", etcd_port)).is_ok() {
                    return etcd;
                }
                let (_, child, log) = self.children.last_mut().unwrap();
                if let Ok(Some(_)) = child.try_wait() {
                    let text = std::fs::read_to_string(&*log).unwrap_or_default();
                    if attempt < 3 && text.contains("address already in use") {
                        eprintln!("k8s harness: etcd's port was taken; new ports");
                        self.children.pop();
                        break;
                    }
                    self.check_alive();
                }
                assert!(Instant::now() < deadline, "etcd did not listen");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        unreachable!("the third attempt returns or panics")
    }

    fn spawn(&mut self, name: &'static str, cmd: &mut Command) {
        let log = self.dir.path().join(format!("{name}.log"));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {e} (etcd: apt-get install etcd-server)"));
        self.children.push((name, child, log));
    }

    /// Panics with the logs when a process exited.
    fn check_alive(&mut self) {
        for (name, c, log) in &mut self.children {
            if let Ok(Some(s)) = c.try_wait() {
                let text = std::fs::read_to_string(&*log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                panic!(
                    "{name} exited: {s}:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
        }
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.check_alive();
            if let Ok(client) = self.try_admin().await {
                let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
                if client.request_text(req).await.is_ok_and(|t| t == "ok") {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "kube-apiserver not ready in 60 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn try_admin(&self) -> Result<kube::Client, kube::Error> {
        client_of(&self.admin_kubeconfig).await
    }

    /// A client as `admin`.
    pub(crate) async fn admin(&self) -> kube::Client {
        self.try_admin().await.unwrap()
    }

    /// Creates every document of a YAML file of one of `kinds` (all when empty), as
    /// kubectl create -f does, through discovery.
    pub(crate) async fn apply_file(&self, path: &Path, kinds: &[&str]) {
        let text = std::fs::read_to_string(path).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        for doc in docs.into_iter().filter(|d| {
            d.is_object() && (kinds.is_empty() || kinds.iter().any(|k| d["kind"] == *k))
        }) {
            self.create(doc).await;
        }
    }

    /// Creates one object (any kind the server serves).
    pub(crate) async fn create(&self, doc: Value) {
        let client = self.admin().await;
        let obj: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
        let tm = obj.types.clone().unwrap();
        let gvk = kube::core::GroupVersionKind::try_from(&tm).unwrap();
        let (ar, caps) = pinned_kind(&client, &gvk).await.unwrap();
        let api: Api<DynamicObject> = match (&obj.metadata.namespace, caps.scope) {
            (Some(ns), kube::discovery::Scope::Namespaced) => Api::namespaced_with(client, ns, &ar),
            (None, kube::discovery::Scope::Namespaced) => {
                Api::namespaced_with(client, "default", &ar)
            }
            _ => Api::all_with(client, &ar),
        };
        api.create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("create {doc}: {e}"));
    }

    async fn wait_machines_served(&mut self) {
        let client = self.admin().await;
        let api: Api<DynamicObject> = Api::all_with(client, &machine_resource());
        let deadline = Instant::now() + Duration::from_secs(30);
        while api.list(&Default::default()).await.is_err() {
            self.check_alive();
            assert!(Instant::now() < deadline, "machines never served");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The tail of a process's log (`etcd`, `kube-apiserver`, `kube-controller-manager`).
    pub(crate) fn log(&self, name: &str) -> String {
        self.children
            .iter()
            .find(|c| c.0 == name)
            .map(|c| std::fs::read_to_string(&c.2).unwrap_or_default())
            .unwrap_or_default()
    }
}

/// kube-apiserver's flags on loopback `port` over `etcd`: a serving certificate of `ca`,
/// the token file, RBAC, the three service-account flags v1.20 requires (an ECDSA key
/// pair), no ServiceAccount admission (no token controller runs). Writes the files
/// under `d`.
fn apiserver_args(d: &Path, ca: &pki::Ca, etcd: &str, port: u16) -> Vec<String> {
    let (crt, key) = pki::leaf(
        ca,
        "kube-apiserver",
        vec![
            SanType::IpAddress("127.0.0.1".parse().unwrap()),
            SanType::DnsName("localhost".try_into().unwrap()),
        ],
    );
    let sa = KeyPair::generate().unwrap();
    let tokens = pki::write(
        d,
        "tokens.csv",
        &format!(
            "{ADMIN_TOKEN},admin,admin,\"system:masters\"\n{EXTENSION_TOKEN},inplace-extension,inplace-extension\n"
        ),
    );
    vec![
        format!("--etcd-servers={etcd}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        "--insecure-port=0".into(),
        format!("--tls-cert-file={}", pki::write(d, "apiserver.crt", &crt)),
        format!(
            "--tls-private-key-file={}",
            pki::write(d, "apiserver.key", &key)
        ),
        format!("--client-ca-file={}", pki::write(d, "ca.crt", &ca.pem)),
        format!("--token-auth-file={tokens}"),
        "--authorization-mode=RBAC".into(),
        "--service-account-issuer=https://kubernetes.default.svc".into(),
        format!(
            "--service-account-key-file={}",
            pki::write(d, "sa.pub", &sa.public_key_pem())
        ),
        format!(
            "--service-account-signing-key-file={}",
            pki::write(d, "sa.key", &sa.serialize_pem())
        ),
        "--service-cluster-ip-range=10.96.0.0/24".into(),
        "--disable-admission-plugins=ServiceAccount".into(),
        "--allow-privileged=true".into(),
    ]
}

/// A client from a kubeconfig file.
pub(crate) async fn client_of(path: &Path) -> Result<kube::Client, kube::Error> {
    let kc = Kubeconfig::read_from(path).map_err(kube::Error::InferKubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(kube::Error::InferKubeconfig)?;
    kube::Client::try_from(cfg)
}

/// `machines.cluster.x-k8s.io/v1beta2`.
pub(crate) fn machine_resource() -> ApiResource {
    ApiResource {
        group: "cluster.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: "Machine".into(),
        plural: "machines".into(),
    }
}

/// Two distinct free loopback ports (both held open while the second is picked).
fn two_free_ports() -> (u16, u16) {
    let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    )
}
