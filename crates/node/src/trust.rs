//! Trust of what the agent obeys: the ownership and mode rule of OpenSSH's `StrictModes`,
//! sudoers and doas, for every file the agent reads to decide what to write or run as root
//! (`config.toml`, the `node.d` drop-ins, the TLS certificates and keys a config key names)
//! and every directory it writes its own files in (the metrics textfile).
//!
//! The rule ([`check`]): the file and **every directory from it up to `/`** are owned by
//! root or by the agent's own effective uid (root in production; the euid lets the tests
//! run unprivileged) and are neither group- nor other-writable. A sticky directory that
//! others can write (`/tmp`) is not trusted either. This is OpenSSH's `safe_path()`
//! (`misc.c`, used by `auth.c` for `authorized_keys` under `StrictModes yes`: owner root or
//! the user, `(st_mode & 022) == 0`, each parent up to `/`), without its stop at the home
//! directory; sudo (`sudo_secure_file`) and doas (`parseconfig`) apply the same owner and
//! `022` test to their own files.
//!
//! The checks are made on open file descriptors, never on names: each component is opened
//! with `O_NOFOLLOW` relative to its (already checked) parent and `fstat`ed, so what is
//! checked is what is read (no time-of-check to time-of-use window). Host paths (the config
//! and the files it names) may pass symlinks: a link is read in its already trusted
//! directory and its target walked the same way (at most 40 links, the kernel's limit).
//! Paths inside the sysroot never follow a symlink (the sysroot rule); the walk starts at
//! the sysroot's own directory, which is checked too. Its host ancestors are not: the
//! sysroot is opened once at start-up and every later access is relative to that
//! descriptor, so renaming its ancestors can not redirect them (in production it is `/`).

use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{FileType, Mode, OFlags};

/// The uid that may own what the agent trusts besides root: its effective uid (root in
/// production).
pub fn expected_owner() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// A file or directory that breaks the ownership/mode rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Untrusted {
    /// The path as reached (host path, or node path inside the sysroot).
    pub path: String,
    /// True for a directory.
    pub dir: bool,
    /// Its owner uid.
    pub uid: u32,
    /// Its permission bits (mask 0o7777).
    pub mode: u32,
    /// What is wrong ("owned by another user", "writable by its group", ...).
    pub reason: &'static str,
}

impl std::fmt::Display for Untrusted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let me = expected_owner();
        let owners = if me == 0 {
            "root".to_string()
        } else {
            format!("root or uid {me}")
        };
        write!(
            f,
            "{path}: untrusted {what} (owner uid {uid}, mode {mode:04o}: {reason}); it must be owned by {owners} and not writable by group or others, like every directory up to / (sshd StrictModes)",
            path = self.path,
            what = if self.dir { "directory" } else { "file" },
            uid = self.uid,
            mode = self.mode,
            reason = self.reason,
        )
    }
}

/// Why a trusted read or walk failed; each names the path.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// A file or directory on the way breaks the rule.
    #[error("{0}")]
    Untrusted(Untrusted),
    /// The path (or a directory on its way) does not exist.
    #[error("{path}: does not exist")]
    Missing {
        /// The first missing path.
        path: String,
    },
    /// A symlink inside the sysroot (never followed there).
    #[error("{path}: is a symlink; inplaced never follows symlinks in node paths")]
    Symlink {
        /// The symlink's path.
        path: String,
    },
    /// A directory was needed and something else is there, or a regular file was needed.
    #[error("{path}: is not a {wanted}")]
    Kind {
        /// The path.
        path: String,
        /// "directory" or "regular file".
        wanted: &'static str,
    },
    /// The path is not absolute and normalized, or more than 40 symlinks were followed.
    #[error("{path}: {why}")]
    BadPath {
        /// The path.
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Any other I/O error.
    #[error("{path}: {op}: {error}")]
    Io {
        /// The path.
        path: String,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        error: io::Error,
    },
}

impl TrustError {
    /// True when the path or a directory on its way is absent.
    pub fn is_missing(&self) -> bool {
        matches!(self, TrustError::Missing { .. })
    }
}

fn io_err(path: &str, op: &'static str, e: impl Into<io::Error>) -> TrustError {
    TrustError::Io {
        path: path.to_string(),
        op,
        error: e.into(),
    }
}

/// Checks one `fstat` result against the rule: owner root or [`expected_owner`], no
/// group- or other-write bit (sticky or not).
pub fn check(path: &str, st: &rustix::fs::Stat) -> Result<(), Untrusted> {
    let mode = st.st_mode & 0o7777;
    let reason = if st.st_uid != 0 && st.st_uid != expected_owner() {
        "owned by another user"
    } else if mode & 0o002 != 0 && mode & 0o1000 != 0 {
        "writable by others (sticky)"
    } else if mode & 0o002 != 0 {
        "writable by others"
    } else if mode & 0o020 != 0 {
        "writable by its group"
    } else {
        return Ok(());
    };
    Err(Untrusted {
        path: path.to_string(),
        dir: FileType::from_raw_mode(st.st_mode) == FileType::Directory,
        uid: st.st_uid,
        mode,
        reason,
    })
}

/// `fstat` of `fd` checked against the rule; returns the stat.
fn checked(fd: BorrowedFd<'_>, path: &str) -> Result<rustix::fs::Stat, TrustError> {
    let st = rustix::fs::fstat(fd).map_err(|e| io_err(path, "stat", e))?;
    check(path, &st).map_err(TrustError::Untrusted)?;
    Ok(st)
}

fn join(base: &str, name: &str) -> String {
    if base.ends_with('/') {
        format!("{base}{name}")
    } else {
        format!("{base}/{name}")
    }
}

/// Opens the directory `parts` below `start` (whose path is `label`, `/` for the root),
/// checking `start` and each directory on the way, `O_NOFOLLOW` per component.
///
/// # Errors
/// [`TrustError::Untrusted`] for the first directory that breaks the rule,
/// [`TrustError::Missing`], [`TrustError::Symlink`], [`TrustError::Kind`].
pub fn open_dir(start: BorrowedFd<'_>, label: &str, parts: &[&str]) -> Result<OwnedFd, TrustError> {
    let mut fd = rustix::io::dup(start).map_err(|e| io_err(label, "dup", e))?;
    checked(fd.as_fd(), label)?;
    let mut path = label.to_string();
    for c in parts {
        path = join(&path, c);
        fd = open_component(fd.as_fd(), c, &path, true)?;
        checked(fd.as_fd(), &path)?;
    }
    Ok(fd)
}

/// Opens `name` in `dir` with `O_NOFOLLOW` (a directory when `dir_wanted`).
fn open_component(
    dir: BorrowedFd<'_>,
    name: &str,
    path: &str,
    dir_wanted: bool,
) -> Result<OwnedFd, TrustError> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let flags = if dir_wanted {
        flags | OFlags::DIRECTORY
    } else {
        flags
    };
    match rustix::fs::openat(dir, name, flags, Mode::empty()) {
        Ok(fd) => Ok(fd),
        Err(rustix::io::Errno::NOENT) => Err(TrustError::Missing {
            path: path.to_string(),
        }),
        Err(rustix::io::Errno::LOOP) => Err(TrustError::Symlink {
            path: path.to_string(),
        }),
        Err(rustix::io::Errno::NOTDIR) => {
            match rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
                    Err(TrustError::Symlink {
                        path: path.to_string(),
                    })
                }
                _ => Err(TrustError::Kind {
                    path: path.to_string(),
                    wanted: "directory",
                }),
            }
        }
        Err(e) => Err(io_err(path, "open", e)),
    }
}

/// Reads the regular file `name` in the (already checked) directory `dir`, checking the
/// opened file itself; `path` names it in errors. `Ok(None)` when it is absent.
pub fn read_file_at(
    dir: BorrowedFd<'_>,
    name: &str,
    path: &str,
) -> Result<Option<Vec<u8>>, TrustError> {
    let fd = match open_component(dir, name, path, false) {
        Ok(fd) => fd,
        Err(TrustError::Missing { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    read_checked(fd, path).map(Some)
}

/// Checks and reads an opened file: a regular file, trusted.
fn read_checked(fd: OwnedFd, path: &str) -> Result<Vec<u8>, TrustError> {
    let st = checked(fd.as_fd(), path)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(TrustError::Kind {
            path: path.to_string(),
            wanted: "regular file",
        });
    }
    let mut buf = Vec::new();
    std::fs::File::from(fd)
        .read_to_end(&mut buf)
        .map_err(|e| io_err(path, "read", e))?;
    Ok(buf)
}

/// Most symlinks followed in one host path (the kernel's `ELOOP` limit).
const MAX_LINKS: usize = 40;

/// Reads the host file `path` (relative paths start at the current directory) when it
/// and every directory from it up to `/` pass [`check`]. Symlinks on the way are followed
/// as the kernel would, each read in its already checked directory, and the directories
/// its target passes are checked too.
///
/// # Errors
/// [`TrustError::Untrusted`] naming the first path that breaks the rule (owner, mode),
/// [`TrustError::Missing`] when it is absent, others for I/O.
pub fn read_host(path: &Path) -> Result<Vec<u8>, TrustError> {
    let (fd, reached) = walk_host(path, false)?;
    read_checked(fd, &reached)
}

/// Checks the host directory `path` and every directory up to `/` as [`read_host`] does
/// for a file (symlinks on the way followed and their targets checked).
///
/// # Errors
/// As [`read_host`]; [`TrustError::Kind`] when `path` is not a directory.
pub fn check_host_dir(path: &Path) -> Result<(), TrustError> {
    let (fd, reached) = walk_host(path, true)?;
    checked(fd.as_fd(), &reached).map(|_| ())
}

/// Opens the host path `path` component by component (the last one a directory when
/// `dir`), checking every directory passed; the last one is opened, not checked. Returns
/// it with the path it was reached at.
fn walk_host(path: &Path, want_dir: bool) -> Result<(OwnedFd, String), TrustError> {
    let shown = path.display().to_string();
    let abs = std::path::absolute(path).map_err(|e| io_err(&shown, "resolve", e))?;
    let text = abs.to_str().ok_or_else(|| TrustError::BadPath {
        path: shown.clone(),
        why: "not UTF-8",
    })?;
    let root = rustix::fs::open(
        "/",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err("/", "open", e))?;
    checked(root.as_fd(), "/")?;
    // the directories walked so far, `/` first, with their names
    let mut stack: Vec<(OwnedFd, String)> = vec![(root, "/".to_string())];
    let mut todo: std::collections::VecDeque<String> = split(text);
    let mut links = 0;
    while let Some(c) = todo.pop_front() {
        let Some((dir, here)) = stack.last().map(|(f, p)| (f.as_fd(), p.clone())) else {
            break;
        };
        if c == ".." {
            if stack.len() > 1 {
                stack.pop();
            }
            continue;
        }
        let p = join(&here, &c);
        let last = todo.is_empty();
        match open_component(dir, &c, &p, want_dir || !last) {
            Ok(fd) if last => return Ok((fd, p)),
            Ok(fd) => {
                checked(fd.as_fd(), &p)?;
                stack.push((fd, p));
            }
            Err(TrustError::Symlink { .. }) => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(TrustError::BadPath {
                        path: shown,
                        why: "more than 40 symlinks",
                    });
                }
                let target = rustix::fs::readlinkat(dir, c.as_str(), Vec::new())
                    .map_err(|e| io_err(&p, "readlink", e))?;
                let target = target.to_string_lossy().into_owned();
                if target.starts_with('/') {
                    stack.truncate(1);
                }
                for (i, t) in split(&target).into_iter().enumerate() {
                    todo.insert(i, t);
                }
            }
            Err(e) => return Err(e),
        }
    }
    // `/` itself, or a path that ends at it (`/..`)
    match stack.pop() {
        Some((fd, p)) if want_dir => Ok((fd, p)),
        _ => Err(TrustError::Kind {
            path: shown,
            wanted: "regular file",
        }),
    }
}

/// The first of the host files `(config key, path)` that breaks the rule, as
/// `<key> <problem naming path, owner and mode>`; `None` when every one passes or can not
/// be read for another reason (left to the loader's own error: missing, not PEM...).
pub fn first_untrusted(files: &[(String, &str)]) -> Option<String> {
    files
        .iter()
        .find_map(|(key, path)| match read_host(Path::new(path)) {
            Err(TrustError::Untrusted(u)) => Some(format!("{key} {u}")),
            _ => None,
        })
}

/// The components of a path, without empty ones and `.`.
fn split(p: &str) -> std::collections::VecDeque<String> {
    p.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(String::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A directory with trusted ancestors: below the cargo target directory, not /tmp.
    /// A directory under the target directory's `tmp` (the test binary is
    /// `<target>/debug/deps/<name>`), or `INPLACED_TEST_TMPDIR`: not the checkout, which
    /// may sit under a directory others can write (a clone under /tmp).
    fn trusted_tmp() -> tempfile::TempDir {
        let base = std::env::var_os("INPLACED_TEST_TMPDIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                let exe = std::env::current_exe().unwrap();
                let target = exe.ancestors().nth(3).unwrap().to_path_buf();
                target.join("tmp")
            });
        std::fs::create_dir_all(&base).unwrap();
        tempfile::tempdir_in(base).unwrap()
    }

    #[test]
    fn tmp_is_not_trusted_and_says_why() {
        let st = rustix::fs::stat("/tmp").unwrap();
        let e = check("/tmp", &st).unwrap_err();
        assert_eq!(e.reason, "writable by others (sticky)");
        assert!(e.to_string().contains("mode 1777"), "{e}");
    }

    #[test]
    fn host_reads_check_file_and_directories() {
        let d = trusted_tmp();
        chmod(d.path(), 0o755);
        let f = d.path().join("c.toml");
        std::fs::write(&f, "x").unwrap();
        chmod(&f, 0o644);
        assert_eq!(read_host(&f).unwrap(), b"x");
        chmod(&f, 0o664);
        let e = read_host(&f).unwrap_err().to_string();
        assert!(
            e.contains("mode 0664") && e.contains("writable by its group"),
            "{e}"
        );
        chmod(&f, 0o600);
        chmod(d.path(), 0o757);
        let e = read_host(&f).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{}: untrusted directory", d.path().display())),
            "{e}"
        );
        chmod(d.path(), 0o755);
        // a link in a trusted directory to a file in an untrusted one
        let bad = d.path().join("bad");
        std::fs::create_dir(&bad).unwrap();
        chmod(&bad, 0o777);
        std::fs::write(bad.join("t"), "y").unwrap();
        chmod(&bad.join("t"), 0o600);
        std::os::unix::fs::symlink("bad/t", d.path().join("l")).unwrap();
        let e = read_host(&d.path().join("l")).unwrap_err().to_string();
        assert!(e.contains("/bad: untrusted directory"), "{e}");
        chmod(&bad, 0o700);
        assert_eq!(read_host(&d.path().join("l")).unwrap(), b"y");
        assert!(
            read_host(&d.path().join("absent"))
                .unwrap_err()
                .is_missing()
        );
    }
}
