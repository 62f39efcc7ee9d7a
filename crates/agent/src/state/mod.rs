//! The agent's persistent state in its state directory (default `/var/lib/inplaced`):
//!
//! ```text
//! applied.json                 the applied record: what the agent manages and what was there before
//! applied-spec.pb              the NodeSpec (protobuf) applied last, drop-ins unmerged
//!                              (both as a start or a write outside an operation installed
//!                              them: a pending commit, below, is read first)
//! operations/<id>.json         one operation each (proto3 JSON of inplace.v1.Operation)
//! originals/<sha256 of path>   the original bytes of a pre-existing file, saved before its first overwrite
//! actions.log                  unit actions and reboots, with --service-manager record
//! journal/<op>.pre-<n>         pre-image of each file it writes or removes, unless the file
//!                              still has the content the applied spec gave it (then the
//!                              intent names the applied spec as its source: no copy)
//! journal/<op>.intent          write-ahead intent of the running operation (see crate::apply::journal)
//! journal/<op>.progress        the last step it completed
//! journal/<op>.commit          the commit point: the record, the phase and the NodeSpec, one
//!                              sealed file; present = roll forward, absent = roll back; kept
//!                              after its operation as the applied state, read before the
//!                              two installed files (the highest generation that verifies)
//! journal/<op>/                a journal of format 1 (inplaced up to 43048f4), still read
//! quarantine/<op>-<time>/      a journal that did not verify, moved aside whole, with REPORT;
//!                              while it is there, the files it names are claimed only as
//!                              they were before its operation (claims.rs)
//! ```
//!
//! The journal's format is versioned (format 2 now, format 1 still recovered): its layout,
//! the version rule and why a commit outlives its operation are in `journal_v2.rs`.
//!
//! The intent, progress, commit and `applied-spec.pb` are sealed ([`seal`]: a header line
//! with the body's SHA-256 and length); each pre-image's hash and length are in the intent.
//! Nothing is trusted before it verifies.
//!
//! Every file is written atomically through [`Sysroot::write_atomic`] with mode 0600,
//! durably unless said otherwise: the Staging operation and the progress marker are
//! written without an fsync (the intent and the journal hold what a crash needs of
//! them). An operation installs no record: its commit is the applied state until a start
//! or a write outside an operation installs it with fsyncs (`journal_v2.rs`). The applied record holds hashes and non-secret settings, never file content;
//! `applied-spec.pb` holds file content (secrets), which is why every file is 0600.
//!
//! The module is three rooms: `record.rs` (the applied record's schema, whose fields the
//! sections own), `journal.rs` (the journal's on-disk types, its seals and its I/O; the
//! recovery logic is in `crate::apply::journal`) and this file (the directory store: its
//! lock, atomic writes, the record and spec files, originals, the drift book); the
//! operation store is `operations.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod claims;
mod journal;
mod journal_v2;
mod operations;
mod record;
#[cfg(test)]
mod tests;
mod tries;

pub(crate) use claims::record_loss;
use claims::{CORRUPT_PREFIX, MISSING_PREFIX};

/// What a start found wrong with the applied record ([`StateDir::load_record_or_quarantine`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RecordProblem {
    /// The quarantined record or lost-record marker the start made, full path: the
    /// problem holds while that file is there. None for a problem that names no such
    /// file (a cut-short install read again from its commit).
    pub file: Option<String>,
    /// What happened and the fix, for status.
    pub message: String,
}

use inplace_node::sysroot::{Durability, Sysroot, SysrootError};
use inplace_wire::pb;

pub(crate) use journal::{
    AppliedContents, Committed, EffectEntry, Intent, IntentEntry, JournalState,
    PRE_FROM_APPLIED_SPEC, PreImage, Sealed, seal,
};
pub(crate) use record::{
    AppliedRecord, ManagedField, ManagedFile, ManagedValue, Original, PendingRemoval, StagedTrial,
};

pub(crate) use journal_v2::JOURNAL_VERSION;

use journal::{SEAL, unseal};

/// The applied record as [`StateDir::read_record`] found it: borrowed from the parsed
/// pending commit (shared, not copied) or read from the installed `applied.json`.
/// Dereferences to the [`AppliedRecord`].
#[derive(Debug)]
pub struct RecordView(View);

#[derive(Debug)]
enum View {
    Commit(std::sync::Arc<journal_v2::AppliedCopy>),
    Installed(Box<AppliedRecord>),
}

impl std::ops::Deref for RecordView {
    type Target = AppliedRecord;

    fn deref(&self) -> &AppliedRecord {
        match &self.0 {
            View::Commit(c) => &c.record,
            View::Installed(r) => r,
        }
    }
}

/// Errors of the state directory; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// File system error.
    #[error(transparent)]
    Io(#[from] SysrootError),
    /// Another agent holds the state directory.
    #[error(
        "{path}: held by another inplaced (pid {pid}); stop it first: two agents on one node would undo each other"
    )]
    Locked {
        /// The lock file.
        path: String,
        /// Pid recorded by the holder, or "unknown".
        pid: String,
    },
    /// The apply would record as the node's own a file that a quarantined journal
    /// leaves in doubt (`claims.rs`): each path, the journal and the fix.
    #[error("{0}")]
    Unvouched(String),
    /// A pending commit in `journal/` that does not verify (damaged on disk, written by a
    /// newer inplaced, or larger than any commit this agent writes), seen while the agent
    /// runs: it may hold the newest applied state, so nothing is planned on an older one
    /// and the file is never removed; the next start quarantines it (bytes kept) and
    /// reports it (`state/journal_v2.rs`, "Why a commit outlives its operation").
    #[error(
        "{path}: a pending commit does not verify ({message}); it may hold the node's newest applied state, so changes are refused: restart inplaced, whose start quarantines the file (its bytes kept) and reports the state it falls back to"
    )]
    DamagedCommit {
        /// The commit file.
        path: String,
        /// Why it does not verify.
        message: String,
    },
    /// A state file does not parse.
    #[error("{path}: corrupt state file: {message}; move it aside to start from an empty record")]
    Corrupt {
        /// The file.
        path: String,
        /// Parser message.
        message: String,
    },
}

/// `sha256:<hex>` of `bytes`.
pub(crate) fn sha256_of(bytes: &[u8]) -> String {
    format!("sha256:{}", inplace_node::digest::sha256_hex(bytes))
}

/// Drift bookkeeping, kept across restarts (`drift.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DriftBook {
    /// Drift detections since the state directory was created.
    pub detections: u64,
    /// Items drifting now: id → Unix seconds when first seen.
    pub seen: BTreeMap<String, i64>,
}

/// The state directory.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    dir: Sysroot,
    uid: u32,
    gid: u32,
    /// The generation of the next format-2 commit (above any pending one).
    generation: std::sync::atomic::AtomicU64,
    /// Operation heads by file name and stamp (`operations.rs`).
    heads: std::sync::Mutex<operations::HeadCache>,
    /// Pending commits by file name and stamp (`journal_v2.rs`, [`StateDir::load_record`]).
    commits_read: std::sync::Mutex<journal_v2::CommitCache>,
    _lock: Option<std::fs::File>,
}

/// Backup name of a node path under `originals/`.
pub(crate) fn backup_name(path: &str) -> String {
    inplace_node::digest::sha256_hex(path.as_bytes())
}

impl StateDir {
    /// Opens (creating with mode 0700) the state directory.
    pub fn open(path: &Path) -> Result<StateDir, StateError> {
        std::fs::create_dir_all(path).map_err(|e| SysrootError::Io {
            path: path.display().to_string(),
            op: "create state directory",
            error: e,
        })?;
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map(|m| m.permissions().mode() & 0o7777)
            .unwrap_or(0);
        // a read-only state directory that already has the mode still opens
        if mode != 0o700 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).map_err(
                |e| SysrootError::Io {
                    path: path.display().to_string(),
                    op: "chmod state directory",
                    error: e,
                },
            )?;
        }
        Ok(StateDir {
            path: path.to_path_buf(),
            dir: Sysroot::open(path)?.without_failpoints(),
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            generation: std::sync::atomic::AtomicU64::new(1),
            heads: Default::default(),
            commits_read: Default::default(),
            _lock: None,
        })
    }

    /// Takes the exclusive lock `<state-dir>/lock` (`flock(2)`, released when the process
    /// exits, even by SIGKILL) and records the pid in it. One agent per state directory.
    pub fn lock(&mut self) -> Result<(), StateError> {
        use std::io::{Read, Seek, Write};
        let p = self.path.join("lock");
        let io = |op: &'static str, e: std::io::Error| SysrootError::Io {
            path: p.display().to_string(),
            op,
            error: e,
        };
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&p);
        // a read-only state directory is still locked (flock needs no write access)
        let mut f = match opened {
            Err(e) if e.raw_os_error() == Some(30) => {
                std::fs::File::open(&p).map_err(|e| io("open", e))?
            }
            r => r.map_err(|e| io("open", e))?,
        };
        if rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            let mut pid = String::new();
            let _ = f.read_to_string(&mut pid);
            return Err(StateError::Locked {
                path: p.display().to_string(),
                pid: if pid.trim().is_empty() {
                    "unknown".into()
                } else {
                    pid.trim().to_string()
                },
            });
        }
        // the pid is informational: a full or read-only directory keeps the lock without it
        let _ = f
            .set_len(0)
            .and_then(|()| f.rewind().map(|_| ()))
            .and_then(|()| writeln!(f, "{}", std::process::id()));
        self._lock = Some(f);
        Ok(())
    }

    /// Removes temporary files a crash left in the state directory (see
    /// [`Sysroot::write_atomic`]).
    pub fn remove_stale_temps(&self) -> Result<(), StateError> {
        for dir in ["/", "/operations", "/originals", "/journal"] {
            for n in self.io(self.dir.list_dir(dir))?.unwrap_or_default() {
                if n.starts_with('.') && n.contains(".inplaced-") && n.ends_with(".tmp") {
                    let p = if dir == "/" {
                        format!("/{n}")
                    } else {
                        format!("{dir}/{n}")
                    };
                    self.io(self.dir.remove(&p))?;
                }
            }
        }
        Ok(())
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&self, rel: &str, bytes: &[u8]) -> Result<(), StateError> {
        self.write_with(rel, bytes, Durability::Durable)
    }

    /// [`StateDir::write`] with the barriers `durability` asks for: the journal batches
    /// its directory fsyncs ([`StateDir::sync_dir`]) and leaves informational files lazy.
    fn write_with(
        &self,
        rel: &str,
        bytes: &[u8],
        durability: Durability,
    ) -> Result<(), StateError> {
        if inplace_node::failpoint::sticky("state-full") {
            return Err(SysrootError::Io {
                path: format!("{}{rel}", self.path.display()),
                op: "write",
                error: std::io::Error::from_raw_os_error(28),
            }
            .into());
        }
        self.io(self
            .dir
            .write_atomic_with(rel, bytes, 0o600, self.uid, self.gid, durability))?;
        Ok(())
    }

    /// Fsyncs the directory `rel` of the state directory: the renames into it done with
    /// [`Durability::ContentOnly`] are durable once this returns.
    fn sync_dir(&self, rel: &str) -> Result<(), StateError> {
        self.io(self.dir.sync_dir(rel))
    }

    /// A sysroot result with the state directory's path before the error's path.
    fn io<T>(&self, r: Result<T, SysrootError>) -> Result<T, StateError> {
        r.map_err(|e| StateError::Io(e.prefixed(&self.path)))
    }

    /// The full path of `rel` (`/journal/x`) in the state directory.
    pub fn full(&self, rel: &str) -> String {
        format!("{}{rel}", self.path.display())
    }

    /// Free bytes in the state directory's file system (for an unprivileged agent:
    /// what it may use).
    pub fn free_bytes(&self) -> Result<u64, StateError> {
        let st = rustix::fs::statvfs(&self.path).map_err(|e| {
            StateError::Io(SysrootError::Io {
                path: self.path.display().to_string(),
                op: "statvfs",
                error: e.into(),
            })
        })?;
        Ok(st.f_bavail.saturating_mul(st.f_frsize))
    }

    /// Checks that the state directory takes a write: a probe file written durably and
    /// removed. The error names the directory and the cause (full, read-only...).
    pub fn probe_writable(&self) -> Result<(), StateError> {
        self.write("/.probe", b"probe")?;
        self.io(self.dir.remove("/.probe"))?;
        Ok(())
    }

    fn corrupt(&self, rel: &str, e: impl std::fmt::Display) -> StateError {
        StateError::Corrupt {
            path: format!("{}{rel}", self.path.display()),
            message: e.to_string(),
        }
    }

    /// The state directory as a sysroot (for a trace of what a computation read).
    pub(crate) fn sysroot(&self) -> &Sysroot {
        &self.dir
    }

    /// Loads the applied record: the record of the pending commit with the highest
    /// generation that verifies, else the installed `applied.json` (empty if none was
    /// written yet). See the module docs for why the commit comes first.
    pub fn load_record(&self) -> Result<AppliedRecord, StateError> {
        match self.applied_commit()? {
            Some(c) => Ok(c.record.clone()),
            None => self.load_installed_record(),
        }
    }

    /// [`StateDir::load_record`] without the copy: the record shared with the cache of
    /// parsed commits, for a reader that only looks at it (a coverage computation, a
    /// dry run). A record of 200 managed files is about 150 KiB of small allocations; a
    /// copy per computation was the largest single consumer at the daemon's peak heap
    /// with concurrent coverage clients (heaptrack, BENCHMARKS.md).
    pub fn read_record(&self) -> Result<RecordView, StateError> {
        Ok(RecordView(match self.applied_commit()? {
            Some(c) => View::Commit(c),
            None => View::Installed(Box::new(self.load_installed_record()?)),
        }))
    }

    /// The applied record for a report (status), with what makes [`StateDir::load_record`]
    /// fail while the agent runs: the pending commits that do not verify, as problems
    /// ([`StateError::DamagedCommit`]'s text). The record is then the newest that
    /// verifies, which may be older than the node.
    pub fn load_record_reporting(&self) -> Result<(AppliedRecord, Vec<String>), StateError> {
        let (best, damage) = self.applied_commit_seen()?;
        let record = match best {
            Some(c) => c.record.clone(),
            None => self.load_installed_record()?,
        };
        Ok((record, damage.into_iter().map(|e| e.to_string()).collect()))
    }

    /// The installed `applied.json` (empty if none), whatever commit is pending.
    fn load_installed_record(&self) -> Result<AppliedRecord, StateError> {
        match self.io(self.dir.read("/applied.json"))? {
            None => Ok(AppliedRecord::default()),
            Some(b) => serde_json::from_slice(&b).map_err(|e| self.corrupt("/applied.json", e)),
        }
    }

    /// Persists the applied record, outside an operation: a pending commit is settled
    /// first ([`StateDir::settle_commits`]).
    pub fn save_record(&self, r: &AppliedRecord) -> Result<(), StateError> {
        self.settle_commits()?;
        let b = serde_json::to_vec_pretty(r).map_err(|e| self.corrupt("/applied.json", e))?;
        self.write("/applied.json", &b)
    }

    /// The NodeSpec applied last: the spec of the pending commit with the highest
    /// generation that verifies, else the installed `applied-spec.pb` (None before the
    /// first apply that recorded it, e.g. when an older inplaced applied the record).
    /// Bytes that do not decode are [`StateError::Corrupt`].
    pub fn load_applied_spec(&self) -> Result<Option<pb::NodeSpec>, StateError> {
        if let Some(c) = self.applied_commit()? {
            return <pb::NodeSpec as prost::Message>::decode(c.spec.as_slice())
                .map(Some)
                .map_err(|e| self.corrupt(&c.file, format!("the spec it commits: {e}")));
        }
        self.load_installed_spec()
    }

    /// The installed `applied-spec.pb` (None if absent), whatever commit is pending.
    fn load_installed_spec(&self) -> Result<Option<pb::NodeSpec>, StateError> {
        match self.io(self.dir.read("/applied-spec.pb"))? {
            None => Ok(None),
            Some(b) => {
                // sealed since the journal carries checksums; raw protobuf before. A file
                // cut inside (or before) its checksum header is not raw protobuf: it would
                // decode as a shorter or empty spec (an empty file is a valid empty
                // NodeSpec), so it is corrupt, never "the older format"
                if SEAL.as_bytes().starts_with(&b) {
                    return Err(self.corrupt(
                        "/applied-spec.pb",
                        format!(
                            "{} bytes: cut before the end of its checksum header",
                            b.len()
                        ),
                    ));
                }
                let body = if b.starts_with(SEAL.as_bytes()) {
                    unseal(&b).map_err(|e| self.corrupt("/applied-spec.pb", e))?
                } else {
                    b.as_slice()
                };
                <pb::NodeSpec as prost::Message>::decode(body)
                    .map(Some)
                    .map_err(|e| self.corrupt("/applied-spec.pb", e))
            }
        }
    }

    /// Persists the NodeSpec applied last (protobuf bytes, mode 0600: it holds file
    /// content).
    pub fn save_applied_spec(&self, spec: &[u8]) -> Result<(), StateError> {
        self.settle_commits()?;
        self.write("/applied-spec.pb", &seal(spec))
    }

    /// Installs a committed record and its spec durably: both contents fsynced, renamed,
    /// then one fsync of the state directory (3 barriers); the journal that holds them is
    /// removed only after this returns. The install of recovery and of a settle
    /// ([`StateDir::settle_commits`]); a running operation installs nothing, its commit is
    /// the applied state ([`StateDir::retire_journal`]).
    pub fn install_applied(&self, r: &AppliedRecord, spec: &[u8]) -> Result<(), StateError> {
        let b = serde_json::to_vec_pretty(r).map_err(|e| self.corrupt("/applied.json", e))?;
        self.write_with("/applied.json", &b, Durability::ContentOnly)?;
        self.write_with("/applied-spec.pb", &seal(spec), Durability::ContentOnly)?;
        self.sync_dir("/")
    }

    /// What is wrong with the state files at start, beyond the applied record's own
    /// parse (see [`StateDir::load_record_or_quarantine`]): a last applied spec that does
    /// not verify, one of the record and the spec without the other, a saved original
    /// that no longer has its recorded hash, a drift book that does not parse.
    /// `quarantined`: the record was just moved aside (already reported).
    pub fn check(&self, record: &AppliedRecord, quarantined: bool) -> Vec<String> {
        let mut out = Vec::new();
        let has = |rel: &str| matches!(self.dir.stat(rel), Ok(Some(_)));
        // a pending commit (one a start could not install) is the record and the spec
        // together: the installed pair is not read while it is there
        let from_commit = matches!(self.applied_commit(), Ok(Some(_)));
        match self.load_applied_spec() {
            Err(e) => out.push(e.to_string()),
            _ if from_commit => {}
            Ok(Some(_)) if !quarantined && !has("/applied.json") => out.push(format!(
                "{}: missing although {} is there: the items applied before are not managed until applied again",
                self.full("/applied.json"),
                self.full("/applied-spec.pb")
            )),
            Ok(None) if !record.is_empty() => out.push(format!(
                "{}: missing although {} manages {} item(s): node.d convergence is off until the next Apply",
                self.full("/applied-spec.pb"),
                self.full("/applied.json"),
                record.len()
            )),
            _ => {}
        }
        for (path, m) in &record.files {
            if let Original::Saved { backup, sha256, .. } = &m.original {
                let rel = format!("/originals/{backup}");
                let seen = self.dir.read(&rel).ok().flatten().map(|b| sha256_of(&b));
                if seen.as_deref() != Some(sha256.as_str()) {
                    out.push(format!(
                        "{}: the saved original of {path} is {}, {sha256} was saved: dropping {path} from the spec will not be covered",
                        self.full(&rel),
                        seen.unwrap_or_else(|| "missing".into())
                    ));
                }
            }
        }
        for name in self
            .dir
            .list_dir("/operations")
            .ok()
            .flatten()
            .unwrap_or_default()
        {
            let Some(id) = name
                .strip_suffix(".json")
                .filter(|_| !name.starts_with('.'))
            else {
                continue;
            };
            let rel = format!("/operations/{name}");
            if let Ok(Some(b)) = self.dir.read(&rel) {
                match serde_json::from_slice::<pb::Operation>(&b) {
                    Ok(op) if op.id == id => {}
                    Ok(op) => out.push(format!(
                        "{}: holds operation {:?}, not {id:?}; left out of the history",
                        self.full(&rel),
                        op.id
                    )),
                    Err(e) => out.push(format!(
                        "{}: does not parse ({e}); left out of the history",
                        self.full(&rel)
                    )),
                }
            }
        }
        if let Ok(Some(b)) = self.dir.read("/drift.json")
            && let Err(e) = serde_json::from_slice::<DriftBook>(&b)
        {
            out.push(format!(
                "{}: does not parse ({e}); drift counts start again",
                self.full("/drift.json")
            ));
        }
        out
    }

    /// Saves the original bytes of `path`. Called only before the first overwrite of a
    /// file the record does not manage yet, so a leftover backup of a failed operation is
    /// replaced by the current content.
    ///
    /// Only the content is fsynced here: [`StateDir::journal_intent`] fsyncs `originals/`
    /// once for all of them, before the intent is written.
    pub fn save_original(&self, path: &str, content: &[u8]) -> Result<String, StateError> {
        let name = backup_name(path);
        self.write_with(
            &format!("/originals/{name}"),
            content,
            Durability::ContentOnly,
        )?;
        Ok(name)
    }

    /// Reads a saved original.
    pub fn read_original(&self, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        self.io(self.dir.read(&format!("/originals/{name}")))
    }

    /// Deletes a saved original once it is no longer needed.
    pub fn drop_original(&self, name: &str) -> Result<(), StateError> {
        self.io(self.dir.remove(&format!("/originals/{name}")))?;
        Ok(())
    }
    /// Loads the applied record; a record that does not parse is moved aside to
    /// `applied.json.corrupt-<unix seconds>` and an empty record is returned with a
    /// description of what happened (shown in status).
    ///
    /// A record that does not parse while a format-2 commit is pending is the commit's
    /// install that a power cut cut short (it was written without an fsync): the commit's
    /// record is returned with that said, and the journal's recovery installs it.
    pub fn load_record_or_quarantine(
        &self,
    ) -> Result<(AppliedRecord, Option<RecordProblem>), StateError> {
        // the installed file is checked even while a commit is pending (and is the
        // record read): a start reports it as the agent before this one did
        match self.load_installed_record() {
            // a commit that does not verify is the start's recovery to quarantine and
            // report (it runs after this): not a reason to refuse to start
            Ok(installed) => {
                let why = self.mark_lost_record(&installed)?;
                Ok((self.load_record_reporting()?.0, why))
            }
            Err(StateError::Corrupt { message, .. }) => {
                if let Ok(Some(c)) = self.pending_commit() {
                    let why = format!(
                        "{} did not parse ({message}); a commit pending in {} holds the applied record, which is installed again from it",
                        self.full("/applied.json"),
                        self.full("/journal")
                    );
                    return Ok((
                        c.record,
                        Some(RecordProblem {
                            file: None,
                            message: why,
                        }),
                    ));
                }
                let ts = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let from = self.path.join("applied.json");
                let name = format!("{CORRUPT_PREFIX}{ts}");
                let to = self.path.join(&name);
                std::fs::rename(&from, &to).map_err(|e| SysrootError::Io {
                    path: from.display().to_string(),
                    op: "move corrupt state aside",
                    error: e,
                })?;
                self.write_lost_record(&name)?;
                Ok((
                    AppliedRecord::default(),
                    Some(RecordProblem {
                        file: Some(self.full(&format!("/{name}"))),
                        message: format!(
                            "{} did not parse ({message}); moved to {} and started from an empty applied record: what each item inplaced managed was like before it is lost, so no apply runs until you check those items (an apply's refusal names them) and remove {}",
                            from.display(),
                            to.display(),
                            to.display()
                        ),
                    }),
                ))
            }
            Err(e) => Err(e),
        }
    }

    /// A record lost without a trace: `applied.json` absent, or parsing but managing
    /// nothing (`{}` reads as an empty record), while something says inplaced managed
    /// items, and no commit is pending (a start installs the pair from a commit, so only
    /// damage or a hand leaves them so). What says so: `applied-spec.pb` naming files,
    /// sysctls, kubelet settings or drop-ins (each always has a record entry; kernel
    /// arguments found in place have none), or, when that file is gone or does not read,
    /// originals saved in `originals/` with an operation in the history that committed
    /// (a rolled-back one leaves the originals it saved, and no record). Treated as a record that did not parse: a marker
    /// `applied.json.missing-<unix seconds>` saying so is written, which refuses applies
    /// as a quarantined record does ([`StateDir::record_doubt`]) until it is removed;
    /// none while a record is quarantined or marked already (the same loss). Returns the
    /// problem to report, None when nothing is lost.
    fn mark_lost_record(
        &self,
        installed: &AppliedRecord,
    ) -> Result<Option<RecordProblem>, StateError> {
        let present = self.io(self.dir.stat("/applied.json"))?.is_some();
        // a record written in place of a lost one (AppliedRecord::lost) is that loss,
        // known: refused while its file is there, settled once it is removed
        if (present && (!installed.is_empty() || installed.lost.is_some()))
            || !self.quarantined_records().is_empty()
            || !matches!(self.pending_commit(), Ok(None))
        {
            return Ok(None);
        }
        let evidence = match self.load_installed_spec() {
            Ok(Some(s)) => {
                let kubelet = s
                    .kubelet
                    .as_ref()
                    .is_some_and(|k| !k.flags.is_empty() || k.config.is_some());
                (!s.files.is_empty() || !s.sysctls.is_empty() || kubelet || !s.dropins.is_empty())
                    .then(|| {
                        format!(
                            "{} names the items applied last",
                            self.full("/applied-spec.pb")
                        )
                    })
            }
            // the spec is gone too (or does not read): saved originals still say, once
            // an operation committed (an operation rolled back leaves the originals it
            // saved, with no record ever written)
            _ => {
                let saved = self
                    .dir
                    .list_dir("/originals")
                    .ok()
                    .flatten()
                    .is_some_and(|n| !n.is_empty());
                let committed = self.operation_heads().is_ok_and(|h| {
                    h.iter().any(|h| {
                        matches!(
                            pb::Phase::try_from(h.phase),
                            Ok(pb::Phase::Succeeded
                                | pb::Phase::RebootRequired
                                | pb::Phase::Rebooting)
                        )
                    })
                });
                (saved && committed).then(|| {
                    format!(
                        "originals inplaced saved are in {} and operations committed",
                        self.full("/originals")
                    )
                })
            }
        };
        let Some(evidence) = evidence else {
            return Ok(None);
        };
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let name = format!("{MISSING_PREFIX}{ts}");
        let rel = format!("/{name}");
        let state = if present {
            "manages nothing"
        } else {
            "is missing"
        };
        let why = format!(
            "{} {state} although {evidence}: what each item inplaced managed was like before it is lost, so no apply runs until you check those items (an apply's refusal names them) and remove {}",
            self.full("/applied.json"),
            self.full(&rel)
        );
        // the marker first: a crash before the record leaves the marker refusing, never
        // a record that says the loss was settled
        self.write(&rel, format!("{why}\n").as_bytes())?;
        self.write_lost_record(&name)?;
        Ok(Some(RecordProblem {
            file: Some(self.full(&rel)),
            message: why,
        }))
    }

    /// Writes `applied.json` as an empty record naming `name`, the quarantined record or
    /// marker just made ([`AppliedRecord::lost`]), so that removing that file is the
    /// administrator's word for good: a start after the removal finds this record and
    /// does not mark the loss again.
    fn write_lost_record(&self, name: &str) -> Result<(), StateError> {
        let record = AppliedRecord {
            lost: Some(name.to_string()),
            ..Default::default()
        };
        let b = serde_json::to_vec_pretty(&record).map_err(|e| self.corrupt("/applied.json", e))?;
        self.write("/applied.json", &b)
    }

    /// The drift book (empty if absent or unreadable).
    pub fn load_drift(&self) -> DriftBook {
        self.dir
            .read("/drift.json")
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Persists the drift book.
    pub fn save_drift(&self, book: &DriftBook) -> Result<(), StateError> {
        let b = serde_json::to_vec_pretty(book).map_err(|e| self.corrupt("/drift.json", e))?;
        self.write("/drift.json", &b)
    }
}
