//! Start-up convergence to the NodeSpec drop-ins in `/etc/inplaced/node.d`: after journal
//! recovery and before serving, the agent applies the last applied spec with its drop-ins
//! replaced by those on disk, when they differ.

use std::sync::Arc;

use super::Agent;
use crate::sections::model::{NodeSpec, parse_dropin};
use inplace_wire::pb;
use inplace_wire::pb::RebootPolicy;
use inplace_wire::{names::DROPIN_DIR, names::validate_dropin_name};

/// A node.d file that is not applied: name, node path, why.
type Broken = (String, String, String);

impl Agent {
    /// Lists `msg` in `NodeStatus.problems`.
    pub(super) fn note(&self, msg: String) {
        self.problems
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(msg);
    }

    /// Logs `msg` and lists it in `NodeStatus.problems`.
    pub(super) fn problem(&self, msg: String) {
        tracing::warn!("{msg}");
        self.note(msg);
    }

    /// Start-up convergence to the NodeSpec drop-ins in `/etc/inplaced/node.d` (called
    /// after journal recovery, before serving). Reads the `*.yaml` files there, sorted by
    /// name; when there are any and they differ from the drop-ins of the last applied spec
    /// (`applied-spec.pb`), starts operation `startup-<first 8 hex digits of the spec
    /// hash>`, or `-2`, `-3`... when that id is in the history (reboot policy
    /// CALLER_HANDLES) applying the last applied spec with its
    /// drop-ins replaced by those on disk. A drop-in that can not be read or does not parse,
    /// or that another user than root could have written (the file, node.d or a directory
    /// above it owned by another user or group- or other-writable,
    /// [`inplace_node::trust`]) is not applied: it is logged with the file and the field (or
    /// its owner and mode) and listed in `NodeStatus.problems`; a last applied version of
    /// it stays in effect and its file is left as it is (its mode is never "repaired"). Returns the operation started (or the existing one of that id), if
    /// any; every reason not to converge is logged and listed in the problems.
    pub(crate) fn converge_node_d(self: &Arc<Self>) -> Option<pb::Operation> {
        // node.d and every directory above it: another user who could write there could
        // place or swap drop-ins, so none is used (the last applied ones stay in effect)
        match self.root.check_trusted_dir(DROPIN_DIR) {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => {
                self.problem(format!(
                    "node.d drop-ins not applied at start-up: {e}; the last applied drop-ins stay in effect"
                ));
                return None;
            }
        }
        let names = match self.root.list_dir(DROPIN_DIR) {
            Ok(Some(n)) => n,
            Ok(None) => return None,
            Err(e) => {
                self.problem(format!("node.d drop-ins not read: {e}"));
                return None;
            }
        };
        let (mut good, broken) = self.read_node_d(names);
        if good.is_empty() && broken.is_empty() {
            return None;
        }
        let applied = self.applied_base()?;
        let leave = self.keep_broken(&applied, &broken, &mut good);
        good.sort_by(|a, b| a.name.cmp(&b.name));
        let mut before = applied.dropins.clone();
        before.sort_by(|a, b| a.name.cmp(&b.name));
        if good == before {
            return None;
        }
        let desired = pb::NodeSpec {
            dropins: good,
            ..applied
        };
        let hash = match NodeSpec::from_pb(&desired) {
            Ok(s) => s.hash(),
            Err(e) => {
                self.problem(format!(
                    "node.d drop-ins not applied at start-up: {e} (merged with the last applied spec)"
                ));
                return None;
            }
        };
        let id = self.startup_id(&hash);
        let req = pb::ApplyRequest {
            diff: None,
            desired: Some(desired),
            operation_id: id.clone(),
            reboot_policy: RebootPolicy::CallerHandles as i32,
            dry_run: false,
            ..Default::default()
        };
        match self.apply_leaving(req, leave) {
            Ok(op) => {
                tracing::info!(operation = %id, "converging to the node.d drop-ins");
                Some(op)
            }
            Err(e) => {
                self.problem(format!(
                    "node.d drop-ins not applied at start-up (operation {id}): {e}"
                ));
                None
            }
        }
    }

    /// The node.d `*.yaml` files among `names`: those that read and parse, and those
    /// that do not (logged with the file).
    fn read_node_d(&self, names: Vec<String>) -> (Vec<pb::DropIn>, Vec<Broken>) {
        let mut good = Vec::new();
        let mut broken = Vec::new();
        for name in names {
            if !name.ends_with(".yaml") || name.starts_with('.') {
                continue;
            }
            let path = format!("{DROPIN_DIR}/{name}");
            let parsed = validate_dropin_name("name", &name)
                .map_err(|e| e.to_string())
                .and_then(|()| match self.root.read_trusted(&path) {
                    Ok(Some(bytes)) => {
                        String::from_utf8(bytes).map_err(|_| format!("{path}: not UTF-8 text"))
                    }
                    Ok(None) => Err("vanished while reading".to_string()),
                    Err(e) => Err(e.to_string()),
                })
                .and_then(|text| {
                    parse_dropin(&name, &text)
                        .map(|_| text)
                        .map_err(|e| e.to_string())
                });
            match parsed {
                Ok(content) => good.push(pb::DropIn {
                    name,
                    content,
                    keep: false,
                }),
                Err(e) => {
                    tracing::warn!(file = %path, error = %e, "node.d drop-in not applied");
                    broken.push((name, path, e));
                }
            }
        }
        (good, broken)
    }

    /// The last applied spec the drop-ins are merged into (empty when nothing was ever
    /// applied); None, with the reason in the problems, when it is not known.
    fn applied_base(&self) -> Option<pb::NodeSpec> {
        match self.state.load_applied_spec() {
            Ok(Some(s)) => Some(s),
            Ok(None)
                if self
                    .state
                    .load_record()
                    .map(|r| r.is_empty())
                    .unwrap_or(false) =>
            {
                Some(pb::NodeSpec::default())
            }
            Ok(None) => {
                self.problem(
                    "node.d drop-ins not applied at start-up: the last applied spec is not known (applied by an older inplaced), so converging would revert it; they are applied with the next Apply that carries them"
                        .to_string(),
                );
                None
            }
            Err(e) => {
                self.problem(format!("node.d drop-ins not applied at start-up: {e}"));
                None
            }
        }
    }

    /// Keeps the last applied version of each broken drop-in (its file left as it is)
    /// and lists every broken one in the problems. Returns the paths to leave.
    fn keep_broken(
        &self,
        applied: &pb::NodeSpec,
        broken: &[Broken],
        good: &mut Vec<pb::DropIn>,
    ) -> Vec<String> {
        let mut leave = Vec::new();
        for (name, path, e) in broken {
            let kept = applied.dropins.iter().find(|d| &d.name == name);
            if let Some(d) = kept {
                good.push(d.clone());
                leave.push(path.clone());
            }
            // logged with the file above
            self.note(format!(
                "{path}: {e}; not applied{}",
                if kept.is_some() {
                    " (its last applied version stays in effect)"
                } else {
                    ""
                }
            ));
        }
        leave
    }

    /// A new id each time this state is converged to: an earlier operation of the same
    /// spec (applied, then replaced by another apply) must not answer for this one.
    fn startup_id(&self, hash: &str) -> String {
        let hex = hash.trim_start_matches("sha256:");
        let base = format!("startup-{}", &hex[..hex.len().min(8)]);
        let taken: std::collections::HashSet<String> = self
            .state
            .operation_heads()
            .unwrap_or_default()
            .into_iter()
            .map(|o| o.id)
            .collect();
        std::iter::once(base.clone())
            .chain((2..).map(|n| format!("{base}-{n}")))
            .find(|c| !taken.contains(c))
            .unwrap_or(base)
    }
}
