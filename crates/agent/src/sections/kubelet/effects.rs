//! The `kubelet` section's effects: the reset of the CPU and memory managers'
//! checkpoints, in place of the kubelet's restart (stop, remove, start: the kubelet
//! refuses a checkpoint whose policy changed), and the health gate after its restart.

use std::collections::BTreeSet;

use crate::sections::kit::effect::{
    Effect, EffectError, Node, Report, RestoreFile, Stage, UndoEntry, UnitAction, UnitTouched,
};
use crate::sections::kit::observe::{FileObs, observe_file};

/// Restarts the kubelet's `unit` as stop, remove the checkpoint `files`, start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResetCheckpoints {
    /// The kubelet's unit (`[kubelet] unit`).
    pub unit: String,
    /// The checkpoint files (node paths) to remove while it is stopped.
    pub files: BTreeSet<String>,
}

impl Effect for ResetCheckpoints {
    fn stage(&self) -> Stage {
        Stage::Restart(self.unit.clone())
    }

    /// The checkpoints: a crash after their removal puts them back from the journal.
    fn journaled_removals(&self) -> Vec<String> {
        self.files.iter().cloned().collect()
    }

    /// Each step is undone on rollback: the unit's state before is kept
    /// ([`UndoEntry::Unit`]: started again once the files are back) and each checkpoint
    /// removed is kept in memory and written back ([`RestoreFile`]), so that a start that
    /// fails leaves nothing the rollback can not put back.
    fn apply(&self, node: &Node<'_>, report: &mut dyn Report) -> Result<(), EffectError> {
        let u = &self.unit;
        let err = |e: String| EffectError::RolledBack(e);
        report.undo(UndoEntry::Unit(UnitTouched::probe(
            node.services,
            u,
            UnitAction::Restart,
        )));
        node.services.stop(u).map_err(|e| err(e.to_string()))?;
        report.action(format!("stopped {u}"));
        for f in &self.files {
            let before = match observe_file(node.root, f).map_err(|e| err(e.to_string()))? {
                FileObs::File { content, entry } => Some((content, entry)),
                _ => None,
            };
            if node.root.remove(f).map_err(|e| err(e.to_string()))? {
                report.undo(UndoEntry::Step(Box::new(RestoreFile {
                    path: f.clone(),
                    before,
                })));
                report.action(format!("removed {f}"));
            }
        }
        node.services.start(u).map_err(|e| err(e.to_string()))?;
        report.action(format!("started {u}"));
        Ok(())
    }
}

/// After the kubelet's restart: it must be healthy ([`Node::kubelet_health`]), else the
/// operation is rolled back, the units restarted with the restored files and the kubelet
/// checked again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HealthGate;

impl Effect for HealthGate {
    fn stage(&self) -> Stage {
        Stage::Gate
    }

    fn apply(&self, node: &Node<'_>, report: &mut dyn Report) -> Result<(), EffectError> {
        node.kubelet_health().map_err(|cause| {
            EffectError::Unhealthy(format!("kubelet health check failed: {cause}"))
        })?;
        report.action("kubelet healthy".into());
        Ok(())
    }

    fn announce(&self) -> Option<&'static str> {
        Some("waiting for the kubelet to be healthy")
    }

    fn recheck(&self, node: &Node<'_>) -> Option<String> {
        Some(match node.kubelet_health() {
            Ok(()) => "the kubelet is healthy again".to_string(),
            Err(e) => format!("the kubelet is still unhealthy: {e}"),
        })
    }
}
