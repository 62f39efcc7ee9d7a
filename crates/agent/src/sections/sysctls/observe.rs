//! What the `sysctls` section observes: the live values under `/proc/sys` and the
//! sysctl.d files systemd-sysctl would read.

use std::collections::BTreeMap;

use crate::sections::kit::observe::{
    NodeView, ObserveError, TextObs, Unknown, list_dir_following, observe_running, observe_text,
    read_string_following,
};
use crate::sections::model::Observed;
use crate::state::Original;
use inplace_formats::sysctl::{SYSCTL_DIRS, is_sysctl_conf, parse_sysctl_conf, sysctl_path};
use inplace_node::sysroot::{Kind, Sysroot, SysrootError};

/// A live kernel parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlLive {
    /// Current value (trailing newline removed); meaningless when `unknown` is set.
    pub value: String,
    /// Whether the file under /proc/sys is writable at all.
    pub writable: bool,
    /// The file exists but its value could not be read, or read empty (a kernel
    /// parameter always has a value): why. A change of the key is then not covered.
    pub unknown: Option<Unknown>,
}

/// Sysctls as observed.
#[derive(Debug, Clone, Default)]
pub struct SysctlObs {
    /// Live values of the managed keys and of the keys of managed sysctl.d files
    /// (None = no such kernel parameter).
    pub live: BTreeMap<String, Option<SysctlLive>>,
    /// The agent's drop-in.
    pub drop_in: Option<TextObs>,
    /// Every sysctl.d file systemd-sysctl would read, in the order it applies them
    /// (node path, text); for a repeated name the /etc copy masks /run and /usr/lib.
    pub files: Vec<(String, String)>,
    /// sysctl.d directories and files that could not be read: what each of them would set
    /// at boot is unknown, so no key's boot value can be told.
    pub unreadable: Vec<Unknown>,
    /// The sysctl.d files of `files` that are symlinks (or under one), with the node path
    /// they resolve to, when the spec has `files` items: systemd-sysctl reads the target,
    /// which such an item may write (issue 27 §3). Empty otherwise.
    pub targets: BTreeMap<String, String>,
}

/// Reads the live value of `key` (None: no such kernel parameter).
pub(crate) fn read_live(root: &Sysroot, key: &str) -> Result<Option<SysctlLive>, SysrootError> {
    let p = sysctl_path(key);
    if inplace_node::sysroot::components(&p).is_err() {
        return Ok(None);
    }
    let entry = match root.stat(&p) {
        Ok(Some(e)) if e.kind == Kind::File => e,
        Ok(_) | Err(SysrootError::Symlink { .. }) | Err(SysrootError::NotADirectory { .. }) => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    // unknown is not empty: a value that can not be read, or reads empty, is unknown
    let (value, unknown) = match observe_running(root, &p) {
        Ok(v) => (v.trim_end_matches('\n').to_string(), None),
        Err(u) => (String::new(), Some(u)),
    };
    Ok(Some(SysctlLive {
        value,
        writable: entry.mode & 0o222 != 0,
        unknown,
    }))
}

/// Every sysctl.d file systemd-sysctl would read (the first of each name, by directory
/// priority), with its text, and the directories and files that could not be read (not
/// skipped as if empty: unknown is not empty, issue 20 §2). An absent directory, or a file
/// gone between the listing and the read, is simply not there.
fn sysctl_files(root: &Sysroot) -> (Vec<(String, String)>, Vec<Unknown>) {
    let mut by_name: BTreeMap<String, String> = BTreeMap::new();
    let mut unreadable = Vec::new();
    let unknown = |source: &str, e: &dyn std::fmt::Display| Unknown {
        source: source.to_string(),
        why: e.to_string(),
    };
    for dir in SYSCTL_DIRS {
        match list_dir_following(root, dir) {
            Ok(names) => {
                for n in names.unwrap_or_default() {
                    if n.ends_with(".conf") {
                        by_name
                            .entry(n.clone())
                            .or_insert_with(|| format!("{dir}/{n}"));
                    }
                }
            }
            Err(e) => unreadable.push(unknown(dir, &e)),
        }
    }
    let mut files = Vec::new();
    for (_, p) in by_name {
        match read_string_following(root, &p) {
            Ok(Some(text)) => files.push((p, text)),
            Ok(None) => {}
            Err(e) => unreadable.push(unknown(&p, &e)),
        }
    }
    (files, unreadable)
}

/// The node path the sysctl.d file `p` resolves to, when a symlink is on the way (its
/// own name or a parent directory); None when it is `p` itself or can not be resolved.
/// A regular file found with no symlink followed (its parents opened `O_NOFOLLOW`, the
/// name not followed) has no link on the way: one `stat`, where the resolution reads
/// every component's link (issue 28).
fn link_target(root: &Sysroot, p: &str) -> Option<String> {
    if let Ok(Some(e)) = root.stat(p)
        && e.kind == Kind::File
    {
        return None;
    }
    root.resolve(p).ok().filter(|t| t != p)
}

/// Every key whose live value the plan reads: managed, recorded, or set by a sysctl.d
/// file (on the node, in the spec, or an original about to be restored).
fn keys_in_play(node: &NodeView<'_>, obs: &Observed, files: &[(String, String)]) -> Vec<String> {
    let (desired, record) = (node.desired, node.record);
    let mut keys: Vec<String> = desired
        .sysctls
        .keys()
        .chain(record.sysctls.keys())
        .cloned()
        .collect();
    for f in &desired.files {
        if is_sysctl_conf(&f.path) {
            keys.extend(parse_sysctl_conf(&String::from_utf8_lossy(&f.content)).into_keys());
        }
    }
    for (_, t) in files {
        keys.extend(parse_sysctl_conf(t).into_keys());
    }
    // originals about to be restored
    for (path, m) in &record.files {
        if let (true, Original::Saved { backup, .. }) = (is_sysctl_conf(path), &m.original)
            && let Some(b) = obs.originals.get(backup)
        {
            keys.extend(parse_sysctl_conf(&String::from_utf8_lossy(b)).into_keys());
        }
    }
    keys
}

/// Reads the sysctl.d files, the live values of every key in play and the agent's
/// drop-in, when the spec or the record has sysctls or sysctl.d files. Runs after the file
/// machinery's observation: the originals about to be restored are read already.
pub(super) fn read(node: &NodeView<'_>, obs: &mut Observed) -> Result<(), ObserveError> {
    let (desired, record) = (node.desired, node.record);
    let files_in_play = desired.files.iter().any(|f| is_sysctl_conf(&f.path))
        || record.files.keys().any(|p| is_sysctl_conf(p));
    if desired.sysctls.is_empty() && record.sysctls.is_empty() && !files_in_play {
        return Ok(());
    }
    let (files, unreadable) = sysctl_files(node.root);
    let keys = keys_in_play(node, obs, &files);
    obs.unknown.extend(unreadable.iter().cloned());
    let mut targets = BTreeMap::new();
    if !desired.files.is_empty() {
        for (p, _) in &files {
            if let Some(t) = link_target(node.root, p) {
                targets.insert(p.clone(), t);
            }
        }
    }
    let mut sysctls = SysctlObs {
        files,
        unreadable,
        targets,
        ..SysctlObs::default()
    };
    for key in keys {
        if let std::collections::btree_map::Entry::Vacant(e) = sysctls.live.entry(key) {
            let v = read_live(node.root, e.key())?;
            e.insert(v);
        }
    }
    sysctls.drop_in = Some(observe_text(node.root, &node.config.sysctl.drop_in)?);
    obs.unknown.extend(
        sysctls
            .live
            .values()
            .flatten()
            .filter_map(|l| l.unknown.clone()),
    );
    obs.sysctls = sysctls;
    Ok(())
}
