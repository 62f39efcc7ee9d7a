//! `inplace-extension` configuration: a TOML file (default
//! `/etc/inplace-extension/config.toml`), overridden per request by the ExtensionConfig
//! `settings` map CAPI merges into every hook request.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::capi::{Capability, PreserveMode};
use inplace_wire::pb::RebootPolicy;

/// A configuration that can not be used, naming the key and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML is malformed or a key has the wrong type.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// toml's message (names the key, line and column).
        message: String,
    },
    /// A value is out of range.
    #[error("{path}: {key}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// Dotted key.
        key: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

/// `[server]`: the HTTPS endpoint CAPI calls.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Listen address, e.g. `0.0.0.0:9443`.
    pub listen: String,
    /// PEM certificate chain (the ExtensionConfig `caBundle` must sign it).
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// Handler timeout advertised in discovery, seconds (CAPI's default is 10).
    #[serde(default = "default_handler_timeout")]
    pub handler_timeout_seconds: i32,
    /// PEM CA bundle that signs the client certificates of CAPI's managers (core and KCP,
    /// started with `--runtime-extension-client-cert-file` / `-key-file`). Required: a
    /// connection without a certificate from this CA fails its TLS handshake.
    pub client_ca: Option<PathBuf>,
    /// The client identities allowed to call the hooks; a verified certificate that
    /// matches none is disconnected before its request is read. Re-read from this file
    /// when it changes.
    #[serde(default)]
    pub clients: Vec<AllowedClient>,
    /// Most authenticated connections open at once (default 64): a connection takes a
    /// place only after its TLS handshake, once its certificate is on `server.clients`
    /// (`inplace_edge::places`); with every place taken a new one waits up to 5 s, then is
    /// closed.
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// Most TLS handshakes pending at once (default 256). Before its handshake a
    /// connection holds no place; when the budget is full a new handshake drops the
    /// oldest of the source holding the most, sources with a handshake older than 1 s
    /// first (`inplace_edge::handshakes`). The ClientHello
    /// must come within 5 s, the handshake end within 10 s.
    #[serde(default = "default_handshake_budget")]
    pub handshake_budget: usize,
    /// Most TLS handshakes older than 1 s pending from one source, an IPv4 address or an
    /// IPv6 /64 (default 8); a newer one drops that source's oldest (a burst of fresh ones
    /// is kept up to 4 times this). At most `handshake_budget`.
    #[serde(default = "default_handshakes_per_source")]
    pub handshakes_per_source: usize,
    /// Most requests answered at once (default 64, as many as connections); more wait
    /// with their body unread. A request keeps its place while the agent answers it.
    #[serde(default = "default_max_requests")]
    pub max_requests: usize,
    /// Most request-body bytes held at once, in MiB (default 64, four bodies of the
    /// largest size): a request reserves its `Content-Length` (16 MiB, `MAX_BODY`, when
    /// it sends none) before its body is read, so memory is bounded by bytes however many
    /// small hooks run; at least 16.
    #[serde(default = "default_max_request_mib")]
    pub max_request_mib: usize,
    /// Most parsed-request bytes held at once, in MiB (default 96): before a body is
    /// parsed its JSON values are counted and 256 bytes reserved for each, its strings
    /// once more, and three copies of what its files' content decodes to, bounded before
    /// anything is inflated (`http::parsed_cost`: at most 89 MiB for one request), held
    /// until the answer; at least 89.
    #[serde(default = "default_max_parsed_mib")]
    pub max_parsed_mib: usize,
}

fn default_max_parsed_mib() -> usize {
    96
}

fn default_max_request_mib() -> usize {
    64
}

fn default_max_connections() -> usize {
    64
}

fn default_handshake_budget() -> usize {
    256
}

fn default_handshakes_per_source() -> usize {
    8
}

fn default_max_requests() -> usize {
    64
}

/// One `[[server.clients]]` entry: a client identity allowed to call the hooks, matched by
/// the same rule as the agent's `[[api.tcp.clients]]`
/// ([`inplace_edge::tls::CertNames::matches`]).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AllowedClient {
    /// A URI SAN, DNS SAN or (with `match = "cn"`) subject CN of the client certificate.
    pub identity: String,
    /// `uri`, `dns` or `cn`; absent: a URI SAN when the identity has a URI scheme, else a
    /// DNS SAN ([`inplace_edge::listener::IdentityKind::of_entry`]).
    #[serde(default, rename = "match")]
    pub kind: Option<inplace_edge::listener::IdentityKind>,
}

fn default_handler_timeout() -> i32 {
    10
}

/// `[agent]`: how the extension reaches node agents (mutual TLS gRPC).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// PEM CA bundle that signs the agents' server certificates.
    pub ca: PathBuf,
    /// PEM client certificate the agents allow (role `admin`; `api.tcp.clients`).
    pub cert: PathBuf,
    /// PEM client key.
    pub key: PathBuf,
    /// Per-call timeout, seconds (settings `agentTimeout`, e.g. "5s", override it).
    #[serde(default = "default_agent_timeout")]
    pub timeout_seconds: u64,
    /// Name verified in the agent's certificate; `{host}` (default) is the host part of
    /// the resolved address. Placeholders as in `resolver.template`.
    #[serde(default = "default_server_name")]
    pub server_name: String,
}

fn default_agent_timeout() -> u64 {
    5
}

fn default_server_name() -> String {
    "{host}".into()
}

/// `[resolver]`: where a Machine's agent listens.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolverConfig {
    /// `host:port` template with `{name}`, `{namespace}`, `{annotation:<key>}` and
    /// `{label:<key>}` placeholders, e.g. `{name}.{namespace}.nodes.example.com:7443`.
    pub template: Option<String>,
    /// `namespace/name` → `host:port`; consulted before the template.
    #[serde(default, rename = "static")]
    pub fixed: BTreeMap<String, String>,
    /// The Kubernetes node name a Machine's agent must report before UpdateMachine changes
    /// anything, as a template over `{name}` and `{namespace}` only (default `{name}`: the
    /// Machine's name, as Metal3 and BYOH name nodes).
    pub node_name: Option<String>,
    /// Take the node name from the request's `status.nodeRef.name` instead, when present
    /// (default false). Only for fleets whose node names no template can give: the value
    /// comes from the request, so whoever can write a Machine's status could point it at
    /// another node.
    #[serde(default)]
    pub trust_node_ref: bool,
    /// The Machine namespaces served (default: all). A Machine of another namespace gets a
    /// `Failure` naming this key before any agent is asked. With exactly one namespace,
    /// `template` need not use `{namespace}` ([`super::resolve::check_namespace_binding`]).
    #[serde(default)]
    pub namespaces: Vec<String>,
}

impl ResolverConfig {
    /// Checks `[resolver]` at load (`server_name` is `agent.server_name`): `node_name` uses
    /// no metadata, `static` entries are `namespace/name` = `host:port`
    /// ([`super::resolve::check_static_entry`]), `template` binds the Machine's namespace
    /// ([`super::resolve::check_namespace_binding`]), and one of them is given. The error
    /// is the key and the message. With `from_machine` (a `[cluster]` table) neither is
    /// needed: the address comes from the Machine's `status.addresses`.
    fn check(&self, server_name: &str, from_machine: bool) -> Result<(), (&'static str, String)> {
        if let Some(t) = &self.node_name
            && (t.contains("{annotation:") || t.contains("{label:"))
        {
            return Err((
                "resolver.node_name",
                "may use only {name} and {namespace}: annotations and labels can be edited by anyone who may edit Machines, which would let them point one Machine at another node".into(),
            ));
        }
        for (k, v) in &self.fixed {
            super::resolve::check_static_entry(k, v).map_err(|e| ("resolver.static", e))?;
        }
        if let Some(t) = &self.template {
            super::resolve::check_namespace_binding(t, server_name, &self.namespaces)
                .map_err(|e| ("resolver.template", e))?;
        }
        if self.template.is_none() && self.fixed.is_empty() && !from_machine {
            return Err((
                "resolver",
                "give a [cluster] table (addresses from the Machine's status), resolver.template (e.g. \"{name}.{namespace}.nodes.example.com:7443\") or resolver.static entries".into(),
            ));
        }
        Ok(())
    }
}

/// `[update]`: how UpdateMachine drives the agent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateConfig {
    /// `retryAfterSeconds` while an operation runs (settings `retryAfterSeconds`).
    #[serde(default = "default_retry")]
    pub retry_after_seconds: i32,
    /// `agent-handles` (the agent reboots by itself once staged) or `forbidden` (changes
    /// that need a reboot are not covered). Settings `rebootPolicy`.
    #[serde(default = "default_reboot")]
    pub reboot_policy: String,
    /// `affectsAvailability` in CanUpdate answers: `auto` (from the covered changes'
    /// disruption: drain or reboot affect availability, anything less does not), `true`
    /// or `false`. Settings `affectsAvailability`.
    #[serde(default = "default_availability")]
    pub affects_availability: String,
    /// With a `[cluster]` table: a live change (one that needs no reboot and upgrades no
    /// Kubernetes version) is applied as a timed try of this many seconds
    /// (`ApplyRequest.try_seconds`, README "Timed tries"), and confirmed only once the
    /// Node is Ready and its kubelet has renewed its Lease after the change; a change that
    /// cuts the node off the cluster is reverted by the agent at the deadline. 0 (the
    /// default): off. At most 86400 (the agent's limit). Settings `trySeconds`.
    #[serde(default)]
    pub try_seconds: u32,
}

/// The longest timed try the agent accepts, seconds (`MAX_TRY_SECONDS` of
/// `crates/agent/src/apply/try_window.rs`).
pub const MAX_TRY_SECONDS: u32 = 86_400;

/// Parses a `trySeconds` value: a whole number of seconds, 0 to [`MAX_TRY_SECONDS`].
pub fn parse_try_seconds(s: &str) -> Result<u32, String> {
    s.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n <= MAX_TRY_SECONDS)
        .ok_or_else(|| {
            format!("{s:?} is not a whole number of seconds from 0 (off) to {MAX_TRY_SECONDS}")
        })
}

fn default_availability() -> String {
    "auto".into()
}

/// Parses `auto` (None), `true`, `false` for `affectsAvailability`.
pub fn parse_availability(s: &str) -> Result<Option<bool>, String> {
    match s.to_ascii_lowercase().as_str() {
        "" | "auto" => Ok(None),
        "true" => Ok(Some(true)),
        "false" => Ok(Some(false)),
        other => Err(format!("{other:?} is not one of auto, true, false")),
    }
}

fn default_retry() -> i32 {
    30
}

fn default_reboot() -> String {
    "agent-handles".into()
}

impl Default for UpdateConfig {
    fn default() -> Self {
        UpdateConfig {
            retry_after_seconds: default_retry(),
            reboot_policy: default_reboot(),
            affects_availability: default_availability(),
            try_seconds: 0,
        }
    }
}

/// `[preservation]`: when to set `preserveOnInsufficientCoverage`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreservationConfig {
    /// `auto` (the node's recommendation; for MachineSets the infrastructure kind),
    /// `always` or `never`. Settings `preserveOnInsufficientCoverage` override it.
    #[serde(default = "default_mode")]
    pub mode: String,
    /// Infrastructure (template) kinds whose Machines are hardware-bound: in `auto` mode a
    /// MachineSet of these kinds is preserved.
    #[serde(default = "default_kinds")]
    pub hardware_bound_kinds: Vec<String>,
}

fn default_mode() -> String {
    "auto".into()
}

fn default_kinds() -> Vec<String> {
    [
        "Metal3MachineTemplate",
        "ByoMachineTemplate",
        "TinkerbellMachineTemplate",
    ]
    .map(String::from)
    .to_vec()
}

impl Default for PreservationConfig {
    fn default() -> Self {
        PreservationConfig {
            mode: default_mode(),
            hardware_bound_kinds: default_kinds(),
        }
    }
}

/// `[machine_set]`: the static capability model CanUpdateMachineSet answers from.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineSetConfig {
    /// Change families every agent of a MachineSet handles: `files`, `kubeletExtraArgs`,
    /// `ntp` (the default), and `kubernetes-version` (opt in when every agent has a
    /// `[kubernetes]` source: version changes a patch or one minor up, as the skew policy
    /// allows).
    #[serde(default = "default_caps")]
    pub capabilities: Vec<Capability>,
}

fn default_caps() -> Vec<Capability> {
    vec![
        Capability::Files,
        Capability::KubeletExtraArgs,
        Capability::Ntp,
    ]
}

impl Default for MachineSetConfig {
    fn default() -> Self {
        MachineSetConfig {
            capabilities: default_caps(),
        }
    }
}

/// `[metrics]`: Prometheus metrics ([`super::metrics`]).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` serving `GET /metrics` over plain HTTP (e.g. `0.0.0.0:9090`); empty:
    /// off. Counts only, no request content.
    #[serde(default)]
    pub listen: String,
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// HTTPS endpoint.
    pub server: ServerConfig,
    /// Agent client identity.
    pub agent: AgentConfig,
    /// Agent addresses.
    #[serde(default)]
    pub resolver: ResolverConfig,
    /// UpdateMachine behaviour.
    #[serde(default)]
    pub update: UpdateConfig,
    /// Preservation policy.
    #[serde(default)]
    pub preservation: PreservationConfig,
    /// MachineSet capability model.
    #[serde(default)]
    pub machine_set: MachineSetConfig,
    /// Prometheus metrics.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// The Kubernetes side (drain, Node readiness, Events, Machine addresses); absent: the
    /// extension talks to agents only and never drains.
    #[serde(default)]
    pub cluster: Option<ClusterConfig>,
}

/// `[cluster]`: how the extension reaches the management cluster and each workload
/// cluster, and how it drains (README "Draining and the cluster side").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// A kubeconfig file for the management cluster; absent: the in-cluster config (the
    /// Pod's ServiceAccount token and `KUBERNETES_SERVICE_HOST`).
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// The drain deadline, seconds, when the Machine sets no
    /// `spec.deletion.nodeDrainTimeoutSeconds` (v1beta2) / `spec.nodeDrainTimeout`
    /// (v1beta1) above 0. Default 600.
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout_seconds: u64,
    /// How long after the agent reports the change done the Node may take to be back
    /// (Ready, a new boot id after a reboot, the target kubelet version, and the workload
    /// cluster answering), seconds; then UpdateMachine answers `Failure` naming what it
    /// still waits for. Counted from the first answer that waited, kept on the Machine
    /// (annotation `inplaced.io/waiting-for-node`), so every replica and a restart count
    /// the same clock. Default 1800: a bare-metal server's firmware and POST alone can
    /// take ten minutes. Must be above 0.
    #[serde(default = "default_node_back_timeout")]
    pub node_back_timeout_seconds: u64,
    /// Whether Pods with `emptyDir` volumes are evicted (their data is lost): CAPI's
    /// Machine drain does (`DeleteEmptyDirData: true`), `kubectl drain` only with
    /// `--delete-emptydir-data`. Default true; false: such a Pod blocks the drain.
    #[serde(default = "default_true")]
    pub evict_local_storage: bool,
    /// Which `status.addresses` of the Machine the agent is reached at, in order of
    /// preference (`InternalIP`, `ExternalIP`, `Hostname`, `InternalDNS`, `ExternalDNS`),
    /// used when `resolver.static` and `resolver.template` give none.
    #[serde(default = "default_address_types")]
    pub address_types: Vec<String>,
    /// The agents' TCP port, with an address from `status.addresses`. Default 9443.
    #[serde(default = "default_agent_port")]
    pub agent_port: u16,
    /// The suffix of the workload cluster's kubeconfig Secret (`<cluster><suffix>`, key
    /// `value`, in the Machine's namespace): CAPI's own is `-kubeconfig`.
    #[serde(default = "default_kubeconfig_suffix")]
    pub workload_kubeconfig_secret_suffix: String,
}

fn default_drain_timeout() -> u64 {
    600
}

fn default_node_back_timeout() -> u64 {
    1800
}

fn default_true() -> bool {
    true
}

fn default_address_types() -> Vec<String> {
    ["InternalIP", "ExternalIP", "Hostname"]
        .map(String::from)
        .to_vec()
}

fn default_agent_port() -> u16 {
    9443
}

fn default_kubeconfig_suffix() -> String {
    "-kubeconfig".into()
}

impl ClusterConfig {
    fn check(&self) -> Result<(), (&'static str, String)> {
        const KNOWN: [&str; 5] = [
            "InternalIP",
            "ExternalIP",
            "Hostname",
            "InternalDNS",
            "ExternalDNS",
        ];
        if let Some(t) = self
            .address_types
            .iter()
            .find(|t| !KNOWN.contains(&t.as_str()))
        {
            return Err((
                "cluster.address_types",
                format!("{t:?} is not a Machine address type; use some of {KNOWN:?}"),
            ));
        }
        if self.drain_timeout_seconds == 0 {
            return Err((
                "cluster.drain_timeout_seconds",
                "must be above 0 (a drain without a deadline could block an update forever)".into(),
            ));
        }
        if self.node_back_timeout_seconds == 0 {
            return Err((
                "cluster.node_back_timeout_seconds",
                "must be above 0 (a Node that never comes back would hold the update forever)"
                    .into(),
            ));
        }
        Ok(())
    }
}

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: p.clone(),
            source,
        })?;
        Config::parse(&text, &p)
    }

    /// Parses and validates TOML text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let c: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.into(),
            message: e.to_string(),
        })?;
        c.check().map_err(|(key, message)| ConfigError::Invalid {
            path: origin.into(),
            key: key.into(),
            message,
        })?;
        Ok(c)
    }

    /// What is wrong with a parsed config, as (key, message); checked in this order:
    /// the update choices, the server's limits, its clients, the resolver.
    fn check(&self) -> Result<(), (&'static str, String)> {
        self.check_update()?;
        self.check_server_limits()?;
        self.check_clients()?;
        if let Some(c) = &self.cluster {
            c.check()?;
        }
        self.resolver
            .check(&self.agent.server_name, self.cluster.is_some())
    }

    /// The update section's choices: preservation mode, reboot policy, availability,
    /// retry interval.
    fn check_update(&self) -> Result<(), (&'static str, String)> {
        PreserveMode::parse(&self.preservation.mode).map_err(|m| {
            (
                "preservation.mode",
                m.replace("settings.preserveOnInsufficientCoverage: ", ""),
            )
        })?;
        parse_reboot_policy(&self.update.reboot_policy).map_err(|m| ("update.reboot_policy", m))?;
        parse_availability(&self.update.affects_availability)
            .map_err(|m| ("update.affects_availability", m))?;
        if self.update.retry_after_seconds < 1 {
            return Err((
                "update.retry_after_seconds",
                "must be at least 1 (0 would mean done to CAPI)".into(),
            ));
        }
        parse_try_seconds(&self.update.try_seconds.to_string())
            .map_err(|m| ("update.try_seconds", m))?;
        if self.update.try_seconds > 0 && self.cluster.is_none() {
            return Err((
                "update.try_seconds",
                "needs a [cluster] table: a try is confirmed from the Node's readiness in the workload cluster".into(),
            ));
        }
        Ok(())
    }

    /// The server's limits: request sizes, counts, handshakes, the handler timeout.
    fn check_server_limits(&self) -> Result<(), (&'static str, String)> {
        if self.server.max_request_mib < crate::budget::MAX_BODY >> 20 {
            return Err((
                "server.max_request_mib",
                format!(
                    "{} is less than one largest request body ({} MiB): such a request could never be read; set at least {}",
                    self.server.max_request_mib,
                    crate::budget::MAX_BODY >> 20,
                    crate::budget::MAX_BODY >> 20
                ),
            ));
        }
        let least = crate::budget::MAX_PARSED_MIB;
        if self.server.max_parsed_mib < least {
            return Err((
                "server.max_parsed_mib",
                format!(
                    "{} is less than one request of the most JSON values takes parsed ({least} MiB): such a request could never be answered; set at least {least}",
                    self.server.max_parsed_mib
                ),
            ));
        }
        for (key, v) in [
            ("server.max_requests", self.server.max_requests),
            ("server.max_connections", self.server.max_connections),
            ("server.handshake_budget", self.server.handshake_budget),
            (
                "server.handshakes_per_source",
                self.server.handshakes_per_source,
            ),
        ] {
            if v == 0 {
                return Err((key, "must be at least 1 (0 would answer no request)".into()));
            }
        }
        if self.server.handshakes_per_source > self.server.handshake_budget {
            return Err((
                "server.handshakes_per_source",
                format!(
                    "{} is more than server.handshake_budget ({})",
                    self.server.handshakes_per_source, self.server.handshake_budget
                ),
            ));
        }
        if self.server.max_connections > 1 << 20 || self.server.handshake_budget > 1 << 20 {
            return Err((
                "server.max_connections",
                "server.max_connections and server.handshake_budget: at most 1048576 each (descriptors)".into(),
            ));
        }
        if !(1..=30).contains(&self.server.handler_timeout_seconds) {
            return Err((
                "server.handler_timeout_seconds",
                format!(
                    "{} is outside 1..=30: CAPI rejects a whole discovery answer whose timeoutSeconds is over 30",
                    self.server.handler_timeout_seconds
                ),
            ));
        }
        Ok(())
    }

    /// The client CA and the identities allowed to call.
    fn check_clients(&self) -> Result<(), (&'static str, String)> {
        if self.server.client_ca.is_none() {
            return Err((
                "server.client_ca",
                "required: the CA bundle that signs the client certificates CAPI's managers present (--runtime-extension-client-cert-file); without it anyone who reaches the port could drive every node".into(),
            ));
        }
        if self.server.clients.is_empty() {
            return Err((
                "server.clients",
                "list at least one [[server.clients]] identity (the URI SAN, DNS SAN or CN of CAPI's client certificates)".into(),
            ));
        }
        for (i, e) in self.server.clients.iter().enumerate() {
            inplace_edge::listener::IdentityKind::check_entry(
                &format!("server.clients[{i}]"),
                &e.identity,
                e.kind,
            )
            .map_err(|m| ("server.clients", m))?;
        }
        Ok(())
    }
}

/// Parses `agent-handles` / `forbidden`.
pub fn parse_reboot_policy(s: &str) -> Result<RebootPolicy, String> {
    match s {
        "agent-handles" => Ok(RebootPolicy::AgentHandles),
        "forbidden" => Ok(RebootPolicy::Forbidden),
        other => Err(format!("{other:?} is not one of agent-handles, forbidden")),
    }
}

/// Parses a Go-style duration as CAPI users write them in settings: `500ms`, `5s`, `2m`,
/// or bare seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as \"5s\""))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "m" => n
            .checked_mul(60)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("{s:?} is too long")),
        _ => Err(format!(
            "{s:?} is not a duration such as \"5s\" (units ms, s, m)"
        )),
    }
}

/// The per-request view: the file config with the ExtensionConfig `settings` applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Effective {
    /// Preservation mode.
    pub preserve: PreserveMode,
    /// Agent call timeout.
    pub agent_timeout: Duration,
    /// UpdateMachine retry interval, seconds.
    pub retry_after_seconds: i32,
    /// Reboot policy for coverage and apply.
    pub reboot_policy: RebootPolicy,
    /// `affectsAvailability` forced (`Some`) or from the coverage (`None`).
    pub affects_availability: Option<bool>,
    /// The timed try of a live change, seconds (0: none); used only with `[cluster]`.
    pub try_seconds: u32,
    /// Settings this extension does not know (logged: likely a typo).
    pub unknown: Vec<String>,
}

/// The ExtensionConfig settings [`Config::effective`] reads.
pub const SETTINGS: [&str; 7] = [
    "preserveOnInsufficientCoverage",
    "agentTimeout",
    "agentCoverageTimeout",
    "retryAfterSeconds",
    "rebootPolicy",
    "affectsAvailability",
    "trySeconds",
];

impl Config {
    /// Applies `settings` (`preserveOnInsufficientCoverage`, `agentTimeout` or its alias
    /// `agentCoverageTimeout`, `retryAfterSeconds`, `rebootPolicy`,
    /// `affectsAvailability`, `trySeconds`); unknown keys are
    /// listed in [`Effective::unknown`]. Errors name the setting and the accepted values.
    pub fn effective(&self, settings: &BTreeMap<String, String>) -> Result<Effective, String> {
        let preserve = PreserveMode::parse(
            settings
                .get("preserveOnInsufficientCoverage")
                .unwrap_or(&self.preservation.mode),
        )?;
        let agent_timeout = match settings
            .get("agentTimeout")
            .or_else(|| settings.get("agentCoverageTimeout"))
        {
            Some(v) => parse_duration(v).map_err(|e| format!("settings.agentTimeout: {e}"))?,
            None => Duration::from_secs(self.agent.timeout_seconds),
        };
        let retry_after_seconds = match settings.get("retryAfterSeconds") {
            Some(v) => v.parse::<i32>().ok().filter(|n| *n >= 1).ok_or_else(|| {
                format!("settings.retryAfterSeconds: {v:?} is not a whole number of seconds >= 1")
            })?,
            None => self.update.retry_after_seconds,
        };
        let reboot_policy = parse_reboot_policy(
            settings
                .get("rebootPolicy")
                .unwrap_or(&self.update.reboot_policy),
        )
        .map_err(|e| format!("settings.rebootPolicy: {e}"))?;
        let affects_availability = parse_availability(
            settings
                .get("affectsAvailability")
                .unwrap_or(&self.update.affects_availability),
        )
        .map_err(|e| format!("settings.affectsAvailability: {e}"))?;
        let try_seconds = match settings.get("trySeconds") {
            Some(v) => parse_try_seconds(v).map_err(|e| format!("settings.trySeconds: {e}"))?,
            None => self.update.try_seconds,
        };
        // as update.try_seconds is refused at start without [cluster]: a try nothing could
        // confirm would otherwise be applied as an ordinary change, silently
        if try_seconds > 0 && self.cluster.is_none() {
            return Err(format!(
                "settings.trySeconds: {try_seconds} needs the extension's [cluster] table (the Node's Lease confirms a timed try); add [cluster] to the extension's config, or remove the setting"
            ));
        }
        let unknown = settings
            .keys()
            .filter(|k| !SETTINGS.contains(&k.as_str()))
            .cloned()
            .collect();
        Ok(Effective {
            preserve,
            agent_timeout,
            retry_after_seconds,
            reboot_policy,
            affects_availability,
            try_seconds,
            unknown,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = "[server]\nlisten = \"127.0.0.1:9443\"\ncert = \"c\"\nkey = \"k\"\nclient_ca = \"ca\"\n[[server.clients]]\nidentity = \"capi\"\n[agent]\nca = \"a\"\ncert = \"c\"\nkey = \"k\"\n[resolver]\ntemplate = \"{name}.{namespace}:7443\"\n";

    #[test]
    fn defaults_and_settings() {
        let c = Config::parse(MIN, "t").unwrap();
        let e = c.effective(&BTreeMap::new()).unwrap();
        assert_eq!(e.preserve, PreserveMode::Auto);
        assert_eq!(e.retry_after_seconds, 30);
        assert_eq!(e.agent_timeout, Duration::from_secs(5));
        let s: BTreeMap<String, String> = [
            ("agentCoverageTimeout", "1500ms"),
            ("preserveOnInsufficientCoverage", "false"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .into();
        let e = c.effective(&s).unwrap();
        assert_eq!(
            (e.agent_timeout, e.preserve),
            (Duration::from_millis(1500), PreserveMode::Never)
        );
        let typo: BTreeMap<String, String> = [(
            "preserveOnInsufficentCoverage".to_string(),
            "false".to_string(),
        )]
        .into();
        assert_eq!(
            c.effective(&typo).unwrap().unknown,
            vec!["preserveOnInsufficentCoverage"]
        );
        assert!(parse_duration("99999999999999999999m").is_err());
        assert!(
            parse_duration("307445734561825861m")
                .unwrap_err()
                .contains("too long")
        );
        let bad: BTreeMap<String, String> =
            [("retryAfterSeconds".to_string(), "0".to_string())].into();
        assert!(
            c.effective(&bad)
                .unwrap_err()
                .contains("settings.retryAfterSeconds")
        );
    }

    /// A timed try needs `[cluster]` (its confirmation is the Node's readiness), and the
    /// agent's limit; the setting overrides the file.
    #[test]
    fn try_seconds_needs_the_cluster_and_a_window_the_agent_takes() {
        let with = |update: &str, cluster: &str| {
            Config::parse(&format!("{MIN}[update]\n{update}\n{cluster}"), "t")
        };
        let e = with("try_seconds = 300", "").unwrap_err().to_string();
        assert!(
            e.contains("update.try_seconds") && e.contains("[cluster]"),
            "{e}"
        );
        let e = with("try_seconds = 86401", "[cluster]\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("update.try_seconds") && e.contains("86400"),
            "{e}"
        );
        let c = with("try_seconds = 300", "[cluster]\n").unwrap();
        assert_eq!(c.effective(&BTreeMap::new()).unwrap().try_seconds, 300);
        let s = |v: &str| BTreeMap::from([("trySeconds".to_string(), v.to_string())]);
        assert_eq!(c.effective(&s("0")).unwrap().try_seconds, 0);
        assert!(
            c.effective(&s("5m"))
                .unwrap_err()
                .contains("settings.trySeconds: \"5m\" is not a whole number of seconds")
        );
        // the setting without [cluster]: refused as the config key is, never ignored
        let bare = Config::parse(MIN, "t").unwrap();
        assert_eq!(
            bare.effective(&s("30")).unwrap_err(),
            "settings.trySeconds: 30 needs the extension's [cluster] table (the Node's Lease confirms a timed try); add [cluster] to the extension's config, or remove the setting"
        );
        assert_eq!(bare.effective(&s("0")).unwrap().try_seconds, 0);
    }

    /// The configuration `deploy/extension.yaml` ships is valid, and requires CAPI's
    /// client certificate.
    #[test]
    fn the_deployed_config_parses() {
        let yaml = include_str!("../../../deploy/extension.yaml");
        let start = yaml
            .find("  config.toml: |\n")
            .expect("config.toml in the ConfigMap")
            + "  config.toml: |\n".len();
        let block: String = yaml[start..]
            .lines()
            .take_while(|l| l.is_empty() || l.starts_with("    "))
            .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
            .collect();
        let c = Config::parse(&block, "deploy/extension.yaml").unwrap();
        assert!(c.server.client_ca.is_some());
        assert_eq!(c.server.clients.len(), 2);
        assert_eq!(c.resolver.node_name.as_deref(), Some("{name}"));
    }

    #[test]
    fn handler_timeout_and_availability_are_checked() {
        let e = Config::parse(
            &MIN.replace("client_ca = ", "handler_timeout_seconds = 31\nclient_ca = "),
            "t",
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("server.handler_timeout_seconds: 31 is outside 1..=30"),
            "{e}"
        );
        let c = Config::parse(MIN, "t").unwrap();
        assert_eq!(
            c.effective(&BTreeMap::new()).unwrap().affects_availability,
            None
        );
        let s: BTreeMap<String, String> =
            [("affectsAvailability".to_string(), "false".to_string())].into();
        assert_eq!(c.effective(&s).unwrap().affects_availability, Some(false));
        let bad: BTreeMap<String, String> =
            [("affectsAvailability".to_string(), "maybe".to_string())].into();
        assert!(
            c.effective(&bad)
                .unwrap_err()
                .contains("settings.affectsAvailability")
        );
    }

    #[test]
    fn client_auth_is_required() {
        let e = Config::parse(&MIN.replace("client_ca = \"ca\"\n", ""), "t").unwrap_err();
        assert!(e.to_string().contains("server.client_ca: required"), "{e}");
        let e = Config::parse(
            &MIN.replace("[[server.clients]]\nidentity = \"capi\"\n", ""),
            "t",
        )
        .unwrap_err();
        assert!(e.to_string().contains("server.clients"), "{e}");
        let e = Config::parse(
            &MIN.replace(
                "[resolver]\n",
                "[resolver]\nnode_name = \"{annotation:node}\"\n",
            ),
            "t",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("resolver.node_name: may use only"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_the_key() {
        let e = Config::parse(
            &MIN.replace("[resolver]\ntemplate = \"{name}.{namespace}:7443\"\n", ""),
            "t",
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("resolver: give a [cluster] table"),
            "{e}"
        );
        let e =
            Config::parse(&format!("{MIN}[update]\nreboot_policy = \"yes\"\n"), "t").unwrap_err();
        assert!(e.to_string().contains("update.reboot_policy"), "{e}");
    }
}
