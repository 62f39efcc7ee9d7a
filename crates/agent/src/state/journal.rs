//! The journal of a running operation on disk: its types (intent, pre-images, commit),
//! the seal every journal file carries, and the reader of the format-1 layout
//! (`journal/<op>/`, written by inplaced up to commit 43048f4); the format-2 layout this
//! agent writes (`journal/<op>.*`) and the version rule are `super::journal_v2`. What
//! recovery does with a journal is `crate::apply::journal`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use inplace_node::sysroot::SysrootError;

use super::{AppliedRecord, StateDir, StateError, sha256_of};

/// [`PreImage::file`] of a pre-image not copied into the journal because its content is
/// a file item of the applied spec (format 2): a managed file the operation removes or
/// overwrites that still has the content the spec gave it. Its bytes are read back from
/// the spec's durable copies (the pending commits in `journal/`, `applied-spec.pb`) and
/// verified against the length and SHA-256 the intent recorded, like a copied one. No
/// `.pre-<n>` file is ever named so; an agent that does not know the name finds the
/// pre-image missing and quarantines the journal (nothing restored), as it does a journal
/// of a newer format.
pub(crate) const PRE_FROM_APPLIED_SPEC: &str = "applied-spec";

/// The pre-image of a file an operation writes or removes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreImage {
    /// File name under `journal/<op>/pre/` (format 1), or under `journal/` (format 2:
    /// `<op>.pre-<n>`), or [`PRE_FROM_APPLIED_SPEC`] (format 2: the content is the
    /// applied spec's).
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
    /// Format 2: a path an effect removes and its service may write again (the kubelet's
    /// CPU or memory manager checkpoint): a rollback writes the pre-image back (or
    /// removes the path when it was absent) over whatever is there.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restore_over_any: bool,
}

/// The write-ahead intent of an operation, written and fsynced before its first change.
///
/// On disk (`intent.json`) it is `IntentOnDisk`, the format every agent version reads:
/// the effects' entries are kept there in the fields of their kind (`sysctls`,
/// `commands`), converted at this edge.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(from = "IntentOnDisk", into = "IntentOnDisk")]
pub struct Intent {
    /// The journal format that wrote it: 1 (no `version` field, `journal/<op>/`) or 2
    /// (`journal/<op>.intent`); see `super::journal_v2`.
    pub version: u32,
    /// Operation id.
    pub operation: String,
    /// Paths changed, in commit order.
    pub entries: Vec<IntentEntry>,
    /// What the sections' effects need to be undone after a crash, in the order of the
    /// plan's effects within each kind.
    pub effects: Vec<EffectEntry>,
    /// Units the operation restarts or reloads (restarted again after a rollback).
    pub units: Vec<String>,
    /// Format 2: the operation as it was in phase Staging (proto3 JSON of
    /// `inplace.v1.Operation`). Its own file is written without an fsync in Staging; a
    /// power cut that loses it after the intent is durable is settled from this copy.
    pub staged: Option<serde_json::Value>,
}

/// What the journal keeps of one effect of a section (`crate::sections::kit::effect`),
/// to undo it after a crash: one variant per kind of entry, each with its field on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectEntry {
    /// The `sysctls` section's live write: the key and its value before (written back
    /// once the paths are restored). On disk: an element of `sysctls`.
    Sysctl {
        /// The key (`vm.swappiness`).
        key: String,
        /// The live value before the operation, without its newline.
        prior: String,
    },
    /// A boot-configuration command (`update-grub`, `grub2-mkconfig -o ...`), argv: run
    /// again after a rollback that put a path back, so what it generates (`grub.cfg`)
    /// follows the restored inputs. On disk: an element of `commands`.
    Rerun(Vec<String>),
}

/// The intent as `intent.json` holds it (field names and order are the format).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct IntentOnDisk {
    /// The journal format (absent in format 1: read as 1).
    #[serde(default = "format_1", skip_serializing_if = "is_format_1")]
    version: u32,
    /// Operation id.
    operation: String,
    /// Paths changed, in commit order.
    entries: Vec<IntentEntry>,
    /// Live sysctls changed: key, prior value.
    sysctls: Vec<(String, String)>,
    /// Units the operation restarts or reloads.
    units: Vec<String>,
    /// Boot-configuration commands, argv each. Absent in journals of older agents
    /// (read as none).
    #[serde(default)]
    commands: Vec<Vec<String>>,
    /// Format 2: the operation in phase Staging.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    staged_operation: Option<serde_json::Value>,
}

fn format_1() -> u32 {
    1
}

fn is_format_1(v: &u32) -> bool {
    *v == 1
}

impl From<IntentOnDisk> for Intent {
    fn from(d: IntentOnDisk) -> Intent {
        let sysctls = d
            .sysctls
            .into_iter()
            .map(|(key, prior)| EffectEntry::Sysctl { key, prior });
        let commands = d.commands.into_iter().map(EffectEntry::Rerun);
        Intent {
            version: d.version,
            operation: d.operation,
            entries: d.entries,
            effects: sysctls.chain(commands).collect(),
            units: d.units,
            staged: d.staged_operation,
        }
    }
}

impl From<Intent> for IntentOnDisk {
    fn from(i: Intent) -> IntentOnDisk {
        let mut sysctls = Vec::new();
        let mut commands = Vec::new();
        for e in i.effects {
            match e {
                EffectEntry::Sysctl { key, prior } => sysctls.push((key, prior)),
                EffectEntry::Rerun(argv) => commands.push(argv),
            }
        }
        IntentOnDisk {
            version: i.version,
            operation: i.operation,
            entries: i.entries,
            sysctls,
            units: i.units,
            commands,
            staged_operation: i.staged,
        }
    }
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
    /// Format 2: the order of the commits of one agent run (1, 2, ...): when a power cut
    /// leaves several, the highest is the applied state. 0 in format 1 (one commit at a
    /// time, removed before the next operation).
    pub generation: u64,
    /// The applied record to install.
    pub record: AppliedRecord,
    /// The phase the operation ends in.
    pub phase: i32,
    /// The NodeSpec applied (protobuf bytes), installed as `applied-spec.pb`.
    pub spec: Vec<u8>,
    /// Format 2: the operation as it was at its commit point (proto3 JSON of
    /// `inplace.v1.Operation`): settles it when its own file was lost or is an earlier
    /// run's of the same id (told by `created`).
    pub operation: Option<serde_json::Value>,
}

/// What the journal of an interrupted operation says, each file verified.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalState {
    /// The journal format: 1 (`journal/<op>/`) or 2 (`journal/<op>.*`).
    pub version: u32,
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
pub(super) const SEAL: &str = "inplaced-sealed";

/// `body` behind a header line with its SHA-256 and length, so that a truncated, extended
/// or altered file is told from a good one.
pub(crate) fn seal(body: &[u8]) -> Vec<u8> {
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
pub(super) fn unseal(bytes: &[u8]) -> Result<&[u8], String> {
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
impl PreImage {
    /// The content is the applied spec's ([`PRE_FROM_APPLIED_SPEC`]), not a journal file.
    pub fn is_from_applied_spec(&self) -> bool {
        self.file == PRE_FROM_APPLIED_SPEC
    }
}

/// The file contents of the applied spec's durable copies, by length and SHA-256: what a
/// pre-image [`PreImage::is_from_applied_spec`] is read back from
/// ([`StateDir::applied_contents`]).
#[derive(Debug, Default)]
pub struct AppliedContents(std::collections::HashMap<(u64, String), Vec<u8>>);

impl AppliedContents {
    /// The content of length `len` and SHA-256 `sha256`, if a copy holds it.
    pub fn get(&self, len: u64, sha256: &str) -> Option<&[u8]> {
        self.0.get(&(len, sha256.to_string())).map(Vec::as_slice)
    }
}

impl StateDir {
    /// The file contents of every copy of the applied spec that verifies: each pending
    /// format-2 commit in `journal/` and `applied-spec.pb`. Before an operation's commit
    /// point at least one of them holds the spec that was applied when its intent was
    /// written, durably: the previous operation's commit stays until this operation's
    /// commit (or a start, or a write of the record outside an operation, which first
    /// installs it with fsyncs). Any of them may be older or newer: a content is taken
    /// only by its length and SHA-256.
    pub fn applied_contents(&self) -> AppliedContents {
        let mut out = AppliedContents::default();
        let mut add = |spec: &[u8]| {
            if let Ok(spec) = <inplace_wire::pb::NodeSpec as prost::Message>::decode(spec) {
                for f in spec.files {
                    let key = (f.content.len() as u64, sha256_of(&f.content));
                    out.0.entry(key).or_insert(f.content);
                }
            }
        };
        for spec in self.commit_specs() {
            add(&spec);
        }
        if let Ok(Some(b)) = self.dir.read("/applied-spec.pb") {
            match unseal(&b) {
                Ok(body) => add(body),
                // raw protobuf, from an agent before the journal had checksums
                Err(_) if !b.starts_with(SEAL.as_bytes()) => add(&b),
                Err(_) => {}
            }
        }
        out
    }

    /// Pre-image `pre` of operation `op` in a journal of format `version`, reading a
    /// pre-image [`PreImage::is_from_applied_spec`] from `applied` (loaded on first need).
    pub fn journal_read_pre_with(
        &self,
        version: u32,
        op: &str,
        pre: &PreImage,
        applied: &std::cell::OnceCell<AppliedContents>,
    ) -> Result<Vec<u8>, String> {
        if version == 1 || !pre.is_from_applied_spec() {
            return self.journal_read_pre(version, op, pre);
        }
        let contents = applied.get_or_init(|| self.applied_contents());
        match contents.get(pre.len, &pre.sha256) {
            Some(b) if b.len() as u64 == pre.len && sha256_of(b) == pre.sha256 => Ok(b.to_vec()),
            _ => Err(format!(
                "{}: pre-image {} ({} bytes, to be read from the applied spec) is in no copy of it ({} and the pending commits in {})",
                self.full("/journal"),
                pre.sha256,
                pre.len,
                self.full("/applied-spec.pb"),
                self.full("/journal")
            )),
        }
    }

    /// Bytes the journal of an operation needs beyond its pre-images and originals: the
    /// intent, the spec and the record (twice each: this operation's commit beside the
    /// previous one, which it replaces, or a start's install beside the commit), with
    /// room for the headers and the operation's own file.
    pub fn bookkeeping_bytes(paths: usize, spec: &[u8], record: &AppliedRecord) -> u64 {
        let record_len = serde_json::to_vec_pretty(record)
            .map(|b| b.len() as u64)
            .unwrap_or(0);
        // an intent entry is a path, three hashes and metadata: well under 1 KiB
        let intent_len = paths as u64 * 1024;
        intent_len + 2 * (spec.len() as u64 + record_len) + 64 * 1024
    }

    /// Pre-image `pre` of operation `op` in a journal of format `version`, when it
    /// verifies against the length and SHA-256 the intent recorded; else why not (with
    /// its full path).
    pub fn journal_read_pre(
        &self,
        version: u32,
        op: &str,
        pre: &PreImage,
    ) -> Result<Vec<u8>, String> {
        let rel = if version == 1 {
            format!("/journal/{op}/pre/{}", pre.file)
        } else {
            // format 2 names it `<op>.pre-<n>`: nothing else of the journal is read as one
            match pre
                .file
                .strip_prefix(op)
                .and_then(|r| r.strip_prefix(".pre-"))
            {
                Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                    format!("/journal/{}", pre.file)
                }
                _ => {
                    return Err(format!(
                        "{}: pre-image {:?} is not one of operation {op}'s",
                        self.full("/journal"),
                        pre.file
                    ));
                }
            }
        };
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
    pub(super) fn read_sealed<T>(
        &self,
        rel: &str,
        parse: impl Fn(&[u8]) -> Result<T, String>,
    ) -> Sealed<T> {
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

    /// The intent at `rel` without its checksum, when it does not verify: what it names
    /// can be reported, never acted on.
    pub(super) fn unverified_intent(&self, rel: &str, intent: &Sealed<Intent>) -> Option<Intent> {
        match intent {
            Sealed::Damaged(_) => self.dir.read(rel).ok().flatten().and_then(|b| {
                let start = b.iter().position(|c| *c == b'{')?;
                serde_json::from_slice(&b[start..]).ok()
            }),
            _ => None,
        }
    }

    /// A progress marker (`staged`, `written`, ...): any one-line text that verifies (the
    /// apply layer interprets it: `Marker::parse`; one it does not know makes the
    /// recovery incomplete).
    pub(super) fn read_progress(&self, rel: &str) -> Sealed<String> {
        self.read_sealed(rel, |b| match std::str::from_utf8(b) {
            Ok(p) if !p.is_empty() && !p.contains('\n') => Ok(p.to_string()),
            _ => Err(format!("unknown step {:?}", String::from_utf8_lossy(b))),
        })
    }

    /// A journal of format 1 (`journal/<op>/`, written by inplaced up to 43048f4), each
    /// file verified: read exactly as that agent read it.
    pub(super) fn journal_v1(&self, op: &str) -> Result<JournalState, StateError> {
        let base = format!("/journal/{op}");
        let json = |b: &[u8]| serde_json::from_slice::<Intent>(b).map_err(|e| e.to_string());
        let rel = format!("{base}/intent.json");
        let intent = self.read_sealed(&rel, json);
        let unverified_intent = self.unverified_intent(&rel, &intent);
        let progress = self.read_progress(&format!("{base}/progress"));
        let committed = if self
            .io(self.dir.stat(&format!("{base}/committed")))?
            .is_some()
        {
            Some(self.committed_v1(&base))
        } else {
            None
        };
        Ok(JournalState {
            version: 1,
            intent,
            unverified_intent,
            progress,
            committed,
        })
    }

    /// The record and spec of a format-1 journal past its commit point, both verified.
    fn committed_v1(&self, base: &str) -> Sealed<Committed> {
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
                generation: 0,
                record,
                phase,
                spec,
                operation: None,
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

    /// Moves the journal of `op` aside whole, to `quarantine/<op>-<unix seconds>` (format
    /// 1: its directory; format 2: its `journal/<op>.*` files, with their names), with
    /// `report` (what it names and what is on disk) written next to it; returns the new
    /// path. Nothing is ever restored from a quarantined journal.
    pub fn journal_quarantine(
        &self,
        version: u32,
        op: &str,
        report: &str,
    ) -> Result<String, StateError> {
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let journal = self.path.join("journal");
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
        if version == 1 {
            let from = journal.join(op);
            std::fs::rename(&from, &to).map_err(|e| io(&from, "move journal to quarantine", e))?;
        } else {
            std::fs::create_dir_all(&to).map_err(|e| io(&to, "create quarantine", e))?;
            for name in self.journal_files_of(op)? {
                let from = journal.join(&name);
                std::fs::rename(&from, to.join(&name))
                    .map_err(|e| io(&from, "move journal to quarantine", e))?;
            }
        }
        for d in [&to, &qdir, &journal] {
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
}

#[cfg(test)]
mod tests {
    use super::{EffectEntry, Intent, IntentEntry, PreImage};

    /// An intent as the agent wrote it before the effects (and still does): a path, two
    /// live sysctls, a unit and a boot-configuration command.
    const WRITTEN: &str = r#"{
  "operation": "op-1",
  "entries": [
    {
      "path": "/etc/default/grub",
      "pre": {
        "file": "0",
        "sha256": "sha256:aa",
        "len": 3,
        "mode": 420,
        "uid": 0,
        "gid": 0
      },
      "missingDirs": [],
      "newSha256": "sha256:bb"
    }
  ],
  "sysctls": [
    [
      "vm.swappiness",
      "60"
    ],
    [
      "net.ipv4.ip_forward",
      "0"
    ]
  ],
  "units": [
    "kubelet.service"
  ],
  "commands": [
    [
      "update-grub"
    ]
  ]
}"#;

    fn expected() -> Intent {
        Intent {
            version: 1,
            staged: None,
            operation: "op-1".into(),
            entries: vec![IntentEntry {
                path: "/etc/default/grub".into(),
                pre: Some(PreImage {
                    file: "0".into(),
                    sha256: "sha256:aa".into(),
                    len: 3,
                    mode: 0o644,
                    uid: 0,
                    gid: 0,
                }),
                missing_dirs: vec![],
                new_sha256: Some("sha256:bb".into()),
                restore_over_any: false,
            }],
            effects: vec![
                EffectEntry::Sysctl {
                    key: "vm.swappiness".into(),
                    prior: "60".into(),
                },
                EffectEntry::Sysctl {
                    key: "net.ipv4.ip_forward".into(),
                    prior: "0".into(),
                },
                EffectEntry::Rerun(vec!["update-grub".into()]),
            ],
            units: vec!["kubelet.service".into()],
        }
    }

    /// The on-disk intent is unchanged: what the agent wrote reads back into the effects'
    /// entries (sysctls in order, then the commands), and is written again byte for byte.
    #[test]
    fn an_intent_with_sysctls_units_and_commands_reads_back_and_is_written_the_same() {
        let read: Intent = serde_json::from_str(WRITTEN).unwrap();
        assert_eq!(read, expected());
        let again = serde_json::to_vec_pretty(&read).unwrap();
        assert_eq!(String::from_utf8(again).unwrap(), WRITTEN);
        // whatever order the plan's effects came in, each kind keeps its field and order
        let mut mixed = expected();
        mixed.effects.rotate_right(1);
        assert_eq!(serde_json::to_string_pretty(&mixed).unwrap(), WRITTEN);
    }

    /// The intent exactly as the agent before the effects declared it (the derive this
    /// edge replaced).
    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Before {
        operation: String,
        entries: Vec<IntentEntry>,
        sysctls: Vec<(String, String)>,
        units: Vec<String>,
        #[serde(default)]
        commands: Vec<Vec<String>>,
    }

    /// Both ways with the agent before the effects: what it wrote is what this writes,
    /// and what this writes it reads with the same values.
    #[test]
    fn the_intent_is_the_one_the_agent_before_the_effects_wrote_and_read() {
        let before = Before {
            operation: "op-1".into(),
            entries: expected().entries,
            sysctls: vec![
                ("vm.swappiness".into(), "60".into()),
                ("net.ipv4.ip_forward".into(), "0".into()),
            ],
            units: vec!["kubelet.service".into()],
            commands: vec![vec!["update-grub".into()]],
        };
        assert_eq!(serde_json::to_string_pretty(&before).unwrap(), WRITTEN);
        let now = serde_json::to_vec_pretty(&expected()).unwrap();
        let read: Before = serde_json::from_slice(&now).unwrap();
        assert_eq!(read.sysctls, before.sysctls);
        assert_eq!(read.commands, before.commands);
        assert_eq!(
            (read.operation, read.units),
            (before.operation, before.units)
        );
    }

    /// Format 2 writes its version first and the Staging operation last, and reads back
    /// the same; format 1 (no `version`) reads as version 1.
    #[test]
    fn a_format_2_intent_says_its_version() {
        let mut v2 = expected();
        v2.version = 2;
        v2.staged = Some(serde_json::json!({"id": "op-1", "phase": "PHASE_STAGING"}));
        let text = serde_json::to_string_pretty(&v2).unwrap();
        assert!(
            text.starts_with("{\n  \"version\": 2,\n  \"operation\""),
            "{text}"
        );
        assert!(text.contains("\"stagedOperation\": {"), "{text}");
        assert_eq!(serde_json::from_str::<Intent>(&text).unwrap(), v2);
        assert_eq!(serde_json::from_str::<Intent>(WRITTEN).unwrap().version, 1);
    }

    /// An older agent's intent (no `commands`) reads as no command; one without `sysctls`
    /// does not parse, as before.
    #[test]
    fn an_older_intent_reads_as_before() {
        let old = r#"{"operation":"op-2","entries":[],"sysctls":[["vm.x","1"]],"units":[]}"#;
        let read: Intent = serde_json::from_str(old).unwrap();
        assert_eq!(
            read.effects,
            [EffectEntry::Sysctl {
                key: "vm.x".into(),
                prior: "1".into()
            }]
        );
        let no_sysctls = r#"{"operation":"op-2","entries":[],"units":[]}"#;
        assert!(serde_json::from_str::<Intent>(no_sysctls).is_err());
    }
}
