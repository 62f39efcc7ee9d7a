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
    let mut s =
        String::from("# Managed by inplaced: sysctls of the applied NodeSpec. Do not edit.\n");
    for (k, v) in values {
        s.push_str(&format!("{k} = {v}\n"));
    }
    s
}

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
}
