//! YAML 1.1 scalar resolution as go-yaml v2 does it (`on`/`off`/`yes`/`no`/`y`/`n` are
//! booleans, `0644` is an octal integer), and the tree's conversion to JSON: [`parse`].

use super::*;

pub(super) const YAML11_TRUE: &[&str] = &[
    "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON",
];
pub(super) const YAML11_FALSE: &[&str] = &[
    "n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF",
];
pub(super) const YAML_NULL: &[&str] = &["", "~", "null", "Null", "NULL"];

/// Go's `strconv.ParseInt(s, 0, 64)`/`ParseUint` on the text (underscores already removed).
pub(super) fn go_parse_int(s: &str) -> Option<Value> {
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
pub(super) fn is_yaml_style_float(s: &str) -> bool {
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

pub(super) fn is_special_float(s: &str) -> bool {
    let t = s.strip_prefix(['-', '+']).unwrap_or(s);
    matches!(t, ".inf" | ".Inf" | ".INF" | ".nan" | ".NaN" | ".NAN")
}

/// Resolve a plain scalar like go-yaml v2 does (YAML 1.1 booleans, Go integer syntax, floats).
pub(super) fn resolve_plain(s: &str, path: &[String]) -> Result<Value, ConfigError> {
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

pub(super) fn scalar_to_json(
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

pub(super) fn key_to_string(key: &Node, path: &[String]) -> Result<String, ConfigError> {
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

pub(super) struct ToJson {
    anchors: HashMap<usize, (Value, usize)>,
    budget: usize,
}

impl ToJson {
    pub(super) fn charge(&mut self, n: usize, path: &[String]) -> Result<(), ConfigError> {
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
    pub(super) fn conv(
        &mut self,
        node: &Node,
        path: &mut Vec<String>,
    ) -> Result<(Value, usize), ConfigError> {
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

pub(super) fn tree_to_json(root: &Node) -> Result<Value, ConfigError> {
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

pub(super) fn parse_root(root: &Node) -> Result<Value, ConfigError> {
    let v = tree_to_json(root)?;
    match v {
        Value::Object(_) => Ok(v),
        other => Err(ConfigError::TopLevelNotMapping {
            found: kind_of(&other),
        }),
    }
}
