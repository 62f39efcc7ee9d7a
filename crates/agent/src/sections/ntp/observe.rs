//! What the `ntp` section observes: which time daemon the node runs, and its file.

use crate::sections::kit::file_items;
use crate::sections::kit::observe::{NodeView, ObserveError};
use crate::sections::model::Observed;
use inplace_formats::ntp::Daemon;

/// The time daemon when the spec manages `ntp`: the daemon found, or what was looked for
/// ([`inplace_formats::ntp::detect`]); None when the spec does not manage `ntp`. Its
/// file is observed with the other files ([`Observed::files`]).
pub(crate) type NtpObs = Option<Result<Daemon, String>>;

/// Reads the daemon and its file when the spec manages `ntp`.
pub(super) fn read(node: &NodeView<'_>, obs: &mut Observed) -> Result<(), ObserveError> {
    if node.desired.ntp.is_none() {
        return Ok(());
    }
    // a path that can not be looked at (a symlinked /lib) counts as absent; the other
    // candidates are tried
    let found = inplace_formats::ntp::detect(|p| matches!(node.root.stat(p), Ok(Some(_))));
    if let Ok(d) = &found {
        file_items::observe_into(node, obs, d.path)?;
    }
    obs.ntp = Some(found);
    Ok(())
}
