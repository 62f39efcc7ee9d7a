//! systemd's `EnvironmentFile=` parser, as [`scan`]: `KEY=value` assignments with their
//! quotes, backslash escapes, line continuations and `#`/`;` comment lines, each
//! recorded with the byte spans of its raw text so an editor can rewrite one assignment
//! and keep every other byte. The lexer of [`crate::kubelet::flags`], kept apart from
//! what the flags mean as `grub_default/lexer.rs` is from GRUB's variables. No I/O.

use crate::textedit::{Decoded, Quoting};

const NEWLINE: &[char] = &['\n', '\r'];
/// What systemd trims around keys and values, and splits `$VAR` on `ExecStart=` at.
pub(crate) const WHITESPACE: &[char] = &[' ', '\t', '\n', '\r'];

/// One `KEY=value` assignment found by the env-file parser.
#[derive(Debug)]
pub(crate) struct Assignment {
    /// The key, trimmed.
    pub(crate) key: String,
    /// Byte offset of the key's first character.
    pub(crate) key_start: usize,
    /// Byte offset of the newline (or end of text) that ends the assignment.
    pub(crate) end: usize,
    /// The value as systemd reads it, with the map back to its raw bytes.
    pub(crate) value: Decoded,
    /// The value opens a quote the text never closes.
    pub(crate) unterminated: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum St {
    PreKey,
    Key,
    PreValue,
    Value,
    ValueEscape,
    Single,
    Double,
    DoubleEscape,
    Comment,
}

/// The scanner of [`scan`]: systemd's states and the assignment being read.
struct Scanner {
    out: Vec<Assignment>,
    st: St,
    key: String,
    key_start: usize,
    /// Length of the key before its trailing whitespace (trimmed at `=`).
    last_key_ws: Option<usize>,
    value: Decoded,
    /// Length of the value before its trailing whitespace (trimmed at the end).
    last_value_ws: Option<usize>,
    /// Byte offset of the backslash of the escape being read.
    esc: usize,
}

/// Records where trailing whitespace starts in `s` (`c` about to be pushed).
fn track_ws(c: char, s: &str, last_ws: &mut Option<usize>) {
    if WHITESPACE.contains(&c) {
        if last_ws.is_none() {
            *last_ws = Some(s.len());
        }
    } else {
        *last_ws = None;
    }
}

impl Scanner {
    /// Ends the assignment being read at byte `end`.
    fn finish(&mut self, end: usize, unterminated: bool) {
        if let Some(n) = self.last_value_ws.take() {
            self.value.truncate(n);
        }
        self.out.push(Assignment {
            key: std::mem::take(&mut self.key),
            key_start: self.key_start,
            end,
            value: std::mem::replace(&mut self.value, Decoded::new(end, Quoting::Plain)),
            unterminated,
        });
    }

    /// One character `c` at byte `i`. The states are systemd's
    /// (`parse_env_file_internal()`'s switch), handed to one method per group, each with
    /// its states' arms in systemd's order of tests: before and in the key, the unquoted
    /// value, the quoted value.
    fn step(&mut self, i: usize, c: char) {
        let newline = NEWLINE.contains(&c);
        match self.st {
            St::PreKey | St::Key => self.key_char(i, c, newline),
            St::PreValue | St::Value | St::ValueEscape => self.value_char(i, c, newline),
            St::Single | St::Double | St::DoubleEscape => self.quoted_char(i, c, newline),
            St::Comment => {
                if newline {
                    self.st = St::PreKey;
                }
            }
        }
    }

    /// `PRE_KEY` and `KEY`: a comment line, the key's start, its end at `=`.
    fn key_char(&mut self, i: usize, c: char, newline: bool) {
        match self.st {
            St::PreKey => {
                if c == '#' || c == ';' {
                    self.st = St::Comment;
                } else if !WHITESPACE.contains(&c) {
                    self.st = St::Key;
                    self.key.clear();
                    self.key.push(c);
                    self.key_start = i;
                    self.last_key_ws = None;
                }
            }
            St::Key if newline => {
                self.st = St::PreKey;
                self.key.clear();
            }
            St::Key if c == '=' => {
                if let Some(n) = self.last_key_ws.take() {
                    self.key.truncate(n);
                }
                self.st = St::PreValue;
                self.value = Decoded::new(i + 1, Quoting::Plain);
                self.last_value_ws = None;
            }
            _ => {
                track_ws(c, &self.key, &mut self.last_key_ws);
                self.key.push(c);
            }
        }
    }

    /// `PRE_VALUE`, `VALUE` and `VALUE_ESCAPE`: the unquoted value, the opening of a
    /// quote, a backslash escape (an escaped newline continues the value).
    fn value_char(&mut self, i: usize, c: char, newline: bool) {
        let end = i + c.len_utf8();
        match self.st {
            St::PreValue | St::Value if newline => {
                self.st = St::PreKey;
                self.finish(i, false);
            }
            St::PreValue => match c {
                '\'' => {
                    self.st = St::Single;
                    self.value.set_empty_at(i + 1, Quoting::Single);
                }
                '"' => {
                    self.st = St::Double;
                    self.value.set_empty_at(i + 1, Quoting::Double);
                }
                '\\' => {
                    self.st = St::ValueEscape;
                    self.esc = i;
                }
                c if !WHITESPACE.contains(&c) => {
                    self.st = St::Value;
                    self.value.push(c, i..end, Quoting::Plain);
                }
                _ => {}
            },
            St::Value if c == '\\' => {
                self.st = St::ValueEscape;
                self.esc = i;
                self.last_value_ws = None;
            }
            St::Value => {
                track_ws(c, self.value.text(), &mut self.last_value_ws);
                self.value.push(c, i..end, Quoting::Plain);
            }
            _ => {
                self.st = St::Value;
                if !newline {
                    // Escaped whitespace is not trimmed.
                    self.value.push(c, self.esc..end, Quoting::Plain);
                    self.last_value_ws = None;
                }
            }
        }
    }

    /// `SINGLE_QUOTE_VALUE`, `DOUBLE_QUOTE_VALUE` and `DOUBLE_QUOTE_VALUE_ESCAPE`: inside
    /// double quotes a backslash escapes only `"`, `\`, `` ` ``, `$` and a newline.
    fn quoted_char(&mut self, i: usize, c: char, newline: bool) {
        let end = i + c.len_utf8();
        match self.st {
            St::Single => match c {
                '\'' => self.st = St::PreValue,
                c => self.value.push(c, i..end, Quoting::Single),
            },
            St::Double => match c {
                '"' => self.st = St::PreValue,
                '\\' => {
                    self.st = St::DoubleEscape;
                    self.esc = i;
                }
                c => self.value.push(c, i..end, Quoting::Double),
            },
            _ => {
                self.st = St::Double;
                if matches!(c, '"' | '\\' | '`' | '$') {
                    self.value.push(c, self.esc..end, Quoting::Double);
                } else if !newline {
                    self.value.push('\\', self.esc..end, Quoting::Double);
                    self.value.push(c, self.esc..end, Quoting::Double);
                }
            }
        }
    }
}

/// systemd's `parse_env_file_internal()` (src/basic/env-file.c, v254+), recording byte
/// spans: every assignment of `text`, in file order (a later one of a key overrides an
/// earlier one).
pub(crate) fn scan(text: &str) -> Vec<Assignment> {
    let mut sc = Scanner {
        out: Vec::new(),
        st: St::PreKey,
        key: String::new(),
        key_start: 0,
        last_key_ws: None,
        value: Decoded::new(0, Quoting::Plain),
        last_value_ws: None,
        esc: 0,
    };
    for (i, c) in text.char_indices() {
        sc.step(i, c);
    }
    match sc.st {
        St::PreValue | St::Value | St::ValueEscape => sc.finish(text.len(), false),
        St::Single | St::Double | St::DoubleEscape => sc.finish(text.len(), true),
        _ => {}
    }
    sc.out
}

#[cfg(test)]
mod tests {
    use super::scan;

    /// (key, value as systemd reads it, unterminated) of each assignment.
    fn read(text: &str) -> Vec<(String, String, bool)> {
        scan(text)
            .into_iter()
            .map(|a| (a.key, a.value.text().to_string(), a.unterminated))
            .collect()
    }

    fn one(k: &str, v: &str) -> (String, String, bool) {
        (k.to_string(), v.to_string(), false)
    }

    #[test]
    fn keys_and_values_are_trimmed_and_comment_lines_skipped() {
        let t = "# A=1\n; B=2\n  C = x y  \nD=\n E\nF='q' \"r\"\n";
        assert_eq!(read(t), vec![one("C", "x y"), one("D", ""), one("F", "qr")]);
    }

    #[test]
    fn escapes_follow_systemd() {
        // unquoted: a backslash keeps the next character (escaped space not trimmed);
        // an escaped newline continues the value
        assert_eq!(read("A=a\\ \\\nb\\ \n"), vec![one("A", "a b ")]);
        // double quotes: only " \ ` $ are escaped, other backslashes kept
        assert_eq!(read("A=\"\\\"\\$\\x\"\n"), vec![one("A", "\"$\\x")]);
        // single quotes: no escapes
        assert_eq!(read("A='\\n'\n"), vec![one("A", "\\n")]);
    }

    #[test]
    fn an_open_quote_at_the_end_is_unterminated() {
        assert_eq!(
            read("A=\"x\nB=1"),
            vec![("A".to_string(), "x\nB=1".to_string(), true)]
        );
        assert_eq!(read("A=x"), vec![one("A", "x")]);
    }

    #[test]
    fn spans_cover_the_assignment_without_its_newline() {
        let t = "X=1\n  KEY=\"v\"  \r\nY=2";
        let list = scan(t);
        assert_eq!(list.len(), 3);
        assert_eq!(&t[list[1].key_start..list[1].end], "KEY=\"v\"  ");
        assert_eq!(list[2].end, t.len());
    }
}
