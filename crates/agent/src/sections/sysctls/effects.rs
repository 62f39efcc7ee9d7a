//! The `sysctls` section's effect: a kernel parameter written live under `/proc/sys`
//! after the files (the sysctl.d drop-in is written first), read back, undone by writing
//! the value before; the journal keeps the value before ([`EffectEntry::Sysctl`]).

use crate::sections::kit::effect::{Effect, EffectError, Node, Report, Stage, Undo, UndoEntry};
use crate::state::EffectEntry;
use inplace_formats::sysctl::{normalize, sysctl_path};
use inplace_node::sysroot::Sysroot;

/// Writes `value` to the live kernel parameter `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SetSysctl {
    /// The key (`vm.swappiness`).
    pub key: String,
    /// The value, in the form the kernel shows.
    pub value: String,
}

/// The live value of `key`, without its newline (empty when it can not be read).
fn live_value(root: &Sysroot, key: &str) -> String {
    root.read_string(&sysctl_path(key))
        .ok()
        .flatten()
        .unwrap_or_default()
        .trim_end_matches('\n')
        .to_string()
}

impl Effect for SetSysctl {
    fn stage(&self) -> Stage {
        Stage::AfterFiles
    }

    fn journal_entry(&self, node: &Node<'_>) -> Option<EffectEntry> {
        Some(EffectEntry::Sysctl {
            key: self.key.clone(),
            prior: live_value(node.root, &self.key),
        })
    }

    /// Writes the value, reports the undo (the value before), then reads it back: a
    /// kernel that shows another form fails the operation, rolled back.
    fn apply(&self, node: &Node<'_>, report: &mut dyn Report) -> Result<(), EffectError> {
        let (k, v) = (&self.key, &self.value);
        let p = sysctl_path(k);
        let old = live_value(node.root, k);
        node.root
            .write_in_place(&p, format!("{v}\n").as_bytes())
            .map_err(|e| EffectError::RolledBack(format!("committing: {e}")))?;
        report.undo(UndoEntry::Step(Box::new(RestoreSysctl {
            key: k.clone(),
            prior: old,
        })));
        let back = node.root.read_string(&p).ok().flatten().unwrap_or_default();
        // The value is not echoed: it may come from a files item's content (a sysctl.d
        // file the spec writes), and content never reaches responses or logs; the
        // spec's own sysctls show their values in coverage.
        if normalize(&back) != normalize(v) {
            return Err(EffectError::RolledBack(format!(
                "sysctl {k}: the kernel does not read back the value written (it reads {:?}); give the value in the form the kernel shows",
                back.trim_end()
            )));
        }
        report.action(format!("set sysctl {k} (live)"));
        Ok(())
    }
}

/// Writes the value before back to a live kernel parameter: the undo of [`SetSysctl`],
/// after a failed run and after a crash (from the journal's [`EffectEntry::Sysctl`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RestoreSysctl {
    /// The key.
    pub key: String,
    /// The value before, without its newline.
    pub prior: String,
}

impl Undo for RestoreSysctl {
    fn describe(&self) -> String {
        format!("set sysctl {} back (live)", self.key)
    }

    fn undo(&self, node: &Node<'_>) -> Result<(), String> {
        let (k, v) = (&self.key, &self.prior);
        node.root
            .write_in_place(&sysctl_path(k), format!("{v}\n").as_bytes())
            .map_err(|e| format!("sysctl {k}: {e}"))
    }
}
