//! Faithful text edits: each [`LeafEdit`] becomes a splice of the lines of the edited
//! node only; where the document uses a construct that can not be edited in place, the
//! whole document is re-rendered and the result says `faithful: false`.

use super::*;

pub(super) fn line_start(text: &str, pos: usize) -> usize {
    text[..pos].rfind('\n').map_or(0, |i| i + 1)
}

/// Position just after the newline ending the line that contains `pos` (or the text end).
pub(super) fn line_end_incl(text: &str, pos: usize) -> usize {
    text[pos..].find('\n').map_or(text.len(), |i| pos + i + 1)
}

/// Why a faithful edit is not possible (we fall back to re-rendering).
pub(super) struct NotFaithful;

pub(super) struct Splice {
    start: usize,
    end: usize,
    with: String,
}

pub(super) fn apply_splice(text: &str, sp: Splice) -> String {
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
pub(super) fn key_layout<'t>(text: &'t str, key: &Node) -> Result<(usize, &'t str), NotFaithful> {
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
pub(super) fn entry_lines(
    text: &str,
    key: &Node,
    value: &Node,
) -> Result<(usize, usize), NotFaithful> {
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

pub(super) fn block_map_entries(node: &Node) -> Result<&[(Node, Node)], NotFaithful> {
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

pub(super) fn find_entry<'n>(
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
pub(super) fn replace_entry(
    text: &str,
    key: &Node,
    value: &Node,
    new: &Value,
) -> Result<Splice, NotFaithful> {
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

pub(super) fn is_simple_scalar(text: &str, n: &Node) -> bool {
    matches!(n, Node::Scalar { style, anchor: 0, tag: None, start, end, .. }
        if *style != Style::Block && start < end && !text[*start..*end].contains('\n'))
}

pub(super) fn render_replacing(old: &Node, new: &Value) -> String {
    if let (Node::Scalar { style, .. }, Value::String(s)) = (old, new) {
        match style {
            Style::Double => return double_quoted(s),
            Style::Single => return single_quoted(s).unwrap_or_else(|| double_quoted(s)),
            _ => {}
        }
    }
    render_scalar(new)
}

/// The splice that makes `text` (parsed as `root`) hold `next`, the document after the
/// edit `e`; `Err(NotFaithful)` where the edit point's construct can not be spliced.
pub(super) fn splice_for(
    text: &str,
    root: &Node,
    next: &Value,
    e: &LeafEdit,
) -> Result<Result<Option<Splice>, NotFaithful>, ConfigError> {
    match e {
        LeafEdit::Set(path, v) => splice_set(text, root, next, (path, v), None),
        LeafEdit::SetRaw(path, v, raw) => splice_set(text, root, next, (path, v), Some(raw)),
        LeafEdit::Remove(path) => splice_remove(text, root, next, path),
    }
}

/// The splice of a set: the scalar replaced in place, the entry re-rendered, or the key
/// inserted with its missing parents.
fn splice_set(
    text: &str,
    root: &Node,
    next: &Value,
    (path, v): (&[String], &Value),
    raw: Option<&str>,
) -> Result<Result<Option<Splice>, NotFaithful>, ConfigError> {
    let mut node = root;
    for i in 0..path.len() {
        let prefix = &path[..=i];
        let Ok(entries) = block_map_entries(node) else {
            return Ok(Err(NotFaithful));
        };
        let Some((k, val)) = find_entry(entries, &path[i], &path[..i])? else {
            // Insert the new key (with its missing parents) into this mapping.
            let Some(newv) = get(next, prefix) else {
                return Ok(Err(NotFaithful));
            };
            return Ok(insert_entry(text, entries, &path[i], newv, &path[..i]));
        };
        let is_last = i + 1 == path.len();
        if is_last && is_simple_scalar(text, val) && !is_block_collection(v) {
            return Ok(Ok(Some(Splice {
                start: val.start(),
                end: val.end(),
                with: match raw {
                    // the original text, when it still reads back as the value
                    Some(r) if scalar_text_is(r, v) => r.to_string(),
                    _ => render_replacing(val, v),
                },
            })));
        }
        let empty_flow_map =
            matches!(val, Node::Map { flow: true, entries, .. } if entries.is_empty());
        let null = matches!(val, Node::Scalar { style: Style::Plain, value, .. } if YAML_NULL.contains(&value.as_str()));
        if is_last || empty_flow_map || null {
            let Some(newv) = get(next, prefix) else {
                return Ok(Err(NotFaithful));
            };
            return Ok(replace_entry(text, k, val, newv).map(Some));
        }
        node = val;
    }
    Ok(Err(NotFaithful))
}

/// True when `raw`, as the value of a key, reads back as `v` (go-yaml v2 resolution).
fn scalar_text_is(raw: &str, v: &Value) -> bool {
    !raw.contains('\n')
        && super::scalars::parse(&format!("k: {raw}\n"))
            .ok()
            .and_then(|d| d.get("k").cloned())
            .as_ref()
            == Some(v)
}

/// The source text of the simple scalar at `path` in `text` (`cluster.local`,
/// `"off"`), to restore it byte for byte later; None when the path is absent or not a
/// one-line scalar.
pub fn raw_scalar(text: &str, path: &[String]) -> Option<String> {
    let root = parse_tree(text).ok()?;
    let mut node = &root;
    for (i, k) in path.iter().enumerate() {
        let entries = block_map_entries(node).ok()?;
        let (_, val) = find_entry(entries, k, &path[..i]).ok()??;
        node = val;
    }
    is_simple_scalar(text, node).then(|| text[node.start()..node.end()].to_string())
}

/// The splice of a removal: the lines of the shallowest entry that no longer exists
/// after the edit (`{}` when it was the document's only entry).
fn splice_remove(
    text: &str,
    root: &Node,
    next: &Value,
    path: &[String],
) -> Result<Result<Option<Splice>, NotFaithful>, ConfigError> {
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
            return Ok(entry_lines(text, k, val).map(|(start, end)| {
                let with = if depth == 0 && entries.len() == 1 {
                    "{}\n".to_string()
                } else {
                    String::new()
                };
                Some(Splice { start, end, with })
            }));
        }
        node = val;
    }
    Ok(Err(NotFaithful))
}

pub(super) fn insert_entry(
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
pub(super) fn rerender(expected: &Value) -> Result<Edited, ConfigError> {
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
