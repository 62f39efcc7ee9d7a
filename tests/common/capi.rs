//! The CAPI side of the black-box tests: a PKI for agents, the extension and CAPI's
//! managers, and the real `inplace-extension` binary over HTTPS.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Node;
use super::pki::{Ca, ca, free_port, leaf, write};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rcgen::SanType;
use serde_json::{Value, json};

pub(crate) fn fixture(rel: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/capi")
        .join(rel);
    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()
}

/// CAs and certificates for one test: agents' server certs, the extension's client cert
/// (allowed as admin by the agents) and the extension's own server cert.
pub(crate) struct Pki {
    pub dir: tempfile::TempDir,
    pub agent_ca: Ca,
    pub ext_ca: Ca,
    /// Signs the client certificates of CAPI's managers (`--runtime-extension-client-cert-file`).
    pub capi_ca: Ca,
    /// The core manager's client certificate (URI SAN [`CAPI_ID`]).
    pub capi: (String, String),
}

/// The identity the extension allows: CAPI's managers' client certificate URI SAN.
pub(crate) const CAPI_ID: &str = "spiffe://mgmt/ns/capi-system/sa/capi-manager";

impl Pki {
    pub(crate) fn new() -> Pki {
        let capi_ca = ca("CAPI runtime extension clients CA");
        let capi = leaf(
            &capi_ca,
            "capi-manager",
            vec![SanType::URI(CAPI_ID.try_into().unwrap())],
        );
        Pki {
            dir: tempfile::tempdir().unwrap(),
            agent_ca: ca("agents CA"),
            ext_ca: ca("extension CA"),
            capi_ca,
            capi,
        }
    }

    pub(crate) fn localhost(ca: &Ca, cn: &str) -> (String, String) {
        leaf(
            ca,
            cn,
            vec![
                SanType::DnsName("localhost".try_into().unwrap()),
                SanType::IpAddress("127.0.0.1".parse().unwrap()),
            ],
        )
    }

    /// Configures `node` to serve mTLS on a free port; returns the address.
    pub(crate) fn agent(&self, node: &Node) -> String {
        let d = node.dir.path();
        let server = Pki::localhost(&self.agent_ca, "node");
        let addr = format!("127.0.0.1:{}", free_port());
        std::fs::write(
            &node.config,
            format!(
                "[api.tcp]\nlisten = \"{addr}\"\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
                 [[api.tcp.clients]]\nidentity = \"spiffe://edge/capi/extension\"\nrole = \"admin\"\n",
                write(d, "server.crt", &server.0),
                write(d, "server.key", &server.1),
                write(d, "clients-ca.crt", &self.ext_ca.pem),
            ),
        )
        .unwrap();
        addr
    }
}

/// A running `inplace-extension`.
pub(crate) struct Extension {
    pub child: Child,
    pub addr: String,
    pub ca: String,
    pub log: PathBuf,
    /// The client certificate requests present (CAPI's).
    pub client: Option<(String, String)>,
    /// The config file (rewrite it to test reloads).
    pub config: PathBuf,
}

impl Drop for Extension {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Extension {
    /// Starts the extension with `resolver.static` = `agents` (`namespace/name` → addr)
    /// and extra TOML.
    pub(crate) fn start(pki: &Pki, agents: &[(&str, &str)], extra: &str) -> Extension {
        Extension::start_logging(pki, agents, extra, "debug")
    }

    /// [`Extension::start`] logging at `level` (the benchmarks use `info`).
    pub(crate) fn start_logging(
        pki: &Pki,
        agents: &[(&str, &str)],
        extra: &str,
        level: &str,
    ) -> Extension {
        Extension::start_resolving(
            pki,
            agents,
            extra,
            level,
            ("", "template = \"{name}.{namespace}.nodes.invalid:7443\"\n"),
        )
    }

    /// [`Extension::start_logging`] with `agent_keys` added to the `[agent]` table and
    /// `resolver_keys` as the `[resolver]` table's keys (before its `[resolver.static]`
    /// of `agents`).
    pub(crate) fn start_resolving(
        pki: &Pki,
        agents: &[(&str, &str)],
        extra: &str,
        level: &str,
        (agent_keys, resolver): (&str, &str),
    ) -> Extension {
        let d = pki.dir.path();
        let client = leaf(
            &pki.ext_ca,
            "capi-extension",
            vec![SanType::URI(
                "spiffe://edge/capi/extension".try_into().unwrap(),
            )],
        );
        let server = Pki::localhost(&pki.ext_ca, "inplace-extension");
        let addr = format!("127.0.0.1:{}", free_port());
        let mut cfg = format!(
            "[server]\nlisten = \"{addr}\"\ncert = \"{}\"\nkey = \"{}\"\nclient_ca = \"{}\"\n\
             [[server.clients]]\nidentity = \"{CAPI_ID}\"\n\
             [agent]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\ntimeout_seconds = 5\n{agent_keys}\
             [update]\nretry_after_seconds = 30\n{extra}\n\
             [resolver]\n{resolver}[resolver.static]\n",
            write(d, "ext.crt", &server.0),
            write(d, "ext.key", &server.1),
            write(d, "capi-ca.crt", &pki.capi_ca.pem),
            write(d, "agents-ca.crt", &pki.agent_ca.pem),
            write(d, "client.crt", &client.0),
            write(d, "client.key", &client.1),
        );
        for (k, v) in agents {
            cfg.push_str(&format!("\"{k}\" = \"{v}\"\n"));
        }
        let config = write(d, "extension.toml", &cfg);
        let log = d.join(format!("extension-{}.log", free_port()));
        let child = Command::new(env!("CARGO_BIN_EXE_inplace-extension"))
            .args(["--config", &config, "--log", level])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut ext = Extension {
            child,
            addr,
            ca: pki.ext_ca.pem.clone(),
            log,
            client: Some(pki.capi.clone()),
            config: PathBuf::from(config),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&ext.addr).is_err() {
            if let Ok(Some(s)) = ext.child.try_wait() {
                panic!(
                    "inplace-extension exited: {s}: {}",
                    std::fs::read_to_string(&ext.log).unwrap()
                );
            }
            assert!(
                Instant::now() < deadline,
                "inplace-extension did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        ext
    }

    /// POSTs `body` to the hook path over HTTPS (verifying the extension's certificate),
    /// presenting CAPI's client certificate.
    pub(crate) async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_as(self.client.as_ref(), path, body)
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"))
    }

    /// POSTs `body` presenting `client` (cert PEM, key PEM), or no certificate; `Err`
    /// when the extension ends the connection without an HTTP answer.
    pub(crate) async fn post_as(
        &self,
        client: Option<&(String, String)>,
        path: &str,
        body: &Value,
    ) -> Result<(u16, Value), String> {
        self.post_bytes(client, path, serde_json::to_vec(body).unwrap())
            .await
    }

    /// POSTs raw `body` bytes presenting `client`, as [`Extension::post_as`].
    /// `post_bytes` with a body that starts with this sends the rest as raw bytes (a
    /// request head, say) and returns the status and the answer's head as a string.
    pub(crate) async fn post_bytes(
        &self,
        client: Option<&(String, String)>,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(u16, Value), String> {
        use rustls_pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls_pki_types::CertificateDer::pem_slice_iter(self.ca.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        let cfg = match client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    rustls_pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
                        .map(Result::unwrap)
                        .collect(),
                    rustls_pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap(),
        };
        let tcp = tokio::net::TcpStream::connect(&self.addr).await.unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect("localhost".try_into().unwrap(), tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        if let Some(head) = body.strip_prefix(RAW) {
            // the bytes as given, and the status line of the answer
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut tls = tls;
            tls.write_all(head)
                .await
                .map_err(|e| format!("write: {e}"))?;
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = tls.read(&mut buf).await.map_err(|e| format!("read: {e}"))?;
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            let text = String::from_utf8_lossy(&got).into_owned();
            let status = text
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("no status line in {text:?}"))?;
            return Ok((status, Value::String(text)));
        }
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
        tokio::spawn(conn);
        let req = hyper::Request::post(format!("https://localhost{path}"))
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from(body)))
            .unwrap();
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let status = resp.status().as_u16();
        let b = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        Ok((status, serde_json::from_slice(&b).unwrap()))
    }

    pub(crate) async fn hook(&self, hook: &str, handler: &str, body: &Value) -> Value {
        let (status, v) = self
            .post(
                &format!("/hooks.runtime.cluster.x-k8s.io/v1alpha1/{hook}/{handler}"),
                body,
            )
            .await;
        assert_eq!(status, 200, "{v}");
        v
    }

    /// CanUpdateMachine, with CAPI's own apply-and-compare run on the answer
    /// ([`super::upstream::check`]).
    pub(crate) async fn can_update_machine(&self, body: &Value) -> Value {
        let r = self
            .hook("canupdatemachine", "can-update-machine", body)
            .await;
        super::upstream::check("CanUpdateMachine", body, &r);
        r
    }

    /// CanUpdateMachineSet, with CAPI's own apply-and-compare run on the answer.
    pub(crate) async fn can_update_machine_set(&self, body: &Value) -> Value {
        let r = self
            .hook("canupdatemachineset", "can-update-machineset", body)
            .await;
        super::upstream::check("CanUpdateMachineSet", body, &r);
        r
    }

    pub(crate) async fn update_machine(&self, body: &Value) -> Value {
        self.hook("updatemachine", "update-machine", body).await
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

/// The metrics text served at `addr` (`[metrics] listen`), with the HTTP head.
pub(crate) fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// `inplace_extension_agent_rpcs_total` of `hook` in a metrics text: (rpc, count), by rpc.
pub(crate) fn agent_rpcs(metrics: &str, hook: &str) -> Vec<(String, f64)> {
    let prefix = format!("inplace_extension_agent_rpcs_total{{hook=\"{hook}\",rpc=\"");
    let mut v: Vec<(String, f64)> = metrics
        .lines()
        .filter_map(|l| {
            let (rpc, n) = l.strip_prefix(&prefix)?.split_once("\"} ")?;
            Some((rpc.to_string(), n.parse().ok()?))
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The usual setup: a copy of fixture node `name`, changed by `prepare` before its agent
/// starts serving mTLS, and an extension resolving Machine `machine` (`namespace/name`)
/// to it. Keep the returned Pki alive as long as the others.
pub(crate) fn one_agent(
    name: &str,
    machine: &str,
    prepare: impl FnOnce(&mut Node),
) -> (Pki, Node, Extension) {
    let pki = Pki::new();
    let mut node = Node::new(name);
    prepare(&mut node);
    let addr = pki.agent(&node);
    node.start();
    let ext = Extension::start(&pki, &[(machine, &addr)], "");
    (pki, node, ext)
}

/// The prefix of a `post_bytes` body that is sent raw.
pub(crate) const RAW: &[u8] = b"\0raw\0";

/// The RFC 6902 operations of the patch under `key` of a hook response, if it has one.
pub(crate) fn patch_ops(resp: &Value, key: &str) -> Option<Value> {
    use inplace_extension::capi::types::Patch;
    resp.get(key).map(|p| {
        serde_json::from_value::<Patch>(p.clone())
            .unwrap()
            .operations()
            .unwrap()
    })
}

/// The patch operations under `key`, `[]` when there is no patch.
pub(crate) fn ops(resp: &Value, key: &str) -> Value {
    patch_ops(resp, key).unwrap_or_else(|| json!([]))
}

/// The UpdateMachine request for the desired objects of a CanUpdateMachine request.
pub(crate) fn update_request(can: &Value) -> Value {
    without_machine_version(json!({
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "kind": "UpdateMachineRequest",
        "settings": can["settings"],
        "desired": can["desired"],
    }))
}

/// `req` without the desired Machine's `spec.version`. The fixture Machines name a
/// version, and the fixture nodes have no kubelet to verify it: UpdateMachine answers
/// Failure naming `spec.version` for them (issue 27 §2, tests/capi_verify.rs). Tests
/// about other fields leave the version out (the NodeSpec is the same: a node without a
/// kubelet never had the version in it); tests about the version set it after this.
pub(crate) fn without_machine_version(mut req: Value) -> Value {
    if let Some(spec) = req
        .pointer_mut("/desired/machine/spec")
        .and_then(Value::as_object_mut)
    {
        spec.remove("version");
    }
    req
}

/// Calls UpdateMachine until it answers done or failed; returns every response.
pub(crate) async fn poll_update(ext: &Extension, req: &Value) -> Vec<Value> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = ext.update_machine(req).await;
        let done = r["retryAfterSeconds"] == 0;
        seen.push(r);
        if done {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "UpdateMachine never finished: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asks CanUpdateMachine about `req`, checks that its bootstrap patch turns the current
/// bootstrap config into the desired one (the change is fully covered), then calls
/// UpdateMachine until it ends; returns the CanUpdateMachine response and every
/// UpdateMachine response.
pub(crate) async fn fully_covered_then_updated(
    ext: &Extension,
    req: &Value,
) -> (Value, Vec<Value>) {
    let resp = ext.can_update_machine(req).await;
    let patch = ops(&resp, "bootstrapConfigPatch");
    let out = inplace_extension::capi::patch::apply(
        &req["current"]["bootstrapConfig"],
        patch.as_array().unwrap(),
    )
    .unwrap();
    assert_eq!(
        out["spec"], req["desired"]["bootstrapConfig"]["spec"],
        "fully covered: {resp}"
    );
    let seen = poll_update(ext, &update_request(req)).await;
    (resp, seen)
}
