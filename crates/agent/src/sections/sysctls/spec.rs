//! The `sysctls` section's part of the NodeSpec: kernel parameters, dotted key (or the
//! slashed `/proc/sys` form) → value. A key names one kernel parameter whatever its
//! spelling ([`inplace_formats::sysctl::sysctl_path`]): given twice, in one document or
//! by two sources, it is an error naming both (the same value from two sources, spelled
//! the same, is accepted).

use std::collections::BTreeMap;

use inplace_wire::names::SpecError;

/// The parameters set so far, by `/proc/sys` path: (the key as spelled, its source
/// `sysctls[<key>]` or `dropins[<name>].sysctls[<key>]`), for errors naming both.
pub(crate) type Sources = BTreeMap<String, (String, String)>;

/// Validates the wire `sysctls` of one document. Errors name `sysctls[<key>]`.
pub(crate) fn from_pb(p: &BTreeMap<String, String>) -> Result<BTreeMap<String, String>, SpecError> {
    let mut out = BTreeMap::new();
    let mut paths: BTreeMap<String, &str> = BTreeMap::new();
    for (k, v) in p {
        validate_sysctl(&format!("sysctls[{k}]"), k, v)?;
        let canonical = inplace_formats::sysctl::sysctl_path(k);
        if let Some(other) = paths.insert(canonical.clone(), k) {
            return Err(SpecError::new(
                format!("sysctls[{k}]"),
                format!(
                    "names the same kernel parameter ({canonical}) as sysctls[{other}]; give it once"
                ),
            ));
        }
        out.insert(k.clone(), v.clone());
    }
    Ok(out)
}

/// Merges the `sysctls` of a source found under `prefix` into `spec`: a parameter
/// another source sets to another value, or spells another way, is an error naming both.
pub(crate) fn merge(
    sources: &mut Sources,
    spec: &mut BTreeMap<String, String>,
    part: BTreeMap<String, String>,
    prefix: &str,
) -> Result<(), SpecError> {
    for (key, value) in part {
        let src = format!("{prefix}sysctls[{key}]");
        let canonical = inplace_formats::sysctl::sysctl_path(&key);
        match sources.get(&canonical) {
            Some((k, other)) if *k != key || spec.get(k) != Some(&value) => {
                return Err(SpecError::new(
                    src,
                    format!(
                        "{other} sets the same kernel parameter ({canonical}) to {:?}; set it once, with one spelling",
                        spec.get(k).cloned().unwrap_or_default()
                    ),
                ));
            }
            Some(_) => {}
            None => {
                sources.insert(canonical, (key.clone(), src));
                spec.insert(key, value);
            }
        }
    }
    Ok(())
}

/// The section's part of the canonical hash: `sysctls`, key → value (always present:
/// the hash of every spec has it).
pub(crate) fn hash(
    sysctls: &BTreeMap<String, String>,
    v: &mut serde_json::Map<String, serde_json::Value>,
) {
    v.insert("sysctls".into(), serde_json::json!(sysctls));
}

/// Validates a sysctl key (dotted or slashed form) and value.
fn validate_sysctl(field: &str, key: &str, value: &str) -> Result<(), SpecError> {
    let ok = !key.is_empty()
        && !key.starts_with(['.', '/'])
        && !key.ends_with(['.', '/'])
        && !key.contains("..")
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | '*'));
    if !ok || key.contains('*') {
        return Err(SpecError::new(
            field,
            format!(
                "sysctl key {key:?} is not valid; use the dotted form such as vm.max_map_count"
            ),
        ));
    }
    if value.is_empty() || value.contains(['\n', '\0']) {
        return Err(SpecError::new(
            field,
            "sysctl value must be a non-empty single line",
        ));
    }
    Ok(())
}
