//! What the `kernelArgs` section observes: the boot configuration's backend
//! ([`crate::bootloader::detect`]), the running kernel command line and the boot id.

use crate::bootloader::{KernelArgsBackend, NoBackend};
use crate::sections::kit::observe::{
    NodeView, Observation, ObserveError, Unknown, observe_running,
};
use crate::sections::model::{NodeSpec, Observed};
use crate::state::AppliedRecord;

/// The kernel arguments' side of the node.
#[derive(Debug)]
pub struct KernelArgsObs {
    /// Kernel-args backend, or why there is none.
    pub backend: Result<Box<dyn KernelArgsBackend>, NoBackend>,
    /// Running kernel command line (`/proc/cmdline`, trailing whitespace removed), or why
    /// it is not known.
    pub proc_cmdline: Observation<String>,
    /// Boot id (`/proc/sys/kernel/random/boot_id`), if readable.
    pub boot_id: Option<String>,
}

impl KernelArgsObs {
    /// Nothing observed yet.
    pub fn empty() -> Self {
        KernelArgsObs {
            backend: Err(NoBackend("not observed".into())),
            proc_cmdline: Err(Unknown {
                source: "/proc/cmdline".into(),
                why: "not observed".into(),
            }),
            boot_id: None,
        }
    }
}

/// Whether planning `desired` over `record` reads anything of the kernel arguments'
/// side: arguments desired or managed (a removal pending, a trial staged), or a file
/// item, desired or recorded, at a path that may be a backend's source
/// ([`crate::bootloader::may_be_source`]: the sources are reserved to this section, and
/// a `files` fragment in `/etc/default/grub.d` is checked against the GRUB backend).
/// Otherwise the plan is the same whatever the boot configuration is, and an apply
/// without kernel arguments does not detect it (issue 28: about 9 % of an apply's CPU).
/// The other sections' file items are at paths of their own (the NTP daemon's
/// configuration, drop-ins in the agent's area), none of them a boot configuration.
pub(crate) fn needed(desired: &NodeSpec, record: &AppliedRecord) -> bool {
    !desired.kernel_args.is_empty()
        || !record.kernel_args.is_empty()
        || !record.kernel_args_removed.is_empty()
        || !record.kernel_args_staged_in.is_empty()
        || record.kernel_args_trial.is_some()
        || desired
            .files
            .iter()
            .map(|f| f.path.as_str())
            .chain(record.files.keys().map(String::as_str))
            .any(crate::bootloader::may_be_source)
}

/// Reads the backend, the running command line (an [`Unknown`] when it can not be read)
/// and the boot id, when the plan needs them ([`needed`]); otherwise leaves them not
/// observed (no backend: nothing reserved beyond the trial artefacts, which are).
pub(super) fn read(node: &NodeView<'_>, obs: &mut Observed) -> Result<(), ObserveError> {
    if !needed(node.desired, node.record) {
        obs.kernel_args = KernelArgsObs::empty();
        return Ok(());
    }
    let root = node.root;
    obs.kernel_args.backend = crate::bootloader::detect(root, node.config.kernel_args.backend);
    obs.kernel_args.proc_cmdline =
        observe_running(root, "/proc/cmdline").map(|s| s.trim_end().to_string());
    if let Err(u) = &obs.kernel_args.proc_cmdline {
        obs.unknown.push(u.clone());
    }
    obs.kernel_args.boot_id = root
        .read_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .flatten()
        .map(|s| s.trim().to_string());
    Ok(())
}
