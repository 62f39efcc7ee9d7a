//! Rendering values as YAML the kubelet reads back as the same value: strings that
//! YAML 1.1 or 1.2 would read otherwise are quoted; whole documents in kubeadm's layout
//! (block style, sequences not indented under their key).

use super::*;

pub(super) fn is_yaml_printable(c: char) -> bool {
    matches!(c, '\u{20}'..='\u{7E}' | '\u{A0}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
        && c != '\u{FEFF}'
}

/// Strings that YAML 1.1 (go-yaml v2, PyYAML) or YAML 1.2 (core schema) would not read back as
/// the same plain string.
pub(super) fn plain_is_ambiguous(s: &str) -> bool {
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

pub(super) fn plain_is_syntactically_safe(s: &str) -> bool {
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

pub(super) fn double_quoted(s: &str) -> String {
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

pub(super) fn single_quoted(s: &str) -> Option<String> {
    if !s.chars().all(is_yaml_printable) || s.starts_with(' ') || s.ends_with(' ') {
        return None;
    }
    Some(format!("'{}'", s.replace('\'', "''")))
}

pub(super) fn render_string(s: &str) -> String {
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

pub(super) fn is_block_collection(v: &Value) -> bool {
    match v {
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
        _ => false,
    }
}

/// Render `key: value` (block style) at `indent`, kubeadm style. `key_text` is the already
/// rendered key; a sequence's `- ` stands `seq_off` columns right of its key (0 in
/// kubeadm's layout).
pub(super) fn render_entry(
    out: &mut String,
    key_text: &str,
    v: &Value,
    indent: usize,
    seq_off: usize,
) {
    out.push_str(&" ".repeat(indent));
    out.push_str(key_text);
    match v {
        Value::Object(m) if !m.is_empty() => {
            out.push_str(":\n");
            render_map_body(out, m, indent + 2, seq_off);
        }
        Value::Array(a) if !a.is_empty() => {
            out.push_str(":\n");
            render_seq_body(out, a, indent + seq_off, seq_off);
        }
        other => {
            out.push_str(": ");
            out.push_str(&render_scalar(other));
            out.push('\n');
        }
    }
}

pub(super) fn render_map_body(
    out: &mut String,
    m: &Map<String, Value>,
    indent: usize,
    seq_off: usize,
) {
    for (k, v) in m {
        render_entry(out, &render_string(k), v, indent, seq_off);
    }
}

pub(super) fn render_seq_body(out: &mut String, a: &[Value], indent: usize, seq_off: usize) {
    for item in a {
        out.push_str(&" ".repeat(indent));
        out.push_str("- ");
        if is_block_collection(item) {
            let mut inner = String::new();
            match item {
                Value::Object(m) => render_map_body(&mut inner, m, indent + 2, seq_off),
                Value::Array(a) => render_seq_body(&mut inner, a, indent + 2, seq_off),
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
pub(super) fn render_document(v: &Value) -> String {
    match v {
        Value::Object(m) if !m.is_empty() => {
            let mut out = String::new();
            render_map_body(&mut out, m, 0, 0);
            out
        }
        other => format!("{}\n", render_scalar(other)),
    }
}

/// A string as a scalar inside a flow collection: [`render_string`], double-quoted when
/// the plain form holds a flow indicator (`,`, `[`, `]`, `{`, `}`).
pub(super) fn flow_string(s: &str) -> String {
    let r = render_string(s);
    if !r.starts_with('"') && r.contains([',', '[', ']', '{', '}']) {
        double_quoted(s)
    } else {
        r
    }
}

/// A value in flow style (`[a, b]`, `{x: 1, y: "on"}`), written where the value replaced
/// or its parent collection is flow style.
pub(super) fn render_flow(v: &Value) -> String {
    match v {
        Value::String(s) => flow_string(s),
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(render_flow).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(m) => {
            let items: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{}: {}", flow_string(k), render_flow(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        other => render_scalar(other),
    }
}
