//! Whether a path can be written at all, asked before an operation is approved
//! (issue 27 §3): the immutable or append-only attribute (`chattr +i`, `+a`; read with
//! `FS_IOC_GETFLAGS`, ioctl_iflags(2)) on the file or on its directory, a read-only mount
//! (`statvfs(3)` `ST_RDONLY`), and too little space on its filesystem for the new
//! content. Each answer names the path and the fix; the kernel would only say `EPERM`,
//! `EROFS` or `ENOSPC` half-way through an operation.

use rustix::fs::{IFlags, Mode, OFlags, StatVfsMountFlags};
use std::os::fd::{AsFd, OwnedFd};

use super::trace::Dep;
use super::{Result, Sysroot, components, io_err, join};

/// The attribute of `fd` that stops a replace or a removal, in words (None: none, or a
/// filesystem that has no attributes).
fn attribute(fd: impl AsFd, what: &str, path: &str) -> Option<String> {
    let flags = rustix::fs::ioctl_getflags(fd).ok()?;
    if flags.contains(IFlags::IMMUTABLE) {
        return Some(format!(
            "{what} {path} has the immutable attribute (chattr +i): it can not be replaced, changed or removed, not even by root; clear it with `chattr -i {path}` if the change is meant"
        ));
    }
    if flags.contains(IFlags::APPEND) {
        return Some(format!(
            "{what} {path} has the append-only attribute (chattr +a): it can only be appended to, not replaced or removed; clear it with `chattr -a {path}` if the change is meant"
        ));
    }
    None
}

impl Sysroot {
    /// Why `path` could not be written (replaced with `bytes` of new content) or removed,
    /// looking at the file, its nearest existing directory and that directory's
    /// filesystem; `Ok(None)` when nothing known stops it. Never follows a symlink.
    pub fn write_blocker(&self, path: &str, bytes: u64) -> Result<Option<String>> {
        self.note_path(path);
        Self::noted(self.write_blocker_untraced(path, bytes))
    }

    fn write_blocker_untraced(&self, path: &str, bytes: u64) -> Result<Option<String>> {
        let parts = components(path)?;
        let Some((name, parents)) = parts.split_last() else {
            return Ok(None);
        };
        // the nearest directory that exists (the write creates the rest under it)
        let mut depth = parents.len();
        let dir: OwnedFd = loop {
            if let Some(fd) = self.open_dir(&parents[..depth])? {
                break fd;
            }
            if depth == 0 {
                return Ok(None);
            }
            depth -= 1;
        };
        let dir_path = join(&parents[..depth]);
        if depth == parents.len()
            && let Ok(f) = rustix::fs::openat(
                &dir,
                *name,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            )
            && let Some(why) = attribute(&f, "the file", path)
        {
            return Ok(Some(why));
        }
        if let Some(why) = attribute(&dir, "its directory", &dir_path) {
            return Ok(Some(why));
        }
        let vfs = rustix::fs::fstatvfs(&dir).map_err(|e| io_err(&dir_path, "statvfs", e))?;
        if vfs.f_flag.contains(StatVfsMountFlags::RDONLY) {
            self.note(|| Dep::ReadOnly(dir_path.clone()));
            return Ok(Some(format!(
                "{dir_path} is on a read-only mount (statvfs ST_RDONLY): remount it read-write, or manage the setting elsewhere"
            )));
        }
        let free = vfs.f_bavail.saturating_mul(vfs.f_frsize);
        if bytes > free {
            super::trace::poison("a file system's free space was named");
            return Ok(Some(format!(
                "the filesystem of {dir_path} has {free} bytes free and the new content of {path} needs {bytes}: free space there"
            )));
        }
        self.note(|| Dep::Room(dir_path, bytes));
        Ok(None)
    }
}

impl Sysroot {
    /// How many hard links the regular file `path` has (`st_nlink`); `Ok(None)` when it
    /// is absent or not a regular file. An atomic replace (rename over it) leaves the
    /// other links with the old content.
    pub fn hard_links(&self, path: &str) -> Result<Option<u64>> {
        self.note_path(path);
        Ok(Self::noted(self.lstat(path))?
            .filter(|st| {
                rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile
            })
            .map(|st| st.st_nlink))
    }
}

#[cfg(test)]
mod tests {
    use super::Sysroot;

    /// Too little space is named with the numbers; an ordinary file is writable.
    #[test]
    fn too_little_space_is_named_and_a_plain_file_is_writable() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/a.conf"), "x").unwrap();
        let root = Sysroot::open(dir.path()).unwrap();
        assert_eq!(root.write_blocker("/etc/a.conf", 1).unwrap(), None);
        assert_eq!(root.write_blocker("/etc/new/b.conf", 1).unwrap(), None);
        let why = root
            .write_blocker("/etc/a.conf", u64::MAX)
            .unwrap()
            .unwrap();
        assert!(
            why.starts_with("the filesystem of /etc has ")
                && why.ends_with(&format!(
                    "bytes free and the new content of /etc/a.conf needs {}: free space there",
                    u64::MAX
                )),
            "{why}"
        );
    }
}
