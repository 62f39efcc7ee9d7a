//! What the `kubelet` section observes: its config and flags files, and the
//! `KUBELET_EXTRA_ARGS` of the unit's override files.

use crate::sections::kit::observe::TextObs;

/// Kubelet files as observed.
#[derive(Debug, Clone)]
pub struct KubeletObs {
    /// The KubeletConfiguration file.
    pub config: TextObs,
    /// kubeadm's flags env file.
    pub flags: TextObs,
    /// `KUBELET_EXTRA_ARGS` per override file that exists: path → flags.
    pub extra_args: Vec<(String, Vec<inplace_formats::kubelet::flags::Flag>)>,
    /// Override files that could not be read or parsed.
    pub problems: Vec<String>,
}

impl Default for KubeletObs {
    fn default() -> Self {
        KubeletObs {
            config: TextObs::Absent,
            flags: TextObs::Absent,
            extra_args: Vec::new(),
            problems: Vec::new(),
        }
    }
}
