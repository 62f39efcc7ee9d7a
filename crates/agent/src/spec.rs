//! The NodeSpec: the desired node state the agent manages; here its generic rules.
//!
//! Three forms:
//! - the wire form [`pb::NodeSpec`] (protobuf, `proto/inplace/v1/inplace.proto`);
//! - the file form, YAML with camelCase keys ([`yaml::parse`]), which converts to the wire
//!   form;
//! - the validated domain form [`crate::sections::model::NodeSpec`]
//!   ([`crate::sections::model::NodeSpec::from_pb`]), which the planner uses. It is one
//!   field per section; each section validates, merges and hashes its part in its own
//!   folder (`crate::sections::<x>::spec`).
//!
//! What is common to every section is here: the canonical JSON the spec hash is taken
//! over ([`canonical`], [`hash_of`]) and the drop-in file form ([`parse_dropin_with`]).
//!
//! Validation errors ([`SpecError`]) name the field (`files[2].path`) and the fix; the
//! server maps them to `INVALID_ARGUMENT`.

use std::collections::BTreeMap;

use inplace_node::digest::sha256_hex;
use inplace_wire::names::SpecError;
use inplace_wire::pb;
use inplace_wire::yaml;

/// Recursively sorts object keys.
pub(crate) fn canonical(v: serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Object(m) => {
            let sorted: BTreeMap<String, serde_json::Value> =
                m.into_iter().map(|(k, v)| (k, canonical(v))).collect();
            serde_json::Value::Object(sorted.into_iter().collect())
        }
        serde_json::Value::Array(a) => {
            serde_json::Value::Array(a.into_iter().map(canonical).collect())
        }
        other => other,
    }
}

/// `sha256:<hex>` over the canonical JSON encoding of `v` (object keys sorted), so equal
/// values hash equally whatever the order their maps were built in.
pub(crate) fn hash_of(v: serde_json::Value) -> String {
    let text = serde_json::to_string(&canonical(v)).unwrap_or_default();
    format!("sha256:{}", sha256_hex(text.as_bytes()))
}

/// Parses one drop-in document (a NodeSpec in the YAML file form) and validates its
/// items on their own with `items`, before merging. Errors name the field prefixed with
/// `dropins[<name>].` (`dropins[10-x.yaml].sysctls[vm.x]`; a YAML syntax error is
/// `dropins[<name>].spec`); a drop-in that has drop-ins of its own is refused.
pub(crate) fn parse_dropin_with<T>(
    name: &str,
    content: &str,
    items: impl FnOnce(&pb::NodeSpec) -> Result<T, SpecError>,
) -> Result<T, SpecError> {
    let prefix = |e: SpecError| SpecError::new(format!("dropins[{name}].{}", e.field), e.message);
    let p = yaml::parse(content).map_err(prefix)?;
    if !p.dropins.is_empty() {
        return Err(SpecError::new(
            format!("dropins[{name}].dropins"),
            "a drop-in can not hold drop-ins; put each document in /etc/inplaced/node.d itself",
        ));
    }
    items(&p).map_err(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_sorts_keys_at_every_depth_and_keeps_array_order() {
        let v = serde_json::json!({"b": [{"y": 1, "x": 2}, 0], "a": {"d": 1, "c": 2}});
        assert_eq!(
            serde_json::to_string(&canonical(v.clone())).unwrap(),
            r#"{"a":{"c":2,"d":1},"b":[{"x":2,"y":1},0]}"#
        );
        assert_eq!(hash_of(v.clone()), hash_of(canonical(v)));
        assert!(hash_of(serde_json::json!({})).starts_with("sha256:"));
    }

    #[test]
    fn dropin_errors_name_the_dropin() {
        let e = parse_dropin_with("a.yaml", "filez: []\n", |_| Ok(())).unwrap_err();
        assert_eq!(e.field, "dropins[a.yaml].spec");
        let e = parse_dropin_with("a.yaml", "dropins:\n- name: b.yaml\n", |_| Ok(())).unwrap_err();
        assert_eq!(e.field, "dropins[a.yaml].dropins");
        let e = parse_dropin_with("a.yaml", "", |_| -> Result<(), _> {
            Err(SpecError::new("ntp", "no"))
        })
        .unwrap_err();
        assert_eq!(e.field, "dropins[a.yaml].ntp");
    }
}
