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
//! ```
//!
//! Every file is written atomically and durably through [`Sysroot::write_atomic`] with mode
//! 0600. The applied record holds hashes and non-secret settings, never file content;
//! `applied-spec.pb` holds file content (secrets), which is why every file is 0600.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::node::sysroot::{Sysroot, SysrootError};
use crate::pb;

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
    /// Managed sysctls by dotted key.
    pub sysctls: BTreeMap<String, ManagedValue<String>>,
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
}

/// What the journal of an interrupted operation says.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalState {
    /// The intent (None when the crash came before it was complete).
    pub intent: Option<Intent>,
    /// The last completed step (`staged`, `written`, `acted`...).
    pub progress: String,
    /// The committed record and the phase to end in, when the commit point was reached.
    pub committed: Option<(AppliedRecord, i32)>,
    /// The NodeSpec (protobuf bytes) the committed operation applied, if journaled.
    pub spec: Option<Vec<u8>>,
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
    crate::spec::sha256_hex(path.as_bytes())
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
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).map_err(|e| {
            SysrootError::Io {
                path: path.display().to_string(),
                op: "chmod state directory",
                error: e,
            }
        })?;
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
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&p)
            .map_err(|e| io("open", e))?;
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
        f.set_len(0).map_err(|e| io("truncate", e))?;
        f.rewind().map_err(|e| io("seek", e))?;
        writeln!(f, "{}", std::process::id()).map_err(|e| io("write", e))?;
        self._lock = Some(f);
        Ok(())
    }

    /// Removes temporary files a crash left in the state directory (see
    /// [`Sysroot::write_atomic`]).
    pub fn remove_stale_temps(&self) -> Result<(), StateError> {
        for dir in ["/", "/operations", "/originals"] {
            for n in self.dir.list_dir(dir)?.unwrap_or_default() {
                if n.starts_with('.') && n.contains(".inplaced-") && n.ends_with(".tmp") {
                    let p = if dir == "/" {
                        format!("/{n}")
                    } else {
                        format!("{dir}/{n}")
                    };
                    self.dir.remove(&p)?;
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
        self.dir
            .write_atomic(rel, bytes, 0o600, self.uid, self.gid)?;
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
        match self.dir.read("/applied.json")? {
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
        match self.dir.read("/applied-spec.pb")? {
            None => Ok(None),
            Some(b) => <pb::NodeSpec as prost::Message>::decode(b.as_slice())
                .map(Some)
                .map_err(|e| self.corrupt("/applied-spec.pb", e)),
        }
    }

    /// Persists the NodeSpec applied last (protobuf bytes, mode 0600: it holds file
    /// content).
    pub fn save_applied_spec(&self, spec: &[u8]) -> Result<(), StateError> {
        self.write("/applied-spec.pb", spec)
    }

    /// Saves the original bytes of `path`. Called only before the first overwrite of a
    /// file the record does not manage yet, so a leftover backup of a failed operation is
    /// replaced by the current content.
    pub fn save_original(&self, path: &str, content: &[u8]) -> Result<String, StateError> {
        let name = backup_name(path);
        self.write(&format!("/originals/{name}"), content)?;
        Ok(name)
    }

    /// Reads a saved original.
    pub fn read_original(&self, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self.dir.read(&format!("/originals/{name}"))?)
    }

    /// Deletes a saved original once it is no longer needed.
    pub fn drop_original(&self, name: &str) -> Result<(), StateError> {
        self.dir.remove(&format!("/originals/{name}"))?;
        Ok(())
    }

    /// Writes (and fsyncs) the pre-image `n` of operation `op`; returns its file name.
    pub fn journal_pre_image(
        &self,
        op: &str,
        n: usize,
        content: &[u8],
    ) -> Result<String, StateError> {
        let file = format!("{n}");
        self.write(&format!("/journal/{op}/pre/{file}"), content)?;
        Ok(file)
    }

    /// Writes the intent; from here on a crash is rolled back at the next start.
    pub fn journal_intent(&self, intent: &Intent) -> Result<(), StateError> {
        let rel = format!("/journal/{}/intent.json", intent.operation);
        let b = serde_json::to_vec_pretty(intent).map_err(|e| self.corrupt(&rel, e))?;
        self.write(&rel, &b)
    }

    /// Records the last step operation `op` completed.
    pub fn journal_progress(&self, op: &str, step: &str) -> Result<(), StateError> {
        self.write(&format!("/journal/{op}/progress"), step.as_bytes())
    }

    /// The commit point: the spec applied (protobuf bytes), the record to install and the
    /// phase to end in, then the marker.
    pub fn journal_commit(
        &self,
        op: &str,
        spec: &[u8],
        record: &AppliedRecord,
        phase: i32,
    ) -> Result<(), StateError> {
        self.write(&format!("/journal/{op}/spec.pb"), spec)?;
        let rel = format!("/journal/{op}/record.json");
        let b = serde_json::to_vec_pretty(&serde_json::json!({"phase": phase, "record": record}))
            .map_err(|e| self.corrupt(&rel, e))?;
        self.write(&rel, &b)?;
        self.write(&format!("/journal/{op}/committed"), b"")
    }

    /// Reads a pre-image.
    pub fn journal_read_pre(&self, op: &str, file: &str) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self.dir.read(&format!("/journal/{op}/pre/{file}"))?)
    }

    /// The journals left by interrupted operations, by operation id.
    pub fn journals(&self) -> Result<Vec<(String, JournalState)>, StateError> {
        let mut out = Vec::new();
        for op in self.dir.list_dir("/journal")?.unwrap_or_default() {
            let base = format!("/journal/{op}");
            let intent = match self.dir.read(&format!("{base}/intent.json"))? {
                Some(b) => serde_json::from_slice(&b).ok(),
                None => None,
            };
            let progress = self
                .dir
                .read_string(&format!("{base}/progress"))
                .ok()
                .flatten()
                .unwrap_or_else(|| "begun".into());
            let committed = if self.dir.stat(&format!("{base}/committed"))?.is_some() {
                self.dir
                    .read(&format!("{base}/record.json"))?
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .and_then(|v| {
                        let phase = v.get("phase")?.as_i64()? as i32;
                        let record = serde_json::from_value(v.get("record")?.clone()).ok()?;
                        Some((record, phase))
                    })
            } else {
                None
            };
            let spec = self.dir.read(&format!("{base}/spec.pb"))?;
            out.push((
                op,
                JournalState {
                    intent,
                    progress,
                    committed,
                    spec,
                },
            ));
        }
        Ok(out)
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
            let _ = d.sync_all();
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

    /// Persists an operation.
    pub fn save_operation(&self, op: &pb::Operation) -> Result<(), StateError> {
        let rel = format!("/operations/{}.json", op.id);
        let b = serde_json::to_vec_pretty(op).map_err(|e| self.corrupt(&rel, e))?;
        self.write(&rel, &b)
    }

    /// All operations, newest first (by creation time, then id). An operation file that
    /// does not parse, or whose id is not its file name, is skipped with a warning in the
    /// log (history must not stop the agent), and left in place for inspection.
    pub fn list_operations(&self) -> Result<Vec<pb::Operation>, StateError> {
        let mut ops = Vec::new();
        for name in self.dir.list_dir("/operations")?.unwrap_or_default() {
            let Some(id) = name.strip_suffix(".json") else {
                continue;
            };
            if name.starts_with('.') {
                continue;
            }
            let rel = format!("/operations/{name}");
            if let Some(b) = self.dir.read(&rel)? {
                match serde_json::from_slice::<pb::Operation>(&b) {
                    Ok(op) if op.id == id => ops.push(op),
                    Ok(_) => {
                        tracing::warn!(file = %rel, "operation file whose id is not its name; skipped")
                    }
                    Err(e) => {
                        tracing::warn!(file = %rel, error = %e, "unreadable operation file; skipped")
                    }
                }
            }
        }
        ops.sort_by(|a, b| {
            let key = |o: &pb::Operation| o.created.map(|t| (t.seconds, t.nanos)).unwrap_or((0, 0));
            key(b).cmp(&key(a)).then_with(|| b.id.cmp(&a.id))
        });
        Ok(ops)
    }

    /// One operation by id.
    pub fn get_operation(&self, id: &str) -> Result<Option<pb::Operation>, StateError> {
        let rel = format!("/operations/{id}.json");
        match self.dir.read(&rel)? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| self.corrupt(&rel, e)),
        }
    }

    /// Keeps the newest `keep` operations; older ones are deleted once they ended for good
    /// (an operation still waiting for a reboot is kept whatever its age).
    pub fn prune(&self, keep: usize) -> Result<(), StateError> {
        let ops = self.list_operations()?;
        for op in ops.iter().skip(keep) {
            if crate::phase::is_terminal(op.phase) {
                self.dir.remove(&format!("/operations/{}.json", op.id))?;
            }
        }
        Ok(())
    }
}
