//! What every section builds its changes with: the change builder and the disruption
//! helper. Shared here so that sections never import each other.

use inplace_wire::pb;
use inplace_wire::pb::{ChangeOperation, DisruptionLevel};

/// A disruption of `level` for `units` (sorted, without repeats).
pub(crate) fn disruption(level: DisruptionLevel, units: &[&str]) -> pb::Disruption {
    let mut u: Vec<String> = units.iter().map(|s| s.to_string()).collect();
    u.sort();
    u.dedup();
    pb::Disruption {
        level: level as i32,
        units: u,
    }
}

/// One change of a coverage report, before it is built: `covered` is `Ok(reason)` or
/// `Err(why not)`.
#[derive(Debug)]
pub struct ChangeBuilder<'a> {
    /// Stable change id (`files[/etc/x]`, `kubelet.config.maxPods`).
    pub id: String,
    /// Create, update or delete.
    pub op: ChangeOperation,
    /// Summary of the item now.
    pub before: String,
    /// Summary of the item after the change.
    pub after: String,
    /// Covered with this reason, or not covered with that one.
    pub covered: Result<&'a str, String>,
    /// What applying the change disrupts.
    pub disruption: pb::Disruption,
    /// Node paths or objects the change touches (sorted, without repeats once built).
    pub targets: Vec<String>,
}

impl ChangeBuilder<'_> {
    /// The report's change.
    pub fn build(self) -> pb::Change {
        let (covered, reason) = match self.covered {
            Ok(r) => (true, r.to_string()),
            Err(r) => (false, r),
        };
        let mut targets = self.targets;
        targets.sort();
        targets.dedup();
        pb::Change {
            id: self.id,
            operation: self.op as i32,
            before: self.before,
            after: self.after,
            covered,
            reason,
            disruption: Some(self.disruption),
            targets,
        }
    }
}
