//! What the agent may claim as the node's own after a journal or the applied record was
//! quarantined (the record's rule: [`StateDir::check_record_claims`]).
//!
//! A quarantined journal (`quarantine/<op>-<time>/`, see `crate::apply::journal`) is one
//! recovery could not verify: nothing was restored from it, so each file it names may
//! hold what the interrupted operation wrote, what the node had, or neither. The next
//! apply records, for every file it takes over, what was there before it (the original:
//! `Original::Absent`, `Unchanged`, or `Saved` with a backup), and for every setting it
//! edits in a file (a kubelet field, a kernel argument source) the prior value read from
//! that file. Taking the interrupted operation's leftovers as that "before" is a lie the
//! agent would act on later: dropping the item from the spec would keep a file the node
//! never had, or "restore" the operation's content instead of the node's.
//!
//! What comparable tools do: the Machine Config Operator's daemon, finding on-disk state
//! it did not expect (a file that is neither the old nor the new rendered config), does
//! not adopt it: the node goes `Degraded` naming the file, and an administrator fixes the
//! file (or forces a re-validation) before anything more is applied. bootc/ostree never
//! adopt at all: `/etc` is a three-way merge whose base is the deployment's pristine
//! `/usr/etc`, so what the node "had" is never inferred from what is on disk after a
//! failure. Neither guesses. The agent does the same for the paths it cannot vouch for:
//!
//! - a path the quarantined intent names is claimed (taken over as a new managed file,
//!   or written, which reads its prior values) only while it still is what the intent
//!   recorded before the operation (its pre-image's hash, or absent): then it is the
//!   node's own for certain;
//! - otherwise the apply is refused in Staging, before anything is written, naming the
//!   path, what the intent recorded and what is there now, the quarantined journal, and
//!   the fix: put back what the node should have (or remove what it should not), then
//!   remove the quarantined journal, whose removal is the administrator's word that the
//!   files are the node's own;
//! - a quarantined journal whose intent does not parse names no path: every file the
//!   apply would newly take over with content (`Unchanged`, `Saved`) is refused the same
//!   way, since any of them may be the operation's. Paths the applied record managed
//!   before the quarantine keep their recorded originals and are not affected.

use std::collections::{BTreeMap, BTreeSet};

use super::{AppliedRecord, Intent, Original, StateDir, StateError};
use inplace_wire::ids::ChangeId;
use inplace_wire::pb;

/// A quarantined journal as the claims check reads it.
#[derive(Debug)]
struct Quarantined {
    /// Its directory.
    dir: String,
    /// The file its intent was read from (or would have been).
    intent_file: String,
    /// Path → fingerprint before the operation (`absent` or `sha256:<hex>`); None when
    /// the intent does not parse.
    before: Option<BTreeMap<String, String>>,
}

/// The fingerprint a newly managed file's original claims the node had.
fn claimed(m: &super::ManagedFile) -> String {
    match &m.original {
        Original::Absent => "absent".into(),
        Original::Unchanged => m.sha256.clone(),
        Original::Saved { sha256, .. } => sha256.clone(),
    }
}

impl StateDir {
    /// The quarantined journals and what their intents recorded, read without trusting
    /// their checksums (the intent's pre-image hashes are only compared with the node,
    /// never restored from).
    fn quarantined_intents(&self) -> Vec<Quarantined> {
        let mut out = Vec::new();
        for (dir, _) in self.quarantined() {
            let d = std::path::Path::new(&dir);
            let names: Vec<String> = std::fs::read_dir(d)
                .into_iter()
                .flatten()
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            // format 2: <op>.intent; format 1: intent.json
            let intent_name = names
                .iter()
                .find(|n| n.ends_with(".intent") || *n == "intent.json")
                .cloned();
            let intent_file = d
                .join(intent_name.as_deref().unwrap_or("<no intent>"))
                .display()
                .to_string();
            let before = intent_name.and_then(|n| {
                let b = std::fs::read(d.join(n)).ok()?;
                let start = b.iter().position(|c| *c == b'{')?;
                let intent: Intent = serde_json::from_slice(&b[start..]).ok()?;
                Some(
                    intent
                        .entries
                        .into_iter()
                        .map(|e| {
                            let fp = e.pre.map(|p| p.sha256).unwrap_or_else(|| "absent".into());
                            (e.path, fp)
                        })
                        .collect(),
                )
            });
            out.push(Quarantined {
                dir,
                intent_file,
                before,
            });
        }
        out
    }

    /// Refuses an apply that would claim as the node's own a file a quarantined journal
    /// leaves in doubt (see the module docs). `touched`: each path the apply writes or
    /// removes, with its fingerprint now (`absent` or `sha256:<hex>`); `next`: the
    /// applied record the apply commits. Nothing is read when no journal is quarantined.
    pub fn check_claims<'a>(
        &self,
        touched: impl Iterator<Item = (&'a str, &'a str)>,
        next: &AppliedRecord,
    ) -> Result<(), StateError> {
        let quarantined = self.quarantined_intents();
        if quarantined.is_empty() {
            return Ok(());
        }
        let installed = self.load_record()?;
        // path → fingerprint the apply takes as the node's: new managed files' originals
        // first, then what it writes over (whose prior values it reads)
        let mut claims: BTreeMap<&str, String> = next
            .files
            .iter()
            .filter(|(p, _)| !installed.files.contains_key(*p))
            .map(|(p, m)| (p.as_str(), claimed(m)))
            .collect();
        for (p, now) in touched {
            if !installed.files.contains_key(p) {
                claims.entry(p).or_insert_with(|| now.to_string());
            }
        }
        let mut refused = Vec::new();
        for q in &quarantined {
            for (path, now) in &claims {
                let why = match &q.before {
                    Some(before) => match before.get(*path) {
                        Some(pre) if pre != now => format!(
                            "{path}: the interrupted operation's journal, quarantined in {}, names it (before the operation: {pre}; now: {now}), so inplaced cannot tell whether it is the node's own or what that operation left",
                            q.dir
                        ),
                        _ => continue,
                    },
                    None if next.files.contains_key(*path) && now != "absent" => format!(
                        "{path}: a journal quarantined in {} does not say which files its operation wrote ({} does not parse), so inplaced cannot tell whether {path} ({now}) is the node's own",
                        q.dir, q.intent_file
                    ),
                    None => continue,
                };
                refused.push(format!(
                    "{why}; it would be recorded as what the node had before inplaced managed it; check {path} (put back what the node should have, or remove it if the node should not have it), then remove {} and apply again",
                    q.dir
                ));
            }
        }
        if refused.is_empty() {
            Ok(())
        } else {
            Err(StateError::Unvouched(refused.join("; ")))
        }
    }
}

/// At most this many items are named in a refusal of [`StateDir::check_record_claims`];
/// the rest are counted.
const NAMED_ITEMS: usize = 20;

/// The name a quarantined applied record is moved to, before its unix seconds.
pub(super) const CORRUPT_PREFIX: &str = "applied.json.corrupt-";
/// The name of the marker of a lost applied record, before its unix seconds.
pub(super) const MISSING_PREFIX: &str = "applied.json.missing-";

/// How the applied record behind `record` (a path [`StateDir::quarantined_records`]
/// gives) came to be in doubt, worded for messages: "marked lost" for an
/// `applied.json.missing-<time>` marker (the record was gone or emptied), "quarantined"
/// for an `applied.json.corrupt-<time>` record (it did not parse).
pub(crate) fn record_loss(record: &str) -> &'static str {
    let name = record.rsplit('/').next().unwrap_or(record);
    if name.starts_with(MISSING_PREFIX) {
        "marked lost"
    } else {
        "quarantined"
    }
}

/// What a lost applied record leaves in doubt ([`StateDir::record_doubt`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RecordDoubt {
    /// The change ids of the items in doubt (`files[/etc/x]`, `sysctls[vm.swappiness]`),
    /// sorted: the last applied spec's, or the apply's own when that spec is not known.
    pub ids: Vec<String>,
    /// The quarantined record or marker, full path.
    pub record: String,
    /// The whole refusal: the record, what says which items were managed, the items
    /// (at most [`NAMED_ITEMS`], with their saved originals) and the fix.
    pub message: String,
}

impl StateDir {
    /// The applied records moved aside as `applied.json.corrupt-<unix seconds>`, and
    /// the markers of a record found lost, `applied.json.missing-<unix seconds>`
    /// ([`StateDir::load_record_or_quarantine`]), full paths, sorted. Listed through the
    /// state directory's sysroot, so a kept coverage answer depends on them.
    pub fn quarantined_records(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .dir
            .list_dir("/")
            .ok()
            .flatten()
            .unwrap_or_default()
            .into_iter()
            .filter(|n| n.starts_with(CORRUPT_PREFIX) || n.starts_with(MISSING_PREFIX))
            .map(|n| self.full(&format!("/{n}")))
            .collect();
        out.sort();
        out
    }

    /// Refuses every apply while an applied record is quarantined and something says
    /// inplaced managed items before ([`StateDir::record_doubt`]): the refusal's message.
    pub fn check_record_claims(
        &self,
        desired: &BTreeSet<String>,
        ids_of: impl FnOnce(&pb::NodeSpec) -> Result<BTreeSet<String>, String>,
    ) -> Result<(), StateError> {
        match self.record_doubt(desired, ids_of) {
            Some(d) => Err(StateError::Unvouched(d.message)),
            None => Ok(()),
        }
    }

    /// What a quarantined (or lost) applied record leaves in doubt, None when no record
    /// is quarantined or nothing says inplaced managed anything (the module docs' rule,
    /// for a lost record rather than a lost journal). The record was the only account of
    /// what each managed item was before inplaced changed it (a file's saved original or
    /// its absence, a sysctl's or kubelet field's prior value, which kernel arguments it
    /// added): an apply that keeps such an item would record the node's value now,
    /// possibly inplaced's own, as that "before", and one that drops it has nothing to put
    /// back (and would report the node as asked). So every apply is refused while it is
    /// in doubt. What says inplaced managed items: the spec applied last (`ids_of` gives
    /// its item ids); when that spec is gone or does not read, nothing says which, and
    /// the apply's own items (`desired`) and every saved original are in doubt, and the
    /// apply is refused whatever it holds. The administrator's word that the node's
    /// values are its own is removing the quarantined record or marker.
    pub fn record_doubt(
        &self,
        desired: &BTreeSet<String>,
        ids_of: impl FnOnce(&pb::NodeSpec) -> Result<BTreeSet<String>, String>,
    ) -> Option<RecordDoubt> {
        let record = self.quarantined_records().pop()?;
        let spec_file = self.full("/applied-spec.pb");
        let applied = match self.load_applied_spec() {
            Ok(Some(s)) => ids_of(&s).map_err(|e| format!("{spec_file} does not validate: {e}")),
            Ok(None) => Err(format!("{spec_file} is missing")),
            Err(e) => Err(e.to_string()),
        };
        let ids: Vec<String> = match &applied {
            Ok(ids) => ids.iter().cloned().collect(),
            Err(_) => desired.iter().cloned().collect(),
        };
        let mut named = ids.clone();
        let originals = self.full("/originals");
        let mut saved: BTreeSet<String> = self
            .dir
            .list_dir("/originals")
            .ok()
            .flatten()
            .unwrap_or_default()
            .into_iter()
            .collect();
        for d in named.iter_mut() {
            let Ok(ChangeId::File(path)) = ChangeId::parse(d) else {
                continue;
            };
            let name = super::backup_name(&path);
            if saved.remove(&name) {
                d.push_str(&format!(" (its original is saved as {originals}/{name})"));
            } else {
                d.push_str(" (no original saved: the file was absent before inplaced first wrote it, as far as originals/ tells)");
            }
        }
        if !saved.is_empty() {
            named.push(format!(
                "{} more original(s) saved in {originals}",
                saved.len()
            ));
        }
        let source = match &applied {
            Ok(_) if named.is_empty() => return None,
            Ok(_) => format!(
                "what inplaced managed (the spec applied last, {spec_file}, and saved originals)"
            ),
            Err(e) => {
                named.push("whatever the spec applied last named".into());
                format!("which items inplaced managed can not be told ({e}); in doubt are")
            }
        };
        let more = named.len().saturating_sub(NAMED_ITEMS);
        named.truncate(NAMED_ITEMS);
        let mut list = named.join(", ");
        if more > 0 {
            list.push_str(&format!(" and {more} more"));
        }
        let how = record_loss(&record);
        let message = format!(
            "the applied record was {how} ({record}): it was the only account of what each item inplaced managed was like before inplaced changed it, so no apply runs until that is settled; {source}: {list}; check each (put back what the node should have: a saved original holds a file's content before inplaced first wrote it, named by the SHA-256 of the file's path), then remove {record} and apply again: inplaced then takes what the node has as its own"
        );
        Some(RecordDoubt {
            ids,
            record,
            message,
        })
    }
}
