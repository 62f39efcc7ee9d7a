//! Kernel parameters (sysctls): the `/proc/sys` path of a key and the `sysctl.d(5)` files
//! systemd-sysctl applies at boot.
//!
//! Shared by the `sysctls` section (its drop-in, its live values), the `files` section
//! (a sysctl.d file written as a file takes effect live) and the operation engine (live
//! writes, rollback, drift): the domain rules live here once, none of them does I/O.

use std::collections::BTreeMap;

/// `/proc/sys/...` of a sysctl key, as procps `sysctl(8)` and systemd-sysctl map it: when
/// the first separator of the key is a `/`, the key is in the slashed form
/// (`net/ipv4/conf/eth0.100/rp_filter`) and used as is; otherwise it is in the dotted form
/// and every `.` separates components while a `/` stands for a `.` inside one
/// (`net.ipv4.conf.eth0/100.rp_filter` is `net/ipv4/conf/eth0.100/rp_filter`).
pub fn sysctl_path(key: &str) -> String {
    match key.find(['.', '/']) {
        Some(i) if key.as_bytes()[i] == b'/' => format!("/proc/sys/{key}"),
        _ => {
            let swapped: String = key
                .chars()
                .map(|c| match c {
                    '.' => '/',
                    '/' => '.',
                    c => c,
                })
                .collect();
            format!("/proc/sys/{swapped}")
        }
    }
}

/// Directories systemd-sysctl reads, highest priority first (`sysctl.d(5)`).
pub const SYSCTL_DIRS: &[&str] = &[
    "/etc/sysctl.d",
    "/run/sysctl.d",
    "/usr/local/lib/sysctl.d",
    "/usr/lib/sysctl.d",
    "/lib/sysctl.d",
];

/// True for a path systemd-sysctl reads at boot.
pub fn is_sysctl_conf(path: &str) -> bool {
    SYSCTL_DIRS.iter().any(|d| {
        path.strip_prefix(d)
            .and_then(|r| r.strip_prefix('/'))
            .is_some_and(|n| !n.contains('/') && n.ends_with(".conf"))
    })
}

/// A value as the kernel compares it: runs of whitespace are one space
/// (`net.ipv4.ip_local_port_range` reads back tab-separated).
pub fn normalize(value: &str) -> String {
    value.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Parses sysctl.d(5) text: `key = value` lines, `#`/`;` comments, a leading `-` ignored.
pub fn parse_sysctl_conf(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let l = line.trim();
        if l.is_empty() || l.starts_with(['#', ';']) {
            continue;
        }
        if let Some((k, v)) = l.split_once('=') {
            let k = k.trim().trim_start_matches('-').to_string();
            out.insert(k, v.trim().to_string());
        }
    }
    out
}

/// Renders the agent's sysctl.d drop-in, keys sorted.
pub fn render_sysctl_conf(values: &BTreeMap<String, String>) -> String {
    let mut s = String::from(DROP_IN_HEADER);
    for (k, v) in values {
        s.push_str(&format!("{k} = {v}\n"));
    }
    s
}

/// The key an assignment line of sysctl.d(5) sets, and the byte range of its value in
/// the line; `None` for blank, comment (`#`, `;`) and malformed lines.
fn assignment(line: &str) -> Option<(&str, std::ops::Range<usize>)> {
    let body = line.trim_end_matches(['\n', '\r']);
    let l = body.trim_start();
    if l.is_empty() || l.starts_with(['#', ';']) {
        return None;
    }
    let eq = body.find('=')?;
    let key = body[..eq].trim().trim_start_matches('-');
    let after = &body[eq + 1..];
    let vstart = eq + 1 + (after.len() - after.trim_start().len());
    let vend = eq + 1 + after.trim_end().len();
    Some((key, vstart..vend.max(vstart)))
}

/// The agent's sysctl.d drop-in, edited in place from its current text (`None`: the file
/// does not exist) to hold `values`, with the lines of the `restore` keys given back their
/// old value texts (the n-th line of a key the n-th text) and the lines of the `dropped`
/// keys removed.
///
/// Every other byte stays: comments, blank lines, other keys, line endings, and on a
/// line whose value changes its `-` prefix, the spacing around `=` and trailing
/// whitespace (only the value is replaced). A key is matched by its `/proc/sys` path, so
/// `net/ipv4/ip_forward` and `net.ipv4.ip_forward` are one key. A new key is appended as
/// `key=value` when every assignment already in the file is written without spaces, else
/// canonically `key = value`, with the file's line ending (a file without a final newline
/// keeps none, so that dropping the key again gives the same bytes). A new file is
/// [`render_sysctl_conf`]. Returns `None` when nothing but the agent's own header (and blank
/// lines) would be left: the file is the agent's and is to be deleted.
///
/// A UTF-8 byte-order mark at the start is kept, and the edit is made as in the file
/// without it. Neither consumer skips the mark (procps-ng `sysctl --system` strips only
/// whitespace before the key; systemd-sysctl reads the line as it is): before a comment
/// it is harmless, glued to an assignment it makes that line's key another, invalid name
/// that sets nothing. [`parse_sysctl_conf`] reads that line the same way, so it is not
/// the line of a managed key here either: the key is appended on a line of its own, which
/// both consumers apply.
pub fn edit_sysctl_conf(
    current: Option<&str>,
    values: &BTreeMap<String, String>,
    restore: &BTreeMap<String, Vec<String>>,
    dropped: &[String],
) -> Option<String> {
    let Some(text) = current else {
        return (!values.is_empty()).then(|| render_sysctl_conf(values));
    };
    let by_path: BTreeMap<String, &String> =
        values.iter().map(|(k, v)| (sysctl_path(k), v)).collect();
    // keys given back their lines' own old values: the n-th line of the key gets the
    // n-th value (the last one for lines added since)
    let restore: BTreeMap<String, &Vec<String>> =
        restore.iter().map(|(k, v)| (sysctl_path(k), v)).collect();
    let mut restored: BTreeMap<String, usize> = BTreeMap::new();
    let dropped: std::collections::BTreeSet<String> =
        dropped.iter().map(|k| sysctl_path(k)).collect();
    let mut seen = std::collections::BTreeSet::new();
    let (mut assignments, mut tight) = (0, true);
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let Some((key, range)) = assignment(line) else {
            out.push_str(line);
            continue;
        };
        assignments += 1;
        tight &= !line.contains(" =") && !line.contains("= ");
        let path = sysctl_path(key);
        if let Some(old) = restore.get(&path).filter(|o| !o.is_empty()) {
            let n = restored.entry(path.clone()).or_default();
            let v = &old[(*n).min(old.len() - 1)];
            *n += 1;
            out.push_str(&line[..range.start]);
            out.push_str(v);
            out.push_str(&line[range.end..]);
            continue;
        }
        match by_path.get(&path) {
            Some(v) => {
                seen.insert(path);
                out.push_str(&line[..range.start]);
                out.push_str(v);
                out.push_str(&line[range.end..]);
            }
            None if dropped.contains(&path) => {
                // the last line, without a newline: so must the result end
                if !line.ends_with('\n') && out.ends_with('\n') {
                    out.pop();
                    if out.ends_with('\r') {
                        out.pop();
                    }
                }
            }
            None => out.push_str(line),
        }
    }
    let eol = if text.contains("\r\n") { "\r\n" } else { "\n" };
    // a file without a final newline keeps none: new lines go before the end
    let open_end = !text.is_empty() && !text.ends_with('\n');
    let sep = if tight && assignments > 0 { "=" } else { " = " };
    for (k, v) in values {
        if seen.contains(&sysctl_path(k)) {
            continue;
        }
        if !out.is_empty() && !out.ends_with('\n') {
            out.push_str(eol);
        }
        out.push_str(&format!("{k}{sep}{v}{eol}"));
    }
    if open_end && out.len() > text.len() && out.ends_with(eol) {
        out.truncate(out.len() - eol.len());
    }
    let header = DROP_IN_HEADER.trim_end();
    // a byte-order mark before the header is still only the header
    let is_header = |l: &str| l.trim_start_matches('\u{feff}').trim_end() == header;
    let header_only = out.lines().any(is_header)
        && out
            .lines()
            .all(|l| l.trim_start_matches('\u{feff}').trim().is_empty() || is_header(l));
    (!header_only || !values.is_empty()).then_some(out)
}

const DROP_IN_HEADER: &str =
    "# Managed by inplaced: sysctls of the applied NodeSpec. Do not edit.\n";

/// The value systemd-sysctl would set at boot for `key`, and the file it comes from,
/// given the sysctl.d `files` (node path, text) with `overrides` (path → new text, None =
/// deleted) applied.
pub fn boot_value(
    files: &[(String, String)],
    key: &str,
    overrides: &BTreeMap<String, Option<String>>,
) -> Option<(String, String)> {
    let mut files: Vec<(String, String)> = files.to_vec();
    for (p, t) in overrides {
        files.retain(|(q, _)| q != p);
        if let Some(t) = t {
            files.push((p.clone(), t.clone()));
        }
    }
    // systemd-sysctl: by file name across the directories; /etc masks /run masks /usr
    let name = |p: &str| p.rsplit('/').next().unwrap_or_default().to_string();
    let prio = |p: &str| {
        SYSCTL_DIRS
            .iter()
            .position(|d| p.starts_with(d))
            .unwrap_or(99)
    };
    files.sort_by(|a, b| {
        name(&a.0)
            .cmp(&name(&b.0))
            .then(prio(&a.0).cmp(&prio(&b.0)))
    });
    files.dedup_by(|b, a| name(&a.0) == name(&b.0));
    let want = sysctl_path(key);
    let mut found = None;
    for (p, t) in &files {
        for (k, v) in parse_sysctl_conf(t) {
            if sysctl_path(&k) == want {
                found = Some((v, p.clone()));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::sysctl_path;
    use std::collections::BTreeMap;

    #[test]
    fn dotted_and_slashed_forms_map_as_procps_does() {
        let want = "/proc/sys/net/ipv4/conf/eth0.100/rp_filter";
        assert_eq!(sysctl_path("net.ipv4.conf.eth0/100.rp_filter"), want);
        assert_eq!(sysctl_path("net/ipv4/conf/eth0.100/rp_filter"), want);
        assert_eq!(
            sysctl_path("vm.max_map_count"),
            "/proc/sys/vm/max_map_count"
        );
        assert_eq!(
            sysctl_path("vm/max_map_count"),
            "/proc/sys/vm/max_map_count"
        );
        assert_eq!(
            sysctl_path("net.ipv4.conf.bond0/2/3.rp_filter"),
            "/proc/sys/net/ipv4/conf/bond0.2.3/rp_filter"
        );
    }

    /// A reader written from sysctl.d(5) alone: blank lines and lines beginning with `#`
    /// or `;` are ignored, `token = value` with the whitespace around token and value
    /// ignored, a leading `-` only marks failures as ignored; the last assignment wins.
    fn sysctl_d_reads(text: &str) -> std::collections::BTreeMap<String, String> {
        let mut m = std::collections::BTreeMap::new();
        for line in text.lines() {
            let l = line.trim();
            if l.is_empty() || l.starts_with('#') || l.starts_with(';') {
                continue;
            }
            if let Some((k, v)) = l.split_once('=') {
                let k = k.trim();
                let k = k.strip_prefix('-').unwrap_or(k).trim();
                m.insert(super::sysctl_path(k), v.trim().to_string());
            }
        }
        m
    }

    fn line() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            Just("# a comment\n".to_string()),
            Just("; another comment = not a key\n".to_string()),
            Just("\n".to_string()),
            Just("   # indented comment\n".to_string()),
            Just("vm.swappiness=10\n".to_string()),
            Just("-net.ipv4.conf.all.rp_filter = 2\n".to_string()),
            Just("  kernel.panic =  10  \n".to_string()),
            Just("net/core/somaxconn = 4096\n".to_string()),
            Just("fs.inotify.max_user_watches\t=\t524288\n".to_string()),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// Issue 20 §1 for the sysctl drop-in: over generated sysctl.d(5) layouts, an
        /// edit keeps every line it does not change, sysctl.d's reading gives the
        /// intended values, and dropping the keys again gives the original bytes.
        #[test]
        fn drop_in_edits_keep_bytes_and_revert_exactly(
            lines in proptest::collection::vec(line(), 0..7),
            crlf in proptest::prelude::any::<bool>(),
            no_final_newline in proptest::prelude::any::<bool>(),
            new in proptest::collection::btree_map(
                proptest::sample::select(vec!["net.ipv4.ip_forward", "kernel.pid_max", "net.ipv4.ip_local_port_range"]),
                proptest::sample::select(vec!["1", "4194304", "32768\t60999", "0"]),
                1..3,
            ),
        ) {
            let mut text: String = lines.concat();
            if crlf {
                text = text.replace('\n', "\r\n");
            }
            if no_final_newline && text.ends_with('\n') && !text.ends_with("\r\n") {
                text.pop();
            }
            let values: BTreeMap<String, String> =
                new.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            let out = super::edit_sysctl_conf(Some(&text), &values, &BTreeMap::new(), &[]).unwrap();
            // (a) every original line is still there, in order, byte for byte
            let body = text.trim_end_matches(['\r', '\n']);
            proptest::prop_assert!(out.starts_with(body), "{:?} -> {:?}", text, out);
            if text.contains("\r\n") {
                proptest::prop_assert!(!out.replace("\r\n", "").contains('\n'));
            }
            // (b) systemd-sysctl reads the intended values, and the others unchanged
            let before = sysctl_d_reads(&text);
            let after = sysctl_d_reads(&out);
            for (k, v) in &values {
                proptest::prop_assert_eq!(after.get(&super::sysctl_path(k)), Some(v));
            }
            for (k, v) in &before {
                proptest::prop_assert_eq!(after.get(k), Some(v));
            }
            // an edit of a value in place keeps the line's layout
            let changed: BTreeMap<String, String> =
                values.keys().map(|k| (k.clone(), "7".to_string())).collect();
            let again = super::edit_sysctl_conf(Some(&out), &changed, &BTreeMap::new(), &[]).unwrap();
            proptest::prop_assert_eq!(again.len() + values.values().map(|v| v.len()).sum::<usize>(), out.len() + values.len());
            // (c) dropping the keys gives the original bytes back
            let dropped: Vec<String> = values.keys().cloned().collect();
            let back = super::edit_sysctl_conf(Some(&out), &BTreeMap::new(), &BTreeMap::new(), &dropped);
            let back = back.unwrap_or_default();
            proptest::prop_assert_eq!(&back, &text);
        }
    }

    #[test]
    fn drop_in_line_styles() {
        let v = |k: &str, x: &str| BTreeMap::from([(k.to_string(), x.to_string())]);
        let text = "# keep\r\n-kernel.panic =  5  \r\nvm.swappiness=10\r\n";
        assert_eq!(
            super::edit_sysctl_conf(Some(text), &v("kernel/panic", "10"), &BTreeMap::new(), &[])
                .unwrap(),
            "# keep\r\n-kernel.panic =  10  \r\nvm.swappiness=10\r\n"
        );
        // new keys follow a file written without spaces, else canonical
        assert_eq!(
            super::edit_sysctl_conf(Some("a.b=1"), &v("c.d", "2"), &BTreeMap::new(), &[]).unwrap(),
            "a.b=1\nc.d=2"
        );
        assert_eq!(
            super::edit_sysctl_conf(None, &v("c.d", "2"), &BTreeMap::new(), &[]).unwrap(),
            super::render_sysctl_conf(&v("c.d", "2"))
        );
        let ours = super::render_sysctl_conf(&v("c.d", "2"));
        assert_eq!(
            super::edit_sysctl_conf(
                Some(&ours),
                &BTreeMap::new(),
                &BTreeMap::new(),
                &["c.d".into()]
            ),
            None
        );
    }

    /// A byte-order mark (issue 27 §6 class): kept, the edit made as without it; glued to
    /// an assignment, that line is read as the consumers read it (another key).
    #[test]
    fn a_byte_order_mark_is_kept_and_the_edit_made_as_without_it() {
        use super::{edit_sysctl_conf, parse_sysctl_conf};
        let values = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let plain = "# Managed by inplaced: sysctls of the applied NodeSpec. Do not edit.\nvm.swappiness = 10\n";
        let bom = format!("\u{feff}{plain}");
        let none = BTreeMap::new();
        // replaced in place
        let want = values(&[("vm.swappiness", "20")]);
        let got = edit_sysctl_conf(Some(&bom), &want, &none, &[]).unwrap();
        let plain_got = edit_sysctl_conf(Some(plain), &want, &none, &[]).unwrap();
        assert_eq!(got, format!("\u{feff}{plain_got}"));
        assert_eq!(plain_got, plain.replace("= 10", "= 20"));
        // inserted
        let want = values(&[("vm.swappiness", "10"), ("vm.max_map_count", "262144")]);
        let got = edit_sysctl_conf(Some(&bom), &want, &none, &[]).unwrap();
        assert_eq!(got, format!("{bom}vm.max_map_count = 262144\n"));
        // dropped to the header alone: the agent's file is deleted, mark or not
        let dropped = ["vm.swappiness".to_string()];
        assert_eq!(
            edit_sysctl_conf(Some(&bom), &BTreeMap::new(), &none, &dropped),
            None
        );
        // glued to an assignment: procps and systemd-sysctl read the key with the mark
        // (no such sysctl), and so does the parser; the managed key gets its own line
        let glued = "\u{feff}vm.swappiness = 10\n";
        assert_eq!(
            parse_sysctl_conf(glued).keys().collect::<Vec<_>>(),
            ["\u{feff}vm.swappiness"]
        );
        let got =
            edit_sysctl_conf(Some(glued), &values(&[("vm.swappiness", "30")]), &none, &[]).unwrap();
        assert_eq!(got, format!("{glued}vm.swappiness = 30\n"));
    }
}
