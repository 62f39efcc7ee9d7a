//! The `ntp` section (change id `ntp`): the time daemon's servers. chrony's config is
//! edited in place (its server and pool lines replaced), systemd-timesyncd gets the
//! agent's drop-in; either file goes through the file machinery, with a restart of the
//! daemon's unit. The domain rules are in [`inplace_formats::ntp`].

pub(crate) mod observe;
pub(crate) mod spec;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

use crate::sections::kit::change::{ChangeBuilder, disruption};
use crate::sections::kit::file_items::FileSpec;
use crate::sections::kit::file_items::{self, DroppedFile, FileItem, FileItems};
use crate::sections::kit::observe::{FileObs, NodeView, ObserveError};
use crate::sections::kit::{DriftView, Input, Section};
use crate::sections::model::Observed;
use inplace_formats::ntp::Daemon;
use inplace_node::accounts::IdRef;
use inplace_node::digest::sha256_hex;
use inplace_wire::ids::ChangeId;
use inplace_wire::pb;
use inplace_wire::pb::{ChangeOperation, DisruptionLevel};
use spec::NtpSpec;

/// The `ntp` section.
#[derive(Debug)]
pub(crate) struct Ntp;

/// A recorded file of this section is marked `ntp`.
fn owns(item: Option<&str>) -> bool {
    item == Some("ntp")
}

/// Server list summary of an ntp file's content (`none` when it names no server).
fn ntp_summary(path: &str, content: &[u8]) -> String {
    let servers = inplace_formats::ntp::servers_in(path, &String::from_utf8_lossy(content));
    if servers.is_empty() {
        "none".into()
    } else {
        servers.join(" ")
    }
}

/// The daemon's file with the desired servers: (content, mode, owner and group of the
/// existing file, summary of the servers now); an error when the file can not be kept
/// byte for byte.
type Built = (Vec<u8>, u32, Option<(u32, u32)>, String);

fn build(daemon: &Daemon, ntp: &NtpSpec, obs_file: &FileObs) -> Result<Built, String> {
    let cur = match obs_file {
        FileObs::File { content, entry } => Some((content.clone(), *entry)),
        FileObs::Absent => None,
        FileObs::Conflict(c) => return Err(c.clone()),
    };
    let before = cur
        .as_ref()
        .map(|(c, _)| ntp_summary(daemon.path, c))
        .unwrap_or_else(|| "absent".into());
    if !daemon.edits_in_place() {
        let content = inplace_formats::ntp::timesyncd_dropin(&ntp.servers).into_bytes();
        return Ok((content, 0o644, None, before));
    }
    let (text, meta) = match &cur {
        Some((c, e)) => (
            String::from_utf8(c.clone()).map_err(|_| {
                format!(
                    "{} is not UTF-8 text; inplaced edits only text it can keep byte for byte",
                    daemon.path
                )
            })?,
            Some((e.uid, e.gid)),
        ),
        None => (String::new(), None),
    };
    let mode = cur.as_ref().map(|(_, e)| e.mode).unwrap_or(0o644);
    inplace_formats::ntp::chrony_refuse_bom(daemon.path, &text)?;
    let content = inplace_formats::ntp::chrony_edit(&text, &ntp.servers).into_bytes();
    Ok((content, mode, meta, before))
}

fn reason(daemon: &Daemon) -> String {
    if daemon.edits_in_place() {
        format!(
            "{}: its server and pool lines are replaced, every other line kept; {} restart",
            daemon.evidence, daemon.unit
        )
    } else {
        format!(
            "{}: the drop-in {} sets NTP=; {} restart",
            daemon.evidence, daemon.path, daemon.unit
        )
    }
}

impl Section for Ntp {
    fn name(&self) -> &'static str {
        "ntp"
    }

    fn observe(&self, node: &NodeView<'_>, obs: &mut Observed) -> Result<(), ObserveError> {
        observe::read(node, obs)
    }

    fn file_items<'a>(&self, input: &Input<'a>) -> FileItems<'a> {
        let mut out = FileItems::default();
        let (Some(ntp), Some(found)) = (&input.desired.ntp, &input.obs.ntp) else {
            return out;
        };
        let after = ntp.servers.join(" ");
        let not_covered = |reason: String, targets: Vec<String>, d: pb::Disruption| {
            ChangeBuilder {
                id: ChangeId::Ntp.to_string(),
                op: ChangeOperation::Update,
                before: String::new(),
                after: after.clone(),
                covered: Err(reason),
                disruption: d,
                targets,
            }
            .build()
        };
        let daemon = match found {
            Ok(daemon) => daemon,
            Err(why) => {
                let none = disruption(DisruptionLevel::None, &[]);
                out.refused.push(not_covered(why.clone(), vec![], none));
                return out;
            }
        };
        let restart = disruption(DisruptionLevel::Restart, &[daemon.unit]);
        let obs_file = input.obs.file(daemon.path);
        match build(daemon, ntp, &obs_file) {
            Err(why) => {
                let targets = vec![daemon.path.to_string()];
                out.refused.push(not_covered(why, targets, restart));
            }
            Ok((content, mode, owner, before)) => out.items.push(FileItem {
                file: Cow::Owned(FileSpec {
                    path: daemon.path.to_string(),
                    sha256: sha256_hex(&content),
                    content,
                    mode,
                    owner: owner.map(|(u, _)| IdRef::Id(u)),
                    group: owner.map(|(_, g)| IdRef::Id(g)),
                }),
                id: ChangeId::Ntp.to_string(),
                item: Some("ntp".into()),
                disruption: Some((restart, reason(daemon))),
                summary: Some((before, after)),
                agent_owned: false,
            }),
        }
        out
    }

    fn dropped_file(&self, item: Option<&str>, path: &str) -> Option<DroppedFile> {
        owns(item).then(|| DroppedFile {
            disruption: inplace_formats::ntp::unit_for_path(path)
                .map(|unit| disruption(DisruptionLevel::Restart, &[unit])),
            summary: Some(ntp_summary),
        })
    }

    fn drift(&self, view: &DriftView<'_>) -> Vec<pb::Drift> {
        file_items::drift(view, owns)
    }

    fn watched(&self, view: &DriftView<'_>) -> Vec<String> {
        file_items::watched(view, owns)
    }
}
