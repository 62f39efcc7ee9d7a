//! The journal's on-disk format 2, the one this agent writes: flat files in `journal/`
//! (a directory that exists after the first operation, so no directory is created per
//! operation), one sealed commit holding everything a roll-forward needs.
//!
//! ```text
//! journal/<op>.pre-<n>    pre-image n (raw bytes; its SHA-256 and length are in the intent);
//!                         none for a path whose content is a file item of the applied spec
//!                         (the intent's pre-image names "applied-spec", see
//!                         `PRE_FROM_APPLIED_SPEC`: read back from the commits or
//!                         `applied-spec.pb`, verified by the same length and SHA-256)
//! journal/<op>.intent     sealed JSON: "version": 2, the paths, pre-images, effects, units,
//!                         and the operation as it was in Staging ("stagedOperation")
//! journal/<op>.progress   sealed step marker (never fsynced, but for an effect's step
//!                         the journal can not undo: a Kubernetes upgrade's)
//! journal/<op>.commit     sealed: one JSON line {"version": 2, "generation", "phase",
//!                         "record", "operation"}, a newline, then the NodeSpec applied
//!                         (protobuf bytes)
//! ```
//!
//! ## The version rule
//!
//! The format is the layout plus the `version` field of the intent and the commit. A
//! directory `journal/<op>/` is format 1 (inplaced up to commit 43048f4: `intent.json`
//! without a `version`, `pre/<n>`, `progress`, `spec.pb`, `record.json`, `committed`); it
//! is read and settled exactly as that agent did, so an agent upgraded while an operation
//! is pending recovers it as before. Flat files are format 2. A flat intent or commit with
//! any other `version` was written by a newer agent: it does not verify (quarantined,
//! nothing restored from it), never guessed at. A change of the layout or of what a
//! field means takes the next version and keeps the reader of every older one.
//!
//! ## Why a commit outlives its operation
//!
//! The commit is the applied state: after it is durable an operation installs nothing
//! ([`StateDir::retire_journal`] only drops the spent journal files), and the
//! readers ([`StateDir::load_record`], [`StateDir::load_applied_spec`], the pre-images
//! read from the applied spec) take the record and the spec from it. The reading rule:
//! **the pending commit with the highest `generation` that verifies wins; else the
//! installed `applied.json` and `applied-spec.pb`.** Up to inplaced c649bfd every
//! operation also wrote both files (without an fsync) from its commit: two new files an
//! operation, which on a file system that skips recently freed inodes (ext4 without a
//! journal) cost more than the rest of their writes; a directory that agent left (its
//! files and a pending commit that holds the same) reads the same by this rule.
//!
//! The commit stays until something newer is durable: the next operation's commit (which
//! removes it, without an fsync: a power cut that brings it back leaves two commits, and
//! the highest `generation` wins), [`StateDir::settle_commits`] (before any write of the
//! record outside an operation: the highest commit installed with fsyncs, then every
//! commit removed and `journal/` fsynced), or the next start (which installs the highest
//! commit with fsyncs and removes them all). Pruning the history settles the commits too
//! before it removes an operation whose commit is pending ([`StateDir::prune`]): the next
//! start would otherwise settle that operation again from its commit, bringing it back in
//! the phase it committed. So the installed files are never newer than a pending commit,
//! nothing but an operation's own commit ever changes the applied state while a commit
//! is pending, and installing the highest commit again is always right.
//!
//! A commit is written whole or not at all (its content fsynced before its rename), so
//! no crash leaves one that does not verify. A regular `*.commit` file that does not
//! verify while the agent runs (damaged on disk, a newer agent's, or larger than
//! [`COMMIT_MAX_BYTES`], which is not read) may hold a newer state than any that
//! verifies: the readers that plan fail naming it ([`StateError::DamagedCommit`]), so
//! coverage and changes are refused; status reports it beside the newest state that
//! verifies; no retire or settle removes it; the next start quarantines it (bytes kept)
//! and reports it. Entries under a commit's name that are not regular files (a
//! directory, a link, a FIFO) are not commits: passed over, left for the start to report.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use inplace_node::sysroot::{Durability, Kind, Stamp};
use inplace_wire::pb;

use super::{AppliedRecord, Committed, Intent, JournalState, Sealed, StateDir, StateError, seal};

/// The largest `journal/*.commit` the readers read, in bytes: a commit is a JSON line
/// (the record and the operation) and the spec, whose protobuf is at most the largest
/// message the server receives (65 MiB, `server/admit.rs` `RECEIVING_MIB`); four times
/// that leaves the record room. A larger file is damaged without being read, so a stray
/// file can not make every status read it whole.
pub(crate) const COMMIT_MAX_BYTES: u64 = 256 << 20;

/// The journal format this agent writes (see the module docs for the version rule).
pub(crate) const JOURNAL_VERSION: u32 = 2;

/// What a flat journal file is, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Intent,
    Progress,
    Commit,
    Pre,
}

/// `<op>.intent` → (op, Intent); temporary files (`.` first) and other names: None.
fn parse_name(name: &str) -> Option<(&str, Part)> {
    if name.starts_with('.') {
        return None;
    }
    for (suffix, part) in [
        (".intent", Part::Intent),
        (".progress", Part::Progress),
        (".commit", Part::Commit),
    ] {
        if let Some(op) = name.strip_suffix(suffix) {
            return Some((op, part)).filter(|(op, _)| !op.is_empty());
        }
    }
    let (op, n) = name.rsplit_once(".pre-")?;
    (!op.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .then_some((op, Part::Pre))
}

/// The body of a commit: its JSON line, then the spec.
fn parse_commit(b: &[u8]) -> Result<Committed, String> {
    let nl = b
        .iter()
        .position(|c| *c == b'\n')
        .ok_or("no newline after the commit's header")?;
    let v: serde_json::Value = serde_json::from_slice(&b[..nl]).map_err(|e| e.to_string())?;
    let version = v.get("version").and_then(serde_json::Value::as_u64);
    if version != Some(u64::from(JOURNAL_VERSION)) {
        return Err(format!(
            "journal format {version:?}: written by another inplaced; this one reads formats 1 and {JOURNAL_VERSION}"
        ));
    }
    let num = |k: &str| {
        v.get(k)
            .and_then(serde_json::Value::as_i64)
            .ok_or(format!("no {k}"))
    };
    Ok(Committed {
        generation: num("generation")? as u64,
        phase: num("phase")? as i32,
        record: serde_json::from_value(v.get("record").cloned().unwrap_or_default())
            .map_err(|e| e.to_string())?,
        spec: b[nl + 1..].to_vec(),
        operation: v.get("operation").cloned(),
    })
}

/// What the readers take from a pending commit: its generation, the record and the spec
/// (the operation is recovery's, [`parse_commit`]).
#[derive(Debug)]
pub(super) struct AppliedCopy {
    /// The commit's file, relative to the state directory (for messages).
    pub(super) file: String,
    /// The commit's generation (the highest that verifies is the applied state).
    pub(super) generation: u64,
    /// The applied record.
    pub(super) record: AppliedRecord,
    /// The NodeSpec applied (protobuf bytes).
    pub(super) spec: Vec<u8>,
}

/// Pending commits parsed by [`StateDir::applied_commit`], by file name, with the stamp
/// of the file they were parsed from.
pub(super) type CommitCache = std::collections::HashMap<String, (Stamp, Arc<AppliedCopy>)>;

/// The body of a commit as the readers need it: what [`parse_commit`] checks (the format,
/// a generation and a phase, the record), without a copy of the operation.
fn parse_applied(b: &[u8]) -> Result<AppliedCopy, String> {
    #[derive(serde::Deserialize)]
    struct Head {
        version: Option<u64>,
        generation: Option<i64>,
        phase: Option<i64>,
        record: AppliedRecord,
    }
    let nl = b
        .iter()
        .position(|c| *c == b'\n')
        .ok_or("no newline after the commit's header")?;
    let h: Head = serde_json::from_slice(&b[..nl]).map_err(|e| e.to_string())?;
    if h.version != Some(u64::from(JOURNAL_VERSION)) {
        return Err(format!(
            "journal format {:?}: written by another inplaced; this one reads formats 1 and {JOURNAL_VERSION}",
            h.version
        ));
    }
    let generation = h.generation.ok_or("no generation")?;
    h.phase.ok_or("no phase")?;
    Ok(AppliedCopy {
        file: String::new(),
        generation: generation as u64,
        record: h.record,
        spec: b[nl + 1..].to_vec(),
    })
}

impl StateDir {
    /// Writes the pre-image `n` of operation `op` as `journal/<op>.pre-<n>` (its content
    /// fsynced; its name is made durable by the intent's fsync of `journal/`); returns its
    /// file name.
    pub fn journal_pre_image(
        &self,
        op: &str,
        n: usize,
        content: &[u8],
    ) -> Result<String, StateError> {
        let file = format!("{op}.pre-{n}");
        self.write_with(
            &format!("/journal/{file}"),
            content,
            Durability::ContentOnly,
        )?;
        Ok(file)
    }

    /// Makes the staged originals durable (one fsync of `originals/` when `originals`
    /// were saved), then writes the intent (sealed, format 2) as `journal/<op>.intent`:
    /// its content, then `journal/` fsynced, which makes the pre-images' names durable
    /// too. From here on a crash is rolled back at the next start.
    pub fn journal_intent(&self, intent: &Intent, originals: bool) -> Result<(), StateError> {
        if originals {
            self.sync_dir("/originals")?;
        }
        let rel = format!("/journal/{}.intent", intent.operation);
        let b = serde_json::to_vec_pretty(intent).map_err(|e| self.corrupt(&rel, e))?;
        self.write(&rel, &seal(&b))
    }

    /// Records a step the journal can not undo (a Kubernetes upgrade's: binaries
    /// replaced, `kubeadm upgrade node`), durably: a new file, fsynced, renamed, the
    /// directory fsynced. A power cut must not leave an earlier marker, which recovery
    /// would read as a step the journal undoes whole (a roll-back reported complete with
    /// the new binaries in place). Two fsyncs a step, for the few steps of an upgrade.
    pub fn journal_progress_durable(&self, op: &str, step: &str) -> Result<(), StateError> {
        self.write_with(
            &format!("/journal/{op}.progress"),
            &seal(step.as_bytes()),
            Durability::Durable,
        )
    }

    /// Records the last step operation `op` completed (sealed), without an fsync: the
    /// marker only says how far the operation got (it words the rolled-back message;
    /// rolling back restarts the units whenever a path went back, whatever it says). A
    /// power cut may leave an earlier step or a marker that does not verify, which
    /// recovery already handles.
    ///
    /// A marker at least as long as the one there (`staged` → `written`) is written over
    /// it in place, one `pwrite` of less than a page (a kill leaves the old marker or the
    /// new one): no new file, which on a file system that skips recently freed inodes
    /// (ext4 without a journal) costs more than the rest of the write. A first or a
    /// shorter marker is written to a new file and renamed, as before.
    pub fn journal_progress(&self, op: &str, step: &str) -> Result<(), StateError> {
        let rel = format!("/journal/{op}.progress");
        let sealed = seal(step.as_bytes());
        if !inplace_node::failpoint::sticky("state-full") && self.overwrite(&rel, &sealed) {
            return Ok(());
        }
        self.write_with(&rel, &sealed, Durability::Lazy)
    }

    /// Writes `bytes` over the regular file `rel` in place when it exists, is no longer
    /// than `bytes` (then one write covers it whole) and is the journal's own file, as
    /// [`StateDir::write_with`] leaves it (one link, 0600, the agent's owner): false when
    /// not done, and the caller writes a new file renamed over it. Anything else there
    /// (a FIFO, which would block the open; a hard link to another file, written
    /// through; a stale file of another mode or owner) is replaced, as before.
    fn overwrite(&self, rel: &str, bytes: &[u8]) -> bool {
        use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
        let path = self.path.join(rel.trim_start_matches('/'));
        let Ok(f) = std::fs::OpenOptions::new()
            .write(true)
            // a link there is not followed (the atomic write then refuses it); a FIFO
            // or device is not waited on
            .custom_flags(
                (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32,
            )
            .open(&path)
        else {
            return false;
        };
        match f.metadata() {
            Ok(m)
                if m.is_file()
                    && m.len() <= bytes.len() as u64
                    && m.nlink() == 1
                    && m.mode() & 0o7777 == 0o600
                    && (m.uid(), m.gid()) == (self.uid, self.gid) => {}
            _ => return false,
        }
        f.write_all_at(bytes, 0).is_ok()
    }

    /// The commit point: `journal/<op>.commit` (sealed: format, generation, the phase to
    /// end in, the record and the operation `op` as it is now, then the spec applied),
    /// its content then `journal/` fsynced (2 barriers). Being one sealed file, it is
    /// there whole or not at all.
    pub fn journal_commit(
        &self,
        op: &pb::Operation,
        spec: &[u8],
        record: &AppliedRecord,
        phase: i32,
    ) -> Result<(), StateError> {
        let rel = format!("/journal/{}.commit", op.id);
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        // serialised straight from the values (no `serde_json::Value` copy of the
        // record and the operation); the keys are those `parse_commit` reads
        #[derive(serde::Serialize)]
        struct Head<'a> {
            version: u32,
            generation: u64,
            phase: i32,
            record: &'a AppliedRecord,
            operation: &'a pb::Operation,
        }
        let head = Head {
            version: JOURNAL_VERSION,
            generation,
            phase,
            record,
            operation: op,
        };
        let mut b = serde_json::to_vec(&head).map_err(|e| self.corrupt(&rel, e))?;
        b.push(b'\n');
        b.extend_from_slice(spec);
        self.write(&rel, &seal(&b))
    }

    /// Ends operation `op`'s use of its journal once its commit is durable: removes,
    /// without an fsync, the intent, progress and pre-images of `op`, and the commits of
    /// earlier operations (a power cut that brings them back is settled by the highest
    /// generation). Nothing is installed: the commit is the applied state's source until
    /// something newer is durable (see the module docs), which saves the two new files
    /// (`applied.json`, `applied-spec.pb`) every operation wrote before.
    ///
    /// An earlier commit is removed only when it is a regular file that verifies: a
    /// directory, link or FIFO under a commit's name is not a file this agent wrote (the
    /// start reports it), and a commit that does not verify may hold a newer applied
    /// state than the one this operation was planned on (the start quarantines it).
    pub fn retire_journal(&self, op: &str) -> Result<(), StateError> {
        for name in self.io(self.dir.list_dir("/journal"))?.unwrap_or_default() {
            let stale = match parse_name(&name) {
                // verified as the readers read it (the operation it holds skipped)
                Some((o, Part::Commit)) => {
                    o != op
                        && matches!(
                            self.read_commit_file(&name, parse_applied),
                            Some(Sealed::Valid(_))
                        )
                }
                Some((o, _)) => o == op,
                None => false,
            };
            if stale {
                self.io(self.dir.remove_deferred(&format!("/journal/{name}")))?;
            }
        }
        Ok(())
    }

    /// `journal/<name>` read as a commit by `parse`, within [`COMMIT_MAX_BYTES`]: None
    /// when it is not a regular file (never a commit this agent wrote: a directory, a
    /// link, a FIFO); a larger file is damaged without being read.
    fn read_commit_file<T>(
        &self,
        name: &str,
        parse: impl Fn(&[u8]) -> Result<T, String>,
    ) -> Option<Sealed<T>> {
        let rel = format!("/journal/{name}");
        match self.io(self.dir.stat(&rel)) {
            Err(e) => Some(Sealed::Damaged(e.to_string())),
            Ok(None) => Some(Sealed::Absent),
            Ok(Some(e)) if e.kind != Kind::File => None,
            Ok(Some(e)) if e.len > COMMIT_MAX_BYTES => Some(Sealed::Damaged(format!(
                "{}: {} bytes, larger than any commit this agent writes ({COMMIT_MAX_BYTES} at most)",
                self.full(&rel),
                e.len
            ))),
            Ok(Some(_)) => Some(self.read_sealed(&rel, parse)),
        }
    }

    /// The applied state held by the pending format-2 commit with the highest generation
    /// that verifies, if any: what [`StateDir::load_record`] and
    /// [`StateDir::load_applied_spec`] read before the installed files.
    ///
    /// A commit listed but gone when read was removed by a newer durable state (the next
    /// operation's commit, or a settle, which installs the files before it removes a
    /// commit): the listing is taken again, so a reader running beside an operation sees
    /// the old applied state or the new one, never an older one.
    ///
    /// A commit is parsed again only when its file's stamp changed since it was last
    /// parsed (as the operation heads: nothing kept from a file changed less than
    /// [`inplace_node::sysroot::trace::RACY`] before the look); every look goes through
    /// the sysroot, so a trace of the reader sees the listing and each commit's stamp.
    ///
    /// A regular `*.commit` file that does not verify fails the read
    /// ([`StateError::DamagedCommit`]): it may hold a newer state than the best that
    /// verifies, so nothing is planned on that one ([`StateDir::load_record_reporting`]
    /// reports it instead). Entries that are not regular files are not commits.
    pub(super) fn applied_commit(&self) -> Result<Option<Arc<AppliedCopy>>, StateError> {
        let (best, damage) = self.applied_commit_seen()?;
        match damage.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(best),
        }
    }

    /// [`StateDir::applied_commit`]'s look: the best commit that verifies, and each
    /// regular `*.commit` file that does not, as a [`StateError::DamagedCommit`].
    pub(super) fn applied_commit_seen(
        &self,
    ) -> Result<(Option<Arc<AppliedCopy>>, Vec<StateError>), StateError> {
        let mut best: Option<Arc<AppliedCopy>> = None;
        let mut damage = Vec::new();
        for _ in 0..8 {
            best = None;
            damage.clear();
            let names: Vec<String> = self
                .io(self.dir.list_dir("/journal"))?
                .unwrap_or_default()
                .into_iter()
                .filter(|n| matches!(parse_name(n), Some((_, Part::Commit))))
                .collect();
            let mut kept = self.commits_read.lock().unwrap_or_else(|p| p.into_inner());
            // rebuilt from the listing: the entries of removed commits go with them
            let mut old = std::mem::take(&mut *kept);
            let mut vanished = false;
            for name in names {
                let rel = format!("/journal/{name}");
                let read_at = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                let Some(stamp) = self.io(self.dir.stamp(&rel))? else {
                    vanished = true;
                    continue;
                };
                let copy = match old.remove(&name) {
                    Some((was, c)) if was == stamp => {
                        kept.insert(name, (was, c.clone()));
                        c
                    }
                    _ => match self.read_commit_file(&name, parse_applied) {
                        Some(Sealed::Valid(c)) => {
                            let c = Arc::new(AppliedCopy { file: rel, ..c });
                            if !stamp.is_racily_clean(read_at) {
                                kept.insert(name, (stamp, c.clone()));
                            }
                            c
                        }
                        Some(Sealed::Absent) => {
                            vanished = true;
                            continue;
                        }
                        // not a commit this agent wrote: the start reports it
                        None => continue,
                        // quarantined and reported by the next start's recovery
                        Some(Sealed::Damaged(why)) => {
                            let path = self.full(&rel);
                            let message = why
                                .strip_prefix(&format!("{path}: "))
                                .map_or(why.clone(), str::to_string);
                            damage.push(StateError::DamagedCommit { path, message });
                            continue;
                        }
                    },
                };
                if best.as_ref().is_none_or(|b| copy.generation > b.generation) {
                    best = Some(copy);
                }
            }
            if !vanished {
                break;
            }
        }
        Ok((best, damage))
    }

    /// Installs the highest pending commit with fsyncs and removes every commit (then
    /// `journal/` fsynced): called before the record or the spec is written outside an
    /// operation, so that no commit can later install an older record over that write.
    pub(super) fn settle_commits(&self) -> Result<(), StateError> {
        // each commit read once: the verified ones are installed (the highest) and
        // removed; as in a retire, what does not verify is left for the start
        let mut verified: Vec<(String, Committed)> = Vec::new();
        for name in self.io(self.dir.list_dir("/journal"))?.unwrap_or_default() {
            if matches!(parse_name(&name), Some((_, Part::Commit)))
                && let Some(Sealed::Valid(c)) = self.read_commit_file(&name, parse_commit)
            {
                verified.push((name, c));
            }
        }
        let Some((_, c)) = verified.iter().max_by_key(|(_, c)| c.generation) else {
            return Ok(());
        };
        self.install_applied(&c.record, &c.spec)?;
        for (name, _) in &verified {
            self.io(self.dir.remove_deferred(&format!("/journal/{name}")))?;
        }
        self.sync_dir("/journal")
    }

    /// The operations that have a format-2 commit in `journal/` (verified or not).
    pub(super) fn commit_owners(&self) -> Result<std::collections::BTreeSet<String>, StateError> {
        Ok(self
            .io(self.dir.list_dir("/journal"))?
            .unwrap_or_default()
            .iter()
            .filter_map(|n| match parse_name(n) {
                Some((op, Part::Commit)) => Some(op.to_string()),
                _ => None,
            })
            .collect())
    }

    /// The spec of every pending format-2 commit that verifies (in `journal/`'s order),
    /// each read as the readers read it ([`parse_applied`]: the operation it holds is
    /// skipped, not built).
    pub(super) fn commit_specs(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for name in self
            .io(self.dir.list_dir("/journal"))
            .ok()
            .flatten()
            .unwrap_or_default()
        {
            if matches!(parse_name(&name), Some((_, Part::Commit)))
                && let Some(Sealed::Valid(c)) = self.read_commit_file(&name, parse_applied)
            {
                out.push(c.spec);
            }
        }
        out
    }

    /// The pending format-2 commit with the highest generation that verifies, if any.
    pub(super) fn pending_commit(&self) -> Result<Option<Committed>, StateError> {
        let mut best: Option<Committed> = None;
        for name in self.io(self.dir.list_dir("/journal"))?.unwrap_or_default() {
            if matches!(parse_name(&name), Some((_, Part::Commit)))
                && let Some(Sealed::Valid(c)) = self.read_commit_file(&name, parse_commit)
                && best.as_ref().is_none_or(|b| c.generation > b.generation)
            {
                best = Some(c);
            }
        }
        Ok(best)
    }

    /// The journals left in the state directory, by operation id, each file verified:
    /// format 1 first (directories, as listed), then format 2's operations without a
    /// commit (rolled back), then those with one, oldest generation first (so that the
    /// last one installed is the newest).
    pub fn journals(&self) -> Result<Vec<(String, JournalState)>, StateError> {
        let mut v1 = Vec::new();
        let mut ops: std::collections::BTreeMap<String, Vec<Part>> = Default::default();
        for name in self.io(self.dir.list_dir("/journal"))?.unwrap_or_default() {
            let is_dir = matches!(
                self.io(self.dir.stat(&format!("/journal/{name}")))?,
                Some(e) if e.kind == inplace_node::sysroot::Kind::Dir
            );
            if is_dir {
                v1.push((name.clone(), self.journal_v1(&name)?));
            } else if let Some((op, part)) = parse_name(&name) {
                ops.entry(op.to_string()).or_default().push(part);
            }
        }
        let mut v2: Vec<(String, JournalState)> = ops
            .into_iter()
            .map(|(op, parts)| {
                let j = self.journal_v2(&op, parts.contains(&Part::Commit));
                (op, j)
            })
            .collect();
        let key = |j: &JournalState| match &j.committed {
            None => (0, 0),
            Some(Sealed::Valid(c)) => (2, c.generation),
            Some(_) => (1, 0),
        };
        v2.sort_by_key(|(_, j)| key(j));
        if let Some(top) = v2.iter().map(|(_, j)| key(j).1).max() {
            self.generation.fetch_max(top + 1, Ordering::Relaxed);
        }
        v1.extend(v2);
        Ok(v1)
    }

    /// A format-2 journal, each file verified.
    fn journal_v2(&self, op: &str, has_commit: bool) -> JournalState {
        let rel = format!("/journal/{op}.intent");
        let intent = self.read_sealed(&rel, |b| {
            let i: Intent = serde_json::from_slice(b).map_err(|e| e.to_string())?;
            if i.version == JOURNAL_VERSION {
                Ok(i)
            } else {
                Err(format!(
                    "journal format {}: written by another inplaced; this one reads formats 1 and {JOURNAL_VERSION}",
                    i.version
                ))
            }
        });
        let unverified_intent = self.unverified_intent(&rel, &intent);
        let progress = self.read_progress(&format!("/journal/{op}.progress"));
        let committed =
            has_commit.then(|| self.read_sealed(&format!("/journal/{op}.commit"), parse_commit));
        JournalState {
            version: JOURNAL_VERSION,
            intent,
            unverified_intent,
            progress,
            committed,
        }
    }

    /// The names of operation `op`'s format-2 journal files in `journal/`.
    pub(super) fn journal_files_of(&self, op: &str) -> Result<Vec<String>, StateError> {
        Ok(self
            .io(self.dir.list_dir("/journal"))?
            .unwrap_or_default()
            .into_iter()
            .filter(|n| matches!(parse_name(n), Some((o, _)) if o == op))
            .collect())
    }

    /// The full path of operation `op`'s journal file `part` (`intent`, `progress`,
    /// `commit`) in format `version`, for messages.
    pub fn journal_file(&self, version: u32, op: &str, part: &str) -> String {
        match (version, part) {
            (1, "intent") => self.full(&format!("/journal/{op}/intent.json")),
            (1, "commit") => self.full(&format!("/journal/{op}/committed")),
            (1, p) => self.full(&format!("/journal/{op}/{p}")),
            (_, p) => self.full(&format!("/journal/{op}.{p}")),
        }
    }

    /// Removes the journal of `op` (the operation is settled): its format-1 directory
    /// and its format-2 files, then `journal/` fsynced.
    pub fn journal_remove(&self, op: &str) -> Result<(), StateError> {
        let p = self.path.join("journal").join(op);
        match std::fs::remove_dir_all(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {}
            Err(e) => {
                return Err(inplace_node::sysroot::SysrootError::Io {
                    path: p.display().to_string(),
                    op: "remove journal",
                    error: e,
                }
                .into());
            }
        }
        for name in self.journal_files_of(op)? {
            self.io(self.dir.remove_deferred(&format!("/journal/{name}")))?;
        }
        if let Ok(d) = std::fs::File::open(self.path.join("journal")) {
            let _ = inplace_node::sysroot::fsync(&d);
        }
        Ok(())
    }

    /// Interrupted operations a start will settle, counted for the recoveries metric:
    /// format-1 directories and format-2 intents (a commit alone is kept by design after
    /// its operation settled).
    pub fn pending_journals(state_dir: &std::path::Path) -> u64 {
        std::fs::read_dir(state_dir.join("journal"))
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| {
                        e.path().is_dir()
                            || matches!(
                                parse_name(&e.file_name().to_string_lossy()),
                                Some((_, Part::Intent))
                            )
                    })
                    .count() as u64
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::{Part, parse_name};

    #[test]
    fn names_of_format_2() {
        assert_eq!(parse_name("op.1.intent"), Some(("op.1", Part::Intent)));
        assert_eq!(parse_name("a.pre-12"), Some(("a", Part::Pre)));
        assert_eq!(
            parse_name("a.pre-1.commit"),
            Some(("a.pre-1", Part::Commit))
        );
        assert_eq!(parse_name("a.pre-"), None);
        assert_eq!(parse_name(".a.intent.inplaced-1-2.tmp"), None);
        assert_eq!(parse_name(".intent"), None);
        assert_eq!(parse_name("x.progress"), Some(("x", Part::Progress)));
    }
}
