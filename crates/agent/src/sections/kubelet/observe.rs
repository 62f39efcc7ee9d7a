//! What the `kubelet` section observes: its config and flags files, and the
//! `KUBELET_EXTRA_ARGS` of the unit's override files.

use crate::sections::kit::observe::{NodeView, ObserveError, TextObs, Unknown, observe_text};
use crate::sections::model::Observed;
use inplace_formats::kubelet::flags as kflags;

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

/// True when the record or the spec manages kubelet settings.
fn in_play(node: &NodeView<'_>) -> bool {
    let (d, r) = (node.desired, node.record);
    d.kubelet.config.is_some()
        || !d.kubelet.flags.is_empty()
        || !r.kubelet_config.is_empty()
        || !r.kubelet_flags.is_empty()
}

/// Reads the kubelet's config and flags files and the `KUBELET_EXTRA_ARGS` of its
/// override files, when the spec or the record manages kubelet settings.
pub(super) fn read(node: &NodeView<'_>, obs: &mut Observed) -> Result<(), ObserveError> {
    if !in_play(node) {
        return Ok(());
    }
    let config = &node.config.kubelet;
    let mut kubelet = KubeletObs {
        config: never_empty(
            obs,
            observe_text(node.root, &config.config_path)?,
            &config.config_path,
            "a kubelet's KubeletConfiguration file",
        ),
        flags: never_empty(
            obs,
            observe_text(node.root, &config.flags_path)?,
            &config.flags_path,
            "kubeadm's flags file (it always sets KUBELET_KUBEADM_ARGS)",
        ),
        ..KubeletObs::default()
    };
    for p in &config.extra_args_paths {
        match observe_text(node.root, p)? {
            TextObs::Absent => {}
            TextObs::Problem(e) => kubelet.problems.push(e),
            TextObs::Text(t, _) => match kflags::parse(&t, "KUBELET_EXTRA_ARGS") {
                Ok(Some(flags)) => kubelet.extra_args.push((p.clone(), flags)),
                Ok(None) => {}
                Err(e) => kubelet.problems.push(format!("{p}: {e}")),
            },
        }
    }
    obs.kubelet = kubelet;
    Ok(())
}

/// Unknown is not empty (issue 20 §2): a present file that holds only whitespace, where
/// `what` can not be empty, is a problem naming the file (its changes are not covered)
/// and an [`Unknown`] for `status`. An absent file stays absent (its own reason).
///
/// [`Unknown`]: crate::sections::kit::observe::Unknown
fn never_empty(obs: &mut Observed, t: TextObs, path: &str, what: &str) -> TextObs {
    match t {
        TextObs::Text(text, _) if text.trim().is_empty() => {
            let u = Unknown {
                source: path.to_string(),
                why: format!("it is empty, which {what} can not be"),
            };
            obs.unknown.push(u.clone());
            TextObs::Problem(format!(
                "{u}; its current settings are not known, so no change to it is planned"
            ))
        }
        t => t,
    }
}
