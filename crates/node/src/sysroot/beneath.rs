//! Path resolution in one system call: `openat2(2)` with `RESOLVE_IN_ROOT |
//! RESOLVE_NO_SYMLINKS` opens a node path below the sysroot's descriptor the way the
//! per-component walk of [`Sysroot`] does (no symlink followed on the way, nothing
//! outside the sysroot reached), in the kernel instead of one `openat` per component:
//! `/etc/kubernetes/kubelet` was four system calls and three descriptors, now it is one.
//!
//! Only the answers that need no interpretation are taken from it: an opened directory,
//! and `ENOENT` (a component is missing: with no symlink followed and no `..`, a missing
//! component can only be one of the path's own). Every other error (a symlink or a file
//! on the way, a kernel without `openat2` (Linux < 5.6: `ENOSYS`), a seccomp filter
//! refusing it (`EPERM`), `EAGAIN` from a concurrent rename) hands the path to the
//! per-component walk, which names the component at fault exactly as before.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// False once the kernel said it has no `openat2` (`ENOSYS`): the walk is used from then on.
static AVAILABLE: AtomicBool = AtomicBool::new(true);

/// Uses `openat2` (true, when the kernel has it) or the per-component walk (false), for
/// tests that the two answer alike.
#[cfg(test)]
pub(super) fn set_available(on: bool) {
    AVAILABLE.store(on, Ordering::Relaxed);
}

/// What one `openat2` of a directory found.
pub(super) enum Beneath {
    /// The directory, opened read-only.
    Dir(OwnedFd),
    /// A component of the path is missing.
    Absent,
    /// Anything else: ask the per-component walk.
    Walk,
}

/// Opens the directory made of `parts` (validated components, at least one) below
/// `root`, with no symlink followed on the way or at the end.
pub(super) fn open_dir(root: &OwnedFd, parts: &[&str]) -> Beneath {
    if parts.is_empty() || !AVAILABLE.load(Ordering::Relaxed) {
        return Beneath::Walk;
    }
    let rel = parts.join("/");
    match rustix::fs::openat2(
        root,
        rel.as_str(),
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    ) {
        Ok(fd) => Beneath::Dir(fd),
        Err(rustix::io::Errno::NOENT) => Beneath::Absent,
        Err(rustix::io::Errno::NOSYS) => {
            AVAILABLE.store(false, Ordering::Relaxed);
            Beneath::Walk
        }
        Err(_) => Beneath::Walk,
    }
}

/// Opens `path` (a node path) following symlinks the way the kernel would with the
/// sysroot as `/` (`RESOLVE_IN_ROOT`: an absolute target starts again at the sysroot,
/// `..` never goes above it), `O_NONBLOCK` so that a FIFO never blocks; `directory`
/// asks for a directory. `Ok(None)`: absent; `Err(())`: ask the walk of
/// [`super::Sysroot::resolve`] (it words the errors).
pub(super) fn open_following(
    root: &OwnedFd,
    path: &str,
    directory: bool,
) -> std::result::Result<Option<OwnedFd>, ()> {
    if !AVAILABLE.load(Ordering::Relaxed) {
        return Err(());
    }
    let rel = path.trim_start_matches('/');
    let rel = if rel.is_empty() { "." } else { rel };
    let mut flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC;
    if directory {
        flags |= OFlags::DIRECTORY;
    }
    match rustix::fs::openat2(
        root,
        rel,
        flags,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(rustix::io::Errno::NOSYS) => {
            AVAILABLE.store(false, Ordering::Relaxed);
            Err(())
        }
        Err(_) => Err(()),
    }
}
