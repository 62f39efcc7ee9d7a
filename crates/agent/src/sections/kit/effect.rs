//! Effects: what a section does to the live node beyond whole files and unit actions (a
//! live sysctl write, the kubelet's checkpoint reset, a Kubernetes upgrade, a boot
//! configuration command), with its undo and its entry in the write-ahead journal.
//!
//! A section plans its effects into [`Steps::effects`](super::steps::Steps::effects); the
//! operation engine (`crate::apply`) runs each at its [`Stage`] through [`Effect::apply`],
//! keeps the [`UndoEntry`]s it reports for the one rollback of a failed run, and writes
//! each [`Effect::journal_entry`] into the intent before the first change, so that a crash
//! is undone the same way ([`crate::sections::journaled_undo`]). The engine knows the
//! stages, never what an effect does.

use std::any::Any;
use std::fmt::Debug;
use std::path::Path;

use crate::config::Config;
use crate::state::EffectEntry;
use inplace_node::sysroot::Sysroot;
use inplace_node::system::{CommandRunner, ServiceManager};

/// When in an operation the engine runs an effect. Within a stage, effects run in the
/// order they were planned (the order of [`crate::sections::SECTIONS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stage {
    /// Committing, before any file is written: the other sections apply over its result
    /// (a Kubernetes version upgrade).
    BeforeFiles,
    /// Committing, after every file write and removal (a live value whose boot-time
    /// source was just written).
    AfterFiles,
    /// Acting, before the unit actions, also when a reboot is pending (a boot
    /// configuration command).
    BeforeUnits,
    /// Acting, in place of the restart of this unit (stop, change, start), when no
    /// reboot is pending.
    Restart(String),
    /// Verifying, before the re-plan, when no reboot is pending (a health gate after a
    /// restart). A failure is [`EffectError::Unhealthy`].
    Gate,
}

/// What an effect acts on: the node's root and the system seams.
pub struct Node<'a> {
    /// The node's root.
    pub root: &'a Sysroot,
    /// systemd.
    pub services: &'a dyn ServiceManager,
    /// Commands.
    pub runner: &'a dyn CommandRunner,
    /// The agent's configuration.
    pub config: &'a Config,
    /// The agent's state directory (a staging area for downloads).
    pub state_dir: &'a Path,
    /// The kubelet's health endpoint when the configuration names none (`[kubelet]
    /// healthz_url`), none outside systemd.
    pub default_healthz: Option<&'a str>,
}

impl Node<'_> {
    /// The kubelet's health, which the `kubelet` section's gate and the `kubernetes`
    /// section's upgrade both check: its unit active (as far as the service manager can
    /// tell) and its health endpoint answering 2xx, within `[kubelet]
    /// health_timeout_secs`. The error says which failed.
    pub fn kubelet_health(&self) -> Result<(), String> {
        let k = &self.config.kubelet;
        let timeout = std::time::Duration::from_secs(k.health_timeout_secs);
        self.services
            .wait_active(&k.unit, timeout)
            .map_err(|e| e.to_string())?;
        match k.healthz_url.as_deref().or(self.default_healthz) {
            Some(u) => inplace_node::system::http_health(u, timeout),
            None => Ok(()),
        }
    }
}

impl Debug for Node<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("root", &self.root).finish()
    }
}

/// Where an effect reports while it runs: the operation's message, its journal progress,
/// its actions and its undo list.
pub trait Report {
    /// A new step began: published as the operation's message, in the same phase.
    fn step(&mut self, message: &str);
    /// The journal's progress marker of a step the journal can not undo, written durably
    /// before the step begins (recovery reads it back with
    /// [`Marker::parse`](super::marker::Marker::parse)). An error (the state directory
    /// full or failing) means the step must not begin: a crash in it would be recovered
    /// as though it never started.
    fn progress(&mut self, marker: &super::marker::Marker) -> Result<(), String>;
    /// A completed action, listed in the operation's actions.
    fn action(&mut self, text: String);
    /// A completed change and how to undo it: reported as soon as it is done, so that a
    /// failure later in the same effect still undoes it.
    fn undo(&mut self, undo: UndoEntry);
}

/// How to undo one completed change of an effect.
#[derive(Debug)]
pub enum UndoEntry {
    /// Undone in reverse order with the operation's other completed steps.
    Step(Box<dyn Undo>),
    /// A command run again once every other step is undone, so that what it generates
    /// (`grub.cfg`) follows the restored inputs; not counted as a step.
    Rerun(Vec<String>),
    /// A unit the step stopped, restarted or reloaded: once every file is back it is put
    /// into the state it had before ([`UnitTouched`]) and verified.
    Unit(UnitTouched),
}

/// How a unit was acted on, and so how the rollback makes it read the restored files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitAction {
    /// `systemctl reload`: reloaded again.
    Reload,
    /// `systemctl try-restart` (only if it was running): try-restarted again.
    TryRestart,
    /// Restarted, or stopped then started: restarted again when it was active before,
    /// stopped when it was not.
    Restart,
}

/// A unit an operation acted on, with its state before (`systemctl is-active`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitTouched {
    /// The unit (`kubelet.service`).
    pub unit: String,
    /// What was done to it.
    pub action: UnitAction,
    /// Active before the operation acted on it: `None` when the service manager can not
    /// tell (the recording stand-in), which the rollback treats as active.
    pub active_before: Option<bool>,
}

impl UnitTouched {
    /// Asks the service manager whether `unit` is active now (no wait), before `action`.
    pub fn probe(services: &dyn ServiceManager, unit: &str, action: UnitAction) -> Self {
        let active_before = match services.wait_active(unit, std::time::Duration::ZERO) {
            Ok(true) => Some(true),
            Ok(false) => None,
            Err(_) => Some(false),
        };
        UnitTouched {
            unit: unit.to_string(),
            action,
            active_before,
        }
    }
}

/// One completed change undone.
pub trait Undo: Debug + Send + Sync {
    /// Puts it back; the error names what could not be (a path, a key, a unit).
    fn undo(&self, node: &Node<'_>) -> Result<(), String>;

    /// What the undo did, for the operation's actions (`restored /var/lib/kubelet/cpu_manager_state`);
    /// never a file's content.
    fn describe(&self) -> String {
        "undid an effect's step".into()
    }

    /// Whether a success wrote a file back and read it back equal ([`RestoreFile`]).
    fn verified_file(&self) -> bool {
        false
    }
}

/// Why an effect failed, and so how the operation ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectError {
    /// Nothing was changed (a download refused before any step): the operation ends
    /// `Failed` when nothing before it changed either.
    Failed(String),
    /// Something may have changed: what was done is undone, the operation ends
    /// `RolledBack`.
    RolledBack(String),
    /// A [`Stage::Gate`] failed: rolled back, then the units restarted and
    /// [`Effect::recheck`] asked again.
    Unhealthy(String),
}

impl EffectError {
    /// The cause, the first part of the operation's message.
    pub fn cause(&self) -> &str {
        match self {
            EffectError::Failed(c) | EffectError::RolledBack(c) | EffectError::Unhealthy(c) => c,
        }
    }
}

/// One effect a section planned. Implemented in the section's `effects.rs`.
pub trait Effect: Debug + Send + Sync + Any {
    /// When the engine runs it.
    fn stage(&self) -> Stage;

    /// What the write-ahead intent keeps to undo it after a crash (None: nothing), read
    /// at Staging, before the first change.
    fn journal_entry(&self, _node: &Node<'_>) -> Option<EffectEntry> {
        None
    }

    /// Node paths it removes (a checkpoint a restart must not find): the journal keeps a
    /// pre-image of each, taken at Staging, and a crash's rollback writes it back over
    /// whatever is there then (the file the service wrote again after the removal
    /// included). Empty: none.
    fn journaled_removals(&self) -> Vec<String> {
        Vec::new()
    }

    /// Applies it: actions, progress and undo entries through `report` as they happen.
    fn apply(&self, node: &Node<'_>, report: &mut dyn Report) -> Result<(), EffectError>;

    /// A [`Stage::Gate`]'s operation message while it waits (`waiting for the kubelet to
    /// be healthy`).
    fn announce(&self) -> Option<&'static str> {
        None
    }

    /// After its gate failed and the rollback restarted the units: the check again, as
    /// the last part of the operation's message (`the kubelet is healthy again`).
    fn recheck(&self, _node: &Node<'_>) -> Option<String> {
        None
    }
}

/// A file an effect removed or rewrote, written back with its content, mode and owner
/// (None: it was absent, removed again) and read back to verify.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RestoreFile {
    /// The node path.
    pub path: String,
    /// Its content and metadata before (None: absent).
    pub before: Option<(Vec<u8>, inplace_node::sysroot::Entry)>,
}

impl Undo for RestoreFile {
    fn verified_file(&self) -> bool {
        self.before.is_some()
    }

    fn describe(&self) -> String {
        match self.before {
            Some(_) => format!("restored {}", self.path),
            None => format!("removed {}", self.path),
        }
    }

    fn undo(&self, node: &Node<'_>) -> Result<(), String> {
        let p = &self.path;
        match &self.before {
            Some((content, e)) => {
                node.root
                    .write_atomic(p, content, e.mode, e.uid, e.gid)
                    .map_err(|e| format!("{p}: {e}"))?;
                match node.root.read(p) {
                    Ok(Some(back)) if back == *content => Ok(()),
                    Ok(_) => Err(format!("{p}: written back, but reading it back differs")),
                    Err(e) => Err(format!(
                        "{p}: written back, but reading it back failed: {e}"
                    )),
                }
            }
            None => node
                .root
                .remove(p)
                .map(|_| ())
                .map_err(|e| format!("{p}: {e}")),
        }
    }
}
