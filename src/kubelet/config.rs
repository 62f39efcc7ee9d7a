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
//! The module does no I/O.

use std::collections::HashMap;

use serde_json::{Map, Value};
use serde_saphyr::granit_parser::{Event, Parser, ScalarStyle, StructureStyle};

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

const MAX_DEPTH: usize = 200;
const MAX_NODES: usize = 1_000_000;

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

// ---------------------------------------------------------------------------------------------
// Syntax tree with byte spans
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Plain,
    Single,
    Double,
    Block,
}

#[derive(Debug)]
enum Node {
    Scalar {
        value: String,
        style: Style,
        start: usize,
        end: usize,
        anchor: usize,
        tag: Option<String>,
    },
    Alias {
        id: usize,
        start: usize,
        end: usize,
    },
    Seq {
        anchor: usize,
        start: usize,
        end: usize,
        items: Vec<Node>,
    },
    Map {
        flow: bool,
        anchor: usize,
        tagged: bool,
        start: usize,
        end: usize,
        entries: Vec<(Node, Node)>,
    },
}

impl Node {
    fn start(&self) -> usize {
        match self {
            Node::Scalar { start, .. }
            | Node::Alias { start, .. }
            | Node::Seq { start, .. }
            | Node::Map { start, .. } => *start,
        }
    }
    fn end(&self) -> usize {
        match self {
            Node::Scalar { end, .. }
            | Node::Alias { end, .. }
            | Node::Seq { end, .. }
            | Node::Map { end, .. } => *end,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            Node::Scalar { .. } => "scalar",
            Node::Alias { .. } => "alias",
            Node::Seq { .. } => "sequence",
            Node::Map { .. } => "mapping",
        }
    }
}

#[derive(Debug)]
enum Ev {
    DocStart,
    Scalar {
        value: String,
        style: Style,
        anchor: usize,
        tag: Option<String>,
    },
    Alias(usize),
    SeqStart {
        flow: bool,
        anchor: usize,
    },
    SeqEnd,
    MapStart {
        flow: bool,
        anchor: usize,
        tagged: bool,
    },
    MapEnd,
    Unresolved(String),
}

fn byte_of(text: &str, m: &serde_saphyr::granit_parser::Marker) -> usize {
    let b = m.byte_offset().unwrap_or_else(|| {
        text.char_indices()
            .nth(m.index())
            .map_or(text.len(), |(b, _)| b)
    });
    // Clamp to a char boundary inside the text so slicing can never panic.
    let mut b = b.min(text.len());
    while !text.is_char_boundary(b) {
        b -= 1;
    }
    b
}

fn tag_string(tag: &serde_saphyr::granit_parser::Tag) -> String {
    if tag.is_yaml_core_schema() {
        format!("!!{}", tag.suffix())
    } else {
        format!("{}{}", tag.handle(), tag.suffix())
    }
}

fn lex(text: &str) -> Result<Vec<(Ev, usize, usize)>, ConfigError> {
    let mut out = Vec::new();
    for item in Parser::new_from_str(text) {
        let (ev, span) = item.map_err(|e| {
            let m = e.marker();
            ConfigError::Syntax {
                line: m.line(),
                column: m.col() + 1,
                message: e.info().to_string(),
            }
        })?;
        let s = byte_of(text, &span.start);
        let en = byte_of(text, &span.end).max(s);
        let ev = match ev {
            Event::DocumentStart(..) => Ev::DocStart,
            Event::Scalar(v, st, anchor, tag) => Ev::Scalar {
                value: v.into_owned(),
                style: match st {
                    ScalarStyle::Plain => Style::Plain,
                    ScalarStyle::SingleQuoted => Style::Single,
                    ScalarStyle::DoubleQuoted => Style::Double,
                    _ => Style::Block,
                },
                anchor,
                tag: tag.map(|t| tag_string(&t)),
            },
            Event::Alias(id) => Ev::Alias(id),
            Event::UnresolvedAlias(name) => Ev::Unresolved(name.into_owned()),
            Event::SequenceStart(st, anchor, _) => Ev::SeqStart {
                flow: st == StructureStyle::Flow,
                anchor,
            },
            Event::SequenceEnd => Ev::SeqEnd,
            Event::MappingStart(st, anchor, tag) => Ev::MapStart {
                flow: st == StructureStyle::Flow,
                anchor,
                tagged: tag.is_some(),
            },
            Event::MappingEnd => Ev::MapEnd,
            _ => continue,
        };
        out.push((ev, s, en));
        if out.len() > MAX_NODES {
            return Err(ConfigError::Unsupported {
                path: "<root>".into(),
                what: "the document has more than a million YAML events".into(),
                fix: "a kubelet config is far smaller; check that this is the right file",
            });
        }
    }
    Ok(out)
}

struct TreeBuilder {
    evs: Vec<(Ev, usize, usize)>,
    pos: usize,
}

impl TreeBuilder {
    fn unexpected() -> ConfigError {
        ConfigError::Syntax {
            line: 0,
            column: 0,
            message: "unexpected end of the YAML event stream".into(),
        }
    }

    fn node(&mut self, depth: usize) -> Result<Node, ConfigError> {
        if depth > MAX_DEPTH {
            return Err(ConfigError::Unsupported {
                path: "<root>".into(),
                what: format!("nesting deeper than {MAX_DEPTH} levels"),
                fix: "a kubelet config is at most a few levels deep; check that this is the right file",
            });
        }
        let idx = self.pos;
        self.pos += 1;
        let Some((ev, s, e)) = self.evs.get_mut(idx) else {
            return Err(Self::unexpected());
        };
        let (s, e) = (*s, *e);
        match std::mem::replace(ev, Ev::MapEnd) {
            Ev::Scalar {
                value,
                style,
                anchor,
                tag,
            } => Ok(Node::Scalar {
                value,
                style,
                start: s,
                end: e,
                anchor,
                tag,
            }),
            Ev::Alias(id) => Ok(Node::Alias {
                id,
                start: s,
                end: e,
            }),
            Ev::Unresolved(name) => Err(ConfigError::Unsupported {
                path: "<root>".into(),
                what: format!("alias *{name} has no matching anchor"),
                fix: "define the anchor (&name) before its use or write the value out",
            }),
            Ev::SeqStart { flow, anchor } => {
                let mut items = Vec::new();
                loop {
                    match self.evs.get(self.pos) {
                        None => return Err(Self::unexpected()),
                        Some((Ev::SeqEnd, _, end)) => {
                            let end = *end;
                            self.pos += 1;
                            let end = if flow {
                                end
                            } else {
                                items.last().map_or(s, Node::end)
                            };
                            return Ok(Node::Seq {
                                anchor,
                                start: s,
                                end,
                                items,
                            });
                        }
                        Some(_) => items.push(self.node(depth + 1)?),
                    }
                }
            }
            Ev::MapStart {
                flow,
                anchor,
                tagged,
            } => {
                let mut entries = Vec::new();
                loop {
                    match self.evs.get(self.pos) {
                        None => return Err(Self::unexpected()),
                        Some((Ev::MapEnd, _, end)) => {
                            let end = *end;
                            self.pos += 1;
                            let end = if flow {
                                end
                            } else {
                                entries
                                    .last()
                                    .map_or(s, |(k, v): &(Node, Node)| k.end().max(v.end()))
                            };
                            return Ok(Node::Map {
                                flow,
                                anchor,
                                tagged,
                                start: s,
                                end,
                                entries,
                            });
                        }
                        Some(_) => {
                            let k = self.node(depth + 1)?;
                            let v = self.node(depth + 1)?;
                            entries.push((k, v));
                        }
                    }
                }
            }
            Ev::DocStart | Ev::SeqEnd | Ev::MapEnd => Err(Self::unexpected()),
        }
    }
}

/// Parse the text into the root node of its single document.
fn parse_tree(text: &str) -> Result<Node, ConfigError> {
    let evs = lex(text)?;
    let docs = evs
        .iter()
        .filter(|(e, _, _)| matches!(e, Ev::DocStart))
        .count();
    if docs == 0 {
        return Err(ConfigError::Empty);
    }
    if docs > 1 {
        return Err(ConfigError::MultipleDocuments { count: docs });
    }
    let first = evs
        .iter()
        .position(|(e, _, _)| matches!(e, Ev::DocStart))
        .unwrap_or(0);
    let mut b = TreeBuilder {
        evs,
        pos: first + 1,
    };
    b.node(0)
}

// ---------------------------------------------------------------------------------------------
// YAML 1.1 (go-yaml v2) scalar resolution
// ---------------------------------------------------------------------------------------------

const YAML11_TRUE: &[&str] = &[
    "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON",
];
const YAML11_FALSE: &[&str] = &[
    "n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF",
];
const YAML_NULL: &[&str] = &["", "~", "null", "Null", "NULL"];

/// Go's `strconv.ParseInt(s, 0, 64)`/`ParseUint` on the text (underscores already removed).
fn go_parse_int(s: &str) -> Option<Value> {
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if body.is_empty() {
        return None;
    }
    let lower = body.to_ascii_lowercase();
    let (radix, digits) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let mag = u128::from_str_radix(digits, radix).ok()?;
    if neg {
        let v = i128::try_from(mag).ok()?.checked_neg()?;
        i64::try_from(v).ok().map(Value::from)
    } else if let Ok(v) = i64::try_from(mag) {
        Some(Value::from(v))
    } else {
        u64::try_from(mag).ok().map(Value::from)
    }
}

/// go-yaml v2's `yamlStyleFloat`: `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn is_yaml_style_float(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'-' | b'+')) {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let st = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - st
    };
    if b.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    } else {
        if digits(&mut i) == 0 {
            return false;
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            digits(&mut i);
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'-' | b'+')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

fn is_special_float(s: &str) -> bool {
    let t = s.strip_prefix(['-', '+']).unwrap_or(s);
    matches!(t, ".inf" | ".Inf" | ".INF" | ".nan" | ".NaN" | ".NAN")
}

/// Resolve a plain scalar like go-yaml v2 does (YAML 1.1 booleans, Go integer syntax, floats).
fn resolve_plain(s: &str, path: &[String]) -> Result<Value, ConfigError> {
    if YAML_NULL.contains(&s) {
        return Ok(Value::Null);
    }
    if YAML11_TRUE.contains(&s) {
        return Ok(Value::Bool(true));
    }
    if YAML11_FALSE.contains(&s) {
        return Ok(Value::Bool(false));
    }
    if is_special_float(s) {
        return Err(ConfigError::Unsupported {
            path: dotted(path),
            what: format!("`{s}` is an infinite or NaN float, which JSON cannot hold"),
            fix: "use a finite number or quote it as a string",
        });
    }
    if s == "<<" {
        return Err(ConfigError::Unsupported {
            path: dotted(path),
            what: "YAML merge keys (<<) are not supported".into(),
            fix: "write the merged fields out explicitly",
        });
    }
    if s.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+') {
        let plain: String = s.chars().filter(|&c| c != '_').collect();
        if let Some(v) = go_parse_int(&plain) {
            return Ok(v);
        }
        if is_yaml_style_float(&plain)
            && let Ok(f) = plain.parse::<f64>()
            && let Some(n) = serde_json::Number::from_f64(f)
        {
            return Ok(Value::Number(n));
        }
    }
    Ok(Value::String(s.to_string()))
}

fn scalar_to_json(
    value: &str,
    style: Style,
    tag: Option<&str>,
    path: &[String],
) -> Result<Value, ConfigError> {
    if style != Style::Plain || tag == Some("!!str") {
        return Ok(Value::String(value.to_string()));
    }
    resolve_plain(value, path)
}

fn key_to_string(key: &Node, path: &[String]) -> Result<String, ConfigError> {
    match key {
        Node::Scalar {
            value, style, tag, ..
        } => Ok(match scalar_to_json(value, *style, tag.as_deref(), path)? {
            Value::String(s) => s,
            Value::Null => "null".into(),
            other => other.to_string(),
        }),
        other => Err(ConfigError::Unsupported {
            path: dotted(path),
            what: format!("a {} is used as a mapping key", other.kind()),
            fix: "kubelet config keys are plain field names; rewrite the key as a string",
        }),
    }
}

struct ToJson {
    anchors: HashMap<usize, (Value, usize)>,
    budget: usize,
}

impl ToJson {
    fn charge(&mut self, n: usize, path: &[String]) -> Result<(), ConfigError> {
        self.budget = self.budget.saturating_add(n);
        if self.budget > MAX_NODES {
            return Err(ConfigError::Unsupported {
                path: dotted(path),
                what: "aliases expand to more than a million nodes".into(),
                fix: "write the values out instead of nesting aliases",
            });
        }
        Ok(())
    }

    /// Convert a node; returns the value and its node count.
    fn conv(&mut self, node: &Node, path: &mut Vec<String>) -> Result<(Value, usize), ConfigError> {
        self.charge(1, path)?;
        let (v, n, anchor) = match node {
            Node::Scalar {
                value,
                style,
                anchor,
                tag,
                ..
            } => (
                scalar_to_json(value, *style, tag.as_deref(), path)?,
                1,
                *anchor,
            ),
            Node::Alias { id, .. } => {
                let Some((v, n)) = self.anchors.get(id).cloned() else {
                    return Err(ConfigError::Unsupported {
                        path: dotted(path),
                        what: "alias refers to an unknown anchor".into(),
                        fix: "define the anchor before its use or write the value out",
                    });
                };
                self.charge(n, path)?;
                (v, n, 0)
            }
            Node::Seq { items, anchor, .. } => {
                let mut out = Vec::with_capacity(items.len());
                let mut n = 1;
                for (i, it) in items.iter().enumerate() {
                    path.push(i.to_string());
                    let r = self.conv(it, path);
                    path.pop();
                    let (v, c) = r?;
                    n += c;
                    out.push(v);
                }
                (Value::Array(out), n, *anchor)
            }
            Node::Map {
                entries, anchor, ..
            } => {
                let mut out = Map::new();
                let mut n = 1;
                for (k, v) in entries {
                    let key = key_to_string(k, path)?;
                    path.push(key.clone());
                    if out.contains_key(&key) {
                        return Err(ConfigError::DuplicateKey { path: dotted(path) });
                    }
                    let r = self.conv(v, path);
                    path.pop();
                    let (val, c) = r?;
                    n += c;
                    out.insert(key, val);
                }
                (Value::Object(out), n, *anchor)
            }
        };
        if anchor != 0 {
            self.anchors.insert(anchor, (v.clone(), n));
        }
        Ok((v, n))
    }
}

fn tree_to_json(root: &Node) -> Result<Value, ConfigError> {
    let mut c = ToJson {
        anchors: HashMap::new(),
        budget: 0,
    };
    let (v, _) = c.conv(root, &mut Vec::new())?;
    Ok(v)
}

/// Parse a kubelet config file (a single YAML document) into a JSON value.
///
/// Scalars resolve as go-yaml v2 (used by the kubelet through `sigs.k8s.io/yaml`) resolves them:
/// YAML 1.1 booleans (`y`, `yes`, `on`, `true`, ... and their negatives), `~`/`null`/empty as
/// null, Go integer syntax (`0x1f`, `0o17`, `0b101`, leading-zero octal `0644`, `_` separators),
/// go-yaml's float syntax; quoted scalars and `!!str` are strings. Non-string keys are turned
/// into strings as `sigs.k8s.io/yaml` does (`true`, `1`). Anchors and aliases are expanded.
/// Unlike go-yaml, plain timestamps stay strings (go-yaml would turn `2001-12-14` into an
/// RFC 3339 time string).
///
/// # Errors
/// [`ConfigError::Syntax`] for invalid YAML, [`ConfigError::Empty`] /
/// [`ConfigError::MultipleDocuments`] unless there is exactly one document,
/// [`ConfigError::TopLevelNotMapping`] if the document is not a mapping,
/// [`ConfigError::DuplicateKey`], and [`ConfigError::Unsupported`] for merge keys, complex keys,
/// `.inf`/`.nan`, nesting deeper than 200 or alias expansion beyond a million nodes.
pub fn parse(text: &str) -> Result<Value, ConfigError> {
    let root = parse_tree(text)?;
    parse_root(&root)
}

fn parse_root(root: &Node) -> Result<Value, ConfigError> {
    let v = tree_to_json(root)?;
    match v {
        Value::Object(_) => Ok(v),
        other => Err(ConfigError::TopLevelNotMapping {
            found: kind_of(&other),
        }),
    }
}

// ---------------------------------------------------------------------------------------------
// Value helpers
// ---------------------------------------------------------------------------------------------

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
        LeafEdit::Set(path, v) => {
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

// ---------------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------------

fn is_yaml_printable(c: char) -> bool {
    matches!(c, '\u{20}'..='\u{7E}' | '\u{A0}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
        && c != '\u{FEFF}'
}

/// Strings that YAML 1.1 (go-yaml v2, PyYAML) or YAML 1.2 (core schema) would not read back as
/// the same plain string.
fn plain_is_ambiguous(s: &str) -> bool {
    const WORDS: &[&str] = &["=", "<<"];
    if YAML_NULL.contains(&s)
        || YAML11_TRUE.contains(&s)
        || YAML11_FALSE.contains(&s)
        || WORDS.contains(&s)
        || is_special_float(s)
    {
        return true;
    }
    let t = s.strip_prefix(['-', '+']).unwrap_or(s);
    let plain: String = s.chars().filter(|&c| c != '_').collect();
    if go_parse_int(&plain).is_some() || is_yaml_style_float(&plain) {
        return true;
    }
    // YAML 1.1 sexagesimal numbers (1:20, 190:20:30.15) and timestamps (2001-12-14...).
    let tb = t.as_bytes();
    if tb.first().is_some_and(u8::is_ascii_digit)
        && t.chars()
            .all(|c| c.is_ascii_digit() || c == ':' || c == '_' || c == '.')
        && t.contains(':')
    {
        return true;
    }
    if tb.len() >= 8 && tb[..4].iter().all(u8::is_ascii_digit) && tb[4] == b'-' {
        return true;
    }
    // YAML 1.2 / 1.1 prefixed integers that Go would not parse the same way.
    let lower = t.to_ascii_lowercase();
    if (lower.starts_with("0x") || lower.starts_with("0o") || lower.starts_with("0b"))
        && lower.len() > 2
    {
        return true;
    }
    false
}

fn plain_is_syntactically_safe(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if !s.chars().all(is_yaml_printable) {
        return false;
    }
    if s.starts_with(' ') || s.ends_with(' ') {
        return false;
    }
    if s.starts_with("---") || s.starts_with("...") {
        return false;
    }
    let second = s.chars().nth(1);
    match first {
        // `-x` is a fine plain scalar (negative numbers are caught as ambiguous); `-` and `- x`
        // would start a sequence entry.
        '-' if second.is_none_or(|c| c == ' ') => return false,
        '?' | ':' | ',' | '[' | ']' | '{' | '}' | '#' | '&' | '*' | '!' | '|' | '>' | '\''
        | '"' | '%' | '@' | '`' => return false,
        _ => {}
    }
    !(s.contains(": ") || s.contains(" #") || s.ends_with(':'))
}

fn double_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c if is_yaml_printable(c) => out.push(c),
            c if (c as u32) <= 0xFF => out.push_str(&format!("\\x{:02X}", c as u32)),
            c if (c as u32) <= 0xFFFF => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push_str(&format!("\\U{:08X}", c as u32)),
        }
    }
    out.push('"');
    out
}

fn single_quoted(s: &str) -> Option<String> {
    if !s.chars().all(is_yaml_printable) || s.starts_with(' ') || s.ends_with(' ') {
        return None;
    }
    Some(format!("'{}'", s.replace('\'', "''")))
}

fn render_string(s: &str) -> String {
    if plain_is_syntactically_safe(s) && !plain_is_ambiguous(s) {
        s.to_string()
    } else {
        double_quoted(s)
    }
}

/// Render a JSON value as a YAML scalar that both YAML 1.1 (go-yaml v2, used by the kubelet)
/// and YAML 1.2 read back as the same value.
///
/// Numbers and booleans are plain, `null` is `null`. A string is plain unless it would be read
/// as something else (`on`, `no`, `y`, `~`, `null`, `0`, `1.5`, `0644`, `1e3`, `0x1F`, `1:20`,
/// `2001-12-14`, the empty string) or is not a valid plain scalar (leading/trailing space,
/// `: `, ` #`, a trailing `:`, a leading indicator such as `*`, `&`, `!`, `[`, `"`, non-printable
/// characters); then it is double-quoted with YAML escapes (`\"`, `\\`, `\n`, `\xNN`, `\uNNNN`).
/// An empty array or object renders as `[]` / `{}`; a non-empty one as JSON flow text (valid
/// YAML), although [`edit`] always writes those in block style.
pub fn render_scalar(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => render_string(s),
        Value::Array(a) if a.is_empty() => "[]".into(),
        Value::Object(m) if m.is_empty() => "{}".into(),
        other => other.to_string(),
    }
}

fn is_block_collection(v: &Value) -> bool {
    match v {
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
        _ => false,
    }
}

/// Render `key: value` (block style) at `indent`, kubeadm style. `key_text` is the already
/// rendered key.
fn render_entry(out: &mut String, key_text: &str, v: &Value, indent: usize) {
    out.push_str(&" ".repeat(indent));
    out.push_str(key_text);
    match v {
        Value::Object(m) if !m.is_empty() => {
            out.push_str(":\n");
            render_map_body(out, m, indent + 2);
        }
        Value::Array(a) if !a.is_empty() => {
            out.push_str(":\n");
            render_seq_body(out, a, indent);
        }
        other => {
            out.push_str(": ");
            out.push_str(&render_scalar(other));
            out.push('\n');
        }
    }
}

fn render_map_body(out: &mut String, m: &Map<String, Value>, indent: usize) {
    for (k, v) in m {
        render_entry(out, &render_string(k), v, indent);
    }
}

fn render_seq_body(out: &mut String, a: &[Value], indent: usize) {
    for item in a {
        out.push_str(&" ".repeat(indent));
        out.push_str("- ");
        if is_block_collection(item) {
            let mut inner = String::new();
            match item {
                Value::Object(m) => render_map_body(&mut inner, m, indent + 2),
                Value::Array(a) => render_seq_body(&mut inner, a, indent + 2),
                _ => {}
            }
            out.push_str(inner.trim_start_matches(' '));
        } else {
            out.push_str(&render_scalar(item));
            out.push('\n');
        }
    }
}

/// Render a whole document in kubeadm style (used as the last-resort fallback).
fn render_document(v: &Value) -> String {
    match v {
        Value::Object(m) if !m.is_empty() => {
            let mut out = String::new();
            render_map_body(&mut out, m, 0);
            out
        }
        other => format!("{}\n", render_scalar(other)),
    }
}

// ---------------------------------------------------------------------------------------------
// Faithful text editing
// ---------------------------------------------------------------------------------------------

fn line_start(text: &str, pos: usize) -> usize {
    text[..pos].rfind('\n').map_or(0, |i| i + 1)
}

/// Position just after the newline ending the line that contains `pos` (or the text end).
fn line_end_incl(text: &str, pos: usize) -> usize {
    text[pos..].find('\n').map_or(text.len(), |i| pos + i + 1)
}

/// Why a faithful edit is not possible (we fall back to re-rendering).
struct NotFaithful;

struct Splice {
    start: usize,
    end: usize,
    with: String,
}

fn apply_splice(text: &str, sp: Splice) -> String {
    let mut with = sp.with;
    // Keep the absence of a trailing newline when the splice reaches the end of the file.
    if sp.end == text.len() && !text.ends_with('\n') && with.ends_with('\n') {
        with.pop();
    }
    // Follow the file's line endings.
    if text.contains("\r\n") {
        with = with.replace('\n', "\r\n");
    }
    let mut out = String::with_capacity(text.len() + with.len());
    out.push_str(&text[..sp.start]);
    out.push_str(&with);
    out.push_str(&text[sp.end..]);
    out
}

/// Checks that the key scalar starts its line (only spaces before it) and is a simple
/// single-line scalar; returns its indentation and source text.
fn key_layout<'t>(text: &'t str, key: &Node) -> Result<(usize, &'t str), NotFaithful> {
    let Node::Scalar {
        start,
        end,
        anchor: 0,
        tag: None,
        style,
        ..
    } = key
    else {
        return Err(NotFaithful);
    };
    if *style == Style::Block || start >= end {
        return Err(NotFaithful);
    }
    let ls = line_start(text, *start);
    let prefix = &text[ls..*start];
    if !prefix.bytes().all(|b| b == b' ') {
        return Err(NotFaithful);
    }
    let src = &text[*start..*end];
    if src.contains('\n') {
        return Err(NotFaithful);
    }
    Ok((*start - ls, src))
}

/// Byte range of the whole lines holding one `key: value` entry of a block mapping.
fn entry_lines(text: &str, key: &Node, value: &Node) -> Result<(usize, usize), NotFaithful> {
    key_layout(text, key)?;
    if let Node::Scalar {
        style: Style::Block,
        ..
    } = value
    {
        return Err(NotFaithful);
    }
    let end = key.end().max(value.end());
    let start = line_start(text, key.start());
    let stop = line_end_incl(text, end);
    // Nothing but a comment may follow the value on its last line.
    let mut rest = text[end..stop].trim();
    if value.start() == value.end() {
        // Implicit null (`key:`): its empty span sits right after the key, before the `:`.
        rest = rest.strip_prefix(':').unwrap_or(rest).trim_start();
    }
    if !(rest.is_empty() || rest.starts_with('#')) {
        return Err(NotFaithful);
    }
    Ok((start, stop))
}

fn block_map_entries(node: &Node) -> Result<&[(Node, Node)], NotFaithful> {
    match node {
        Node::Map {
            flow: false,
            anchor: 0,
            tagged: false,
            entries,
            ..
        } if !entries.is_empty() => Ok(entries),
        _ => Err(NotFaithful),
    }
}

fn find_entry<'n>(
    entries: &'n [(Node, Node)],
    key: &str,
    path: &[String],
) -> Result<Option<&'n (Node, Node)>, ConfigError> {
    for e in entries {
        if key_to_string(&e.0, path)? == key {
            return Ok(Some(e));
        }
    }
    Ok(None)
}

/// Where the value of an existing entry must be rewritten as a whole block.
fn replace_entry(text: &str, key: &Node, value: &Node, new: &Value) -> Result<Splice, NotFaithful> {
    let (start, stop) = entry_lines(text, key, value)?;
    if let Node::Seq { anchor, .. } | Node::Map { anchor, .. } | Node::Scalar { anchor, .. } = value
        && *anchor != 0
    {
        return Err(NotFaithful);
    }
    let (indent, key_src) = key_layout(text, key)?;
    let mut with = String::new();
    render_entry(&mut with, key_src, new, indent);
    Ok(Splice {
        start,
        end: stop,
        with,
    })
}

fn is_simple_scalar(text: &str, n: &Node) -> bool {
    matches!(n, Node::Scalar { style, anchor: 0, tag: None, start, end, .. }
        if *style != Style::Block && start < end && !text[*start..*end].contains('\n'))
}

fn render_replacing(old: &Node, new: &Value) -> String {
    if let (Node::Scalar { style, .. }, Value::String(s)) = (old, new) {
        match style {
            Style::Double => return double_quoted(s),
            Style::Single => return single_quoted(s).unwrap_or_else(|| double_quoted(s)),
            _ => {}
        }
    }
    render_scalar(new)
}

/// Compute the splice for one edit on the current text; `Ok(None)` means no text change.
fn splice_for(
    text: &str,
    root: &Node,
    next: &Value,
    e: &LeafEdit,
) -> Result<Result<Option<Splice>, NotFaithful>, ConfigError> {
    match e {
        LeafEdit::Set(path, v) => {
            let mut node = root;
            for i in 0..path.len() {
                let prefix = &path[..=i];
                let Ok(entries) = block_map_entries(node) else {
                    return Ok(Err(NotFaithful));
                };
                match find_entry(entries, &path[i], &path[..i])? {
                    Some((k, val)) => {
                        let is_last = i + 1 == path.len();
                        if is_last {
                            if is_simple_scalar(text, val) && !is_block_collection(v) {
                                let (s, en) = (val.start(), val.end());
                                return Ok(Ok(Some(Splice {
                                    start: s,
                                    end: en,
                                    with: render_replacing(val, v),
                                })));
                            }
                            let Some(newv) = get(next, prefix) else {
                                return Ok(Err(NotFaithful));
                            };
                            return Ok(replace_entry(text, k, val, newv).map(Some));
                        }
                        let empty_flow_map = matches!(val, Node::Map { flow: true, entries, .. } if entries.is_empty());
                        let null = matches!(val, Node::Scalar { style: Style::Plain, value, .. } if YAML_NULL.contains(&value.as_str()));
                        if empty_flow_map || null {
                            let Some(newv) = get(next, prefix) else {
                                return Ok(Err(NotFaithful));
                            };
                            return Ok(replace_entry(text, k, val, newv).map(Some));
                        }
                        node = val;
                    }
                    None => {
                        // Insert the new key (with its missing parents) into this mapping.
                        let Some(newv) = get(next, prefix) else {
                            return Ok(Err(NotFaithful));
                        };
                        return Ok(insert_entry(text, entries, &path[i], newv, &path[..i]));
                    }
                }
            }
            Ok(Err(NotFaithful))
        }
        LeafEdit::Remove(path) => {
            // The shallowest prefix that no longer exists after the edit is the entry to drop.
            let Some(depth) = (0..path.len()).find(|&i| get(next, &path[..=i]).is_none()) else {
                return Ok(Ok(None));
            };
            let mut node = root;
            for i in 0..=depth {
                let Ok(entries) = block_map_entries(node) else {
                    return Ok(Err(NotFaithful));
                };
                let Some((k, val)) = find_entry(entries, &path[i], &path[..i])? else {
                    // Absent before the edit as well: nothing to do.
                    return Ok(Ok(None));
                };
                if i == depth {
                    return Ok(match entry_lines(text, k, val) {
                        Ok((start, end)) => {
                            let with = if depth == 0 && entries.len() == 1 {
                                "{}\n".to_string()
                            } else {
                                String::new()
                            };
                            Ok(Some(Splice { start, end, with }))
                        }
                        Err(nf) => Err(nf),
                    });
                }
                node = val;
            }
            Ok(Err(NotFaithful))
        }
    }
}

fn insert_entry(
    text: &str,
    entries: &[(Node, Node)],
    key: &str,
    v: &Value,
    parent: &[String],
) -> Result<Option<Splice>, NotFaithful> {
    let Some((first_key, _)) = entries.first() else {
        return Err(NotFaithful);
    };
    let (indent, _) = key_layout(text, first_key)?;
    let mut keys = Vec::with_capacity(entries.len());
    for (k, _) in entries {
        keys.push(key_to_string(k, parent).map_err(|_| NotFaithful)?);
    }
    let sorted = keys.windows(2).all(|w| w[0] <= w[1]);
    let idx = if sorted {
        keys.iter()
            .position(|k| k.as_str() > key)
            .unwrap_or(keys.len())
    } else {
        keys.len()
    };
    let pos = if idx == 0 {
        line_start(text, first_key.start())
    } else {
        let (k, val) = &entries[idx - 1];
        entry_lines(text, k, val)?.1
    };
    let mut with = String::new();
    render_entry(&mut with, &render_string(key), v, indent);
    if pos == text.len() && !text.is_empty() && !text.ends_with('\n') {
        with.pop();
        with.insert(0, '\n');
    }
    Ok(Some(Splice {
        start: pos,
        end: pos,
        with,
    }))
}

/// Re-render the whole document (fallback), checking the result reads back as `expected`.
fn rerender(expected: &Value) -> Result<Edited, ConfigError> {
    if let Ok(t) = serde_saphyr::to_string(expected)
        && parse(&t).ok().as_ref() == Some(expected)
    {
        return Ok(Edited {
            text: t,
            faithful: false,
        });
    }
    let t = render_document(expected);
    match parse(&t) {
        Ok(v) if &v == expected => Ok(Edited {
            text: t,
            faithful: false,
        }),
        Ok(_) => Err(ConfigError::Render {
            message: "the re-rendered document does not read back as the edited value".into(),
        }),
        Err(e) => Err(ConfigError::Render {
            message: format!("the re-rendered document does not parse: {e}"),
        }),
    }
}

/// Apply leaf edits to a kubelet config file, changing only the lines of the edited nodes.
///
/// Semantics: `parse(&edit(text, edits)?.text)` equals `parse(text)` with each edit applied in
/// order as described on [`LeafEdit`].
///
/// Layout rules (faithful mode):
/// * every line not belonging to an edited node stays byte-identical (quoting, comments, order,
///   a missing final newline); new lines use the file's line ending (`\r\n` if it has any);
/// * `Set` of a scalar over a single-line scalar replaces only the value text; an old
///   double- or single-quoted string stays quoted in the same style;
/// * when the old or new value is a mapping or sequence (or the old value is `null`, an empty
///   flow map `{}` being set into, a block scalar), the key's whole block is rewritten in kubeadm
///   style (2-space indent, sequence items `- x` at the key's indentation);
/// * a new key goes into its parent mapping at the sorted position if the mapping's keys are
///   sorted (byte order), else at its end, at the mapping's indentation; missing parents are
///   created as block mappings (`systemReserved:\n  cpu: 500m`);
/// * `Remove` deletes the key's lines (including a trailing comment on its last line) and those
///   of parents left empty; removing the last top-level key leaves `{}`.
///
/// A multi-line plain or quoted scalar that is Set is replaced together with its key's lines.
/// When an edit point uses something that cannot be edited faithfully (a non-empty flow
/// collection being edited into or inserted into, an anchor or alias on the edited node or its
/// parent mapping, a tag on a parent mapping, a key that does not start its line, a block scalar
/// `|`/`>` being replaced or followed by an insertion) or the faithful result does not read back
/// as expected (e.g. an alias elsewhere refers to an anchor inside a replaced block), the whole
/// document is
/// re-rendered with `serde_saphyr::to_string` (or, if that output does not read back exactly,
/// a kubeadm-style renderer) and `faithful` is `false`.
///
/// # Errors
/// Any [`parse`] error of `text`; [`ConfigError::EmptyPath`]; [`ConfigError::ParentNotMapping`]
/// when a path goes through an existing non-mapping value (e.g. a field of `clusterDNS`);
/// [`ConfigError::Render`] if no rendering reads back as the edited value.
pub fn edit(text: &str, edits: &[LeafEdit]) -> Result<Edited, ConfigError> {
    let mut expected = parse(text)?;
    for e in edits {
        apply(&mut expected, e)?;
    }
    let mut cur = text.to_string();
    for e in edits {
        // `expected` was computed without error, so any failure below means the text edits
        // diverged from the semantics: fall back to re-rendering.
        let Ok(root) = parse_tree(&cur) else {
            return rerender(&expected);
        };
        let Ok(before) = parse_root(&root) else {
            return rerender(&expected);
        };
        let mut next = before.clone();
        if apply(&mut next, e).is_err() {
            return rerender(&expected);
        }
        if next == before {
            continue;
        }
        match splice_for(&cur, &root, &next, e) {
            Ok(Ok(Some(sp))) => cur = apply_splice(&cur, sp),
            Ok(Ok(None)) => {}
            Ok(Err(NotFaithful)) | Err(_) => return rerender(&expected),
        }
    }
    match parse(&cur) {
        Ok(v) if v == expected => Ok(Edited {
            text: cur,
            faithful: true,
        }),
        _ => rerender(&expected),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const FIXTURES: &[(&str, &str)] = &[
        (
            "fedora-41-bls",
            include_str!("../../tests/fixtures/nodes/fedora-41-bls/var/lib/kubelet/config.yaml"),
        ),
        (
            "rhel8-grubenv",
            include_str!("../../tests/fixtures/nodes/rhel8-grubenv/var/lib/kubelet/config.yaml"),
        ),
        (
            "systemd-boot",
            include_str!("../../tests/fixtures/nodes/systemd-boot/var/lib/kubelet/config.yaml"),
        ),
        (
            "ubuntu-2404-grub",
            include_str!("../../tests/fixtures/nodes/ubuntu-2404-grub/var/lib/kubelet/config.yaml"),
        ),
    ];

    fn p(s: &str) -> FieldPath {
        s.split('.').map(String::from).collect()
    }

    fn set(path: &str, v: Value) -> LeafEdit {
        LeafEdit::Set(p(path), v)
    }

    fn expected_after(text: &str, edits: &[LeafEdit]) -> Value {
        let mut v = parse(text).unwrap();
        for e in edits {
            apply(&mut v, e).unwrap();
        }
        v
    }

    #[test]
    fn fixtures_parse() {
        for (name, text) in FIXTURES {
            let v = parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(v["kind"], json!("KubeletConfiguration"), "{name}");
            assert_eq!(v["healthzBindAddress"], json!("127.0.0.1"), "{name}");
            assert_eq!(v["healthzPort"], json!(10248), "{name}");
            assert_eq!(v["authentication"]["anonymous"]["enabled"], json!(false));
            assert_eq!(
                v["logging"]["options"]["json"]["infoBufferSize"],
                json!("0")
            );
            assert_eq!(v["crashLoopBackOff"], json!({}));
            assert!(v["clusterDNS"].is_array());
        }
        let rhel = parse(FIXTURES[1].1).unwrap();
        assert_eq!(rhel["containerRuntimeEndpoint"], json!(""));
        assert_eq!(rhel["clusterDNS"], json!(["10.112.0.10"]));
    }

    #[test]
    fn a_max_pods_and_system_reserved_are_surgical() {
        for (name, text) in FIXTURES {
            let edits = [
                set("maxPods", json!(250)),
                set("systemReserved.cpu", json!("500m")),
            ];
            let out = edit(text, &edits).unwrap();
            assert!(out.faithful, "{name}");
            let mut want = text.replacen("memorySwap: {}\n", "maxPods: 250\nmemorySwap: {}\n", 1);
            if !text.contains("systemReserved:") {
                want = want.replacen(
                    "volumeStatsAggPeriod:",
                    "systemReserved:\n  cpu: 500m\nvolumeStatsAggPeriod:",
                    1,
                );
            }
            assert_eq!(out.text, want, "{name}");
            assert_eq!(parse(&out.text).unwrap(), expected_after(text, &edits));
        }
    }

    #[test]
    fn b_ambiguous_strings_are_quoted() {
        let text = FIXTURES[3].1;
        let out = edit(text, &[set("cgroupDriver", json!("on"))]).unwrap();
        assert_eq!(
            out.text,
            text.replace("cgroupDriver: systemd", "cgroupDriver: \"on\"")
        );
        let out = edit(text, &[set("featureGates.x", json!("no"))]).unwrap();
        assert!(out.text.contains("featureGates:\n  x: \"no\"\n"));
        assert_eq!(parse(&out.text).unwrap()["featureGates"]["x"], json!("no"));
        for s in [
            "on",
            "no",
            "yes",
            "off",
            "y",
            "Y",
            "n",
            "true",
            "False",
            "null",
            "~",
            "0",
            "1.5",
            "0644",
            "1e3",
            "",
            "0x1F",
            "0o17",
            "1_000",
            "-1",
            ".5",
            ".inf",
            "1:20",
            "2001-12-14",
            " x",
            "x ",
            "a: b",
            "a #b",
            "*a",
            "&a",
            "!a",
            "[a",
            "{a",
            "'a",
            "\"a",
            "%a",
            "@a",
            "`a",
            "|",
            ">",
            "-",
            "- a",
            "? a",
            "a:",
            "---",
            "line\nbreak",
            "tab\t",
            "\u{0}",
            "\u{85}",
            "\u{feff}x",
            "=",
            "<<",
        ] {
            let r = render_scalar(&json!(s));
            assert!(r.starts_with('"'), "{s:?} rendered as {r}");
            let doc = format!("k: {r}\n");
            assert_eq!(parse(&doc).unwrap()["k"], json!(s), "{s:?} via {r}");
        }
        for s in [
            "500m",
            "2m0s",
            "10.96.0.10",
            "systemd",
            "/etc/kubernetes/pki/ca.crt",
            "unix:///var/run/containerd/containerd.sock",
            "memory.available<500Mi",
            "kubelet.config.k8s.io/v1beta1",
            "a,b",
            "-a",
            "x\"y",
            "ünï",
        ] {
            assert_eq!(render_scalar(&json!(s)), s);
        }
        assert_eq!(render_scalar(&json!(250)), "250");
        assert_eq!(render_scalar(&json!(1.5)), "1.5");
        assert_eq!(render_scalar(&json!(true)), "true");
        assert_eq!(render_scalar(&Value::Null), "null");
        assert_eq!(render_scalar(&json!({})), "{}");
        assert_eq!(render_scalar(&json!([])), "[]");
    }

    #[test]
    fn c_edit_then_reverse_restores_bytes() {
        for (name, text) in FIXTURES {
            let orig = parse(text).unwrap();
            let edits = vec![
                set("maxPods", json!(250)),
                set("systemReserved.cpu", json!("500m")),
                set("authentication.webhook.cacheTTL", json!("2m0s")),
                LeafEdit::Set(
                    vec!["evictionHard".into(), "memory.available".into()],
                    json!("500Mi"),
                ),
                set("crashLoopBackOff.maxContainerRestartPeriod", json!("5m0s")),
                set("cgroupDriver", json!("cgroupfs")),
            ];
            let once = edit(text, &edits).unwrap();
            assert!(once.faithful, "{name}");
            let mut reverse = Vec::new();
            for e in edits.iter().rev() {
                let LeafEdit::Set(path, _) = e else { continue };
                match get(&orig, path) {
                    Some(old) => reverse.push(LeafEdit::Set(path.clone(), old.clone())),
                    None => reverse.push(LeafEdit::Remove(path.clone())),
                }
            }
            let back = edit(&once.text, &reverse).unwrap();
            assert!(back.faithful, "{name}");
            // crashLoopBackOff: {} becomes a block mapping and removing its only key drops it,
            // so restore it explicitly.
            let back = edit(&back.text, &[set("crashLoopBackOff", json!({}))]).unwrap();
            assert_eq!(back.text, *text, "{name}");
        }
    }

    #[test]
    fn d_nested_scalar_in_place() {
        let text = FIXTURES[0].1;
        let out = edit(
            text,
            &[set("authentication.webhook.cacheTTL", json!("2m0s"))],
        )
        .unwrap();
        assert!(out.faithful);
        assert_eq!(
            out.text,
            text.replacen("    cacheTTL: 0s\n", "    cacheTTL: 2m0s\n", 1)
        );
    }

    #[test]
    fn e_replace_list() {
        let text = FIXTURES[3].1;
        let out = edit(
            text,
            &[set("clusterDNS", json!(["10.96.0.10", "10.96.0.11"]))],
        )
        .unwrap();
        assert!(out.faithful);
        assert_eq!(
            out.text,
            text.replacen(
                "clusterDNS:\n- 10.96.0.10\n",
                "clusterDNS:\n- 10.96.0.10\n- 10.96.0.11\n",
                1
            )
        );
        // List to scalar and back to a nested list of mappings.
        let out = edit(text, &[set("clusterDNS", json!([{"a": 1, "b": [1, 2]}]))]).unwrap();
        assert!(
            out.text
                .contains("clusterDNS:\n- a: 1\n  b:\n  - 1\n  - 2\nclusterDomain")
        );
        assert!(out.faithful);
    }

    #[test]
    fn empty_flow_map_gets_a_block() {
        let text = FIXTURES[3].1;
        let out = edit(
            text,
            &[set(
                "crashLoopBackOff.maxContainerRestartPeriod",
                json!("5m0s"),
            )],
        )
        .unwrap();
        assert!(out.faithful);
        assert_eq!(
            out.text,
            text.replacen(
                "crashLoopBackOff: {}\n",
                "crashLoopBackOff:\n  maxContainerRestartPeriod: 5m0s\n",
                1
            )
        );
    }

    #[test]
    fn quoted_values_stay_quoted_and_untouched() {
        let text = FIXTURES[3].1;
        let out = edit(
            text,
            &[set("logging.options.json.infoBufferSize", json!("1"))],
        )
        .unwrap();
        assert_eq!(
            out.text,
            text.replacen("infoBufferSize: \"0\"", "infoBufferSize: \"1\"", 1)
        );
        let out = edit(
            text,
            &[set("logging.options.text.infoBufferSize", json!("1Mi"))],
        )
        .unwrap();
        assert!(
            out.text.contains(
                "      infoBufferSize: \"0\"\n    text:\n      infoBufferSize: \"1Mi\"\n"
            )
        );
        let sq = "a: 'x'\nb: 1\n";
        assert_eq!(
            edit(sq, &[set("a", json!("it's"))]).unwrap().text,
            "a: 'it''s'\nb: 1\n"
        );
        // A number over a quoted string becomes plain.
        assert_eq!(
            edit(sq, &[set("a", json!(3))]).unwrap().text,
            "a: 3\nb: 1\n"
        );
    }

    #[test]
    fn remove_prunes_emptied_parents() {
        let text = FIXTURES[0].1;
        let out = edit(
            text,
            &[
                LeafEdit::Remove(p("kubeReserved.cpu")),
                LeafEdit::Remove(p("kubeReserved.memory")),
            ],
        )
        .unwrap();
        assert!(out.faithful);
        assert_eq!(
            out.text,
            text.replacen("kubeReserved:\n  cpu: 250m\n  memory: 512Mi\n", "", 1)
        );
        // Pre-existing empty mappings are not pruned; absent keys are a no-op.
        let out = edit(text, &[LeafEdit::Remove(p("memorySwap.swapBehavior"))]).unwrap();
        assert_eq!(out.text, *text);
        let out = edit(
            text,
            &[LeafEdit::Remove(p("logging.options.json.infoBufferSize"))],
        )
        .unwrap();
        assert_eq!(
            out.text,
            text.replacen("    json:\n      infoBufferSize: \"0\"\n", "", 1)
        );
        assert_eq!(
            edit("a: 1\n", &[LeafEdit::Remove(p("a"))]).unwrap().text,
            "{}\n"
        );
    }

    #[test]
    fn non_mapping_parent_is_an_error() {
        let text = FIXTURES[3].1;
        let err = edit(text, &[set("clusterDNS.x", json!(1))]).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ConfigError::ParentNotMapping { .. }), "{msg}");
        assert!(
            msg.contains("clusterDNS.x") && msg.contains("sequence"),
            "{msg}"
        );
        let err = edit(text, &[LeafEdit::Remove(p("cgroupDriver.x"))]).unwrap_err();
        assert!(err.to_string().contains("`cgroupDriver` is a string"));
        assert!(matches!(
            edit(text, &[LeafEdit::Set(vec![], json!(1))]),
            Err(ConfigError::EmptyPath)
        ));
    }

    #[test]
    fn comments_unsorted_and_missing_newline() {
        let text = "# managed\nzeta: 1 # keep\nalpha:\n  # inner\n  b: x\n";
        let out = edit(text, &[set("alpha.c", json!("y")), set("mid", json!(2))]).unwrap();
        assert!(out.faithful);
        assert_eq!(
            out.text,
            "# managed\nzeta: 1 # keep\nalpha:\n  # inner\n  b: x\n  c: \"y\"\nmid: 2\n"
        );
        // A tagged scalar that is replaced as a whole is fine.
        let out = edit("a: !!str 5\nb: 1\n", &[set("a", json!("6"))]).unwrap();
        assert_eq!(out.text, "a: \"6\"\nb: 1\n");
        assert!(out.faithful);
        let out = edit("a: 1\nc: 3", &[set("d", json!(4)), set("b", json!(2))]).unwrap();
        assert_eq!(out.text, "a: 1\nb: 2\nc: 3\nd: 4");
        let out = edit("a: 1 # one\nb: 2", &[set("a", json!(5))]).unwrap();
        assert_eq!(out.text, "a: 5 # one\nb: 2");
        let out = edit("k: 1\r\nm:\r\n  a: 1\r\n", &[set("m.b", json!(2))]).unwrap();
        assert_eq!(out.text, "k: 1\r\nm:\r\n  a: 1\r\n  b: 2\r\n");
        let out = edit("a:\nb: 2\n", &[set("a.x", json!(1))]).unwrap();
        assert_eq!(out.text, "a:\n  x: 1\nb: 2\n");
        assert!(out.faithful);
    }

    #[test]
    fn fallback_for_unsupported_constructs() {
        let cases = [
            ("a: {x: 1}\nb: 2\n", set("a.y", json!(2))),
            ("a: &r\n  x: 1\nb: *r\n", set("a.x", json!(2))),
            ("a: !!map\n  x: 1\nb: 1\n", set("a.y", json!("6"))),
            ("a: |\n  text\nb: 1\n", set("a", json!("x"))),
            ("{a: 1, b: 2}\n", set("c", json!(3))),
        ];
        for (text, e) in cases {
            let out = edit(text, std::slice::from_ref(&e)).unwrap();
            assert!(!out.faithful, "{text}");
            assert_eq!(
                parse(&out.text).unwrap(),
                expected_after(text, &[e]),
                "{text}"
            );
        }
        // Anchors away from the edit point do not prevent a faithful edit.
        let text = "a: &r 1\nb: *r\nc: 3\n";
        let out = edit(text, &[set("c", json!(4))]).unwrap();
        assert!(out.faithful);
        assert_eq!(out.text, "a: &r 1\nb: *r\nc: 4\n");
    }

    #[test]
    fn parse_follows_go_yaml_v2() {
        let v = parse("a: on\nb: 0644\nc: 0x1F\nd: 1_000\ne: 1e3\nf: y\ng: ~\nh: '1'\ni: 10.96.0.10\nj: -5\nk: 18446744073709551615\non: 1\n").unwrap();
        assert_eq!(
            v,
            json!({"a": true, "b": 420, "c": 31, "d": 1000, "e": 1000.0, "f": true, "g": null,
                   "h": "1", "i": "10.96.0.10", "j": -5, "k": 18446744073709551615u64, "true": 1})
        );
        assert!(matches!(
            parse("a: 1\n---\nb: 2\n"),
            Err(ConfigError::MultipleDocuments { count: 2 })
        ));
        assert!(matches!(parse(""), Err(ConfigError::Empty)));
        assert!(matches!(
            parse("- a\n"),
            Err(ConfigError::TopLevelNotMapping { .. })
        ));
        assert!(matches!(
            parse("a: 1\na: 2\n"),
            Err(ConfigError::DuplicateKey { .. })
        ));
        assert!(matches!(parse("a: [\n"), Err(ConfigError::Syntax { .. })));
        assert!(matches!(
            parse("a: .inf\n"),
            Err(ConfigError::Unsupported { .. })
        ));
        assert!(matches!(
            parse("a: &x {b: 1}\n<<: *x\n"),
            Err(ConfigError::Unsupported { .. })
        ));
        let deep = format!("a: {}{}\n", "[".repeat(500), "]".repeat(500));
        assert!(parse(&deep).is_err());
    }

    #[test]
    fn leaves_and_get() {
        let partial = json!({"maxPods": 250, "systemReserved": {"cpu": "500m", "memory": "1Gi"},
                             "crashLoopBackOff": {}, "clusterDNS": ["a"], "x": null});
        let l = leaves(&partial);
        assert_eq!(
            l,
            vec![
                (p("maxPods"), json!(250)),
                (p("systemReserved.cpu"), json!("500m")),
                (p("systemReserved.memory"), json!("1Gi")),
                (p("crashLoopBackOff"), json!({})),
                (p("clusterDNS"), json!(["a"])),
                (p("x"), Value::Null),
            ]
        );
        assert!(leaves(&json!({})).is_empty());
        assert_eq!(leaves(&json!(1)), vec![(vec![], json!(1))]);
        assert_eq!(
            get(&partial, &p("systemReserved.cpu")),
            Some(&json!("500m"))
        );
        assert_eq!(get(&partial, &p("maxPods.x")), None);
        // Merging a whole partial through leaves.
        let text = FIXTURES[3].1;
        let edits: Vec<LeafEdit> = l.into_iter().map(|(p, v)| LeafEdit::Set(p, v)).collect();
        let out = edit(text, &edits).unwrap();
        assert!(out.faithful);
        assert_eq!(parse(&out.text).unwrap(), expected_after(text, &edits));
    }

    // ---------------- property tests ----------------

    fn path_strategy() -> impl Strategy<Value = FieldPath> {
        let mut pool: Vec<FieldPath> = Vec::new();
        for (_, text) in FIXTURES {
            for (path, _) in leaves(&parse(text).unwrap()) {
                if !pool.contains(&path) {
                    for i in 1..=path.len() {
                        let pre = path[..i].to_vec();
                        if !pool.contains(&pre) {
                            pool.push(pre);
                        }
                    }
                }
            }
        }
        for extra in [
            "maxPods",
            "systemReserved.cpu",
            "systemReserved.memory",
            "kubeReserved.ephemeral-storage",
            "crashLoopBackOff.maxContainerRestartPeriod",
            "evictionHard.memory.available",
            "featureGates.on",
            "a.b.c",
            "zzz",
            "AAA",
            "logging.options.json.infoBufferSize",
            "clusterDNS.x",
            "cgroupDriver.y",
        ] {
            pool.push(p(extra));
        }
        proptest::sample::select(pool)
    }

    fn scalar_strategy() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e12f64..1e12).prop_map(Value::from),
            proptest::sample::select(vec![
                "on",
                "no",
                "yes",
                "0",
                "1.5",
                "0644",
                "1e3",
                "",
                "~",
                "null",
                "500m",
                "2m0s",
                "a: b",
                " x",
                "#x",
                "x #y",
                "'q'",
                "\"dq\"",
                "-",
                "10.96.0.10",
                "a\nb",
                "\u{85}",
            ])
            .prop_map(Value::from),
            any::<String>().prop_map(Value::from),
        ]
    }

    fn value_strategy() -> impl Strategy<Value = Value> {
        scalar_strategy().prop_recursive(2, 8, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                proptest::collection::vec(("[a-z]{1,6}|on|y|0", inner), 0..3)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    fn edit_strategy() -> impl Strategy<Value = LeafEdit> {
        prop_oneof![
            (path_strategy(), value_strategy()).prop_map(|(p, v)| LeafEdit::Set(p, v)),
            path_strategy().prop_map(LeafEdit::Remove),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        #[test]
        fn f_edits_satisfy_semantics(
            fixture in 0..FIXTURES.len(),
            edits in proptest::collection::vec(edit_strategy(), 1..6),
        ) {
            let text = FIXTURES[fixture].1;
            let mut want = parse(text).unwrap();
            let mut want_err = false;
            for e in &edits {
                if apply(&mut want, e).is_err() {
                    want_err = true;
                    break;
                }
            }
            match edit(text, &edits) {
                Ok(out) => {
                    prop_assert!(!want_err);
                    prop_assert_eq!(parse(&out.text).unwrap(), want);
                    prop_assert!(out.faithful, "fell back on {:?}:\n{}", edits, out.text);
                }
                Err(e) => {
                    prop_assert!(want_err, "unexpected error {}", e);
                    prop_assert!(matches!(e, ConfigError::ParentNotMapping { .. }), "wrong error kind: {}", e);
                }
            }
        }

        #[test]
        fn f_semantics_on_tricky_docs(
            doc in 0..4usize,
            edits in proptest::collection::vec(edit_strategy(), 1..5),
        ) {
            let text = [
                "# head\n---\nmaxPods: 1 # c\n\"systemReserved\":\n    cpu: '1'\n    # note\nclusterDNS:\n  - a\n  - b\nzzz: x\n...\n",
                "a: &x 1\nb: *x\nlogging: {format: text}\ncrashLoopBackOff: {}\nfeatureGates:\n  on: true",
                "kind: KubeletConfiguration\r\nsystemReserved:\r\n  memory: 1Gi\r\nauthentication:\r\n  webhook:\r\n    cacheTTL: 0s\r\n",
                "a:\nb: |\n  lit\nc: plain\n  continued\nd: \"x\n  y\"\n",
            ][doc];
            let mut want = parse(text).unwrap();
            let want_err = edits.iter().any(|e| apply(&mut want, e).is_err());
            match edit(text, &edits) {
                Ok(out) => {
                    prop_assert!(!want_err);
                    prop_assert_eq!(parse(&out.text).unwrap(), want);
                }
                Err(e) => prop_assert!(want_err, "unexpected error {}", e),
            }
        }

        #[test]
        fn g_no_panic_on_arbitrary_text(text in any::<String>(), path in path_strategy()) {
            let _ = parse(&text);
            let _ = edit(&text, &[LeafEdit::Set(path.clone(), json!("x")), LeafEdit::Remove(path)]);
        }

        #[test]
        fn g_no_panic_on_yaml_like_text(
            text in "([a-c]|: |:|-|- |\n|  |#|\\{|\\}|\\[|\\]|&a|\\*a|!|\\||>|'|\"|,|---|\\.\\.\\.|\t|\\?)*",
            path in path_strategy(),
        ) {
            if let Ok(out) = edit(&text, &[LeafEdit::Set(path.clone(), json!({"k": [1]})), LeafEdit::Remove(vec!["a".into()])]) {
                let mut want = parse(&text).unwrap();
                let _ = apply(&mut want, &LeafEdit::Set(path, json!({"k": [1]})));
                let _ = apply(&mut want, &LeafEdit::Remove(vec!["a".into()]));
                prop_assert_eq!(parse(&out.text).unwrap(), want);
            }
        }
    }
}
