//! The observation primitives every section reads the node with: files and text files
//! as observed, running-state values that may be unknown, and the view of the node a
//! section observes through ([`super::Section::observe`]). Each section's own
//! observation type is in its folder (`<x>/observe.rs`); the aggregate is
//! [`crate::sections::model::Observed`].

use crate::config::Config;
use crate::sections::model::NodeSpec;
use crate::state::{AppliedRecord, StateDir, StateError};
use std::sync::Arc;

use inplace_node::sysroot::{Entry, Kind, Sysroot, SysrootError};

/// Largest file the agent reads or writes as a managed file (64 MiB): a node agent must
/// not copy a disk image into memory because a spec named it.
pub(crate) const MAX_FILE_BYTES: u64 = 64 << 20;

/// A file as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileObs {
    /// Absent; parents present or missing (to be created).
    Absent,
    /// A regular file.
    File {
        /// Content.
        content: Vec<u8>,
        /// Metadata.
        entry: Entry,
    },
    /// Can not be written: a parent is a file or symlink, or the path is a dir/symlink, or
    /// it is too large.
    Conflict(String),
}

impl FileObs {
    /// `sha256:<hex>` of the content, `absent`, or the conflict.
    pub fn fingerprint(&self) -> String {
        match self {
            FileObs::File { content, .. } => {
                format!("sha256:{}", inplace_node::digest::sha256_hex(content))
            }
            FileObs::Absent => "absent".into(),
            FileObs::Conflict(c) => c.clone(),
        }
    }
}

/// A text configuration file as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextObs {
    /// Absent.
    Absent,
    /// UTF-8 text with its metadata.
    Text(String, Entry),
    /// Present but unusable (symlink, not UTF-8, too large...), with the reason.
    Problem(String),
}

impl TextObs {
    /// The text and metadata when usable.
    pub fn text(&self) -> Option<(&str, Entry)> {
        match self {
            TextObs::Text(t, e) => Some((t.as_str(), *e)),
            _ => None,
        }
    }

    /// The fingerprint a commit checks before writing (see [`FileObs::fingerprint`]).
    pub fn fingerprint(&self) -> String {
        match self {
            TextObs::Text(t, _) => {
                format!("sha256:{}", inplace_node::digest::sha256_hex(t.as_bytes()))
            }
            TextObs::Absent => "absent".into(),
            TextObs::Problem(p) => p.clone(),
        }
    }
}

/// A running-state observation that could not be made (issue 20 §2): the source is
/// absent, unreadable, or empty where it can not be. Unknown is never read as empty: a
/// change that depends on it is not covered, naming `source` and `why`, and `status`
/// lists it as a problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unknown {
    /// What was read (`/proc/cmdline`).
    pub source: String,
    /// Why it is not known (`it is absent`, `it is empty, which it can not be ...`).
    pub why: String,
}

impl std::fmt::Display for Unknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} could not be read: {}", self.source, self.why)
    }
}

/// A running-state value as observed: the value, or why it is not known.
pub(crate) type Observation<T> = Result<T, Unknown>;

/// Reads a running-state text file that is never empty on a live node (`/proc/cmdline`,
/// a `/proc/sys` value): absent, unreadable, or empty (only whitespace) is [`Unknown`].
pub(crate) fn observe_running(root: &Sysroot, path: &str) -> Observation<String> {
    let unknown = |why: String| Unknown {
        source: path.to_string(),
        why,
    };
    match root.read_string(path) {
        Ok(Some(t)) if !t.trim().is_empty() => Ok(t),
        Ok(Some(_)) => Err(unknown(
            "it is empty, which it never is on a running node".into(),
        )),
        Ok(None) => Err(unknown("it is absent".into())),
        Err(e) => Err(unknown(e.to_string())),
    }
}

/// Errors observing the node (I/O failures other than "absent").
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// Sysroot access failed.
    #[error(transparent)]
    Sysroot(#[from] SysrootError),
    /// State directory access failed.
    #[error(transparent)]
    State(#[from] StateError),
}

/// Observes one file path (never following symlinks, never reading more than
/// [`MAX_FILE_BYTES`]). Kept in the sysroot's memo while the file keeps its stamp
/// ([`inplace_node::sysroot::Memo`]): one `stat` when it has not changed.
pub(crate) fn observe_file(root: &Sysroot, path: &str) -> Result<FileObs, SysrootError> {
    Ok(Arc::unwrap_or_clone(root.probe_memo(
        path,
        MAX_FILE_BYTES,
        file_obs,
    )?))
}

/// What [`Sysroot::probe`] found at `path`, as a [`FileObs`].
fn file_obs(path: &str, found: inplace_node::sysroot::Probe) -> FileObs {
    use inplace_node::sysroot::Probe;
    match found {
        Probe::Absent => FileObs::Absent,
        Probe::ParentConflict(c) => FileObs::Conflict(c.to_string()),
        Probe::Present {
            entry,
            content: Some(content),
        } => FileObs::File { content, entry },
        Probe::Present {
            entry,
            content: None,
        } => FileObs::Conflict(match entry.kind {
            Kind::File => format!(
                "{path} is {} bytes, larger than the {} MiB inplaced manages",
                entry.len,
                MAX_FILE_BYTES >> 20
            ),
            Kind::Symlink => format!(
                "{path} is a symlink; inplaced never follows symlinks in managed paths (manage the file it points to instead)"
            ),
            k => format!("{path} is a {}, not a regular file", k.describe()),
        }),
    }
}

/// Observes a text configuration file (kept like [`observe_file`]).
pub(crate) fn observe_text(root: &Sysroot, path: &str) -> Result<TextObs, SysrootError> {
    Ok(Arc::unwrap_or_clone(root.probe_memo(
        path,
        MAX_FILE_BYTES,
        text_obs,
    )?))
}

/// What [`Sysroot::probe`] found at `path`, as a [`TextObs`].
pub(crate) fn text_obs(path: &str, found: inplace_node::sysroot::Probe) -> TextObs {
    match file_obs(path, found) {
        FileObs::Absent => TextObs::Absent,
        FileObs::Conflict(c) => TextObs::Problem(c),
        FileObs::File { content, entry } => match String::from_utf8(content) {
            Ok(t) => TextObs::Text(t, entry),
            Err(_) => TextObs::Problem(format!(
                "{path} is not UTF-8 text; inplaced edits only text it can keep byte for byte"
            )),
        },
    }
}

/// [`Sysroot::read_string_following`], kept while the file it resolves to keeps its
/// stamp. Not for `/proc` or `/sys` (their times do not follow their content).
pub(crate) fn read_string_following(
    root: &Sysroot,
    path: &str,
) -> Result<Option<String>, SysrootError> {
    fn same(_: &str, t: Option<String>) -> Option<String> {
        t
    }
    Ok(Arc::unwrap_or_clone(root.read_following_memo(path, same)?))
}

/// [`Sysroot::read_string`] (no symlink followed, at most [`MAX_FILE_BYTES`]), kept as
/// [`observe_text`] keeps it. Its errors name the path and say why (the probe's words).
pub(crate) fn read_string(root: &Sysroot, path: &str) -> Result<Option<String>, SysrootError> {
    match observe_text(root, path)? {
        TextObs::Absent => Ok(None),
        TextObs::Text(t, _) => Ok(Some(t)),
        TextObs::Problem(why) => Err(SysrootError::Io {
            path: path.to_string(),
            op: "read",
            error: std::io::Error::other(why),
        }),
    }
}

/// [`Sysroot::list_dir_following`], kept while the directory keeps its stamp.
pub(crate) fn list_dir_following(
    root: &Sysroot,
    path: &str,
) -> Result<Option<Vec<String>>, SysrootError> {
    Ok(Arc::unwrap_or_clone(root.list_dir_memo(path, true)?))
}

/// [`Sysroot::list_dir`] (no symlink followed), kept while the directory keeps its stamp.
pub(crate) fn list_dir(root: &Sysroot, path: &str) -> Result<Option<Vec<String>>, SysrootError> {
    Ok(Arc::unwrap_or_clone(root.list_dir_memo(path, false)?))
}

/// What a section observes the node with: the sysroot and the state directory, and what
/// it is asked about (the desired spec, the applied record, the agent config).
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    /// The node's root (all host access goes through it).
    pub root: &'a Sysroot,
    /// The agent's state directory (saved originals).
    pub state: &'a StateDir,
    /// Agent config.
    pub config: &'a Config,
    /// The desired spec.
    pub desired: &'a NodeSpec,
    /// The applied record.
    pub record: &'a AppliedRecord,
    /// Read-only commands (`kubelet --version`); None: none can be run.
    pub runner: Option<&'a dyn inplace_node::system::CommandRunner>,
}
