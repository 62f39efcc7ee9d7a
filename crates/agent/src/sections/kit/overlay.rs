//! The node as the spec's `files` items leave it (issue 27 §3): the file machinery
//! writes (and reverts) whole files before any section's own steps run, so a section
//! whose consumer reads other files (a grub.d fragment, a sysctl.d file, a kubelet
//! `--config-dir` drop-in or unit drop-in, a chrony `confdir` file, a timesyncd drop-in)
//! must plan against those files as the operation will leave them, not as they are now.
//! Otherwise a combination is reported covered, fails verification and rolls back, and a
//! re-run fails the same way.
//!
//! A section observes such files through [`read_text`] and [`list_dir`], which see a
//! `files` item's content where the spec writes one and the restored original (or
//! nothing) where the record's item leaves the spec; [`written_by`] names the item, so a
//! refusal names both the section's change and the `files` item.

use crate::sections::kit::observe::{NodeView, TextObs};
use crate::sections::model::Observed;
use crate::state::Original;
use inplace_node::sysroot::SysrootError;
use inplace_wire::ids::ChangeId;

/// What the file machinery leaves at `path`: Some(Some(text)) written or restored,
/// Some(None) removed, None when no whole-file item touches it.
fn left(node: &NodeView<'_>, obs: &Observed, path: &str) -> Option<Option<String>> {
    if let Some(f) = node.desired.files.iter().find(|f| f.path == path) {
        return Some(Some(String::from_utf8_lossy(&f.content).into_owned()));
    }
    let m = node.record.files.get(path).filter(|m| m.item.is_none())?;
    match &m.original {
        Original::Absent => Some(None),
        Original::Unchanged => None,
        Original::Saved { backup, .. } => obs
            .originals
            .get(backup)
            .map(|b| Some(String::from_utf8_lossy(b).into_owned())),
    }
}

/// The text of `path` once the operation's file items ran (None: absent then). A symlink
/// is read as its target inside the sysroot, as the consumers read it (chronyd,
/// systemd-timesyncd, systemd's unit and environment files, the kubelet's `--config-dir`
/// all follow links), also when the spec's own items write that target.
pub(crate) fn read_text(
    node: &NodeView<'_>,
    obs: &Observed,
    path: &str,
) -> Result<Option<String>, SysrootError> {
    if let Some(t) = left(node, obs, path) {
        return Ok(t);
    }
    // the common case, a regular file or nothing, from the memo (one stat when unchanged);
    // only what is not (a symlink on the way) is resolved, component by component
    match super::observe::observe_text(node.root, path)? {
        TextObs::Absent => return Ok(None),
        TextObs::Text(t, _) => return Ok(Some(t)),
        TextObs::Problem(_) => {}
    }
    let target = node.root.resolve(path)?;
    if target == path {
        return node.root.read_string(path);
    }
    match left(node, obs, &target) {
        Some(t) => Ok(t),
        None => super::observe::read_string_following(node.root, path),
    }
}

/// The names in `dir` once the operation's file items ran, sorted (None: the directory is
/// absent and no item writes into it).
pub(crate) fn list_dir(
    node: &NodeView<'_>,
    obs: &Observed,
    dir: &str,
) -> Result<Option<Vec<String>>, SysrootError> {
    let dir = dir.trim_end_matches('/');
    let on_node = super::observe::list_dir(node.root, dir)?;
    let in_dir = |p: &str| {
        p.strip_prefix(dir)
            .and_then(|r| r.strip_prefix('/'))
            .filter(|n| !n.is_empty() && !n.contains('/'))
            .map(str::to_string)
    };
    let written: Vec<String> = node
        .desired
        .files
        .iter()
        .filter_map(|f| in_dir(&f.path))
        .collect();
    if on_node.is_none() && written.is_empty() {
        return Ok(None);
    }
    let mut names: Vec<String> = on_node
        .unwrap_or_default()
        .into_iter()
        .filter(|n| left(node, obs, &format!("{dir}/{n}")) != Some(None))
        .chain(written)
        .collect();
    names.sort();
    names.dedup();
    Ok(Some(names))
}

/// The change id of the spec's `files` item that writes `path` (`files[/etc/x]`).
pub(crate) fn written_by(node: &NodeView<'_>, path: &str) -> Option<String> {
    node.desired
        .files
        .iter()
        .any(|f| f.path == path)
        .then(|| ChangeId::File(path.to_string()).to_string())
}

/// `path`, followed by ` (written by files[<path>] in this spec)` when a `files` item of
/// the spec writes it: a refusal then names both items.
pub(crate) fn named(node: &NodeView<'_>, path: &str) -> String {
    match written_by(node, path) {
        Some(id) => format!("{path} (written by {id} in this spec)"),
        None => path.to_string(),
    }
}
