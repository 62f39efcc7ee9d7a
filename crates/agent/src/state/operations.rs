//! The operation store: `operations/<id>.json`, one proto3 JSON `inplace.v1.Operation`
//! each. Settled operations live here only; the agent keeps in memory just the running
//! operation and a byte-bounded replay of the newest ones (`crate::apply`), and reads
//! the rest from here when asked for. Bookkeeping that needs only an operation's id,
//! phase and creation time (pruning, superseding, start-up ids, status) reads
//! [`OperationHead`]s, which skip the changes and actions while parsing.

use serde::Deserialize;

use super::{StateDir, StateError};
use inplace_node::sysroot::Stamp;
use inplace_wire::pb;

/// An operation's id, phase and creation time, read without its changes and actions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationHead {
    /// Operation id (the file name without `.json`).
    pub id: String,
    /// Its phase (`pb::Phase` as i32; 0 when the file has none).
    pub phase: i32,
    /// Creation time as (seconds, nanos) since the Unix epoch; (0, 0) when absent.
    pub created: (i64, i32),
}

#[derive(Deserialize)]
struct HeadJson {
    #[serde(default)]
    id: String,
    #[serde(default)]
    phase: Option<pb::Phase>,
    #[serde(default)]
    created: Option<pbjson_types::Timestamp>,
}

fn created_key(t: Option<pbjson_types::Timestamp>) -> (i64, i32) {
    t.map(|t| (t.seconds, t.nanos)).unwrap_or((0, 0))
}

/// An operation file's head, skipping its changes and actions.
fn parse_head(b: &[u8]) -> serde_json::Result<OperationHead> {
    let h: HeadJson = serde_json::from_slice(b)?;
    Ok(OperationHead {
        id: h.id,
        phase: h.phase.map(|p| p as i32).unwrap_or(0),
        created: created_key(h.created),
    })
}

/// The heads parsed from operation files, by file name, with the stamp of the file they
/// were parsed from ([`StateDir::operation_heads`]): device, inode, size, mtime and ctime
/// (ns), which change when a file is replaced or rewritten.
#[derive(Debug, Default)]
pub(super) struct HeadCache {
    heads: std::collections::HashMap<String, KeptHead>,
    /// Operation files read for their heads (what the cache saves, for its tests).
    #[cfg(test)]
    reads: u64,
}

/// A head and the stamp of the file it was parsed from.
#[derive(Debug)]
struct KeptHead {
    stamp: Stamp,
    head: OperationHead,
    /// The file was racily clean when read ([`Stamp::is_racily_clean`]): a rewrite in
    /// the same clock tick may have left its stamp as it was, so the head is used only
    /// while the file stays within the racy window, and read once more past it.
    provisional: bool,
}

impl KeptHead {
    /// True when the head still holds for a file whose stamp is `stamp`, looked at
    /// `read_at`.
    fn is_current(&self, stamp: Stamp, read_at: std::time::Duration) -> bool {
        self.stamp == stamp && (!self.provisional || stamp.is_racily_clean(read_at))
    }
}

impl StateDir {
    /// Persists an operation durably (the file, then `operations/`), except in phase
    /// Staging: then it is written without an fsync, because the journal's intent holds
    /// the operation as it was in Staging (a power cut before the intent is durable
    /// changed nothing on the node; after it, recovery settles the operation from the
    /// intent's copy).
    ///
    /// Written as compact JSON (one line): every reader parses JSON, so a file of an
    /// earlier release (pretty-printed) reads as before, and this one reads in an
    /// earlier release; the indentation was about a third of the bytes, and its
    /// formatting a share of each phase's publishing (issue 28).
    pub fn save_operation(&self, op: &pb::Operation) -> Result<(), StateError> {
        let rel = format!("/operations/{}.json", op.id);
        let b = serde_json::to_vec(op).map_err(|e| self.corrupt(&rel, e))?;
        let durability = if op.phase == pb::Phase::Staging as i32 {
            inplace_node::sysroot::Durability::Lazy
        } else {
            inplace_node::sysroot::Durability::Durable
        };
        // the head kept for the file no longer holds ([`StateDir::doomed_from_kept`]
        // looks again at a file whose head is not kept)
        let name = format!("{}.json", op.id);
        self.heads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .heads
            .remove(&name);
        self.write_with(&rel, &b, durability)
    }

    /// The names of the operation files (`<id>.json`, temporary files skipped), with
    /// their ids.
    fn operation_files(&self) -> Result<Vec<(String, String)>, StateError> {
        Ok(self
            .io(self.dir.list_dir("/operations"))?
            .unwrap_or_default()
            .into_iter()
            .filter(|n| !n.starts_with('.'))
            .filter_map(|n| Some((n.strip_suffix(".json")?.to_string(), n.clone())))
            .collect())
    }

    /// Every operation file parsed by `parse` (which returns the id it found), newest
    /// first by `key`; a file that does not parse, or whose id is not its name, is
    /// skipped with a warning and left in place for inspection.
    fn read_operations<T>(
        &self,
        parse: impl Fn(&[u8]) -> serde_json::Result<(String, T)>,
        key: impl Fn(&T) -> (i64, i32),
        id_of: impl Fn(&T) -> &str,
    ) -> Result<Vec<T>, StateError> {
        let mut ops = Vec::new();
        for (id, name) in self.operation_files()? {
            let rel = format!("/operations/{name}");
            if let Some(b) = self.read_operation_file(&rel) {
                match parse(&b) {
                    Ok((found, op)) if found == id => ops.push(op),
                    Ok(_) => {
                        tracing::warn!(file = %rel, "operation file whose id is not its name; skipped")
                    }
                    Err(e) => {
                        tracing::warn!(file = %rel, error = %e, "unreadable operation file; skipped")
                    }
                }
            }
        }
        ops.sort_by(|a, b| key(b).cmp(&key(a)).then_with(|| id_of(b).cmp(id_of(a))));
        Ok(ops)
    }

    /// One file of `operations/`; `None` when it is gone, or can not be read: an entry
    /// under an operation file's name that is not a regular file (a directory, a FIFO, a
    /// symlink, which the sysroot never follows) or that the kernel refuses is skipped with
    /// a warning, as an operation file that does not parse is, so that one bad entry does
    /// not stop the status, the history or the prune of the others.
    fn read_operation_file(&self, rel: &str) -> Option<Vec<u8>> {
        match self.io(self.dir.read(rel)) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(file = %rel, error = %e, "unreadable operation file; skipped");
                None
            }
        }
    }

    /// All operations, newest first (by creation time, then id). An operation file that
    /// can not be read or does not parse, or whose id is not its file name, is skipped with
    /// a warning in the log (history must not stop the agent), and left in place for
    /// inspection.
    pub fn list_operations(&self) -> Result<Vec<pb::Operation>, StateError> {
        self.read_operations(
            |b| serde_json::from_slice::<pb::Operation>(b).map(|op| (op.id.clone(), op)),
            |o| created_key(o.created),
            |o| &o.id,
        )
    }

    /// The [`OperationHead`] of every operation, newest first, as [`list_operations`]
    /// orders and skips them.
    ///
    /// A head is parsed again only when its file's [`Stamp`] changed since it was
    /// last parsed ([`HeadCache`]): pruning after every operation and `status` read the
    /// heads of up to `history.keep` files, and a 200-file operation's file is about
    /// 100 KB of JSON to scan for its head. A head read while its file was racily clean
    /// (changed less than [`inplace_node::sysroot::trace::RACY`] before the look) is used
    /// while the stamp holds and the file is still within that window, then read once
    /// more past it: a rewrite in the same clock tick that left the stamp as it was is
    /// seen then. Operations back to back read each new file twice, not at every
    /// operation's prune until it is 50 ms old (six reads an operation in the bench,
    /// 10 % of its CPU). The agent replaces an operation file by a rename, which gives it
    /// a new inode, so its own rewrites change the stamp at once.
    ///
    /// [`list_operations`]: StateDir::list_operations
    pub fn operation_heads(&self) -> Result<Vec<OperationHead>, StateError> {
        // the time before the looks: a change after it has a later time
        let read_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        // every file's stamp through one open of `operations/` (a walk per file was
        // two more syscalls per operation kept, after every operation)
        let files: Vec<(String, String, Option<Stamp>)> = self
            .io(self.dir.list_dir_stamped("/operations"))?
            .unwrap_or_default()
            .into_iter()
            .filter(|(n, _)| !n.starts_with('.'))
            .filter_map(|(n, s)| Some((n.strip_suffix(".json")?.to_string(), n.clone(), s)))
            .collect();
        let mut cache = self.heads.lock().unwrap_or_else(|p| p.into_inner());
        // rebuilt from the listing: entries of files that are gone go with them
        let mut old = std::mem::take(&mut cache.heads);
        let mut heads = Vec::with_capacity(files.len());
        for (id, name, stamp) in files {
            let current = |k: &KeptHead| stamp.is_some_and(|s| k.is_current(s, read_at));
            if let Some(k) = old.remove(&name).filter(current) {
                heads.push(k.head.clone());
                cache.heads.insert(name, k);
                continue;
            }
            if let Some(head) = self.read_head(&mut cache, &id, &name, stamp, read_at) {
                heads.push(head);
            }
        }
        drop(cache);
        heads.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| b.id.cmp(&a.id)));
        Ok(heads)
    }

    /// The operations [`StateDir::prune`] removes, told without a look at each file kept
    /// (a `stat` of every kept operation file after every operation was 51 of its
    /// syscalls, issue 28): `operations/` is listed, a file whose head is not kept is
    /// looked at and read as [`StateDir::operation_heads`] does (the agent's own writes,
    /// [`StateDir::save_operation`], drop the head kept for their file), the heads are
    /// ordered, and only the operations past the newest `keep` are looked at. `None`
    /// (the caller looks at every file) when one of those changed since its head was
    /// parsed, or is still within its racy window.
    ///
    /// Only the order of the newest `keep` is taken from heads not looked at again. A
    /// file among them rewritten in place by someone else is seen by the next look at
    /// every file (status, the history), or when it comes up for removal: no operation
    /// is removed, nor kept as waiting for a reboot, on a head that no longer holds. At
    /// worst one operation more or fewer than `keep` stays until then.
    fn doomed_from_kept(&self, keep: usize) -> Result<Option<Vec<OperationHead>>, StateError> {
        let read_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let files = self.operation_files()?;
        let mut cache = self.heads.lock().unwrap_or_else(|p| p.into_inner());
        // the cache follows the listing: entries of files that are gone go with them
        if cache.heads.len() > files.len()
            || files.iter().any(|(_, n)| !cache.heads.contains_key(n))
        {
            let listed: std::collections::HashSet<&str> =
                files.iter().map(|(_, n)| n.as_str()).collect();
            cache.heads.retain(|n, _| listed.contains(n.as_str()));
        }
        let mut heads = Vec::with_capacity(files.len());
        for (id, name) in &files {
            match cache.heads.get(name) {
                Some(k) if k.head.id == *id => heads.push((k.head.clone(), name)),
                _ => {
                    let rel = format!("/operations/{name}");
                    let stamp = self.io(self.dir.stamp(&rel))?;
                    if let Some(head) = self.read_head(&mut cache, id, name, stamp, read_at) {
                        heads.push((head, name));
                    }
                }
            }
        }
        heads.sort_by(|(a, _), (b, _)| b.created.cmp(&a.created).then_with(|| b.id.cmp(&a.id)));
        let mut out = Vec::new();
        for (head, name) in heads.into_iter().skip(keep) {
            let stamp = self.io(self.dir.stamp(&format!("/operations/{name}")))?;
            let holds = cache
                .heads
                .get(name)
                .is_some_and(|k| stamp.is_some_and(|s| k.is_current(s, read_at) && !k.provisional));
            if !holds {
                return Ok(None);
            }
            if inplace_wire::phase::is_terminal(head.phase) {
                out.push(head);
            }
        }
        Ok(Some(out))
    }

    /// Reads the head of `operations/<name>` (operation `id`, whose stamp was `stamp` before
    /// the read at `read_at`) and keeps it in `cache` unless its stamp is unknown; `None`,
    /// with a warning, when the file can not be read, does not parse or names another id.
    fn read_head(
        &self,
        cache: &mut HeadCache,
        id: &str,
        name: &str,
        stamp: Option<Stamp>,
        read_at: std::time::Duration,
    ) -> Option<OperationHead> {
        let rel = format!("/operations/{name}");
        let b = self.read_operation_file(&rel)?;
        #[cfg(test)]
        {
            cache.reads += 1;
        }
        match parse_head(&b) {
            Ok(head) if head.id == id => {
                if let Some(stamp) = stamp {
                    let provisional = stamp.is_racily_clean(read_at);
                    let k = KeptHead {
                        stamp,
                        head: head.clone(),
                        provisional,
                    };
                    cache.heads.insert(name.to_string(), k);
                }
                Some(head)
            }
            Ok(_) => {
                tracing::warn!(file = %rel, "operation file whose id is not its name; skipped");
                None
            }
            Err(e) => {
                tracing::warn!(file = %rel, error = %e, "unreadable operation file; skipped");
                None
            }
        }
    }

    /// Moves `operations/<id>.json` (which does not parse) aside to
    /// `operations/<id>.json.corrupt-<unix seconds>`; returns the new path.
    pub fn operation_quarantine(&self, id: &str) -> Result<String, StateError> {
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let from = self.path.join("operations").join(format!("{id}.json"));
        let to = self
            .path
            .join("operations")
            .join(format!("{id}.json.corrupt-{ts}"));
        std::fs::rename(&from, &to).map_err(|e| inplace_node::sysroot::SysrootError::Io {
            path: from.display().to_string(),
            op: "move corrupt operation aside",
            error: e,
        })?;
        Ok(to.display().to_string())
    }

    /// One operation by id.
    pub fn get_operation(&self, id: &str) -> Result<Option<pb::Operation>, StateError> {
        // never a path: callers validate ids (`apply::validate_operation_id`); this is
        // the last line
        if !inplace_wire::names::is_safe_name(id, 255) {
            return Ok(None);
        }
        let rel = format!("/operations/{id}.json");
        match self.io(self.dir.read(&rel))? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| self.corrupt(&rel, e)),
        }
    }

    /// Keeps the newest `keep` operations; older ones are deleted once they ended for good
    /// (an operation still waiting for a reboot is kept whatever its age). Reads only the
    /// operations' heads.
    ///
    /// An operation's format-2 commit outlives it as the durable copy of the applied
    /// state (`journal_v2.rs`), and the next start settles a commit whose operation file
    /// is gone from the commit's own copy of the operation, in the phase it committed:
    /// a pruned operation would come back, a confirmed try as `AwaitingConfirmation`
    /// (then reverted at its deadline), a `Succeeded` one as "completed after an agent
    /// restart". So before an operation whose commit is still pending is pruned, the
    /// commits are settled ([`StateDir::settle_commits`]: the highest installed with
    /// fsyncs, every commit removed, `journal/` fsynced): the operation is then gone
    /// for good, and a power cut that brings its file back brings back what it was.
    ///
    /// The operations to remove are told from the heads kept ([`StateDir::doomed_from_kept`])
    /// when every one of them still holds; otherwise from every file's look
    /// ([`StateDir::operation_heads`]).
    pub fn prune(&self, keep: usize) -> Result<(), StateError> {
        let doomed = match self.doomed_from_kept(keep)? {
            Some(d) => d,
            None => doomed(self.operation_heads()?, keep),
        };
        if doomed.is_empty() {
            return Ok(());
        }
        let committed = self.commit_owners()?;
        if doomed.iter().any(|op| committed.contains(&op.id)) {
            self.settle_commits()?;
        }
        for op in doomed {
            // a pruned file that a power cut brings back is pruned again next time
            self.io(self
                .dir
                .remove_deferred(&format!("/operations/{}.json", op.id)))?;
        }
        Ok(())
    }
}

/// The operations of `heads` (newest first) that pruning to `keep` removes: those past
/// the newest `keep` that ended for good.
fn doomed(heads: Vec<OperationHead>, keep: usize) -> Vec<OperationHead> {
    heads
        .into_iter()
        .skip(keep)
        .filter(|op| inplace_wire::phase::is_terminal(op.phase))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    /// The ids of the operation heads, newest first.
    fn head_ids(s: &StateDir) -> Vec<String> {
        s.operation_heads()
            .unwrap()
            .into_iter()
            .map(|h| h.id)
            .collect()
    }

    fn open() -> (tempfile::TempDir, StateDir) {
        let d = tempfile::tempdir().unwrap();
        let s = StateDir::open(&d.path().join("state")).unwrap();
        (d, s)
    }

    fn op(id: &str, phase: pb::Phase, created: i64) -> pb::Operation {
        pb::Operation {
            id: id.into(),
            phase: phase as i32,
            created: Some(pbjson_types::Timestamp {
                seconds: created,
                nanos: 0,
            }),
            ..Default::default()
        }
    }

    /// Waits until a file written now is past the racy window, so its head is kept.
    fn past_racy_window() {
        std::thread::sleep(2 * inplace_node::sysroot::trace::RACY);
    }

    /// The phase of the head kept for `name` once past the racy window (not provisional).
    fn cached(s: &StateDir, name: &str) -> Option<i32> {
        let c = s.heads.lock().unwrap();
        c.heads
            .get(name)
            .filter(|k| !k.provisional)
            .map(|k| k.head.phase)
    }

    fn reads(s: &StateDir) -> u64 {
        s.heads.lock().unwrap().reads
    }

    /// A head read within the racy window is used again while the file's stamp holds
    /// (not read at every look), read once more past the window, then kept; a file
    /// replaced (the agent's rename) is read at once, in the window or not. (Counts
    /// allow for a loaded machine leaving the window between two looks.)
    #[test]
    fn a_head_read_in_the_racy_window_is_read_once_more_past_it() {
        let (_d, s) = open();
        s.save_operation(&op("a", pb::Phase::Staging, 1)).unwrap();
        assert_eq!(
            s.operation_heads().unwrap()[0].phase,
            pb::Phase::Staging as i32
        );
        assert_eq!(reads(&s), 1);
        for _ in 0..5 {
            assert_eq!(
                s.operation_heads().unwrap()[0].phase,
                pb::Phase::Staging as i32
            );
        }
        assert!(reads(&s) <= 2, "read at every look: {}", reads(&s));
        // the agent's own rewrite: a new file renamed over it, seen at once
        let before = reads(&s);
        s.save_operation(&op("a", pb::Phase::Succeeded, 1)).unwrap();
        assert_eq!(
            s.operation_heads().unwrap()[0].phase,
            pb::Phase::Succeeded as i32
        );
        assert_eq!(reads(&s), before + 1);
        past_racy_window();
        assert_eq!(
            s.operation_heads().unwrap()[0].phase,
            pb::Phase::Succeeded as i32
        );
        assert!(reads(&s) <= before + 2);
        assert_eq!(cached(&s, "a.json"), Some(pb::Phase::Succeeded as i32));
        let kept = reads(&s);
        s.operation_heads().unwrap();
        assert_eq!(reads(&s), kept, "kept");
    }

    /// A file rewritten in place with the same length (same device, inode and size) is
    /// told by its times: the head is parsed again, and pruning sees the new phase.
    #[test]
    fn a_head_kept_is_parsed_again_when_its_file_is_rewritten() {
        let (_d, s) = open();
        s.save_operation(&op("old", pb::Phase::RebootRequired, 10))
            .unwrap();
        s.save_operation(&op("new", pb::Phase::Succeeded, 20))
            .unwrap();
        past_racy_window();
        let heads = s.operation_heads().unwrap();
        assert_eq!(
            heads.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(),
            ["new", "old"]
        );
        assert_eq!(
            cached(&s, "old.json"),
            Some(pb::Phase::RebootRequired as i32)
        );
        // pruning keeps an operation waiting for a reboot, whatever its age
        s.prune(1).unwrap();
        let path = s.path().join("operations/old.json");
        assert!(path.exists());
        // "old" ended: the same file rewritten in place, the same length
        let before = std::fs::read(&path).unwrap();
        let mut after = serde_json::to_vec(&op("old", pb::Phase::Succeeded, 10)).unwrap();
        assert!(after.len() <= before.len());
        after.resize(before.len(), b' ');
        use std::io::Write;
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(&path).unwrap().ino();
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all(&after).unwrap();
        drop(f);
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), ino);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), before.len() as u64);
        let heads = s.operation_heads().unwrap();
        assert_eq!(heads[1].phase, pb::Phase::Succeeded as i32);
        // so pruning removes it now, and its head leaves the cache
        s.prune(1).unwrap();
        assert!(!path.exists());
        assert_eq!(s.operation_heads().unwrap().len(), 1);
        assert_eq!(cached(&s, "old.json"), None);
    }

    /// Pruning reads only the files whose heads are not kept and looks only at the
    /// operations past `keep`: a head that no longer holds there (a file rewritten in
    /// place, or replaced by the agent) is read again before anything is removed.
    #[test]
    fn pruning_looks_again_at_what_it_would_remove() {
        let (_d, s) = open();
        for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
            s.save_operation(&op(id, pb::Phase::Succeeded, i as i64 + 1))
                .unwrap();
        }
        past_racy_window();
        assert_eq!(s.operation_heads().unwrap().len(), 3);
        // "a" rewritten in place (the same inode): waiting for a reboot now
        let path = s.path().join("operations/a.json");
        let after = serde_json::to_vec(&op("a", pb::Phase::RebootRequired, 1)).unwrap();
        use std::io::Write;
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(&path).unwrap().ino();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.write_all(&after).unwrap();
        drop(f);
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), ino);
        let read = reads(&s);
        s.prune(2).unwrap();
        assert!(path.exists(), "removed on a head that no longer holds");
        assert!(reads(&s) > read, "not read again");
        // a new operation: only its file is read, "a" is looked at and kept
        past_racy_window();
        s.operation_heads().unwrap();
        let read = reads(&s);
        s.save_operation(&op("d", pb::Phase::Succeeded, 4)).unwrap();
        s.prune(3).unwrap();
        assert_eq!(reads(&s), read + 1, "kept heads read again");
        assert!(path.exists());
        // the agent settles "a" (a new file renamed over it): pruned at once
        s.save_operation(&op("a", pb::Phase::Succeeded, 1)).unwrap();
        s.prune(3).unwrap();
        assert!(!path.exists());
        let ids = head_ids(&s);
        assert_eq!(ids, ["d", "c", "b"]);
        // and past `keep`, the oldest ended operation goes
        s.save_operation(&op("e", pb::Phase::Succeeded, 5)).unwrap();
        s.prune(3).unwrap();
        let ids = head_ids(&s);
        assert_eq!(ids, ["e", "d", "c"]);
    }

    /// An operation file is written as one line of JSON, and one of an earlier release
    /// (pretty-printed) reads as before: by id, in the history, as a head, and pruned.
    #[test]
    fn compact_files_are_written_and_pretty_ones_still_read() {
        let (_d, s) = open();
        let new = op("new", pb::Phase::Succeeded, 20);
        s.save_operation(&new).unwrap();
        let written = std::fs::read(s.path().join("operations/new.json")).unwrap();
        assert!(
            !written.contains(&b'\n'),
            "{}",
            String::from_utf8_lossy(&written)
        );
        let old = op("old", pb::Phase::Failed, 10);
        let pretty = serde_json::to_vec_pretty(&old).unwrap();
        assert!(pretty.contains(&b'\n'));
        std::fs::write(s.path().join("operations/old.json"), &pretty).unwrap();
        assert_eq!(s.get_operation("old").unwrap(), Some(old.clone()));
        assert_eq!(s.get_operation("new").unwrap(), Some(new.clone()));
        assert_eq!(s.list_operations().unwrap(), [new, old]);
        let heads = s.operation_heads().unwrap();
        assert_eq!(
            heads
                .iter()
                .map(|h| (h.id.as_str(), h.phase))
                .collect::<Vec<_>>(),
            [
                ("new", pb::Phase::Succeeded as i32),
                ("old", pb::Phase::Failed as i32)
            ]
        );
        s.prune(1).unwrap();
        assert!(!s.path().join("operations/old.json").exists());
    }

    /// A head read within the racy window is not kept; a file that is gone leaves the
    /// cache.
    #[test]
    fn only_settled_files_heads_are_kept_and_only_while_listed() {
        let (_d, s) = open();
        s.save_operation(&op("a", pb::Phase::Succeeded, 1)).unwrap();
        // changed "later than now" (a clock set back): read, never kept
        let path = s.path().join("operations/a.json");
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(SystemTime::now() + Duration::from_secs(3600))
            .unwrap();
        assert_eq!(s.operation_heads().unwrap().len(), 1);
        assert_eq!(cached(&s, "a.json"), None);
        s.save_operation(&op("a", pb::Phase::Succeeded, 1)).unwrap();
        past_racy_window();
        assert_eq!(s.operation_heads().unwrap().len(), 1);
        assert!(cached(&s, "a.json").is_some());
        std::fs::remove_file(&path).unwrap();
        assert!(s.operation_heads().unwrap().is_empty());
        assert_eq!(cached(&s, "a.json"), None);
        // an unparsable file is never kept, and still skipped
        std::fs::write(&path, b"{").unwrap();
        past_racy_window();
        assert!(s.operation_heads().unwrap().is_empty());
        assert_eq!(cached(&s, "a.json"), None);
    }
}
