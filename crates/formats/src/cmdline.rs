//! A kernel-faithful model of the Linux kernel command line.
//!
//! Tokenizing mirrors `next_arg()` in the kernel's `lib/cmdline.c` (the parser
//! behind `parse_args()` and `/proc/cmdline` consumers in the kernel):
//!
//! * arguments are separated by runs of whitespace (the kernel's `isspace()`:
//!   space, `\t`, `\n`, `\v`, `\f`, `\r`);
//! * every `"` toggles an "in quotes" state, and whitespace inside quotes does
//!   not split (`dyndbg="file foo.c +p"`, `"foo bar"`);
//! * the key ends at the first `=` at index >= 1 of the argument body, *even
//!   inside quotes* (the kernel does not look at the quote state there);
//! * a value starting with `"` loses that quote, and then a trailing `"` of the
//!   argument is dropped too; an argument starting with `"` loses it and its
//!   trailing `"`;
//! * the kernel stops at a NUL byte, so [`Cmdline::parse`] does too.
//!
//! Each [`Arg`] keeps its raw text so that rendering a parsed command line
//! gives back the same arguments (whitespace between them normalised to one
//! space).
//!
//! Deliberate divergence: the kernel's `isspace()` also treats the Latin-1
//! byte `0xA0` as whitespace. A `&str` cannot be split inside a UTF-8
//! sequence, so [`Cmdline::parse`] keeps such characters inside the argument,
//! and [`Arg::parse_one`] rejects any character whose UTF-8 encoding contains
//! the byte `0xA0` (for example U+00A0 or `à`) so that we never *write* one.
//!
//! We do not use the `linux-kernel-cmdline` crate: its parameter parser strips
//! a trailing `"` even when the value did not start with one (`foo=bar"` gives
//! `bar`, the kernel gives `bar"`), does not treat `\v` as whitespace, and
//! splits `=a=b` as key `""` where the kernel gives key `=a`.

use std::fmt;
use std::ops::Range;

use crate::textedit::InPlace;

/// Errors from [`Arg::parse_one`] and [`Cmdline::check`].
///
/// Every message names the offending argument and says how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CmdlineError {
    /// The argument text was empty.
    #[error("empty kernel argument: give a key such as `quiet` or `key=value`")]
    Empty,
    /// Whitespace outside double quotes would split the text into several
    /// kernel arguments.
    #[error(
        "kernel argument {arg:?} contains whitespace outside double quotes, so the kernel would \
         split it; pass the parts as separate arguments or quote the value (key=\"a b\")"
    )]
    UnquotedWhitespace {
        /// The rejected text.
        arg: String,
    },
    /// An odd number of `"` would make the kernel swallow every following
    /// argument into this one.
    #[error(
        "kernel argument {arg:?} has an unbalanced double quote, so the kernel would merge every \
         following argument into it; close the quote (key=\"value\")"
    )]
    UnbalancedQuote {
        /// The rejected text.
        arg: String,
    },
    /// A bare `--` is not a kernel argument: it ends the kernel's parameters
    /// and everything after it is passed to init.
    #[error(
        "{arg:?} is not a kernel argument: it ends the kernel parameters and passes the rest to \
         init; give real kernel arguments instead"
    )]
    InitSeparator {
        /// The rejected text.
        arg: String,
    },
    /// A character that cannot be stored safely in a command line or in the
    /// line-based files that carry it.
    #[error("kernel argument {arg:?} contains the forbidden character {ch:?} ({why}); remove it")]
    ForbiddenChar {
        /// The rejected text.
        arg: String,
        /// The offending character.
        ch: char,
        /// Why it is forbidden.
        why: &'static str,
    },
}

/// The kernel's `isspace()` restricted to ASCII (see the module docs for 0xA0).
fn is_kernel_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// One kernel argument, stored as the raw text it was written with.
///
/// `key()` and `value()` are computed exactly as the kernel's `next_arg()`
/// computes `param` and `val` (quotes removed the way the kernel removes
/// them). Equality (`==`) compares the raw text; use [`Arg::matches_exactly`]
/// for the kernel's notion of "same argument".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arg {
    raw: String,
    key: (usize, usize),
    value: Option<(usize, usize)>,
}

impl Arg {
    /// Builds an `Arg` from one raw token (no validation) using the
    /// `next_arg()` rules for `param` and `val`.
    fn from_token(raw: &str) -> Arg {
        let b = raw.as_bytes();
        let quoted = b.first() == Some(&b'"');
        let off = usize::from(quoted);
        let body = &b[off..];
        let n = body.len();
        // `if (equals == 0) if (args[i] == '=') equals = i;` : an '=' at
        // index 0 leaves `equals` at 0, i.e. "not found yet".
        let equals = body.iter().enumerate().skip(1).find(|(_, c)| **c == b'=');
        let last_is_quote = n > 0 && body[n - 1] == b'"';
        match equals {
            None => {
                let end = if quoted && last_is_quote { n - 1 } else { n };
                Arg {
                    raw: raw.to_owned(),
                    key: (off, off + end),
                    value: None,
                }
            }
            Some((eq, _)) => {
                let mut vs = eq + 1;
                let mut ve = n;
                if body.get(vs) == Some(&b'"') {
                    vs += 1;
                    if last_is_quote {
                        ve = n - 1;
                    }
                }
                if quoted && last_is_quote {
                    ve = ve.min(n - 1);
                }
                // `a="` : the C string starts at the terminator, i.e. "".
                let ve = ve.max(vs);
                Arg {
                    raw: raw.to_owned(),
                    key: (off, off + eq),
                    value: Some((off + vs, off + ve)),
                }
            }
        }
    }

    /// Parses exactly one kernel argument, e.g. `quiet`, `isolcpus=2-7` or
    /// `dyndbg="file foo.c +p"`.
    ///
    /// The text is kept as written (no quoting is added or removed).
    ///
    /// # Errors
    /// * [`CmdlineError::Empty`] for `""`;
    /// * [`CmdlineError::ForbiddenChar`] for NUL, `\n`, `\r` (anywhere, even
    ///   inside quotes: they would break the line-based files that carry
    ///   command lines) and for characters whose UTF-8 encoding contains the
    ///   byte `0xA0`, which the kernel treats as whitespace;
    /// * [`CmdlineError::UnquotedWhitespace`] when the kernel would split the
    ///   text into several arguments (including leading/trailing whitespace);
    /// * [`CmdlineError::UnbalancedQuote`] for an odd number of `"`;
    /// * [`CmdlineError::InitSeparator`] for `--` (or `"--"`).
    pub fn parse_one(s: &str) -> Result<Arg, CmdlineError> {
        if s.is_empty() {
            return Err(CmdlineError::Empty);
        }
        for ch in s.chars() {
            let why = match ch {
                '\0' => Some("the kernel stops reading at NUL"),
                '\n' | '\r' => Some("line breaks corrupt the boot loader files"),
                c if !c.is_ascii() && {
                    let mut buf = [0u8; 4];
                    c.encode_utf8(&mut buf).bytes().any(|b| b == 0xa0)
                } =>
                {
                    Some(
                        "its UTF-8 encoding contains byte 0xA0, which the kernel treats as a space",
                    )
                }
                _ => None,
            };
            if let Some(why) = why {
                return Err(CmdlineError::ForbiddenChar {
                    arg: s.to_owned(),
                    ch,
                    why,
                });
            }
        }
        let mut in_quote = false;
        for &b in s.as_bytes() {
            if is_kernel_space(b) && !in_quote {
                return Err(CmdlineError::UnquotedWhitespace { arg: s.to_owned() });
            }
            if b == b'"' {
                in_quote = !in_quote;
            }
        }
        if in_quote {
            return Err(CmdlineError::UnbalancedQuote { arg: s.to_owned() });
        }
        let arg = Arg::from_token(s);
        if arg.is_init_separator() {
            return Err(CmdlineError::InitSeparator { arg: s.to_owned() });
        }
        Ok(arg)
    }

    /// The key as the kernel sees it (`param` in `next_arg()`): the text before
    /// the first `=` (at index >= 1), with a leading `"` of the argument
    /// removed. For `"foo bar"` (no `=`) it is `foo bar`.
    pub fn key(&self) -> &str {
        self.raw.get(self.key.0..self.key.1).unwrap_or("")
    }

    /// The value as the kernel sees it (`val` in `next_arg()`), unquoted:
    /// `None` for a bare flag like `quiet`, `Some("")` for `key=`,
    /// `Some("file foo.c +p")` for `dyndbg="file foo.c +p"`.
    pub fn value(&self) -> Option<&str> {
        self.value.and_then(|(s, e)| self.raw.get(s..e))
    }

    /// The raw text as written (what [`Cmdline::render`] emits).
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// True when both keys are equal with `-` and `_` treated as the same
    /// character, as the kernel's `parameq()` does.
    pub fn same_key(&self, o: &Arg) -> bool {
        let (a, b) = (self.key().as_bytes(), o.key().as_bytes());
        let norm = |c: u8| if c == b'-' { b'_' } else { c };
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| norm(*x) == norm(*y))
    }

    /// True when the keys are the same (see [`Arg::same_key`]) and the
    /// unquoted values are equal (`None` differs from `Some("")`), so
    /// `dyndbg="a"` matches `dyndbg=a` and `foo-bar=1` matches `foo_bar=1`.
    pub fn matches_exactly(&self, o: &Arg) -> bool {
        self.same_key(o) && self.value() == o.value()
    }

    /// True for the bare `--` argument: the kernel stops parsing there and
    /// hands everything after it to init.
    fn is_init_separator(&self) -> bool {
        self.key() == "--" && self.value().is_none()
    }
}

impl fmt::Display for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

/// A whole kernel command line: the arguments in order, duplicates kept
/// (the kernel passes every occurrence to its handler; for most parameters
/// the last one wins).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cmdline {
    args: Vec<Arg>,
}

impl Cmdline {
    /// Splits a command line exactly as the kernel's `parse_args()` loop over
    /// `next_arg()` does. Never fails: an unbalanced quote makes the rest of
    /// the line one argument (as in the kernel), text after a NUL is ignored
    /// (as in the kernel), and leading/trailing/repeated whitespace (such as
    /// the newline ending `/proc/cmdline`) is skipped. Use [`Cmdline::check`]
    /// before writing a parsed line somewhere.
    pub fn parse(s: &str) -> Cmdline {
        let args = arg_spans(s)
            .into_iter()
            .filter_map(|r| s.get(r).map(Arg::from_token))
            .collect();
        Cmdline { args }
    }

    /// Builds a command line from already validated arguments.
    pub fn from_args(args: Vec<Arg>) -> Cmdline {
        Cmdline { args }
    }

    /// The arguments in order.
    pub fn args(&self) -> &[Arg] {
        &self.args
    }

    /// True when there are no arguments.
    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }

    /// The raw arguments joined by single spaces, no leading or trailing
    /// space (GRUB and systemd-boot also join words with single spaces).
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (i, a) in self.args.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(a.as_str());
        }
        out
    }

    /// Validates every argument with the rules of [`Arg::parse_one`], except
    /// that a bare `--` (the kernel/init separator) is allowed.
    ///
    /// # Errors
    /// The first argument's [`CmdlineError`]; in practice only the last
    /// argument of a parsed line can fail (unbalanced quote, NUL/newline
    /// inside quotes, 0xA0 bytes).
    pub fn check(&self) -> Result<(), CmdlineError> {
        self.args
            .iter()
            .try_for_each(|a| match Arg::parse_one(a.as_str()) {
                Ok(_) | Err(CmdlineError::InitSeparator { .. }) => Ok(()),
                Err(e) => Err(e),
            })
    }

    /// True when some argument [`Arg::matches_exactly`] `a`.
    pub fn contains_exact(&self, a: &Arg) -> bool {
        self.args.iter().any(|x| x.matches_exactly(a))
    }

    /// Returns an edited copy: for each arg in `remove`, drops ONE occurrence
    /// (the last) that [`Arg::matches_exactly`] it (nothing if absent); then
    /// appends `append` in order.
    ///
    /// A bare `--` ends the kernel's own parameters (`parse_args()` hands the
    /// rest to init), so when one is present removal only looks before it and
    /// appended arguments are inserted just before it; init's arguments are
    /// never touched. Removing then re-appending the same args is idempotent
    /// (`c.apply(x, x).apply(x, x) == c.apply(x, x)`), and
    /// `c.apply(&[], x).apply(x, &[]) == c`.
    pub fn apply(&self, remove: &[Arg], append: &[Arg]) -> Cmdline {
        let mut args = self.args.clone();
        let kernel_end = |args: &[Arg]| {
            args.iter()
                .position(Arg::is_init_separator)
                .unwrap_or(args.len())
        };
        for r in remove {
            let end = kernel_end(&args);
            if let Some(pos) = args[..end].iter().rposition(|a| a.matches_exactly(r)) {
                args.remove(pos);
            }
        }
        let at = kernel_end(&args);
        args.splice(at..at, append.iter().cloned());
        Cmdline { args }
    }

    /// A copy without the arguments that boot loaders inject and no
    /// configuration file contains: `BOOT_IMAGE=` (GRUB) and `initrd=`
    /// (systemd-boot, one per initrd line of the entry). Use it to compare
    /// `/proc/cmdline` with configured options.
    pub fn without_bootloader_injected(&self) -> Cmdline {
        Cmdline {
            args: self
                .args
                .iter()
                .filter(|a| !matches!(a.key(), "BOOT_IMAGE" | "initrd"))
                .cloned()
                .collect(),
        }
    }
}

/// The byte ranges of the arguments of `s`, split exactly as [`Cmdline::parse`] splits
/// (runs of kernel whitespace outside double quotes; nothing after a NUL). Token
/// boundaries are ASCII bytes, so every range lies on char boundaries.
pub fn arg_spans(s: &str) -> Vec<Range<usize>> {
    let s = match s.find('\0') {
        Some(i) => &s[..i],
        None => s,
    };
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if is_kernel_space(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        let mut in_quote = false;
        while i < b.len() {
            if is_kernel_space(b[i]) && !in_quote {
                break;
            }
            if b[i] == b'"' {
                in_quote = !in_quote;
            }
            i += 1;
        }
        out.push(start..i);
    }
    out
}

/// The decoded range that removing the last exact occurrence of `r` (before a bare `--`)
/// deletes: the argument and the whitespace run before it, or after it when it is the
/// first argument, so that text the agent appended goes without a trace.
fn removal_range(s: &str, r: &Arg) -> Option<Range<usize>> {
    let spans = arg_spans(s);
    let args: Vec<Arg> = spans
        .iter()
        .map(|x| Arg::from_token(&s[x.clone()]))
        .collect();
    let end = args
        .iter()
        .position(Arg::is_init_separator)
        .unwrap_or(args.len());
    let i = args[..end].iter().rposition(|a| a.matches_exactly(r))?;
    Some(if i > 0 {
        spans[i - 1].end..spans[i].end
    } else if i + 1 < spans.len() {
        spans[i].start..spans[i + 1].start
    } else {
        spans[i].clone()
    })
}

/// Where appending `args` goes and the text inserted there: one space and the arguments
/// after the last kernel argument (before a bare `--`), the arguments and one space before
/// a leading `--`, the bare arguments into a line without any.
fn append_point(s: &str, args: &[Arg]) -> Option<(usize, String)> {
    if args.is_empty() {
        return None;
    }
    let joined = Cmdline::from_args(args.to_vec()).render();
    let spans = arg_spans(s);
    let end = spans
        .iter()
        .position(|x| Arg::from_token(&s[x.clone()]).is_init_separator())
        .unwrap_or(spans.len());
    Some(if end > 0 {
        (spans[end - 1].end, format!(" {joined}"))
    } else if let Some(first) = spans.first() {
        (first.start, format!("{joined} "))
    } else {
        (0, joined)
    })
}

/// Applies [`Cmdline::apply`]`(remove, append)` to a value in place: each removal deletes
/// one argument and the whitespace next to it ([`removal_range`]), the appended arguments
/// are inserted after the last kernel argument; every other byte of the value (spacing,
/// quotes, continuation lines of the file that holds it) stays. Appending then removing
/// the same arguments gives back the original bytes.
///
/// # Errors
/// Those of [`InPlace::splice`].
pub fn edit_in_place<T: InPlace>(
    t: &mut T,
    remove: &[Arg],
    append: &[Arg],
) -> Result<(), T::Error> {
    for r in remove {
        if let Some(range) = removal_range(&t.decoded(), r) {
            t.splice(range, "")?;
        }
    }
    if let Some((at, text)) = append_point(&t.decoded(), append) {
        t.splice(at..at, &text)?;
    }
    Ok(())
}

/// The UTF-8 byte-order mark (bytes EF BB BF) as text.
pub const UTF8_BOM: &str = "\u{feff}";

/// Why a plain command-line file's text (`/etc/kernel/cmdline`) can not be used as the
/// boot tools read it; None when it can.
///
/// A leading UTF-8 byte-order mark: systemd's kernel-install reads
/// `/etc/kernel/cmdline` and writes its text into the new boot entry's `options` line
/// (or a UKI's `.cmdline`) without looking for a BOM (neither the C kernel-install of
/// systemd 255+ nor 90-loaderentry.install before it strips one), and the kernel splits
/// arguments on ASCII whitespace only (`lib/cmdline.c`), so the three bytes become part
/// of the first argument (`\xEF\xBB\xBFroot=...`: an unknown parameter, and the
/// root file system is not found). Editing around the mark would keep a file that
/// breaks every kernel installed later; removing it silently would change a byte the
/// administrator wrote. The caller refuses, naming the file and the fix.
pub fn plain_file_problem(text: &str) -> Option<&'static str> {
    text.starts_with(UTF8_BOM).then_some(
        "starts with a UTF-8 byte-order mark (bytes EF BB BF): kernel-install copies its text into new boot entries as is, so the kernel would read the mark as part of its first argument",
    )
}

/// A plain command line held as is (`/etc/kernel/cmdline`, a test's string): decoded and
/// raw text are the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainText(pub String);

impl InPlace for PlainText {
    type Error = std::convert::Infallible;
    fn decoded(&self) -> String {
        self.0.clone()
    }
    fn splice(&mut self, range: Range<usize>, insert: &str) -> Result<(), Self::Error> {
        self.0.replace_range(range, insert);
        Ok(())
    }
}

impl fmt::Display for Cmdline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn a(s: &str) -> Arg {
        Arg::parse_one(s).unwrap()
    }

    #[test]
    fn kernel_key_value_rules() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            ("quiet", "quiet", None),
            ("a=b", "a", Some("b")),
            ("a=", "a", Some("")),
            ("a=b=c", "a", Some("b=c")),
            ("dyndbg=\"file foo.c +p\"", "dyndbg", Some("file foo.c +p")),
            ("\"foo bar\"", "foo bar", None),
            ("\"foo=bar baz\"", "foo", Some("bar baz")),
            ("\"foo\"=bar", "foo\"", Some("bar")),
            ("\"foo=\"bar", "foo", Some("bar")),
            ("foo=bar\"\"", "foo", Some("bar\"\"")),
            ("foo=\"in\"ner\"", "foo", Some("in\"ner")),
            ("=a=b", "=a", Some("b")),
            ("=a", "=a", None),
            ("\"\"", "", None),
            ("a=\"\"", "a", Some("")),
            ("k=\"a=b\"", "k", Some("a=b")),
        ];
        for (raw, k, v) in cases {
            let arg = Cmdline::parse(raw).args()[0].clone();
            assert_eq!(arg.key(), *k, "key of {raw}");
            assert_eq!(arg.value(), *v, "value of {raw}");
            assert_eq!(arg.as_str(), *raw);
        }
        // Unbalanced: only Cmdline::parse accepts them, like the kernel.
        let c = Cmdline::parse("a=\" b");
        assert_eq!(c.args().len(), 1);
        assert_eq!(c.args()[0].value(), Some(" b"));
        let c = Cmdline::parse("a=\"");
        assert_eq!(c.args()[0].value(), Some(""));
        // `foo=bar"` keeps its quote in the kernel (the crate drops it).
        let c = Cmdline::parse("x foo=bar\" y\"");
        assert_eq!(c.args()[1].value(), Some("bar\" y\""));
    }

    #[test]
    fn a_plain_file_with_a_bom_is_refused() {
        assert!(
            plain_file_problem("\u{feff}root=/dev/sda1 ro\n").is_some_and(
                |p| p.starts_with("starts with a UTF-8 byte-order mark (bytes EF BB BF)")
            )
        );
        assert_eq!(plain_file_problem("root=/dev/sda1 ro\n"), None);
        // a BOM further in is an ordinary (odd) character of an argument, not a mark
        assert_eq!(plain_file_problem("ro \u{feff}x\n"), None);
        assert_eq!(plain_file_problem(""), None);
        // what the kernel would make of it: the mark glued to the first argument
        let c = Cmdline::parse("\u{feff}root=/dev/sda1 ro");
        assert_eq!(c.args()[0].key(), "\u{feff}root");
    }

    #[test]
    fn splitting() {
        let c = Cmdline::parse("  a\tb\x0bc\x0cd\re\n \"x y\" k=\"1 2\"  \n");
        let raws: Vec<_> = c.args().iter().map(Arg::as_str).collect();
        assert_eq!(raws, ["a", "b", "c", "d", "e", "\"x y\"", "k=\"1 2\""]);
        assert_eq!(Cmdline::parse("a b\0c d").render(), "a b");
        assert!(Cmdline::parse(" \n").is_empty());
    }

    #[test]
    fn parse_one_errors() {
        assert_eq!(Arg::parse_one(""), Err(CmdlineError::Empty));
        assert!(matches!(
            Arg::parse_one("a b"),
            Err(CmdlineError::UnquotedWhitespace { .. })
        ));
        assert!(matches!(
            Arg::parse_one(" a"),
            Err(CmdlineError::UnquotedWhitespace { .. })
        ));
        assert!(matches!(
            Arg::parse_one("a=\"b"),
            Err(CmdlineError::UnbalancedQuote { .. })
        ));
        assert!(matches!(
            Arg::parse_one("a=\"b\nc\""),
            Err(CmdlineError::ForbiddenChar { ch: '\n', .. })
        ));
        assert!(matches!(
            Arg::parse_one("a\0"),
            Err(CmdlineError::ForbiddenChar { ch: '\0', .. })
        ));
        assert!(matches!(
            Arg::parse_one("a=\u{a0}"),
            Err(CmdlineError::ForbiddenChar { .. })
        ));
        let msg = Arg::parse_one("isolcpus=2-7 nohz_full=2-7")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("isolcpus=2-7 nohz_full=2-7") && msg.contains("separate"));
        assert!(matches!(
            Arg::parse_one("\"--\""),
            Err(CmdlineError::InitSeparator { .. })
        ));
        assert!(Cmdline::parse("a -- b").check().is_ok());
        assert!(Arg::parse_one("a=\"b c\"").is_ok());
        assert!(Arg::parse_one("a=é").is_ok());
    }

    #[test]
    fn key_equivalence() {
        assert!(a("nohz-full=1").same_key(&a("nohz_full=2")));
        assert!(a("nohz-full=1").matches_exactly(&a("nohz_full=1")));
        assert!(a("d=\"x\"").matches_exactly(&a("d=x")));
        assert!(!a("quiet").matches_exactly(&a("quiet=")));
        assert!(!a("a.b=1").same_key(&a("a_b=1")));
    }

    #[test]
    fn apply_removes_last_and_appends() {
        let c = Cmdline::parse("a=1 b a=1 c");
        let out = c.apply(&[a("a=1"), a("zz")], &[a("d"), a("a=1")]);
        assert_eq!(out.render(), "a=1 b c d a=1");
        let c = Cmdline::parse("root=/dev/sda ro -- single");
        assert_eq!(
            c.apply(&[], &[a("quiet")]).render(),
            "root=/dev/sda ro quiet -- single"
        );
    }

    #[test]
    fn dyndbg_survives_edit() {
        let c = Cmdline::parse("ro dyndbg=\"file foo.c +p\" quiet");
        let e = c.apply(&[a("quiet")], &[a("isolcpus=2-7")]);
        assert_eq!(e.render(), "ro dyndbg=\"file foo.c +p\" isolcpus=2-7");
        assert_eq!(e.args()[1].value(), Some("file foo.c +p"));
        assert_eq!(Cmdline::parse(&e.render()), e);
    }

    #[test]
    fn proc_cmdline_fixtures() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/nodes");
        let cases = [
            (
                "ubuntu-2404-grub",
                "BOOT_IMAGE",
                "root=UUID=9074757c-80e3-4fbb-85eb-30ac5d8144a1 ro intel_iommu=on iommu=pt \
                 console=tty1 console=ttyS0 default_hugepagesz=1G hugepagesz=1G hugepages=16",
            ),
            (
                "fedora-41-bls",
                "BOOT_IMAGE",
                "root=UUID=88be9724-6475-4e38-ba1d-43420e7b7574 ro rootflags=subvol=root \
                 no_timer_check console=tty1 console=ttyS0,115200n8 systemd.firstboot=off \
                 transparent_hugepage=madvise",
            ),
            (
                "rhel8-grubenv",
                "BOOT_IMAGE",
                "root=/dev/mapper/rhel-root ro crashkernel=auto rd.lvm.lv=rhel/root rhgb quiet \
                 systemd.unified_cgroup_hierarchy=1",
            ),
            (
                "systemd-boot",
                "initrd",
                "root=UUID=1065c5b0-0d3d-4b2c-b710-081db0e60316 ro quiet console=tty0 \
                 console=ttyS1,115200n8 intel_iommu=on iommu=pt hugepagesz=2M hugepages=4096 \
                 systemd.machine_id=382841d297f903a743992847508b8eae",
            ),
        ];
        for (node, injected, expected) in cases {
            let text = std::fs::read_to_string(format!("{root}/{node}/proc/cmdline")).unwrap();
            let c = Cmdline::parse(&text);
            assert!(c.check().is_ok(), "{node}");
            assert_eq!(c.args()[0].key(), injected, "{node}");
            assert_eq!(c.render(), text.trim_end(), "{node}");
            let clean = c.without_bootloader_injected();
            assert_eq!(clean.render(), expected, "{node}");
            assert_eq!(clean.args().len() + 1, c.args().len(), "{node}");
        }
        // BOOT_IMAGE carries the GRUB device on Fedora; the value is kept raw.
        let f = Cmdline::parse(
            &std::fs::read_to_string(format!("{root}/fedora-41-bls/proc/cmdline")).unwrap(),
        );
        assert_eq!(
            f.args()[0].value(),
            Some("(hd0,gpt3)/vmlinuz-6.15.9-201.fc41.x86_64")
        );
    }

    fn arb_part() -> impl Strategy<Value = String> {
        prop_oneof![9 => arb_arg(), 1 => Just("--".to_owned())]
    }

    fn arb_arg() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z_.][a-z_.-]{0,7}",
            "[a-z_-]{1,6}=[a-zA-Z0-9,./=-]{0,8}",
            "[a-z_-]{1,6}=\"[a-z ,=+]{0,8}\"",
            "\"[a-z ]{1,8}\"",
            "\"[a-z]{1,4}=[a-z ]{0,6}\"",
        ]
    }

    proptest! {
        #[test]
        fn render_parse_roundtrip(parts in proptest::collection::vec(arb_part(), 0..8),
                                  seps in proptest::collection::vec("[ \t\n]{1,3}", 8)) {
            let mut text = String::new();
            for (i, p) in parts.iter().enumerate() {
                text.push_str(&seps[i]);
                text.push_str(p);
            }
            let c = Cmdline::parse(&text);
            prop_assert_eq!(c.args().len(), parts.len());
            let r = c.render();
            prop_assert_eq!(Cmdline::parse(&r).render(), r.clone());
            prop_assert_eq!(Cmdline::parse(&r), c.clone());
            for (arg, p) in c.args().iter().zip(&parts) {
                let single = Cmdline::parse(p);
                prop_assert_eq!(&single.args()[0], arg);
                if p != "--" {
                    prop_assert_eq!(&Arg::parse_one(p).unwrap(), arg);
                }
            }
        }

        #[test]
        fn edits_idempotent(parts in proptest::collection::vec(arb_part(), 0..8),
                            extra in proptest::collection::vec(arb_arg(), 0..4)) {
            let c = Cmdline::parse(&parts.join(" "));
            let x: Vec<Arg> = extra.iter().map(|s| Arg::parse_one(s).unwrap()).collect();
            let once = c.apply(&x, &x);
            prop_assert_eq!(once.apply(&x, &x), once.clone());
            prop_assert_eq!(c.apply(&[], &x).apply(&x, &[]), c.clone());
            prop_assert_eq!(Cmdline::parse(&once.render()), once);
        }

        #[test]
        fn never_panics(s in "\\PC{0,40}", t in proptest::collection::vec(any::<char>(), 0..20)) {
            let t: String = t.into_iter().collect();
            for input in [&s, &t] {
                let c = Cmdline::parse(input);
                let _ = c.check();
                let _ = Cmdline::parse(&c.render());
                for x in c.args() { let _ = (x.key(), x.value()); }
                let _ = Arg::parse_one(input);
            }
        }
    }
}
