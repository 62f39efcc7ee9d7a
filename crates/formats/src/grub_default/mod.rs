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

use std::ops::Range;

use crate::cmdline::{Arg, Cmdline};
use crate::textedit::{Decoded, InPlace, shell_encode};

mod events;
mod lexer;

use events::{Event, events};

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
    /// The fragment starts with a UTF-8 byte-order mark, which `sh` does not skip: it
    /// reads the first line as a command, so the edit would not do what it says.
    #[error(
        "line 1 starts with a UTF-8 byte-order mark (EF BB BF), which /bin/sh does not skip: \
         it reads that line as a command, so {what}; remove the byte-order mark"
    )]
    ByteOrderMark {
        /// What the mark does to this edit.
        what: String,
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

/// The last event touching `var`, checked for evaluability.
enum Last {
    Absent,
    Value {
        start: usize,
        end: usize,
        value: Decoded,
    },
}

fn last_state(frag: &str, var: &str) -> Result<Last, GrubError> {
    last_state_of(frag, events(frag).as_deref(), var)
}

/// [`last_state`] with the fragment's events `ev` ([`events`] of `frag`) at hand.
fn last_state_of(
    frag: &str,
    ev: Result<&[Event], &GrubError>,
    var: &str,
) -> Result<Last, GrubError> {
    if !is_name(var) {
        return Err(GrubError::InvalidName(var.to_owned()));
    }
    let bom = frag.strip_prefix(BOM);
    if let Some(rest) = bom {
        bom_first_line(rest)?;
    }
    let ev = match ev {
        Err(GrubError::Syntax { line: 1, what }) if bom.is_some() => {
            return Err(GrubError::ByteOrderMark {
                what: format!(
                    "its text is not a comment or an assignment and the file does not parse ({what})"
                ),
            });
        }
        r => r.map_err(Clone::clone)?,
    };
    let Some(e) = ev.iter().rev().find(|e| e.name() == var) else {
        if let Some(rest) = bom
            && rest.starts_with(&format!("{var}="))
        {
            return Err(GrubError::ByteOrderMark {
                what: format!("its {var}= is not an assignment and {var} stays unset"),
            });
        }
        return Ok(Last::Absent);
    };
    match e {
        Event::Unset { context: None, .. } => Ok(Last::Absent),
        Event::Unset {
            line,
            context: Some(how),
            ..
        } => Err(GrubError::Unevaluable {
            line: *line,
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
            let (start, end, line) = (*start, *end, *line);
            let text = frag[start..end].to_owned();
            match (context, value) {
                (Some(how), _) | (None, Err(how)) => Err(GrubError::Unevaluable {
                    line,
                    var: var.to_owned(),
                    how,
                    text,
                }),
                (None, Ok(value)) => Ok(Last::Value {
                    start,
                    end,
                    value: value.clone(),
                }),
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
    let lexed: Vec<(&str, Fragment)> = fragments
        .iter()
        .map(|(p, t)| (p.as_str(), Fragment::new(t.clone())))
        .collect();
    Fragment::value_after(lexed.iter().map(|(p, f)| (*p, f)), var)
}

/// A fragment's text lexed once, for the answers that would each lex it again
/// ([`assigns`], [`read_var`], [`value_after`]; [`Fragment::assigns`],
/// [`Fragment::read_var`], [`Fragment::value_after`] answer the same). A pure function
/// of the text: the agent keeps it while the file stays the same (issue 28).
#[derive(Debug)]
pub struct Fragment {
    text: String,
    events: Result<Vec<Event>, GrubError>,
}

impl Fragment {
    /// Lexes `text`.
    pub fn new(text: String) -> Fragment {
        let events = events(&text);
        Fragment { text, events }
    }

    /// The text lexed.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// [`assigns`] of the text.
    pub fn assigns(&self, var: &str) -> bool {
        match &self.events {
            Ok(ev) => assigns_in(ev, var),
            Err(_) => assigns(&self.text, var),
        }
    }

    /// [`read_var`] of the text.
    ///
    /// # Errors
    /// Those of [`read_var`].
    pub fn read_var(&self, var: &str) -> Result<Option<String>, GrubError> {
        Ok(
            match last_state_of(&self.text, self.events.as_deref(), var)? {
                Last::Absent => None,
                Last::Value { value, .. } => Some(value.text().to_owned()),
            },
        )
    }

    /// [`value_after`] of (path, fragment) pairs in the order they are sourced.
    ///
    /// # Errors
    /// Those of [`value_after`].
    pub fn value_after<'a>(
        fragments: impl IntoIterator<Item = (&'a str, &'a Fragment)>,
        var: &str,
    ) -> Result<Option<String>, String> {
        let mut cur: Option<String> = None;
        for (path, frag) in fragments {
            if !frag.assigns(var) {
                continue;
            }
            cur = match frag.read_var(var) {
                Ok(v) => v,
                Err(GrubError::Unevaluable {
                    text: raw, line, ..
                }) => Some(
                    self_append(&raw, var, cur.as_deref().unwrap_or("")).ok_or_else(|| {
                        format!("{path}: line {line}: {var} can not be evaluated")
                    })?,
                ),
                Err(e) => return Err(format!("{path}: {e}")),
            };
        }
        Ok(cur)
    }
}

/// True if the events `ev` assign `var` ([`assigns`] of a fragment that lexes).
fn assigns_in(ev: &[Event], var: &str) -> bool {
    ev.iter()
        .any(|e| matches!(e, Event::Assign { name, .. } if name == var))
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
        Last::Value { value, .. } => Some(value.text().to_owned()),
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
/// fragment does not assign `var`, `VAR="value"\n` is appended after the
/// [`crate::textedit::OWNED_LINE`] marker that lets a revert take it away again.
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
        Last::Absent => crate::textedit::append_owned_line(fragment, &new),
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

/// Refuses a byte-order mark glued to a first line that sh would then read as something
/// that matters: sh runs `\u{feff}# text` as a command, which only fails with "not found"
/// when the text has no shell syntax; with `(`, `;`, a quote and the like it may be a
/// syntax error that stops grub-mkconfig, or run something.
fn bom_first_line(rest: &str) -> Result<(), GrubError> {
    let line = rest.lines().next().unwrap_or("");
    let special = |c: char| "()<>;&|'\"`$\\{}".contains(c);
    if line.starts_with('#') && !line.contains(special) {
        return Ok(());
    }
    Err(GrubError::ByteOrderMark {
        what: format!(
            "{:?} is run as a command{}",
            line.chars().take(40).collect::<String>(),
            if line.contains(special) {
                " and its shell syntax may stop grub-mkconfig"
            } else {
                ""
            }
        ),
    })
}

/// The UTF-8 byte-order mark.
const BOM: &str = "\u{feff}";

/// The last assignment of a variable in a fragment, edited in place ([`InPlace`]): a
/// splice changes only the raw bytes of the characters it touches, and inserted text is
/// written in the quoting of the character before it ([`shell_encode`]): inside `"..."`
/// with `"`, `$`, `` ` ``, `\` escaped, inside `'...'` with `'` written `'"'"'`,
/// unquoted with a backslash before every special character (`\ ` for a space).
#[derive(Debug, Clone)]
pub struct VarInPlace {
    /// The fragment as edited so far.
    pub text: String,
    var: String,
}

impl VarInPlace {
    /// The last assignment of `var` in `fragment`; `Ok(None)` when it is not assigned.
    ///
    /// # Errors
    /// Those of [`read_var`].
    pub fn new(fragment: &str, var: &str) -> Result<Option<VarInPlace>, GrubError> {
        Ok(match last_state(fragment, var)? {
            Last::Absent => None,
            Last::Value { .. } => Some(VarInPlace {
                text: fragment.to_owned(),
                var: var.to_owned(),
            }),
        })
    }
}

impl InPlace for VarInPlace {
    type Error = GrubError;
    fn decoded(&self) -> String {
        match last_state(&self.text, &self.var) {
            Ok(Last::Value { value, .. }) => value.text().to_owned(),
            _ => String::new(),
        }
    }
    fn splice(&mut self, range: Range<usize>, insert: &str) -> Result<(), GrubError> {
        if let Last::Value { value, .. } = last_state(&self.text, &self.var)? {
            self.text = value.splice(&self.text, range, insert, shell_encode);
        }
        Ok(())
    }
}

/// Returns the fragment with the kernel command line in `var` edited as
/// [`Cmdline::apply`]`(remove, append)` does, in place ([`crate::cmdline::edit_in_place`]
/// over [`VarInPlace`]): quotes, escapes, continuation lines, spacing, comments and every
/// other byte stay; appending then removing the same arguments gives back the original
/// bytes. When `var` is not assigned, `VAR="<args>"` is appended as [`set_var`] does.
///
/// # Errors
/// Those of [`set_var`].
pub fn edit_cmdline_var(
    fragment: &str,
    var: &str,
    remove: &[Arg],
    append: &[Arg],
) -> Result<String, GrubError> {
    let old = Cmdline::parse(&read_var(fragment, var)?.unwrap_or_default());
    let want = old.apply(remove, append);
    if let Some(mut v) = VarInPlace::new(fragment, var)? {
        crate::cmdline::edit_in_place(&mut v, remove, append)?;
        if read_var(&v.text, var)?.map(|t| Cmdline::parse(&t)) == Some(want.clone()) {
            return Ok(crate::textedit::without_owned_empty(v.text, var));
        }
    }
    set_var(fragment, var, &want.render()).map(|t| crate::textedit::without_owned_empty(t, var))
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
        Ok(ev) => assigns_in(&ev, var),
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
    use super::events::{AFTER_COND, AS_PREFIX, IN_COMPOUND, IN_PIPELINE};
    use super::lexer::{BACKTICK, EXPANSION};
    use super::*;

    fn fixture(p: &str) -> String {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/nodes");
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
        use crate::textedit::{OWNED_LINE, OWNED_LINE_AFTER_BREAK};
        assert_eq!(
            set_var("X=1\nunset X", "X", "2").unwrap(),
            format!("X=1\nunset X\n{OWNED_LINE_AFTER_BREAK}\nX=\"2\"\n")
        );
        assert_eq!(
            set_var("", "X", "2").unwrap(),
            format!("{OWNED_LINE}\nX=\"2\"\n")
        );
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

        /// A [`Fragment`] answers as [`assigns`] and [`read_var`] answer on its text
        /// (lexed once, against once per question): shell-like noise, with and without
        /// a byte-order mark, and a variable name that is not one.
        #[test]
        fn fragment_answers_as_the_functions(
            s in "(X=|Y=|export |unset X|\\$X|\"|'|`|\\\\|#|;|&&|\\||\\(|\\)|if |fi|\n| |a|b)*",
            bom in proptest::bool::ANY,
        ) {
            let s = if bom { format!("{BOM}{s}") } else { s };
            let f = Fragment::new(s.clone());
            proptest::prop_assert_eq!(f.text(), s.as_str());
            for var in ["X", "Y", "Z", "1X"] {
                proptest::prop_assert_eq!(f.assigns(var), assigns(&s, var));
                proptest::prop_assert_eq!(f.read_var(var), read_var(&s, var));
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
