//! The GRUB environment block (`/boot/grub2/grubenv`, `/boot/grub/grubenv`),
//! read by GRUB's `load_env` and written by `save_env` / `grub2-editenv`.
//! RHEL 8 keeps the kernel arguments of `options $kernelopts` entries here.
//!
//! Format (GRUB `grub-core/lib/envblk.c`): the block starts with the signature
//! line `# GRUB Environment Block\n`; then `name=value\n` lines, where a value
//! escapes `\` as `\\` and a newline as `\` followed by the newline; lines
//! starting with `#` are comments (GRUB 2.12 adds a `# WARNING: ...` line);
//! the block is filled to its fixed size (1024 bytes as created by
//! `grub-editenv`) with `#` bytes and no final newline. GRUB writes the block
//! in place, so its size must never change.
//!
//! Stricter than `grub_envblk_iterate()`, which silently stops at the first
//! malformed line: we report it instead.

use std::ops::Range;

use crate::textedit::{Decoded, InPlace, Quoting};

/// The signature every environment block starts with.
pub const SIGNATURE: &str = "# GRUB Environment Block\n";

/// Errors from [`parse`], [`get`] and [`set`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrubenvError {
    /// The block does not start with [`SIGNATURE`].
    #[error(
        "not a GRUB environment block: it must start with \"# GRUB Environment Block\"; \
         recreate it with grub2-editenv <file> create"
    )]
    BadSignature,
    /// The block starts with a UTF-8 byte-order mark, so GRUB's signature check fails.
    #[error(
        "the GRUB environment block starts with a UTF-8 byte-order mark (EF BB BF) before \
         \"# GRUB Environment Block\", so GRUB's load_env rejects it; recreate it with \
         grub2-editenv <file> create and set the variables again"
    )]
    ByteOrderMark,
    /// A line GRUB would not parse.
    #[error(
        "GRUB environment block is malformed at byte {offset}: {why}; repair it with \
         grub2-editenv (list, then create and set the variables again)"
    )]
    Malformed {
        /// Byte offset of the line.
        offset: usize,
        /// What is wrong.
        why: &'static str,
    },
    /// A name or value is not UTF-8.
    #[error("GRUB environment variable at byte {offset} is not UTF-8; fix it with grub2-editenv")]
    NotUtf8 {
        /// Byte offset of the line.
        offset: usize,
    },
    /// The variable is defined more than once, so editing one copy is
    /// ambiguous.
    #[error(
        "GRUB environment variable {0:?} is defined more than once; remove the copies with \
         grub2-editenv unset and set it once"
    )]
    Duplicate(String),
    /// The variable name cannot be stored.
    #[error(
        "invalid GRUB environment variable name {0:?}: it must be non-empty, not start with '#' \
         and contain no '=', newline or NUL"
    )]
    InvalidName(String),
    /// The value contains NUL, which GRUB (C strings) cannot hold.
    #[error("the value for GRUB environment variable {0:?} contains NUL; remove it")]
    InvalidValue(String),
    /// The edited variables do not fit into the fixed-size block.
    #[error(
        "the GRUB environment block would need {needed} bytes but is fixed at {size}; shorten \
         the value or unset unused variables"
    )]
    DoesNotFit {
        /// Bytes needed.
        needed: usize,
        /// Size of the block.
        size: usize,
    },
}

#[derive(Debug)]
enum Item {
    /// A `#` comment line (raw bytes, including its newline).
    Comment(std::ops::Range<usize>),
    /// A variable line (raw bytes, including its newline).
    Var {
        raw: std::ops::Range<usize>,
        name: String,
        value: String,
    },
}

/// Splits the block into items; the trailing unterminated `#` run is padding.
fn items(bytes: &[u8]) -> Result<Vec<Item>, GrubenvError> {
    let Some(body) = bytes.strip_prefix(SIGNATURE.as_bytes()) else {
        if bytes.starts_with("\u{feff}".as_bytes()) {
            return Err(GrubenvError::ByteOrderMark);
        }
        return Err(GrubenvError::BadSignature);
    };
    let base = SIGNATURE.len();
    let mut out = Vec::new();
    let mut p = 0;
    while p < body.len() {
        let off = base + p;
        let nl = body[p..].iter().position(|&c| c == b'\n').map(|i| p + i);
        if body[p] == b'#' {
            match nl {
                Some(nl) => {
                    out.push(Item::Comment(off..base + nl + 1));
                    p = nl + 1;
                    continue;
                }
                // The padding: GRUB skips it like a comment without newline.
                None => break,
            }
        }
        let Some(eq) = body[p..].iter().position(|&c| c == b'=' || c == b'\n') else {
            return Err(GrubenvError::Malformed {
                offset: off,
                why: "a line without '=' at the end of the block",
            });
        };
        let eq = p + eq;
        if body[eq] == b'\n' {
            return Err(GrubenvError::Malformed {
                offset: off,
                why: "a line that is neither a comment nor name=value",
            });
        }
        let mut value = Vec::new();
        let mut q = eq + 1;
        loop {
            match body.get(q) {
                None => {
                    return Err(GrubenvError::Malformed {
                        offset: off,
                        why: "the last variable has no terminating newline",
                    });
                }
                Some(b'\n') => break,
                Some(b'\\') => {
                    q += 1;
                    match body.get(q) {
                        Some(&c) => value.push(c),
                        None => {
                            return Err(GrubenvError::Malformed {
                                offset: off,
                                why: "a value ends with a lone backslash",
                            });
                        }
                    }
                }
                Some(&c) => value.push(c),
            }
            q += 1;
        }
        let name =
            std::str::from_utf8(&body[p..eq]).map_err(|_| GrubenvError::NotUtf8 { offset: off })?;
        let value = String::from_utf8(value).map_err(|_| GrubenvError::NotUtf8 { offset: off })?;
        out.push(Item::Var {
            raw: off..base + q + 1,
            name: name.to_owned(),
            value,
        });
        p = q + 1;
    }
    Ok(out)
}

/// Parses an environment block into `(name, value)` pairs in file order,
/// values unescaped (`\\` -> `\`, `\<newline>` -> newline). Comments and
/// padding are skipped; trailing spaces in values are kept (RHEL 8's
/// `kernelopts` ends with one).
///
/// # Errors
/// [`GrubenvError::BadSignature`], [`GrubenvError::Malformed`] (a line that is
/// neither `#...` nor `name=value\n`), [`GrubenvError::NotUtf8`].
pub fn parse(bytes: &[u8]) -> Result<Vec<(String, String)>, GrubenvError> {
    Ok(items(bytes)?
        .into_iter()
        .filter_map(|i| match i {
            Item::Var { name, value, .. } => Some((name, value)),
            Item::Comment(_) => None,
        })
        .collect())
}

/// The value of `name`, or `None` if unset. When a name appears several
/// times the last one wins, as with GRUB's `load_env`.
///
/// # Errors
/// Those of [`parse`].
pub fn get(bytes: &[u8], name: &str) -> Result<Option<String>, GrubenvError> {
    Ok(parse(bytes)?
        .into_iter()
        .rev()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v))
}

fn escape(value: &str, out: &mut Vec<u8>) {
    for &b in value.as_bytes() {
        if b == b'\\' || b == b'\n' {
            out.push(b'\\');
        }
        out.push(b);
    }
}

/// Returns a new block with `name` set to `value`, like
/// `grub2-editenv FILE set name=value` (GRUB's `grub_envblk_set()`): an
/// existing variable is rewritten in place, a new one is added after the
/// last line; every other line (variables, `# WARNING` comments) is kept
/// byte for byte and in order, and the result is `#`-padded to the ORIGINAL
/// block size (`bytes.len()`, normally 1024). Setting a variable to its
/// current value returns the input unchanged.
///
/// # Errors
/// Those of [`parse`]; [`GrubenvError::InvalidName`],
/// [`GrubenvError::InvalidValue`] (NUL); [`GrubenvError::Duplicate`] when
/// `name` appears more than once; [`GrubenvError::DoesNotFit`] when the result
/// would exceed the block size.
pub fn set(bytes: &[u8], name: &str, value: &str) -> Result<Vec<u8>, GrubenvError> {
    if name.is_empty() || name.starts_with('#') || name.contains(['=', '\n', '\0']) {
        return Err(GrubenvError::InvalidName(name.to_owned()));
    }
    if value.contains('\0') {
        return Err(GrubenvError::InvalidValue(name.to_owned()));
    }
    let items = items(bytes)?;
    let hits = items
        .iter()
        .filter(|i| matches!(i, Item::Var { name: n, .. } if n == name))
        .count();
    if hits > 1 {
        return Err(GrubenvError::Duplicate(name.to_owned()));
    }
    let mut line = Vec::with_capacity(name.len() + value.len() + 2);
    line.extend_from_slice(name.as_bytes());
    line.push(b'=');
    escape(value, &mut line);
    line.push(b'\n');

    let size = bytes.len();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(SIGNATURE.as_bytes());
    for i in &items {
        match i {
            Item::Var { name: n, .. } if n == name => out.extend_from_slice(&line),
            Item::Var { raw, .. } | Item::Comment(raw) => {
                out.extend_from_slice(&bytes[raw.clone()])
            }
        }
    }
    if hits == 0 {
        out.extend_from_slice(&line);
    }
    if out.len() > size {
        return Err(GrubenvError::DoesNotFit {
            needed: out.len(),
            size,
        });
    }
    out.resize(size, b'#');
    Ok(out)
}

/// GRUB's way to write `s` in a value (`grub_envblk_set()`): `\` as `\\`, a newline as
/// `\` and the newline. The quoting is ignored (grubenv has none).
pub fn encode(_q: Quoting, s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '\\' || c == '\n' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The raw line of the only variable `name` (byte range of its value, without the
/// newline), and the value decoded with its map back to that range (offsets into the
/// block).
fn raw_value(bytes: &[u8], name: &str) -> Result<Option<(Range<usize>, Decoded)>, GrubenvError> {
    let items = items(bytes)?;
    let mut hits = items
        .iter()
        .filter_map(|i| match i {
            Item::Var { raw, name: n, .. } if n == name => Some(raw.clone()),
            _ => None,
        })
        .collect::<Vec<_>>();
    if hits.len() > 1 {
        return Err(GrubenvError::Duplicate(name.to_owned()));
    }
    let Some(raw) = hits.pop() else {
        return Ok(None);
    };
    let start = raw.start + name.len() + 1;
    let end = raw.end - 1;
    let text = std::str::from_utf8(&bytes[start..end])
        .map_err(|_| GrubenvError::NotUtf8 { offset: raw.start })?;
    let mut d = Decoded::new(start, Quoting::Plain);
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let (c, len) = match (c, chars.peek()) {
            ('\\', Some(&(_, n))) => {
                chars.next();
                (n, 1 + n.len_utf8())
            }
            (c, _) => (c, c.len_utf8()),
        };
        d.push(c, start + i..start + i + len, Quoting::Plain);
    }
    Ok(Some((start..end, d)))
}

/// One variable of an environment block, edited in place ([`InPlace`]): a splice changes
/// only the bytes of the value it touches, and the `#` padding at the end grows or shrinks
/// so the block keeps its size. Every other byte stays.
#[derive(Debug, Clone)]
pub struct VarInPlace {
    /// The block as edited so far.
    pub bytes: Vec<u8>,
    name: String,
}

impl VarInPlace {
    /// The variable `name` of `bytes`.
    ///
    /// # Errors
    /// Those of [`parse`]; [`GrubenvError::Duplicate`] when `name` is set more than once.
    /// `Ok(None)` when the block does not set `name`.
    pub fn new(bytes: &[u8], name: &str) -> Result<Option<VarInPlace>, GrubenvError> {
        Ok(raw_value(bytes, name)?.map(|_| VarInPlace {
            bytes: bytes.to_vec(),
            name: name.to_owned(),
        }))
    }
}

impl InPlace for VarInPlace {
    type Error = GrubenvError;
    fn decoded(&self) -> String {
        raw_value(&self.bytes, &self.name)
            .ok()
            .flatten()
            .map(|(_, d)| d.text().to_owned())
            .unwrap_or_default()
    }
    fn splice(&mut self, range: Range<usize>, insert: &str) -> Result<(), GrubenvError> {
        if insert.contains('\0') {
            return Err(GrubenvError::InvalidValue(self.name.clone()));
        }
        let Some((line, d)) = raw_value(&self.bytes, &self.name)? else {
            return Ok(());
        };
        // Spans are block offsets: splice the value line behind `line.start` placeholder
        // bytes (the block before it need not be UTF-8).
        let value = std::str::from_utf8(&self.bytes[line.clone()])
            .map_err(|_| GrubenvError::NotUtf8 { offset: line.start })?;
        let shift = format!("{}{value}", " ".repeat(line.start));
        let edited = d.splice(&shift, range, insert, encode);
        let size = self.bytes.len();
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(&self.bytes[..line.start]);
        out.extend_from_slice(&edited.as_bytes()[line.start..]);
        let tail = &self.bytes[line.end..];
        let pad = tail.iter().rev().take_while(|&&b| b == b'#').count();
        let pad = if tail[..tail.len() - pad].ends_with(b"\n") {
            pad
        } else {
            0
        };
        out.extend_from_slice(&tail[..tail.len() - pad]);
        if out.len() > size {
            return Err(GrubenvError::DoesNotFit {
                needed: out.len(),
                size,
            });
        }
        out.resize(size, b'#');
        self.bytes = out;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::{Arg, Cmdline};

    fn fixture(p: &str) -> Vec<u8> {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/nodes");
        std::fs::read(format!("{root}/{p}")).unwrap()
    }

    fn isol() -> Vec<Arg> {
        ["isolcpus=2-7", "nohz_full=2-7"]
            .map(|s| Arg::parse_one(s).unwrap())
            .to_vec()
    }

    #[test]
    fn rhel8_kernelopts() {
        let env = fixture("rhel8-grubenv/boot/grub2/grubenv");
        assert_eq!(env.len(), 1024);
        let vars = parse(&env).unwrap();
        let names: Vec<&str> = vars.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "saved_entry",
                "kernelopts",
                "boot_success",
                "boot_indeterminate"
            ]
        );
        let old = get(&env, "kernelopts").unwrap().unwrap();
        assert_eq!(
            old,
            "root=/dev/mapper/rhel-root ro crashkernel=auto rd.lvm.lv=rhel/root rhgb quiet \
             systemd.unified_cgroup_hierarchy=1 "
        );
        // Unchanged value: identical bytes, trailing space kept.
        assert_eq!(set(&env, "kernelopts", &old).unwrap(), env);
        assert_eq!(
            set(&env, "boot_success", "0").unwrap(),
            env,
            "other edits keep kernelopts' trailing space"
        );

        let new = Cmdline::parse(&old).apply(&[], &isol()).render();
        let out = set(&env, "kernelopts", &new).unwrap();
        assert_eq!(out.len(), 1024);
        let after = parse(&out).unwrap();
        assert_eq!(
            after[1],
            (
                "kernelopts".into(),
                format!("{} isolcpus=2-7 nohz_full=2-7", old.trim_end())
            )
        );
        assert_eq!(after[0], vars[0]);
        assert_eq!(after[2..], vars[2..]);
        let text = String::from_utf8(out.clone()).unwrap();
        let (_, pad) = text.split_once("boot_indeterminate=0\n").unwrap();
        assert!(!pad.is_empty() && pad.bytes().all(|b| b == b'#'));
        // Setting the old value back restores the original bytes.
        assert_eq!(set(&out, "kernelopts", &old).unwrap(), env);
        assert_eq!(get(&env, "tuned_params").unwrap(), None);
    }

    #[test]
    fn fedora_keeps_warning_and_order() {
        let env = fixture("fedora-41-bls/boot/grub2/grubenv");
        assert_eq!(env.len(), 1024);
        assert_eq!(
            get(&env, "saved_entry").unwrap().as_deref(),
            Some("60427531c86a90c5034f2e849abe07c5-6.15.9-201.fc41.x86_64")
        );
        assert_eq!(get(&env, "kernelopts").unwrap(), None);
        let out = set(&env, "kernelopts", "root=UUID=x ro").unwrap();
        assert_eq!(out.len(), 1024);
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(text.starts_with(
            "# GRUB Environment Block\n# WARNING: Do not edit this file by tools other than grub-editenv!!!\nsaved_entry="
        ));
        assert!(text.contains("boot_indeterminate=0\nkernelopts=root=UUID=x ro\n#"));
        let names: Vec<String> = parse(&out).unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "saved_entry",
                "menu_auto_hide",
                "boot_success",
                "boot_indeterminate",
                "kernelopts"
            ]
        );
        assert_eq!(set(&env, "menu_auto_hide", "1").unwrap(), env);
    }

    #[test]
    fn escapes_and_errors() {
        let mut blk = SIGNATURE.as_bytes().to_vec();
        blk.extend_from_slice(b"a=x\\\\y\\\nz\nb=\n");
        blk.resize(64, b'#');
        assert_eq!(
            parse(&blk).unwrap(),
            [("a".into(), "x\\y\nz".into()), ("b".into(), String::new())]
        );
        let out = set(&blk, "b", "p\\q\nr").unwrap();
        assert_eq!(get(&out, "b").unwrap().as_deref(), Some("p\\q\nr"));
        assert_eq!(out.len(), 64);
        assert_eq!(
            set(&blk, "c", &"v".repeat(30)),
            Err(GrubenvError::DoesNotFit {
                needed: 71,
                size: 64
            })
        );
        assert_eq!(parse(b"# GRUB Env"), Err(GrubenvError::BadSignature));
        let mut bom = "\u{feff}".as_bytes().to_vec();
        bom.extend_from_slice(&blk);
        assert_eq!(parse(&bom), Err(GrubenvError::ByteOrderMark));
        let mut bad = SIGNATURE.as_bytes().to_vec();
        bad.extend_from_slice(b"novalue\n###");
        assert!(matches!(
            parse(&bad),
            Err(GrubenvError::Malformed { offset: 25, .. })
        ));
        let mut dup = SIGNATURE.as_bytes().to_vec();
        dup.extend_from_slice(b"a=1\na=2\n###");
        assert_eq!(get(&dup, "a").unwrap().as_deref(), Some("2"));
        assert_eq!(
            set(&dup, "a", "3"),
            Err(GrubenvError::Duplicate("a".into()))
        );
        assert!(matches!(
            set(&blk, "x=y", "1"),
            Err(GrubenvError::InvalidName(_))
        ));
        assert!(matches!(
            set(&blk, "x", "\0"),
            Err(GrubenvError::InvalidValue(_))
        ));
        let mut nonl = SIGNATURE.as_bytes().to_vec();
        nonl.extend_from_slice(b"a=1");
        assert!(matches!(parse(&nonl), Err(GrubenvError::Malformed { .. })));
    }

    proptest::proptest! {
        #[test]
        fn set_get_roundtrip(v in "\\PC{0,40}", tail in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
            let env = fixture("rhel8-grubenv/boot/grub2/grubenv");
            if let Ok(out) = set(&env, "kernelopts", &v) {
                proptest::prop_assert_eq!(out.len(), 1024);
                proptest::prop_assert_eq!(get(&out, "kernelopts").unwrap(), Some(v));
            }
            let mut junk = SIGNATURE.as_bytes().to_vec();
            junk.extend_from_slice(&tail);
            let _ = parse(&junk);
            let _ = set(&junk, "k", "v");
        }
    }
}
