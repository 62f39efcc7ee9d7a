//! The engine's side of a Kubernetes version upgrade ([`crate::kubernetes::upgrade`]):
//! run at the start of `Committing`, before any other section's write, so that the other
//! sections apply to the upgraded node in the same operation. Each step is journaled
//! (`progress` = `kubernetes: <step>`), shown as the operation's message and listed in
//! its actions; each completed step's undo joins the operation's undo list.

use super::Agent;
use super::engine::Run;
use super::rollback::{Fail, Undo};
use crate::kubernetes::upgrade;
use crate::kubernetes::upgrade::{Host, Progress, Restore};

/// Follows the steps into the operation: message, journal, actions.
struct Follow<'a, 'r> {
    agent: &'a Agent,
    run: &'a mut Run<'r>,
}

impl Progress for Follow<'_, '_> {
    fn step(&mut self, message: &str) {
        let same = self.run.op.state().stay();
        let _ = self.agent.publish(self.run.op, same, message);
        let _ = self
            .agent
            .state
            .journal_progress(self.run.op.id(), &format!("kubernetes: {message}"));
    }

    fn done(&mut self, action: String) {
        self.run.op.push_action(action);
    }
}

impl Agent {
    /// Fetches and verifies the target's binaries (a failure changes nothing), then runs
    /// the upgrade's steps; a failure is `RolledBack` with the failing step (the engine
    /// undoes every step, restarting the kubelet last).
    pub(super) fn upgrade_kubernetes(&self, run: &mut Run<'_>) -> Result<(), Fail> {
        let Some(up) = run.plan.steps.kubernetes.clone() else {
            return Ok(());
        };
        let config = &self.config.kubernetes;
        let fetched = upgrade::fetch(&up, config, self.state.path())
            .map_err(|e| Fail::failed(format!("fetching Kubernetes {}: {e}", up.to)))?;
        let health = || self.kubelet_health();
        let host = Host {
            root: &self.root,
            services: &*self.services,
            runner: &*self.runner,
            config,
            kubelet_unit: &self.config.kubelet.unit,
            health: &health,
        };
        let mut restores: Vec<Restore> = Vec::new();
        let result = {
            let mut follow = Follow { agent: self, run };
            upgrade::run(&up, &fetched, &host, &mut follow, &mut restores)
        };
        run.undo.extend(restores.into_iter().map(Undo::Kubernetes));
        result
            .map_err(|e| Fail::rolled_back(format!("Kubernetes {} → {}: {e}", up.from, up.to)))?;
        let _ = self
            .state
            .journal_progress(run.op.id(), "kubernetes: upgraded");
        Ok(())
    }
}
