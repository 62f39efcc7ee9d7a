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
/// use inplaced::ntp;
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
/// the first word; `!`, `;`, `#` and `%` start comments).
fn is_source_line(line: &str) -> bool {
    let mut words = line.split_whitespace();
    matches!(words.next(), Some("server" | "pool"))
}

/// chrony.conf with its `server` and `pool` lines replaced by one `server <name> iburst`
/// line per server, at the position of the first such line (appended at the end when
/// there is none); every other byte unchanged, line endings included.
///
/// ```
/// let text = "# c\npool 2.pool.ntp.org iburst\ndriftfile /x\nserver a\n";
/// let out = inplaced::ntp::chrony_edit(text, &["n1".into(), "n2".into()]);
/// assert_eq!(out, "# c\nserver n1 iburst\nserver n2 iburst\ndriftfile /x\n");
/// ```
pub fn chrony_edit(text: &str, servers: &[String]) -> String {
    let ours: String = servers
        .iter()
        .map(|s| format!("server {s} iburst\n"))
        .collect();
    let mut out = String::with_capacity(text.len() + ours.len());
    let mut placed = false;
    for line in text.split_inclusive('\n') {
        if is_source_line(line) {
            if !placed {
                out.push_str(&ours);
                placed = true;
            }
            continue;
        }
        out.push_str(line);
    }
    if !placed {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&ours);
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn chrony_keeps_every_other_byte() {
        let text = "a\r\nserver x iburst\r\n  pool p  maxsources 4\nserverx\n# server c\nb";
        let out = chrony_edit(text, &s(&["n1"]));
        assert_eq!(out, "a\r\nserver n1 iburst\nserverx\n# server c\nb");
        let appended = chrony_edit("driftfile /d", &s(&["n1", "n2"]));
        assert_eq!(
            appended,
            "driftfile /d\nserver n1 iburst\nserver n2 iburst\n"
        );
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
}
