//! Kubelet command-line flags kept in systemd `EnvironmentFile=`s.
//!
//! kubeadm writes `/var/lib/kubelet/kubeadm-flags.env` as one line
//! `KUBELET_KUBEADM_ARGS="--a=1 --b=x"` (Go `%q` quoting, flags sorted by name); packages ship
//! `/etc/default/kubelet` (Debian) or `/etc/sysconfig/kubelet` (RPM) with `KUBELET_EXTRA_ARGS=`,
//! which comes later on the kubelet's `ExecStart=` line and so wins for a repeated flag.
//!
//! systemd reads these files with its env-file parser (quotes, backslash escapes, `#`/`;`
//! comment lines); `$VAR` on `ExecStart=` is then split on whitespace into words with no further
//! quote processing. This module reproduces both steps ([`parse`]; the env-file parser itself
//! is `crate::envfile`) and rewrites one assignment while keeping every other byte of the
//! file ([`edit`]). It does no I/O.

/// One kubelet flag as written in an environment file.
///
/// `--max-pods=110` is `Flag { name: "max-pods", value: Some("110") }`; a bare `--flag` has
/// `value: None`. `name` carries no leading dashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flag {
    /// Flag name without its leading dashes, e.g. `max-pods`.
    pub name: String,
    /// The text after the first `=`, or `None` for a bare `--flag`.
    pub value: Option<String>,
}

/// Errors from reading or editing kubelet flags in an environment file.
#[derive(Debug, thiserror::Error)]
pub enum FlagsError {
    /// The variable name is not a valid environment variable name.
    #[error(
        "`{var}` is not a valid environment variable name; use letters, digits and `_`, not starting with a digit (e.g. KUBELET_EXTRA_ARGS)"
    )]
    InvalidVariable {
        /// The rejected name.
        var: String,
    },
    /// A flag name is not of the form `[a-z0-9][a-z0-9-]*`.
    #[error(
        "`{name}` is not a valid kubelet flag name; give the name without leading dashes, lower-case letters, digits and `-` only (e.g. max-pods)"
    )]
    InvalidName {
        /// The rejected name.
        name: String,
    },
    /// A flag value would not survive systemd's word splitting.
    #[error(
        "value of kubelet flag --{name} contains {what}; systemd splits $VAR on ExecStart= at whitespace and env files cannot carry control characters, so the kubelet would get a broken argument; remove it (use commas where the flag takes a list)"
    )]
    InvalidValue {
        /// The flag name.
        name: String,
        /// Description of the offending character.
        what: String,
    },
    /// The assignment's value opens a quote that is never closed.
    #[error(
        "the assignment of {var} opens a quote that is never closed; systemd would swallow the rest of the file into it, close the quote"
    )]
    UnterminatedQuote {
        /// The variable.
        var: String,
    },
    /// A word in the variable is not a `--flag`.
    #[error(
        "{var} contains the word `{word}`, which is not a --flag; the kubelet rejects positional arguments (\"unknown command\"), write it as --name=value"
    )]
    NotAFlag {
        /// The variable.
        var: String,
        /// The offending word.
        word: String,
    },
    /// The rewritten file would not read back as intended (e.g. it ends inside a quote or
    /// with a line-continuation backslash, so an appended line would be swallowed).
    #[error(
        "cannot write {var} safely: the file ends in an unfinished line (an open quote or a trailing backslash) or another assignment would change; fix the file by hand first"
    )]
    UnsafeFile {
        /// The variable.
        var: String,
    },
    /// The file starts with a UTF-8 byte-order mark glued to the assignment of `var`:
    /// systemd does not skip the mark, reads the key as `\u{feff}VAR`, not a valid
    /// variable name, and ignores the assignment.
    #[error(
        "the file starts with a UTF-8 byte-order mark (EF BB BF) right before {var}=, which systemd's EnvironmentFile= parser does not skip: it reads the key as a different, invalid name and ignores the assignment, so the kubelet gets none of these flags; remove the byte-order mark"
    )]
    ByteOrderMark {
        /// The variable.
        var: String,
    },
    /// The same flag is both set and removed in one edit.
    #[error("flag --{name} is both set and removed in the same edit; list it in only one of them")]
    Conflict {
        /// The flag name.
        name: String,
    },
}

use crate::envfile::{Assignment, WHITESPACE, scan};

mod in_place;

use in_place::{FlagsInPlace, edit_in_place};

fn check_var(var: &str) -> Result<(), FlagsError> {
    let ok = var
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(FlagsError::InvalidVariable { var: var.into() })
    }
}

/// The last assignment of `var` (systemd: a later assignment overrides an earlier one).
fn last_assignment<'a>(list: &'a [Assignment], var: &str) -> Option<&'a Assignment> {
    list.iter().rev().find(|a| a.key == var)
}

fn parse_word(var: &str, word: &str) -> Result<Flag, FlagsError> {
    let not_a_flag = || FlagsError::NotAFlag {
        var: var.into(),
        word: word.into(),
    };
    let body = word
        .strip_prefix("--")
        .or_else(|| word.strip_prefix('-'))
        .ok_or_else(not_a_flag)?;
    let (name, value) = match body.split_once('=') {
        Some((n, v)) => (n, Some(v.to_string())),
        None => (body, None),
    };
    if name.is_empty() || name.starts_with('-') {
        return Err(not_a_flag());
    }
    Ok(Flag {
        name: name.into(),
        value,
    })
}

fn words_of(value: &str) -> Vec<&str> {
    value.split(WHITESPACE).filter(|w| !w.is_empty()).collect()
}

/// Parse the kubelet flags held by `var` in an environment file.
///
/// The file is read as systemd reads an `EnvironmentFile=`: `#`/`;` comment lines, `KEY=value`
/// with leading/trailing whitespace trimmed, single quotes (literal), double quotes (with `\"`,
/// `\\`, `` \` ``, `\$` escapes; other backslashes kept), backslash escapes and line
/// continuations outside quotes, and the last assignment of a key wins. The value is then split
/// as `$VAR` on `ExecStart=` is: on whitespace, with no further quote processing, so
/// `--eviction-hard=memory.available<500Mi,nodefs.available<10%` stays one flag. Each word must
/// be `--name[=value]` (a single dash is accepted as pflag does); the value is everything after
/// the first `=`. Repeated flags are all returned in order (for pflag the last one wins).
///
/// Returns `Ok(None)` when `var` is not assigned in the file, `Ok(Some(vec![]))` for `VAR=`.
///
/// # Errors
/// [`FlagsError::InvalidVariable`] for a bad `var`, [`FlagsError::UnterminatedQuote`] if the
/// assignment never closes its quote, [`FlagsError::NotAFlag`] for a word that is not a flag,
/// [`FlagsError::ByteOrderMark`] when the only assignment of `var` has a byte-order mark glued
/// to its key (systemd ignores it; a mark before anything else is kept and harmless).
pub fn parse(text: &str, var: &str) -> Result<Option<Vec<Flag>>, FlagsError> {
    check_var(var)?;
    let list = scan(text);
    let Some(a) = last_assignment(&list, var) else {
        if list
            .first()
            .is_some_and(|a| a.key.strip_prefix('\u{feff}') == Some(var))
        {
            return Err(FlagsError::ByteOrderMark { var: var.into() });
        }
        return Ok(None);
    };
    if a.unterminated {
        return Err(FlagsError::UnterminatedQuote { var: var.into() });
    }
    words_of(a.value.text())
        .into_iter()
        .map(|w| parse_word(var, w))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn check_name(name: &str) -> Result<(), FlagsError> {
    let ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(FlagsError::InvalidName { name: name.into() })
    }
}

/// Check that a flag can be written to an environment file and reach the kubelet intact.
///
/// The name must match `[a-z0-9][a-z0-9-]*` (given without leading dashes, as kubelet flags are
/// spelled). The value may hold anything except whitespace (systemd splits `$VAR` on
/// `ExecStart=` into words at whitespace, so `--a=x y` would reach the kubelet as `--a=x` and a
/// stray `y`, which it rejects), control characters (including newline and NUL, which an
/// environment file cannot carry) and other Unicode white space. `<`, `%`, `,`, `"`, `\`, `$`
/// are fine: [`edit`] escapes `"` and `\`, and systemd does not expand `$` from env files.
///
/// # Errors
/// [`FlagsError::InvalidName`] or [`FlagsError::InvalidValue`], naming the flag.
pub fn validate_flag(name: &str, value: &str) -> Result<(), FlagsError> {
    check_name(name)?;
    if let Some(c) = value.chars().find(|c| c.is_whitespace() || c.is_control()) {
        let what = match c {
            ' ' => "a space".to_string(),
            '\t' => "a tab".to_string(),
            '\n' | '\r' => "a line break".to_string(),
            '\0' => "a NUL byte".to_string(),
            c => format!("the character U+{:04X}", c as u32),
        };
        return Err(FlagsError::InvalidValue {
            name: name.into(),
            what,
        });
    }
    Ok(())
}

fn quote_go(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn flag_name_of(word: &str) -> &str {
    let body = word.trim_start_matches('-');
    body.split_once('=').map_or(body, |(n, _)| n)
}

/// The words of the variable after the edit: removed flags dropped, a set flag
/// replacing its first occurrence (later ones dropped) or inserted in sorted place when
/// the flags are sorted (else appended).
fn edit_words(old_words: &[String], set: &[(String, String)], remove: &[String]) -> Vec<String> {
    let mut words = old_words.to_vec();
    words.retain(|w| !remove.iter().any(|r| r == flag_name_of(w)));
    for (n, v) in set {
        let new_word = format!("--{n}={v}");
        if let Some(first) = words.iter().position(|w| flag_name_of(w) == n) {
            words[first] = new_word;
            let mut i = 0;
            words.retain(|w| {
                let keep = i <= first || flag_name_of(w) != n;
                i += 1;
                keep
            });
        } else {
            let names: Vec<&str> = words.iter().map(|w| flag_name_of(w)).collect();
            let sorted = names.windows(2).all(|p| p[0] <= p[1]);
            let at = if sorted {
                names
                    .iter()
                    .position(|x| *x > n.as_str())
                    .unwrap_or(names.len())
            } else {
                names.len()
            };
            words.insert(at, new_word);
        }
    }
    words
}

/// `text` with `assignment` replaced by `rendered`, or `rendered` appended on a line of
/// its own when there is none.
fn splice_assignment(text: &str, assignment: Option<&Assignment>, rendered: &str) -> String {
    let mut out = String::with_capacity(text.len() + rendered.len() + 1);
    match assignment {
        Some(a) => {
            out.push_str(&text[..a.key_start]);
            out.push_str(rendered);
            out.push_str(&text[a.end..]);
        }
        None => return crate::textedit::append_owned_line(text, rendered),
    }
    out
}

/// Checks that `out` reads back as `words` and that no other assignment of `list` (the
/// text before) changed.
fn check_readback(
    var: &str,
    list: &[Assignment],
    out: &str,
    words: &[String],
) -> Result<(), FlagsError> {
    let others = |l: &[Assignment]| -> Vec<(String, String, bool)> {
        let last = l.iter().rposition(|a| a.key == var);
        l.iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != last)
            .map(|(_, a)| (a.key.clone(), a.value.text().to_owned(), a.unterminated))
            .collect()
    };
    let after = scan(out);
    let readback = last_assignment(&after, var)
        .filter(|a| !a.unterminated)
        .map(|a| {
            words_of(a.value.text())
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>()
        });
    if readback.as_deref() != Some(words) || others(list) != others(&after) {
        return Err(FlagsError::UnsafeFile { var: var.into() });
    }
    Ok(())
}

/// Rewrite the kubelet flags held by `var`, keeping every other byte of the file.
///
/// * A flag in `set` that already exists gets its new value in place (the first occurrence;
///   later duplicates are dropped so the new value is the one that counts).
/// * A flag in `remove` is dropped (every occurrence); removing an absent flag is a no-op.
/// * A new flag is inserted at its sorted position if the existing flags are sorted by name
///   (as kubeadm writes them), else appended.
/// * The edit is made in place: untouched words keep their bytes (quotes, escapes, `\`
///   continuation lines, spacing, bare `--flag`s, single-dash spellings), a removed flag goes
///   with the whitespace next to it, a changed flag's word is rewritten where it is, a new one
///   goes after the word before its place with one space. Written text takes the quoting of
///   the place it goes to (inside `"..."` with `"`, `\`, `` ` ``, `$` escaped; inside
///   `'...'` with `'` written `'"'"'`; unquoted with `\`, `'`, `"` escaped), so removing what
///   was added gives back the original bytes. Should the in-place result not read back as
///   intended, the assignment is re-rendered as `VAR="..."` (Go `%q`-compatible escaping), the
///   canonical style, in place of the last assignment (the rest of the file unchanged).
/// * If `var` is not assigned, a `VAR="..."` line is appended after the
///   [`crate::textedit::OWNED_LINE`] marker; when its last flag is removed again, the
///   marker and the line go, and the file has its original bytes.
/// * If the flag list does not change (or `var` is absent and nothing is set), the text is
///   returned unchanged.
///
/// # Errors
/// The errors of [`parse`] and [`validate_flag`] (for each `set` entry and `remove` name),
/// [`FlagsError::Conflict`] when a flag is both set and removed, and [`FlagsError::UnsafeFile`]
/// when the rewritten file would not read back as intended (the result is checked by re-parsing).
pub fn edit(
    text: &str,
    var: &str,
    set: &[(String, String)],
    remove: &[String],
) -> Result<String, FlagsError> {
    check_var(var)?;
    for (n, v) in set {
        validate_flag(n, v)?;
        if remove.contains(n) {
            return Err(FlagsError::Conflict { name: n.clone() });
        }
    }
    for n in remove {
        check_name(n)?;
    }
    // Validates the existing words too.
    let existing = parse(text, var)?;
    let list = scan(text);
    let assignment = last_assignment(&list, var);
    let old_words: Vec<String> = assignment
        .map(|a| {
            words_of(a.value.text())
                .into_iter()
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();

    let words = edit_words(&old_words, set, remove);
    if words == old_words && (existing.is_some() || words.is_empty()) {
        return Ok(text.to_string());
    }
    if assignment.is_some() {
        let mut v = FlagsInPlace {
            text: text.to_string(),
            var: var.to_string(),
        };
        edit_in_place(&mut v, set, remove);
        if check_readback(var, &list, &v.text, &words).is_ok() {
            return Ok(crate::textedit::without_owned_empty(v.text, var));
        }
    }
    let rendered = format!("{var}={}", quote_go(&words.join(" ")));
    let out = splice_assignment(text, assignment, &rendered);
    check_readback(var, &list, &out, &words)?;
    Ok(crate::textedit::without_owned_empty(out, var))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const UBUNTU: &str = include_str!(
        "../../../../../tests/fixtures/nodes/ubuntu-2404-grub/var/lib/kubelet/kubeadm-flags.env"
    );
    const FEDORA: &str = include_str!(
        "../../../../../tests/fixtures/nodes/fedora-41-bls/var/lib/kubelet/kubeadm-flags.env"
    );
    const RHEL: &str = include_str!(
        "../../../../../tests/fixtures/nodes/rhel8-grubenv/var/lib/kubelet/kubeadm-flags.env"
    );
    const SDBOOT: &str = include_str!(
        "../../../../../tests/fixtures/nodes/systemd-boot/var/lib/kubelet/kubeadm-flags.env"
    );
    const KUBEADM: &str = "KUBELET_KUBEADM_ARGS";
    const EXTRA: &str = "KUBELET_EXTRA_ARGS";

    fn f(name: &str, value: &str) -> Flag {
        Flag {
            name: name.into(),
            value: Some(value.into()),
        }
    }

    fn s(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn fixtures_parse() {
        assert_eq!(
            parse(UBUNTU, KUBEADM).unwrap().unwrap(),
            vec![
                f("max-pods", "110"),
                f(
                    "node-labels",
                    "metal3.io/uuid=7a710f31-7879-4f17-bf4d-646881d6af6a"
                ),
                f("pod-infra-container-image", "registry.k8s.io/pause:3.10.1"),
                f("provider-id", "metal3://site-a/host-03/edge-1-cp-7xk2p"),
            ]
        );
        assert_eq!(
            parse(FEDORA, KUBEADM).unwrap().unwrap(),
            vec![
                f(
                    "eviction-hard",
                    "memory.available<500Mi,nodefs.available<10%"
                ),
                f("node-labels", "node.example.invalid/pool=vm-general"),
                f("pod-infra-container-image", "registry.k8s.io/pause:3.10.1"),
            ]
        );
        let rhel = parse(RHEL, KUBEADM).unwrap().unwrap();
        assert_eq!(
            rhel[0],
            f(
                "container-runtime-endpoint",
                "unix:///var/run/containerd/containerd.sock"
            )
        );
        assert_eq!(rhel.len(), 4);
        let sd = parse(SDBOOT, KUBEADM).unwrap().unwrap();
        assert_eq!(sd[0], f("cpu-manager-policy", "static"));
        assert_eq!(sd[5], f("reserved-cpus", "0-1"));
        assert_eq!(parse(UBUNTU, EXTRA).unwrap(), None);
        for t in [
            include_str!(
                "../../../../../tests/fixtures/nodes/ubuntu-2404-grub/etc/default/kubelet"
            ),
            include_str!("../../../../../tests/fixtures/nodes/systemd-boot/etc/default/kubelet"),
            include_str!("../../../../../tests/fixtures/nodes/fedora-41-bls/etc/sysconfig/kubelet"),
        ] {
            assert_eq!(parse(t, EXTRA).unwrap(), Some(vec![]));
        }
        assert_eq!(
            parse(
                include_str!(
                    "../../../../../tests/fixtures/nodes/rhel8-grubenv/etc/sysconfig/kubelet"
                ),
                EXTRA
            )
            .unwrap(),
            Some(vec![f("node-ip", "192.0.2.21")])
        );
    }

    #[test]
    fn edit_max_pods_in_place() {
        let out = edit(UBUNTU, KUBEADM, &s(&[("max-pods", "250")]), &[]).unwrap();
        assert_eq!(out, UBUNTU.replacen("--max-pods=110", "--max-pods=250", 1));
        // No-op edits keep the bytes.
        assert_eq!(
            edit(UBUNTU, KUBEADM, &s(&[("max-pods", "110")]), &[]).unwrap(),
            UBUNTU
        );
        assert_eq!(
            edit(UBUNTU, KUBEADM, &[], &["absent".into()]).unwrap(),
            UBUNTU
        );
    }

    #[test]
    fn insert_sorted_and_keep_eviction_hard() {
        let out = edit(
            UBUNTU,
            KUBEADM,
            &s(&[("serialize-image-pulls", "false")]),
            &[],
        )
        .unwrap();
        assert_eq!(
            out,
            "KUBELET_KUBEADM_ARGS=\"--max-pods=110 --node-labels=metal3.io/uuid=7a710f31-7879-4f17-bf4d-646881d6af6a --pod-infra-container-image=registry.k8s.io/pause:3.10.1 --provider-id=metal3://site-a/host-03/edge-1-cp-7xk2p --serialize-image-pulls=false\"\n"
        );
        let out = edit(UBUNTU, KUBEADM, &s(&[("cgroup-root", "/x")]), &[]).unwrap();
        assert!(out.starts_with("KUBELET_KUBEADM_ARGS=\"--cgroup-root=/x --max-pods=110 "));
        let out = edit(FEDORA, KUBEADM, &s(&[("max-pods", "200")]), &[]).unwrap();
        assert_eq!(
            out,
            "KUBELET_KUBEADM_ARGS=\"--eviction-hard=memory.available<500Mi,nodefs.available<10% --max-pods=200 --node-labels=node.example.invalid/pool=vm-general --pod-infra-container-image=registry.k8s.io/pause:3.10.1\"\n"
        );
        let out = edit(FEDORA, KUBEADM, &[], &["node-labels".into()]).unwrap();
        assert_eq!(
            parse(&out, KUBEADM).unwrap().unwrap()[0],
            f(
                "eviction-hard",
                "memory.available<500Mi,nodefs.available<10%"
            )
        );
        // Extra args file: an empty unquoted assignment stays unquoted, and dropping the
        // flag again gives back the original bytes.
        let t = include_str!(
            "../../../../../tests/fixtures/nodes/ubuntu-2404-grub/etc/default/kubelet"
        );
        let out = edit(t, EXTRA, &s(&[("node-ip", "192.0.2.5")]), &[]).unwrap();
        assert_eq!(out, "KUBELET_EXTRA_ARGS=--node-ip=192.0.2.5\n");
        assert_eq!(edit(&out, EXTRA, &[], &["node-ip".into()]).unwrap(), t);
    }

    #[test]
    fn env_file_syntax() {
        let t = "# c\n; c2\n  FOO = 'a b' \"c\\\"d\" \\\nX=1\nKUBELET_EXTRA_ARGS=--a=1 --b\n";
        // FOO's value continues over the escaped newline.
        let list = scan(t);
        assert_eq!(list[0].key, "FOO");
        assert_eq!(list[0].value.text(), "a bc\"dX=1");
        assert_eq!(
            parse(t, EXTRA).unwrap().unwrap(),
            vec![
                f("a", "1"),
                Flag {
                    name: "b".into(),
                    value: None
                }
            ]
        );
        // Last assignment wins; only it is rewritten.
        let t = "V=\"--a=1\"\r\n#V=--z\nV='--b=2 --c'  \n# tail";
        assert_eq!(parse(t, "V").unwrap().unwrap()[0], f("b", "2"));
        assert_eq!(
            edit(t, "V", &s(&[("a", "x\\\"y")]), &[]).unwrap(),
            "V=\"--a=1\"\r\n#V=--z\nV='--a=x\\\"y --b=2 --c'  \n# tail"
        );
        assert_eq!(
            parse(&edit(t, "V", &s(&[("a", "x\\\"y")]), &[]).unwrap(), "V")
                .unwrap()
                .unwrap()[0],
            f("a", "x\\\"y")
        );
        // Append when absent, after the marker that lets the revert take it away again
        // (with the line break it added before, when the file had no final newline).
        for text in ["A=1", "A=1\n", ""] {
            let added = edit(text, "V", &s(&[("a", "1")]), &[]).unwrap();
            assert!(added.ends_with("\nV=\"--a=1\"\n"), "{added:?}");
            assert!(added.contains(crate::textedit::OWNED_LINE.get(..20).unwrap()));
            assert_eq!(edit(&added, "V", &[], &["a".into()]).unwrap(), text);
        }
        // Errors.
        assert!(matches!(
            parse("V=\"--a", "V"),
            Err(FlagsError::UnterminatedQuote { .. })
        ));
        assert!(matches!(
            parse("V=foo", "V"),
            Err(FlagsError::NotAFlag { .. })
        ));
        assert!(matches!(
            parse("V=1", "1V"),
            Err(FlagsError::InvalidVariable { .. })
        ));
        assert!(matches!(
            edit("", "V", &s(&[("a", "1")]), &["a".into()]),
            Err(FlagsError::Conflict { .. })
        ));
        let e = validate_flag("node-labels", "a=b c")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--node-labels") && e.contains("space") && e.contains("systemd"),
            "{e}"
        );
        assert!(validate_flag("--max-pods", "1").is_err());
        assert!(validate_flag("Max", "1").is_err());
        assert!(validate_flag("a", "x\0").is_err());
        assert!(validate_flag("a", "x\n").is_err());
        assert!(
            validate_flag(
                "eviction-hard",
                "memory.available<500Mi,nodefs.available<10%"
            )
            .is_ok()
        );
    }

    #[test]
    fn byte_order_mark_kept_or_refused_for_its_real_reason() {
        // glued to the assignment, systemd reads another (invalid) key and ignores it
        let t = "\u{feff}KUBELET_KUBEADM_ARGS=\"--max-pods=110\"\n";
        let e = parse(t, KUBEADM).unwrap_err().to_string();
        assert!(
            e.contains("byte-order mark") && e.contains("systemd"),
            "{e}"
        );
        assert!(edit(t, KUBEADM, &s(&[("max-pods", "250")]), &[]).is_err());
        // before a comment it is harmless: kept, and the edit is made in place
        let t = "\u{feff}# flags\r\nKUBELET_KUBEADM_ARGS=\"--max-pods=110\"\r\n";
        let out = edit(t, KUBEADM, &s(&[("max-pods", "250")]), &[]).unwrap();
        assert_eq!(out, t.replace("110", "250"));
        assert_eq!(
            edit(&out, KUBEADM, &s(&[("max-pods", "110")]), &[]).unwrap(),
            t
        );
    }

    #[test]
    fn bare_flags_and_duplicates_round_trip() {
        let t = "V=\"--b --a=1 -v=2 --a=3\"\n";
        let out = edit(t, "V", &s(&[("c", "1")]), &[]).unwrap();
        // Unsorted: appended, other words kept verbatim.
        assert_eq!(out, "V=\"--b --a=1 -v=2 --a=3 --c=1\"\n");
        let out = edit(t, "V", &s(&[("a", "9")]), &[]).unwrap();
        assert_eq!(out, "V=\"--b --a=9 -v=2\"\n");
        let out = edit(t, "V", &[], &["a".into(), "v".into()]).unwrap();
        assert_eq!(out, "V=\"--b\"\n");
    }

    fn name_strategy() -> impl Strategy<Value = String> {
        "[a-z0-9][a-z0-9-]{0,12}"
    }

    fn value_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-zA-Z0-9=<>%,.:/\"\\\\$`'_-]{0,16}",
            any::<String>().prop_map(|s| s
                .chars()
                .filter(|c| !c.is_whitespace() && !c.is_control())
                .collect()),
        ]
    }

    fn model(mut flags: Vec<Flag>, set: &[(String, String)], remove: &[String]) -> Vec<Flag> {
        flags.retain(|f| !remove.contains(&f.name));
        for (n, v) in set {
            let new = Flag {
                name: n.clone(),
                value: Some(v.clone()),
            };
            if let Some(i) = flags.iter().position(|f| &f.name == n) {
                flags[i] = new;
                let mut j = 0;
                flags.retain(|f| {
                    let keep = j <= i || &f.name != n;
                    j += 1;
                    keep
                });
            } else {
                let sorted = flags.windows(2).all(|w| w[0].name <= w[1].name);
                let at = if sorted {
                    flags
                        .iter()
                        .position(|f| f.name > *n)
                        .unwrap_or(flags.len())
                } else {
                    flags.len()
                };
                flags.insert(at, new);
            }
        }
        flags
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn edit_matches_model(
            which in 0..4usize,
            set in proptest::collection::vec((prop_oneof![name_strategy(), Just("max-pods".to_string()), Just("node-labels".to_string())], value_strategy()), 0..4),
            remove in proptest::collection::vec(prop_oneof![name_strategy(), Just("provider-id".to_string()), Just("eviction-hard".to_string())], 0..3),
        ) {
            let text = [UBUNTU, FEDORA, RHEL, SDBOOT][which];
            let conflict = set.iter().any(|(n, _)| remove.contains(n));
            match edit(text, KUBEADM, &set, &remove) {
                Ok(out) => {
                    prop_assert!(!conflict);
                    let want = model(parse(text, KUBEADM).unwrap().unwrap(), &set, &remove);
                    prop_assert_eq!(parse(&out, KUBEADM).unwrap().unwrap(), want);
                    prop_assert!(out.ends_with('\n'));
                    prop_assert_eq!(out.lines().count(), 1);
                }
                Err(e) => prop_assert!(conflict, "unexpected error {}", e),
            }
        }

        #[test]
        fn no_panic_on_arbitrary_input(
            text in any::<String>(),
            name in any::<String>(),
            value in any::<String>(),
        ) {
            let _ = parse(&text, KUBEADM);
            let _ = validate_flag(&name, &value);
            if let Ok(out) = edit(&text, KUBEADM, &[("max-pods".into(), "1".into())], &["x".into()]) {
                let flags = parse(&out, KUBEADM).unwrap().unwrap();
                let want = Flag { name: "max-pods".into(), value: Some("1".into()) };
                prop_assert!(flags.contains(&want), "missing --max-pods=1 in {}", out);
            }
        }

        #[test]
        fn no_panic_on_env_like_input(
            text in "(V|KUBELET_KUBEADM_ARGS|=|\"|'|\\\\|\n|\r| |#|;|--a=1|--b|x|\\$)*",
        ) {
            let _ = parse(&text, "V");
            if let Ok(out) = edit(&text, "V", &[("a".into(), "2".into())], &["b".into()]) {
                let flags = parse(&out, "V").unwrap().unwrap();
                let want = Flag { name: "a".into(), value: Some("2".into()) };
                prop_assert!(flags.contains(&want), "missing --a=2 in {}", out);
                prop_assert!(!flags.iter().any(|f| f.name == "b"));
                // Other assignments are untouched.
                let a = parse(&text, "KUBELET_KUBEADM_ARGS").ok();
                prop_assert_eq!(parse(&out, "KUBELET_KUBEADM_ARGS").ok(), a);
            }
        }
    }
}
