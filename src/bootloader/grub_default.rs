//! Reading and editing variables in `/etc/default/grub` and
//! `/etc/default/grub.d/*.cfg`.
//!
//! Those files are POSIX shell fragments that `grub-mkconfig` sources with
//! `/bin/sh` (dash on Debian/Ubuntu), in the order `/etc/default/grub`, then
//! `grub.d/*.cfg` in glob order. This module never runs a shell: it lexes the
//! fragment with the POSIX quoting rules (single quotes, double quotes with
//! `\` escaping only `$`, `` ` ``, `"`, `\` and newline, backslash escapes and
//! line continuations, `#` comments) and finds the assignments of one variable.
//!
//! An assignment of the requested variable that cannot be evaluated without a
//! shell (parameter expansion, command substitution, assignment inside
//! `if`/`case`/loops/functions/subshells, after `&&`/`||`, in a pipeline, or as
//! a prefix of a command) is an error naming the line: we refuse to edit what
//! we cannot evaluate. Assignments of other variables may use any of these
//! (`GRUB_DISTRIBUTOR=\`...\``) and are skipped.
//!
//! Limitations: here-documents are rejected as a syntax error; `~` expansion
//! and `case` patterns containing `(` are not modelled.

use std::fmt::Write as _;

/// Errors from [`read_var`] and [`set_var`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrubError {
    /// The fragment is not valid shell as far as our lexer can tell (for
    /// example an unterminated quote); `grub-mkconfig` would fail too.
    #[error("line {line}: {what}; fix the shell syntax of this file (grub-mkconfig sources it)")]
    Syntax {
        /// 1-based line where the problem starts.
        line: usize,
        /// What is wrong.
        what: String,
    },
    /// The variable's effective assignment cannot be evaluated without a
    /// shell.
    #[error(
        "line {line}: {var} is assigned {how} ({text}); refusing to edit a value that cannot be \
         evaluated without running a shell: replace it with a literal assignment {var}=\"...\""
    )]
    Unevaluable {
        /// 1-based line of the assignment.
        line: usize,
        /// The variable name.
        var: String,
        /// Why it cannot be evaluated.
        how: &'static str,
        /// The raw assignment text.
        text: String,
    },
    /// The variable name is not a shell name.
    #[error("{0:?} is not a shell variable name: use letters, digits and '_' (not first a digit)")]
    InvalidName(String),
    /// The new value cannot be stored in a shell fragment.
    #[error(
        "the new value for {var} contains a NUL byte, which a shell variable cannot hold; remove it"
    )]
    InvalidValue {
        /// The variable name.
        var: String,
    },
}

fn is_name(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c == b'_' || c.is_ascii_alphabetic())
        && b.all(|c| c == b'_' || c.is_ascii_alphanumeric())
}

/// Length of a leading `NAME=` (including the `=`), if the raw word starts
/// with one.
fn assignment_prefix(raw: &str) -> Option<usize> {
    let eq = raw.find('=')?;
    is_name(&raw[..eq]).then_some(eq + 1)
}

const EXPANSION: &str = "with a $ parameter expansion or $(...) command substitution";
const BACKTICK: &str = "with a `...` command substitution";

#[derive(Debug)]
struct Word {
    start: usize,
    end: usize,
    line: usize,
    /// The word after quote removal, or why it needs a shell to evaluate.
    value: Result<String, &'static str>,
    /// No quoting or escaping at all (needed for reserved words).
    plain: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Sep,
    Cond,
    Pipe,
    LParen,
    RParen,
    Redir,
    DSemi,
}

#[derive(Debug)]
enum Tok {
    Word(Word),
    Op(Op),
}

struct Lexer<'a> {
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

    fn tokens(mut self) -> Result<Vec<Tok>, GrubError> {
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
        let mut value = String::new();
        let mut why: Option<&'static str> = None;
        let mut plain = true;
        while let Some(c) = self.peek(0) {
            match c {
                b' ' | b'\t' | b'\n' | b';' | b'&' | b'|' | b'<' | b'>' | b'(' | b')' => break,
                b'\\' => {
                    plain = false;
                    self.i += 1;
                    match self.bump_char() {
                        Some('\n') => {}
                        Some(ch) => value.push(ch),
                        None => value.push('\\'),
                    }
                }
                b'\'' => {
                    plain = false;
                    let qline = self.line;
                    self.i += 1;
                    loop {
                        match self.bump_char() {
                            Some('\'') => break,
                            Some(ch) => value.push(ch),
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
                        value.push('$');
                    }
                }
                b'`' => {
                    self.backtick()?;
                    why.get_or_insert(BACKTICK);
                }
                _ => {
                    if let Some(ch) = self.bump_char() {
                        value.push(ch);
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
        value: &mut String,
        why: &mut Option<&'static str>,
    ) -> Result<(), GrubError> {
        let qline = self.line;
        self.i += 1;
        loop {
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
                        value.push(char::from(n));
                    }
                    _ => {
                        self.i += 1;
                        value.push('\\');
                    }
                },
                Some(b'$') => {
                    if self.dollar()? {
                        why.get_or_insert(EXPANSION);
                    } else {
                        value.push('$');
                    }
                }
                Some(b'`') => {
                    self.backtick()?;
                    why.get_or_insert(BACKTICK);
                }
                Some(_) => {
                    if let Some(ch) = self.bump_char() {
                        value.push(ch);
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
                    let mut sink = String::new();
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

const IN_COMPOUND: &str = "inside a compound command (if/while/for/case/{ }/function/subshell)";
const AFTER_COND: &str = "conditionally (after && or ||)";
const IN_PIPELINE: &str = "in a pipeline or background job (a subshell)";
const AS_PREFIX: &str = "as a prefix of a command (it does not persist)";

#[derive(Debug)]
enum Event {
    Assign {
        name: String,
        start: usize,
        end: usize,
        line: usize,
        value: Result<String, &'static str>,
        context: Option<&'static str>,
    },
    Unset {
        name: String,
        line: usize,
        context: Option<&'static str>,
    },
}

impl Event {
    fn name(&self) -> &str {
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

fn assign_event(frag: &str, w: &Word, eq: usize, context: Option<&'static str>) -> Event {
    let name = frag[w.start..w.start + eq - 1].to_owned();
    let value = match &w.value {
        Ok(v) => Ok(v.get(eq..).unwrap_or("").to_owned()),
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

/// Lexes the fragment and lists every assignment and `unset` in order.
fn events(frag: &str) -> Result<Vec<Event>, GrubError> {
    let toks = Lexer {
        s: frag,
        b: frag.as_bytes(),
        i: 0,
        line: 1,
    }
    .tokens()?;
    let mut ev: Vec<Event> = Vec::new();
    let mut pending: Vec<Event> = Vec::new();
    let mut depth = 0usize;
    let mut in_case = 0usize;
    let mut cmd_pos = true;
    let mut cond: Option<&'static str> = None;
    let mut mode = Mode::Normal;
    let mut skip_word = false;
    let mut stmt_start = 0usize;
    for tok in &toks {
        let ctx = if depth > 0 { Some(IN_COMPOUND) } else { cond };
        match tok {
            Tok::Op(op) => {
                ev.append(&mut pending);
                skip_word = false;
                mode = Mode::Normal;
                match op {
                    Op::Sep => {
                        cmd_pos = true;
                        cond = None;
                        stmt_start = ev.len();
                    }
                    Op::Cond => {
                        cmd_pos = true;
                        cond = Some(AFTER_COND);
                    }
                    Op::Pipe => {
                        for e in &mut ev[stmt_start..] {
                            e.set_context(IN_PIPELINE);
                        }
                        cmd_pos = true;
                        cond = Some(IN_PIPELINE);
                    }
                    Op::DSemi => cmd_pos = false,
                    Op::LParen => {
                        if in_case == 0 || cmd_pos {
                            depth += 1;
                            cmd_pos = true;
                        }
                    }
                    Op::RParen => {
                        if in_case > 0 && !cmd_pos {
                            cmd_pos = true; // end of a case pattern
                        } else {
                            // After `name()` a function body follows; after a
                            // subshell only an operator is valid shell.
                            depth = depth.saturating_sub(1);
                            cmd_pos = true;
                        }
                    }
                    Op::Redir => skip_word = true,
                }
            }
            Tok::Word(w) => {
                if skip_word {
                    skip_word = false;
                    continue;
                }
                let raw = &frag[w.start..w.end];
                let reserved = if w.plain { raw } else { "" };
                if in_case > 0 && reserved == "esac" {
                    in_case -= 1;
                    depth = depth.saturating_sub(1);
                    cmd_pos = false;
                    continue;
                }
                if cmd_pos {
                    match reserved {
                        "if" | "while" | "until" | "{" => {
                            depth += 1;
                            continue;
                        }
                        "then" | "do" | "else" | "elif" | "!" => continue,
                        "fi" | "done" | "}" => {
                            depth = depth.saturating_sub(1);
                            cmd_pos = false;
                            continue;
                        }
                        "for" => {
                            depth += 1;
                            cmd_pos = false;
                            continue;
                        }
                        "case" => {
                            depth += 1;
                            in_case += 1;
                            cmd_pos = false;
                            continue;
                        }
                        _ => {}
                    }
                    if let Some(eq) = assignment_prefix(raw) {
                        pending.push(assign_event(frag, w, eq, ctx));
                        continue;
                    }
                    for mut e in pending.drain(..) {
                        e.set_context(AS_PREFIX);
                        ev.push(e);
                    }
                    cmd_pos = false;
                    mode = match reserved {
                        "export" | "readonly" => Mode::Export,
                        "unset" => Mode::Unset,
                        _ => Mode::Normal,
                    };
                    continue;
                }
                match mode {
                    Mode::Export => {
                        if let Some(eq) = assignment_prefix(raw) {
                            ev.push(assign_event(frag, w, eq, ctx));
                        }
                    }
                    Mode::Unset => {
                        if is_name(raw) {
                            ev.push(Event::Unset {
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
    }
    ev.append(&mut pending);
    Ok(ev)
}

/// The last event touching `var`, checked for evaluability.
enum Last {
    Absent,
    Value {
        start: usize,
        end: usize,
        value: String,
    },
}

fn last_state(frag: &str, var: &str) -> Result<Last, GrubError> {
    if !is_name(var) {
        return Err(GrubError::InvalidName(var.to_owned()));
    }
    let ev = events(frag)?;
    let Some(e) = ev.into_iter().rev().find(|e| e.name() == var) else {
        return Ok(Last::Absent);
    };
    match e {
        Event::Unset { context: None, .. } => Ok(Last::Absent),
        Event::Unset {
            line,
            context: Some(how),
            ..
        } => Err(GrubError::Unevaluable {
            line,
            var: var.to_owned(),
            how,
            text: format!("unset {var}"),
        }),
        Event::Assign {
            start,
            end,
            line,
            value,
            context,
            ..
        } => {
            let text = frag[start..end].to_owned();
            match (context, value) {
                (Some(how), _) | (None, Err(how)) => Err(GrubError::Unevaluable {
                    line,
                    var: var.to_owned(),
                    how,
                    text,
                }),
                (None, Ok(value)) => Ok(Last::Value { start, end, value }),
            }
        }
    }
}

/// The value of `var` after sourcing `fragments` in order, as `grub-mkconfig` does
/// (`/etc/default/grub`, then `/etc/default/grub.d/*.cfg`): each fragment's last
/// assignment wins, and an assignment that appends to the variable itself
/// (`VAR="$VAR more"`, `VAR="${VAR} more"`) is evaluated with the value so far. Any other
/// expansion is an error naming the fragment.
pub fn value_after(fragments: &[(String, String)], var: &str) -> Result<Option<String>, String> {
    let mut cur: Option<String> = None;
    for (path, text) in fragments {
        if !assigns(text, var) {
            continue;
        }
        cur = match read_var(text, var) {
            Ok(v) => v,
            Err(GrubError::Unevaluable {
                text: raw, line, ..
            }) => Some(
                self_append(&raw, var, cur.as_deref().unwrap_or(""))
                    .ok_or_else(|| format!("{path}: line {line}: {var} can not be evaluated"))?,
            ),
            Err(e) => return Err(format!("{path}: {e}")),
        };
    }
    Ok(cur)
}

/// `VAR="$VAR more"` (or `${VAR}`, optionally after `export `) with `$VAR` replaced by
/// `cur`; None for anything else (other expansions, escapes, command substitution).
fn self_append(raw: &str, var: &str, cur: &str) -> Option<String> {
    let raw = raw.trim().strip_prefix("export ").unwrap_or(raw.trim());
    let value = raw.strip_prefix(var)?.strip_prefix('=')?;
    let inner = value.strip_prefix('"')?.strip_suffix('"')?;
    if inner.contains(['\\', '`', '"']) {
        return None;
    }
    let braced = format!("${{{var}}}");
    let mut out = inner.replace(&braced, cur);
    let plain = format!("${var}");
    while let Some(i) = out.find(&plain) {
        let after = &out[i + plain.len()..];
        if after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        out = format!("{}{cur}{after}", &out[..i]);
    }
    (!out.contains('$')).then_some(out)
}

/// Returns the value of the LAST assignment of `var` in the shell fragment,
/// after shell quote removal, or `None` when the fragment never assigns it
/// (or a later plain `unset var` clears it).
///
/// Mirrors what `/bin/sh` would leave in `var` after sourcing the fragment
/// alone (as `grub-mkconfig` does with `/etc/default/grub`, then each
/// `grub.d/*.cfg`): `VAR=value`, `export VAR=value`, `readonly VAR=value`,
/// several assignments on one line, quoted values spanning lines.
///
/// # Errors
/// * [`GrubError::InvalidName`] if `var` is not a shell name;
/// * [`GrubError::Syntax`] for an unterminated quote/substitution or a
///   here-document anywhere in the fragment;
/// * [`GrubError::Unevaluable`] naming the line when the effective assignment
///   of `var` uses `$`/`` ` `` expansion or sits in a conditional, compound,
///   pipeline or command-prefix context. Assignments of other variables are
///   never an error.
pub fn read_var(fragment: &str, var: &str) -> Result<Option<String>, GrubError> {
    Ok(match last_state(fragment, var)? {
        Last::Absent => None,
        Last::Value { value, .. } => Some(value),
    })
}

/// Double-quotes `value` for a shell fragment, escaping `"`, `$`, `` ` ``
/// and `\`.
fn shell_double_quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if matches!(c, '"' | '$' | '`' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// Returns the fragment with the last assignment of `var` rewritten as
/// `VAR="value"` (with `"`, `$`, `` ` `` and `\` escaped); every other byte,
/// including an `export ` before it and a comment after it, is kept. When the
/// fragment does not assign `var`, `VAR="value"\n` is appended (after a
/// newline if the fragment does not end with one).
///
/// Mirrors a hand edit of the `GRUB_CMDLINE_LINUX=` line; `read_var` on the
/// result returns `value`.
///
/// # Errors
/// The errors of [`read_var`] (we refuse to overwrite an assignment we cannot
/// evaluate, such as `VAR="$VAR foo"`), [`GrubError::InvalidValue`] for a
/// value containing NUL, and [`GrubError::Syntax`] when the edited text would
/// not read back as `value` (checked on every call).
pub fn set_var(fragment: &str, var: &str, value: &str) -> Result<String, GrubError> {
    if value.contains('\0') {
        return Err(GrubError::InvalidValue {
            var: var.to_owned(),
        });
    }
    let new = format!("{var}={}", shell_double_quote(value));
    let out = match last_state(fragment, var)? {
        Last::Value { start, end, .. } => {
            let mut out = String::with_capacity(fragment.len() + new.len());
            out.push_str(&fragment[..start]);
            out.push_str(&new);
            out.push_str(&fragment[end..]);
            out
        }
        Last::Absent => {
            let mut out = fragment.to_owned();
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            let _ = writeln!(out, "{new}");
            out
        }
    };
    // Safety net: the edit must read back (an append after a trailing `\`
    // continuation or an unclosed `if` would not take effect).
    match read_var(&out, var) {
        Ok(Some(v)) if v == value => Ok(out),
        _ => Err(GrubError::Syntax {
            line: fragment.lines().count().max(1),
            what: format!(
                "an assignment of {var} written at the end would not take effect (the file ends \
                 inside a line continuation or an unclosed compound command)"
            ),
        }),
    }
}

/// True if any uncommented assignment of `var` exists in the fragment, in any
/// context (`VAR=`, `export VAR=`, inside `if`, after `&&`, ...). Used to
/// detect `/etc/default/grub.d/*.cfg` files that shadow a value from
/// `/etc/default/grub` (they are sourced later, so they win).
///
/// Never fails: when the fragment cannot be lexed, falls back to a
/// conservative line scan (any non-comment line containing `VAR=` at the
/// start of a word counts).
pub fn assigns(fragment: &str, var: &str) -> bool {
    match events(fragment) {
        Ok(ev) => ev
            .iter()
            .any(|e| matches!(e, Event::Assign { name, .. } if name == var)),
        Err(_) => {
            let pat = format!("{var}=");
            fragment.lines().any(|l| {
                let l = l.trim_start();
                !l.starts_with('#')
                    && l.match_indices(&pat).any(|(i, _)| {
                        i == 0
                            || matches!(
                                l.as_bytes()[i - 1],
                                b' ' | b'\t' | b';' | b'&' | b'|' | b'(' | b'{'
                            )
                    })
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::{Arg, Cmdline};

    fn fixture(p: &str) -> String {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/nodes");
        std::fs::read_to_string(format!("{root}/{p}")).unwrap()
    }

    /// Lines that differ between two texts with the same line count.
    fn changed_lines(a: &str, b: &str) -> Vec<usize> {
        let (la, lb): (Vec<_>, Vec<_>) = (a.split('\n').collect(), b.split('\n').collect());
        assert_eq!(la.len(), lb.len());
        (0..la.len()).filter(|&i| la[i] != lb[i]).collect()
    }

    const V: &str = "GRUB_CMDLINE_LINUX";

    #[test]
    fn ubuntu_append_isolcpus() {
        let text = fixture("ubuntu-2404-grub/etc/default/grub");
        let old = read_var(&text, V).unwrap().unwrap();
        assert_eq!(old, "intel_iommu=on iommu=pt");
        assert_eq!(
            read_var(&text, "GRUB_CMDLINE_LINUX_DEFAULT")
                .unwrap()
                .as_deref(),
            Some("quiet splash")
        );
        // GRUB_DISTRIBUTOR uses backticks: an error for it, not for us.
        assert!(matches!(
            read_var(&text, "GRUB_DISTRIBUTOR"),
            Err(GrubError::Unevaluable {
                line: 8,
                how: BACKTICK,
                ..
            })
        ));
        let isol: Vec<Arg> = ["isolcpus=2-7", "nohz_full=2-7"]
            .map(|s| Arg::parse_one(s).unwrap())
            .to_vec();
        let appended = Cmdline::parse(&old).apply(&[], &isol).render();
        let new = set_var(&text, V, &appended).unwrap();
        assert_eq!(changed_lines(&text, &new), [9]);
        assert!(new.contains(
            "\nGRUB_CMDLINE_LINUX=\"intel_iommu=on iommu=pt isolcpus=2-7 nohz_full=2-7\"\n"
        ));
        assert_eq!(
            read_var(&new, V).unwrap().as_deref(),
            Some("intel_iommu=on iommu=pt isolcpus=2-7 nohz_full=2-7")
        );
        // apply(remove those, append nothing) gives back the original bytes.
        let now = Cmdline::parse(&read_var(&new, V).unwrap().unwrap());
        let back = set_var(&new, V, &now.apply(&isol, &[]).render()).unwrap();
        assert_eq!(back, text);
    }

    #[test]
    fn default_after_grub_d_self_appends() {
        let frags: Vec<(String, String)> = [
            "ubuntu-2404-grub/etc/default/grub",
            "ubuntu-2404-grub/etc/default/grub.d/50-cloudimg-settings.cfg",
            "ubuntu-2404-grub/etc/default/grub.d/60-hugepages.cfg",
        ]
        .iter()
        .map(|p| (p.to_string(), fixture(p)))
        .collect();
        assert_eq!(
            value_after(&frags, "GRUB_CMDLINE_LINUX_DEFAULT")
                .unwrap()
                .as_deref(),
            Some("console=tty1 console=ttyS0 default_hugepagesz=1G hugepagesz=1G hugepages=16")
        );
        let braced = vec![
            ("a".to_string(), "X=\"one\"\n".to_string()),
            ("b".to_string(), "export X=\"${X} two\"\n".to_string()),
        ];
        assert_eq!(
            value_after(&braced, "X").unwrap().as_deref(),
            Some("one two")
        );
        let other = vec![("c".to_string(), "X=\"$Y two\"\n".to_string())];
        assert!(value_after(&other, "X").unwrap_err().contains("c: line 1"));
        let prefix = vec![("d".to_string(), "X=\"$XY\"\n".to_string())];
        assert!(value_after(&prefix, "X").is_err());
    }

    #[test]
    fn ubuntu_grub_d_shadowing() {
        let cloud = fixture("ubuntu-2404-grub/etc/default/grub.d/50-cloudimg-settings.cfg");
        let huge = fixture("ubuntu-2404-grub/etc/default/grub.d/60-hugepages.cfg");
        assert!(!assigns(&cloud, V));
        assert!(assigns(&cloud, "GRUB_CMDLINE_LINUX_DEFAULT"));
        assert!(!assigns(&huge, V));
        assert!(assigns(&huge, "GRUB_CMDLINE_LINUX_DEFAULT"));
        assert_eq!(read_var(&cloud, V).unwrap(), None);
        assert_eq!(
            read_var(&cloud, "GRUB_CMDLINE_LINUX_DEFAULT")
                .unwrap()
                .as_deref(),
            Some("console=tty1 console=ttyS0")
        );
        let e = read_var(&huge, "GRUB_CMDLINE_LINUX_DEFAULT").unwrap_err();
        assert!(matches!(
            e,
            GrubError::Unevaluable {
                line: 2,
                how: EXPANSION,
                ..
            }
        ));
        assert!(e.to_string().contains("line 2"));
        assert!(set_var(&huge, "GRUB_CMDLINE_LINUX_DEFAULT", "x").is_err());
        assert!(!assigns(
            &fixture("ubuntu-2404-grub/etc/default/grub"),
            "GRUB_TERMINAL"
        ));
    }

    #[test]
    fn fedora_and_rhel_append_isolcpus() {
        for (node, line) in [("fedora-41-bls", 5), ("rhel8-grubenv", 5)] {
            let text = fixture(&format!("{node}/etc/default/grub"));
            let old = read_var(&text, V).unwrap().unwrap();
            assert!(old.ends_with("=1") || old.ends_with("madvise"), "{old}");
            let want = format!("{old} isolcpus=2-7 nohz_full=2-7");
            let new = set_var(&text, V, &want).unwrap();
            assert_eq!(changed_lines(&text, &new), [line], "{node}");
            assert_eq!(read_var(&new, V).unwrap(), Some(want));
            // "$(sed 's, release .*$,,g' /etc/system-release)" is skipped intact.
            assert!(matches!(
                read_var(&text, "GRUB_DISTRIBUTOR"),
                Err(GrubError::Unevaluable { line: 2, .. })
            ));
            assert_eq!(
                read_var(&text, "GRUB_DEFAULT").unwrap().as_deref(),
                Some("saved")
            );
        }
    }

    #[test]
    fn quoting_rules() {
        let f = "A='x \"y\" $z'\nB=\"a \\\"b\\\" \\$c \\\\ \\q\"\nC=a\\ b\\\nc\nexport D=\"1\n2\" # c\nE=$ F=1 G=\"$\"\n";
        assert_eq!(read_var(f, "A").unwrap().as_deref(), Some("x \"y\" $z"));
        assert_eq!(
            read_var(f, "B").unwrap().as_deref(),
            Some("a \"b\" $c \\ \\q")
        );
        assert_eq!(read_var(f, "C").unwrap().as_deref(), Some("a bc"));
        assert_eq!(read_var(f, "D").unwrap().as_deref(), Some("1\n2"));
        assert_eq!(read_var(f, "E").unwrap().as_deref(), Some("$"));
        assert_eq!(read_var(f, "G").unwrap().as_deref(), Some("$"));
        assert_eq!(read_var(f, "F").unwrap().as_deref(), Some("1"));
        assert_eq!(read_var(f, "Z").unwrap(), None);
        let tricky = "weird \"q\" $x `y` \\";
        let g = set_var(f, "D", tricky).unwrap();
        assert_eq!(read_var(&g, "D").unwrap().as_deref(), Some(tricky));
        assert!(g.contains("export D=\"weird \\\"q\\\" \\$x \\`y\\` \\\\\" # c\n"));
    }

    #[test]
    fn contexts_refused() {
        let bad = [
            ("if true; then X=1; fi\n", IN_COMPOUND),
            ("true && X=1\n", AFTER_COND),
            ("X=1 | cat\n", IN_PIPELINE),
            ("X=1 true\n", AS_PREFIX),
            ("f() { X=1; }\n", IN_COMPOUND),
            ("case a in a) X=1;; esac\n", IN_COMPOUND),
            ("X=\"${Y}\"\n", EXPANSION),
            ("X=`true`\n", BACKTICK),
        ];
        for (f, how) in bad {
            match read_var(f, "X") {
                Err(GrubError::Unevaluable {
                    how: h, line: 1, ..
                }) => assert_eq!(h, how, "{f}"),
                other => panic!("{f}: {other:?}"),
            }
            assert!(assigns(f, "X"), "{f}");
        }
        // A plain assignment after the conditional one wins.
        assert_eq!(
            read_var(
                "if a; then X=1; fi\nX=2\ncase a in a) Y=1;; esac\nX=3 Y=4\n",
                "X"
            )
            .unwrap()
            .as_deref(),
            Some("3")
        );
        assert_eq!(read_var("X=1\nunset X\n", "X").unwrap(), None);
        assert_eq!(
            set_var("X=1\nunset X", "X", "2").unwrap(),
            "X=1\nunset X\nX=\"2\"\n"
        );
        assert_eq!(set_var("", "X", "2").unwrap(), "X=\"2\"\n");
        assert!(matches!(
            read_var("X='a\n", "X"),
            Err(GrubError::Syntax { line: 1, .. })
        ));
        assert!(matches!(
            read_var("Y=\"$(a\n", "X"),
            Err(GrubError::Syntax { .. })
        ));
        assert!(assigns("#x\nX='broken\n", "X"));
        assert!(!assigns("# X=1\n", "X"));
        assert!(matches!(read_var("", "1X"), Err(GrubError::InvalidName(_))));
        assert!(matches!(
            set_var("", "X", "a\0"),
            Err(GrubError::InvalidValue { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,60}", v in "[ -~]{0,20}") {
            let _ = read_var(&s, "X");
            let _ = assigns(&s, "X");
            if let Ok(out) = set_var(&s, "X", &v) {
                proptest::prop_assert_eq!(read_var(&out, "X").unwrap(), Some(v));
            }
        }

        #[test]
        fn set_roundtrip(v in "\\PC{0,30}", pre in "[A-Z]{1,3}=[a-z]{0,3}\n") {
            let f = format!("{pre}X=old\n# tail\n");
            let out = set_var(&f, "X", &v).unwrap();
            proptest::prop_assert_eq!(read_var(&out, "X").unwrap(), Some(v));
            proptest::prop_assert!(out.starts_with(&pre) && out.ends_with("\n# tail\n"));
        }
    }
}
