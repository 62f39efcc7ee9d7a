//! The NodeSpec file form: YAML with camelCase keys, like a Kubernetes object's spec.
//!
//! ```yaml
//! files:
//!   - path: /etc/sysctl.d/90-tuning.conf
//!     content: |
//!       vm.max_map_count = 262144
//!     mode: "0644"          # quoted octal string; an unquoted number is refused
//!     owner: root           # or "etcd:etcd", or numeric ids
//! kubelet:
//!   config: {maxPods: 250}  # partial KubeletConfiguration
//!   flags: {max-pods: "250"}
//! kernelArgs: [isolcpus=2-7, nohz_full=2-7]
//! sysctls: {vm.max_map_count: "262144"}
//! ntp:
//!   servers: [ntp1.example.com, ntp2.example.com]
//! kubernetes:
//!   version: v1.35.2        # upgraded in place with kubeadm
//! dropins:                  # NodeSpec drop-ins kept in /etc/inplaced/node.d
//!   - name: 10-tuning.yaml
//!     content: |
//!       sysctls: {vm.swappiness: "10"}
//! ```
//!
//! Unknown keys are refused (a misspelt section must not be silently ignored). `mode` must
//! be a quoted octal string: YAML 1.1 parsers (go-yaml v2, PyYAML) read an unquoted `0644`
//! as octal 420 while YAML 1.2 parsers read it as decimal 644, so the same file would mean
//! two different modes.

use std::collections::BTreeMap;

use base64::Engine;
use serde::Deserialize;
use serde_json::Value;

use crate::names::SpecError;
use crate::pb;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[schemars(
    title = "inplaced NodeSpec",
    description = "The desired node state inplaced manages (the file form of inplacectl apply -f, coverage -f, validate -f and /etc/inplaced/node.d drop-ins). Validate a file fully with `inplacectl validate -f FILE`: this schema checks the shape, the agent also checks the values."
)]
struct YamlSpec {
    /// Files inplaced writes, each item a whole file.
    #[serde(default)]
    files: Vec<YamlFile>,
    /// The kubelet's configuration (a partial KubeletConfiguration) and flags.
    #[serde(default)]
    kubelet: Option<YamlKubelet>,
    /// Kernel arguments, in order, each one argument as the kernel tokenizes it. Quote an
    /// argument with a comma in a flow list: ["console=ttyS1,115200n8"].
    #[serde(default)]
    kernel_args: Vec<String>,
    /// sysctl keys (dotted) and their values, as scalars.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, SchemaScalar>")]
    sysctls: BTreeMap<String, Value>,
    /// NTP servers.
    #[serde(default)]
    ntp: Option<YamlNtp>,
    /// The Kubernetes version, upgraded in place with kubeadm.
    #[serde(default)]
    kubernetes: Option<YamlKubernetes>,
    /// NodeSpec drop-ins kept in /etc/inplaced/node.d.
    #[serde(default)]
    dropins: Vec<YamlDropIn>,
}

/// A YAML scalar (string, number or boolean), kept as written.
#[derive(schemars::JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum SchemaScalar {
    /// A string.
    String(String),
    /// A number.
    Number(f64),
    /// A boolean.
    Bool(bool),
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct YamlKubernetes {
    /// A Kubernetes version, e.g. v1.35.2.
    #[serde(default)]
    version: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct YamlNtp {
    /// Host names or addresses of NTP servers.
    #[serde(default)]
    servers: Vec<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct YamlDropIn {
    /// The drop-in's file name in /etc/inplaced/node.d ([A-Za-z0-9._-], ending .yaml).
    #[serde(default)]
    name: String,
    /// The drop-in: a NodeSpec in this form, without dropins.
    #[serde(default)]
    content: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct YamlFile {
    /// Absolute path on the node.
    #[serde(default)]
    path: String,
    /// The content as text (or contentBase64, not both).
    #[serde(default)]
    content: Option<String>,
    /// The content, base64 (standard alphabet, padded).
    #[serde(default)]
    content_base64: Option<String>,
    /// The mode as a quoted octal string ("0644"); an unquoted number is refused.
    #[serde(default)]
    #[schemars(with = "Option<String>", regex(pattern = r"^[0-7]{3,4}$"))]
    mode: Option<Value>,
    /// Owner: a user name or a numeric id.
    #[serde(default)]
    #[schemars(with = "Option<SchemaScalar>")]
    owner: Option<Value>,
    /// Group: a group name or a numeric id.
    #[serde(default)]
    #[schemars(with = "Option<SchemaScalar>")]
    group: Option<Value>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct YamlKubelet {
    /// A partial KubeletConfiguration (kubelet.config.k8s.io/v1beta1), camelCase keys.
    #[serde(default)]
    #[schemars(with = "Option<serde_json::Map<String, Value>>")]
    config: Option<Value>,
    /// kubelet flags without the leading --, and their values as scalars.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, SchemaScalar>")]
    flags: BTreeMap<String, Value>,
}

/// The JSON Schema (draft 2020-12) of the file form, derived from the types [`parse`]
/// reads it with (schemars): the keys, their types and the `mode` pattern. Editors and CI
/// linters use it (`docs/nodespec.schema.json`); the values' rules are the agent's
/// (`inplacectl validate -f`).
pub fn json_schema() -> serde_json::Value {
    let mut v = serde_json::to_value(schemars::schema_for!(YamlSpec)).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "$id".into(),
            "https://inplaced.example.invalid/nodespec.schema.json".into(),
        );
    }
    v
}

/// Parses an octal mode string ("0640", "1777", "644").
///
/// Errors name `field` and explain the quoting rule when given a YAML number.
pub fn parse_mode(field: &str, v: &Value) -> Result<u32, SpecError> {
    match v {
        Value::String(s) => {
            let digits = s.strip_prefix("0o").unwrap_or(s);
            if !(3..=5).contains(&digits.len()) || !digits.chars().all(|c| ('0'..='7').contains(&c))
            {
                return Err(SpecError::new(
                    field,
                    format!("{s:?} is not an octal mode; write it like \"0644\" or \"1777\""),
                ));
            }
            let m = u32::from_str_radix(digits, 8).unwrap_or(u32::MAX);
            if m > 0o7777 {
                return Err(SpecError::new(
                    field,
                    format!("{s:?} has bits beyond 07777; write permission bits like \"0644\""),
                ));
            }
            Ok(m)
        }
        Value::Number(n) => {
            let shown = match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f >= 0.0 => format!("{f:.0}"),
                _ => n.to_string(),
            };
            Err(SpecError::new(
                field,
                format!(
                    "got the unquoted number {shown}; write the mode as a quoted octal string such as \"{shown:0>4}\". \
                     YAML 1.1 reads an unquoted 0644 as octal (420) and YAML 1.2 as decimal 644, so an unquoted mode is ambiguous"
                ),
            ))
        }
        other => Err(SpecError::new(
            field,
            format!("expected a quoted octal string such as \"0644\", got {other}"),
        )),
    }
}

fn scalar_string(field: &str, v: &Value) -> Result<String, SpecError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(SpecError::new(
            field,
            format!("expected a string, number or boolean, got {other}"),
        )),
    }
}

/// Parses the YAML file form into the wire form. Syntax errors and unknown keys come back
/// as a [`SpecError`] whose field is `spec` with the parser's line and column.
///
/// ```
/// let spec = inplace_wire::yaml::parse("kernelArgs: [isolcpus=2-7]\nfiles:\n- path: /etc/x\n  mode: \"0640\"\n").unwrap();
/// assert_eq!(spec.kernel_args, vec!["isolcpus=2-7"]);
/// assert_eq!(spec.files[0].mode, Some(0o640));
///
/// let err = inplace_wire::yaml::parse("files:\n- path: /etc/x\n  mode: 644\n").unwrap_err();
/// assert_eq!(err.field, "files[0].mode");
/// ```
pub fn parse(text: &str) -> Result<pb::NodeSpec, SpecError> {
    let y: YamlSpec = if text.trim().is_empty() {
        YamlSpec {
            files: vec![],
            kubelet: None,
            kernel_args: vec![],
            sysctls: BTreeMap::new(),
            ntp: None,
            kubernetes: None,
            dropins: vec![],
        }
    } else {
        // No source snippet in the error: a drop-in or spec file may hold secrets, and
        // errors reach logs, status problems and CAPI messages. Line and column stay.
        serde_saphyr::from_str_with_options(text, serde_saphyr::options! { with_snippet: false })
            .map_err(|e| SpecError::new("spec", yaml_error(&e)))?
    };
    let mut out = pb::NodeSpec::default();
    for (i, f) in y.files.into_iter().enumerate() {
        out.files.push(file(&format!("files[{i}]"), f)?);
    }
    out.kubelet = y.kubelet.map(kubelet).transpose()?;
    out.kernel_args = y.kernel_args;
    for (k, v) in y.sysctls {
        let value = scalar_string(&format!("sysctls[{k}]"), &v)?;
        out.sysctls.insert(k, value);
    }
    out.ntp = y.ntp.map(|n| pb::Ntp { servers: n.servers });
    out.kubernetes = y.kubernetes.map(|k| pb::Kubernetes { version: k.version });
    out.dropins = y
        .dropins
        .into_iter()
        .map(|d| pb::DropIn {
            name: d.name,
            content: d.content,
            keep: false,
        })
        .collect();
    Ok(out)
}

/// serde-saphyr's message for `e`, except for its reader's resource budget, whose message
/// is the breach's debug form (`budget breached: Nodes { nodes: 250001 }`, seen from an
/// alias bomb in a drop-in): that one is worded as a refusal with its fix.
fn yaml_error(e: &serde_saphyr::Error) -> String {
    use serde_saphyr::budget::BudgetBreach as B;
    // the breach may come wrapped with the alias's places, or a snippet
    let mut inner = e;
    while let serde_saphyr::Error::AliasError { error, .. }
    | serde_saphyr::Error::WithSnippet { error, .. } = inner
    {
        inner = error;
    }
    let serde_saphyr::Error::Budget { breach, location } = inner else {
        return e.to_string();
    };
    let what = match breach {
        B::Nodes { nodes } => format!("{nodes} nodes"),
        B::Aliases { aliases } => format!("{aliases} aliases"),
        B::Anchors { anchors } => format!("{anchors} anchors"),
        B::Events { events } => format!("{events} parser events"),
        B::Depth { depth } => format!("nesting {depth} levels deep"),
        B::Documents { documents } => format!("{documents} documents"),
        other => format!("{other:?}"),
    };
    format!(
        "over the YAML reader's limits at line {}, column {}: {what}, counting every use of an alias as a copy; write the values out once, or split the spec",
        location.line(),
        location.column()
    )
}

/// One `files[i]` item of the file form (`field` names it in errors): content from
/// `content` or `contentBase64` (not both), the mode as YAML 1.1 octal or a string, owner
/// and group as scalars.
fn file(field: &str, f: YamlFile) -> Result<pb::File, SpecError> {
    let content = match (f.content, f.content_base64) {
        (Some(_), Some(_)) => {
            return Err(SpecError::new(
                format!("{field}.contentBase64"),
                "give either content or contentBase64, not both",
            ));
        }
        (Some(c), None) => c.into_bytes(),
        (None, Some(b)) => base64::engine::general_purpose::STANDARD
            .decode(b.trim())
            .map_err(|_| {
                // No detail: the decoder's message quotes a byte of the content.
                SpecError::new(
                    format!("{field}.contentBase64"),
                    "not valid base64 (standard alphabet, padded)",
                )
            })?,
        (None, None) => Vec::new(),
    };
    let mode = f
        .mode
        .as_ref()
        .map(|m| parse_mode(&format!("{field}.mode"), m))
        .transpose()?;
    let owner = f
        .owner
        .as_ref()
        .map(|v| scalar_string(&format!("{field}.owner"), v))
        .transpose()?
        .unwrap_or_default();
    let group = f
        .group
        .as_ref()
        .map(|v| scalar_string(&format!("{field}.group"), v))
        .transpose()?
        .unwrap_or_default();
    Ok(pb::File {
        path: f.path,
        content,
        mode,
        owner,
        group,
    })
}

/// The `kubelet` section of the file form: `config` a mapping (a partial
/// KubeletConfiguration), `flags` scalars named without leading dashes.
fn kubelet(k: YamlKubelet) -> Result<pb::Kubelet, SpecError> {
    let mut kubelet = pb::Kubelet::default();
    match k.config {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => kubelet.config = Some(crate::structs::json_to_struct(&m)),
        Some(other) => {
            return Err(SpecError::new(
                "kubelet.config",
                format!("expected a mapping (a partial KubeletConfiguration), got {other}"),
            ));
        }
    }
    for (name, v) in k.flags {
        let field = format!("kubelet.flags[{name}]");
        let value = scalar_string(&field, &v)?;
        if name.starts_with('-') {
            return Err(SpecError::new(
                field,
                format!(
                    "write the flag name without leading dashes: {:?}",
                    name.trim_start_matches('-')
                ),
            ));
        }
        kubelet.flags.insert(name, value);
    }
    Ok(kubelet)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alias_bomb_is_refused_with_words_not_the_readers_debug_form() {
        // each level nine copies of the one before: 9^9 nodes once expanded
        let mut y = String::from("kubelet:\n  config:\n    a0: &a0 [x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let p = format!("*a{}", i - 1);
            y.push_str(&format!("    a{i}: &a{i} [{}]\n", vec![p; 9].join(", ")));
        }
        let e = parse(&y).unwrap_err();
        assert_eq!(e.field, "spec");
        assert!(
            e.message
                .starts_with("over the YAML reader's limits at line "),
            "{}",
            e.message
        );
        assert!(
            e.message
                .ends_with("write the values out once, or split the spec"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("budget breached"), "{}", e.message);
    }

    #[test]
    fn quoted_modes() {
        let p =
            parse("files:\n- path: /a\n  mode: \"1777\"\n- path: /b\n  mode: '0640'\n").unwrap();
        assert_eq!(p.files[0].mode, Some(0o1777));
        assert_eq!(p.files[1].mode, Some(0o640));
    }

    #[test]
    fn unquoted_mode_is_refused_with_explanation() {
        let e = parse("files:\n- path: /a\n  mode: 644\n").unwrap_err();
        assert_eq!(e.field, "files[0].mode");
        assert!(e.message.contains("YAML 1.1"), "{e}");
        assert!(e.message.contains("\"0644\""), "{e}");
    }

    #[test]
    fn unknown_section_is_refused() {
        let e = parse("filez: []\n").unwrap_err();
        assert!(e.to_string().contains("filez"), "{e}");
    }

    #[test]
    fn scalars_become_strings() {
        let p = parse("sysctls:\n  vm.max_map_count: 262144\nkubelet:\n  flags:\n    max-pods: 250\n  config:\n    maxPods: 250\n").unwrap();
        assert_eq!(p.sysctls["vm.max_map_count"], "262144");
        assert_eq!(p.kubelet.as_ref().unwrap().flags["max-pods"], "250");
    }

    #[test]
    fn ntp_and_dropins() {
        let p = parse("ntp:\n  servers: [a.example, b.example]\ndropins:\n- name: 10-x.yaml\n  content: \"sysctls: {vm.swappiness: 10}\"\n").unwrap();
        assert_eq!(p.ntp.unwrap().servers, vec!["a.example", "b.example"]);
        assert_eq!(p.dropins[0].name, "10-x.yaml");
        assert_eq!(p.dropins[0].content, "sysctls: {vm.swappiness: 10}");
        let e = parse("ntp:\n  server: [a]\n").unwrap_err();
        assert!(e.to_string().contains("server"), "{e}");
    }

    #[test]
    fn base64_content() {
        let p = parse("files:\n- path: /a\n  contentBase64: aGk=\n").unwrap();
        assert_eq!(p.files[0].content, b"hi");
    }
}

#[cfg(test)]
mod secret_tests {
    /// A parse error names the place, never the content around it.
    #[test]
    fn parse_errors_quote_no_content() {
        let text = "files:\n- path: /etc/db.env\n  content: \"DB_PASSWORD=hunter2-TOPSECRET\n";
        let e = super::parse(text).unwrap_err().to_string();
        assert!(!e.contains("hunter2"), "{e}");
        assert!(e.contains("line"), "{e}");
    }
}
