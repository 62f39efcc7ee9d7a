//! The write-ahead journal of an operation: what is written before the first change
//! (the intent), and how the next start settles an operation a crash interrupted.
//!
//! ## The order of writes and fsyncs
//!
//! A crash (power cut, SIGKILL) at any instant leaves every managed file entirely old or
//! entirely new, and the next start settles the operation:
//!
//! 1. `originals/<hash>` for first overwrites, then `journal/<op>/pre/<n>` (the pre-image of
//!    every path the operation writes or removes), then `journal/<op>/intent.json` (paths,
//!    pre-image metadata, directories to be created, prior sysctl values, units): each
//!    written to a temporary file, fsynced, renamed, directory fsynced. Failpoint `stage`.
//! 2. Each file: temporary file, write, fchown, fchmod, fsync, rename, fsync of the
//!    directory (failpoints `write-temp`, `write`); then live sysctls (`sysctl`);
//!    `journal/<op>/progress` = `written`.
//! 3. Commands and unit actions; `progress` = `acted` (failpoint `act`); the kubelet's
//!    health gate; verification by re-planning.
//! 4. The commit point: `journal/<op>/record.json` then the empty `journal/<op>/committed`,
//!    each fsynced (failpoint `record`); then `applied.json` (failpoint `applied`); then the
//!    journal is removed and the final phase persisted (failpoint `reboot-required`).
//!
//! At start ([`Agent::recover_journals`]): a journal with `committed` is rolled forward (its
//! record installed, the operation ends in the phase it recorded); any other is rolled
//! back (pre-images restored, files that were absent removed with the directories created
//! for them, temporary files removed, sysctls restored, units restarted again if
//! `progress` says it had written) and the operation ends `Failed` (`interrupted`);
//! re-applying it with the same id runs it again.
//!
//! The file primitives (temporary file, fsync, rename, directory fsync) are
//! [`crate::node::sysroot`]'s and [`crate::state`]'s; this module decides what goes into
//! the journal and in which order it is read back.

use super::{Agent, AgentError, now};
use crate::pb;
use crate::phase::{INTERRUPTED, Phase};
use crate::plan::{self, observe::FileObs};
use crate::state::{Intent, JournalState};

impl Agent {
    /// The write-ahead intent of `steps`: a pre-image of every path (written to the
    /// journal), the directories writes will create, the prior value of every sysctl.
    pub(super) fn intent(&self, op: &pb::Operation, steps: &plan::Steps) -> Result<Intent, String> {
        use crate::node::sysroot::Parents;
        use crate::state::{IntentEntry, PreImage};
        let mut entries = Vec::new();
        let paths = steps
            .writes
            .iter()
            .map(|w| w.path.as_str())
            .chain(steps.removes.iter().map(|r| r.path.as_str()));
        for (n, path) in paths.enumerate() {
            let pre =
                match plan::observe::observe_file(&self.root, path).map_err(|e| e.to_string())? {
                    FileObs::File { content, entry } => {
                        let file = self
                            .state
                            .journal_pre_image(&op.id, n, &content)
                            .map_err(|e| e.to_string())?;
                        Some(PreImage {
                            file,
                            mode: entry.mode,
                            uid: entry.uid,
                            gid: entry.gid,
                        })
                    }
                    _ => None,
                };
            let mut missing_dirs = Vec::new();
            if let Ok(Parents::Missing(first)) = self.root.parents(path) {
                let mut d = String::new();
                for c in crate::node::sysroot::components(path).map_err(|e| e.to_string())? {
                    d.push('/');
                    d.push_str(c);
                    if d.len() >= first.len() && d.as_str() != path {
                        missing_dirs.push(d.clone());
                    }
                }
            }
            entries.push(IntentEntry {
                path: path.to_string(),
                pre,
                missing_dirs,
            });
        }
        let mut sysctls = Vec::new();
        for (k, _) in &steps.sysctls {
            let prior = self
                .root
                .read_string(&plan::observe::sysctl_path(k))
                .ok()
                .flatten()
                .unwrap_or_default()
                .trim_end_matches('\n')
                .to_string();
            sysctls.push((k.clone(), prior));
        }
        let units = steps
            .restarts
            .iter()
            .chain(steps.try_restarts.iter())
            .chain(steps.reloads.iter())
            .cloned()
            .collect();
        Ok(Intent {
            operation: op.id.clone(),
            entries,
            sysctls,
            units,
        })
    }

    /// Settles the journal of every operation a crash interrupted: a committed one is
    /// rolled forward (its record installed), any other rolled back from its pre-images
    /// (temporary files removed, created directories removed, sysctls restored, units
    /// restarted again if it had acted).
    pub(super) fn recover_journals(&self) -> Result<(), AgentError> {
        for (id, j) in self.state.journals()? {
            let mut op = self.state.get_operation(&id)?;
            if let Some((record, phase)) = &j.committed {
                self.roll_forward(op.as_mut(), &j, record, *phase)?;
            } else {
                let (restored, problems) = match &j.intent {
                    Some(intent) => self.roll_back(&id, &j, intent)?,
                    None => (0, Vec::new()),
                };
                if let Some(op) = op.as_mut() {
                    op.phase = Phase::Failed as i32;
                    op.message = format!(
                        "{INTERRUPTED} the agent stopped (last step: {}); rolled back from the write-ahead journal, {restored} file(s) restored{}; re-apply with the same operation id to converge",
                        j.progress,
                        if problems.is_empty() {
                            String::new()
                        } else {
                            format!(", problems: {}", problems.join("; "))
                        }
                    );
                    op.updated = Some(now());
                    self.state.save_operation(op)?;
                }
                tracing::warn!(operation = %id, restored, "rolled back an interrupted operation");
            }
            self.state.journal_remove(&id)?;
        }
        Ok(())
    }

    /// Past the commit point: the record (and the spec) the journal holds are installed
    /// and the operation ends in the phase it recorded.
    fn roll_forward(
        &self,
        op: Option<&mut pb::Operation>,
        j: &JournalState,
        record: &crate::state::AppliedRecord,
        phase: i32,
    ) -> Result<(), AgentError> {
        self.state.save_record(record)?;
        if let Some(spec) = &j.spec {
            self.state.save_applied_spec(spec)?;
        }
        if let Some(op) = op {
            op.phase = phase;
            op.message = if phase == Phase::RebootRequired as i32 {
                "changes committed (completed after an agent restart); they take effect after a reboot: drain the node, then call Reboot".into()
            } else {
                "changes committed; completed after an agent restart".into()
            };
            op.updated = Some(now());
            self.state.save_operation(op)?;
        }
        Ok(())
    }

    /// Before the commit point: every path of the intent back to its pre-image (in
    /// reverse order), the directories created for them removed, the sysctls restored,
    /// the units restarted again if the operation had written. Returns the count of
    /// paths restored and the problems met.
    fn roll_back(
        &self,
        id: &str,
        j: &JournalState,
        intent: &Intent,
    ) -> Result<(usize, Vec<String>), AgentError> {
        let mut restored = 0;
        let mut problems = Vec::new();
        for e in intent.entries.iter().rev() {
            let _ = self.root.remove_stale_temps(&e.path);
            let r = match &e.pre {
                Some(pre) => match self.state.journal_read_pre(id, &pre.file)? {
                    Some(bytes) => self
                        .root
                        .write_atomic(&e.path, &bytes, pre.mode, pre.uid, pre.gid)
                        .map(|_| ()),
                    None => {
                        problems.push(format!("{}: pre-image missing", e.path));
                        Ok(())
                    }
                },
                None => self.root.remove(&e.path).map(|_| ()),
            };
            match r {
                Ok(()) => restored += 1,
                Err(err) => problems.push(format!("{}: {err}", e.path)),
            }
            for d in e.missing_dirs.iter().rev() {
                let _ = self.root.remove_dir_if_empty(d);
            }
        }
        for (k, v) in &intent.sysctls {
            let _ = self
                .root
                .write_in_place(&plan::observe::sysctl_path(k), format!("{v}\n").as_bytes());
        }
        if j.progress == "written" || j.progress == "acted" {
            let _ = self.restart_units(&intent.units);
        }
        Ok((restored, problems))
    }
}
