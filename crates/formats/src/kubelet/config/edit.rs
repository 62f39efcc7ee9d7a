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
    /// Order among splices at the same place (inserts at one position): deeper
    /// mappings first (their block ends there), then by key in a sorted mapping, else
    /// in edit order (`(usize::MAX - depth, key)`; `(0, "")` for non-inserts).
    rank: (usize, String),
}

impl Splice {
    fn new(start: usize, end: usize, with: String) -> Splice {
        Splice {
            start,
            end,
            with,
            rank: (0, String::new()),
        }
    }
}

/// The text a splice puts in: the file's line ending (`\r\n` if it has any), and no
/// final newline when the splice reaches the end of a file that has none.
fn splice_text(text: &str, crlf: bool, sp: &Splice) -> String {
    let mut with = sp.with.clone();
    if sp.end == text.len() && !text.ends_with('\n') && with.ends_with('\n') {
        with.pop();
    }
    if crlf {
        with = with.replace('\n', "\r\n");
    }
    with
}

pub(super) fn apply_splice(text: &str, sp: Splice) -> String {
    apply_splices(text, &[sp])
}

/// Apply non-overlapping splices sorted by position in one pass.
fn apply_splices(text: &str, sps: &[Splice]) -> String {
    let crlf = text.contains("\r\n");
    let mut out =
        String::with_capacity(text.len() + sps.iter().map(|s| s.with.len()).sum::<usize>());
    let mut at = 0;
    for sp in sps {
        out.push_str(&text[at..sp.start]);
        out.push_str(&splice_text(text, crlf, sp));
        at = sp.end;
    }
    out.push_str(&text[at..]);
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

/// The keys of each mapping of one parsed tree, resolved once (go-yaml's key
/// resolution) and indexed, so that a batch of N edits into a mapping of N entries costs
/// O(N) and not O(N²).
#[derive(Default)]
pub(super) struct Keys {
    maps: HashMap<usize, MapKeys>,
}

/// The resolved keys of one mapping, in document order.
pub(super) struct MapKeys {
    pub(super) keys: Vec<String>,
    at: HashMap<String, usize>,
    /// The keys are in byte order (kubeadm writes them sorted): new keys go in sorted.
    pub(super) sorted: bool,
}

impl Keys {
    /// The keys of the mapping `node` (whose entries are `entries`) at `path`.
    pub(super) fn of(
        &mut self,
        node: &Node,
        entries: &[(Node, Node)],
        path: &[String],
    ) -> Result<&MapKeys, ConfigError> {
        let id = node as *const Node as usize;
        if let std::collections::hash_map::Entry::Vacant(slot) = self.maps.entry(id) {
            let mut keys = Vec::with_capacity(entries.len());
            let mut at = HashMap::with_capacity(entries.len());
            for (i, (k, _)) in entries.iter().enumerate() {
                let s = key_to_string(k, path)?;
                at.entry(s.clone()).or_insert(i);
                keys.push(s);
            }
            let sorted = keys.windows(2).all(|w| w[0] <= w[1]);
            slot.insert(MapKeys { keys, at, sorted });
        }
        Ok(&self.maps[&id])
    }

    /// The index of `key` among the entries of mapping `node`.
    pub(super) fn find(
        &mut self,
        node: &Node,
        entries: &[(Node, Node)],
        key: &str,
        path: &[String],
    ) -> Result<Option<usize>, ConfigError> {
        Ok(self.of(node, entries, path)?.at.get(key).copied())
    }
}

/// The entries of a mapping node.
pub(super) type Entries = [(Node, Node)];

/// A mapping the editor can splice into, with whether it is flow style: a non-empty
/// block mapping or any flow mapping, without an anchor or a tag.
pub(super) fn editable_map(node: &Node) -> Result<(&Entries, bool), NotFaithful> {
    match node {
        Node::Map {
            flow,
            anchor: 0,
            tagged: false,
            entries,
            ..
        } if *flow || !entries.is_empty() => Ok((entries, *flow)),
        _ => Err(NotFaithful),
    }
}

fn anchor_of(n: &Node) -> usize {
    match n {
        Node::Seq { anchor, .. } | Node::Map { anchor, .. } | Node::Scalar { anchor, .. } => {
            *anchor
        }
        Node::Alias { .. } => 1,
    }
}

/// A non-empty flow sequence or mapping (`[a, b]`, `{x: 1}`): replaced, it stays flow.
fn is_flow_collection(n: &Node) -> bool {
    match n {
        Node::Seq {
            flow: true, items, ..
        } => !items.is_empty(),
        Node::Map {
            flow: true,
            entries,
            ..
        } => !entries.is_empty(),
        _ => false,
    }
}

/// How far a block sequence's `- ` stands right of its key in this mapping: 0 in
/// kubeadm's layout (`clusterDNS:\n- x`), 2 in the indented one; taken from the entry
/// being replaced, else from the first block sequence among its neighbours, else 0.
fn seq_offset(text: &str, entries: &[(Node, Node)], prefer: Option<&Node>) -> usize {
    let off = |k: &Node, v: &Node| -> Option<usize> {
        let Node::Seq {
            flow: false, items, ..
        } = v
        else {
            return None;
        };
        let item = items.first()?;
        let ls = line_start(text, item.start());
        let dash = text[ls..item.start()].find('-')?;
        let key_col = k.start() - line_start(text, k.start());
        Some(dash.saturating_sub(key_col))
    };
    if let Some(v) = prefer
        && let Some((k, _)) = entries.iter().find(|(_, x)| std::ptr::eq(x, v))
        && let Some(o) = off(k, v)
    {
        return o;
    }
    entries.iter().find_map(|(k, v)| off(k, v)).unwrap_or(0)
}

/// Where the value of an existing entry must be rewritten as a whole block.
pub(super) fn replace_entry(
    text: &str,
    entries: &[(Node, Node)],
    key: &Node,
    value: &Node,
    new: &Value,
) -> Result<Splice, NotFaithful> {
    let (start, stop) = entry_lines(text, key, value)?;
    if anchor_of(value) != 0 {
        return Err(NotFaithful);
    }
    let (indent, key_src) = key_layout(text, key)?;
    let mut with = String::new();
    let seq_off = seq_offset(text, entries, Some(value));
    render_entry(&mut with, key_src, new, indent, seq_off);
    Ok(Splice::new(start, stop, with))
}

pub(super) fn is_simple_scalar(text: &str, n: &Node) -> bool {
    matches!(n, Node::Scalar { style, anchor: 0, tag: None, start, end, .. }
        if *style != Style::Block && start < end && !text[*start..*end].contains('\n'))
}

/// The new scalar written over `old`: a string keeps the old quote style (double or
/// single) where that style can express it; else canonical ([`render_scalar`], and
/// double-quoted inside a flow collection when the plain form holds `,[]{}`).
pub(super) fn render_replacing(old: &Node, new: &Value, flow: bool) -> String {
    if let (Node::Scalar { style, .. }, Value::String(s)) = (old, new) {
        match style {
            Style::Double => return double_quoted(s),
            Style::Single => return single_quoted(s).unwrap_or_else(|| double_quoted(s)),
            _ => {}
        }
    }
    if flow {
        render_flow(new)
    } else {
        render_scalar(new)
    }
}

/// The splice that makes `text` (parsed as `root`) hold `next` at the edit `e`'s path;
/// `Err(NotFaithful)` where the edit point's construct can not be spliced. `next` is the
/// document after the edit (sequential mode) or after all edits (batch mode).
pub(super) fn splice_for(
    text: &str,
    root: &Node,
    next: &Value,
    e: &LeafEdit,
    keys: &mut Keys,
) -> Result<Result<Option<Splice>, NotFaithful>, ConfigError> {
    match e {
        LeafEdit::Set(path, _) => splice_set(text, root, next, path, None, keys),
        LeafEdit::SetRaw(path, _, raw) => splice_set(text, root, next, path, Some(raw), keys),
        LeafEdit::Remove(path) => splice_remove(text, root, next, path, keys),
    }
}

/// The splice of a set: the scalar (or flow collection) replaced in place, the entry
/// re-rendered, or the key inserted with its missing parents.
fn splice_set(
    text: &str,
    root: &Node,
    next: &Value,
    path: &[String],
    raw: Option<&str>,
    keys: &mut Keys,
) -> Result<Result<Option<Splice>, NotFaithful>, ConfigError> {
    let Some(v) = get(next, path) else {
        return Ok(Err(NotFaithful));
    };
    let mut node = root;
    for i in 0..path.len() {
        let prefix = &path[..=i];
        let Ok((entries, flow)) = editable_map(node) else {
            return Ok(Err(NotFaithful));
        };
        let Some(j) = keys.find(node, entries, &path[i], &path[..i])? else {
            // Insert the new key (with its missing parents) into this mapping.
            let Some(newv) = get(next, prefix) else {
                return Ok(Err(NotFaithful));
            };
            return Ok(if flow {
                insert_flow(text, node, entries, &path[i], newv)
            } else {
                insert_entry(text, node, entries, (&path[i], newv), &path[..i], keys)
            });
        };
        let (k, val) = &entries[j];
        let is_last = i + 1 == path.len();
        let raw_fits = raw.filter(|r| scalar_text_is(r, v));
        if is_last
            && let Some(r) = raw_fits
            && (is_simple_scalar(text, val) || is_one_line_flow(text, val))
        {
            // a revert: the original text, which still reads back as the value
            return Ok(Ok(Some(Splice::new(val.start(), val.end(), r.to_string()))));
        }
        if is_last && is_simple_scalar(text, val) && !is_block_collection(v) {
            return Ok(Ok(Some(Splice::new(
                val.start(),
                val.end(),
                render_replacing(val, v, flow),
            ))));
        }
        let Some(newv) = get(next, prefix) else {
            return Ok(Err(NotFaithful));
        };
        let empty_flow_map =
            matches!(val, Node::Map { flow: true, entries, .. } if entries.is_empty());
        let null = matches!(val, Node::Scalar { style: Style::Plain, value, .. } if YAML_NULL.contains(&value.as_str()));
        let replace_here = is_last || empty_flow_map || null;
        if (flow && replace_here) || (is_last && is_flow_collection(val) && is_block_collection(v))
        {
            // Inside a flow collection, or over one: the new value in flow style.
            if anchor_of(val) != 0
                || val.start() >= val.end()
                || matches!(
                    val,
                    Node::Scalar {
                        style: Style::Block,
                        ..
                    }
                )
            {
                return Ok(Err(NotFaithful));
            }
            return Ok(Ok(Some(Splice::new(
                val.start(),
                val.end(),
                render_flow(newv),
            ))));
        }
        if replace_here {
            return Ok(replace_entry(text, entries, k, val, newv).map(Some));
        }
        node = val;
    }
    Ok(Err(NotFaithful))
}

fn is_one_line_flow(text: &str, n: &Node) -> bool {
    is_flow_collection(n) && anchor_of(n) == 0 && !text[n.start()..n.end()].contains('\n')
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
    raw_scalars(text, [path]).pop().flatten()
}

/// [`raw_scalar`] for many paths with one parse of `text`: the source text of each
/// path's one-line scalar or one-line flow collection (`[10.96.0.10]`), in the order of
/// `paths`; all `None` when the text does not parse.
pub fn raw_scalars<'p>(
    text: &str,
    paths: impl IntoIterator<Item = &'p [String]>,
) -> Vec<Option<String>> {
    let text = split_bom(text).1;
    raw_scalars_in(text, parse_tree(text).ok().as_ref(), paths)
}

/// [`raw_scalars`] of `text` (without a byte-order mark) whose syntax tree is `root`.
fn raw_scalars_in<'p>(
    text: &str,
    root: Option<&Node>,
    paths: impl IntoIterator<Item = &'p [String]>,
) -> Vec<Option<String>> {
    let mut keys = Keys::default();
    paths
        .into_iter()
        .map(|path| {
            let mut node = root?;
            for (i, k) in path.iter().enumerate() {
                let (entries, _) = editable_map(node).ok()?;
                let j = keys.find(node, entries, k, &path[..i]).ok()??;
                node = &entries[j].1;
            }
            (is_simple_scalar(text, node) || is_one_line_flow(text, node))
                .then(|| text[node.start()..node.end()].to_string())
        })
        .collect()
}

/// A KubeletConfiguration text parsed once, for the answers that would each parse it
/// again: [`parse`] ([`Document::value`]), [`raw_scalars`] and [`edit()`]
/// ([`Document::raw_scalars`], [`Document::edit`]), each the same as the function's on
/// [`Document::text`]. A pure function of the text: the agent keeps it while the file
/// stays the same (issue 28: the plan parsed the file three times per coverage call).
#[derive(Debug)]
pub struct Document {
    text: String,
    /// The syntax tree of the text after a byte-order mark.
    tree: Result<Node, ConfigError>,
    /// [`parse`] of the whole text.
    value: Result<Value, ConfigError>,
    /// The value of `tree`, when the text has a byte-order mark (else `value` is it).
    after_bom: Option<Result<Value, ConfigError>>,
}

impl Document {
    /// Parses `text` once.
    pub fn parse(text: String) -> Document {
        let (bom, rest) = split_bom(&text);
        let tree = parse_tree(rest);
        let (value, after_bom) = match &tree {
            Ok(root) if bom.is_empty() => (parse_root(root), None),
            Ok(root) => (parse(&text), Some(parse_root(root))),
            Err(_) => (parse(&text), None),
        };
        Document {
            text,
            tree,
            value,
            after_bom,
        }
    }

    /// The text parsed.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// [`parse`] of the text.
    ///
    /// # Errors
    /// Those of [`parse`].
    pub fn value(&self) -> Result<&Value, &ConfigError> {
        self.value.as_ref()
    }

    /// [`raw_scalars`] of the text.
    pub fn raw_scalars<'p>(
        &self,
        paths: impl IntoIterator<Item = &'p [String]>,
    ) -> Vec<Option<String>> {
        raw_scalars_in(split_bom(&self.text).1, self.tree.as_ref().ok(), paths)
    }

    /// [`edit()`] of the text.
    ///
    /// # Errors
    /// Those of [`edit()`].
    pub fn edit(&self, edits: &[LeafEdit]) -> Result<Edited, ConfigError> {
        let before = self.after_bom.as_ref().unwrap_or(&self.value);
        let (Ok(root), Ok(before)) = (&self.tree, before) else {
            // the error, worded by the edit itself
            return edit(&self.text, edits);
        };
        let (bom, text) = split_bom(&self.text);
        let mut out = edit_tree(text, root, before, edits)?;
        out.text.insert_str(0, bom);
        Ok(out)
    }
}

/// The splice of a removal: the lines of the shallowest entry that no longer exists
/// after the edit (`{}` when it was the document's only entry); in a flow mapping the
/// entry and one separating comma.
fn splice_remove(
    text: &str,
    root: &Node,
    next: &Value,
    path: &[String],
    keys: &mut Keys,
) -> Result<Result<Option<Splice>, NotFaithful>, ConfigError> {
    let Some(depth) = (0..path.len()).find(|&i| get(next, &path[..=i]).is_none()) else {
        return Ok(Ok(None));
    };
    let mut node = root;
    for i in 0..=depth {
        let Ok((entries, flow)) = editable_map(node) else {
            return Ok(Err(NotFaithful));
        };
        let Some(j) = keys.find(node, entries, &path[i], &path[..i])? else {
            // Absent before the edit as well: nothing to do.
            return Ok(Ok(None));
        };
        let (k, val) = &entries[j];
        if i == depth {
            if flow {
                return Ok(remove_flow(entries, j).map(Some));
            }
            return Ok(entry_lines(text, k, val).map(|(mut start, end)| {
                let with = if depth == 0 && entries.len() == 1 {
                    "{}\n".to_string()
                } else {
                    String::new()
                };
                // The last line of a file without a final newline: take the newline
                // before it instead, so that none is left dangling.
                if with.is_empty() && end == text.len() && !text.ends_with('\n') && start > 0 {
                    start -= 1;
                    if text[..start].ends_with('\r') {
                        start -= 1;
                    }
                }
                Some(Splice::new(start, end, with))
            }));
        }
        node = &entries[j].1;
    }
    Ok(Err(NotFaithful))
}

/// The bytes of entry `j` of a flow mapping with the comma that joins it to a neighbour.
fn remove_flow(entries: &[(Node, Node)], j: usize) -> Result<Splice, NotFaithful> {
    let spanned = |n: &Node| n.start() < n.end();
    let (k, v) = &entries[j];
    if !spanned(v) {
        return Err(NotFaithful);
    }
    if j > 0 {
        let prev = &entries[j - 1].1;
        if !spanned(prev) {
            return Err(NotFaithful);
        }
        return Ok(Splice::new(prev.end(), v.end(), String::new()));
    }
    match entries.get(1) {
        Some((k1, _)) => Ok(Splice::new(k.start(), k1.start(), String::new())),
        None => Ok(Splice::new(k.start(), v.end(), String::new())),
    }
}

/// A new `key: value` in a flow mapping: `, key: value` after its last entry (`key:
/// value` inside an empty `{}`), the value in flow style.
fn insert_flow(
    text: &str,
    node: &Node,
    entries: &[(Node, Node)],
    key: &str,
    v: &Value,
) -> Result<Option<Splice>, NotFaithful> {
    let kv = format!("{}: {}", flow_string(key), render_flow(v));
    let (pos, with) = match entries.last() {
        Some((_, last)) if last.start() < last.end() => (last.end(), format!(", {kv}")),
        Some(_) => return Err(NotFaithful),
        None if text[node.start()..].starts_with('{') => (node.start() + 1, kv),
        None => return Err(NotFaithful),
    };
    Ok(Some(Splice {
        start: pos,
        end: pos,
        with,
        rank: (0, String::new()),
    }))
}

/// A new `key: value` in a block mapping: at its sorted place when the keys are sorted,
/// else after the last entry; at the mapping's indentation, sequences laid out as the
/// neighbours lay them out.
pub(super) fn insert_entry(
    text: &str,
    node: &Node,
    entries: &[(Node, Node)],
    (key, v): (&str, &Value),
    parent: &[String],
    keys: &mut Keys,
) -> Result<Option<Splice>, NotFaithful> {
    let Some((first_key, _)) = entries.first() else {
        return Err(NotFaithful);
    };
    let (indent, _) = key_layout(text, first_key)?;
    let mk = keys.of(node, entries, parent).map_err(|_| NotFaithful)?;
    let sorted = mk.sorted;
    let idx = if sorted {
        mk.keys.partition_point(|k| k.as_str() <= key)
    } else {
        entries.len()
    };
    let pos = if idx == 0 {
        line_start(text, first_key.start())
    } else {
        let (k, val) = &entries[idx - 1];
        entry_lines(text, k, val)?.1
    };
    let mut with = String::new();
    render_entry(
        &mut with,
        &render_string(key),
        v,
        indent,
        seq_offset(text, entries, None),
    );
    if pos == text.len() && !text.is_empty() && !text.ends_with('\n') {
        with.pop();
        with.insert(0, '\n');
    }
    Ok(Some(Splice {
        start: pos,
        end: pos,
        with,
        rank: (
            usize::MAX - parent.len(),
            if sorted {
                key.to_string()
            } else {
                String::new()
            },
        ),
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
/// * inside a flow mapping a value is replaced in place, a new key appended after the last
///   entry (`, key: value`), a removed key taken out with one separating comma; a
///   non-empty flow collection replaced by a collection stays flow style (`[a, b]`);
/// * all edits are splices of one parse of `text` applied in one pass (O(text + edits));
///   where two splices would overlap (edits of a field and of its parent) the edits are
///   made one by one instead, with the same result.
///
/// A multi-line plain or quoted scalar that is Set is replaced together with its key's lines.
/// When an edit point uses something that cannot be edited faithfully (an anchor or alias on the edited node or its
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
    // a UTF-8 byte-order mark (which go-yaml skips) is kept, and the rest edited as a
    // file without one: the syntax tree's spans are the text's after the mark
    let (bom, text) = split_bom(text);
    let mut out = edit_text(text, edits)?;
    out.text.insert_str(0, bom);
    Ok(out)
}

/// The UTF-8 byte-order mark `text` starts with ("" when none), and the rest.
fn split_bom(text: &str) -> (&str, &str) {
    match text.strip_prefix('\u{feff}') {
        Some(rest) => ("\u{feff}", rest),
        None => ("", text),
    }
}

/// [`edit`] of a text without a byte-order mark.
fn edit_text(text: &str, edits: &[LeafEdit]) -> Result<Edited, ConfigError> {
    let root = parse_tree(text)?;
    let before = parse_root(&root)?;
    edit_tree(text, &root, &before, edits)
}

/// [`edit_text`] with the text's syntax tree `root` and its value `before` at hand.
fn edit_tree(
    text: &str,
    root: &Node,
    before: &Value,
    edits: &[LeafEdit],
) -> Result<Edited, ConfigError> {
    let mut expected = before.clone();
    for e in edits {
        apply(&mut expected, e)?;
    }
    if expected == *before {
        return Ok(Edited {
            text: text.to_string(),
            faithful: true,
        });
    }
    if let Some(out) = edit_batch(text, root, before, &expected, edits)
        && parse(&out).ok().as_ref() == Some(&expected)
    {
        return Ok(Edited {
            text: out,
            faithful: true,
        });
    }
    edit_sequential(text, edits, &expected)
}

impl LeafEdit {
    pub(super) fn path(&self) -> &[String] {
        match self {
            LeafEdit::Set(p, _) | LeafEdit::SetRaw(p, _, _) | LeafEdit::Remove(p) => p,
        }
    }
}

/// All edits as splices of the one parsed tree, each computed against the final
/// document `expected`, applied in one pass: O(text + edits). `None` when two splices
/// overlap (edits whose regions nest, e.g. a field and its parent) or an edit point can
/// not be spliced; [`edit`] then goes edit by edit.
fn edit_batch(
    text: &str,
    root: &Node,
    before: &Value,
    expected: &Value,
    edits: &[LeafEdit],
) -> Option<String> {
    let mut keys = Keys::default();
    // The last edit of a path decides its value (`expected` holds it).
    let mut seen = std::collections::HashSet::new();
    // A parent missing (or null, or `{}`) before the edits is rendered whole from
    // `expected` by the first edit below it: the others below it have nothing to add
    // (rendering it once per edit was O(N²) for N new featureGates).
    let mut rendered = std::collections::HashSet::new();
    let mut splices = Vec::new();
    for (idx, e) in edits.iter().enumerate().rev() {
        let path = e.path();
        if !seen.insert(path) || get(before, path) == get(expected, path) {
            continue;
        }
        if matches!(e, LeafEdit::Set(..) | LeafEdit::SetRaw(..))
            && let Some(i) = (1..path.len()).find(|&i| {
                get(before, &path[..i]).is_none_or(|v| v.as_object().is_none_or(|m| m.is_empty()))
            })
            && !rendered.insert(&path[..i])
        {
            continue;
        }
        if matches!(e, LeafEdit::Set(..) | LeafEdit::SetRaw(..)) && get(expected, path).is_none() {
            // set, then removed with a parent by a later edit: that edit's splice covers it
            continue;
        }
        match splice_for(text, root, expected, e, &mut keys) {
            Ok(Ok(Some(sp))) => splices.push((idx, sp)),
            Ok(Ok(None)) => {}
            Ok(Err(NotFaithful)) | Err(_) => return None,
        }
    }
    splices.sort_by(|(ia, a), (ib, b)| {
        (a.start, a.end, &a.rank, ia).cmp(&(b.start, b.end, &b.rank, ib))
    });
    // Edits into one missing parent each render the whole parent: keep one.
    splices.dedup_by(|(_, b), (_, a)| a.start == b.start && a.end == b.end && a.with == b.with);
    let splices: Vec<Splice> = splices.into_iter().map(|(_, sp)| sp).collect();
    if splices.windows(2).any(|w| w[0].end > w[1].start) {
        return None;
    }
    Some(apply_splices(text, &splices))
}

/// Edit by edit, re-parsing after each splice (O(edits × text)): the exact semantics
/// for batches whose splices nest; re-renders when an edit point can not be spliced.
fn edit_sequential(
    text: &str,
    edits: &[LeafEdit],
    expected: &Value,
) -> Result<Edited, ConfigError> {
    let mut cur = text.to_string();
    for e in edits {
        // `expected` was computed without error, so any failure below means the text edits
        // diverged from the semantics: fall back to re-rendering.
        let Ok(root) = parse_tree(&cur) else {
            return rerender(expected);
        };
        let Ok(before) = parse_root(&root) else {
            return rerender(expected);
        };
        let mut next = before.clone();
        if apply(&mut next, e).is_err() {
            return rerender(expected);
        }
        if next == before {
            continue;
        }
        match splice_for(&cur, &root, &next, e, &mut Keys::default()) {
            Ok(Ok(Some(sp))) => cur = apply_splice(&cur, sp),
            Ok(Ok(None)) => {}
            Ok(Err(NotFaithful)) | Err(_) => return rerender(expected),
        }
    }
    match parse(&cur) {
        Ok(v) if &v == expected => Ok(Edited {
            text: cur,
            faithful: true,
        }),
        _ => rerender(expected),
    }
}
