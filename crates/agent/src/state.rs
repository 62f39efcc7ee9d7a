//! The agent's persistent state in its state directory (default `/var/lib/inplaced`):
//!
//! ```text
//! applied.json                 the applied record: what the agent manages and what was there before
//! applied-spec.pb              the NodeSpec (protobuf) applied last, drop-ins unmerged
//! operations/<id>.json         one operation each (proto3 JSON of inplace.v1.Operation)
//! originals/<sha256 of path>   the original bytes of a pre-existing file, saved before its first overwrite
//! actions.log                  unit actions and reboots, with --service-manager record
//! journal/<op>/intent.json     write-ahead intent of the running operation (see crate::apply::journal)
//! journal/<op>/pre/<n>         pre-image of each file it writes or removes
//! journal/<op>/progress        the last step it completed
//! journal/<op>/spec.pb         the NodeSpec it applies, then
//! journal/<op>/record.json     the applied record it commits, then
//! journal/<op>/committed       the commit point: present = roll forward, absent = roll back
//! quarantine/<op>-<time>/      a journal that did not verify, moved aside whole, with REPORT
//! ```
//!
//! `intent.json`, `progress`, `spec.pb`, `record.json` and `applied-spec.pb` are sealed
//! ([`seal`]: a header line with the body's SHA-256 and length); each pre-image's hash and
//! length are in the intent. Nothing is trusted before it verifies.
//!
//! Every file is written atomically and durably through [`Sysroot::write_atomic`] with mode
//! 0600. The applied record holds hashes and non-secret settings, never file content;
//! `applied-spec.pb` holds file content (secrets), which is why every file is 0600.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod operations;

use inplace_node::sysroot::{Durability, Sysroot, SysrootError};
use inplace_wire::pb;

pub use operations::OperationHead;

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
    /// A state file does not parse.
    #[error("{path}: corrupt state file: {message}; move it aside to start from an empty record")]
    Corrupt {
        /// The file.
        path: String,
        /// Parser message.
        message: String,
    },
}

/// How a managed file looked before the agent first wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Original {
    /// The file did not exist: removing it from the spec deletes it.
    Absent,
    /// The file already had the desired state: removing it from the spec leaves it.
    Unchanged,
    /// The file existed: removing it from the spec restores this backup.
    Saved {
        /// Backup name under `originals/`.
        backup: String,
        /// `sha256:<hex>` of the original content.
        sha256: String,
        /// Original mode (0o7777 mask).
        mode: u32,
        /// Original owner.
        uid: u32,
        /// Original group.
        gid: u32,
    },
}

/// A managed file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedFile {
    /// `sha256:<hex>` of the content written.
    pub sha256: String,
    /// Mode written.
    pub mode: u32,
    /// Owner written.
    pub uid: u32,
    /// Group written.
    pub gid: u32,
    /// What was there before.
    pub original: Original,
    /// Directories the agent created for the file, outermost first; removed (when empty)
    /// with the file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub created_dirs: Vec<String>,
    /// Change id of a file the agent writes for a section other than `files` (`ntp`,
    /// `dropins[10-x.yaml]`); None for a `files` item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<String>,
}

/// A managed setting (kubelet config field, kubelet flag, sysctl) and its prior value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedValue<T> {
    /// Value applied.
    pub value: T,
    /// Value before the agent first set it (None = absent).
    pub prior: Option<T>,
}

/// A managed KubeletConfiguration leaf.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedField {
    /// Path of keys, e.g. `["systemReserved", "cpu"]`.
    pub path: Vec<String>,
    /// Value applied and prior value.
    #[serde(flatten)]
    pub value: ManagedValue<serde_json::Value>,
    /// The prior value's source text (`cluster.local`, `"off"`), restored byte for byte
    /// when the field leaves the spec; None when absent or not a one-line scalar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prior_raw: Option<String>,
}

/// A kernel argument removed from the boot configuration, not yet from the running kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingRemoval {
    /// The argument as it was on the command line (`isolcpus=2-7`).
    pub arg: String,
    /// Boot id (`/proc/sys/kernel/random/boot_id`) of the boot it was removed in.
    pub boot_id: String,
}

/// What the agent applied last.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AppliedRecord {
    /// Hash of the spec applied last.
    pub spec_hash: String,
    /// Managed files by path.
    pub files: BTreeMap<String, ManagedFile>,
    /// Managed kubelet config leaves by dotted id.
    pub kubelet_config: BTreeMap<String, ManagedField>,
    /// Managed kubelet flags by name.
    pub kubelet_flags: BTreeMap<String, ManagedValue<String>>,
    /// Kernel arguments the agent added (never ones it found there), in order.
    pub kernel_args: Vec<String>,
    /// Kernel arguments the agent removed from the boot configuration that the running
    /// kernel still has: the removal takes effect at the next boot. Each is pending only
    /// in the boot it was staged in, so an argument that comes back from elsewhere can not
    /// cause a reboot loop.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernel_args_removed: Vec<PendingRemoval>,
    /// Boot id of the boot in which the managed kernel arguments were staged while the
    /// running kernel lacked some of them (empty: all were running). Until the boot id
    /// changes the running kernel may lack them; after, every one must be in
    /// `/proc/cmdline` (drift otherwise).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kernel_args_staged_in: String,
    /// Managed sysctls by dotted key.
    pub sysctls: BTreeMap<String, ManagedValue<String>>,
    /// The value text of each line a managed sysctl already had in the agent's own
    /// drop-in before the agent first set it, in file order (by key as the spec names
    /// it): each line is given its text back, not removed, when the key leaves the spec.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub sysctl_drop_in_prior: BTreeMap<String, Vec<String>>,
}

impl AppliedRecord {
    /// Number of managed items.
    pub fn len(&self) -> usize {
        self.files.len()
            + self.kubelet_config.len()
            + self.kubelet_flags.len()
            + self.kernel_args.len()
            + self.sysctls.len()
    }

    /// True when nothing is managed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The pre-image of a file an operation writes or removes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreImage {
    /// File name under `journal/<op>/pre/`.
    pub file: String,
    /// `sha256:<hex>` of the pre-image, recorded before the intent is written: a
    /// pre-image is restored only when it still has it.
    pub sha256: String,
    /// Its length in bytes.
    pub len: u64,
    /// Mode (0o7777 mask).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
}

/// One path an operation changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IntentEntry {
    /// Node path.
    pub path: String,
    /// What it was before (None = absent).
    pub pre: Option<PreImage>,
    /// Directories that did not exist and a write creates, outermost first.
    #[serde(default)]
    pub missing_dirs: Vec<String>,
    /// `sha256:<hex>` of the content the operation writes (None: it removes the path).
    #[serde(default)]
    pub new_sha256: Option<String>,
}

/// The write-ahead intent of an operation, written and fsynced before its first change.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Intent {
    /// Operation id.
    pub operation: String,
    /// Paths changed, in commit order.
    pub entries: Vec<IntentEntry>,
    /// Live sysctls changed: key, prior value.
    pub sysctls: Vec<(String, String)>,
    /// Units the operation restarts or reloads (restarted again after a rollback).
    pub units: Vec<String>,
    /// Boot-configuration commands the operation runs (`update-grub`, `grub2-mkconfig
    /// -o ...`), argv each: run again after a rollback that put a path back, so what they
    /// generate (`grub.cfg`) follows the restored inputs. Absent in journals of older
    /// agents (read as none).
    #[serde(default)]
    pub commands: Vec<Vec<String>>,
}

/// A journal file read back: absent, verified against its checksum and parsed, or
/// damaged (with why).
#[derive(Debug, Clone, PartialEq)]
pub enum Sealed<T> {
    /// The file is not there.
    Absent,
    /// The file verifies and parses.
    Valid(T),
    /// The file is there but does not verify or parse: the reason, with its full path.
    Damaged(String),
}

/// What a committed journal holds: the record to install, the phase to end in, the
/// NodeSpec (protobuf bytes) applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Committed {
    /// The applied record to install.
    pub record: AppliedRecord,
    /// The phase the operation ends in.
    pub phase: i32,
    /// The NodeSpec applied (protobuf bytes), installed as `applied-spec.pb`.
    pub spec: Vec<u8>,
}

/// What the journal of an interrupted operation says, each file verified.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalState {
    /// The intent (Absent when the crash came before it was complete).
    pub intent: Sealed<Intent>,
    /// The intent parsed without its checksum, when it does not verify: what it names
    /// can be reported, never acted on.
    pub unverified_intent: Option<Intent>,
    /// The last completed step (`staged`, `written`, `acted`).
    pub progress: Sealed<String>,
    /// None before the commit point (no `committed` marker); past it, the record.
    pub committed: Option<Sealed<Committed>>,
}

/// The first line of every sealed journal file.
const SEAL: &str = "inplaced-sealed";

/// `body` behind a header line with its SHA-256 and length, so that a truncated, extended
/// or altered file is told from a good one.
pub fn seal(body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "{SEAL} sha256:{} len={}\n",
        inplace_node::digest::sha256_hex(body),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// The body of a sealed file when its header is intact and the body has the recorded
/// length and SHA-256; else why not.
pub fn unseal(bytes: &[u8]) -> Result<&[u8], String> {
    let nl = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or("no checksum header")?;
    let header = std::str::from_utf8(&bytes[..nl]).map_err(|_| "checksum header not UTF-8")?;
    let body = &bytes[nl + 1..];
    let mut parts = header.split(' ');
    let (Some(SEAL), Some(sha), Some(len), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("bad checksum header {header:?}"));
    };
    let len: usize = len
        .strip_prefix("len=")
        .and_then(|l| l.parse().ok())
        .ok_or_else(|| format!("bad length in checksum header {header:?}"))?;
    if body.len() != len {
        return Err(format!("{} bytes where {len} were written", body.len()));
    }
    let seen = format!("sha256:{}", inplace_node::digest::sha256_hex(body));
    if seen != sha {
        return Err(format!("content is {seen}, {sha} was written"));
    }
    Ok(body)
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_of(bytes: &[u8]) -> String {
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
    _lock: Option<std::fs::File>,
}

/// Backup name of a node path under `originals/`.
pub fn backup_name(path: &str) -> String {
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
        for dir in ["/", "/operations", "/originals"] {
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

    /// Loads the applied record (empty if none was written yet).
    pub fn load_record(&self) -> Result<AppliedRecord, StateError> {
        match self.io(self.dir.read("/applied.json"))? {
            None => Ok(AppliedRecord::default()),
            Some(b) => serde_json::from_slice(&b).map_err(|e| self.corrupt("/applied.json", e)),
        }
    }

    /// Persists the applied record.
    pub fn save_record(&self, r: &AppliedRecord) -> Result<(), StateError> {
        let b = serde_json::to_vec_pretty(r).map_err(|e| self.corrupt("/applied.json", e))?;
        self.write("/applied.json", &b)
    }

    /// The NodeSpec applied last (None before the first apply that recorded it, e.g. when
    /// an older inplaced applied the record). Bytes that do not decode are
    /// [`StateError::Corrupt`].
    pub fn load_applied_spec(&self) -> Result<Option<pb::NodeSpec>, StateError> {
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
        self.write("/applied-spec.pb", &seal(spec))
    }

    /// Installs a committed record and its spec: both contents fsynced, renamed, then one
    /// fsync of the state directory (3 barriers instead of 4); the journal that holds them
    /// is removed only after this returns.
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
        match self.load_applied_spec() {
            Err(e) => out.push(e.to_string()),
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

    /// Writes the pre-image `n` of operation `op` (its content fsynced; the directory is
    /// fsynced once for all of them by [`StateDir::journal_intent`]); returns its file name.
    pub fn journal_pre_image(
        &self,
        op: &str,
        n: usize,
        content: &[u8],
    ) -> Result<String, StateError> {
        let file = format!("{n}");
        self.write_with(
            &format!("/journal/{op}/pre/{file}"),
            content,
            Durability::ContentOnly,
        )?;
        Ok(file)
    }

    /// Makes the staged originals and pre-images durable (one fsync of `originals/` when
    /// `originals` were saved, one of `journal/<op>/pre/` when the intent names a
    /// pre-image), then writes the intent (sealed) durably; from here on a crash is rolled
    /// back at the next start.
    pub fn journal_intent(&self, intent: &Intent, originals: bool) -> Result<(), StateError> {
        if originals {
            self.sync_dir("/originals")?;
        }
        if intent.entries.iter().any(|e| e.pre.is_some()) {
            self.sync_dir(&format!("/journal/{}/pre", intent.operation))?;
        }
        let rel = format!("/journal/{}/intent.json", intent.operation);
        let b = serde_json::to_vec_pretty(intent).map_err(|e| self.corrupt(&rel, e))?;
        self.write(&rel, &seal(&b))
    }

    /// Records the last step operation `op` completed (sealed), without an fsync: the
    /// marker only says how far the operation got (it words the rolled-back message;
    /// rolling back restarts the units whenever a path went back, whatever it says). A
    /// power cut may leave an earlier step or a marker that does not verify, which
    /// recovery already handles.
    pub fn journal_progress(&self, op: &str, step: &str) -> Result<(), StateError> {
        self.write_with(
            &format!("/journal/{op}/progress"),
            &seal(step.as_bytes()),
            Durability::Lazy,
        )
    }

    /// The commit point: the spec applied (protobuf bytes) and the record to install with
    /// the phase to end in, each sealed and its content fsynced, one fsync of the
    /// journal directory, then the marker and a second fsync of the directory (3 + 1
    /// barriers: the marker is never durable before what it commits).
    pub fn journal_commit(
        &self,
        op: &str,
        spec: &[u8],
        record: &AppliedRecord,
        phase: i32,
    ) -> Result<(), StateError> {
        let dir = format!("/journal/{op}");
        self.write_with(
            &format!("{dir}/spec.pb"),
            &seal(spec),
            Durability::ContentOnly,
        )?;
        let rel = format!("{dir}/record.json");
        let b = serde_json::to_vec_pretty(&serde_json::json!({"phase": phase, "record": record}))
            .map_err(|e| self.corrupt(&rel, e))?;
        self.write_with(&rel, &seal(&b), Durability::ContentOnly)?;
        self.sync_dir(&dir)?;
        self.write_with(&format!("{dir}/committed"), b"", Durability::Lazy)?;
        self.sync_dir(&dir)
    }

    /// Bytes the journal of an operation needs beyond its pre-images and originals: the
    /// intent, the spec and the record (twice each: in the journal, then installed), with
    /// room for the headers and the operation's own file.
    pub fn bookkeeping_bytes(paths: usize, spec: &[u8], record: &AppliedRecord) -> u64 {
        let record_len = serde_json::to_vec_pretty(record)
            .map(|b| b.len() as u64)
            .unwrap_or(0);
        // an intent entry is a path, three hashes and metadata: well under 1 KiB
        let intent_len = paths as u64 * 1024;
        intent_len + 2 * (spec.len() as u64 + record_len) + 64 * 1024
    }

    /// Pre-image `pre` of operation `op`, when it verifies against the length and
    /// SHA-256 the intent recorded; else why not (with its full path).
    pub fn journal_read_pre(&self, op: &str, pre: &PreImage) -> Result<Vec<u8>, String> {
        let rel = format!("/journal/{op}/pre/{}", pre.file);
        let full = self.full(&rel);
        match self.io(self.dir.read(&rel)) {
            Err(e) => Err(e.to_string()),
            Ok(None) => Err(format!("{full}: pre-image missing")),
            Ok(Some(b)) if b.len() as u64 != pre.len => Err(format!(
                "{full}: pre-image has {} bytes, {} were journaled",
                b.len(),
                pre.len
            )),
            Ok(Some(b)) if sha256_of(&b) != pre.sha256 => Err(format!(
                "{full}: pre-image is {}, {} was journaled",
                sha256_of(&b),
                pre.sha256
            )),
            Ok(Some(b)) => Ok(b),
        }
    }

    /// A sealed journal file read back, verified and parsed by `parse`.
    fn read_sealed<T>(&self, rel: &str, parse: impl Fn(&[u8]) -> Result<T, String>) -> Sealed<T> {
        let full = self.full(rel);
        match self.io(self.dir.read(rel)) {
            Err(e) => Sealed::Damaged(e.to_string()),
            Ok(None) => Sealed::Absent,
            Ok(Some(b)) => match unseal(&b).and_then(&parse) {
                Ok(v) => Sealed::Valid(v),
                Err(why) => Sealed::Damaged(format!("{full}: {why}")),
            },
        }
    }

    /// The journals left by interrupted operations, by operation id, each file verified.
    pub fn journals(&self) -> Result<Vec<(String, JournalState)>, StateError> {
        let mut out = Vec::new();
        for op in self.io(self.dir.list_dir("/journal"))?.unwrap_or_default() {
            out.push((op.clone(), self.journal(&op)?));
        }
        Ok(out)
    }

    fn journal(&self, op: &str) -> Result<JournalState, StateError> {
        let base = format!("/journal/{op}");
        let json = |b: &[u8]| serde_json::from_slice::<Intent>(b).map_err(|e| e.to_string());
        let intent = self.read_sealed(&format!("{base}/intent.json"), json);
        let unverified_intent = match &intent {
            Sealed::Damaged(_) => self
                .dir
                .read(&format!("{base}/intent.json"))
                .ok()
                .flatten()
                .and_then(|b| {
                    let start = b.iter().position(|c| *c == b'{')?;
                    serde_json::from_slice(&b[start..]).ok()
                }),
            _ => None,
        };
        let progress =
            self.read_sealed(&format!("{base}/progress"), |b| {
                match std::str::from_utf8(b) {
                    Ok(p @ ("staged" | "written" | "acted")) => Ok(p.to_string()),
                    _ => Err(format!("unknown step {:?}", String::from_utf8_lossy(b))),
                }
            });
        let committed = if self
            .io(self.dir.stat(&format!("{base}/committed")))?
            .is_some()
        {
            Some(self.committed(&base))
        } else {
            None
        };
        Ok(JournalState {
            intent,
            unverified_intent,
            progress,
            committed,
        })
    }

    /// The record and spec of a journal past its commit point, both verified.
    fn committed(&self, base: &str) -> Sealed<Committed> {
        let record = self.read_sealed(&format!("{base}/record.json"), |b| {
            let v: serde_json::Value = serde_json::from_slice(b).map_err(|e| e.to_string())?;
            let phase = v
                .get("phase")
                .and_then(serde_json::Value::as_i64)
                .ok_or("no phase")? as i32;
            let record = serde_json::from_value(v.get("record").cloned().unwrap_or_default())
                .map_err(|e| e.to_string())?;
            Ok((record, phase))
        });
        let spec = self.read_sealed(&format!("{base}/spec.pb"), |b| Ok(b.to_vec()));
        match (record, spec) {
            (Sealed::Valid((record, phase)), Sealed::Valid(spec)) => Sealed::Valid(Committed {
                record,
                phase,
                spec,
            }),
            (Sealed::Damaged(w), _) | (_, Sealed::Damaged(w)) => Sealed::Damaged(w),
            (Sealed::Absent, _) => Sealed::Damaged(format!(
                "{}: missing although {} is there",
                self.full(&format!("{base}/record.json")),
                self.full(&format!("{base}/committed"))
            )),
            (_, Sealed::Absent) => Sealed::Damaged(format!(
                "{}: missing although {} is there",
                self.full(&format!("{base}/spec.pb")),
                self.full(&format!("{base}/committed"))
            )),
        }
    }

    /// Moves the journal of `op` aside whole, to `quarantine/<op>-<unix seconds>`, with
    /// `report` (what it names and what is on disk) written next to it; returns the new
    /// path. Nothing is ever restored from a quarantined journal.
    pub fn journal_quarantine(&self, op: &str, report: &str) -> Result<String, StateError> {
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let from = self.path.join("journal").join(op);
        let qdir = self.path.join("quarantine");
        let to = qdir.join(format!("{op}-{ts}"));
        let io = |p: &Path, what: &'static str, e: std::io::Error| {
            StateError::Io(SysrootError::Io {
                path: p.display().to_string(),
                op: what,
                error: e,
            })
        };
        std::fs::create_dir_all(&qdir).map_err(|e| io(&qdir, "create quarantine", e))?;
        std::fs::rename(&from, &to).map_err(|e| io(&from, "move journal to quarantine", e))?;
        for d in [&qdir, &self.path.join("journal")] {
            if let Ok(f) = std::fs::File::open(d) {
                let _ = inplace_node::sysroot::fsync(&f);
            }
        }
        let _ = std::fs::write(to.join("REPORT"), report);
        Ok(to.display().to_string())
    }

    /// The quarantined journals still in the state directory, with their reports.
    pub fn quarantined(&self) -> Vec<(String, String)> {
        let qdir = self.path.join("quarantine");
        let mut out: Vec<(String, String)> = std::fs::read_dir(&qdir)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|e| {
                let report = std::fs::read_to_string(e.path().join("REPORT")).unwrap_or_default();
                (e.path().display().to_string(), report)
            })
            .collect();
        out.sort();
        out
    }

    /// Removes the journal of `op` (the operation is settled).
    pub fn journal_remove(&self, op: &str) -> Result<(), StateError> {
        let p = self.path.join("journal").join(op);
        match std::fs::remove_dir_all(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(SysrootError::Io {
                    path: p.display().to_string(),
                    op: "remove journal",
                    error: e,
                }
                .into());
            }
        }
        if let Ok(d) = std::fs::File::open(self.path.join("journal")) {
            let _ = inplace_node::sysroot::fsync(&d);
        }
        Ok(())
    }

    /// Loads the applied record; a record that does not parse is moved aside to
    /// `applied.json.corrupt-<unix seconds>` and an empty record is returned with a
    /// description of what happened (shown in status).
    pub fn load_record_or_quarantine(&self) -> Result<(AppliedRecord, Option<String>), StateError> {
        match self.load_record() {
            Ok(r) => Ok((r, None)),
            Err(StateError::Corrupt { message, .. }) => {
                let ts = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let from = self.path.join("applied.json");
                let to = self.path.join(format!("applied.json.corrupt-{ts}"));
                std::fs::rename(&from, &to).map_err(|e| SysrootError::Io {
                    path: from.display().to_string(),
                    op: "move corrupt state aside",
                    error: e,
                })?;
                Ok((
                    AppliedRecord::default(),
                    Some(format!(
                        "{} did not parse ({message}); moved to {} and started from an empty applied record: items applied before are no longer managed until applied again",
                        from.display(),
                        to.display()
                    )),
                ))
            }
            Err(e) => Err(e),
        }
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
