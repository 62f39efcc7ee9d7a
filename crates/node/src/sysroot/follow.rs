//! Symlink following inside the sysroot, for facts and for the directories a boot value
//! depends on (`/etc/os-release -> ../usr/lib/os-release`, merged-/usr `/lib -> usr/lib`):
//! links are resolved as the kernel resolves them with the sysroot as `/`, never on the
//! host. Never used for managed paths, which refuse symlinks.

use std::io::{self, Read};
use std::os::fd::OwnedFd;

use super::trace::Dep;
use super::{Result, Sysroot, components, io_err};

impl Sysroot {
    /// Reads a file for facts, following symlinks the way the node itself would but
    /// resolving them inside the sysroot (`/etc/os-release -> ../usr/lib/os-release`).
    /// At most 8 links are followed. Never used for managed paths.
    pub fn read_string_following(&self, path: &str) -> Result<Option<String>> {
        self.note_following(path);
        Self::noted(self.read_string_following_untraced(path))
    }

    /// Notes for a running trace that an answer depends on what `path` resolves to.
    pub(super) fn note_following(&self, path: &str) {
        if super::trace::is_volatile(path) {
            super::trace::poison(&format!("{path} was read in a way a trace can not check"));
        } else {
            self.note(|| Dep::Following(path.to_string()));
        }
    }

    fn read_string_following_untraced(&self, path: &str) -> Result<Option<String>> {
        components(path)?;
        match super::beneath::open_following(&self.root, path, false) {
            Ok(None) => return Ok(None),
            Ok(Some(fd)) => {
                if let Some(text) = read_regular_text(fd) {
                    return Ok(Some(text));
                }
            }
            Err(()) => {}
        }
        // not a regular UTF-8 file, or no openat2: the walk words the answer
        self.read_string(&self.resolve(path)?)
    }

    /// Sorted names in a directory reached by following symlinks inside the sysroot
    /// ([`Sysroot::resolve`]: `/lib/sysctl.d` on a merged-/usr node, where `/lib ->
    /// usr/lib`); `Ok(None)` if it is absent. Never used for managed paths.
    pub fn list_dir_following(&self, path: &str) -> Result<Option<Vec<String>>> {
        self.note_following(path);
        components(path)?;
        Self::noted(
            match super::beneath::open_following(&self.root, path, true) {
                Ok(None) => Ok(None),
                Ok(Some(dir)) => super::names_in(dir, path).map(Some),
                Err(()) => self.list_dir(&self.resolve(path)?),
            },
        )
    }

    /// The node path `path` names once every symlink on the way (a parent directory as
    /// well as the last component) is followed inside the sysroot, as the kernel resolves
    /// it with the sysroot as `/`: an absolute target starts again at the root, `..`
    /// goes up and never above `/`. Components that do not exist are kept as they are
    /// (the read of the result is then absent).
    ///
    /// # Errors
    /// [`SysrootError::Io`] after 40 links (the kernel's `ELOOP` limit) and for a link
    /// that can not be read.
    pub fn resolve(&self, path: &str) -> Result<String> {
        let mut todo: std::collections::VecDeque<String> =
            components(path)?.into_iter().map(String::from).collect();
        let mut done: Vec<String> = Vec::new();
        let mut links = 0;
        while let Some(c) = todo.pop_front() {
            match c.as_str() {
                "" | "." => continue,
                ".." => {
                    done.pop();
                    continue;
                }
                _ => {}
            }
            let here = format!(
                "/{}",
                done.iter()
                    .chain([&c])
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("/")
            );
            match self.read_link(&here)? {
                None => done.push(c),
                Some(target) => {
                    links += 1;
                    if links > 40 {
                        return Err(io_err(
                            path,
                            "resolve",
                            io::Error::other("too many levels of symbolic links"),
                        ));
                    }
                    if target.starts_with('/') {
                        done.clear();
                    }
                    let mut next: std::collections::VecDeque<String> =
                        target.split('/').map(String::from).collect();
                    next.extend(todo);
                    todo = next;
                }
            }
        }
        Ok(format!("/{}", done.join("/")))
    }
}

/// The text of the opened `fd` when it is a regular UTF-8 file; None otherwise (the
/// caller then takes the walk, which words the error exactly).
fn read_regular_text(fd: OwnedFd) -> Option<String> {
    let st = rustix::fs::fstat(&fd).ok()?;
    if super::kind_of(&st) != super::Kind::File {
        return None;
    }
    let mut buf = Vec::with_capacity(st.st_size as usize);
    std::fs::File::from(fd)
        .take(u64::MAX)
        .read_to_end(&mut buf)
        .ok()?;
    String::from_utf8(buf).ok()
}
