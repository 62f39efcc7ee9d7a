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
    /// The KubeletConfiguration drop-ins of the kubelet's `--config-dir` (from kubeadm's
    /// flags file or a `KUBELET_EXTRA_ARGS`), in the kubelet's merge order (`*.conf`
    /// sorted by name, a later one wins; upstream "Kubelet configuration directory
    /// merging"): path → parsed document. They override the config file.
    pub config_dropins: Vec<(String, serde_json::Value)>,
    /// `--config-dir` drop-ins that could not be read or parsed.
    pub dropin_problems: Vec<String>,
    /// The effective `ExecStart=` of the kubelet's unit (unit file and its drop-ins in
    /// systemd's order): (the file that set it, its words). None when the unit is not
    /// found.
    pub exec_start: Option<(String, Vec<String>)>,
}

impl Default for KubeletObs {
    fn default() -> Self {
        KubeletObs {
            config: TextObs::Absent,
            flags: TextObs::Absent,
            extra_args: Vec::new(),
            problems: Vec::new(),
            config_dropins: Vec::new(),
            dropin_problems: Vec::new(),
            exec_start: None,
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
    read_config_dropins(node, &mut kubelet)?;
    kubelet.exec_start = crate::sections::kubernetes::unit::unit_files(node.root, &config.unit)
        .and_then(|f| {
            inplace_formats::kubelet::unit::effective_exec_start_words(
                f.iter().map(|(p, t)| (p.as_str(), t.as_str())),
            )
        });
    obs.kubelet = kubelet;
    Ok(())
}

/// The kubelet's `--config-dir`: the last one set, kubeadm's flags file first, then the
/// `KUBELET_EXTRA_ARGS` files in order (the kubelet's command line puts them after).
fn config_dir(k: &KubeletObs) -> Option<String> {
    let kubeadm = match &k.flags {
        TextObs::Text(t, _) => kflags::parse(t, "KUBELET_KUBEADM_ARGS").ok().flatten(),
        _ => None,
    };
    kubeadm
        .iter()
        .flatten()
        .chain(k.extra_args.iter().flat_map(|(_, f)| f))
        .filter(|f| f.name == "config-dir")
        .filter_map(|f| f.value.clone())
        .next_back()
        .filter(|d| !d.trim().is_empty())
}

/// Reads the `*.conf` drop-ins of the kubelet's `--config-dir` ([`config_dir`]) in the
/// kubelet's order; one that can not be read or parsed is a problem naming it.
fn read_config_dropins(node: &NodeView<'_>, k: &mut KubeletObs) -> Result<(), ObserveError> {
    let Some(dir) = config_dir(k) else {
        return Ok(());
    };
    let dir = dir.trim_end_matches('/').to_string();
    let names = match crate::sections::kit::observe::list_dir(node.root, &dir) {
        Ok(n) => n.unwrap_or_default(),
        Err(e) => {
            k.problems
                .push(format!("{dir} (kubelet --config-dir): {e}"));
            return Ok(());
        }
    };
    let mut names: Vec<String> = names.into_iter().filter(|n| n.ends_with(".conf")).collect();
    names.sort();
    for n in names {
        let p = format!("{dir}/{n}");
        match observe_text(node.root, &p)? {
            TextObs::Absent => {}
            TextObs::Problem(e) => k.problems.push(e),
            TextObs::Text(t, _) => match inplace_formats::kubelet::config::parse(&t) {
                Ok(doc) => k.config_dropins.push((p, doc)),
                Err(e) => k
                    .problems
                    .push(format!("{p} (kubelet --config-dir drop-in): {e}")),
            },
        }
    }
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
