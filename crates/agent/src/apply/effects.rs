//! The engine's side of the sections' effects ([`crate::sections::kit::effect`]): the
//! node they act on, and the operation they report into (its message, journal progress,
//! actions and undo list). Which effects run at which stage is the engine's
//! ([`super::engine`]); what they do is their section's.

use super::Agent;
use super::engine::Run;
use super::rollback::{Fail, Undo};
use crate::sections::kit::effect::{Effect, EffectError, Node, Report, Stage, UndoEntry};

/// Follows an effect into the running operation: message, journal, actions, undo list.
struct Follow<'a, 'r> {
    agent: &'a Agent,
    run: &'a mut Run<'r>,
}

impl Report for Follow<'_, '_> {
    fn step(&mut self, message: &str) {
        let same = self.run.op.state().stay();
        let _ = self.agent.publish(self.run.op, same, message);
    }

    /// An effect's marker is a step the journal can not undo: written durably, so that a
    /// power cut can not bring back an earlier marker (`journal_progress_durable`). When
    /// it can not be written the step must not begin (the effect fails): recovery would
    /// otherwise take a crash in it for one before it. Failpoint `effect-marker-enospc`
    /// makes the write fail as a full state directory would.
    fn progress(&mut self, marker: &crate::sections::kit::marker::Marker) -> Result<(), String> {
        let written = if inplace_node::failpoint::triggered("effect-marker-enospc") {
            Err(std::io::Error::from_raw_os_error(libc::ENOSPC).to_string())
        } else {
            self.agent
                .state
                .journal_progress_durable(self.run.op.id(), &marker.text())
                .map_err(|e| e.to_string())
        };
        written.map_err(|e| {
            format!(
                "the journal could not record the step \"{}\" ({e}); it was not begun",
                marker.text()
            )
        })?;
        self.run.marked = true;
        Ok(())
    }

    fn action(&mut self, text: String) {
        self.run.op.push_action(text);
    }

    fn undo(&mut self, undo: UndoEntry) {
        self.run.undo.push(match undo {
            UndoEntry::Step(u) => Undo::Effect(u),
            UndoEntry::Rerun(argv) => Undo::Rerun(argv),
            UndoEntry::Unit(t) => Undo::Unit(t),
        });
    }
}

/// The failed transition an effect's error makes; after a failed gate, the rollback
/// asks the gate again ([`Effect::recheck`]).
pub(super) fn fail_of(e: EffectError, effect: &std::sync::Arc<dyn Effect>) -> Fail {
    match e {
        EffectError::Failed(c) => Fail::failed(c),
        EffectError::RolledBack(c) => Fail::rolled_back(c),
        EffectError::Unhealthy(c) => Fail::unhealthy(c, effect.clone()),
    }
}

impl Agent {
    /// Calls `f` with the node the effects act on.
    pub(super) fn with_node<R>(&self, f: impl FnOnce(&Node<'_>) -> R) -> R {
        let node = Node {
            root: &self.root,
            services: &*self.services,
            runner: &*self.runner,
            config: &self.config,
            state_dir: self.state.path(),
            default_healthz: self.default_healthz.as_deref(),
        };
        f(&node)
    }

    /// Runs the plan's effects of `stage`, in order; the first failure stops them.
    pub(super) fn run_effects(&self, run: &mut Run<'_>, stage: &Stage) -> Result<(), Fail> {
        let plan = run.plan;
        for e in plan.steps.at(stage) {
            let mut follow = Follow { agent: self, run };
            self.with_node(|node| e.apply(node, &mut follow))
                .map_err(|err| fail_of(err, e))?;
        }
        Ok(())
    }
}
