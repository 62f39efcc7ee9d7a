//! A POSIX shell lexer for the fragments `grub-mkconfig` sources: words (with their value
//! after quote removal and the map back to their raw bytes, [`Decoded`]) and the operators
//! between them. Single quotes, double quotes with `\` escaping only `$`, `` ` ``, `"`,
//! `\` and newline, backslash escapes and line continuations, `#` comments.

use super::GrubError;
use crate::textedit::{Decoded, Quoting};

pub(super) const EXPANSION: &str = "with a $ parameter expansion or $(...) command substitution";
pub(super) const BACKTICK: &str = "with a `...` command substitution";

/// One shell word.
#[derive(Debug)]
pub(super) struct Word {
    /// Byte offset of its first byte.
    pub start: usize,
    /// Byte offset after its last byte.
    pub end: usize,
    /// 1-based line it starts on.
    pub line: usize,
    /// The word after quote removal (with its raw map), or why it needs a shell to
    /// evaluate.
    pub value: Result<Decoded, &'static str>,
    /// No quoting or escaping at all (needed for reserved words).
    pub plain: bool,
}

/// An operator between words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Sep,
    Cond,
    Pipe,
    LParen,
    RParen,
    Redir,
    DSemi,
}

/// A word or an operator.
#[derive(Debug)]
pub(super) enum Tok {
    Word(Word),
    Op(Op),
}

/// The lexer over one fragment.
pub(super) struct Lexer<'a> {
    s: &'a str,
    b: &'a [u8],
    i: usize,
    line: usize,
}

impl<'a> Lexer<'a> {
    fn syntax(&self, line: usize, what: &str) -> GrubError {
        GrubError::Syntax {
            line,
            what: what.to_owned(),
        }
    }

    fn peek(&self, off: usize) -> Option<u8> {
        self.b.get(self.i + off).copied()
    }

    /// Advances over one (possibly multi-byte) character, returning it.
    fn bump_char(&mut self) -> Option<char> {
        let c = self.s.get(self.i..)?.chars().next()?;
        if c == '\n' {
            self.line += 1;
        }
        self.i += c.len_utf8();
        Some(c)
    }

    /// A lexer at the start of `s`.
    pub(super) fn new(s: &'a str) -> Lexer<'a> {
        Lexer {
            s,
            b: s.as_bytes(),
            i: 0,
            line: 1,
        }
    }

    /// Every token of the fragment.
    pub(super) fn tokens(mut self) -> Result<Vec<Tok>, GrubError> {
        let mut out = Vec::new();
        while let Some(c) = self.peek(0) {
            match c {
                b' ' | b'\t' => self.i += 1,
                b'\\' if self.peek(1) == Some(b'\n') => {
                    self.i += 2;
                    self.line += 1;
                }
                b'#' => {
                    while let Some(c) = self.peek(0) {
                        if c == b'\n' {
                            break;
                        }
                        self.i += 1;
                    }
                }
                b'\n' => {
                    self.i += 1;
                    self.line += 1;
                    out.push(Tok::Op(Op::Sep));
                }
                b';' => {
                    if self.peek(1) == Some(b';') {
                        self.i += 2;
                        out.push(Tok::Op(Op::DSemi));
                    } else {
                        self.i += 1;
                        out.push(Tok::Op(Op::Sep));
                    }
                }
                b'&' | b'|' => {
                    if self.peek(1) == Some(c) {
                        self.i += 2;
                        out.push(Tok::Op(Op::Cond));
                    } else {
                        self.i += 1;
                        out.push(Tok::Op(Op::Pipe));
                    }
                }
                b'(' => {
                    self.i += 1;
                    out.push(Tok::Op(Op::LParen));
                }
                b')' => {
                    self.i += 1;
                    out.push(Tok::Op(Op::RParen));
                }
                b'<' | b'>' => {
                    if c == b'<' && self.peek(1) == Some(b'<') {
                        return Err(self.syntax(self.line, "here-documents (<<) are not supported"));
                    }
                    self.i += 1;
                    if matches!(self.peek(0), Some(b'>' | b'&' | b'|')) {
                        self.i += 1;
                    }
                    out.push(Tok::Op(Op::Redir));
                }
                _ => out.push(Tok::Word(self.word()?)),
            }
        }
        Ok(out)
    }

    fn word(&mut self) -> Result<Word, GrubError> {
        let (start, line) = (self.i, self.line);
        let mut value = Decoded::new(start, Quoting::Plain);
        let mut why: Option<&'static str> = None;
        let mut plain = true;
        while let Some(c) = self.peek(0) {
            let at = self.i;
            match c {
                b' ' | b'\t' | b'\n' | b';' | b'&' | b'|' | b'<' | b'>' | b'(' | b')' => break,
                b'\\' => {
                    plain = false;
                    self.i += 1;
                    match self.bump_char() {
                        Some('\n') => {}
                        Some(ch) => value.push(ch, at..self.i, Quoting::Plain),
                        None => value.push('\\', at..self.i, Quoting::Plain),
                    }
                }
                b'\'' => {
                    plain = false;
                    let qline = self.line;
                    self.i += 1;
                    value.set_empty_at(self.i, Quoting::Single);
                    loop {
                        let at = self.i;
                        match self.bump_char() {
                            Some('\'') => break,
                            Some(ch) => value.push(ch, at..self.i, Quoting::Single),
                            None => return Err(self.syntax(qline, "unterminated single quote")),
                        }
                    }
                }
                b'"' => {
                    plain = false;
                    self.double_quoted(&mut value, &mut why)?;
                }
                b'$' => {
                    if self.dollar()? {
                        why.get_or_insert(EXPANSION);
                    } else {
                        value.push('$', at..self.i, Quoting::Plain);
                    }
                }
                b'`' => {
                    self.backtick()?;
                    why.get_or_insert(BACKTICK);
                }
                _ => {
                    if let Some(ch) = self.bump_char() {
                        value.push(ch, at..self.i, Quoting::Plain);
                    }
                }
            }
        }
        Ok(Word {
            start,
            end: self.i,
            line,
            value: why.map_or(Ok(value), Err),
            plain,
        })
    }

    fn double_quoted(
        &mut self,
        value: &mut Decoded,
        why: &mut Option<&'static str>,
    ) -> Result<(), GrubError> {
        let qline = self.line;
        self.i += 1;
        value.set_empty_at(self.i, Quoting::Double);
        loop {
            let at = self.i;
            match self.peek(0) {
                None => return Err(self.syntax(qline, "unterminated double quote")),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(b'\\') => match self.peek(1) {
                    Some(b'\n') => {
                        self.i += 2;
                        self.line += 1;
                    }
                    Some(n @ (b'$' | b'`' | b'"' | b'\\')) => {
                        self.i += 2;
                        value.push(char::from(n), at..self.i, Quoting::Double);
                    }
                    _ => {
                        self.i += 1;
                        value.push('\\', at..self.i, Quoting::Double);
                    }
                },
                Some(b'$') => {
                    if self.dollar()? {
                        why.get_or_insert(EXPANSION);
                    } else {
                        value.push('$', at..self.i, Quoting::Double);
                    }
                }
                Some(b'`') => {
                    self.backtick()?;
                    why.get_or_insert(BACKTICK);
                }
                Some(_) => {
                    if let Some(ch) = self.bump_char() {
                        value.push(ch, at..self.i, Quoting::Double);
                    }
                }
            }
        }
    }

    /// At a `$`: skips an expansion and returns true, or consumes a literal
    /// `$` and returns false.
    fn dollar(&mut self) -> Result<bool, GrubError> {
        let line = self.line;
        self.i += 1;
        match self.peek(0) {
            Some(b'{') => {
                self.i += 1;
                self.skip_until_close(b'{', b'}', line)?;
                Ok(true)
            }
            Some(b'(') => {
                self.i += 1;
                self.skip_until_close(b'(', b')', line)?;
                Ok(true)
            }
            Some(c) if c == b'_' || c.is_ascii_alphabetic() => {
                while matches!(self.peek(0), Some(c) if c == b'_' || c.is_ascii_alphanumeric()) {
                    self.i += 1;
                }
                Ok(true)
            }
            Some(c) if c.is_ascii_digit() || b"@*#?$!-".contains(&c) => {
                self.i += 1;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Skips to the matching `close`, honouring quotes, escapes, nested
    /// substitutions and backticks. The opening byte was already consumed.
    fn skip_until_close(&mut self, open: u8, close: u8, line: usize) -> Result<(), GrubError> {
        let mut depth = 1usize;
        loop {
            match self.peek(0) {
                None => {
                    return Err(self.syntax(
                        line,
                        &format!("unterminated {}...{}", char::from(open), char::from(close)),
                    ));
                }
                Some(b'\\') => {
                    self.i += 1;
                    self.bump_char();
                }
                Some(b'\'') => {
                    self.i += 1;
                    loop {
                        match self.bump_char() {
                            Some('\'') => break,
                            Some(_) => {}
                            None => return Err(self.syntax(line, "unterminated single quote")),
                        }
                    }
                }
                Some(b'"') => {
                    let mut sink = Decoded::new(0, Quoting::Plain);
                    let mut why = None;
                    self.double_quoted(&mut sink, &mut why)?;
                }
                Some(b'`') => self.backtick()?,
                Some(b'$') => {
                    self.dollar()?;
                }
                Some(c) => {
                    if c == open {
                        depth += 1;
                    } else if c == close {
                        depth -= 1;
                    }
                    self.bump_char();
                    if depth == 0 {
                        return Ok(());
                    }
                }
            }
        }
    }

    fn backtick(&mut self) -> Result<(), GrubError> {
        let line = self.line;
        self.i += 1;
        loop {
            match self.bump_char() {
                Some('`') => return Ok(()),
                Some('\\') => {
                    self.bump_char();
                }
                Some(_) => {}
                None => return Err(self.syntax(line, "unterminated backquote")),
            }
        }
    }
}
