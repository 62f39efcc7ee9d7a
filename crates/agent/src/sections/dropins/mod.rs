//! The `dropins` section: the NodeSpec drop-ins, kept as `/etc/inplaced/node.d/<name>`
//! (`dropins[<name>]`). Written through the file machinery as the agent's own area: no
//! disruption, no write policy, nothing to restore (a dropped one is deleted).

pub(crate) mod spec;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

use crate::sections::kit::change::disruption;
use crate::sections::kit::file_items::FileSpec;
use crate::sections::kit::file_items::{self, DroppedFile, FileItem, FileItems};
use crate::sections::kit::observe::{FileObs, NodeView, ObserveError};
use crate::sections::kit::{DriftView, Input, Section};
use crate::sections::model::Observed;
use inplace_wire::ids::ChangeId;
use inplace_wire::pb;
use inplace_wire::pb::DisruptionLevel;

/// The `dropins` section.
#[derive(Debug)]
pub(crate) struct Dropins;

/// A recorded file of this section is marked `dropins[<name>]`.
fn owns(item: Option<&str>) -> bool {
    item.is_some_and(|i| i.starts_with("dropins["))
}

/// The mode a drop-in is kept with: 0644, or the mode of the file already there when it
/// is one the agent may obey (owned by root or the agent's uid, not group- or
/// other-writable, no setuid/setgid/sticky bit: [`inplace_node::trust::check`]), so that an
/// operator's `0600` drop-in converged to at start-up is not "repaired" to 0644 (issue 23
/// §3). A file others could write is never obeyed, so it never keeps its mode this way.
fn kept_mode(obs: &Observed, path: &str) -> u32 {
    match obs.files.get(path) {
        Some(FileObs::File { entry, .. })
            if (entry.uid == 0 || entry.uid == inplace_node::trust::expected_owner())
                && entry.mode & 0o7022 == 0 =>
        {
            entry.mode
        }
        _ => 0o644,
    }
}

impl Section for Dropins {
    fn name(&self) -> &'static str {
        "dropins"
    }

    fn observe(&self, node: &NodeView<'_>, obs: &mut Observed) -> Result<(), ObserveError> {
        for d in &node.desired.dropins {
            file_items::observe_into(node, obs, &d.path())?;
        }
        Ok(())
    }

    fn file_items<'a>(&self, input: &Input<'a>) -> FileItems<'a> {
        let items = input.desired.dropins.iter().map(|d| {
            let id = ChangeId::DropIn(d.name.clone()).to_string();
            FileItem {
                file: Cow::Owned(FileSpec {
                    path: d.path(),
                    content: d.content.clone().into_bytes(),
                    mode: kept_mode(input.obs, &d.path()),
                    owner: None,
                    group: None,
                    sha256: d.sha256.clone(),
                }),
                item: Some(id.clone()),
                id,
                disruption: Some((
                    disruption(DisruptionLevel::None, &[]),
                    "the NodeSpec drop-in is kept in /etc/inplaced/node.d (its items are merged into the spec); no disruption".into(),
                )),
                summary: None,
                agent_owned: true,
            }
        });
        FileItems {
            items: items.collect(),
            refused: Vec::new(),
        }
    }

    fn dropped_file(&self, item: Option<&str>, _path: &str) -> Option<DroppedFile> {
        owns(item).then(|| DroppedFile {
            disruption: Some(disruption(DisruptionLevel::None, &[])),
            summary: None,
        })
    }

    fn drift(&self, view: &DriftView<'_>) -> Vec<pb::Drift> {
        file_items::drift(view, owns)
    }

    fn watched(&self, view: &DriftView<'_>) -> Vec<String> {
        file_items::watched(view, owns)
    }
}
