//! What was derived from a node file, kept while the file stays the same (issue 28):
//! coverage read and parsed the kubelet config, the flags file and every sysctl.d file on
//! every call. A [`Memo`] keeps the derived value with the [`Stamp`] of the file it was
//! read from (device, inode, size, mtime and ctime in ns), and a later read that finds
//! the same stamp gets the value back after one `stat` instead of open, read and parse.
//!
//! **The stamp is of the file that is read.** A probe (no symlink followed) looks at the
//! name with `statat(AT_SYMLINK_NOFOLLOW)` in the parent directory opened exactly as
//! [`Sysroot::probe`] opens it, and a miss reads through that same descriptor, keeping the
//! `fstat` of the opened file; a following read opens the file once (`RESOLVE_IN_ROOT`),
//! `fstat`s that descriptor and reads it on a miss. A directory listing is keyed by the
//! directory's own stamp (an entry added, removed or renamed changes its mtime and ctime).
//! Every sysroot rule holds: the reads are the sysroot's, only what they return is kept.
//!
//! **Racily clean** (git's rule, `Documentation/technical/racy-git.txt`): file times come
//! from a coarse clock (a jiffy; 2 s on FAT), so a second write soon after the first may
//! leave the stamp equal. A value is kept only when the file's mtime and ctime are older
//! than [`MemoLimits::racy`] (50 ms) before the read began, or [`MemoLimits::racy_coarse`]
//! (2 s) for times without a sub-second part (FAT); otherwise it is read again next time,
//! until it has settled. ctime can not be set from user space, so a rewrite that puts the
//! mtime back (`touch -d`) still changes the stamp. Not covered: a file system whose
//! times come from another clock (NFS with a skewed server), and a wall clock stepped
//! back onto a kept ctime to the nanosecond with an in-place rewrite of the same size.
//!
//! Never for `/proc` or `/sys`: their times do not follow their content (the callers read
//! running state without a memo).
//!
//! **Bounded**: at most [`MemoLimits::entries`] values and [`MemoLimits::bytes`] of what
//! was read for them (a file larger than [`MemoLimits::entry_bytes`] is never kept); the
//! least recently used value goes first. A value whose file changed is dropped when the
//! change is seen.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::AtFlags;

use super::{Kind, Probe, Result, Stamp, Sysroot, SysrootError, components, io_err, kind_of};

impl Stamp {
    /// The stamp of a `stat` answer.
    // the stat fields' integer types differ between architectures
    #[allow(clippy::unnecessary_cast)]
    pub(super) fn of(st: &rustix::fs::Stat) -> Stamp {
        Stamp([
            st.st_dev as u64,
            st.st_ino as u64,
            st.st_size as u64,
            st.st_mtime as u64,
            st.st_mtime_nsec as u64,
            st.st_ctime as u64,
            st.st_ctime_nsec as u64,
        ])
    }

    /// The later of the file's mtime and ctime, in ns since the Unix epoch.
    fn changed_ns(&self) -> i128 {
        let ns = |s: u64, n: u64| i128::from(s as i64) * 1_000_000_000 + i128::from(n);
        ns(self.0[3], self.0[4]).max(ns(self.0[5], self.0[6]))
    }

    /// True when neither time has a sub-second part: the file system keeps whole (or
    /// two) seconds (FAT, ext3's small inodes), or, one time in a billion, a fine one
    /// landed on a whole second; either way the coarse margin applies.
    pub(super) fn is_coarse(&self) -> bool {
        self.0[4] == 0 && self.0[6] == 0
    }

    /// The racily-clean rule: true when the file's mtime or ctime is less than `margin`
    /// before `read_at` (a time since the Unix epoch taken before the read began), or
    /// after it. A value read from such a file is not kept: a second write within the
    /// same clock tick could leave the stamp equal with other content.
    pub fn is_racy(&self, read_at: Duration, margin: Duration) -> bool {
        self.changed_ns() + margin.as_nanos() as i128 >= read_at.as_nanos() as i128
    }

    /// [`Stamp::is_racy`] with the usual margins: [`RACY`] (50 ms), or [`RACY_COARSE`]
    /// (2 s) for times without a sub-second part ([`Stamp::is_coarse`]). For callers
    /// outside the memo that keep what they derived from a file (a trace's seal, the
    /// state directory's operation heads).
    ///
    /// [`RACY`]: super::trace::RACY
    /// [`RACY_COARSE`]: super::trace::RACY_COARSE
    pub fn is_racily_clean(&self, read_at: Duration) -> bool {
        use super::trace::{RACY, RACY_COARSE};
        self.is_racy(read_at, if self.is_coarse() { RACY_COARSE } else { RACY })
    }
}

/// The bounds of a [`Memo`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoLimits {
    /// Most values kept (256).
    pub entries: usize,
    /// Most bytes read for the values kept, summed (1 MiB: the daemon's idle RSS target
    /// is 12 MiB, so the memo may not hold a node's worth of managed files).
    pub bytes: usize,
    /// Largest read whose value is kept (64 KiB; a kubelet config is 1–3 KiB).
    pub entry_bytes: usize,
    /// How long after a file's last change its values are not kept, for times with a
    /// sub-second part (50 ms: several jiffies of the coarse clock file times are taken
    /// from, 4 ms at HZ=250, 10 ms at HZ=100).
    pub racy: Duration,
    /// The same for times without one (2 s: FAT keeps 2 s, ext3 with 128-byte inodes 1 s).
    pub racy_coarse: Duration,
}

impl Default for MemoLimits {
    fn default() -> Self {
        MemoLimits {
            entries: 256,
            bytes: 1 << 20,
            entry_bytes: 64 << 10,
            racy: super::trace::RACY,
            racy_coarse: super::trace::RACY_COARSE,
        }
    }
}

/// How a value was read: part of its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Via {
    /// [`Sysroot::probe`] with this read limit.
    Probe(u64),
    /// [`Sysroot::read_string_following`].
    Following,
    /// [`Sysroot::list_dir`].
    List,
    /// [`Sysroot::list_dir_following`].
    ListFollowing,
}

/// A value's key: how and where it was read, its type and the function that derived it
/// (its address: two functions folded into one derive the same values).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    via: Via,
    path: String,
    ty: TypeId,
    derive: usize,
}

impl Key {
    fn new<T: 'static>(via: Via, path: &str, derive: usize) -> Key {
        Key {
            via,
            path: path.to_string(),
            ty: TypeId::of::<T>(),
            derive,
        }
    }
}

type Value = Arc<dyn Any + Send + Sync>;

struct Slot {
    stamp: Stamp,
    value: Value,
    bytes: usize,
    used: u64,
}

#[derive(Default)]
struct Slots {
    map: HashMap<Key, Slot>,
    bytes: usize,
    tick: u64,
    hits: u64,
    misses: u64,
}

/// Values derived from a sysroot's files, each kept with the stamp of the file it was
/// read from (see the module docs). One per [`Sysroot`]; shared by every reader of it.
#[derive(Default)]
pub struct Memo {
    slots: Mutex<Slots>,
    limits: MemoLimits,
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Memo")
            .field("entries", &s.map.len())
            .field("bytes", &s.bytes)
            .field("limits", &self.limits)
            .finish()
    }
}

impl Memo {
    /// An empty memo with these bounds.
    pub fn with_limits(limits: MemoLimits) -> Memo {
        Memo {
            slots: Mutex::default(),
            limits,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value kept under `key` when it was read from a file of stamp `stamp`; a value
    /// of another stamp is dropped.
    fn get(&self, key: &Key, stamp: Stamp) -> Option<Value> {
        let mut s = self.lock();
        s.tick += 1;
        let tick = s.tick;
        match s.map.get_mut(key) {
            Some(slot) if slot.stamp == stamp => {
                slot.used = tick;
                let v = slot.value.clone();
                s.hits += 1;
                Some(v)
            }
            Some(_) => {
                let bytes = s.map.remove(key).map_or(0, |old| old.bytes);
                s.bytes -= bytes;
                s.misses += 1;
                None
            }
            None => {
                s.misses += 1;
                None
            }
        }
    }

    /// Drops what is kept under `key`.
    fn forget(&self, key: &Key) {
        let mut s = self.lock();
        if let Some(old) = s.map.remove(key) {
            s.bytes -= old.bytes;
        }
    }

    /// Keeps `value`, read (`bytes` of it) from a file of stamp `stamp` by a read that
    /// began at `read_at`, unless the file is racily clean or the read too large; the
    /// least recently used values make room.
    fn put(&self, key: Key, stamp: Stamp, value: Value, bytes: usize, read_at: Duration) {
        let l = self.limits;
        let margin = if stamp.is_coarse() {
            l.racy_coarse
        } else {
            l.racy
        };
        if l.entries == 0 || bytes > l.entry_bytes || stamp.is_racy(read_at, margin) {
            return;
        }
        let mut s = self.lock();
        if let Some(old) = s.map.remove(&key) {
            s.bytes -= old.bytes;
        }
        while !s.map.is_empty() && (s.map.len() >= l.entries || s.bytes + bytes > l.bytes) {
            let Some(lru) = s
                .map
                .iter()
                .min_by_key(|(_, v)| v.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            let gone = s.map.remove(&lru).map_or(0, |v| v.bytes);
            s.bytes -= gone;
        }
        s.tick += 1;
        let used = s.tick;
        s.bytes += bytes;
        s.map.insert(
            key,
            Slot {
                stamp,
                value,
                bytes,
                used,
            },
        );
    }

    /// (values kept, bytes read for them, hits, misses) so far.
    pub fn counts(&self) -> (usize, usize, u64, u64) {
        let s = self.lock();
        (s.map.len(), s.bytes, s.hits, s.misses)
    }
}

/// Now, as a time since the Unix epoch (zero before it: nothing is then kept).
fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// `v` as the `T` its key says it is.
fn typed<T: Send + Sync + 'static>(v: Value) -> Option<Arc<T>> {
    v.downcast::<T>().ok()
}

impl Sysroot {
    /// The same root with an empty memo of these bounds (tests: a zero
    /// [`MemoLimits::racy`] keeps what was written a moment ago).
    pub fn with_memo(mut self, limits: MemoLimits) -> Self {
        self.memo = Memo::with_limits(limits);
        self
    }

    /// This root's memo.
    pub fn memo(&self) -> &Memo {
        &self.memo
    }

    /// `derive(path, what Sysroot::probe(path, max_read) finds)`, kept while the regular
    /// file at `path` keeps its stamp (see the module docs): one `statat` of the name in
    /// its parent, opened as [`Sysroot::probe`] opens it, when the value is kept. Absent
    /// paths, parents in conflict and anything but a regular file are derived afresh each
    /// time. `derive` must depend on nothing but its arguments (a `fn`, not a closure).
    ///
    /// # Errors
    /// Those of [`Sysroot::probe`].
    pub fn probe_memo<T: Send + Sync + 'static>(
        &self,
        path: &str,
        max_read: u64,
        derive: fn(&str, Probe) -> T,
    ) -> Result<Arc<T>> {
        self.note_path(path);
        Self::noted(self.probe_memo_untraced(path, max_read, derive))
    }

    fn probe_memo_untraced<T: Send + Sync + 'static>(
        &self,
        path: &str,
        max_read: u64,
        derive: fn(&str, Probe) -> T,
    ) -> Result<Arc<T>> {
        let parts = components(path)?;
        let Some((name, parents)) = parts.split_last() else {
            return Err(SysrootError::BadPath {
                path: path.to_string(),
            });
        };
        let fd = match self.probe_parents(&parts, parents)? {
            Ok(fd) => fd,
            Err(found) => return Ok(Arc::new(derive(path, found))),
        };
        let key = Key::new::<T>(Via::Probe(max_read), path, derive as usize);
        let read_at = now();
        match rustix::fs::statat(&fd, *name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if kind_of(&st) == Kind::File => {
                if let Some(v) = self.memo.get(&key, Stamp::of(&st)).and_then(typed) {
                    return Ok(v);
                }
            }
            Err(rustix::io::Errno::NOENT) => {
                self.memo.forget(&key);
                return Ok(Arc::new(derive(path, Probe::Absent)));
            }
            // not a file: what was kept for it goes, the probe words what it is
            _ => self.memo.forget(&key),
        }
        // read as Sysroot::probe reads, keeping the fstat of the file read
        for _ in 0..2 {
            if let Some((found, st)) = super::probe_name_stat(&fd, path, name, max_read)? {
                let bytes = match &found {
                    Probe::Present {
                        content: Some(c), ..
                    } => c.len(),
                    _ => 0,
                };
                let v = Arc::new(derive(path, found));
                if let Some(st) = st {
                    self.memo
                        .put(key, Stamp::of(&st), v.clone(), bytes, read_at);
                }
                return Ok(v);
            }
        }
        Err(io_err(
            path,
            "read",
            io::Error::other("replaced twice while being read; ask again"),
        ))
    }

    /// `derive(path, Sysroot::read_string_following(path))`, kept while the file the path
    /// resolves to (symlinks followed inside the sysroot) keeps its stamp: one `openat2`
    /// and one `fstat` of that file when the value is kept. Never for managed paths.
    ///
    /// # Errors
    /// Those of [`Sysroot::read_string_following`].
    pub fn read_following_memo<T: Send + Sync + 'static>(
        &self,
        path: &str,
        derive: fn(&str, Option<String>) -> T,
    ) -> Result<Arc<T>> {
        self.note_following(path);
        Self::noted(self.read_following_memo_untraced(path, derive))
    }

    fn read_following_memo_untraced<T: Send + Sync + 'static>(
        &self,
        path: &str,
        derive: fn(&str, Option<String>) -> T,
    ) -> Result<Arc<T>> {
        components(path)?;
        let read_at = now();
        match super::beneath::open_following(&self.root, path, false) {
            Ok(None) => return Ok(Arc::new(derive(path, None))),
            Ok(Some(fd)) => {
                let key = Key::new::<T>(Via::Following, path, derive as usize);
                if let Some(v) = self.read_open_memo(fd, key, read_at, path, derive) {
                    return Ok(v);
                }
            }
            Err(()) => {}
        }
        // not a regular UTF-8 file, or no openat2: the sysroot's reader words the answer
        Ok(Arc::new(derive(path, self.read_string_following(path)?)))
    }

    /// The kept value of the opened `fd` when its stamp matches, else its text read and
    /// derived (and kept); None when it is not a regular UTF-8 file.
    fn read_open_memo<T: Send + Sync + 'static>(
        &self,
        fd: OwnedFd,
        key: Key,
        read_at: Duration,
        path: &str,
        derive: fn(&str, Option<String>) -> T,
    ) -> Option<Arc<T>> {
        let st = rustix::fs::fstat(&fd).ok()?;
        if kind_of(&st) != Kind::File {
            return None;
        }
        let stamp = Stamp::of(&st);
        if let Some(v) = self.memo.get(&key, stamp).and_then(typed) {
            return Some(v);
        }
        let mut buf = Vec::with_capacity(st.st_size as usize);
        std::fs::File::from(fd).read_to_end(&mut buf).ok()?;
        let text = String::from_utf8(buf).ok()?;
        let bytes = text.len();
        let v = Arc::new(derive(path, Some(text)));
        self.memo.put(key, stamp, v.clone(), bytes, read_at);
        Some(v)
    }

    /// [`Sysroot::list_dir`] (`follow`: [`Sysroot::list_dir_following`]), kept while the
    /// directory keeps its stamp: one open and one `fstat` of the directory when kept.
    ///
    /// # Errors
    /// Those of the listing.
    pub fn list_dir_memo(&self, path: &str, follow: bool) -> Result<Arc<Option<Vec<String>>>> {
        if follow {
            self.note_following(path);
        } else {
            self.note_path(path);
        }
        Self::noted(self.list_dir_memo_untraced(path, follow))
    }

    fn list_dir_memo_untraced(&self, path: &str, follow: bool) -> Result<Arc<Option<Vec<String>>>> {
        let parts = components(path)?;
        let read_at = now();
        let dir = if follow {
            match super::beneath::open_following(&self.root, path, true) {
                Ok(None) => return Ok(Arc::new(None)),
                Ok(Some(fd)) => fd,
                Err(()) => return Ok(Arc::new(self.list_dir_following(path)?)),
            }
        } else {
            match self.open_dir(&parts)? {
                None => return Ok(Arc::new(None)),
                Some(fd) => fd,
            }
        };
        let via = if follow {
            Via::ListFollowing
        } else {
            Via::List
        };
        let key = Key::new::<Option<Vec<String>>>(via, path, 0);
        let st = rustix::fs::fstat(&dir).map_err(|e| io_err(path, "stat", e))?;
        let stamp = Stamp::of(&st);
        if let Some(v) = self.memo.get(&key, stamp).and_then(typed) {
            return Ok(v);
        }
        let names = super::names_in(dir, path)?;
        let bytes = names.iter().map(|n| n.len() + 1).sum();
        let v = Arc::new(Some(names));
        self.memo.put(key, stamp, v.clone(), bytes, read_at);
        Ok(v)
    }
}

#[cfg(test)]
mod tests;
