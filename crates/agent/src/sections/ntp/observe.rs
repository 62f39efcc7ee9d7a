//! What the `ntp` section observes: which time daemon the node runs, and its file.

use std::collections::BTreeSet;

use crate::sections::kit::file_items;
use crate::sections::kit::observe::{NodeView, ObserveError};
use crate::sections::kit::overlay;
use crate::sections::model::Observed;
use inplace_formats::ntp::{Daemon, glob_match, has_wildcard};

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
    let found = found.and_then(|d| match other_sources(node, obs, &d) {
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
/// time sources or resets the list; None when there is none. Files are read as the
/// operation's `files` items leave them ([`overlay`]).
fn other_sources(node: &NodeView<'_>, obs: &Observed, d: &Daemon) -> Option<String> {
    if d.edits_in_place() {
        let text = overlay::read_text(node, obs, d.path).ok().flatten()?;
        let mut seen = BTreeSet::new();
        chrony_sources(node, obs, (d.path, &text), &mut seen)
    } else {
        timesyncd_sources(node, obs, d)
    }
}

/// The `*<suffix>` files of `dir` (sorted by name), as paths.
fn files_in(node: &NodeView<'_>, obs: &Observed, dir: &str, suffix: &str) -> Vec<String> {
    let dir = dir.trim_end_matches('/');
    let mut names: Vec<String> = overlay::list_dir(node, obs, dir)
        .ok()
        .flatten()
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.ends_with(suffix) && n.len() > suffix.len())
        .collect();
    names.sort();
    names.into_iter().map(|n| format!("{dir}/{n}")).collect()
}

/// The files of chrony's `confdir` or `sourcedir` `dirs` (chrony.conf(5)): every
/// `*<suffix>` file of the directories, in name order; for a name found in more than one
/// directory only the first directory's file is read.
fn dir_files(node: &NodeView<'_>, obs: &Observed, dirs: &[&str], suffix: &str) -> Vec<String> {
    let mut by_name: std::collections::BTreeMap<String, String> = Default::default();
    for dir in dirs {
        for p in files_in(node, obs, dir, suffix) {
            let name = p.rsplit('/').next().unwrap_or_default().to_string();
            by_name.entry(name).or_insert(p);
        }
    }
    by_name.into_values().collect()
}

/// The paths chrony's `include pattern` reads: glob(3) of the pattern (any component may
/// hold `*`, `?` or `[...]`), sorted as glob sorts them; a pattern without a wildcard is
/// the one path.
fn glob(node: &NodeView<'_>, obs: &Observed, pattern: &str) -> Vec<String> {
    if !has_wildcard(pattern) {
        return vec![pattern.to_string()];
    }
    let mut found = vec![String::new()];
    for part in pattern.split('/').filter(|p| !p.is_empty()) {
        let mut next = Vec::new();
        for base in &found {
            if !has_wildcard(part) {
                next.push(format!("{base}/{part}"));
                continue;
            }
            let dir = if base.is_empty() { "/" } else { base.as_str() };
            for n in overlay::list_dir(node, obs, dir)
                .ok()
                .flatten()
                .unwrap_or_default()
            {
                if glob_match(part, &n) {
                    next.push(format!("{base}/{n}"));
                }
            }
        }
        found = next;
    }
    found.sort();
    found
}

/// How many files chrony's `include`, `confdir` and `sourcedir` are followed into (a
/// loop is cut by the set of files seen).
const MAX_FILES: usize = 256;

/// chrony's other configuration and source files, per chrony.conf(5): `confdir` (its
/// `*.conf` files), `sourcedir` (its `*.sources` files) and `include` (a path or a glob
/// pattern), followed into the files they read. One that names a `server`, `pool` or
/// `peer` adds time sources chrony uses alongside the managed ones.
fn chrony_sources(
    node: &NodeView<'_>,
    obs: &Observed,
    (file, text): (&str, &str),
    seen: &mut BTreeSet<String>,
) -> Option<String> {
    if seen.len() > MAX_FILES || !seen.insert(file.to_string()) {
        return None;
    }
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let Some(directive) = words.next() else {
            continue;
        };
        let args: Vec<&str> = words.collect();
        let files: Vec<String> = match directive {
            "confdir" => dir_files(node, obs, &args, ".conf"),
            "sourcedir" => dir_files(node, obs, &args, ".sources"),
            "include" => args.iter().flat_map(|p| glob(node, obs, p)).collect(),
            _ => continue,
        };
        for f in files {
            let Some(t) = overlay::read_text(node, obs, &f).ok().flatten() else {
                continue;
            };
            let servers = inplace_formats::ntp::servers_in(&f, &t);
            if !servers.is_empty() {
                return Some(format!(
                    "{} (chrony `{directive}` in {file}) adds time sources {}: chrony uses them alongside the managed servers, so they would stay; remove them there, or manage the file under files",
                    overlay::named(node, &f),
                    servers.join(" ")
                ));
            }
            if let Some(why) = chrony_sources(node, obs, (&f, &t), seen) {
                return Some(why);
            }
        }
    }
    None
}

/// systemd-timesyncd's other files that set `NTP=`: the main `timesyncd.conf` and the
/// drop-ins of [`TIMESYNCD_DIRS`] other than the agent's. `NTP=` lists add up across
/// files and an empty `NTP=` resets the list, so a non-empty one adds servers that stay
/// and an empty one after the agent's drop-in drops the managed servers.
fn timesyncd_sources(node: &NodeView<'_>, obs: &Observed, d: &Daemon) -> Option<String> {
    let own = d.path.rsplit('/').next().unwrap_or_default();
    let mut files: std::collections::BTreeMap<String, String> = Default::default();
    for dir in TIMESYNCD_DIRS {
        for p in files_in(node, obs, &format!("{dir}/timesyncd.conf.d"), ".conf") {
            let name = p.rsplit('/').next().unwrap_or_default().to_string();
            files.entry(name).or_insert(p);
        }
    }
    let main = TIMESYNCD_DIRS
        .iter()
        .map(|d| format!("{d}/timesyncd.conf"))
        .find(|p| matches!(overlay::read_text(node, obs, p), Ok(Some(_))));
    let ordered = main.into_iter().map(|p| (String::new(), p)).chain(files);
    for (name, p) in ordered {
        if name == own {
            continue;
        }
        let Some(t) = overlay::read_text(node, obs, &p).ok().flatten() else {
            continue;
        };
        for line in t.lines() {
            let Some(v) = line.trim().strip_prefix("NTP=") else {
                continue;
            };
            let servers: Vec<&str> = v.split_whitespace().collect();
            if !servers.is_empty() {
                return Some(format!(
                    "{} sets NTP={}: systemd-timesyncd adds the NTP= lists of its files, so these servers would stay alongside the managed ones in {}; remove them there",
                    overlay::named(node, &p),
                    servers.join(" "),
                    d.path
                ));
            }
            if name.as_str() > own {
                return Some(format!(
                    "{} resets NTP= after {}, so the managed servers would not be used; remove the line there",
                    overlay::named(node, &p),
                    d.path
                ));
            }
        }
    }
    None
}
