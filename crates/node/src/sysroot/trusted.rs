//! The sysroot's reads and writes under the ownership/mode rule of
//! [`crate::trust`]: the agent's own inputs (`node.d`) and the directories it writes
//! in but does not create (the metrics textfile's).

use std::io;
use std::os::fd::AsFd;

use super::{Durability, Sysroot, SysrootError, components};
use crate::trust;
use crate::trust::TrustError;

impl Sysroot {
    /// Writes `content` to `path` (a file of a directory the agent does not create, such
    /// as the metrics textfile's) only when its directory and every one above it pass
    /// [`crate::trust::check`], owned by the agent's uid and gid with `mode`, as
    /// [`Sysroot::write_atomic`] does otherwise (unique `O_EXCL` temporary, rename, a
    /// symlink at `path` refused). A missing directory is [`TrustError::Missing`], never
    /// created.
    pub fn write_trusted(
        &self,
        path: &str,
        content: &[u8],
        mode: u32,
    ) -> std::result::Result<(), TrustError> {
        let parts = components(path).map_err(|_| TrustError::BadPath {
            path: path.to_string(),
            why: "not an absolute, normalized node path",
        })?;
        let Some((name, parents)) = parts.split_last() else {
            return Err(TrustError::BadPath {
                path: path.to_string(),
                why: "not a file",
            });
        };
        let dir = trust::open_dir(self.root.as_fd(), "/", parents)?;
        let owner = (
            mode,
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        );
        self.write_in_dir(
            &dir,
            name,
            path,
            super::Content::Bytes(content),
            owner,
            Durability::Durable,
        )
        .map_err(|e| match e {
            SysrootError::Symlink { path } => TrustError::Symlink { path },
            SysrootError::NotADirectory { path, .. } => TrustError::Kind {
                path,
                wanted: "regular file",
            },
            other => TrustError::Io {
                path: path.to_string(),
                op: "write",
                error: io::Error::other(other.to_string()),
            },
        })
    }

    /// Reads the regular file `path` when it and every directory from it up to the
    /// sysroot's `/` pass [`crate::trust::check`] (no symlink followed);
    /// `Ok(None)` when it or a directory on its way is absent.
    pub fn read_trusted(&self, path: &str) -> std::result::Result<Option<Vec<u8>>, TrustError> {
        self.note_path(path);
        let parts = components(path).map_err(|_| TrustError::BadPath {
            path: path.to_string(),
            why: "not an absolute, normalized node path",
        })?;
        let Some((name, parents)) = parts.split_last() else {
            return Err(TrustError::Kind {
                path: path.to_string(),
                wanted: "regular file",
            });
        };
        let dir = match trust::open_dir(self.root.as_fd(), "/", parents) {
            Ok(d) => d,
            Err(e) if e.is_missing() => return Ok(None),
            Err(e) => return Err(e),
        };
        trust::read_file_at(dir.as_fd(), name, path)
    }

    /// Checks the directory `path` and every one above it up to the sysroot's `/`
    /// against [`crate::trust::check`]; `Ok(false)` when one is absent.
    pub fn check_trusted_dir(&self, path: &str) -> std::result::Result<bool, TrustError> {
        self.note_path(path);
        let parts = components(path).map_err(|_| TrustError::BadPath {
            path: path.to_string(),
            why: "not an absolute, normalized node path",
        })?;
        match trust::open_dir(self.root.as_fd(), "/", &parts) {
            Ok(_) => Ok(true),
            Err(e) if e.is_missing() => Ok(false),
            Err(e) => Err(e),
        }
    }
}
