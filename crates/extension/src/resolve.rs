//! Finding a Machine's agent: one trait, one implementation per source (a static map, a
//! template over the Machine's name, namespace, annotations and labels). A lookup of
//! Machine addresses through the Kubernetes API can be added as another implementation.

use std::collections::BTreeMap;

use serde_json::Value;

/// What the resolver may use of a Machine (from the hook request, already trimmed by CAPI
/// to name, namespace, labels and annotations).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MachineRef {
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
    /// `status.addresses` as (type, address), read from the management cluster when a
    /// `[cluster]` table is configured ([`AddressResolver`]); empty otherwise.
    pub addresses: Vec<(String, String)>,
}

impl MachineRef {
    /// Reads the metadata of a Machine object.
    pub(crate) fn of(machine: &Value) -> MachineRef {
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
            addresses: Vec::new(),
        }
    }

    /// `namespace/name`.
    pub(crate) fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Finds the `host:port` of a Machine's agent API (mTLS gRPC).
pub(crate) trait AgentResolver: Send + Sync + std::fmt::Debug {
    /// The address, or why there is none (names the Machine and the config key).
    fn resolve(&self, m: &MachineRef) -> Result<String, String>;
}

/// `resolver.static`: `namespace/name` → `host:port`.
#[derive(Debug, Clone, Default)]
pub(crate) struct StaticResolver(pub BTreeMap<String, String>);

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
pub(crate) struct TemplateResolver(pub String);

/// Expands the placeholders of `template` for `m`; `extra` adds more (`{host}`). Errors
/// name a missing annotation or label, or an unknown placeholder.
pub(crate) fn expand(
    template: &str,
    m: &MachineRef,
    extra: &[(&str, &str)],
) -> Result<String, String> {
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
pub(crate) fn expected_node_name(
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

/// Whether `template` takes anything from a Machine's annotations or labels, which anyone
/// who may edit Machine objects can set.
pub(crate) fn uses_metadata(template: &str) -> bool {
    template.contains("{annotation:") || template.contains("{label:")
}

/// The host part of an address template: the text before its last `:` outside `{...}`
/// (so `{annotation:port}` is not taken for the port separator).
fn template_host(template: &str) -> &str {
    let mut depth = 0usize;
    let mut cut = template.len();
    for (i, c) in template.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ':' if depth == 0 => cut = i,
            _ => {}
        }
    }
    &template[..cut]
}

/// Checks at config load that a Machine of one namespace can never be sent to the agent of
/// a node of another: two Machines may share a name across namespaces (one namespace's
/// editors can create a Machine named like another's), and the node check
/// ([`expected_node_name`]) compares node names only. Bound means one of:
/// - `namespaces` (`resolver.namespaces`) lists a single namespace, the only one served;
/// - the template's host part uses `{namespace}` and no annotation or label (the operator's
///   DNS then says which host serves which namespace);
/// - `server_name` (`agent.server_name`, the name verified in the agent's certificate
///   before anything is sent) uses `{namespace}` and only `{name}` and `{namespace}`
///   (the operator's agent CA then binds each node to its Machine's namespace).
///
/// `resolver.static` needs no check (the operator writes every `namespace/name`). The
/// error states the three fixes.
pub(crate) fn check_namespace_binding(
    template: &str,
    server_name: &str,
    namespaces: &[String],
) -> Result<(), String> {
    let host = template_host(template);
    let host_bound = namespace_label(host) && !uses_metadata(host);
    let name_bound = namespace_label(server_name)
        && !uses_metadata(server_name)
        && !server_name.contains("{host}");
    // one namespace served binds a host the operator's DNS gives, not one from metadata
    // (an annotation can name any agent that trusts the extension, in any namespace)
    let one_namespace = namespaces.len() == 1 && !uses_metadata(host);
    if host_bound || name_bound || one_namespace {
        return Ok(());
    }
    let why = if uses_metadata(host) {
        "its host comes from Machine annotations or labels, which any Machine editor can point at another namespace's node"
    } else {
        "its host does not have {namespace} as a label of its own, so a Machine of another namespace can reach the same node (edge-1 in cp-x and edge-1-cp in x both give edge-1-cp-x with {name}-{namespace})"
    };
    Err(format!(
        "{template:?}: {why}; use {{namespace}} as a whole DNS label (between dots) and no annotation or label in the host part, or set agent.server_name to a template with {{namespace}} as a whole label over {{name}}/{{namespace}} only (each agent's certificate then carries that SAN), or, for a host without annotations or labels, list the one namespace served in resolver.namespaces"
    ))
}

/// Checks a `resolver.static` entry at config load: the key is `namespace/name` (both
/// non-empty, one `/`), the value `host:port` with a port of 1-65535 (IPv6 in brackets).
/// A key of another form could never match a Machine (a `[resolver.static]` table written
/// above other `[resolver]` keys swallows them as entries, silently).
pub(crate) fn check_static_entry(key: &str, addr: &str) -> Result<(), String> {
    let ok_key = matches!(key.split_once('/'), Some((ns, n)) if !ns.is_empty() && !n.is_empty() && !n.contains('/'));
    if !ok_key {
        return Err(format!(
            "{key:?} is no \"namespace/name\" of a Machine (a key of the [resolver] table written below [resolver.static] lands there: put [resolver.static] last)"
        ));
    }
    let port = if addr.starts_with('[') {
        addr.rsplit_once("]:").map(|(_, p)| p)
    } else {
        addr.rsplit_once(':').map(|(_, p)| p)
    };
    match port.and_then(|p| p.parse::<u16>().ok()) {
        Some(p) if p > 0 && !host_of(addr).is_empty() => Ok(()),
        _ => Err(format!(
            "{key:?} = {addr:?}: not host:port (e.g. \"10.0.0.7:9443\" or \"[fd00::7]:9443\")"
        )),
    }
}

/// Whether `{namespace}` occurs in `text` as a DNS label of its own: each side the start
/// or end of the text or a `.` (`:` too after it, before a port). A namespace is an RFC
/// 1123 label (no dots), so only then does the expanded text give the namespace back:
/// `{name}-{namespace}` gives `edge-1-cp-x` for Machine `edge-1` in `cp-x` and for
/// `edge-1-cp` in `x`.
fn namespace_label(text: &str) -> bool {
    const NS: &str = "{namespace}";
    text.match_indices(NS).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + NS.len()..].chars().next();
        matches!(before, None | Some('.')) && matches!(after, None | Some('.' | ':'))
    })
}

/// Tries each resolver in order; the first address wins. Errors list every miss.
#[derive(Debug, Default)]
pub(crate) struct Chain(pub Vec<Box<dyn AgentResolver>>);

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

/// The Machine's `status.addresses` (`[cluster] address_types`, in order of preference;
/// `[cluster] agent_port`): the first address of the first type the Machine has. The
/// infrastructure provider writes them (Machine status; editable only with the status
/// subresource), and the agent is still checked to be the Machine's node, with its TLS
/// name from `agent.server_name`, before anything is sent.
#[derive(Debug, Clone)]
pub(crate) struct AddressResolver {
    /// Address types in order of preference (`InternalIP`, `ExternalIP`, `Hostname`).
    pub types: Vec<String>,
    /// The agents' port.
    pub port: u16,
}

impl AgentResolver for AddressResolver {
    fn resolve(&self, m: &MachineRef) -> Result<String, String> {
        pick_address(&m.addresses, &self.types, self.port).ok_or_else(|| {
            format!(
                "Machine {} has no status.addresses of a type in cluster.address_types {:?} (it has {:?})",
                m.key(),
                self.types,
                m.addresses.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>()
            )
        })
    }
}

/// `host:port` of the first address whose type comes first in `types` (IPv6 in
/// brackets).
pub(crate) fn pick_address(
    addrs: &[(String, String)],
    types: &[String],
    port: u16,
) -> Option<String> {
    types.iter().find_map(|t| {
        addrs
            .iter()
            .find(|(at, a)| at == t && !a.is_empty())
            .map(|(_, a)| {
                if a.contains(':') {
                    format!("[{a}]:{port}")
                } else {
                    format!("{a}:{port}")
                }
            })
    })
}

/// The host part of `host:port` (IPv6 in brackets kept without them).
pub(crate) fn host_of(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_by_preference() {
        let a = |t: &str, v: &str| (t.to_string(), v.to_string());
        let addrs = vec![
            a("Hostname", "node-7"),
            a("ExternalIP", "203.0.113.7"),
            a("InternalIP", "10.0.0.7"),
            a("InternalIP", "fd00::7"),
        ];
        let pref = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let types = pref(&["InternalIP", "ExternalIP", "Hostname"]);
        assert_eq!(
            pick_address(&addrs, &types, 9443).as_deref(),
            Some("10.0.0.7:9443")
        );
        assert_eq!(
            pick_address(&addrs[..2], &types, 9443).as_deref(),
            Some("203.0.113.7:9443")
        );
        assert_eq!(
            pick_address(&addrs[3..], &types, 1).as_deref(),
            Some("[fd00::7]:1")
        );
        assert_eq!(pick_address(&addrs[..1], &pref(&["InternalIP"]), 1), None);
        let m = MachineRef {
            name: "m".into(),
            namespace: "ns".into(),
            addresses: addrs[..1].to_vec(),
            ..Default::default()
        };
        let r = AddressResolver {
            types: pref(&["InternalIP"]),
            port: 1,
        };
        assert!(r.resolve(&m).unwrap_err().contains("it has [\"Hostname\"]"));
    }

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
        assert_eq!(
            template_host("{name}.{namespace}.x:{annotation:port}"),
            "{name}.{namespace}.x"
        );
    }

    #[test]
    fn static_entries_are_machine_keys_and_host_ports() {
        check_static_entry("site-a/edge-1", "10.0.0.7:9443").unwrap();
        check_static_entry("site-a/edge-1", "[fd00::7]:9443").unwrap();
        check_static_entry("site-a/edge-1", "node-1.example.com:9443").unwrap();
        for (k, v, why) in [
            ("node_name", "{name}", "no \"namespace/name\""),
            ("bogus", "10.0.0.7:9443", "no \"namespace/name\""),
            ("site-a/", "10.0.0.7:9443", "no \"namespace/name\""),
            ("site-a/edge-1", "not-an-address", "not host:port"),
            ("site-a/edge-1", "10.0.0.7:0", "not host:port"),
            ("site-a/edge-1", ":9443", "not host:port"),
        ] {
            let e = check_static_entry(k, v).unwrap_err();
            assert!(e.contains(why), "{k} {v}: {e}");
        }
    }

    #[test]
    fn a_template_must_bind_the_namespace() {
        let ok = |t: &str, sn: &str, ns: &[&str]| {
            let ns: Vec<String> = ns.iter().map(|s| s.to_string()).collect();
            check_namespace_binding(t, sn, &ns)
        };
        // bound by the host
        ok("{name}.{namespace}.nodes.example.com:7443", "{host}", &[]).unwrap();
        ok("{name}.{namespace}.x:{annotation:port}", "{host}", &[]).unwrap();
        // bound by the certificate name
        ok("{annotation:addr}", "{name}.{namespace}.agents", &[]).unwrap();
        // bound by serving one namespace (a host the operator's DNS gives)
        ok("{name}:7443", "{host}", &["site-a"]).unwrap();
        ok("{annotation:addr}", "{host}", &["site-a"]).unwrap_err();
        // {namespace} joined to other text is no binding (break-it finding 1)
        for t in [
            "{name}-{namespace}.x:1",
            "{name}{namespace}.x:1",
            "{namespace}-{name}.x:1",
            "x.{namespace}{name}:1",
        ] {
            ok(t, "{host}", &[]).unwrap_err();
        }
        ok("{annotation:a}", "{name}-{namespace}", &[]).unwrap_err();
        ok("{annotation:a}", "{namespace}{name}.agents", &[]).unwrap_err();
        ok("{namespace}.{name}.x:1", "{host}", &[]).unwrap();
        ok("{name}.{namespace}:1", "{host}", &[]).unwrap();
        // not bound: name only, annotations, labels, a server name from the host
        for (t, sn, why) in [
            ("{name}:7443", "{host}", "as a label of its own"),
            ("{annotation:addr}", "{host}", "annotations or labels"),
            (
                "{label:rack}.{namespace}.x:1",
                "{host}",
                "annotations or labels",
            ),
            (
                "{annotation:addr}",
                "{host}.{namespace}",
                "annotations or labels",
            ),
            (
                "{annotation:addr}",
                "{annotation:ns}",
                "annotations or labels",
            ),
        ] {
            let e = ok(t, sn, &[]).unwrap_err();
            assert!(
                e.contains(why) && e.contains("resolver.namespaces"),
                "{t} {sn}: {e}"
            );
        }
        assert!(ok("{name}:7443", "{host}", &["a", "b"]).is_err());
        assert_eq!(host_of("node-3:7443"), "node-3");
    }
}
