//! What a computation read from the node, so that its answer can be kept while the node
//! stays the same (issue 28: coverage of an unchanged node re-read and re-planned every
//! file on every call; the [`super::Memo`] saves reads and parses, not the plan).
//!
//! [`record`] runs a computation with a trace on the calling thread: every read of a
//! [`Sysroot`] on that thread notes what its answer depends on ([`Dep`]). [`Trace::seal`]
//! then looks at each dependency once more and keeps what it saw; [`Seal::holds`] looks
//! again later and says whether every look sees the same. When it does, every read of
//! the computation would answer the same, so a computation that depends on nothing but
//! its arguments and these reads (the planner is one: `plan` is a pure function of the
//! observation) would answer the same too.
//!
//! **What is looked at** (one system call each, no descriptor opened for a plain path):
//! - a path read without following symlinks (every managed path, [`Sysroot::probe`],
//!   [`Sysroot::read`], [`Sysroot::list_dir`], [`Sysroot::stat`], the trust checks): the
//!   `lstat` stamp ([`Stamp`]: device, inode, size, mtime and ctime in ns) of the path and
//!   of every directory above it, from the sysroot's descriptor. A file rewritten, replaced,
//!   renamed, chmod-ed, chown-ed, given an attribute (`chattr` changes ctime) or linked
//!   elsewhere (its link count, ctime) changes its stamp; an entry added to or removed from
//!   a directory changes the directory's; a directory on the way replaced by a symlink or a
//!   file changes the stamp of that component (another inode and kind).
//!   The sysroot's own `/` is not stamped (an entry added to it changes its times), but
//!   its owner, group and mode are looked at: the trust checks ([`Sysroot::read_trusted`])
//!   read them, and a `/` made writable by others must refuse what it allowed.
//! - a path read following symlinks inside the sysroot ([`Sysroot::read_string_following`],
//!   [`Sysroot::list_dir_following`]): the `fstat` stamp of what it resolves to, opened
//!   again with `openat2(RESOLVE_IN_ROOT)` as the read opened it, plus the chain above.
//! - a written path's room ([`Sysroot::write_blocker`]): the file system is still not
//!   read-only and still has the bytes free (`statvfs`); an answer naming a number of free
//!   bytes is never kept (the number moves).
//! - a kernel interface (`/proc`, `/sys`: their times do not follow their content): the
//!   content read, and the metadata, compared whole on each look.
//!
//! **Racily clean** (as the memo, git's `racy-git.txt`): a trace is not sealed when a
//! stamp it sees changed less than [`RACY`] (or [`RACY_COARSE`] for whole-second times)
//! before the computation began, or later: a write during the computation, or within the
//! same tick of the coarse clock file times come from, could leave the stamp equal with
//! other content. A write after the seal gets a time later than every time the seal kept,
//! so the stamp differs.
//!
//! **Only the calling thread is traced**: a computation that reads on another thread
//! (none does: the planner runs on one blocking thread) would be kept without those reads.
//!
//! **Not traced, so not sealed**: anything a computation asks outside the sysroot. A
//! command run for its output (the command seam calls [`poison`]) or a request over the
//! network must call [`poison`], and the trace then refuses to seal. Not covered, as for
//! the memo: a file system whose times come from another clock (NFS with a skewed server),
//! an `mmap` write not yet flushed, and a clock stepped back onto a kept ctime to the
//! nanosecond with a same-size in-place rewrite.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, StatVfsMountFlags};

use super::{Entry, Kind, Stamp, Sysroot};

/// A change this close before a computation began keeps its trace from being sealed
/// (50 ms: several ticks of the coarse clock file times come from, 4 ms at HZ=250).
pub const RACY: Duration = Duration::from_millis(50);
/// The same for file times without a sub-second part (2 s: FAT keeps 2 s).
pub const RACY_COARSE: Duration = Duration::from_secs(2);

/// Most bytes of a kernel interface file kept to compare (a larger one is not sealed).
const MAX_CONTENT: usize = 64 << 10;

/// What one read's answer depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Dep {
    /// The path and every directory above it, not followed.
    Lexical(String),
    /// What the path resolves to inside the sysroot, symlinks followed.
    Following(String),
    /// The file system of this directory takes `bytes` more (not read-only, that much free).
    Room(String, u64),
    /// The file system of this directory is mounted read-only.
    ReadOnly(String),
    /// A kernel interface file's content (None: absent).
    Content(String, Option<Vec<u8>>),
    /// A kernel interface path's metadata (None: absent).
    Meta(String, Option<Entry>),
}

/// The dependencies noted on this thread while [`record`] runs.
#[derive(Debug)]
pub struct Trace {
    /// When the computation began (since the Unix epoch).
    started: Duration,
    /// (the sysroot's id, what was read).
    deps: Vec<(u64, Dep)>,
    /// Why the trace can not be sealed (the first reason noted).
    poisoned: Option<String>,
}

thread_local! {
    static ACTIVE: RefCell<Option<Trace>> = const { RefCell::new(None) };
}

/// True for the node paths of kernel interfaces, whose file times do not follow their
/// content (`/proc`, `/sys`).
pub(super) fn is_volatile(path: &str) -> bool {
    ["/proc", "/sys"]
        .iter()
        .any(|p| path == *p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/')))
}

fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Runs `f` with a trace on this thread and returns its answer with the trace. A trace
/// already running (a nested call) gets every dependency of this one as well.
pub fn record<T>(f: impl FnOnce() -> T) -> (T, Trace) {
    let fresh = Trace {
        started: now(),
        deps: Vec::new(),
        poisoned: None,
    };
    let outer = ACTIVE.with(|a| a.borrow_mut().replace(fresh));
    let out = f();
    let trace = ACTIVE
        .with(|a| std::mem::replace(&mut *a.borrow_mut(), outer))
        .expect("the trace this call began");
    ACTIVE.with(|a| {
        if let Some(o) = a.borrow_mut().as_mut() {
            o.deps.extend(trace.deps.iter().cloned());
            if o.poisoned.is_none() {
                o.poisoned.clone_from(&trace.poisoned);
            }
        }
    });
    (out, trace)
}

/// Says that the running computation (if any) asked something no trace can look at
/// again (a command's output, a network answer): its trace will not be sealed.
pub fn poison(why: &str) {
    ACTIVE.with(|a| {
        if let Some(t) = a.borrow_mut().as_mut()
            && t.poisoned.is_none()
        {
            t.poisoned = Some(why.to_string());
        }
    });
}

/// Notes `dep()` for the sysroot `root` when a trace runs on this thread.
pub(super) fn note(root: u64, dep: impl FnOnce() -> Dep) {
    ACTIVE.with(|a| {
        if let Some(t) = a.borrow_mut().as_mut() {
            t.deps.push((root, dep()));
        }
    });
}

/// True when a trace runs on this thread (a reader notes only then).
pub(super) fn active() -> bool {
    ACTIVE.with(|a| a.borrow().is_some())
}

/// What one look saw at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// The stamp of what is there, and what it is.
    Stamp(Stamp, Kind),
    /// Nothing (`ENOENT`).
    Absent,
    /// A component on the way is not a directory (`ENOTDIR`).
    NotDir,
    /// Any other answer (the look failed: the seal does not hold).
    Failed,
}

/// One look of a [`Seal`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Look {
    /// `lstat` of the path.
    Lstat(String),
    /// `fstat` of the path opened following symlinks inside the sysroot.
    Follow(String),
    /// `statvfs` of the directory: not read-only, and at least this many bytes free.
    Room(String),
    /// `statvfs` of the directory: read-only.
    ReadOnly(String),
    /// A kernel interface path: its metadata and, when read, its content (one open).
    Kernel(String),
    /// The owner, group and mode of the sysroot's own `/` (the trust checks read them:
    /// [`Sysroot::read_trusted`] checks from `/` down; its times are not looked at, as
    /// an entry added to `/` changes them and each path's chain covers its own entries).
    Root,
}

/// What a look expects to see again.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    Seen(Seen),
    Bytes(u64),
    Flag,
    /// What a kernel interface path showed: its metadata (None: absent) when it was
    /// looked at, its content (None: absent) when it was read.
    Kernel {
        meta: Option<Option<Entry>>,
        content: Option<Option<Vec<u8>>>,
    },
    /// (uid, gid, mode) of the sysroot's `/`.
    Owner(u32, u32, u32),
}

/// A sealed trace: the looks that must see again what they saw for the computation's
/// answer to hold ([`Seal::holds`]).
#[derive(Debug, Clone)]
pub struct Seal {
    /// (index of the sysroot in the list given to [`Trace::seal`], look, expected).
    looks: Vec<(usize, Look, Expect)>,
}

impl Trace {
    /// Why this trace can not be sealed, if a reader said so ([`poison`]).
    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    /// How many reads were noted.
    pub fn len(&self) -> usize {
        self.deps.len()
    }

    /// True when nothing was read.
    pub fn is_empty(&self) -> bool {
        self.deps.is_empty()
    }

    /// Looks at every dependency once and keeps what it sees, in `roots` (every sysroot
    /// the computation read). Errors (why the answer can not be kept): the trace was
    /// poisoned, a read was of another sysroot, a look failed, saw something other than
    /// the read saw (a kernel interface changed), or saw a racily clean stamp (see the
    /// module docs).
    pub fn seal(self, roots: &[&Sysroot]) -> Result<Seal, String> {
        if let Some(why) = self.poisoned {
            return Err(why);
        }
        let mut looks: BTreeMap<(usize, Look), Expect> = BTreeMap::new();
        for (id, dep) in self.deps {
            let Some(r) = roots.iter().position(|r| r.id == id) else {
                return Err("a read of a sysroot the seal was not given".into());
            };
            match dep {
                Dep::Lexical(p) => {
                    looks.insert((r, Look::Root), Expect::Flag);
                    for a in chain(&p) {
                        looks.insert((r, Look::Lstat(a.to_string())), Expect::Flag);
                    }
                }
                Dep::Following(p) => {
                    looks.insert((r, Look::Root), Expect::Flag);
                    for a in chain(&p) {
                        looks.insert((r, Look::Lstat(a.to_string())), Expect::Flag);
                    }
                    looks.insert((r, Look::Follow(p)), Expect::Flag);
                }
                Dep::Room(d, bytes) => {
                    let e = looks.entry((r, Look::Room(d))).or_insert(Expect::Bytes(0));
                    if let Expect::Bytes(b) = e {
                        *b = (*b).max(bytes);
                    }
                }
                Dep::ReadOnly(d) => {
                    looks.insert((r, Look::ReadOnly(d)), Expect::Flag);
                }
                Dep::Content(p, c) => {
                    if c.as_ref().is_some_and(|c| c.len() > MAX_CONTENT) {
                        return Err(format!("{p} is too large to compare"));
                    }
                    kernel(&mut looks, r, p, None, Some(c))?;
                }
                Dep::Meta(p, m) => kernel(&mut looks, r, p, Some(m), None)?,
            }
        }
        let mut out = Vec::with_capacity(looks.len());
        for ((r, look), expect) in looks {
            let expect = match (&look, expect) {
                (Look::Lstat(p) | Look::Follow(p), _) => {
                    let seen = look_at(roots[r], &look);
                    match &seen {
                        Seen::Failed => return Err(format!("{p} could not be looked at")),
                        Seen::Stamp(s, _) if s.is_racily_clean(self.started) => {
                            return Err(format!("{p} changed a moment ago"));
                        }
                        _ => {}
                    }
                    Expect::Seen(seen)
                }
                (Look::Root, _) => match owner(roots[r]) {
                    Some(o) => o,
                    None => return Err("the sysroot's / could not be looked at".into()),
                },
                (_, e) => {
                    if !holds(roots[r], &look, &e) {
                        return Err(
                            "a kernel interface or a file system changed while being read".into(),
                        );
                    }
                    e
                }
            };
            out.push((r, look, expect));
        }
        Ok(Seal { looks: pruned(out) })
    }
}

/// Adds what a read of the kernel interface `p` showed to its look; an answer that
/// differs from an earlier read's in the same computation is an error (it changed while
/// being read).
fn kernel(
    looks: &mut BTreeMap<(usize, Look), Expect>,
    r: usize,
    p: String,
    meta: Option<Option<Entry>>,
    content: Option<Option<Vec<u8>>>,
) -> Result<(), String> {
    let changed = || format!("{p} changed while being read");
    let e = looks
        .entry((r, Look::Kernel(p.clone())))
        .or_insert(Expect::Kernel {
            meta: None,
            content: None,
        });
    let Expect::Kernel {
        meta: m,
        content: c,
    } = e
    else {
        return Err(changed());
    };
    if let Some(meta) = meta {
        if m.as_ref().is_some_and(|old| *old != meta) {
            return Err(changed());
        }
        *m = Some(meta);
    }
    if let Some(content) = content {
        if c.as_ref().is_some_and(|old| *old != content) {
            return Err(changed());
        }
        *c = Some(content);
    }
    Ok(())
}

/// The looks whose answer the others already decide, left out (one system call each,
/// every call of a kept answer):
/// - a path below one seen absent, or seen as something other than a directory or a
///   symlink: it is absent (or not reachable) as long as that one looks the same;
/// - a followed path with no symlink on its chain nor at its end: it resolves to the
///   lexical path, whose own look is there.
fn pruned(looks: Vec<(usize, Look, Expect)>) -> Vec<(usize, Look, Expect)> {
    let seen: std::collections::HashMap<(usize, String), Seen> = looks
        .iter()
        .filter_map(|(r, look, e)| match (look, e) {
            (Look::Lstat(p), Expect::Seen(s)) => Some(((*r, p.clone()), s.clone())),
            _ => None,
        })
        .collect();
    let at = |r: usize, p: &str| seen.get(&(r, p.to_string()));
    let dead_end = |s: Option<&Seen>| match s {
        Some(Seen::Absent | Seen::NotDir) => true,
        Some(Seen::Stamp(_, k)) => !matches!(k, Kind::Dir | Kind::Symlink),
        _ => false,
    };
    looks
        .into_iter()
        .filter(|(r, look, _)| match look {
            Look::Lstat(p) => !chain(p)
                .filter(|a| *a != p.as_str())
                .any(|a| dead_end(at(*r, a))),
            Look::Follow(p) => chain(p).any(|a| {
                !matches!(
                    at(*r, a),
                    Some(
                        Seen::Stamp(_, Kind::Dir | Kind::File | Kind::Other)
                            | Seen::Absent
                            | Seen::NotDir
                    )
                )
            }),
            _ => true,
        })
        .collect()
}

impl Seal {
    /// True when every look sees again what it saw when sealed, in the same `roots` (in
    /// the same order as given to [`Trace::seal`]). Stops at the first difference.
    pub fn holds(&self, roots: &[&Sysroot]) -> bool {
        self.looks
            .iter()
            .all(|(r, look, expect)| roots.get(*r).is_some_and(|root| holds(root, look, expect)))
    }

    /// How many looks [`Seal::holds`] makes.
    pub fn looks(&self) -> usize {
        self.looks.len()
    }
}

/// `/a/b/c` → `/a`, `/a/b`, `/a/b/c`; `/` → `/` (above a path, the root itself is the
/// sysroot's descriptor).
fn chain(path: &str) -> impl Iterator<Item = &str> {
    // the sysroot's own directory when the path is it (a listing of "/"): its entries
    // are what was read, and its stamp changes with them. Above any other path "/" is
    // not looked at: an entry of it replaced shows in that entry's own look.
    let root = path.trim_start_matches('/').is_empty().then_some("/");
    root.into_iter().chain(
        path.match_indices('/')
            .skip(1)
            .map(|(i, _)| &path[..i])
            .chain(std::iter::once(path))
            .filter(|p| !p.is_empty() && *p != "/"),
    )
}

fn relative(path: &str) -> &str {
    match path.trim_start_matches('/') {
        "" => ".",
        r => r,
    }
}

fn look_at(root: &Sysroot, look: &Look) -> Seen {
    let answer = match look {
        Look::Lstat(p) => rustix::fs::statat(&root.root, relative(p), AtFlags::SYMLINK_NOFOLLOW),
        Look::Follow(p) => match super::beneath::open_following(&root.root, p, false) {
            Ok(Some(fd)) => rustix::fs::fstat(&fd),
            Ok(None) => Err(rustix::io::Errno::NOENT),
            Err(()) => return Seen::Failed,
        },
        _ => return Seen::Failed,
    };
    match answer {
        Ok(st) => Seen::Stamp(Stamp::of(&st), super::kind_of(&st)),
        Err(rustix::io::Errno::NOENT) => Seen::Absent,
        Err(rustix::io::Errno::NOTDIR) => Seen::NotDir,
        Err(_) => Seen::Failed,
    }
}

fn holds(root: &Sysroot, look: &Look, expect: &Expect) -> bool {
    match (look, expect) {
        (Look::Lstat(_) | Look::Follow(_), Expect::Seen(seen)) => {
            *seen != Seen::Failed && look_at(root, look) == *seen
        }
        (Look::Room(d), Expect::Bytes(bytes)) => statvfs(root, d).is_some_and(|v| {
            !v.f_flag.contains(StatVfsMountFlags::RDONLY)
                && v.f_bavail.saturating_mul(v.f_frsize) >= *bytes
        }),
        (Look::ReadOnly(d), Expect::Flag) => {
            statvfs(root, d).is_some_and(|v| v.f_flag.contains(StatVfsMountFlags::RDONLY))
        }
        (Look::Kernel(p), Expect::Kernel { meta, content }) => {
            look_kernel(root, p, content.is_some()).is_some_and(|(m, c)| {
                meta.as_ref().is_none_or(|want| *want == m)
                    && content.as_ref().is_none_or(|want| *want == c)
            })
        }
        (Look::Root, e @ Expect::Owner(..)) => owner(root).as_ref() == Some(e),
        _ => false,
    }
}

/// A kernel interface path opened once as [`Sysroot::read`] and [`Sysroot::stat`] reach
/// it (below the sysroot, no symlink followed: `openat2(RESOLVE_IN_ROOT |
/// RESOLVE_NO_SYMLINKS)`), with its metadata and, when `read`, its content (a regular file
/// only, at most [`MAX_CONTENT`] bytes); None when it can not be looked at that way (the
/// look then fails: the seal does not hold).
fn look_kernel(root: &Sysroot, p: &str, read: bool) -> Option<(Option<Entry>, Option<Vec<u8>>)> {
    use std::io::Read;
    let fd = match rustix::fs::openat2(
        &root.root,
        relative(p),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
        rustix::fs::ResolveFlags::IN_ROOT
            | rustix::fs::ResolveFlags::NO_SYMLINKS
            | rustix::fs::ResolveFlags::NO_MAGICLINKS,
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Some((None, None)),
        Err(_) => return None,
    };
    let st = rustix::fs::fstat(&fd).ok()?;
    let entry = super::entry_of(&st);
    if !read {
        return Some((Some(entry), None));
    }
    if entry.kind != Kind::File {
        return None;
    }
    let mut buf = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_CONTENT as u64 + 1)
        .read_to_end(&mut buf)
        .ok()?;
    Some((Some(entry), Some(buf)))
}

/// The owner, group and mode of the sysroot's `/` (the descriptor it was opened as).
fn owner(root: &Sysroot) -> Option<Expect> {
    let st = rustix::fs::fstat(&root.root).ok()?;
    Some(Expect::Owner(st.st_uid, st.st_gid, st.st_mode))
}

/// `statvfs` of the directory `dir` by its host path (one system call; the seal looks at
/// the directory's chain as well, so no symlink has come onto the way).
fn statvfs(root: &Sysroot, dir: &str) -> Option<rustix::fs::StatVfs> {
    rustix::fs::statvfs(root.path.join(relative(dir))).ok()
}

#[cfg(test)]
mod tests;
