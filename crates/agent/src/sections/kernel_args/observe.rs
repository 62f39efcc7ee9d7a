//! What the `kernelArgs` section observes: the boot configuration's backend
//! ([`crate::bootloader::detect`]), the running kernel command line and the boot id.

use crate::bootloader::{KernelArgsBackend, NoBackend};
use crate::sections::kit::observe::{
    NodeView, Observation, ObserveError, Unknown, observe_running,
};
use crate::sections::model::Observed;

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

/// Reads the backend, the running command line (an [`Unknown`] when it can not be read)
/// and the boot id.
pub(super) fn read(node: &NodeView<'_>, obs: &mut Observed) -> Result<(), ObserveError> {
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
