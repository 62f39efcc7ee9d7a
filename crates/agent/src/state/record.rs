//! The applied record (`applied.json`): what the agent manages and what was there
//! before. Its fields are the sections' (files, kubelet config and flags, kernel
//! arguments, sysctls); the store that reads and writes it is [`super::StateDir`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How a managed file looked before the agent first wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Original {
    /// The file did not exist: removing it from the spec deletes it.
    Absent,
    /// The file already had the desired state: removing it from the spec leaves it.
    Unchanged,
    /// The file existed: removing it from the spec restores this backup.
    Saved {
        /// Backup name under `originals/`.
        backup: String,
        /// `sha256:<hex>` of the original content.
        sha256: String,
        /// Original mode (0o7777 mask).
        mode: u32,
        /// Original owner.
        uid: u32,
        /// Original group.
        gid: u32,
    },
}

/// A managed file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedFile {
    /// `sha256:<hex>` of the content written.
    pub sha256: String,
    /// Mode written.
    pub mode: u32,
    /// Owner written.
    pub uid: u32,
    /// Group written.
    pub gid: u32,
    /// What was there before.
    pub original: Original,
    /// Directories the agent created for the file, outermost first; removed (when empty)
    /// with the file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub created_dirs: Vec<String>,
    /// Change id of a file the agent writes for a section other than `files` (`ntp`,
    /// `dropins[10-x.yaml]`); None for a `files` item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<String>,
}

/// A managed setting (kubelet config field, kubelet flag, sysctl) and its prior value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedValue<T> {
    /// Value applied.
    pub value: T,
    /// Value before the agent first set it (None = absent).
    pub prior: Option<T>,
}

/// A managed KubeletConfiguration leaf.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedField {
    /// Path of keys, e.g. `["systemReserved", "cpu"]`.
    pub path: Vec<String>,
    /// Value applied and prior value.
    #[serde(flatten)]
    pub value: ManagedValue<serde_json::Value>,
    /// The prior value's source text (`cluster.local`, `"off"`), restored byte for byte
    /// when the field leaves the spec; None when absent or not a one-line scalar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prior_raw: Option<String>,
}

/// A kernel argument removed from the boot configuration, not yet from the running kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingRemoval {
    /// The argument as it was on the command line (`isolcpus=2-7`).
    pub arg: String,
    /// Boot id (`/proc/sys/kernel/random/boot_id`) of the boot it was removed in.
    pub boot_id: String,
}

/// A trial boot entry staged by a kernel-argument change ([`AppliedRecord::kernel_args_trial`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StagedTrial {
    /// The trial artefact written (`/etc/grub.d/99_inplaced_trial`,
    /// `<entries>/inplaced-trial.conf`).
    pub artefact: String,
}

/// What the agent applied last.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AppliedRecord {
    /// Hash of the spec applied last.
    pub spec_hash: String,
    /// Managed files by path.
    pub files: BTreeMap<String, ManagedFile>,
    /// Managed kubelet config leaves by dotted id.
    pub kubelet_config: BTreeMap<String, ManagedField>,
    /// Managed kubelet flags by name.
    pub kubelet_flags: BTreeMap<String, ManagedValue<String>>,
    /// Kernel arguments the agent added (never ones it found there), in order.
    pub kernel_args: Vec<String>,
    /// Kernel arguments the agent removed from the boot configuration that the running
    /// kernel still has: the removal takes effect at the next boot. Each is pending only
    /// in the boot it was staged in, so an argument that comes back from elsewhere can not
    /// cause a reboot loop.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernel_args_removed: Vec<PendingRemoval>,
    /// Boot id of the boot in which the managed kernel arguments were staged while the
    /// running kernel lacked some of them (empty: all were running). Until the boot id
    /// changes the running kernel may lack them; after, every one must be in
    /// `/proc/cmdline` (drift otherwise).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kernel_args_staged_in: String,
    /// The trial boot entry the kernel-argument change applied last staged
    /// (`crate::bootloader::trial`): set by the plan that stages it, carried by a plan
    /// that leaves that trial pending, None from any other plan and after a trial's
    /// rollback. After the boot, an operation waiting for it whose trial entry is gone is
    /// told from a plain reboot by this field (never by its action strings). Absent in
    /// records of older agents: read as None (such an operation whose entry is lost is
    /// then verified as a plain reboot, in `/proc/cmdline`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_args_trial: Option<StagedTrial>,
    /// Managed sysctls by dotted key.
    pub sysctls: BTreeMap<String, ManagedValue<String>>,
    /// The value text of each line a managed sysctl already had in the agent's own
    /// drop-in before the agent first set it, in file order (by key as the spec names
    /// it): each line is given its text back, not removed, when the key leaves the spec.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub sysctl_drop_in_prior: BTreeMap<String, Vec<String>>,
    /// The file name, in the state directory, of the quarantined record
    /// (`applied.json.corrupt-<time>`) or lost-record marker (`applied.json.missing-<time>`)
    /// a start found or made when it wrote this empty record in place of the lost one
    /// ([`crate::state::StateDir::load_record_or_quarantine`]). While that file is there,
    /// every apply is refused; once an administrator removes it, this record stands (the
    /// node's values are its own, nothing is managed) and no later start takes the loss
    /// for a new one. None in every record an operation writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<String>,
}

impl AppliedRecord {
    /// Number of managed items.
    pub fn len(&self) -> usize {
        self.files.len()
            + self.kubelet_config.len()
            + self.kubelet_flags.len()
            + self.kernel_args.len()
            + self.sysctls.len()
    }

    /// True when nothing is managed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
