//! What the `ntp` section observes: which time daemon the node runs, and its file.

use crate::sections::kit::file_items;
use crate::sections::kit::observe::{NodeView, ObserveError};
use crate::sections::model::Observed;
use inplace_formats::ntp::Daemon;

/// The time daemon when the spec manages `ntp`: the daemon found, or what was looked for
/// ([`inplace_formats::ntp::detect`]); None when the spec does not manage `ntp`. Its
/// file is observed with the other files ([`Observed::files`]).
pub(crate) type NtpObs = Option<Result<Daemon, String>>;

/// Reads the daemon and its file when the spec manages `ntp`.
pub(super) fn read(node: &NodeView<'_>, obs: &mut Observed) -> Result<(), ObserveError> {
    if node.desired.ntp.is_none() {
        return Ok(());
    }
    // a path that can not be looked at (a symlinked /lib) counts as absent; the other
    // candidates are tried
    let found = inplace_formats::ntp::detect(|p| matches!(node.root.stat(p), Ok(Some(_))));
    if let Ok(d) = &found {
        file_items::observe_into(node, obs, d.path)?;
    }
    // a source the spec does not control that adds to or overrides the managed servers
    // makes the change not covered, naming the file
    let found = found.and_then(|d| match other_sources(node, &d) {
        Some(why) => Err(why),
        None => Ok(d),
    });
    obs.ntp = Some(found);
    Ok(())
}

/// systemd-timesyncd's configuration directories, per timesyncd.conf(5): the main file's
/// and the drop-ins' (`timesyncd.conf.d/*.conf`, a name in an earlier directory masks the
/// same name in a later one; all are read in name order after the main file).
const TIMESYNCD_DIRS: &[&str] = &[
    "/etc/systemd",
    "/run/systemd",
    "/usr/local/lib/systemd",
    "/usr/lib/systemd",
];

/// Why the managed servers would not be the daemon's servers: another file that adds
/// time sources or resets the list; None when there is none.
fn other_sources(node: &NodeView<'_>, d: &Daemon) -> Option<String> {
    if d.edits_in_place() {
        chrony_sources(node, d)
    } else {
        timesyncd_sources(node, d)
    }
}

/// The `*<suffix>` files of `dir` (sorted by name), as paths.
fn files_in(node: &NodeView<'_>, dir: &str, suffix: &str) -> Vec<String> {
    let dir = dir.trim_end_matches('/');
    let mut names: Vec<String> = node
        .root
        .list_dir(dir)
        .ok()
        .flatten()
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.ends_with(suffix) && n.len() > suffix.len())
        .collect();
    names.sort();
    names.into_iter().map(|n| format!("{dir}/{n}")).collect()
}

/// chrony's other configuration and source files, per chrony.conf(5): `confdir` (its
/// `*.conf` files), `sourcedir` (its `*.sources` files) and `include` (a path or a
/// `dir/*suffix` pattern). One that names a `server`, `pool` or `peer` adds time sources
/// chrony uses alongside the managed ones.
fn chrony_sources(node: &NodeView<'_>, d: &Daemon) -> Option<String> {
    let text = node.root.read_string(d.path).ok().flatten()?;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(directive), args) = (words.next(), words) else {
            continue;
        };
        let files: Vec<String> = match directive {
            "confdir" => args.flat_map(|dir| files_in(node, dir, ".conf")).collect(),
            "sourcedir" => args
                .flat_map(|dir| files_in(node, dir, ".sources"))
                .collect(),
            "include" => args
                .flat_map(|pat| match pat.rsplit_once('/') {
                    Some((dir, name)) if name.starts_with('*') => files_in(node, dir, &name[1..]),
                    _ => vec![pat.to_string()],
                })
                .collect(),
            _ => continue,
        };
        for f in files {
            let Some(t) = node.root.read_string(&f).ok().flatten() else {
                continue;
            };
            let servers = inplace_formats::ntp::servers_in(&f, &t);
            if !servers.is_empty() {
                return Some(format!(
                    "{f} (chrony `{directive}` in {}) adds time sources {}: chrony uses them alongside the managed servers, so they would stay; remove them there, or manage the file under files",
                    d.path,
                    servers.join(" ")
                ));
            }
        }
    }
    None
}

/// systemd-timesyncd's other files that set `NTP=`: the main `timesyncd.conf` and the
/// drop-ins of [`TIMESYNCD_DIRS`] other than the agent's. `NTP=` lists add up across
/// files and an empty `NTP=` resets the list, so a non-empty one adds servers that stay
/// and an empty one after the agent's drop-in drops the managed servers.
fn timesyncd_sources(node: &NodeView<'_>, d: &Daemon) -> Option<String> {
    let own = d.path.rsplit('/').next().unwrap_or_default();
    let mut files: std::collections::BTreeMap<String, String> = Default::default();
    for dir in TIMESYNCD_DIRS {
        for p in files_in(node, &format!("{dir}/timesyncd.conf.d"), ".conf") {
            let name = p.rsplit('/').next().unwrap_or_default().to_string();
            files.entry(name).or_insert(p);
        }
    }
    let main = TIMESYNCD_DIRS
        .iter()
        .map(|d| format!("{d}/timesyncd.conf"))
        .find(|p| matches!(node.root.stat(p), Ok(Some(_))));
    let ordered = main.into_iter().map(|p| (String::new(), p)).chain(files);
    for (name, p) in ordered {
        if name == own {
            continue;
        }
        let Some(t) = node.root.read_string(&p).ok().flatten() else {
            continue;
        };
        for line in t.lines() {
            let Some(v) = line.trim().strip_prefix("NTP=") else {
                continue;
            };
            let servers: Vec<&str> = v.split_whitespace().collect();
            if !servers.is_empty() {
                return Some(format!(
                    "{p} sets NTP={}: systemd-timesyncd adds the NTP= lists of its files, so these servers would stay alongside the managed ones in {}; remove them there",
                    servers.join(" "),
                    d.path
                ));
            }
            if name.as_str() > own {
                return Some(format!(
                    "{p} resets NTP= after {}, so the managed servers would not be used; remove the line there",
                    d.path
                ));
            }
        }
    }
    None
}
