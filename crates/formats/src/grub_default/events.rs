//! What sourcing a fragment does to variables, statement by statement: every assignment
//! and `unset`, with the context that makes it conditional or temporary (inside a compound
//! command, after `&&`/`||`, in a pipeline, as a command prefix), found by walking the
//! lexer's tokens the way the shell's grammar groups them.

use super::lexer::{Lexer, Op, Tok, Word};
use super::{GrubError, assignment_prefix, is_name};
use crate::textedit::Decoded;

pub(super) const IN_COMPOUND: &str =
    "inside a compound command (if/while/for/case/{ }/function/subshell)";
pub(super) const AFTER_COND: &str = "conditionally (after && or ||)";
pub(super) const IN_PIPELINE: &str = "in a pipeline or background job (a subshell)";
pub(super) const AS_PREFIX: &str = "as a prefix of a command (it does not persist)";

/// One assignment or `unset` of a variable.
#[derive(Debug)]
pub(super) enum Event {
    Assign {
        name: String,
        /// Raw byte range of the whole `NAME=value` word.
        start: usize,
        end: usize,
        line: usize,
        value: Result<Decoded, &'static str>,
        context: Option<&'static str>,
    },
    Unset {
        name: String,
        line: usize,
        context: Option<&'static str>,
    },
}

impl Event {
    /// The variable.
    pub(super) fn name(&self) -> &str {
        match self {
            Event::Assign { name, .. } | Event::Unset { name, .. } => name,
        }
    }
    fn set_context(&mut self, c: &'static str) {
        match self {
            Event::Assign { context, .. } | Event::Unset { context, .. } => {
                context.get_or_insert(c);
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Normal,
    Export,
    Unset,
}

fn assign_event(w: &Word, frag: &str, eq: usize, context: Option<&'static str>) -> Event {
    let name = frag[w.start..w.start + eq - 1].to_owned();
    let value = match &w.value {
        Ok(v) => {
            let mut v = v.clone();
            v.skip(eq);
            Ok(v)
        }
        Err(e) => Err(*e),
    };
    Event::Assign {
        name,
        start: w.start,
        end: w.end,
        line: w.line,
        value,
        context,
    }
}

/// The walk over the tokens: where in the grammar the next word is.
struct Walk<'f> {
    frag: &'f str,
    ev: Vec<Event>,
    /// Assignments before a command word: they become prefixes if one follows.
    pending: Vec<Event>,
    depth: usize,
    in_case: usize,
    cmd_pos: bool,
    cond: Option<&'static str>,
    mode: Mode,
    skip_word: bool,
    stmt_start: usize,
}

impl Walk<'_> {
    fn context(&self) -> Option<&'static str> {
        if self.depth > 0 {
            Some(IN_COMPOUND)
        } else {
            self.cond
        }
    }

    fn op(&mut self, op: Op) {
        self.ev.append(&mut self.pending);
        self.skip_word = false;
        self.mode = Mode::Normal;
        match op {
            Op::Sep => {
                self.cmd_pos = true;
                self.cond = None;
                self.stmt_start = self.ev.len();
            }
            Op::Cond => {
                self.cmd_pos = true;
                self.cond = Some(AFTER_COND);
            }
            Op::Pipe => {
                for e in &mut self.ev[self.stmt_start..] {
                    e.set_context(IN_PIPELINE);
                }
                self.cmd_pos = true;
                self.cond = Some(IN_PIPELINE);
            }
            Op::DSemi => self.cmd_pos = false,
            Op::LParen => {
                if self.in_case == 0 || self.cmd_pos {
                    self.depth += 1;
                    self.cmd_pos = true;
                }
            }
            Op::RParen => {
                if self.in_case > 0 && !self.cmd_pos {
                    self.cmd_pos = true; // end of a case pattern
                } else {
                    // After `name()` a function body follows; after a subshell only an
                    // operator is valid shell.
                    self.depth = self.depth.saturating_sub(1);
                    self.cmd_pos = true;
                }
            }
            Op::Redir => self.skip_word = true,
        }
    }

    /// A reserved word in command position; true when it was one.
    fn reserved(&mut self, reserved: &str) -> bool {
        match reserved {
            "if" | "while" | "until" | "{" => self.depth += 1,
            "then" | "do" | "else" | "elif" | "!" => {}
            "fi" | "done" | "}" => {
                self.depth = self.depth.saturating_sub(1);
                self.cmd_pos = false;
            }
            "for" => {
                self.depth += 1;
                self.cmd_pos = false;
            }
            "case" => {
                self.depth += 1;
                self.in_case += 1;
                self.cmd_pos = false;
            }
            _ => return false,
        }
        true
    }

    fn word(&mut self, w: &Word) {
        if self.skip_word {
            self.skip_word = false;
            return;
        }
        let ctx = self.context();
        let raw = &self.frag[w.start..w.end];
        let reserved = if w.plain { raw } else { "" };
        if self.in_case > 0 && reserved == "esac" {
            self.in_case -= 1;
            self.depth = self.depth.saturating_sub(1);
            self.cmd_pos = false;
            return;
        }
        if self.cmd_pos {
            if self.reserved(reserved) {
                return;
            }
            if let Some(eq) = assignment_prefix(raw) {
                self.pending.push(assign_event(w, self.frag, eq, ctx));
                return;
            }
            for mut e in self.pending.drain(..) {
                e.set_context(AS_PREFIX);
                self.ev.push(e);
            }
            self.cmd_pos = false;
            self.mode = match reserved {
                "export" | "readonly" => Mode::Export,
                "unset" => Mode::Unset,
                _ => Mode::Normal,
            };
            return;
        }
        match self.mode {
            Mode::Export => {
                if let Some(eq) = assignment_prefix(raw) {
                    self.ev.push(assign_event(w, self.frag, eq, ctx));
                }
            }
            Mode::Unset => {
                if is_name(raw) {
                    self.ev.push(Event::Unset {
                        name: raw.to_owned(),
                        line: w.line,
                        context: ctx,
                    });
                }
            }
            Mode::Normal => {}
        }
    }
}

/// Lexes the fragment and lists every assignment and `unset` in order.
pub(super) fn events(frag: &str) -> Result<Vec<Event>, GrubError> {
    let mut walk = Walk {
        frag,
        ev: Vec::new(),
        pending: Vec::new(),
        depth: 0,
        in_case: 0,
        cmd_pos: true,
        cond: None,
        mode: Mode::Normal,
        skip_word: false,
        stmt_start: 0,
    };
    for tok in Lexer::new(frag).tokens()? {
        match tok {
            Tok::Op(op) => walk.op(op),
            Tok::Word(w) => walk.word(&w),
        }
    }
    walk.ev.append(&mut walk.pending);
    Ok(walk.ev)
}
