//! The `kubelet` section's part of the NodeSpec: a partial KubeletConfiguration (a
//! JSON object whose fields are type-checked against the kubelet's catalogue,
//! [`inplace_formats::kubelet::fields`]) and kubelet flags (name without dashes → value).
//! Sources merge field by field: a leaf may be set by several sources only with the same
//! value, and a flag likewise.

use std::collections::BTreeMap;

use inplace_wire::names::SpecError;
use inplace_wire::pb;
use inplace_wire::structs::struct_to_json;

/// A partial KubeletConfiguration: a JSON object.
pub(crate) type KubeletConfig = serde_json::Map<String, serde_json::Value>;

/// The validated `kubelet` section.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KubeletSpec {
    /// Partial KubeletConfiguration, if any (never an empty object).
    pub config: Option<KubeletConfig>,
    /// Kubelet flags without dashes → value.
    pub flags: BTreeMap<String, String>,
}

/// Which source set each config leaf (path, value, `kubelet.config` or
/// `dropins[<name>].kubelet.config`) and each flag (`kubelet.flags[<name>]`...), for
/// errors naming both.
#[derive(Debug, Default)]
pub(crate) struct Sources {
    leaves: Vec<(Vec<String>, serde_json::Value, String)>,
    flags: BTreeMap<String, String>,
}

/// Validates the wire `kubelet` of one document: its config (a mapping without
/// `apiVersion` or `kind`, fields of the right types; None when empty) and its flags.
/// Errors name `kubelet.config.<field>` or `kubelet.flags[<name>]`.
pub(crate) fn from_pb(p: Option<&pb::Kubelet>) -> Result<KubeletSpec, SpecError> {
    let (mut config, mut flags) = (None, BTreeMap::new());
    let Some(k) = p else {
        return Ok(KubeletSpec { config, flags });
    };
    if let Some(cfg) = &k.config {
        let json = struct_to_json(cfg);
        // the agent refuses it on the wire, before decoding (inplace_wire::limits)
        if let Some(why) = inplace_wire::limits::config_too_deep(json_depth(&json)) {
            return Err(SpecError::new("kubelet.config", why));
        }
        let serde_json::Value::Object(map) = json else {
            return Err(SpecError::new("kubelet.config", "must be a mapping"));
        };
        for key in ["apiVersion", "kind"] {
            if map.contains_key(key) {
                return Err(SpecError::new(
                    format!("kubelet.config.{key}"),
                    "is set by the kubelet's config file; remove it from the partial KubeletConfiguration",
                ));
            }
        }
        inplace_formats::kubelet::fields::check_types(&map)
            .map_err(|(f, m)| SpecError::new(format!("kubelet.config.{f}"), m))?;
        if !map.is_empty() {
            config = Some(map);
        }
    }
    for (name, value) in &k.flags {
        validate_flag(&format!("kubelet.flags[{name}]"), name, value)?;
        flags.insert(name.clone(), value.clone());
    }
    Ok(KubeletSpec { config, flags })
}

/// How many maps and lists deep `v` nests (a scalar 0, a map of scalars 1), counted as
/// [`inplace_wire::limits::count`] counts them on the wire.
fn json_depth(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Object(m) => 1 + m.values().map(json_depth).max().unwrap_or(0),
        serde_json::Value::Array(a) => 1 + a.iter().map(json_depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Merges the `kubelet` of a source found under `prefix` into `spec`: the config leaf by
/// leaf, then the flags; a leaf (or an object on its path) or a flag an earlier source
/// sets to another value is an error naming both.
pub(crate) fn merge(
    sources: &mut Sources,
    spec: &mut KubeletSpec,
    part: KubeletSpec,
    prefix: &str,
) -> Result<(), SpecError> {
    merge_config(sources, &mut spec.config, part.config, prefix)?;
    merge_flags(sources, &mut spec.flags, part.flags, prefix)
}

/// Merges the config of a source (see [`merge`]).
fn merge_config(
    sources: &mut Sources,
    spec: &mut Option<KubeletConfig>,
    part: Option<KubeletConfig>,
    prefix: &str,
) -> Result<(), SpecError> {
    let Some(cfg) = part else {
        return Ok(());
    };
    let src = format!("{prefix}kubelet.config");
    let leaves = inplace_formats::kubelet::config::leaves(&serde_json::Value::Object(cfg.clone()));
    // leaves of one document never clash with each other: only earlier sources
    // are checked, so a spec without drop-ins costs no quadratic scan
    for (path, value) in leaves.iter().filter(|_| !sources.leaves.is_empty()) {
        let clash = sources.leaves.iter().find(|(p, v, _)| {
            let n = p.len().min(path.len());
            p[..n] == path[..n] && (p.len() != path.len() || v != value)
        });
        if let Some((p, v, other)) = clash {
            return Err(SpecError::new(
                format!("{src}.{}", path.join(".")),
                format!(
                    "{other}.{} is already set to {v}; a field may be set by several sources only with the same value",
                    p.join(".")
                ),
            ));
        }
    }
    match spec {
        None => *spec = Some(cfg),
        Some(map) => {
            for (path, value) in &leaves {
                set_leaf(map, path, value.clone());
            }
        }
    }
    sources
        .leaves
        .extend(leaves.into_iter().map(|(p, v)| (p, v, src.clone())));
    Ok(())
}

/// Merges the flags of a source (see [`merge`]).
fn merge_flags(
    sources: &mut Sources,
    spec: &mut BTreeMap<String, String>,
    part: BTreeMap<String, String>,
    prefix: &str,
) -> Result<(), SpecError> {
    for (name, value) in part {
        let src = format!("{prefix}kubelet.flags[{name}]");
        match spec.get(&name) {
            Some(v) if *v != value => {
                return Err(SpecError::new(
                    src,
                    format!(
                        "{} sets it to {v:?}, this source to {value:?}; set it once",
                        sources.flags.get(&name).cloned().unwrap_or_default()
                    ),
                ));
            }
            Some(_) => {}
            None => {
                sources.flags.insert(name.clone(), src);
                spec.insert(name, value);
            }
        }
    }
    Ok(())
}

/// The section's part of the canonical hash: `kubeletConfig` (its keys sorted; null when
/// not set) and `kubeletFlags` (always present: the hash of every spec has them).
pub(crate) fn hash(k: &KubeletSpec, v: &mut serde_json::Map<String, serde_json::Value>) {
    let config = k
        .config
        .clone()
        .map(serde_json::Value::Object)
        .map(crate::spec::canonical);
    v.insert("kubeletConfig".into(), serde_json::json!(config));
    v.insert("kubeletFlags".into(), serde_json::json!(k.flags));
}

/// Sets `value` at `path` in `map`, creating the objects on the way.
fn set_leaf(
    map: &mut serde_json::Map<String, serde_json::Value>,
    path: &[String],
    value: serde_json::Value,
) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = map;
    for k in parents {
        let next = cur
            .entry(k.clone())
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        if !next.is_object() {
            *next = serde_json::Value::Object(Default::default());
        }
        let serde_json::Value::Object(m) = next else {
            return;
        };
        cur = m;
    }
    cur.insert(last.clone(), value);
}

/// Validates a kubelet flag name and value: `[a-z0-9][a-z0-9-]*`, and a value with no
/// whitespace or control characters (systemd splits `$KUBELET_KUBEADM_ARGS` on whitespace).
pub(crate) fn validate_flag(field: &str, name: &str, value: &str) -> Result<(), SpecError> {
    let ok_name = !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok_name {
        return Err(SpecError::new(
            field,
            format!(
                "flag name {name:?} is not valid; write it without leading dashes, in lower case, e.g. max-pods"
            ),
        ));
    }
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(SpecError::new(
            field,
            "flag value contains whitespace or a control character; systemd splits KUBELET_KUBEADM_ARGS on whitespace, so such a value can not be passed",
        ));
    }
    Ok(())
}
