//! Boot Loader Specification (uapi-group) Type #1 entries:
//! `/boot/loader/entries/*.conf` (GRUB `blscfg` on Fedora/RHEL) and
//! `<ESP>/loader/entries/*.conf` (systemd-boot).
//!
//! Line syntax mirrors systemd-boot's `line_get_key_value()`: lines end at
//! `\n` (a `\r` before it is ignored); leading and trailing spaces/tabs are
//! ignored; empty lines and lines starting with `#` are skipped; the key runs
//! to the first space or tab, the value starts after any run of spaces/tabs
//! (so keys may be padded to a column, as `kernel-install` does). A key with no
//! value is ignored. `options` may appear several times; boot loaders join the
//! values with one space.
//!
//! Difference between loaders: systemd-boot also strips one pair of double
//! quotes from a value that both starts and ends with `"`; GRUB's `blscfg`
//! does not but expands `$var` GRUB variables (RHEL 8's `$kernelopts`).
//! [`Entry::options`] returns the text as written.

use crate::cmdline::{Arg, Cmdline, arg_spans};

/// Errors from [`Entry::parse`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlsError {
    /// The file name is not that of a BLS Type #1 entry.
    #[error(
        "{name:?} is not a boot loader entry file name ({why}); entries are named <id>.conf \
         directly inside loader/entries/"
    )]
    FileName {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The entry starts with a UTF-8 byte-order mark glued to its `options` key: GRUB's
    /// blscfg and systemd-boot split a line at whitespace without skipping the mark, so
    /// they read the key `\u{feff}options`, which they ignore, and boot without those
    /// options; an edit could not be read as the loaders read it.
    #[error(
        "{name} starts with a UTF-8 byte-order mark (EF BB BF) glued to its options line, which the boot loaders (GRUB's blscfg, systemd-boot) do not skip: they read another key and boot without these options; nothing was changed: remove the byte-order mark"
    )]
    ByteOrderMark {
        /// The entry's file name.
        name: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    /// Byte range of the line content (without `\r\n`/`\n`).
    start: usize,
    end: usize,
    /// Start of the next line.
    next: usize,
    key: Option<(usize, usize)>,
    /// Value range (trailing whitespace excluded); `None` for a bare key.
    value: Option<(usize, usize)>,
}

/// One parsed BLS Type #1 entry, keeping the original text so it can be
/// rewritten with every unrelated byte intact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    file_name: String,
    text: String,
    lines: Vec<Line>,
}

fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn split_lines(text: &str) -> Vec<Line> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    while start < b.len() {
        let nl = b[start..].iter().position(|&c| c == b'\n');
        let (mut end, next) = match nl {
            Some(i) => (start + i, start + i + 1),
            None => (b.len(), b.len()),
        };
        if end > start && b[end - 1] == b'\r' {
            end -= 1;
        }
        let mut ks = start;
        while ks < end && is_blank(b[ks]) {
            ks += 1;
        }
        let mut ce = end;
        while ce > ks && is_blank(b[ce - 1]) {
            ce -= 1;
        }
        let (mut key, mut value) = (None, None);
        if ks < ce && b[ks] != b'#' {
            let mut ke = ks;
            while ke < ce && !is_blank(b[ke]) {
                ke += 1;
            }
            key = Some((ks, ke));
            let mut vs = ke;
            while vs < ce && is_blank(b[vs]) {
                vs += 1;
            }
            if vs < ce {
                value = Some((vs, ce));
            }
        }
        out.push(Line {
            start,
            end,
            next,
            key,
            value,
        });
        start = next;
    }
    out
}

impl Entry {
    /// Parses an entry file. `file_name` is the base name (for example
    /// `60427531c86a90c5034f2e849abe07c5-6.15.9-201.fc41.x86_64.conf`), `text`
    /// its content. Unknown keys are kept and ignored, as boot loaders do.
    ///
    /// # Errors
    /// [`BlsError::FileName`] when `file_name` does not end in `.conf`,
    /// contains `/`, or leaves an empty id; [`BlsError::ByteOrderMark`] when the text
    /// starts with a UTF-8 byte-order mark glued to `options`.
    pub fn parse(file_name: &str, text: &str) -> Result<Entry, BlsError> {
        let err = |why| BlsError::FileName {
            name: file_name.to_owned(),
            why,
        };
        let Some(stem) = file_name.strip_suffix(".conf") else {
            return Err(err("it does not end in .conf"));
        };
        if file_name.contains('/') {
            return Err(err("it contains '/'"));
        }
        if stem.is_empty() {
            return Err(err("the id before .conf is empty"));
        }
        // a mark before any other key (`title`) is kept: the loaders lose that key as
        // they do now, and the options are edited as in the file without the mark
        if text
            .strip_prefix('\u{feff}')
            .and_then(|rest| rest.split_whitespace().next())
            == Some("options")
        {
            return Err(BlsError::ByteOrderMark {
                name: file_name.to_owned(),
            });
        }
        Ok(Entry {
            file_name: file_name.to_owned(),
            text: text.to_owned(),
            lines: split_lines(text),
        })
    }

    /// The file name given to [`Entry::parse`].
    pub fn file_name(&self) -> &str {
        &self.file_name
    }

    /// The original text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The entry id: the file name without `.conf` and without a trailing
    /// boot-counting suffix `+LEFT` or `+LEFT-DONE` (digits only), as the BLS
    /// spec and systemd-boot define it. This is what GRUB's `saved_entry` and
    /// systemd-boot's `LoaderEntryDefault` name. A `+` followed by anything
    /// else is part of the id (`6.12.48+deb13-amd64`).
    pub fn id(&self) -> &str {
        let stem = self
            .file_name
            .strip_suffix(".conf")
            .unwrap_or(&self.file_name);
        if let Some(plus) = stem.rfind('+') {
            let counter = &stem[plus + 1..];
            let digits = |s: &str| !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit());
            let is_counter = match counter.split_once('-') {
                Some((left, done)) => digits(left) && digits(done),
                None => digits(counter),
            };
            if is_counter && plus > 0 {
                return &stem[..plus];
            }
        }
        stem
    }

    fn values<'a, 'k>(&'a self, key: &'k str) -> impl Iterator<Item = &'a str> + use<'a, 'k> {
        let text: &'a str = &self.text;
        self.lines.iter().filter_map(move |l| {
            let (ks, ke) = l.key?;
            let (vs, ve) = l.value?;
            if text.get(ks..ke)? == key {
                text.get(vs..ve)
            } else {
                None
            }
        })
    }

    /// The first value of `key` (for single-valued keys such as `title`,
    /// `version`, `linux`, `machine-id`, `sort-key`); `None` if absent.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values(key).next()
    }

    /// The `title` value.
    pub fn title(&self) -> Option<&str> {
        self.get("title")
    }

    /// The `version` value (for example `6.15.9-201.fc41.x86_64`).
    pub fn version(&self) -> Option<&str> {
        self.get("version")
    }

    /// True for a rescue entry: the id, version or title contains "rescue"
    /// (case-insensitively), as in Fedora/RHEL's
    /// `<machine-id>-0-rescue.conf` with version `0-rescue-<machine-id>`
    /// written by dracut's `51-dracut-rescue.install`.
    pub fn is_rescue(&self) -> bool {
        [Some(self.id()), self.version(), self.title()]
            .into_iter()
            .flatten()
            .any(|s| s.to_ascii_lowercase().contains("rescue"))
    }

    /// All `options` values joined by one space, as systemd-boot and GRUB's
    /// `blscfg` join them; `None` when the entry has no `options` line.
    /// GRUB variables such as `$kernelopts` are returned unexpanded.
    pub fn options(&self) -> Option<String> {
        let v: Vec<&str> = self.values("options").collect();
        (!v.is_empty()).then(|| v.join(" "))
    }

    /// [`Entry::options`] parsed as a kernel command line (empty when there
    /// is no `options` line). Meaningless when [`Entry::uses_variables`] is
    /// not empty.
    pub fn options_cmdline(&self) -> Cmdline {
        Cmdline::parse(&self.options().unwrap_or_default())
    }

    /// The GRUB variables referenced by the options (`$name` or `${name}`),
    /// in order of first use, without duplicates: `["kernelopts",
    /// "tuned_params"]` for `options $kernelopts $tuned_params` (RHEL 8).
    /// GRUB's `blscfg` expands them at boot; systemd-boot does not.
    pub fn uses_variables(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for v in self.values("options") {
            let b = v.as_bytes();
            let mut i = 0;
            while i < b.len() {
                if b[i] != b'$' {
                    i += 1;
                    continue;
                }
                i += 1;
                let name = if b.get(i) == Some(&b'{') {
                    let s = i + 1;
                    let e = b[s..].iter().position(|&c| c == b'}').map(|p| s + p);
                    i = e.map_or(b.len(), |e| e + 1);
                    e.and_then(|e| v.get(s..e))
                } else {
                    let s = i;
                    while i < b.len() && (b[i] == b'_' || b[i].is_ascii_alphanumeric()) {
                        i += 1;
                    }
                    v.get(s..i)
                };
                if let Some(n) = name.filter(|n| !n.is_empty())
                    && !out.iter().any(|o| o == n)
                {
                    out.push(n.to_owned());
                }
            }
        }
        out
    }

    /// Returns the entry text with the kernel options replaced by `new`: the
    /// whole rendered command line goes on the FIRST `options` line, keeping
    /// its indentation, key and key padding (`options    ` in
    /// `kernel-install` entries) and its line ending; the other `options`
    /// lines are dropped; every other line is byte-identical. Without an
    /// `options` line, `options <cmdline>\n` is appended.
    ///
    /// Like `grubby --update-kernel`, this replaces GRUB variables such as
    /// `$kernelopts $tuned_params` with literal text: check
    /// [`Entry::uses_variables`] first (on RHEL 8 edit `kernelopts` in grubenv
    /// instead). systemd-boot strips one pair of surrounding double quotes
    /// from a value, so a command line that both starts and ends with `"`
    /// would not reach the kernel unchanged there.
    pub fn set_options(&self, new: &Cmdline) -> String {
        let rendered = new.render();
        let mut out = String::with_capacity(self.text.len() + rendered.len());
        let mut done = false;
        let mut copied = 0;
        for l in &self.lines {
            let is_opts = l
                .key
                .and_then(|(ks, ke)| self.text.get(ks..ke))
                .is_some_and(|k| k == "options");
            if !is_opts {
                continue;
            }
            out.push_str(&self.text[copied..l.start]);
            copied = l.next;
            if done {
                continue;
            }
            done = true;
            let prefix_end = match (l.value, l.key) {
                (Some((vs, _)), _) => vs,
                (None, Some((_, ke))) => ke,
                (None, None) => l.end,
            };
            let mut prefix = self.text[l.start..prefix_end].to_owned();
            if l.value.is_none() {
                prefix.push(' ');
            }
            if rendered.is_empty() {
                prefix.truncate(prefix.trim_end_matches([' ', '\t']).len());
            }
            out.push_str(&prefix);
            out.push_str(&rendered);
            out.push_str(&self.text[l.end..l.next]);
        }
        out.push_str(&self.text[copied..]);
        if !done {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str("options");
            if !rendered.is_empty() {
                out.push(' ');
                out.push_str(&rendered);
            }
            out.push('\n');
        }
        out
    }
}

/// One `options` line of an entry being edited in place: its value, or `None` once the
/// edit dropped the line.
struct OptLine {
    line: usize,
    value: Option<String>,
}

impl Entry {
    /// Applies [`Cmdline::apply`]`(remove, append)` to the options in place, keeping the
    /// layout the Boot Loader Specification allows: every `options` line stays where it
    /// is with its indentation, key padding, trailing whitespace and line ending (`\r\n`
    /// included); a removed argument goes with the whitespace next to it on its own line,
    /// and a line it was alone on goes entirely; appended arguments go after the last
    /// argument, on its line (or on a new `options` line at the end when the entry has
    /// none). Appending then removing the same arguments gives back the original bytes.
    ///
    /// Returns `None` when the options can not be edited line by line: an argument spans
    /// two `options` lines (a double quote opened on one line and closed on another, which
    /// the loaders join into one argument). [`Entry::set_options`] is the fallback.
    pub fn edit_options(&self, remove: &[Arg], append: &[Arg]) -> Option<String> {
        let mut lines: Vec<OptLine> = Vec::new();
        for (i, l) in self.lines.iter().enumerate() {
            let key = l.key.and_then(|(ks, ke)| self.text.get(ks..ke));
            if key == Some("options")
                && let Some((vs, ve)) = l.value
            {
                lines.push(OptLine {
                    line: i,
                    value: Some(self.text[vs..ve].to_owned()),
                });
            }
        }
        let joined_ok = |lines: &[OptLine]| {
            let vals: Vec<&str> = lines.iter().filter_map(|o| o.value.as_deref()).collect();
            let per_line: Vec<&str> = vals
                .iter()
                .flat_map(|v| arg_spans(v).into_iter().map(move |r| &v[r]))
                .collect();
            let joined = vals.join(" ");
            let whole: Vec<&str> = arg_spans(&joined).into_iter().map(|r| &joined[r]).collect();
            per_line == whole
        };
        if !joined_ok(&lines) {
            return None;
        }
        for r in remove {
            remove_one(&mut lines, r);
        }
        let mut extra = None;
        if !append.is_empty() {
            let text = Cmdline::from_args(append.to_vec()).render();
            match last_kernel_arg(&lines) {
                Some(Place::After(k, end)) => {
                    if let Some(v) = lines[k].value.as_mut() {
                        v.insert_str(end, &format!(" {text}"));
                    }
                }
                Some(Place::Before(k, start)) => {
                    if let Some(v) = lines[k].value.as_mut() {
                        v.insert_str(start, &format!("{text} "));
                    }
                }
                None => extra = Some(text),
            }
        }
        Some(self.render_options(&lines, extra.as_deref()))
    }

    /// The text with each `options` line of `lines` rewritten (or dropped), and an
    /// `options <extra>` line appended.
    fn render_options(&self, lines: &[OptLine], extra: Option<&str>) -> String {
        let mut out = String::with_capacity(self.text.len() + 64);
        let mut copied = 0;
        // a file without a final newline keeps none: an appended line goes after a line
        // break and ends the file, and dropping the last line takes the break before it
        let open_end = !self.text.is_empty() && !self.text.ends_with('\n');
        for o in lines {
            let l = &self.lines[o.line];
            let Some((vs, ve)) = l.value else { continue };
            out.push_str(&self.text[copied..l.start]);
            copied = l.next;
            if let Some(v) = &o.value {
                out.push_str(&self.text[l.start..vs]);
                out.push_str(v);
                out.push_str(&self.text[ve..l.next]);
            } else if open_end && l.next == self.text.len() {
                let kept = out.trim_end_matches('\n').len();
                out.truncate(kept);
                if out.ends_with('\r') {
                    out.pop();
                }
            }
        }
        out.push_str(&self.text[copied..]);
        if let Some(extra) = extra {
            let eol = if self.text.contains("\r\n") {
                "\r\n"
            } else {
                "\n"
            };
            if !out.is_empty() && !out.ends_with('\n') {
                out.push_str(eol);
            }
            out.push_str("options ");
            out.push_str(extra);
            if !open_end {
                out.push_str(eol);
            }
        }
        out
    }
}

/// Where appended arguments go: after the argument ending at byte `.1` of line `.0`, or
/// before a leading `--` starting there.
enum Place {
    After(usize, usize),
    Before(usize, usize),
}

/// Every argument of the kept `options` lines, in the loaders' order: (line, range, arg).
fn all_args(lines: &[OptLine]) -> Vec<(usize, std::ops::Range<usize>, Arg)> {
    let mut out = Vec::new();
    for (k, o) in lines.iter().enumerate() {
        if let Some(v) = &o.value {
            for r in arg_spans(v) {
                out.push((k, r.clone(), Cmdline::parse(&v[r]).args()[0].clone()));
            }
        }
    }
    out
}

/// Index of the first bare `--` (the end of the kernel's own arguments), or the count.
fn kernel_end(args: &[(usize, std::ops::Range<usize>, Arg)]) -> usize {
    args.iter()
        .position(|(_, _, a)| a.key() == "--" && a.value().is_none())
        .unwrap_or(args.len())
}

fn last_kernel_arg(lines: &[OptLine]) -> Option<Place> {
    let args = all_args(lines);
    let end = kernel_end(&args);
    if end > 0 {
        let (k, r, _) = &args[end - 1];
        Some(Place::After(*k, r.end))
    } else {
        args.first().map(|(k, r, _)| Place::Before(*k, r.start))
    }
}

/// Removes the last exact occurrence of `r` before `--`, with the whitespace next to it on
/// its line, or its whole line when it is alone there.
fn remove_one(lines: &mut [OptLine], r: &Arg) {
    let args = all_args(lines);
    let end = kernel_end(&args);
    let Some(i) = args[..end]
        .iter()
        .rposition(|(_, _, a)| a.matches_exactly(r))
    else {
        return;
    };
    let k = args[i].0;
    let Some(v) = lines[k].value.as_mut() else {
        return;
    };
    let spans = arg_spans(v);
    let j = spans.iter().position(|s| *s == args[i].1).unwrap_or(0);
    if spans.len() == 1 {
        lines[k].value = None;
    } else if j > 0 {
        v.replace_range(spans[j - 1].end..spans[j].end, "");
    } else {
        v.replace_range(spans[0].start..spans[1].start, "");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(dir: &str) -> Vec<Entry> {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/nodes");
        let mut v: Vec<Entry> = std::fs::read_dir(format!("{root}/{dir}"))
            .unwrap()
            .map(|d| {
                let d = d.unwrap();
                let name = d.file_name().into_string().unwrap();
                Entry::parse(&name, &std::fs::read_to_string(d.path()).unwrap()).unwrap()
            })
            .collect();
        v.sort_by(|a, b| a.file_name().cmp(b.file_name()));
        v
    }

    fn isol() -> Vec<Arg> {
        ["isolcpus=2-7", "nohz_full=2-7"]
            .map(|s| Arg::parse_one(s).unwrap())
            .to_vec()
    }

    /// Lines that differ between two texts with the same line count.
    fn changed_lines(a: &str, b: &str) -> Vec<usize> {
        let (la, lb): (Vec<_>, Vec<_>) = (a.split('\n').collect(), b.split('\n').collect());
        assert_eq!(la.len(), lb.len());
        (0..la.len()).filter(|&i| la[i] != lb[i]).collect()
    }

    #[test]
    fn fedora_append_to_non_rescue() {
        let es = entries("fedora-41-bls/boot/loader/entries");
        assert_eq!(es.len(), 3);
        let rescue: Vec<bool> = es.iter().map(Entry::is_rescue).collect();
        assert_eq!(rescue, [true, false, false]);
        // What the agent does: edit every non-rescue entry, leave rescue alone.
        let edited: Vec<String> = es
            .iter()
            .map(|e| {
                if e.is_rescue() {
                    e.text().to_owned()
                } else {
                    e.set_options(&e.options_cmdline().apply(&[], &isol()))
                }
            })
            .collect();
        assert_eq!(edited[0], es[0].text());
        assert!(!edited[0].contains("isolcpus"));
        assert!(edited[1..].iter().all(|t| {
            t.contains("transparent_hugepage=madvise isolcpus=2-7 nohz_full=2-7\ngrub_users")
        }));
        assert_eq!(es[0].id(), "60427531c86a90c5034f2e849abe07c5-0-rescue");
        assert_eq!(es[2].version(), Some("6.15.9-201.fc41.x86_64"));
        let base = "root=UUID=88be9724-6475-4e38-ba1d-43420e7b7574 ro rootflags=subvol=root \
                    no_timer_check console=tty1 console=ttyS0,115200n8 systemd.firstboot=off";
        assert_eq!(es[0].options().as_deref(), Some(base));
        for e in &es[1..] {
            assert!(e.uses_variables().is_empty());
            let old = e.options_cmdline();
            assert_eq!(
                e.options().unwrap(),
                format!("{base} transparent_hugepage=madvise")
            );
            let new_text = e.set_options(&old.apply(&[], &isol()));
            assert_eq!(changed_lines(e.text(), &new_text), [4]);
            let e2 = Entry::parse(e.file_name(), &new_text).unwrap();
            assert_eq!(
                e2.options().unwrap(),
                format!("{base} transparent_hugepage=madvise isolcpus=2-7 nohz_full=2-7")
            );
            // Removing them again gives back the original bytes.
            let back = e2.set_options(&e2.options_cmdline().apply(&isol(), &[]));
            assert_eq!(back, e.text());
        }
    }

    #[test]
    fn systemd_boot_padding_and_machine_id() {
        let es = entries("systemd-boot/boot/efi/loader/entries");
        assert_eq!(
            es.iter().map(Entry::id).collect::<Vec<_>>(),
            [
                "382841d297f903a743992847508b8eae-6.12.41+deb13-amd64",
                "382841d297f903a743992847508b8eae-6.12.48+deb13-amd64"
            ]
        );
        for e in &es {
            assert!(!e.is_rescue());
            assert_eq!(
                e.get("machine-id"),
                Some("382841d297f903a743992847508b8eae")
            );
            assert_eq!(e.title(), Some("Debian GNU/Linux 13 (trixie)"));
            let new_text = e.set_options(&e.options_cmdline().apply(&[], &isol()));
            assert_eq!(changed_lines(e.text(), &new_text), [6]);
            let line = new_text.lines().nth(6).unwrap();
            assert!(line.starts_with("options    root=UUID="), "{line}");
            assert!(line.ends_with(
                " systemd.machine_id=382841d297f903a743992847508b8eae isolcpus=2-7 nohz_full=2-7"
            ));
            let e2 = Entry::parse(e.file_name(), &new_text).unwrap();
            assert!(e2.options_cmdline().contains_exact(
                &Arg::parse_one("systemd.machine_id=382841d297f903a743992847508b8eae").unwrap()
            ));
            assert_eq!(
                e2.set_options(&e2.options_cmdline().apply(&isol(), &[])),
                e.text()
            );
        }
        assert!(es[1].options().unwrap().contains("hugepages=4096"));
        assert!(!es[0].options().unwrap().contains("hugepages=4096"));
    }

    #[test]
    fn rhel8_variables() {
        let es = entries("rhel8-grubenv/boot/loader/entries");
        assert_eq!(es[0].uses_variables(), ["kernelopts"]);
        assert!(es[0].is_rescue());
        assert_eq!(es[1].uses_variables(), ["tuned_params"]);
        assert_eq!(es[2].uses_variables(), ["kernelopts", "tuned_params"]);
        assert_eq!(
            es[2].options().as_deref(),
            Some("$kernelopts $tuned_params")
        );
    }

    #[test]
    fn ids_and_multiple_options() {
        let t = "title x\n  options  a=1   \n# options no\noptions\toptions b \"c d\"\r\nlinux /v\noptions x";
        let e = Entry::parse("m-1.2+3-1.conf", t).unwrap();
        assert_eq!(e.id(), "m-1.2");
        assert_eq!(e.options().as_deref(), Some("a=1 options b \"c d\" x"));
        let c = Cmdline::parse("q dyndbg=\"file foo.c +p\"");
        assert_eq!(
            e.set_options(&c),
            "title x\n  options  q dyndbg=\"file foo.c +p\"\n# options no\nlinux /v\n"
        );
        assert_eq!(Entry::parse("a+5.conf", "").unwrap().id(), "a");
        assert_eq!(Entry::parse("a+5-.conf", "").unwrap().id(), "a+5-");
        assert_eq!(Entry::parse("+5.conf", "").unwrap().id(), "+5");
        assert_eq!(Entry::parse("a+x1.conf", "").unwrap().id(), "a+x1");
        assert_eq!(
            Entry::parse("e.conf", "title t").unwrap().set_options(&c),
            "title t\noptions q dyndbg=\"file foo.c +p\"\n"
        );
        assert_eq!(
            Entry::parse("e.conf", "options a\n")
                .unwrap()
                .set_options(&Cmdline::default()),
            "options\n"
        );
        assert!(Entry::parse("e.cfg", "").is_err());
        assert!(Entry::parse(".conf", "").is_err());
        assert!(Entry::parse("a/b.conf", "").is_err());
        let v = Entry::parse("v.conf", "options ${a} $b_1 $ ${ $a\n").unwrap();
        assert_eq!(v.uses_variables(), ["a", "b_1"]);
    }

    proptest::proptest! {
        #[test]
        fn never_panics(t in "\\PC{0,80}", args in "[a-z= \"]{0,20}") {
            let e = Entry::parse("x.conf", &t).unwrap();
            let _ = (e.id(), e.options(), e.uses_variables(), e.is_rescue());
            let c = Cmdline::parse(&args);
            let out = e.set_options(&c);
            let e2 = Entry::parse("x.conf", &out).unwrap();
            if c.check().is_ok() && !c.is_empty() {
                proptest::prop_assert_eq!(e2.options_cmdline(), c);
            }
        }
    }

    /// A byte-order mark (issue 27 §6 class): before `title` it is kept and the options
    /// are edited as without it; glued to `options` (which the loaders would then not
    /// read) the entry is refused naming the mark.
    #[test]
    fn a_byte_order_mark_is_kept_or_refused_for_the_loaders_reason() {
        let plain =
            "title Fedora Linux\nversion 6.15.9\nlinux /vmlinuz\noptions root=UUID=1 ro quiet\n";
        let name = "abc-6.15.9.conf";
        let with = Entry::parse(name, &format!("\u{feff}{plain}")).unwrap();
        let without = Entry::parse(name, plain).unwrap();
        assert_eq!(with.options(), without.options());
        let got = with.edit_options(&[], &isol()).unwrap();
        let want = without.edit_options(&[], &isol()).unwrap();
        assert_eq!(got, format!("\u{feff}{want}"));
        assert!(want.ends_with("options root=UUID=1 ro quiet isolcpus=2-7 nohz_full=2-7\n"));
        let glued = "\u{feff}options root=UUID=1 ro\ntitle x\n";
        let e = Entry::parse(name, glued).unwrap_err().to_string();
        assert!(
            e.starts_with("abc-6.15.9.conf starts with a UTF-8 byte-order mark (EF BB BF) glued to its options line"),
            "{e}"
        );
    }
}
