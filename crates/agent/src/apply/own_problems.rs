//! What the agent could not read for its own work, as `status` problems (and so counted
//! in `inplaced_state_problems`), not only a log line (issue 27 §5): an unknown boot id
//! (a reboot can not be verified) and a kubelet that does not report a version (a
//! Kubernetes upgrade is not covered). The metrics textfile's directory is
//! [`Agent::set_problem`]'s already.

use super::Agent;

impl Agent {
    /// The problems of this status answer, from the `boot_id` and the kubelet `version`
    /// it reports ("" when not known).
    pub(super) fn unreadable(&self, boot_id: &str, version: &str) -> Vec<String> {
        let mut p = Vec::new();
        if boot_id.is_empty() {
            p.push(
                "the boot id can not be read (/proc/sys/kernel/random/boot_id): an operation that needs a reboot can not be verified after it".to_string(),
            );
        }
        let kubelet = self.config.kubernetes.bin_path("kubelet");
        if version.is_empty() && self.stamps_following(&kubelet).is_some() {
            p.push(format!(
                "the kubelet at {kubelet} does not report a version `{kubelet} --version` parses: Kubernetes version upgrades are not covered until it does"
            ));
        }
        p
    }
}
