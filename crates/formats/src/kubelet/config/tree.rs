//! The YAML syntax tree with byte spans: the parser's events (serde-saphyr's granit
//! parser) built into nodes that know where they stand in the text, so that an edit can
//! splice the text around them.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Style {
    Plain,
    Single,
    Double,
    Block,
}

#[derive(Debug)]
pub(super) enum Node {
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
        flow: bool,
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
    pub(super) fn start(&self) -> usize {
        match self {
            Node::Scalar { start, .. }
            | Node::Alias { start, .. }
            | Node::Seq { start, .. }
            | Node::Map { start, .. } => *start,
        }
    }
    pub(super) fn end(&self) -> usize {
        match self {
            Node::Scalar { end, .. }
            | Node::Alias { end, .. }
            | Node::Seq { end, .. }
            | Node::Map { end, .. } => *end,
        }
    }
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Node::Scalar { .. } => "scalar",
            Node::Alias { .. } => "alias",
            Node::Seq { .. } => "sequence",
            Node::Map { .. } => "mapping",
        }
    }
}

#[derive(Debug)]
pub(super) enum Ev {
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

pub(super) fn byte_of(text: &str, m: &serde_saphyr::granit_parser::Marker) -> usize {
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

pub(super) fn tag_string(tag: &serde_saphyr::granit_parser::Tag) -> String {
    if tag.is_yaml_core_schema() {
        format!("!!{}", tag.suffix())
    } else {
        format!("{}{}", tag.handle(), tag.suffix())
    }
}

pub(super) fn lex(text: &str) -> Result<Vec<(Ev, usize, usize)>, ConfigError> {
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

pub(super) struct TreeBuilder {
    evs: Vec<(Ev, usize, usize)>,
    pos: usize,
}

impl TreeBuilder {
    pub(super) fn unexpected() -> ConfigError {
        ConfigError::Syntax {
            line: 0,
            column: 0,
            message: "unexpected end of the YAML event stream".into(),
        }
    }

    pub(super) fn node(&mut self, depth: usize) -> Result<Node, ConfigError> {
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
            Ev::SeqStart { flow, anchor } => self.seq(depth, s, flow, anchor),
            Ev::MapStart {
                flow,
                anchor,
                tagged,
            } => self.map(depth, s, flow, anchor, tagged),
            Ev::DocStart | Ev::SeqEnd | Ev::MapEnd => Err(Self::unexpected()),
        }
    }

    /// The items of a sequence that started at byte `s`, up to its end event. A block
    /// sequence ends where its last item ends (the event's span runs on to the next key).
    fn seq(
        &mut self,
        depth: usize,
        s: usize,
        flow: bool,
        anchor: usize,
    ) -> Result<Node, ConfigError> {
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
                        flow,
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

    /// The entries of a mapping that started at byte `s`, up to its end event; a block
    /// mapping ends where its last entry ends.
    fn map(
        &mut self,
        depth: usize,
        s: usize,
        flow: bool,
        anchor: usize,
        tagged: bool,
    ) -> Result<Node, ConfigError> {
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
}

/// Parse the text into the root node of its single document.
pub(super) fn parse_tree(text: &str) -> Result<Node, ConfigError> {
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
