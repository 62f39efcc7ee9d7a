//! Time sources: what cloud-init's `ntp` module configures, done in place.
//!
//! The node's time daemon is detected from its files ([`detect`]): chrony when its config
//! exists (`/etc/chrony.conf` on RHEL and Fedora, unit `chronyd.service`;
//! `/etc/chrony/chrony.conf` on Debian and Ubuntu, unit `chrony.service`), else
//! systemd-timesyncd when its binary or config exists. For chrony the config is edited
//! faithfully ([`chrony_edit`]); for timesyncd the agent writes its own drop-in
//! ([`timesyncd_dropin`]). Everything here is pure: the caller does the I/O.

/// chrony's config on RHEL, CentOS and Fedora.
pub const CHRONY_RHEL: &str = "/etc/chrony.conf";
/// chrony's config on Debian and Ubuntu.
pub const CHRONY_DEBIAN: &str = "/etc/chrony/chrony.conf";
/// Files whose presence means systemd-timesyncd is installed.
pub const TIMESYNCD_MARKERS: &[&str] = &[
    "/usr/lib/systemd/systemd-timesyncd",
    "/lib/systemd/systemd-timesyncd",
    "/etc/systemd/timesyncd.conf",
];
/// The drop-in the agent writes for systemd-timesyncd.
pub const TIMESYNCD_DROPIN: &str = "/etc/systemd/timesyncd.conf.d/inplaced-ntp.conf";
/// systemd-timesyncd's unit.
pub const TIMESYNCD_UNIT: &str = "systemd-timesyncd.service";

/// Every path the agent may write for the `ntp` section, whatever the daemon.
pub const PATHS: &[&str] = &[CHRONY_RHEL, CHRONY_DEBIAN, TIMESYNCD_DROPIN];

/// A detected time daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    /// `chrony` or `systemd-timesyncd`.
    pub name: &'static str,
    /// The file the agent writes: chrony's config, or the timesyncd drop-in.
    pub path: &'static str,
    /// The unit restarted after a change.
    pub unit: &'static str,
    /// Why this daemon was chosen (the file found).
    pub evidence: String,
}

impl Daemon {
    /// True for chrony (config edited in place), false for timesyncd (own drop-in).
    pub fn edits_in_place(&self) -> bool {
        self.name == "chrony"
    }
}

/// Picks the time daemon given which node paths exist. Errors say what was looked for.
///
/// ```
/// use inplace_formats::ntp;
/// let d = ntp::detect(|p| p == "/etc/chrony/chrony.conf").unwrap();
/// assert_eq!(d.unit, "chrony.service");
/// assert!(ntp::detect(|_| false).unwrap_err().contains("/etc/chrony.conf"));
/// ```
pub fn detect(exists: impl Fn(&str) -> bool) -> Result<Daemon, String> {
    if exists(CHRONY_RHEL) {
        return Ok(Daemon {
            name: "chrony",
            path: CHRONY_RHEL,
            unit: "chronyd.service",
            evidence: format!("chrony: {CHRONY_RHEL} exists"),
        });
    }
    if exists(CHRONY_DEBIAN) {
        return Ok(Daemon {
            name: "chrony",
            path: CHRONY_DEBIAN,
            unit: "chrony.service",
            evidence: format!("chrony: {CHRONY_DEBIAN} exists"),
        });
    }
    if let Some(m) = TIMESYNCD_MARKERS.iter().find(|m| exists(m)) {
        return Ok(Daemon {
            name: "systemd-timesyncd",
            path: TIMESYNCD_DROPIN,
            unit: TIMESYNCD_UNIT,
            evidence: format!("systemd-timesyncd: {m} exists"),
        });
    }
    Err(format!(
        "no time daemon found on this node: looked for chrony ({CHRONY_RHEL}, {CHRONY_DEBIAN}) and systemd-timesyncd ({}); install one, or drop ntp from the spec",
        TIMESYNCD_MARKERS.join(", ")
    ))
}

/// The unit to restart when the agent's file at `path` changes (None for other paths).
pub fn unit_for_path(path: &str) -> Option<&'static str> {
    match path {
        CHRONY_RHEL => Some("chronyd.service"),
        CHRONY_DEBIAN => Some("chrony.service"),
        TIMESYNCD_DROPIN => Some(TIMESYNCD_UNIT),
        _ => None,
    }
}

/// True for a chrony `server` or `pool` directive line (chrony.conf(5): the directive is
/// the first word, matched without regard to case as chronyd's `strcasecmp` does; `!`,
/// `;`, `#` and `%` start comments, so such lines are never directives).
fn is_source_line(line: &str) -> bool {
    let mut words = line.split_whitespace();
    words
        .next()
        .is_some_and(|w| w.eq_ignore_ascii_case("server") || w.eq_ignore_ascii_case("pool"))
}

/// The name a `server`/`pool` line names (its second word).
fn source_name(line: &str) -> Option<&str> {
    line.split_whitespace().nth(1)
}

/// chrony.conf with its `server` and `pool` lines replaced by one line per server, at
/// the position of the first such line (appended at the end when there is none); every
/// other byte unchanged (comments, `include`/`confdir`/`sourcedir` lines, a missing final
/// newline stays missing).
///
/// A server that a `server` line already names keeps that line byte for byte (its
/// options: `iburst prefer maxpoll 6`); a new one is written canonically as
/// `server <name> iburst`. New lines end as the file's lines do (`\r\n` when the file
/// uses it).
///
/// ```
/// let text = "# c\npool 2.pool.ntp.org iburst\ndriftfile /x\nserver a\n";
/// let out = inplace_formats::ntp::chrony_edit(text, &["n1".into(), "a".into()]);
/// assert_eq!(out, "# c\nserver n1 iburst\nserver a\ndriftfile /x\n");
/// ```
pub fn chrony_edit(text: &str, servers: &[String]) -> String {
    let eol = if text.contains("\r\n") { "\r\n" } else { "\n" };
    let kept = |name: &str| {
        text.split_inclusive('\n').find(|l| {
            is_source_line(l)
                && l.split_whitespace()
                    .next()
                    .is_some_and(|w| w.eq_ignore_ascii_case("server"))
                && source_name(l) == Some(name)
        })
    };
    let mut ours = String::new();
    for s in servers {
        match kept(s) {
            Some(l) if l.ends_with('\n') => ours.push_str(l),
            Some(l) => {
                ours.push_str(l);
                ours.push_str(eol);
            }
            None => {
                ours.push_str(&format!("server {s} iburst"));
                ours.push_str(eol);
            }
        }
    }
    let mut out = String::with_capacity(text.len() + ours.len());
    let mut placed = false;
    let mut last_was_source = false;
    let mut ours_end = usize::MAX;
    for line in text.split_inclusive('\n') {
        last_was_source = is_source_line(line);
        if last_was_source {
            if !placed {
                out.push_str(&ours);
                ours_end = out.len();
                placed = true;
            }
            continue;
        }
        out.push_str(line);
    }
    if !placed {
        let open_end = !out.is_empty() && !out.ends_with('\n');
        if open_end {
            out.push_str(eol);
        }
        out.push_str(&ours);
        if open_end {
            // no final newline before: none after
            out.truncate(out.len() - eol.len());
        }
    } else if last_was_source && !text.ends_with('\n') && out.len() == ours_end {
        // the file ended in a source line without a newline: so does the result
        out.truncate(out.len() - eol.len());
    }
    out
}

/// Refuses to edit a chrony config that starts with a UTF-8 byte-order mark (issue 27 §6
/// class): chronyd does not skip the mark. chrony's `conf.c` reads each line through
/// `CPS_NormalizeLine`, which strips only whitespace and knows a comment only by its
/// first character, so line 1 is the directive `\u{feff}<word>` ("Invalid directive at
/// line 1", which is fatal: chronyd does not start with the file as it is, comment or
/// not). The file is left unchanged; the error names it, why, and the fix.
///
/// ```
/// use inplace_formats::ntp::chrony_refuse_bom;
/// assert!(chrony_refuse_bom("/etc/chrony.conf", "pool a iburst\n").is_ok());
/// let e = chrony_refuse_bom("/etc/chrony.conf", "\u{feff}pool a iburst\n").unwrap_err();
/// assert!(e.contains("byte-order mark"), "{e}");
/// ```
pub fn chrony_refuse_bom(path: &str, text: &str) -> Result<(), String> {
    match text.strip_prefix('\u{feff}') {
        None => Ok(()),
        Some(rest) => Err(format!(
            "{path} starts with a UTF-8 byte-order mark (EF BB BF), which chronyd does not skip: it reads line 1 ({:?}) as the directive \"\\u{{feff}}{}\" and stops with \"Invalid directive at line 1\" (a comment too, chrony knows one only by its first character); nothing was changed: remove the byte-order mark",
            rest.lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(40)
                .collect::<String>(),
            rest.split_whitespace().next().unwrap_or("")
        )),
    }
}

/// The time sources a chrony config or timesyncd drop-in names, in order: the second word
/// of `server`/`pool` lines, or the words of `NTP=` lines. Used for report summaries.
pub fn servers_in(path: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        if path == TIMESYNCD_DROPIN {
            if let Some(v) = line.trim().strip_prefix("NTP=") {
                out = v.split_whitespace().map(String::from).collect();
            }
        } else if is_source_line(line) {
            out.extend(line.split_whitespace().nth(1).map(String::from));
        }
    }
    out
}

/// The agent's systemd-timesyncd drop-in: `[Time]` with `NTP=` listing the servers.
pub fn timesyncd_dropin(servers: &[String]) -> String {
    format!("[Time]\nNTP={}\n", servers.join(" "))
}

/// True when `pattern` has a glob(7) wildcard (`*`, `?` or `[`): chrony's `include`
/// expands such a pattern with glob(3).
pub fn has_wildcard(pattern: &str) -> bool {
    pattern.contains(['*', '?', '['])
}

/// One path component matched as glob(3) matches it (fnmatch(3) with `FNM_PERIOD`, no
/// `GLOB_PERIOD`): `*` any run, `?` one character, `[...]` a class with ranges and a
/// leading `!` or `^` negation; a leading `.` of `name` matches only a literal `.`.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    if name.starts_with('.') && !pattern.starts_with('.') {
        return false;
    }
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    glob_at(&p, &n)
}

fn glob_at(p: &[char], n: &[char]) -> bool {
    match p.first() {
        None => n.is_empty(),
        Some('*') => (0..=n.len()).any(|i| glob_at(&p[1..], &n[i..])),
        Some('?') => !n.is_empty() && glob_at(&p[1..], &n[1..]),
        Some('[') => match (class(&p[1..]), n.first()) {
            (Some((hit, len)), Some(c)) => hit(*c) && glob_at(&p[1 + len..], &n[1..]),
            (None, Some('[')) => glob_at(&p[1..], &n[1..]),
            _ => false,
        },
        Some(c) => n.first() == Some(c) && glob_at(&p[1..], &n[1..]),
    }
}

/// A bracket expression after its `[`: the matcher and how many characters it spans
/// (through the closing `]`); None when it never closes (then `[` is literal).
#[allow(clippy::type_complexity)]
fn class(p: &[char]) -> Option<(Box<dyn Fn(char) -> bool>, usize)> {
    let neg = matches!(p.first(), Some('!' | '^'));
    let start = usize::from(neg);
    // a `]` right after the opening (or the negation) is a member
    let close = p
        .iter()
        .enumerate()
        .skip(start + 1)
        .find(|(_, c)| **c == ']')
        .map(|(i, _)| i)?;
    let body: Vec<char> = p[start..close].to_vec();
    let hit = move |c: char| {
        let mut i = 0;
        let mut found = false;
        while i < body.len() {
            if i + 2 < body.len() && body[i + 1] == '-' {
                found |= body[i] <= c && c <= body[i + 2];
                i += 3;
            } else {
                found |= body[i] == c;
                i += 1;
            }
        }
        found != neg
    };
    Some((Box::new(hit), close + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn globs_match_as_glob3_does() {
        assert!(glob_match("*.conf", "10-a.conf"));
        assert!(!glob_match("*.conf", "10-a.conf.disabled"));
        assert!(!glob_match("*.conf", ".hidden.conf"));
        assert!(glob_match(".*.conf", ".hidden.conf"));
        assert!(glob_match("[0-9]?-*.sources", "10-site.sources"));
        assert!(!glob_match("[!0-9]*", "10-site"));
        assert!(glob_match("[]a]x", "]x"));
        assert!(glob_match("a[b", "a[b"));
        assert!(has_wildcard("/etc/chrony/*.conf") && !has_wildcard("/etc/chrony.keys"));
    }

    #[test]
    fn chrony_keeps_every_other_byte() {
        let text = "a\r\nserver x iburst\r\n  pool p  maxsources 4\nserverx\n# server c\nb";
        let out = chrony_edit(text, &s(&["n1"]));
        assert_eq!(out, "a\r\nserver n1 iburst\r\nserverx\n# server c\nb");
        // case-insensitive directives; a named server keeps its line and options
        let text = "SERVER a iburst\nServer b prefer maxpoll 6\ninclude /etc/chrony.d/*.conf\n";
        let out = chrony_edit(text, &s(&["b", "c"]));
        assert_eq!(
            out,
            "Server b prefer maxpoll 6\nserver c iburst\ninclude /etc/chrony.d/*.conf\n"
        );
        assert_eq!(chrony_edit("x\nserver a", &s(&["b"])), "x\nserver b iburst");
        let appended = chrony_edit("driftfile /d", &s(&["n1", "n2"]));
        assert_eq!(appended, "driftfile /d\nserver n1 iburst\nserver n2 iburst");
        assert_eq!(chrony_edit("", &s(&["n1"])), "server n1 iburst\n");
    }

    #[test]
    fn detection_order() {
        let both = |p: &str| p == CHRONY_RHEL || p == "/etc/systemd/timesyncd.conf";
        assert_eq!(detect(both).unwrap().unit, "chronyd.service");
        let ts = detect(|p| p == "/lib/systemd/systemd-timesyncd").unwrap();
        assert_eq!((ts.path, ts.unit), (TIMESYNCD_DROPIN, TIMESYNCD_UNIT));
    }

    #[test]
    fn servers_listed() {
        assert_eq!(
            servers_in(CHRONY_RHEL, "server a iburst\npool b\n#server c\n"),
            s(&["a", "b"])
        );
        assert_eq!(
            servers_in(TIMESYNCD_DROPIN, &timesyncd_dropin(&s(&["a", "b"]))),
            s(&["a", "b"])
        );
    }

    fn chrony_line() -> impl proptest::strategy::Strategy<Value = &'static str> {
        proptest::sample::select(vec![
            "# server commented.example iburst\n",
            "! pool bang.example\n",
            "; semicolon comment\n",
            "% percent comment\n",
            "\n",
            "include /etc/chrony.d/*.conf\n",
            "confdir /etc/chrony.d\n",
            "sourcedir /run/chrony-dhcp\n",
            "driftfile /var/lib/chrony/drift\n",
            "makestep 1.0 3\n",
            "server a.example iburst\n",
            "Pool 2.pool.ntp.org iburst maxsources 4\n",
            "server b.example prefer maxpoll 6\n",
            "  server c.example   iburst  \n",
        ])
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// Issue 20 §1 for chrony.conf: over generated layouts chronyd accepts, every
        /// line that is not a `server`/`pool` directive stays byte for byte and in order,
        /// chronyd's sources are exactly the desired servers in order (a server already
        /// named keeps its line and options), and planning again changes nothing. The
        /// revert restores the saved original file (tests/files.rs checks the bytes).
        #[test]
        fn chrony_layouts_keep_bytes(
            lines in proptest::collection::vec(chrony_line(), 0..8),
            crlf in proptest::prelude::any::<bool>(),
            no_final_newline in proptest::prelude::any::<bool>(),
            servers in proptest::sample::subsequence(vec!["b.example", "n1.example", "a.example", "n2.example"], 1..4),
        ) {
            let mut text: String = lines.concat();
            if crlf {
                text = text.replace('\n', "\r\n");
            }
            if no_final_newline {
                text = text.trim_end_matches(['\r', '\n']).to_string();
            }
            let servers: Vec<String> = servers.iter().map(|s| s.to_string()).collect();
            let out = chrony_edit(&text, &servers);
            let others = |t: &str| -> Vec<String> {
                t.split_inclusive('\n')
                    .filter(|l| !is_source_line(l))
                    .map(|l| l.trim_end_matches(['\r', '\n']).to_string())
                    .collect()
            };
            // (a) the other lines, in order and byte for byte; the line endings
            proptest::prop_assert_eq!(others(&out), others(&text));
            if text.contains("\r\n") {
                proptest::prop_assert!(!out.replace("\r\n", "").contains('\n'), "{:?}", out);
            }
            if !text.lines().last().is_some_and(is_source_line) {
                proptest::prop_assert_eq!(out.ends_with('\n'), text.ends_with('\n') || text.is_empty());
            }
            // (b) chronyd's sources: the desired servers, a named one with its own line
            let sources: Vec<&str> = out.lines().filter(|l| is_source_line(l)).collect();
            let names: Vec<&str> = sources.iter().filter_map(|l| source_name(l)).collect();
            proptest::prop_assert_eq!(&names, &servers.iter().map(String::as_str).collect::<Vec<_>>());
            for l in &sources {
                if let Some(orig) = text.lines().find(|o| is_source_line(o) && o.starts_with("server") && source_name(o) == source_name(l)) {
                    proptest::prop_assert_eq!(*l, orig);
                }
            }
            // (c) a second plan is a no-op
            proptest::prop_assert_eq!(chrony_edit(&out, &servers), out);
        }
    }

    /// A byte-order mark: chronyd would stop at line 1, so the edit is refused naming the
    /// mark and the file's first line; without it the same text is edited.
    #[test]
    fn a_byte_order_mark_is_refused_for_chronyds_reason() {
        let plain = "# Use public servers\npool 2.pool.ntp.org iburst\n";
        let e = chrony_refuse_bom(CHRONY_RHEL, &format!("\u{feff}{plain}")).unwrap_err();
        assert_eq!(
            e,
            "/etc/chrony.conf starts with a UTF-8 byte-order mark (EF BB BF), which chronyd does not skip: it reads line 1 (\"# Use public servers\") as the directive \"\\u{feff}#\" and stops with \"Invalid directive at line 1\" (a comment too, chrony knows one only by its first character); nothing was changed: remove the byte-order mark"
        );
        assert_eq!(chrony_refuse_bom(CHRONY_RHEL, plain), Ok(()));
        // a mark anywhere else is no concern of chronyd's first line
        assert_eq!(chrony_refuse_bom(CHRONY_RHEL, "# a \u{feff}\n"), Ok(()));
    }
}
