//! The Kubernetes side of an in-place update (README "Draining and the cluster side"):
//! the clients, the Machine as the management cluster has it, and the drain, Node and
//! Event steps the UpdateMachine driver ([`crate::hooks::driver`]) takes around the
//! agent's operation ([`flow`]).
//!
//! Libraries: `kube` (client, kubeconfig, in-cluster config, discovery) and `k8s-openapi`
//! (typed Node, Pod, Secret, Event), the field's Rust Kubernetes client, on the same
//! rustls/hyper/tokio as the rest of the workspace (features `rustls-tls`, `ring`: no
//! second TLS stack). The Eviction is posted raw (`Client::send`), because its version is
//! chosen at run time and because kube's typed error drops `details.causes`, where the
//! API server names the blocking PodDisruptionBudget.
//!
//! Eviction version, by discovery: `policy/v1` where the workload cluster serves it
//! (Kubernetes 1.22 and later), else `policy/v1beta1` (1.20 and 1.21 serve only that;
//! 1.25 removed it). The body is the same in both; discovery is asked once per client
//! ([`Workload`]).
//!
//! Clusters: the management cluster through the in-cluster config (or
//! `[cluster] kubeconfig`); each workload cluster through CAPI's own `<cluster>-kubeconfig`
//! Secret (key `value`) in the Machine's namespace, as CAPI's cluster cache does; the
//! client is cached per cluster and built again when the Secret's `resourceVersion`
//! changes (CAPI rotates it).
//!
//! Map: [`drain`] and [`node`] are the pure decisions (which Pod is evicted, skipped or
//! waited for; the cordon, the state annotations, when the Node is back); [`events`]
//! writes Events and the Machine's phase annotation; [`flow`] takes the steps.

pub(crate) mod drain;
pub(crate) mod events;
pub(crate) mod flow;
pub(crate) mod node;

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::Value;
use tokio::sync::{Mutex, OnceCell};

use crate::config::ClusterConfig;

/// The Kubernetes clients of the extension (one per cluster, built on first use).
pub(crate) struct Kube {
    pub(crate) cfg: ClusterConfig,
    management: OnceCell<kube::Client>,
    /// `namespace/cluster` → (the Secret's resourceVersion, the client).
    workloads: Mutex<HashMap<String, (String, Workload)>>,
}

impl std::fmt::Debug for Kube {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kube")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// A workload cluster's client and the Eviction version it serves.
#[derive(Clone)]
pub(crate) struct Workload {
    pub(crate) client: kube::Client,
    /// `v1` or `v1beta1` ([`drain::eviction_version`]).
    pub(crate) eviction: &'static str,
}

impl std::fmt::Debug for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workload")
            .field("eviction", &self.eviction)
            .finish_non_exhaustive()
    }
}

/// What the extension reads of a Machine object in the management cluster.
#[derive(Debug, Clone, Default)]
pub(crate) struct MachineInfo {
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.clusterName` (else the `cluster.x-k8s.io/cluster-name` label).
    pub cluster: String,
    /// `status.nodeRef.name`.
    pub node: Option<String>,
    /// The drain deadline the Machine sets, seconds: v1beta2
    /// `spec.deletion.nodeDrainTimeoutSeconds`, v1beta1 `spec.nodeDrainTimeout` (a Go
    /// duration); `None` when unset or 0 (CAPI: no limit; here the config default).
    pub drain_timeout: Option<u64>,
    /// `status.addresses` as (type, address), in the Machine's order.
    pub addresses: Vec<(String, String)>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
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

/// Seconds of a Go duration as CAPI v1beta1 writes `nodeDrainTimeout` (`10m`, `1h30m`,
/// `90s`, `1.5h`); `None` when malformed.
pub(crate) fn go_duration_seconds(s: &str) -> Option<u64> {
    let (mut total, mut num) = (0f64, String::new());
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    while let Some(c) = rest.chars().next() {
        if c.is_ascii_digit() || c == '.' {
            num.push(c);
            rest = &rest[1..];
            continue;
        }
        let (unit, len) = [
            ("ms", 0.001, 2),
            ("h", 3600.0, 1),
            ("m", 60.0, 1),
            ("s", 1.0, 1),
        ]
        .iter()
        .find(|(u, _, _)| rest.starts_with(u))
        .map(|(_, f, l)| (*f, *l))?;
        total += num.parse::<f64>().ok()? * unit;
        num.clear();
        rest = &rest[len..];
    }
    num.is_empty().then_some(total.round() as u64)
}

/// Reads a Machine object (pure).
pub(crate) fn machine_info(v: &Value) -> MachineInfo {
    let s = |p: &str| v.pointer(p).and_then(Value::as_str).map(String::from);
    let cluster = s("/spec/clusterName")
        .or_else(|| s("/metadata/labels/cluster.x-k8s.io~1cluster-name"))
        .unwrap_or_default();
    let drain_timeout = v
        .pointer("/spec/deletion/nodeDrainTimeoutSeconds")
        .and_then(Value::as_u64)
        .or_else(|| s("/spec/nodeDrainTimeout").and_then(|d| go_duration_seconds(&d)))
        .filter(|t| *t > 0);
    let addresses = v
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|a| Some((a["type"].as_str()?.into(), a["address"].as_str()?.into())))
        .collect();
    let annotations = v
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").into()))
                .collect()
        })
        .unwrap_or_default();
    MachineInfo {
        uid: s("/metadata/uid").unwrap_or_default(),
        cluster,
        node: s("/status/nodeRef/name"),
        drain_timeout,
        addresses,
        annotations,
    }
}

/// Each request's bound: a hook answers within its deadline (default 10 s) even when an
/// API server hangs.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(4);

/// A client of `cfg` without kube's own retry layer (it retries a 429 for seconds inside
/// one request: an Eviction blocked by a budget must come back at once, to be named in the
/// answer and tried again at the next poll) and with [`REQUEST_TIMEOUT`]. The error is in
/// our words: kube's quotes the TLS material it could not use (keys, certificates).
fn client_of(mut cfg: kube::Config) -> Result<kube::Client, String> {
    cfg.default_retry = false;
    cfg.connect_timeout = Some(REQUEST_TIMEOUT);
    cfg.read_timeout = Some(REQUEST_TIMEOUT);
    cfg.write_timeout = Some(REQUEST_TIMEOUT);
    kube::Client::try_from(cfg).map_err(|_| {
        "gives no client: its certificate authority, client certificate or \
         client key is not usable PEM (check certificate-authority-data, \
         client-certificate-data, client-key-data)"
            .to_string()
    })
}

/// What is wrong with a kubeconfig, in our words only: kube's and serde's errors quote
/// the offending text (a token pasted as the value, a line of a near-YAML, a key's bytes),
/// and the text is a Secret's. Never format `e` into an answer, Event, annotation or log.
fn kubeconfig_problem(e: &kube::config::KubeconfigError) -> &'static str {
    use kube::config::KubeconfigError as K;
    match e {
        K::Parse(_) => {
            "is not a kubeconfig (YAML with apiVersion v1, kind Config, clusters, users, contexts)"
        }
        K::CurrentContextNotSet | K::LoadContext(_) => {
            "names no usable current-context (set current-context to one of its contexts)"
        }
        K::LoadClusterOfContext(_) => "its current context names a cluster it does not define",
        K::MissingClusterUrl | K::ParseClusterUrl(_) => {
            "its cluster has no valid server URL (clusters[].cluster.server)"
        }
        K::ParseProxyUrl(_) => "its cluster's proxy-url is not valid",
        K::LoadCertificateAuthority(_) => "its certificate-authority-data is not valid base64 PEM",
        K::LoadClientCertificate(_) => "its client-certificate-data is not valid base64 PEM",
        K::LoadClientKey(_) => "its client-key-data is not valid base64 PEM",
        K::ParseCertificates(_) => "a certificate in it is not valid PEM",
        _ => "is not a usable kubeconfig (its clusters, users and contexts)",
    }
}

/// A client from a kubeconfig's text ([`client_of`]); the error says what is wrong in our
/// words ([`kubeconfig_problem`]), never the text.
async fn client_from_kubeconfig(text: &str) -> Result<kube::Client, String> {
    let kc = Kubeconfig::from_yaml(text).map_err(|e| kubeconfig_problem(&e).to_string())?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| kubeconfig_problem(&e).to_string())?;
    client_of(cfg)
}

impl Kube {
    /// Clients built on first use from `cfg`.
    pub(crate) fn new(cfg: ClusterConfig) -> Kube {
        Kube {
            cfg,
            management: OnceCell::new(),
            workloads: Mutex::default(),
        }
    }

    /// The management cluster's client: `[cluster] kubeconfig`, else in-cluster.
    pub(crate) async fn management(&self) -> Result<kube::Client, String> {
        self.management
            .get_or_try_init(|| async {
                match &self.cfg.kubeconfig {
                    Some(p) => {
                        let text = tokio::fs::read_to_string(p)
                            .await
                            .map_err(|e| format!("cluster.kubeconfig {}: {e}", p.display()))?;
                        client_from_kubeconfig(&text)
                            .await
                            .map_err(|e| format!("cluster.kubeconfig {}: {e}", p.display()))
                    }
                    None => {
                        let cfg = kube::Config::incluster().map_err(|e| {
                            format!(
                                "in-cluster config: {e} (outside a Pod, set cluster.kubeconfig)"
                            )
                        })?;
                        client_of(cfg).map_err(|e| format!("in-cluster config: {e}"))
                    }
                }
            })
            .await
            .cloned()
    }

    /// Machine `ns/name` from the management cluster.
    pub(crate) async fn machine(&self, ns: &str, name: &str) -> Result<MachineInfo, String> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.management().await?, ns, &machine_resource());
        let m = api
            .get(name)
            .await
            .map_err(|e| format!("reading Machine {ns}/{name}: {e}"))?;
        let v = serde_json::to_value(&m).map_err(|e| e.to_string())?;
        Ok(machine_info(&v))
    }

    /// The client of workload cluster `ns/cluster`, from its kubeconfig Secret; rebuilt
    /// when the Secret's resourceVersion changed since the cached client was built.
    pub(crate) async fn workload(&self, ns: &str, cluster: &str) -> Result<Workload, String> {
        let name = format!("{cluster}{}", self.cfg.workload_kubeconfig_secret_suffix);
        let secrets: Api<Secret> = Api::namespaced(self.management().await?, ns);
        let s = secrets
            .get(&name)
            .await
            .map_err(|e| format!("reading Secret {ns}/{name}: {e}"))?;
        let rv = s.metadata.resource_version.clone().unwrap_or_default();
        let key = format!("{ns}/{cluster}");
        // the lock is not held while a client is built (a slow cluster would stall the
        // others); two builds at once for one cluster both succeed, the later one is kept
        if let Some((have, w)) = self.workloads.lock().await.get(&key)
            && *have == rv
        {
            return Ok(w.clone());
        }
        let value = s
            .data
            .as_ref()
            .and_then(|d| d.get("value"))
            .ok_or_else(|| format!("Secret {ns}/{name} has no key `value`"))?;
        let text = std::str::from_utf8(&value.0)
            .map_err(|_| format!("Secret {ns}/{name} key `value` is not UTF-8"))?;
        let client = client_from_kubeconfig(text)
            .await
            .map_err(|e| format!("Secret {ns}/{name} key `value` {e}"))?;
        let group = kube::discovery::group(&client, "policy")
            .await
            .map_err(|e| format!("workload cluster {cluster}: discovery of group policy: {e}"))?;
        let w = Workload {
            client,
            eviction: drain::eviction_version(group.versions()),
        };
        tracing::info!(cluster = %key, eviction = %w.eviction, secret_version = %rv, "workload cluster client built");
        self.workloads.lock().await.insert(key, (rv, w.clone()));
        Ok(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A Secret's content never reaches the error (breakit_kubeconfig_leak): a token
    /// pasted as the value, a near-kubeconfig whose wrong-typed field kube's YAML error
    /// quotes, and a client key that is not PEM (the TLS error path).
    async fn err_of(text: &str) -> String {
        match client_from_kubeconfig(text).await {
            Ok(_) => panic!("a client was built"),
            Err(e) => e,
        }
    }

    #[tokio::test]
    async fn a_garbage_kubeconfig_error_names_the_problem_not_the_content() {
        let token = "eyJhbGciOiJSUzI1NiJ9.SECRET-TOKEN-abc123";
        let e = err_of(token).await;
        assert!(!e.contains("SECRET-TOKEN"), "{e}");
        assert!(e.contains("is not a kubeconfig"), "{e}");
        let wrong = "apiVersion: v1\nkind: Config\nclusters: SECRET-TOKEN-in-clusters\nusers:\n- name: u\n  user:\n    token: SECRET-TOKEN-xyz\n";
        let e = err_of(wrong).await;
        assert!(!e.contains("SECRET-TOKEN"), "{e}");
        assert!(e.contains("is not a kubeconfig"), "{e}");
        // base64 of "SECRET-KEY-bytes-not-pem"
        let key = "U0VDUkVULUtFWS1ieXRlcy1ub3QtcGVt";
        let bad_key = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:6443\nusers:\n- name: u\n  user:\n    client-certificate-data: {key}\n    client-key-data: {key}\ncontexts:\n- name: c\n  context: {{cluster: k, user: u}}\n"
        );
        let e = err_of(&bad_key).await;
        assert!(!e.contains("SECRET-KEY") && !e.contains(key), "{e}");
        assert!(e.contains("client"), "{e}");
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration_seconds("10m"), Some(600));
        assert_eq!(go_duration_seconds("1h30m"), Some(5400));
        assert_eq!(go_duration_seconds("90s"), Some(90));
        assert_eq!(go_duration_seconds("1.5h"), Some(5400));
        assert_eq!(go_duration_seconds("0s"), Some(0));
        assert_eq!(go_duration_seconds("10"), None);
        assert_eq!(go_duration_seconds("10x"), None);
        assert_eq!(go_duration_seconds(""), None);
    }

    #[test]
    fn reads_both_machine_versions() {
        let v = json!({
            "metadata": {"uid": "u1", "labels": {"cluster.x-k8s.io/cluster-name": "c1"}, "annotations": {"a": "b"}},
            "spec": {"deletion": {"nodeDrainTimeoutSeconds": 600}},
            "status": {"nodeRef": {"name": "n1"}, "addresses": [{"type": "Hostname", "address": "h"}, {"type": "InternalIP", "address": "10.0.0.7"}]},
        });
        let m = machine_info(&v);
        assert_eq!(
            (m.uid.as_str(), m.cluster.as_str(), m.node.as_deref()),
            ("u1", "c1", Some("n1"))
        );
        assert_eq!(m.drain_timeout, Some(600));
        assert_eq!(m.addresses[1], ("InternalIP".into(), "10.0.0.7".into()));
        assert_eq!(m.annotations["a"], "b");
        let v1 = json!({"spec": {"clusterName": "c2", "nodeDrainTimeout": "2m"}});
        let m = machine_info(&v1);
        assert_eq!((m.cluster.as_str(), m.drain_timeout), ("c2", Some(120)));
        let zero = json!({"spec": {"deletion": {"nodeDrainTimeoutSeconds": 0}}});
        assert_eq!(machine_info(&zero).drain_timeout, None);
    }
}
