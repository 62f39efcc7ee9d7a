//! Symlink-safe, dir-fd relative access to the node's file system under a sysroot.
//!
//! Every host path the agent touches goes through a [`Sysroot`] (default `/`), so tests run
//! unprivileged on a copy of a node in a temporary directory and the same code runs on a
//! real node. Paths are absolute node paths (`/etc/default/grub`); each component is opened
//! relative to its parent's file descriptor with `O_NOFOLLOW`, so no symlink is ever
//! followed inside a managed path and nothing escapes the sysroot (the approach of bootc's
//! cap-std-ext, done with `openat(2)` directly so the symlink rule covers every component).
//!
//! Durable writes follow DESIGN §3.1: a temporary file in the target's directory, write,
//! explicit `fchown` then `fchmod` (chown clears setuid/setgid, and umask never matters),
//! `fsync`, `renameat` over the target, `fsync` of the directory.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

mod beneath;
mod follow;
mod memo;
pub mod trace;
mod trusted;
mod writable;

use trace::Dep;

/// Errors of sysroot access; each names the node path.
#[derive(Debug, thiserror::Error)]
pub enum SysrootError {
    /// The path is not absolute and normalized.
    #[error("{path}: not an absolute, normalized path (no '.', '..', '//' or trailing '/')")]
    BadPath {
        /// The offending path.
        path: String,
    },
    /// A component of the path is a symlink; inplaced never follows symlinks in managed paths.
    #[error("{path}: is a symlink; inplaced never follows symlinks in managed paths")]
    Symlink {
        /// The symlink's node path.
        path: String,
    },
    /// A parent component exists but is not a directory.
    #[error("{path}: is a {kind}, not a directory")]
    NotADirectory {
        /// The offending component's node path.
        path: String,
        /// What it is ("regular file", ...).
        kind: &'static str,
    },
    /// Any other I/O error.
    #[error("{path}: {op}: {error}")]
    Io {
        /// Node path.
        path: String,
        /// What was being done ("read", "rename", ...).
        op: &'static str,
        /// The OS error (part of the message, so not repeated as a cause).
        error: io::Error,
    },
}

impl SysrootError {
    /// The same error with `prefix` written before its path: the state directory opens
    /// itself as a sysroot, and its errors must name the full path
    /// (`/var/lib/inplaced/applied-spec.pb`, not `/applied-spec.pb`).
    pub fn prefixed(self, prefix: &Path) -> SysrootError {
        let full = |p: String| format!("{}{p}", prefix.display());
        match self {
            SysrootError::BadPath { path } => SysrootError::BadPath { path: full(path) },
            SysrootError::Symlink { path } => SysrootError::Symlink { path: full(path) },
            SysrootError::NotADirectory { path, kind } => SysrootError::NotADirectory {
                path: full(path),
                kind,
            },
            SysrootError::Io { path, op, error } => SysrootError::Io {
                path: full(path),
                op,
                error,
            },
        }
    }

    /// True for ENOSPC or EDQUOT (a full file system or quota) and EROFS (read-only).
    pub fn is_no_space(&self) -> bool {
        matches!(self, SysrootError::Io { error, .. }
            if matches!(error.raw_os_error(), Some(28 | 122 | 30)))
    }
}

/// The start of the temporary file names of `name` (`.<name>.inplaced-`); for a name too
/// long to take the suffix within NAME_MAX (255 bytes), its hash stands in for it.
fn temp_prefix(name: &str) -> String {
    if name.len() <= 200 {
        format!(".{name}.inplaced-")
    } else {
        format!(
            ".{}.inplaced-",
            &crate::digest::sha256_hex(name.as_bytes())[..32]
        )
    }
}

/// Result alias for sysroot operations.
pub type Result<T> = std::result::Result<T, SysrootError>;

thread_local! {
    static FSYNCS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// `fsync(2)` of `fd`, counted for [`fsyncs_on_this_thread`]. Every durable barrier of the
/// agent (node files and its state directory) goes through here.
pub fn fsync(fd: impl std::os::fd::AsFd) -> rustix::io::Result<()> {
    FSYNCS.with(|c| c.set(c.get() + 1));
    rustix::fs::fsync(fd)
}

/// How many [`fsync`]s this thread has made. An operation runs on one thread, so the
/// difference across it is the operation's durable barriers (logged when it settles).
pub fn fsyncs_on_this_thread() -> u64 {
    FSYNCS.with(std::cell::Cell::get)
}

fn io_err(path: &str, op: &'static str, e: impl Into<io::Error>) -> SysrootError {
    SysrootError::Io {
        path: path.to_string(),
        op,
        error: e.into(),
    }
}

/// What kind of file system object a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link (never followed).
    Symlink,
    /// Device, fifo or socket.
    Other,
}

impl Kind {
    /// Human name ("regular file", "directory", ...).
    pub fn describe(self) -> &'static str {
        match self {
            Kind::File => "regular file",
            Kind::Dir => "directory",
            Kind::Symlink => "symlink",
            Kind::Other => "special file",
        }
    }
}

/// Metadata of one path (not following a final symlink).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Object kind.
    pub kind: Kind,
    /// Permission bits including setuid/setgid/sticky (mask 0o7777).
    pub mode: u32,
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
    /// Size in bytes.
    pub len: u64,
}

/// A directory entry's name and [`Stamp`] ([`Sysroot::list_dir_stamped`]; `None`: gone
/// between the listing and its look).
pub type Stamped = (String, Option<Stamp>);

/// A file's identity and change times ([`Sysroot::stamp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp([u64; 7]);

pub use memo::{Memo, MemoLimits};

impl Stamp {
    /// True when the file's content was modified less than `secs` seconds before `now`
    /// (Unix seconds), or in the future. File times come from a coarse clock (a jiffy),
    /// so a rewrite that soon after the stamp was taken may leave it equal; what is
    /// derived from such a file is not cached (git's "racily clean" rule).
    pub fn is_recent(&self, now: u64, secs: u64) -> bool {
        self.0[3].saturating_add(secs) > now
    }
}

/// State of the parents of a path, for coverage before anything is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parents {
    /// Every parent exists and is a directory.
    Present,
    /// Parents from this node path on are missing (would be created 0755 root:root).
    Missing(String),
    /// A parent is not a directory or is a symlink: the path can never be written.
    Conflict(SysrootConflict),
}

/// Why a path can not be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysrootConflict {
    /// The node path of the conflicting component.
    pub path: String,
    /// What it is.
    pub kind: Kind,
}

impl std::fmt::Display for SysrootConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            Kind::Symlink => write!(
                f,
                "parent {} is a symlink; inplaced never follows symlinks in managed paths",
                self.path
            ),
            k => write!(
                f,
                "parent {} is a {}, not a directory",
                self.path,
                k.describe()
            ),
        }
    }
}

/// What [`Sysroot::probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// The path or one of its parents is absent.
    Absent,
    /// A parent is not a directory (or is a symlink).
    ParentConflict(SysrootConflict),
    /// The path exists; `content` is read for regular files within the size limit.
    Present {
        /// Metadata (not following a final symlink).
        entry: Entry,
        /// The content, for a regular file no larger than the limit.
        content: Option<Vec<u8>>,
    },
}

/// Validates that `path` is absolute and normalized and returns its components.
///
/// Errors: [`SysrootError::BadPath`] for relative paths, `.`/`..`/empty components, a
/// trailing `/`, or NUL bytes.
pub fn components(path: &str) -> Result<Vec<&str>> {
    let bad = || SysrootError::BadPath {
        path: path.to_string(),
    };
    let rest = path.strip_prefix('/').ok_or_else(bad)?;
    if rest.is_empty() {
        return Ok(Vec::new());
    }
    let parts: Vec<&str> = rest.split('/').collect();
    if path.contains('\0')
        || parts
            .iter()
            .any(|c| c.is_empty() || *c == "." || *c == "..")
    {
        return Err(bad());
    }
    Ok(parts)
}

fn kind_of(st: &rustix::fs::Stat) -> Kind {
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => Kind::File,
        FileType::Directory => Kind::Dir,
        FileType::Symlink => Kind::Symlink,
        _ => Kind::Other,
    }
}

fn entry_of(st: &rustix::fs::Stat) -> Entry {
    Entry {
        kind: kind_of(st),
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        len: st.st_size as u64,
    }
}

fn join(parts: &[&str]) -> String {
    format!("/{}", parts.join("/"))
}

/// One look at `name` in the directory `dir` for [`Sysroot::probe`]: its metadata, with
/// the content of a regular file no larger than `max_read`; None when it was replaced
/// while being looked at (look again).
fn probe_name(dir: &OwnedFd, path: &str, name: &str, max_read: u64) -> Result<Option<Probe>> {
    Ok(probe_name_stat(dir, path, name, max_read)?.map(|(p, _)| p))
}

/// [`probe_name`] with the `fstat` of the file whose content was read (None when no
/// content was read), so that a cache keys what was read by the stamp of that same file.
fn probe_name_stat(
    dir: &OwnedFd,
    path: &str,
    name: &str,
    max_read: u64,
) -> Result<Option<(Probe, Option<rustix::fs::Stat>)>> {
    let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(rustix::io::Errno::NOENT) => return Ok(Some((Probe::Absent, None))),
        Err(e) => return Err(io_err(path, "stat", e)),
    };
    let entry = entry_of(&st);
    if entry.kind != Kind::File || entry.len > max_read {
        let found = Probe::Present {
            entry,
            content: None,
        };
        return Ok(Some((found, None)));
    }
    let file = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(file) => file,
        Err(rustix::io::Errno::NOENT) => return Ok(Some((Probe::Absent, None))),
        // replaced by a symlink since the stat: look again
        Err(rustix::io::Errno::LOOP) => return Ok(None),
        Err(e) => return Err(io_err(path, "open", e)),
    };
    let st = rustix::fs::fstat(&file).map_err(|e| io_err(path, "stat", e))?;
    let opened = entry_of(&st);
    if opened.kind != Kind::File || opened.len > max_read {
        // replaced by a directory, a device or a larger file since the stat
        return Ok(None);
    }
    let mut f = std::fs::File::from(file);
    let mut buf = Vec::with_capacity(opened.len as usize);
    (&mut f)
        .take(max_read + 1)
        .read_to_end(&mut buf)
        .map_err(|e| io_err(path, "read", e))?;
    if buf.len() as u64 > max_read {
        return Ok(None);
    }
    let found = Probe::Present {
        entry: opened,
        content: Some(buf),
    };
    Ok(Some((found, Some(st))))
}

/// The sorted names in the directory `dir` (node path `path`), without `.` and `..`.
/// `dir` must be an open file description of its own (an `open`, never a `dup` of a fd
/// kept for later), read from its start: the listing moves its offset. Taking it saves
/// the re-open of `.` (and an `fcntl`) that [`rustix::fs::Dir::read_from`] makes.
fn names_in(dir: OwnedFd, path: &str) -> Result<Vec<String>> {
    let mut d = rustix::fs::Dir::new(dir).map_err(|e| io_err(path, "readdir", e))?;
    read_names(&mut d, path)
}

/// The sorted names [`names_in`] reads from `d`.
fn read_names(d: &mut rustix::fs::Dir, path: &str) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for ent in d {
        let ent = ent.map_err(|e| io_err(path, "readdir", e))?;
        let name = ent.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// A node's root file system, opened once as a directory fd.
#[derive(Debug)]
pub struct Sysroot {
    path: PathBuf,
    root: OwnedFd,
    failpoints: bool,
    /// What was derived from this root's files, by their stamps ([`Memo`]).
    memo: Memo,
    /// This root among the sysroots of the process, for a [`trace`] of reads.
    id: u64,
}

/// The next [`Sysroot::id`].
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// What is on stable storage when a write returns (see [`Sysroot::write_atomic_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// The content and the new name: fsync of the file, then of its directory.
    Durable,
    /// The content only (fsync of the file); the rename becomes durable with the next
    /// fsync of the directory, which the caller does once for a batch of writes.
    ContentOnly,
    /// Nothing is fsynced: for state a crash may lose (the old file stays readable).
    Lazy,
}

impl Sysroot {
    /// Opens `path` (the node's `/`, or a copy of a node in tests).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let root = rustix::fs::open(
            &path,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_err(&path.display().to_string(), "open sysroot", e))?;
        Ok(Sysroot {
            path,
            root,
            failpoints: true,
            memo: Memo::default(),
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        })
    }

    /// Notes for a running [`trace`] that an answer depends on `path` and every
    /// directory above it (not followed); a kernel interface's path can not be looked at
    /// that way, and poisons the trace.
    fn note_path(&self, path: &str) {
        if trace::active() {
            if trace::is_volatile(path) {
                trace::poison(&format!("{path} was read in a way a trace can not check"));
            } else {
                trace::note(self.id, || Dep::Lexical(path.to_string()));
            }
        }
    }

    /// Notes `dep` for a running [`trace`].
    fn note(&self, dep: impl FnOnce() -> Dep) {
        trace::note(self.id, dep);
    }

    /// Passes `r` on; an I/O error (not an answer the node's files alone decide: `EIO`,
    /// a file replaced while read) poisons a running [`trace`].
    fn noted<T>(r: Result<T>) -> Result<T> {
        if let Err(SysrootError::Io { path, op, .. }) = &r {
            trace::poison(&format!("{path}: {op} failed"));
        }
        r
    }

    /// The same, without the `write-temp` failpoint (for the agent's own state files, so
    /// that failpoints name steps on the node).
    pub fn without_failpoints(mut self) -> Self {
        self.failpoints = false;
        self
    }

    /// The sysroot's host path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True when the sysroot is the live host's `/`.
    pub fn is_host_root(&self) -> bool {
        self.path == Path::new("/")
    }

    /// Opens the directory made of `parts` without following symlinks.
    /// Returns `Ok(None)` if a component is missing.
    fn open_dir(&self, parts: &[&str]) -> Result<Option<OwnedFd>> {
        match beneath::open_dir(&self.root, parts) {
            beneath::Beneath::Dir(fd) => return Ok(Some(fd)),
            beneath::Beneath::Absent => return Ok(None),
            beneath::Beneath::Walk => {}
        }
        // an open of its own, not a `dup` sharing the root's offset: [`names_in`] reads
        // the directory returned from its start
        let mut fd = rustix::fs::openat(
            &self.root,
            ".",
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_err("/", "open", e))?;
        for (i, c) in parts.iter().enumerate() {
            match rustix::fs::openat(
                &fd,
                *c,
                OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(next) => fd = next,
                Err(rustix::io::Errno::NOENT) => return Ok(None),
                Err(rustix::io::Errno::NOTDIR) | Err(rustix::io::Errno::LOOP) => {
                    let p = join(&parts[..=i]);
                    let st = rustix::fs::statat(&fd, *c, AtFlags::SYMLINK_NOFOLLOW)
                        .map_err(|e| io_err(&p, "stat", e))?;
                    return Err(match kind_of(&st) {
                        Kind::Symlink => SysrootError::Symlink { path: p },
                        k => SysrootError::NotADirectory {
                            path: p,
                            kind: k.describe(),
                        },
                    });
                }
                Err(e) => return Err(io_err(&join(&parts[..=i]), "open", e)),
            }
        }
        Ok(Some(fd))
    }

    /// Metadata of `path` without following symlinks; `Ok(None)` if it (or a parent) is absent.
    pub fn stat(&self, path: &str) -> Result<Option<Entry>> {
        let r = Self::noted(self.lstat(path).map(|st| st.map(|st| entry_of(&st))));
        if trace::is_volatile(path) {
            match &r {
                Ok(e) => self.note(|| Dep::Meta(path.to_string(), *e)),
                Err(e) => trace::poison(&e.to_string()),
            }
        } else {
            self.note_path(path);
        }
        r
    }

    /// The raw `lstat` of `path` (the root itself for `/`); `Ok(None)` if it is absent.
    fn lstat(&self, path: &str) -> Result<Option<rustix::fs::Stat>> {
        let parts = components(path)?;
        let Some((name, parents)) = parts.split_last() else {
            let st = rustix::fs::fstat(&self.root).map_err(|e| io_err("/", "stat", e))?;
            return Ok(Some(st));
        };
        let Some(dir) = self.open_dir(parents)? else {
            return Ok(None);
        };
        match rustix::fs::statat(&dir, *name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(io_err(path, "stat", e)),
        }
    }

    /// What changes when a file is replaced or rewritten: device, inode, size, and the
    /// modification and status-change times (ns), of `path` itself (not followed);
    /// `Ok(None)` if it is absent. Equal stamps mean the same file, unchanged, for
    /// caching what is derived from it (the kubelet's `--version`).
    pub fn stamp(&self, path: &str) -> Result<Option<Stamp>> {
        self.note_path(path);
        Ok(Self::noted(self.lstat(path))?.map(|st| Stamp::of(&st)))
    }

    /// Looks at `path` in one walk from the root (each parent opened once, `O_NOFOLLOW`):
    /// whether a parent is missing or in conflict, the path's metadata, and the content of a
    /// regular file no larger than `max_read` bytes. This is what coverage needs per file,
    /// at the cost of one `openat` per component.
    pub fn probe(&self, path: &str, max_read: u64) -> Result<Probe> {
        self.note_path(path);
        Self::noted(self.probe_untraced(path, max_read))
    }

    fn probe_untraced(&self, path: &str, max_read: u64) -> Result<Probe> {
        let parts = components(path)?;
        let Some((name, parents)) = parts.split_last() else {
            return Err(SysrootError::BadPath {
                path: path.to_string(),
            });
        };
        let fd = match self.probe_parents(&parts, parents)? {
            Ok(fd) => fd,
            Err(found) => return Ok(found),
        };
        // The file may be unlinked, or replaced by a rename, between the stat and the open
        // (an apply running beside a coverage call): a name that is gone is absent, and a
        // name replaced under us is looked at once more, so that the metadata returned is
        // always that of the content read (fstat of the opened file).
        for _ in 0..2 {
            if let Some(found) = probe_name(&fd, path, name, max_read)? {
                return Ok(found);
            }
        }
        // replaced twice in a row while being looked at: not an observation, ask again
        Err(io_err(
            path,
            "read",
            io::Error::other("replaced twice while being read; ask again"),
        ))
    }

    /// Opens each of `parents` (the first components of `parts`) in turn, `O_NOFOLLOW`:
    /// the last one's descriptor, or (as the inner error) what [`Sysroot::probe`] answers
    /// when one is missing ([`Probe::Absent`]) or not a directory
    /// ([`Probe::ParentConflict`]).
    fn probe_parents(
        &self,
        parts: &[&str],
        parents: &[&str],
    ) -> Result<std::result::Result<OwnedFd, Probe>> {
        match beneath::open_dir(&self.root, parents) {
            beneath::Beneath::Dir(fd) => return Ok(Ok(fd)),
            beneath::Beneath::Absent => return Ok(Err(Probe::Absent)),
            beneath::Beneath::Walk => {}
        }
        let mut fd = rustix::io::dup(&self.root).map_err(|e| io_err("/", "dup", e))?;
        for (i, c) in parents.iter().enumerate() {
            match rustix::fs::openat(
                &fd,
                *c,
                OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(next) => fd = next,
                Err(rustix::io::Errno::NOENT) => return Ok(Err(Probe::Absent)),
                Err(rustix::io::Errno::NOTDIR) | Err(rustix::io::Errno::LOOP) => {
                    let p = join(&parts[..=i]);
                    let st = match rustix::fs::statat(&fd, *c, AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(st) => st,
                        // removed since the open: absent
                        Err(rustix::io::Errno::NOENT) => return Ok(Err(Probe::Absent)),
                        Err(e) => return Err(io_err(&p, "stat", e)),
                    };
                    return Ok(Err(Probe::ParentConflict(SysrootConflict {
                        path: p,
                        kind: kind_of(&st),
                    })));
                }
                Err(e) => return Err(io_err(&join(&parts[..=i]), "open", e)),
            }
        }
        Ok(Ok(fd))
    }

    /// Checks the parents of `path` before a write: present, missing from some point, or in
    /// conflict (a regular file or a symlink where a directory is needed).
    pub fn parents(&self, path: &str) -> Result<Parents> {
        let parts = components(path)?;
        let n = parts.len().saturating_sub(1);
        for i in 0..n {
            let p = join(&parts[..=i]);
            match self.stat(&p) {
                Ok(None) => return Ok(Parents::Missing(p)),
                Ok(Some(e)) if e.kind == Kind::Dir => {}
                Ok(Some(e)) => {
                    return Ok(Parents::Conflict(SysrootConflict {
                        path: p,
                        kind: e.kind,
                    }));
                }
                Err(SysrootError::Symlink { path }) => {
                    return Ok(Parents::Conflict(SysrootConflict {
                        path,
                        kind: Kind::Symlink,
                    }));
                }
                Err(SysrootError::NotADirectory { path, .. }) => {
                    return Ok(Parents::Conflict(SysrootConflict {
                        path,
                        kind: Kind::File,
                    }));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Parents::Present)
    }

    /// Reads a regular file without following symlinks; `Ok(None)` if absent.
    pub fn read(&self, path: &str) -> Result<Option<Vec<u8>>> {
        let r = Self::noted(self.read_untraced(path));
        if trace::is_volatile(path) {
            match &r {
                Ok(c) => self.note(|| Dep::Content(path.to_string(), c.clone())),
                Err(e) => trace::poison(&e.to_string()),
            }
        } else {
            self.note_path(path);
        }
        r
    }

    fn read_untraced(&self, path: &str) -> Result<Option<Vec<u8>>> {
        let Some((f, len)) = self.open_read_len(path)? else {
            return Ok(None);
        };
        // sized from the fstat already made (std's read_to_end of a File asks again,
        // statx and lseek); a file that grew since is still read whole
        let mut buf = Vec::with_capacity(len as usize);
        (&f).take(u64::MAX)
            .read_to_end(&mut buf)
            .map_err(|e| io_err(path, "read", e))?;
        Ok(Some(buf))
    }

    /// Opens a regular file for reading without following symlinks (a large file is
    /// then streamed, never held in memory); `Ok(None)` if absent.
    pub fn open_read(&self, path: &str) -> Result<Option<std::fs::File>> {
        self.note_path(path);
        Ok(Self::noted(self.open_read_len(path))?.map(|(f, _)| f))
    }

    /// [`Sysroot::open_read`] with the file's size when it was opened (bytes).
    fn open_read_len(&self, path: &str) -> Result<Option<(std::fs::File, u64)>> {
        let parts = components(path)?;
        let Some((name, parents)) = parts.split_last() else {
            return Err(SysrootError::BadPath {
                path: path.to_string(),
            });
        };
        let Some(dir) = self.open_dir(parents)? else {
            return Ok(None);
        };
        // O_NONBLOCK: opening a FIFO must not wait for a writer; only regular files are
        // read (a FIFO, socket or device named like a config file is an error, never a
        // hang or an endless read)
        let fd = match rustix::fs::openat(
            &dir,
            *name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(rustix::io::Errno::LOOP) => {
                return Err(SysrootError::Symlink {
                    path: path.to_string(),
                });
            }
            Err(e) => return Err(io_err(path, "open", e)),
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err(path, "stat", e))?;
        if kind_of(&st) != Kind::File {
            return Err(io_err(path, "read", io::Error::other("not a regular file")));
        }
        Ok(Some((std::fs::File::from(fd), st.st_size as u64)))
    }

    /// Reads a UTF-8 text file; `Ok(None)` if absent. Invalid UTF-8 is an I/O error.
    pub fn read_string(&self, path: &str) -> Result<Option<String>> {
        match self.read(path)? {
            None => Ok(None),
            Some(b) => String::from_utf8(b).map(Some).map_err(|_| {
                io_err(
                    path,
                    "read",
                    io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"),
                )
            }),
        }
    }

    /// Target of the symlink at `path` (not followed); `Ok(None)` if `path` is absent or
    /// not a symlink.
    pub fn read_link(&self, path: &str) -> Result<Option<String>> {
        self.note_path(path);
        Self::noted(self.read_link_untraced(path))
    }

    fn read_link_untraced(&self, path: &str) -> Result<Option<String>> {
        let parts = components(path)?;
        let Some((name, parents)) = parts.split_last() else {
            return Ok(None);
        };
        let Some(dir) = self.open_dir(parents)? else {
            return Ok(None);
        };
        match rustix::fs::readlinkat(&dir, *name, Vec::new()) {
            Ok(t) => Ok(Some(t.to_string_lossy().into_owned())),
            Err(rustix::io::Errno::NOENT) | Err(rustix::io::Errno::INVAL) => Ok(None),
            Err(e) => Err(io_err(path, "readlink", e)),
        }
    }

    /// Removes the temporary files [`Sysroot::write_atomic`] leaves in the directory of
    /// `path` when the process dies between writing and renaming
    /// (`.<name>.inplaced-<pid>-<n>.tmp`). Returns the names removed.
    pub fn remove_stale_temps(&self, path: &str) -> Result<Vec<String>> {
        let parts = components(path)?;
        let Some((name, parents)) = parts.split_last() else {
            return Ok(Vec::new());
        };
        let dir_path = join(parents);
        let prefix = temp_prefix(name);
        let mut removed = Vec::new();
        for n in self.list_dir(&dir_path)?.unwrap_or_default() {
            if n.starts_with(&prefix) && n.ends_with(".tmp") {
                let p = if parents.is_empty() {
                    format!("/{n}")
                } else {
                    format!("{dir_path}/{n}")
                };
                if self.remove(&p)? {
                    removed.push(p);
                }
            }
        }
        Ok(removed)
    }

    /// Sorted names in a directory; `Ok(None)` if it is absent.
    pub fn list_dir(&self, path: &str) -> Result<Option<Vec<String>>> {
        self.note_path(path);
        let parts = components(path)?;
        let Some(dir) = self.open_dir(&parts)? else {
            return Ok(None);
        };
        Self::noted(names_in(dir, path).map(Some))
    }

    /// [`Sysroot::list_dir`] with each entry's [`Sysroot::stamp`] (`None` for an entry
    /// gone between the listing and its look), every look through the one directory fd:
    /// one open for the whole listing instead of a walk from the root per entry (the
    /// state directory's operation heads look at every operation file after each
    /// operation).
    pub fn list_dir_stamped(&self, path: &str) -> Result<Option<Vec<Stamped>>> {
        self.note_path(path);
        let parts = components(path)?;
        let Some(dir) = self.open_dir(&parts)? else {
            return Ok(None);
        };
        let mut d = rustix::fs::Dir::new(dir).map_err(|e| io_err(path, "readdir", e))?;
        let names = Self::noted(read_names(&mut d, path))?;
        // the listing's own fd: `statat` does not depend on its offset
        let dir = d.fd().map_err(|e| io_err(path, "readdir", e))?;
        let mut out = Vec::with_capacity(names.len());
        let full = |name: &str| format!("{}/{name}", path.trim_end_matches('/'));
        for name in names {
            // a path formatted only for a trace or an error: not per entry per look
            if trace::active() {
                self.note_path(&full(&name));
            }
            let stamp = match rustix::fs::statat(dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => Some(Stamp::of(&st)),
                Err(rustix::io::Errno::NOENT) => None,
                Err(e) => return Self::noted(Err(io_err(&full(&name), "stat", e))),
            };
            out.push((name, stamp));
        }
        Ok(Some(out))
    }

    /// Opens the parent directory of `path`, creating missing directories with mode 0755
    /// owned by root (explicit `fchmod`/`fchown`, then `fsync` of the new directory and its
    /// parent). Returns the parent fd, the file name and the directories created.
    fn ensure_parent<'p>(&self, path: &'p str) -> Result<(OwnedFd, &'p str, Vec<String>)> {
        let parts = components(path)?;
        let Some((name, parents)) = parts.split_last() else {
            return Err(SysrootError::BadPath {
                path: path.to_string(),
            });
        };
        if let beneath::Beneath::Dir(fd) = beneath::open_dir(&self.root, parents) {
            return Ok((fd, name, Vec::new()));
        }
        let mut created = Vec::new();
        let mut fd = rustix::io::dup(&self.root).map_err(|e| io_err("/", "dup", e))?;
        for (i, c) in parents.iter().enumerate() {
            let p = join(&parts[..=i]);
            let open = |fd: &OwnedFd| {
                rustix::fs::openat(
                    fd,
                    *c,
                    OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
            };
            let next = match open(&fd) {
                Ok(n) => n,
                Err(rustix::io::Errno::NOENT) => {
                    rustix::fs::mkdirat(&fd, *c, Mode::from_raw_mode(0o755))
                        .map_err(|e| io_err(&p, "mkdir", e))?;
                    let n = open(&fd).map_err(|e| io_err(&p, "open", e))?;
                    set_owner_mode(&n, 0, 0, 0o755).map_err(|e| io_err(&p, "chown/chmod", e))?;
                    fsync(&n).map_err(|e| io_err(&p, "fsync", e))?;
                    fsync(&fd).map_err(|e| io_err(&p, "fsync parent", e))?;
                    created.push(p.clone());
                    n
                }
                Err(rustix::io::Errno::NOTDIR) | Err(rustix::io::Errno::LOOP) => {
                    return Err(match self.parents(path)? {
                        Parents::Conflict(c) if c.kind == Kind::Symlink => {
                            SysrootError::Symlink { path: c.path }
                        }
                        Parents::Conflict(c) => SysrootError::NotADirectory {
                            path: c.path,
                            kind: c.kind.describe(),
                        },
                        _ => io_err(&p, "open", io::Error::other("not a directory")),
                    });
                }
                Err(e) => return Err(io_err(&p, "open", e)),
            };
            fd = next;
        }
        Ok((fd, name, created))
    }

    /// Writes `content` to `path` atomically and durably with exactly `mode` (0o7777 mask,
    /// setuid/setgid/sticky included) and `uid:gid`. Missing parents are created 0755 root.
    /// A symlink or directory at `path` is refused. Returns the directories created.
    pub fn write_atomic(
        &self,
        path: &str,
        content: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
    ) -> Result<Vec<String>> {
        self.write_atomic_with(path, content, mode, uid, gid, Durability::Durable)
    }

    /// [`Sysroot::write_atomic`] with the barriers `durability` asks for: the rename is
    /// atomic in every case (a reader sees the old or the new file), only what is on
    /// stable storage when it returns differs.
    pub fn write_atomic_with(
        &self,
        path: &str,
        content: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
        durability: Durability,
    ) -> Result<Vec<String>> {
        let (dir, name, created) = self.ensure_parent(path)?;
        let content = Content::Bytes(content);
        self.write_in_dir(&dir, name, path, content, (mode, uid, gid), durability)?;
        Ok(created)
    }

    /// [`Sysroot::write_atomic_with`] with the content streamed from `src` (copied
    /// through a fixed-size buffer: memory does not grow with the content's size).
    pub fn write_atomic_from(
        &self,
        path: &str,
        src: &mut dyn std::io::Read,
        mode: u32,
        uid: u32,
        gid: u32,
        durability: Durability,
    ) -> Result<Vec<String>> {
        let (dir, name, created) = self.ensure_parent(path)?;
        let content = Content::Read(src);
        self.write_in_dir(&dir, name, path, content, (mode, uid, gid), durability)?;
        Ok(created)
    }

    /// Writes what `src` reads as `name` in `dir` (node path `path`), streamed through
    /// a fixed-size buffer: a unique `O_EXCL` temporary, owner and mode, fsync, rename; a
    /// symlink or non-file at `path` refused.
    fn write_in_dir(
        &self,
        dir: &OwnedFd,
        name: &str,
        path: &str,
        content: Content<'_>,
        (mode, uid, gid): (u32, u32, u32),
        durability: Durability,
    ) -> Result<()> {
        match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if kind_of(&st) == Kind::Symlink => {
                return Err(SysrootError::Symlink {
                    path: path.to_string(),
                });
            }
            Ok(st) if kind_of(&st) != Kind::File => {
                return Err(SysrootError::NotADirectory {
                    path: path.to_string(),
                    kind: kind_of(&st).describe(),
                });
            }
            _ => {}
        }
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp_name = format!("{}{}-{seq}.tmp", temp_prefix(name), pid());
        let fd = rustix::fs::openat(
            dir,
            tmp_name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| io_err(path, "create temporary file", e))?;
        let cleanup = |e: SysrootError| {
            let _ = rustix::fs::unlinkat(dir, tmp_name.as_str(), AtFlags::empty());
            e
        };
        let mut f = std::fs::File::from(fd);
        match content {
            Content::Bytes(b) => f.write_all(b),
            Content::Read(src) => std::io::copy(src, &mut f).map(|_| ()),
        }
        .map_err(|e| cleanup(io_err(path, "write", e)))?;
        set_owner_mode(&f, uid, gid, mode).map_err(|e| cleanup(io_err(path, "chown/chmod", e)))?;
        if durability != Durability::Lazy {
            fsync(&f).map_err(|e| cleanup(io_err(path, "fsync", e)))?;
        }
        drop(f);
        if self.failpoints {
            crate::failpoint::hit("write-temp");
        }
        rustix::fs::renameat(dir, tmp_name.as_str(), dir, name)
            .map_err(|e| cleanup(io_err(path, "rename", e)))?;
        if durability == Durability::Durable {
            fsync(dir).map_err(|e| io_err(path, "fsync directory", e))?;
        }
        Ok(())
    }

    /// Fsyncs the directory `path` (making the renames and unlinks in it durable); an
    /// absent directory is not an error (nothing in it to make durable).
    pub fn sync_dir(&self, path: &str) -> Result<()> {
        let parts = components(path)?;
        if let Some(dir) = self.open_dir(&parts)? {
            fsync(&dir).map_err(|e| io_err(path, "fsync directory", e))?;
        }
        Ok(())
    }

    /// Removes the regular file at `path` without fsyncing its directory: the caller
    /// fsyncs each directory once ([`Sysroot::sync_dir`]) before anything that depends on
    /// the removal being durable. `Ok(false)` if absent.
    pub fn remove_deferred(&self, path: &str) -> Result<bool> {
        self.remove_with(path, false)
    }

    /// Removes the regular file at `path` and fsyncs its directory. `Ok(false)` if absent.
    pub fn remove(&self, path: &str) -> Result<bool> {
        self.remove_with(path, true)
    }

    fn remove_with(&self, path: &str, sync: bool) -> Result<bool> {
        let parts = components(path)?;
        let Some((name, parents)) = parts.split_last() else {
            return Err(SysrootError::BadPath {
                path: path.to_string(),
            });
        };
        let Some(dir) = self.open_dir(parents)? else {
            return Ok(false);
        };
        match rustix::fs::unlinkat(&dir, *name, AtFlags::empty()) {
            Ok(()) => {
                if sync {
                    fsync(&dir).map_err(|e| io_err(path, "fsync directory", e))?;
                }
                Ok(true)
            }
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(io_err(path, "unlink", e)),
        }
    }

    /// Removes the directory at `path` if it is empty; `Ok(false)` if it is absent or not
    /// empty. Its parent is fsynced.
    pub fn remove_dir_if_empty(&self, path: &str) -> Result<bool> {
        let parts = components(path)?;
        let Some((name, parents)) = parts.split_last() else {
            return Ok(false);
        };
        let Some(dir) = self.open_dir(parents)? else {
            return Ok(false);
        };
        match rustix::fs::unlinkat(&dir, *name, AtFlags::REMOVEDIR) {
            Ok(()) => {
                fsync(&dir).map_err(|e| io_err(path, "fsync directory", e))?;
                Ok(true)
            }
            Err(rustix::io::Errno::NOENT)
            | Err(rustix::io::Errno::NOTEMPTY)
            | Err(rustix::io::Errno::EXIST) => Ok(false),
            Err(e) => Err(io_err(path, "rmdir", e)),
        }
    }

    /// Writes `content` into an existing file in place (no rename), for kernel interfaces
    /// such as `/proc/sys/...` that can not be replaced. The file must exist.
    pub fn write_in_place(&self, path: &str, content: &[u8]) -> Result<()> {
        let parts = components(path)?;
        let Some((name, parents)) = parts.split_last() else {
            return Err(SysrootError::BadPath {
                path: path.to_string(),
            });
        };
        let dir = self
            .open_dir(parents)?
            .ok_or_else(|| io_err(path, "open", io::Error::from(io::ErrorKind::NotFound)))?;
        let fd = rustix::fs::openat(
            &dir,
            *name,
            OFlags::WRONLY | OFlags::TRUNC | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_err(path, "open", e))?;
        let mut f = std::fs::File::from(fd);
        f.write_all(content).map_err(|e| io_err(path, "write", e))?;
        Ok(())
    }
}

/// What [`Sysroot::write_in_dir`] writes: bytes at hand (one `write`), or what a reader
/// gives (copied through a fixed-size buffer).
enum Content<'a> {
    Bytes(&'a [u8]),
    Read(&'a mut dyn std::io::Read),
}

/// This process's id, asked of the kernel once (it names temporary files; glibc does not
/// keep it, so each `std::process::id` was a `getpid`).
fn pid() -> u32 {
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *PID.get_or_init(std::process::id)
}

/// Whether this process runs as root, asked once: the agent never changes its ids.
fn is_root() -> bool {
    static ROOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ROOT.get_or_init(|| rustix::process::geteuid().is_root())
}

/// `fchown` (only as root, or when the ids differ from the file's) then `fchmod`, so the
/// setuid/setgid bits that chown clears are set last and the mode never depends on umask.
/// As root the ids are set whatever they are, so the file's are not looked at.
fn set_owner_mode(fd: impl AsFd, uid: u32, gid: u32, mode: u32) -> io::Result<()> {
    let chown = is_root() || {
        let st = rustix::fs::fstat(&fd)?;
        st.st_uid != uid || st.st_gid != gid
    };
    if chown {
        rustix::fs::fchown(
            &fd,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )?;
    }
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o7777))?;
    Ok(())
}

#[cfg(test)]
mod tests;
