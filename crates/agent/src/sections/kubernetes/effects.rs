//! The `kubernetes` section's effect: the version upgrade, run before every other
//! section's step so that they apply to the upgraded node in the same operation. The
//! steps and their undo are [`crate::kubernetes::upgrade`]'s; each step is journaled
//! (`progress` = `kubernetes: <step>`), shown as the operation's message and listed in
//! its actions, and each completed step's undo joins the operation's undo list.

use crate::kubernetes::upgrade;
use crate::kubernetes::upgrade::{Host, Progress, Restore, Upgrade};
use crate::sections::kit::effect::{Effect, EffectError, Node, Report, Stage, Undo, UndoEntry};
use crate::sections::kit::marker::Marker;

/// Upgrades the node's Kubernetes version ([`Upgrade`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UpgradeKubernetes(pub Upgrade);

/// Follows the upgrade's steps into the operation: message, journal, actions.
struct Follow<'a>(&'a mut dyn Report);

impl Progress for Follow<'_> {
    fn step(&mut self, message: &str) -> Result<(), String> {
        self.0.progress(&Marker::Kubernetes(message.to_string()))?;
        self.0.step(message);
        // a crash once a step began (the journal's marker says which)
        inplace_node::failpoint::hit("kubernetes-step");
        Ok(())
    }

    fn done(&mut self, action: String) {
        self.0.action(action);
    }
}

impl Effect for UpgradeKubernetes {
    fn stage(&self) -> Stage {
        Stage::BeforeFiles
    }

    /// Fetches and verifies the target's binaries (a failure changes nothing), then runs
    /// the upgrade's steps; a failure is rolled back with the failing step (every step
    /// undone, the kubelet restarted last).
    fn apply(&self, node: &Node<'_>, report: &mut dyn Report) -> Result<(), EffectError> {
        let up = &self.0;
        let config = &node.config.kubernetes;
        let fetched = upgrade::fetch(up, config, node.state_dir)
            .map_err(|e| EffectError::Failed(format!("fetching Kubernetes {}: {e}", up.to)))?;
        let health = || node.kubelet_health();
        let host = Host {
            root: node.root,
            services: node.services,
            runner: node.runner,
            config,
            kubelet_unit: &node.config.kubelet.unit,
            health: &health,
        };
        let mut restores: Vec<Restore> = Vec::new();
        let result = upgrade::run(up, &fetched, &host, &mut Follow(report), &mut restores);
        for r in restores {
            report.undo(UndoEntry::Step(Box::new(UpgradeStep(r))));
        }
        result.map_err(|e| {
            EffectError::RolledBack(format!("Kubernetes {} → {}: {e}", up.from, up.to))
        })?;
        // the last step's marker (`restarting kubelet`) is durable already: a crash now
        // is recovered as an upgrade begun either way, so this one failing changes nothing
        let _ = report.progress(&Marker::Kubernetes("upgraded".into()));
        Ok(())
    }
}

/// One completed step of the upgrade, undone ([`Restore::undo`]).
#[derive(Debug)]
struct UpgradeStep(Restore);

impl Undo for UpgradeStep {
    fn describe(&self) -> String {
        self.0.describe()
    }

    fn undo(&self, node: &Node<'_>) -> Result<(), String> {
        self.0.undo(node.root, node.services, node.runner)
    }
}
