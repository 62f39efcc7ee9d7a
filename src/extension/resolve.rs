//! Finding a Machine's agent: one trait, one implementation per source (a static map, a
//! template over the Machine's name, namespace, annotations and labels). A lookup of
//! Machine addresses through the Kubernetes API can be added as another implementation.

use std::collections::BTreeMap;

use serde_json::Value;

/// What the resolver may use of a Machine (from the hook request, already trimmed by CAPI
/// to name, namespace, labels and annotations).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineRef {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `status.nodeRef.name`, when the request carries it (CAPI trims hook objects to
    /// metadata and spec today, so usually absent).
    pub node_ref: Option<String>,
}

impl MachineRef {
    /// Reads the metadata of a Machine object.
    pub fn of(machine: &Value) -> MachineRef {
        let md = &machine["metadata"];
        let map = |v: &Value| -> BTreeMap<String, String> {
            v.as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                        .collect()
                })
                .unwrap_or_default()
        };
        MachineRef {
            name: md["name"].as_str().unwrap_or("").to_string(),
            namespace: md["namespace"].as_str().unwrap_or("").to_string(),
            labels: map(&md["labels"]),
            annotations: map(&md["annotations"]),
            node_ref: machine["status"]["nodeRef"]["name"]
                .as_str()
                .filter(|n| !n.is_empty())
                .map(str::to_string),
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Finds the `host:port` of a Machine's agent API (mTLS gRPC).
pub trait AgentResolver: Send + Sync + std::fmt::Debug {
    /// The address, or why there is none (names the Machine and the config key).
    fn resolve(&self, m: &MachineRef) -> Result<String, String>;
}

/// `resolver.static`: `namespace/name` → `host:port`.
#[derive(Debug, Clone, Default)]
pub struct StaticResolver(pub BTreeMap<String, String>);

impl AgentResolver for StaticResolver {
    fn resolve(&self, m: &MachineRef) -> Result<String, String> {
        self.0
            .get(&m.key())
            .cloned()
            .ok_or_else(|| format!("no resolver.static entry for {}", m.key()))
    }
}

/// `resolver.template`: `{name}`, `{namespace}`, `{annotation:<key>}`, `{label:<key>}`.
///
/// Which placeholders are safe: `{name}` and `{namespace}` never change for a Machine.
/// Annotations and labels can be edited by anyone who may edit Machine objects, so a
/// template that uses them lets such a user point a Machine at another node's agent; that
/// is harmless only because UpdateMachine first checks that the agent reports the
/// Machine's node ([`expected_node_name`]), which comes from `{name}`/`{namespace}` only.
#[derive(Debug, Clone)]
pub struct TemplateResolver(pub String);

/// Expands the placeholders of `template` for `m`; `extra` adds more (`{host}`). Errors
/// name a missing annotation or label, or an unknown placeholder.
pub fn expand(template: &str, m: &MachineRef, extra: &[(&str, &str)]) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        let Some(j) = rest[i..].find('}') else {
            return Err(format!("template {template:?}: unclosed {{"));
        };
        let ph = &rest[i + 1..i + j];
        let v = match ph {
            "name" => m.name.clone(),
            "namespace" => m.namespace.clone(),
            _ => {
                if let Some(k) = ph.strip_prefix("annotation:") {
                    m.annotations
                        .get(k)
                        .cloned()
                        .ok_or_else(|| format!("Machine {} has no annotation {k}", m.key()))?
                } else if let Some(k) = ph.strip_prefix("label:") {
                    m.labels
                        .get(k)
                        .cloned()
                        .ok_or_else(|| format!("Machine {} has no label {k}", m.key()))?
                } else if let Some((_, v)) = extra.iter().find(|(n, _)| *n == ph) {
                    v.to_string()
                } else {
                    return Err(format!(
                        "template {template:?}: unknown placeholder {{{ph}}}"
                    ));
                }
            }
        };
        out.push_str(&v);
        rest = &rest[i + j + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

impl AgentResolver for TemplateResolver {
    fn resolve(&self, m: &MachineRef) -> Result<String, String> {
        expand(&self.0, m, &[])
    }
}

/// The Kubernetes node name the agent of `m` must report before UpdateMachine changes
/// anything: `template` (`resolver.node_name`, default `{name}`, over `{name}` and
/// `{namespace}` only), or with `trust_node_ref` the request's `status.nodeRef.name` when
/// it carries one; lower-cased as node names are.
pub fn expected_node_name(
    m: &MachineRef,
    template: Option<&str>,
    trust_node_ref: bool,
) -> Result<String, String> {
    if let Some(n) = m.node_ref.as_ref().filter(|_| trust_node_ref) {
        return Ok(n.to_lowercase());
    }
    let bare = MachineRef {
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        ..Default::default()
    };
    expand(template.unwrap_or("{name}"), &bare, &[])
        .map(|n| n.to_lowercase())
        .map_err(|e| format!("resolver.node_name: {e}"))
}

/// Tries each resolver in order; the first address wins. Errors list every miss.
#[derive(Debug, Default)]
pub struct Chain(pub Vec<Box<dyn AgentResolver>>);

impl AgentResolver for Chain {
    fn resolve(&self, m: &MachineRef) -> Result<String, String> {
        let mut misses = Vec::new();
        for r in &self.0 {
            match r.resolve(m) {
                Ok(a) => return Ok(a),
                Err(e) => misses.push(e),
            }
        }
        Err(format!(
            "no agent address for Machine {}: {}",
            m.key(),
            misses.join("; ")
        ))
    }
}

/// The host part of `host:port` (IPv6 in brackets kept without them).
pub fn host_of(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_placeholders() {
        let mut m = MachineRef {
            name: "edge-1-cp-7xk2p".into(),
            namespace: "site-a".into(),
            ..Default::default()
        };
        m.annotations
            .insert("inplace.example/port".into(), "7443".into());
        let t = TemplateResolver(
            "{name}.{namespace}.nodes.example.invalid:{annotation:inplace.example/port}".into(),
        );
        assert_eq!(
            t.resolve(&m).unwrap(),
            "edge-1-cp-7xk2p.site-a.nodes.example.invalid:7443"
        );
        let e = TemplateResolver("{label:rack}:1".into())
            .resolve(&m)
            .unwrap_err();
        assert_eq!(e, "Machine site-a/edge-1-cp-7xk2p has no label rack");
        let chain = Chain(vec![
            Box::new(StaticResolver::default()),
            Box::new(TemplateResolver("{nope}".into())),
        ]);
        let e = chain.resolve(&m).unwrap_err();
        assert!(
            e.contains("no resolver.static entry for site-a/edge-1-cp-7xk2p")
                && e.contains("unknown placeholder {nope}"),
            "{e}"
        );
        assert_eq!(host_of("[::1]:7443"), "::1");
        assert_eq!(host_of("node-3:7443"), "node-3");
    }
}
