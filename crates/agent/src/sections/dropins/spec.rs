//! The `dropins` section's part of the NodeSpec: the drop-in documents themselves, each
//! kept as `/etc/inplaced/node.d/<name>`. Their items are merged into the other sections
//! by [`crate::sections::model::NodeSpec::from_pb`], in name order.

use std::collections::BTreeMap;

use inplace_node::digest::sha256_hex;
use inplace_wire::names::{DROPIN_DIR, SpecError, validate_dropin_name};
use inplace_wire::pb;

/// A validated NodeSpec drop-in (`dropins[i]`), kept in [`DROPIN_DIR`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DropInSpec {
    /// File name (`[A-Za-z0-9._-]`, ending in `.yaml`).
    pub name: String,
    /// The YAML document, as given.
    pub content: String,
    /// Lower-case hex SHA-256 of `content`.
    pub sha256: String,
}

impl DropInSpec {
    /// Node path of the drop-in: `/etc/inplaced/node.d/<name>`.
    pub fn path(&self) -> String {
        format!("{DROPIN_DIR}/{}", self.name)
    }
}

/// Validates the wire drop-ins (names, no `keep`, each name once) and returns them sorted
/// by name, the order they are merged in. Errors name `dropins[<i>].name` or
/// `dropins[<i>].keep`; their documents are parsed when merged.
pub(crate) fn from_pb(p: &[pb::DropIn]) -> Result<Vec<DropInSpec>, SpecError> {
    let mut names = BTreeMap::new();
    for (i, d) in p.iter().enumerate() {
        let field = format!("dropins[{i}].name");
        validate_dropin_name(&field, &d.name)?;
        if d.keep {
            return Err(SpecError::new(
                format!("dropins[{i}].keep"),
                "keep is resolved by the agent from its node.d; send the spec to the agent",
            ));
        }
        if let Some(j) = names.insert(d.name.as_str(), i) {
            return Err(SpecError::new(
                field,
                format!("{} is also dropins[{j}]; give each name once", d.name),
            ));
        }
    }
    let mut out: Vec<DropInSpec> = p
        .iter()
        .map(|d| DropInSpec {
            name: d.name.clone(),
            sha256: sha256_hex(d.content.as_bytes()),
            content: d.content.clone(),
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The section's part of the canonical hash: `dropins`, each name with the hash of its
/// document, only when there are any (so the hash of a spec without them is what it
/// always was).
pub(crate) fn hash(dropins: &[DropInSpec], v: &mut serde_json::Map<String, serde_json::Value>) {
    if !dropins.is_empty() {
        let list = dropins
            .iter()
            .map(|d| serde_json::json!({"name": d.name, "content": d.sha256}))
            .collect();
        v.insert("dropins".into(), list);
    }
}
