//! Faithful (surgical) edits of a kubelet `KubeletConfiguration` YAML file.
//!
//! The kubelet reads `/var/lib/kubelet/config.yaml` with `sigs.k8s.io/yaml`, i.e. go-yaml v2
//! with YAML 1.1 scalar resolution (`on`/`off`/`yes`/`no`/`y`/`n` are booleans, `0644` is an
//! octal integer), then converts the result to JSON. kubeadm writes the file block style, keys
//! sorted, 2-space indentation and sequences *not* indented under their key
//! (`clusterDNS:\n- 10.96.0.10`).
//!
//! This module parses such a file into a [`serde_json::Value`] ([`parse`]), flattens a partial
//! configuration into leaf edits ([`leaves`]) and applies [`LeafEdit`]s to the *text* so that
//! every line not belonging to an edited node stays byte-identical ([`edit`]). When a document
//! uses a construct that cannot be edited faithfully at an edit point, [`edit`] re-renders the
//! whole document and reports `faithful: false`.
//!
//! The module does no I/O. It is split into `tree.rs` (the YAML syntax tree with byte
//! spans), `scalars.rs` (YAML 1.1 scalar resolution and the conversion to JSON:
//! [`parse`]), `render.rs` (quoting and whole-document rendering) and `edit.rs` (the
//! faithful splices: [`edit()`]); the KubeletConfiguration-specific rules (which fields
//! exist, which flags override them) are in [`super::fields`].
//!
//! ## Why not the `yaml-edit` crate
//!
//! `yaml-edit` 0.3.6 (a lossless rowan-based YAML parser and editor) was evaluated
//! against this module's faithful-edit tests and the four node fixtures. It round-trips
//! the fixtures byte for byte, keeps comments and CRLF line ends, inserts a key before
//! another (`maxPods` before `memorySwap`), edits nested scalars in place and removes
//! keys cleanly. It gets these cases wrong:
//!
//! - YAML 1.1 scalars: it quotes for YAML 1.2 only, so the string `y` is written plain
//!   (`k: y`), which go-yaml v2 and so the kubelet read as the boolean `true`; likewise
//!   `1_000` (an integer in YAML 1.1) and `1:20` (sexagesimal 80) stay plain. A string
//!   field would silently change type: this alone rules it out.
//! - kubeadm's unindented sequences: replacing `clusterDNS:\n- 10.96.0.10` re-renders
//!   the list indented (`  - 10.96.0.10`), so lines the edit did not mean to change move.
//! - An empty flow mapping given a key stays flow style
//!   (`crashLoopBackOff: {maxContainerRestartPeriod: 5m0s}`), not kubeadm's block style.
//! - Quoting style is not kept: a new value over `"0"` is written `'1'`, over `'x'` as
//!   `"it's"`.
//!
//! So the hand-written editor stays; as with `linux-kernel-cmdline` in
//! [`crate::cmdline`], the crate is not a dependency.

use std::collections::HashMap;

mod edit;
#[cfg(test)]
mod layout_tests;
mod render;
mod scalars;
#[cfg(test)]
mod tests;
mod tree;

use serde_json::{Map, Value};
use serde_saphyr::granit_parser::{Event, Parser, ScalarStyle, StructureStyle};

pub use edit::{Document, edit, raw_scalar, raw_scalars};
pub use render::render_scalar;
use render::*;
pub use scalars::parse;
use scalars::*;
use tree::*;

/// A path of mapping keys from the document root to a field, e.g. `["systemReserved", "cpu"]`.
pub type FieldPath = Vec<String>;

/// One leaf-level change to a configuration document.
///
/// * `Set(path, value)` sets the field at `path` to `value`, creating missing parent mappings
///   (a parent that is `null` counts as missing). `value` may be a scalar, an array or an
///   object; an array or object replaces the old value wholesale (no deep merge).
/// * `Remove(path)` removes the key at `path` (a no-op if it is absent) and then removes each
///   parent mapping that became empty as a result (never the document root).
#[derive(Debug, Clone, PartialEq)]
pub enum LeafEdit {
    /// Set the field at the path to the value, creating missing parent mappings.
    Set(FieldPath, Value),
    /// Remove the field at the path and any parent mapping left empty by the removal.
    Remove(FieldPath),
    /// Set a scalar field back to a value whose original source text is known (a revert):
    /// where the field is a simple scalar the text is spliced in as it was, so the file is
    /// byte-identical to before; a text that does not read back as the value is ignored
    /// and the value rendered as for `Set`.
    SetRaw(FieldPath, Value, String),
}

/// Errors from parsing or editing a kubelet configuration file.
///
/// Every message names the offending field path (dotted, e.g. `systemReserved.cpu`) or the
/// location in the file, and says how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The text is not valid YAML (the kubelet would refuse to start with it).
    #[error(
        "kubelet config is not valid YAML at line {line}, column {column}: {message}; fix the syntax (the kubelet would refuse to load this file)"
    )]
    Syntax {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// The parser's description.
        message: String,
    },
    /// The file holds no YAML document at all.
    #[error(
        "kubelet config is empty; it must hold one KubeletConfiguration mapping (apiVersion: kubelet.config.k8s.io/v1beta1, kind: KubeletConfiguration)"
    )]
    Empty,
    /// The file holds more than one YAML document (`---` separators).
    #[error(
        "kubelet config holds {count} YAML documents; the kubelet reads a single KubeletConfiguration, remove the extra `---` documents"
    )]
    MultipleDocuments {
        /// Number of documents found.
        count: usize,
    },
    /// The top-level node is not a mapping.
    #[error(
        "kubelet config top level is a {found}, not a mapping; the file must be a KubeletConfiguration mapping of field: value"
    )]
    TopLevelNotMapping {
        /// Kind of node found (`sequence`, `scalar`, ...).
        found: &'static str,
    },
    /// A mapping holds the same key twice (kubelet's strict decoding rejects this).
    #[error(
        "kubelet config field `{path}` is defined more than once; keep one definition (the kubelet's strict decoding rejects duplicate fields)"
    )]
    DuplicateKey {
        /// Dotted path of the duplicated key.
        path: String,
    },
    /// A construct this module does not support in kubelet configs.
    #[error("kubelet config field `{path}`: {what}; {fix}")]
    Unsupported {
        /// Dotted path where it occurs (`<root>` for the document itself).
        path: String,
        /// What was found.
        what: String,
        /// How to fix it.
        fix: &'static str,
    },
    /// An edit has an empty field path.
    #[error("an edit has an empty field path; name the field to change, e.g. [\"maxPods\"]")]
    EmptyPath,
    /// An edit goes through a node that exists but is not a mapping.
    #[error(
        "cannot edit `{path}`: `{parent}` is a {found}, not a mapping; set `{parent}` itself to a new value instead of one of its fields"
    )]
    ParentNotMapping {
        /// Dotted path of the edit.
        path: String,
        /// Dotted path of the non-mapping parent.
        parent: String,
        /// Kind of value found there.
        found: &'static str,
    },
    /// Rendering the edited document failed (a bug; the original file must be kept).
    #[error(
        "could not render the edited kubelet config ({message}); keep the original file and report this as a bug"
    )]
    Render {
        /// What went wrong.
        message: String,
    },
}

/// Result of [`edit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edited {
    /// The new file content.
    pub text: String,
    /// `true` when only the edited nodes' lines changed; `false` when the document had to be
    /// re-rendered as a whole (comments, quoting and order of unrelated lines may then differ).
    pub faithful: bool,
}

pub(super) const MAX_DEPTH: usize = 200;
pub(super) const MAX_NODES: usize = 1_000_000;

fn dotted(path: &[String]) -> String {
    if path.is_empty() {
        "<root>".to_string()
    } else {
        path.join(".")
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "sequence",
        Value::Object(_) => "mapping",
    }
}

/// Flatten a partial configuration into `(path, value)` leaves in document order.
///
/// Non-empty objects recurse; arrays, scalars (including `null`) and *empty* objects are
/// leaves, so setting a leaf replaces a list wholesale and `{}` sets an empty mapping.
/// A top-level empty object yields no leaves; a top-level non-object yields one leaf with an
/// empty path (which [`edit`] rejects with [`ConfigError::EmptyPath`]).
pub fn leaves(partial: &Value) -> Vec<(FieldPath, Value)> {
    fn walk(v: &Value, path: &mut FieldPath, out: &mut Vec<(FieldPath, Value)>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, child) in m {
                    path.push(k.clone());
                    walk(child, path, out);
                    path.pop();
                }
            }
            other => out.push((path.clone(), other.clone())),
        }
    }
    let mut out = Vec::new();
    if let Value::Object(m) = partial
        && m.is_empty()
    {
        return out;
    }
    walk(partial, &mut Vec::new(), &mut out);
    out
}

/// Look up the value at `path` through nested objects; `None` if any step is missing or not an
/// object. An empty path returns the document itself.
pub fn get<'a>(doc: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = doc;
    for k in path {
        cur = cur.as_object()?.get(k)?;
    }
    Some(cur)
}

/// Apply one edit to a value (the semantics [`edit`] must reproduce in text).
fn apply(doc: &mut Value, e: &LeafEdit) -> Result<(), ConfigError> {
    match e {
        LeafEdit::Set(path, v) | LeafEdit::SetRaw(path, v, _) => {
            let Some((last, parents)) = path.split_last() else {
                return Err(ConfigError::EmptyPath);
            };
            let mut cur = doc;
            for (i, k) in parents.iter().enumerate() {
                let Value::Object(m) = cur else {
                    return Err(ConfigError::Render {
                        message: "internal: non-object parent".into(),
                    });
                };
                let slot = m.entry(k.clone()).or_insert(Value::Null);
                if slot.is_null() {
                    *slot = Value::Object(Map::new());
                }
                if !slot.is_object() {
                    return Err(ConfigError::ParentNotMapping {
                        path: dotted(path),
                        parent: dotted(&path[..=i]),
                        found: kind_of(slot),
                    });
                }
                cur = slot;
            }
            match cur {
                Value::Object(m) => {
                    m.insert(last.clone(), v.clone());
                    Ok(())
                }
                _ => Err(ConfigError::Render {
                    message: "internal: non-object parent".into(),
                }),
            }
        }
        LeafEdit::Remove(path) => {
            if path.is_empty() {
                return Err(ConfigError::EmptyPath);
            }
            // Validate the parents first.
            let mut cur: &Value = doc;
            for (i, k) in path[..path.len() - 1].iter().enumerate() {
                match cur.get(k) {
                    None | Some(Value::Null) => return Ok(()),
                    Some(v @ Value::Object(_)) => cur = v,
                    Some(other) => {
                        return Err(ConfigError::ParentNotMapping {
                            path: dotted(path),
                            parent: dotted(&path[..=i]),
                            found: kind_of(other),
                        });
                    }
                }
            }
            remove_rec(doc, path);
            Ok(())
        }
    }
}

/// Remove `path` below `v`; returns true if something was removed. Empty parents are pruned.
fn remove_rec(v: &mut Value, path: &[String]) -> bool {
    let Value::Object(m) = v else { return false };
    match path {
        [] => false,
        [k] => m.shift_remove(k).is_some(),
        [k, rest @ ..] => {
            let Some(child) = m.get_mut(k) else {
                return false;
            };
            let removed = remove_rec(child, rest);
            if removed && child.as_object().is_some_and(Map::is_empty) {
                m.shift_remove(k);
            }
            removed
        }
    }
}
