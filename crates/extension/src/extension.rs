//! The extension itself: its configuration, the agent resolver and the pool of agent
//! channels, and what every hook asks of them (the request's settings, the Machine's
//! agent, whether the Machine's namespace is served, whether an agent is the Machine's
//! node). The hooks are in [`crate::hooks`], routing and deadlines in [`crate::http`].

use tonic::transport::Channel;

use crate::config::{self, Config, Effective};
use crate::pool;
use crate::resolve::{self, AgentResolver, Chain, MachineRef, StaticResolver, TemplateResolver};
use inplace_edge::client::TlsIdentity;
use inplace_edge::logging::escape_controls as esc;
use inplace_wire::pb;
use inplace_wire::pb::node_agent_client::NodeAgentClient;

/// The extension: configuration and agent resolver.
#[derive(Debug)]
pub(crate) struct Extension {
    pub(crate) config: Config,
    resolver: Box<dyn AgentResolver>,
    /// One mutual-TLS channel per agent, reused across hooks.
    pub(crate) pool: std::sync::Arc<pool::Pool>,
    /// Hooks in flight, for giving freed memory back after a burst.
    pub(crate) activity: std::sync::Arc<crate::memory::Activity>,
    /// The Kubernetes side (`[cluster]`): drain, Node readiness, Events, addresses.
    pub(crate) kube: Option<crate::cluster::Kube>,
}

/// Why an agent could not be asked.
#[derive(Debug)]
pub(crate) struct AgentError(pub(crate) String);

impl Extension {
    /// An extension with the resolvers the config names (`resolver.static` first, then
    /// `resolver.template`).
    pub(crate) fn new(config: Config) -> Extension {
        let mut chain: Vec<Box<dyn AgentResolver>> = Vec::new();
        if !config.resolver.fixed.is_empty() {
            chain.push(Box::new(StaticResolver(config.resolver.fixed.clone())));
        }
        if let Some(t) = &config.resolver.template {
            chain.push(Box::new(TemplateResolver(t.clone())));
        }
        if let Some(c) = &config.cluster {
            chain.push(Box::new(resolve::AddressResolver {
                types: c.address_types.clone(),
                port: c.agent_port,
            }));
        }
        Extension {
            kube: config.cluster.clone().map(crate::cluster::Kube::new),
            config,
            resolver: Box::new(Chain(chain)),
            pool: std::sync::Arc::default(),
            activity: std::sync::Arc::default(),
        }
    }

    /// The effective settings of a request; unknown setting names are logged (a typo in
    /// the ExtensionConfig would otherwise silently change nothing).
    pub(crate) fn settings(
        &self,
        settings: &std::collections::BTreeMap<String, String>,
    ) -> Result<Effective, String> {
        let eff = self.config.effective(settings)?;
        for k in &eff.unknown {
            tracing::warn!(setting = %k, known = ?config::SETTINGS, "unknown ExtensionConfig setting ignored");
        }
        Ok(eff)
    }

    /// Closes the pool's idle channels every [`pool::PRUNE_EVERY`] until the extension
    /// is dropped, and gives memory freed since the last trim back
    /// ([`crate::memory::Activity::trim_if_used`]); [`crate::http::serve`] runs it.
    pub(crate) fn prune_pool(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let pool = std::sync::Arc::downgrade(&self.pool);
        let activity = std::sync::Arc::downgrade(&self.activity);
        async move {
            loop {
                tokio::time::sleep(pool::PRUNE_EVERY).await;
                let (Some(p), Some(a)) = (pool.upgrade(), activity.upgrade()) else {
                    return;
                };
                p.prune();
                // memory freed by the hooks that ended in the last second: a burst that
                // is still going, or whose last hook came within a second of a trim
                a.trim_if_used(std::time::Duration::ZERO);
            }
        }
    }

    /// A client for the Machine's agent: its pooled channel when there is one for the
    /// address and the identity files as they read now, else a new mutual-TLS
    /// connection with the identity's one client config ([`pool::Pool::client_config`]),
    /// pooled ([`pool`]). Returns the address, the client and the pool key
    /// (for [`pool::Pool::evict`] after a failed call).
    pub(crate) async fn agent(
        &self,
        m: &MachineRef,
        eff: &Effective,
    ) -> Result<(String, NodeAgentClient<Channel>, pool::Key), AgentError> {
        let addr = self.resolver.resolve(m).map_err(AgentError)?;
        let a = &self.config.agent;
        let read = |p: &std::path::Path, key: &str| {
            std::fs::read(p).map_err(|e| AgentError(format!("agent.{key} {}: {e}", p.display())))
        };
        let server_name = resolve::expand(&a.server_name, m, &[("host", resolve::host_of(&addr))])
            .map_err(|e| AgentError(format!("agent.server_name: {e}")))?;
        let id = TlsIdentity {
            ca: read(&a.ca, "ca")?,
            cert: read(&a.cert, "cert")?,
            key: read(&a.key, "key")?,
            server_name,
        };
        let key = pool::Key::new(&addr, &id);
        if let Some(channel) = self.pool.get(&key) {
            return Ok((addr, NodeAgentClient::new(channel), key));
        }
        let cfg = self
            .pool
            .client_config(&key, &id)
            .map_err(|e| AgentError(format!("agent at {addr}: {e:#}")))?;
        let channel = tokio::time::timeout(
            eff.agent_timeout,
            inplace_edge::client::connect_tls_channel_with(&addr, cfg, &id.server_name),
        )
        .await
        .map_err(|_| {
            AgentError(format!(
                "agent at {addr} did not answer within {:?}",
                eff.agent_timeout
            ))
        })?
        .map_err(|e| AgentError(format!("agent at {addr}: {e:#}")))?;
        self.pool.put(key.clone(), channel.clone());
        Ok((addr, NodeAgentClient::new(channel), key))
    }

    /// Whether the node check must pass before any spec is sent: the address may come
    /// from Machine annotations or labels (`resolver.template`), which a Machine editor
    /// can point at any agent, and a desired spec carries file contents. Otherwise the
    /// address is the operator's (static map, or a template over name and namespace) and
    /// UpdateMachine checks the node in its first round trip. With `[cluster]` the
    /// address may come from the Machine's `status.addresses`: checked first too.
    pub(crate) fn check_node_first(&self) -> bool {
        // an address from the Machine's status.addresses is not the operator's either
        self.config.cluster.is_some()
            || self
                .config
                .resolver
                .template
                .as_deref()
                .is_some_and(resolve::uses_metadata)
    }

    /// `Failure` text for a Machine whose namespace `resolver.namespaces` does not list.
    pub(crate) fn unserved(&self, m: &MachineRef) -> Option<String> {
        let ns = &self.config.resolver.namespaces;
        (!ns.is_empty() && !ns.contains(&m.namespace)).then(|| {
            format!(
                "Machine {} is in a namespace this extension does not serve (resolver.namespaces: {ns:?}): no node was asked",
                esc(&m.key())
            )
        })
    }

    /// Checks that the agent at `addr` reports the node Machine `m` runs on
    /// ([`resolve::expected_node_name`]); the error names both names and the fix. Both
    /// CanUpdateMachine ([`Extension::check_node_first`]) and the UpdateMachine driver
    /// check.
    pub(crate) fn check_node(
        &self,
        m: &MachineRef,
        addr: &str,
        status: &pb::NodeStatus,
    ) -> Result<(), String> {
        let r = &self.config.resolver;
        let want = resolve::expected_node_name(m, r.node_name.as_deref(), r.trust_node_ref)?;
        let have = status
            .facts
            .as_ref()
            .map(|f| f.node_name.as_str())
            .unwrap_or("");
        if have.is_empty() {
            return Err(format!(
                "the agent at {addr} reports no node name, so it can not be checked to be Machine {}'s node {want:?}; give the node a hostname or the kubelet --hostname-override",
                m.key()
            ));
        }
        if have != want {
            return Err(format!(
                "the agent at {addr} is node {have:?}, not Machine {}'s node {want:?}: nothing was changed; fix the resolver (resolver.static, resolver.template) or resolver.node_name",
                m.key()
            ));
        }
        Ok(())
    }
}
