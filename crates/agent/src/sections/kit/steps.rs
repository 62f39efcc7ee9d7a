//! What a plan does to the node, in order of execution: the vocabulary every section
//! writes its steps in and the operation engine executes.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::effect::{Effect, Stage};

use inplace_node::sysroot::Entry;
use inplace_wire::pb;
use inplace_wire::pb::DisruptionLevel;

/// One durable file write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// Node path.
    pub path: String,
    /// Full content.
    pub content: Vec<u8>,
    /// Mode (0o7777 mask).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Keep the existing file's mode and owner (configuration files edited in place);
    /// `mode`, `uid`, `gid` apply only when the file is created.
    pub keep_meta: bool,
    /// What the file must still be at commit time ([`FileObs::fingerprint`](super::observe::FileObs::fingerprint)): a commit
    /// never overwrites a change made after the plan.
    pub expect: String,
    /// Original content to save under `originals/` before the first overwrite.
    pub save_original: Option<Vec<u8>>,
    /// Part of the `files` section (its created directories are recorded).
    pub managed_file: bool,
}

/// One file deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remove {
    /// Node path.
    pub path: String,
    /// Fingerprint the file must still have.
    pub expect: String,
    /// Directories the agent created for it, deepest first, removed when empty.
    pub dirs: Vec<String>,
}

/// Everything an apply does, in order of execution: whole files, unit actions and the
/// reboot (generic), and the sections' own [`Effect`]s, each run at its [`Stage`].
#[derive(Debug, Clone, Default)]
pub struct Steps {
    /// Files written (files section, kubelet files, boot configuration, sysctl drop-in).
    pub writes: Vec<Write>,
    /// Files deleted.
    pub removes: Vec<Remove>,
    /// `systemctl daemon-reload` needed.
    pub daemon_reload: bool,
    /// Units to reload.
    pub reloads: BTreeSet<String>,
    /// Units to restart.
    pub restarts: BTreeSet<String>,
    /// Units to restart only if running (`systemctl try-restart`), after a daemon-reload.
    pub try_restarts: BTreeSet<String>,
    /// A reboot is needed to take effect.
    pub reboot: bool,
    /// The sections' effects, in the order they were planned.
    pub effects: Vec<Arc<dyn Effect>>,
    /// Saved originals no longer needed after the commit.
    pub drop_originals: Vec<String>,
}

/// Mode and owner a [`Write`] gives the file: the existing file's own when `keep_meta`.
pub(crate) fn resolve_keep(w: &Write, existing: Option<Entry>) -> (u32, u32, u32) {
    match existing {
        Some(e) if w.keep_meta => (e.mode, e.uid, e.gid),
        _ => (w.mode, w.uid, w.gid),
    }
}

impl Steps {
    /// Adds an effect.
    pub fn effect(&mut self, e: impl Effect) {
        self.effects.push(Arc::new(e));
    }

    /// The effects run at `stage`, in order.
    pub fn at(&self, stage: &Stage) -> impl Iterator<Item = &Arc<dyn Effect>> {
        self.effects.iter().filter(move |e| e.stage() == *stage)
    }

    /// The effects of type `T` (a section reading its own back, its tests).
    pub fn effects_of<T: Effect>(&self) -> impl Iterator<Item = &T> {
        self.effects
            .iter()
            .filter_map(|e| (e.as_ref() as &dyn std::any::Any).downcast_ref::<T>())
    }

    /// Adds the unit actions a change of disruption `d` needs: reloads, restarts (also
    /// for a drain, which the caller does first), a daemon-reload with try-restarts, or
    /// the reboot.
    pub fn add_disruption(&mut self, d: &pb::Disruption) {
        match DisruptionLevel::try_from(d.level).unwrap_or(DisruptionLevel::None) {
            DisruptionLevel::Reload => self.reloads.extend(d.units.iter().cloned()),
            // a drain is the caller's to do first (CAPI does not drain for in-place
            // updates); the agent then restarts the rule's units
            DisruptionLevel::Restart | DisruptionLevel::Drain => {
                self.restarts.extend(d.units.iter().cloned())
            }
            DisruptionLevel::DaemonReload => {
                self.daemon_reload = true;
                self.try_restarts.extend(d.units.iter().cloned());
            }
            DisruptionLevel::Reboot => self.reboot = true,
            _ => {}
        }
    }
}
