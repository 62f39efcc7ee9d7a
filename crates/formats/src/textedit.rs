//! Values decoded from quoted text, with the map back to their raw bytes, so that an edit
//! of the decoded value changes only the raw bytes it must.
//!
//! The shell-style editors (`/etc/default/grub`, systemd env files such as
//! `kubeadm-flags.env`) and grubenv read a value through quotes, escapes and continuation
//! lines. A [`Decoded`] value remembers, for every decoded byte, the raw bytes it came from
//! and the quoting it was read in. [`Decoded::splice`] then replaces a decoded range:
//!
//! * deleted characters lose exactly their raw bytes; when the first and the last deleted
//!   character were read in the same quoting, the raw bytes between them go too (the reader
//!   is in the same state at both cut points, so the rest of the text reads the same), else
//!   every quote and continuation between them is kept;
//! * inserted text goes right after the character before the insertion point, in that
//!   character's quoting, encoded by the format's [`Encode`] for that quoting (so a value
//!   in single quotes stays in single quotes, an unquoted one stays unquoted).
//!
//! Inserting text and then deleting the same decoded range gives back the original bytes.
//! No I/O.

use std::ops::Range;

/// The quoting a character was read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quoting {
    /// Outside quotes (a backslash escape counts as unquoted).
    Plain,
    /// Inside `'...'`.
    Single,
    /// Inside `"..."`.
    Double,
}

/// How a format writes text in a given quoting: the raw bytes that read back as the text.
pub type Encode = fn(Quoting, &str) -> String;

/// A decoded value and, per decoded byte, the raw byte range and quoting it came from.
#[derive(Debug, Clone)]
pub struct Decoded {
    text: String,
    spans: Vec<(usize, usize, Quoting)>,
    empty_at: (usize, Quoting),
}

impl Decoded {
    /// An empty value; text inserted into it while it has no character goes to raw offset
    /// `at`, in quoting `q` (for `VAR=""`, just after the opening quote, [`Quoting::Double`]).
    pub fn new(at: usize, q: Quoting) -> Decoded {
        Decoded {
            text: String::new(),
            spans: Vec::new(),
            empty_at: (at, q),
        }
    }

    /// Records a quote opening at raw offset `at` (just after the quote): text inserted
    /// into a value that turns out to have no character goes to the last such point.
    pub fn set_empty_at(&mut self, at: usize, q: Quoting) {
        self.empty_at = (at, q);
    }

    /// Drops the first `n` decoded bytes (a prefix such as `NAME=` read unquoted); when
    /// nothing is left and no quote opened after the prefix, insertion goes right after it.
    pub fn skip(&mut self, n: usize) {
        if n == 0 || n > self.text.len() {
            return;
        }
        let end = self.spans[n - 1].1;
        self.text.drain(..n);
        self.spans.drain(..n);
        if self.empty_at.0 < end {
            self.empty_at = (end, Quoting::Plain);
        }
    }

    /// Appends decoded character `c`, read from raw bytes `raw` in quoting `q`.
    pub fn push(&mut self, c: char, raw: Range<usize>, q: Quoting) {
        self.text.push(c);
        for _ in 0..c.len_utf8() {
            self.spans.push((raw.start, raw.end, q));
        }
    }

    /// Keeps the first `len` decoded bytes (a char boundary).
    pub fn truncate(&mut self, len: usize) {
        self.text.truncate(len);
        self.spans.truncate(self.text.len());
    }

    /// The decoded value.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Where text inserted at decoded offset `p` goes in the raw text, and its quoting.
    fn insertion_point(&self, p: usize) -> (usize, Quoting) {
        if p > 0 {
            let (_, end, q) = self.spans[p - 1];
            (end, q)
        } else if let Some(&(start, _, q)) = self.spans.first() {
            (start, q)
        } else {
            self.empty_at
        }
    }

    /// `raw` with the decoded bytes `range` replaced by `insert`, written with `encode` in
    /// the quoting of the insertion point (see the module docs). `range` must lie on char
    /// boundaries of [`Decoded::text`].
    pub fn splice(&self, raw: &str, range: Range<usize>, insert: &str, encode: Encode) -> String {
        let mut out = raw.to_string();
        let (at, q) = self.insertion_point(range.start);
        if !range.is_empty() {
            let (a, _, qa) = self.spans[range.start];
            let (_, b, qb) = self.spans[range.end - 1];
            if qa == qb {
                out.replace_range(a..b, "");
            } else {
                let mut spans: Vec<(usize, usize)> = self.spans[range.clone()]
                    .iter()
                    .map(|s| (s.0, s.1))
                    .collect();
                spans.dedup();
                for (s, e) in spans.into_iter().rev() {
                    out.replace_range(s..e, "");
                }
            }
        }
        if !insert.is_empty() {
            let at = if range.is_empty() {
                at
            } else {
                self.spans[range.start].0
            };
            let q = if range.is_empty() {
                q
            } else {
                self.spans[range.start].2
            };
            out.insert_str(at, &encode(q, insert));
        }
        out
    }
}

/// The POSIX shell's way to write `s` (`/etc/default/grub`, read by `sh`'s `.`): in double
/// quotes `"`, `$`, `` ` `` and `\` get a backslash; in single quotes a `'` is written
/// `'"'"'` (close, a double-quoted quote, reopen); unquoted, every character but letters,
/// digits and `-_./,:+=@%^` gets a backslash (so a space is `\ `).
pub fn shell_encode(q: Quoting, s: &str) -> String {
    encode_with(q, s, |c| {
        !(c.is_alphanumeric() || "-_./,:+=@%^".contains(c) || !c.is_ascii())
    })
}

/// systemd's env-file way to write `s` (`EnvironmentFile=`, systemd.exec(5)): in double
/// quotes `"`, `\`, `` ` `` and `$` get a backslash (the characters systemd unescapes
/// there); in single quotes a `'` is written `'"'"'`; unquoted, `\`, `'` and `"` get a
/// backslash (whitespace inside an unquoted value is kept by systemd as written).
pub fn systemd_encode(q: Quoting, s: &str) -> String {
    encode_with(q, s, |c| matches!(c, '\\' | '\'' | '"'))
}

/// `s` written for `q`: the double- and single-quote rules the shell and systemd share,
/// and a backslash before every character `plain_escaped` names when unquoted.
fn encode_with(q: Quoting, s: &str, plain_escaped: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    for c in s.chars() {
        match q {
            Quoting::Double if matches!(c, '"' | '$' | '`' | '\\') => out.push('\\'),
            Quoting::Single if c == '\'' => out.push_str("'\"'\""),
            Quoting::Plain if plain_escaped(c) => out.push('\\'),
            _ => {}
        }
        out.push(c);
    }
    out
}

/// The comment line the agent writes before an assignment it appends to a file that did
/// not have one (`GRUB_CMDLINE_LINUX=` in `/etc/default/grub`, `KUBELET_KUBEADM_ARGS=` in
/// `kubeadm-flags.env`), so that the revert can take the line away again: without it the
/// last removal would leave `VAR=""`, which is not the original bytes. A `#` line is a
/// comment for both `sh` and systemd's env-file reader (systemd.exec(5)).
pub const OWNED_LINE: &str =
    "# Added by inplaced with the next line; both go when that value is empty again.";
/// [`OWNED_LINE`] for a file that did not end with a newline: the agent wrote one before
/// the marker, and takes it away with the two lines.
pub const OWNED_LINE_AFTER_BREAK: &str = "# Added by inplaced with the next line and the line \
     break before; all go when that value is empty again.";

/// `text` with `assignment` (one line, no newline) appended after an [`OWNED_LINE`]
/// marker, each on a line of its own; a newline is first added when `text` is not empty
/// and does not end with one (and the marker says so).
pub fn append_owned_line(text: &str, assignment: &str) -> String {
    let mut out = String::with_capacity(text.len() + assignment.len() + 120);
    out.push_str(text);
    if text.is_empty() || text.ends_with('\n') {
        out.push_str(OWNED_LINE);
    } else {
        out.push('\n');
        out.push_str(OWNED_LINE_AFTER_BREAK);
    }
    out.push('\n');
    out.push_str(assignment);
    out.push('\n');
    out
}

/// `text` without the `VAR=""` line [`append_owned_line`] wrote (with its marker) once
/// the last word in it is removed; `text` unchanged when that line is the file's own.
pub fn without_owned_empty(text: String, var: &str) -> String {
    drop_owned_line(&text, &format!("{var}=\"\"")).unwrap_or(text)
}

/// The inverse of [`append_owned_line`] once the value is empty again: `text` without
/// the marker and the `empty` assignment line after it (and without the newline the
/// marker says was added, when nothing follows), or `None` when `text` has no such pair
/// (the assignment is the file's own, whose bytes stay).
pub fn drop_owned_line(text: &str, empty: &str) -> Option<String> {
    for (marker, break_before) in [(OWNED_LINE, false), (OWNED_LINE_AFTER_BREAK, true)] {
        let pair = format!("{marker}\n{empty}\n");
        let found = text
            .rmatch_indices(&pair)
            .map(|(i, _)| i)
            .find(|&i| i == 0 || text.as_bytes()[i - 1] == b'\n');
        if let Some(i) = found {
            let end = i + pair.len();
            let start = if break_before && i > 0 && end == text.len() {
                i - 1
            } else {
                i
            };
            return Some(format!("{}{}", &text[..start], &text[end..]));
        }
    }
    None
}

/// A value a word-level edit can be applied to in place: decoded, then spliced.
pub trait InPlace {
    /// Why a splice can not be written.
    type Error;
    /// The value as its reader decodes it now.
    fn decoded(&self) -> String;
    /// Replaces the decoded bytes `range` with `insert`.
    ///
    /// # Errors
    /// When the format can not hold the result (a fixed-size block that would overflow).
    fn splice(&mut self, range: Range<usize>, insert: &str) -> Result<(), Self::Error>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owned_line_goes_with_its_marker_and_only_then() {
        for text in ["", "A=1\n", "A=1", "# c\r\nA=1\r\n"] {
            let added = append_owned_line(text, "V=\"x\"");
            assert!(added.ends_with("V=\"x\"\n"), "{added:?}");
            let emptied = added.replace("V=\"x\"", "V=\"\"");
            assert_eq!(drop_owned_line(&emptied, "V=\"\"").as_deref(), Some(text));
        }
        // a line the user wrote after ours keeps its line break
        let added = append_owned_line("A=1", "V=\"\"") + "B=2\n";
        assert_eq!(
            drop_owned_line(&added, "V=\"\"").as_deref(),
            Some("A=1\nB=2\n")
        );
        // the file's own empty assignment stays
        assert_eq!(drop_owned_line("A=1\nV=\"\"\n", "V=\"\""), None);
        // a marker not at the start of a line is not ours
        let glued = format!("x{OWNED_LINE}\nV=\"\"\n");
        assert_eq!(drop_owned_line(&glued, "V=\"\""), None);
    }

    /// A toy double-quoted value: `"a b"` decodes to `a b`.
    fn dq(raw: &str) -> Decoded {
        let mut d = Decoded::new(1, Quoting::Double);
        for (i, c) in raw.char_indices() {
            if c != '"' {
                d.push(c, i..i + c.len_utf8(), Quoting::Double);
            }
        }
        d
    }

    #[test]
    fn insert_then_delete_is_identity() {
        let raw = "\"a b\"";
        let d = dq(raw);
        let out = d.splice(raw, 3..3, " c$", shell_encode);
        assert_eq!(out, "\"a b c\\$\"");
        let mut d2 = Decoded::new(1, Quoting::Double);
        // decode the result by hand: a, space, b, space, c, \$
        let spans = [(1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 8)];
        for ((s, e), c) in spans.iter().zip("a b c$".chars()) {
            d2.push(c, *s..*e, Quoting::Double);
        }
        assert_eq!(d2.splice(&out, 3..6, "", shell_encode), raw);
        assert_eq!(dq("\"\"").splice("\"\"", 0..0, "x", shell_encode), "\"x\"");
    }

    #[test]
    fn encoders() {
        assert_eq!(shell_encode(Quoting::Plain, " a b"), "\\ a\\ b");
        assert_eq!(shell_encode(Quoting::Single, " it's"), " it'\"'\"'s");
        assert_eq!(
            systemd_encode(Quoting::Plain, " --a=\"x\""),
            " --a=\\\"x\\\""
        );
        assert_eq!(systemd_encode(Quoting::Double, "`$"), "\\`\\$");
    }
}
