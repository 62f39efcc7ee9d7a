//! The `files` section: whole files of the spec (`files[<path>]`), written through the
//! file machinery ([`crate::sections::kit::file_items`]) with the path rules for their disruption.

pub(crate) mod spec;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

use crate::sections::kit::file_items::{self, FileItem, FileItems};
use crate::sections::kit::observe::{NodeView, ObserveError};
use crate::sections::kit::{DriftView, Input, Section};
use crate::sections::model::Observed;
use inplace_wire::ids::ChangeId;
use inplace_wire::pb;

/// The `files` section.
#[derive(Debug)]
pub(crate) struct Files;

/// A recorded file of this section carries no marker.
fn owns(item: Option<&str>) -> bool {
    item.is_none()
}

impl Section for Files {
    fn name(&self) -> &'static str {
        "files"
    }

    fn observe(&self, node: &NodeView<'_>, obs: &mut Observed) -> Result<(), ObserveError> {
        for f in &node.desired.files {
            file_items::observe_into(node, obs, &f.path)?;
        }
        Ok(())
    }

    fn file_items<'a>(&self, input: &Input<'a>) -> FileItems<'a> {
        FileItems {
            items: input
                .desired
                .files
                .iter()
                .map(|f| FileItem {
                    id: ChangeId::File(f.path.clone()).to_string(),
                    file: Cow::Borrowed(f),
                    item: None,
                    disruption: None,
                    summary: None,
                    agent_owned: false,
                })
                .collect(),
            refused: Vec::new(),
        }
    }

    fn drift(&self, view: &DriftView<'_>) -> Vec<pb::Drift> {
        file_items::drift(view, owns)
    }

    fn watched(&self, view: &DriftView<'_>) -> Vec<String> {
        file_items::watched(view, owns)
    }
}
