//! CanUpdateMachineSet: deterministic, from the translation and the declared
//! capabilities (no node is asked; CAPI caches the answer for 24 h).

use serde_json::Value;

use super::{Answer, Hook, reply};
use crate::capi;
use crate::capi::types::{CanUpdateMachineSetRequest, failure};
use crate::extension::Extension;

const HOOK: Hook = Hook::CanUpdateMachineSet;

impl Extension {
    /// CanUpdateMachineSet: the answer of [`capi::can_update_machine_set`] with the
    /// request's settings.
    pub(crate) fn can_update_machine_set(
        &self,
        req: CanUpdateMachineSetRequest,
    ) -> (Value, Answer) {
        // Diffed as CAPI diffs it: the MachineDeployment path compares the raw template
        // specs (only KCP's PrepareKubeadmConfigsForDiff blanks joinConfiguration.discovery),
        // so a change there is a unit of its own, not covered (a joined node never reads it,
        // and a patch would carry the bootstrap secret). The objects are neither logged nor
        // forwarded, and the message names paths, never values.
        let eff = match self.settings(&req.settings) {
            Ok(e) => e,
            Err(e) => return (failure(HOOK.response_kind(), &e), Answer::Failure),
        };
        let (mut resp, verdict) = capi::can_update_machine_set_with_verdict(
            &req.current,
            &req.desired,
            &self.config.machine_set.capabilities,
            eff.preserve,
            &self.config.preservation.hardware_bound_kinds,
        );
        if resp.affects_availability.is_some() && eff.affects_availability.is_some() {
            resp.affects_availability = eff.affects_availability;
        }
        tracing::info!(
            preserve = resp.preserve_on_insufficient_coverage.unwrap_or(false),
            "CanUpdateMachineSet: {}",
            resp.message
        );
        reply(HOOK, resp, Answer::of_verdict(verdict))
    }
}
