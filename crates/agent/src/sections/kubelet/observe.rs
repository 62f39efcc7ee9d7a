//! What the `kubelet` section observes: its config and flags files, and every other
//! place a kubelet flag can come from (issue 27 §4): the `KUBELET_EXTRA_ARGS` of the
//! packages' override files, the kubelet unit's effective `ExecStart=` and the variables
//! it expands, resolved through the unit's `Environment=` and `EnvironmentFile=` settings
//! as systemd.exec(5) does, and the `--config-dir` drop-ins. Files a `files` item of the
//! spec writes are read as the operation leaves them ([`overlay`], issue 27 §3).

use std::sync::Arc;

use crate::sections::kit::observe::{
    MAX_FILE_BYTES, NodeView, ObserveError, TextObs, Unknown, observe_text, text_obs,
};
use crate::sections::kit::overlay;
use crate::sections::model::Observed;
use inplace_formats::kubelet::config as kcfg;
use inplace_formats::kubelet::flags as kflags;
use inplace_formats::kubelet::flags::Flag;
use inplace_formats::kubelet::unit as kunit;

/// Kubelet flags held by an environment variable the kubelet's command line expands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvFlags {
    /// The file that sets the variable (an environment file, or the unit file or drop-in
    /// of an `Environment=`), named with the `files` item that writes it, if any.
    pub file: String,
    /// 1-based line of the assignment; 0 when not known.
    pub line: usize,
    /// The variable (`KUBELET_EXTRA_ARGS`).
    pub var: String,
    /// Its flags, in order.
    pub flags: Vec<Flag>,
}

impl EnvFlags {
    /// `<file> (<VAR>) at line <n>`: where a flag of it is set.
    pub fn place(&self) -> String {
        match self.line {
            0 => format!("{} ({})", self.file, self.var),
            n => format!("{} ({}) at line {n}", self.file, self.var),
        }
    }
}

/// Kubelet files as observed.
#[derive(Debug, Clone)]
pub struct KubeletObs {
    /// The KubeletConfiguration file.
    pub config: TextObs,
    /// The KubeletConfiguration file parsed, when it is text: kept in the memo with the
    /// text while the file stays the same ([`ConfigObs`]), so that a plan does not parse
    /// it again (issue 28). The plan uses it only when its text is `config`'s.
    pub config_doc: Option<Arc<kcfg::Document>>,
    /// kubeadm's flags env file.
    pub flags: TextObs,
    /// Flags of the variables the kubelet's command line expands other than
    /// `KUBELET_KUBEADM_ARGS`: the `KUBELET_EXTRA_ARGS` of each override file that exists
    /// (`kubelet.extra_args_paths`), then every other variable of the effective
    /// `ExecStart=` as the unit's environment sets it, in command-line order. They come
    /// after kubeadm's flags (and so win) unless `before_kubeadm` counts them.
    pub extra_args: Vec<EnvFlags>,
    /// How many of `extra_args` (from the start of the unit's variables) come before
    /// `$KUBELET_KUBEADM_ARGS` on the command line: they override config fields, not
    /// kubeadm's flags. Indexes into `extra_args`.
    pub before_kubeadm: Vec<usize>,
    /// Why kubeadm's flags file is not what the kubelet gets as `KUBELET_KUBEADM_ARGS`
    /// (the unit does not read it, or a later setting replaces it), naming the file and
    /// line; None when it is, or the unit is not known.
    pub kubeadm_source: Option<String>,
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
            config_doc: None,
            flags: TextObs::Absent,
            extra_args: Vec::new(),
            before_kubeadm: Vec::new(),
            kubeadm_source: None,
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
    let kept = node
        .root
        .probe_memo(&config.config_path, MAX_FILE_BYTES, config_obs)?;
    let mut kubelet = KubeletObs {
        config: never_empty(
            obs,
            kept.text.clone(),
            &config.config_path,
            "a kubelet's KubeletConfiguration file",
        ),
        config_doc: kept.doc.clone(),
        flags: never_empty(
            obs,
            observe_text(node.root, &config.flags_path)?,
            &config.flags_path,
            "kubeadm's flags file (it always sets KUBELET_KUBEADM_ARGS)",
        ),
        ..KubeletObs::default()
    };
    for p in &config.extra_args_paths {
        let text = match overlay::read_text(node, obs, p) {
            Ok(Some(t)) => t,
            Ok(None) => continue,
            Err(e) => {
                kubelet.problems.push(format!("{p}: {e}"));
                continue;
            }
        };
        match kflags::parse(&text, EXTRA_VAR) {
            Ok(Some(flags)) => kubelet.extra_args.push(EnvFlags {
                file: overlay::named(node, p),
                line: kunit::env_file_value(&text, EXTRA_VAR).map_or(0, |(l, _)| l),
                var: EXTRA_VAR.into(),
                flags,
            }),
            Ok(None) => {}
            Err(e) => kubelet.problems.push(format!("{p}: {e}")),
        }
    }
    if let Some(files) = unit_files(node, obs, &config.unit) {
        let pairs = || files.iter().map(|(p, t)| (p.as_str(), t.as_str()));
        kubelet.exec_start = kunit::effective_exec_start_words(pairs());
        let env = kunit::service_env(pairs());
        unit_env(node, obs, &env, &mut kubelet);
    }
    read_config_dropins(node, obs, &mut kubelet)?;
    obs.kubelet = kubelet;
    Ok(())
}

/// The KubeletConfiguration file as [`observe_text`] observes it, and its text parsed:
/// what the memo keeps of the file.
struct ConfigObs {
    text: TextObs,
    doc: Option<Arc<kcfg::Document>>,
}

/// [`ConfigObs`] of what the probe found at `path`: a pure function of the file (the
/// memo's contract).
fn config_obs(path: &str, found: inplace_node::sysroot::Probe) -> ConfigObs {
    let text = text_obs(path, found);
    let doc = text
        .text()
        .map(|(t, _)| Arc::new(kcfg::Document::parse(t.to_string())));
    ConfigObs { text, doc }
}

/// The metadata of a text the planner only reads (a `--config-dir` drop-in).
const ENTRY: inplace_node::sysroot::Entry = inplace_node::sysroot::Entry {
    kind: inplace_node::sysroot::Kind::File,
    mode: 0o644,
    uid: 0,
    gid: 0,
    len: 0,
};

/// The packages' override variable.
const EXTRA_VAR: &str = "KUBELET_EXTRA_ARGS";
/// kubeadm's flags variable.
const KUBEADM_VAR: &str = "KUBELET_KUBEADM_ARGS";

/// The kubelet unit file and its drop-ins in systemd's order (systemd.unit(5): the first
/// directory of the load path that has the unit file; `<unit>.d/*.conf` from every
/// directory, one per name, the higher-priority directory's, sorted by name), as the
/// operation's `files` items leave them; None when there is no unit file.
fn unit_files(node: &NodeView<'_>, obs: &Observed, unit: &str) -> Option<Vec<(String, String)>> {
    use crate::sections::kubernetes::unit::UNIT_DIRS;
    let read = |p: &str| overlay::read_text(node, obs, p).ok().flatten();
    let main = UNIT_DIRS
        .iter()
        .map(|d| format!("{d}/{unit}"))
        .find_map(|p| read(&p).map(|t| (overlay::named(node, &p), t)))?;
    let mut dropins: std::collections::BTreeMap<String, String> = Default::default();
    for d in UNIT_DIRS {
        let dir = format!("{d}/{unit}.d");
        for name in overlay::list_dir(node, obs, &dir)
            .ok()
            .flatten()
            .unwrap_or_default()
        {
            if name.ends_with(".conf") {
                dropins
                    .entry(name.clone())
                    .or_insert(format!("{dir}/{name}"));
            }
        }
    }
    let mut files = vec![main];
    for path in dropins.into_values() {
        if let Some(t) = read(&path) {
            files.push((overlay::named(node, &path), t));
        }
    }
    Some(files)
}

/// The value of `var` in the service's environment: the last `EnvironmentFile=` that
/// assigns it (they override `Environment=`), else its `Environment=`; as (file, line,
/// value). Environment files are read as the operation leaves them.
fn resolve(
    node: &NodeView<'_>,
    obs: &Observed,
    env: &kunit::ServiceEnv,
    var: &str,
    scanned: &mut EnvFiles,
) -> Option<(String, usize, String)> {
    let from_files = env.files.iter().rev().find_map(|f| {
        let values = scanned.entry(f.path.clone()).or_insert_with(|| {
            overlay::read_text(node, obs, &f.path)
                .ok()
                .flatten()
                .map(|t| kunit::env_file_values(&t))
        });
        let (_, line, value) = values.as_ref()?.iter().rev().find(|(k, _, _)| k == var)?;
        Some((f.path.clone(), *line, value.clone()))
    });
    from_files.or_else(|| {
        env.vars
            .get(var)
            .map(|s| (s.file.clone(), s.line, s.value.clone()))
    })
}

/// The environment files of the kubelet's unit read in one observation: path → every
/// assignment in it (None: not readable), so that each file is read and scanned once,
/// however many variables the command line expands.
type EnvFiles = std::collections::HashMap<String, Option<Vec<(String, usize, String)>>>;

/// The flags of a variable's value as `$VAR` splits it on `ExecStart=`: whitespace-
/// separated words, each `--name[=value]` (a word that is not a flag is skipped).
fn flags_of(value: &str) -> Vec<Flag> {
    value
        .split_whitespace()
        .filter_map(|w| {
            let body = w.strip_prefix("--").or_else(|| w.strip_prefix('-'))?;
            let (name, value) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            (!name.is_empty()).then(|| Flag {
                name: name.to_string(),
                value,
            })
        })
        .collect()
}

/// Resolves the variables of the effective `ExecStart=` through the unit's environment:
/// where `KUBELET_KUBEADM_ARGS` comes from ([`KubeletObs::kubeadm_source`]) and the flags
/// of every other variable ([`KubeletObs::extra_args`]). A `KUBELET_EXTRA_ARGS` read from
/// an override file already listed is not counted twice.
fn unit_env(node: &NodeView<'_>, obs: &Observed, env: &kunit::ServiceEnv, k: &mut KubeletObs) {
    let Some((exec_file, words)) = k.exec_start.clone() else {
        return;
    };
    let flags_path = &node.config.kubelet.flags_path;
    let mut after_kubeadm = false;
    let mut scanned = EnvFiles::new();
    for w in &words {
        for var in kunit::var_refs(w) {
            let found = resolve(node, obs, env, &var, &mut scanned);
            if var == KUBEADM_VAR {
                after_kubeadm = true;
                k.kubeadm_source = kubeadm_source(env, found, flags_path, &exec_file);
                continue;
            }
            let Some((file, line, value)) = found else {
                continue;
            };
            if var == EXTRA_VAR && node.config.kubelet.extra_args_paths.contains(&file) {
                continue;
            }
            if !after_kubeadm {
                k.before_kubeadm.push(k.extra_args.len());
            }
            k.extra_args.push(EnvFlags {
                file: overlay::named(node, &file),
                line,
                var,
                flags: flags_of(&value),
            });
        }
    }
}

/// Why `KUBELET_KUBEADM_ARGS` (its setting `found`) is not read from kubeadm's
/// `flags_path`; None when it is.
fn kubeadm_source(
    env: &kunit::ServiceEnv,
    found: Option<(String, usize, String)>,
    flags_path: &str,
    exec_file: &str,
) -> Option<String> {
    match found {
        Some((file, _, _)) if file == flags_path => None,
        Some((file, line, _)) => Some(format!(
            "{KUBEADM_VAR} is set at line {line} of {file}, which wins over {flags_path} (systemd: EnvironmentFile= settings override Environment=, a later file wins), so the flags written there would not reach the kubelet; remove the setting there"
        )),
        None if env.files.iter().any(|f| f.path == flags_path) => None,
        None => Some(format!(
            "the kubelet unit (ExecStart= in {exec_file}) expands ${KUBEADM_VAR}, but no EnvironmentFile= of the unit or its drop-ins reads {flags_path}, so the flags written there would not reach the kubelet; add EnvironmentFile=-{flags_path} to the unit"
        )),
    }
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
        .chain(k.extra_args.iter().flat_map(|e| &e.flags))
        .filter(|f| f.name == "config-dir")
        .filter_map(|f| f.value.clone())
        .next_back()
        .filter(|d| !d.trim().is_empty())
}

/// Reads the `*.conf` drop-ins of the kubelet's `--config-dir` ([`config_dir`]) in the
/// kubelet's order; one that can not be read or parsed is a problem naming it.
fn read_config_dropins(
    node: &NodeView<'_>,
    obs: &Observed,
    k: &mut KubeletObs,
) -> Result<(), ObserveError> {
    let Some(dir) = config_dir(k) else {
        return Ok(());
    };
    let dir = dir.trim_end_matches('/').to_string();
    let names = match overlay::list_dir(node, obs, &dir) {
        Ok(n) => n.unwrap_or_default(),
        Err(e) => {
            k.dropin_problems
                .push(format!("{dir} (kubelet --config-dir): {e}"));
            return Ok(());
        }
    };
    // the kubelet walks the directory (filepath.WalkDir in cmd/kubelet/app/server.go,
    // mergeKubeletConfigurations): every `*.conf` below it, subdirectories included, read
    // through symlinks. inplaced reads the files at the top level (through symlinks, as
    // the overlay reads); a subdirectory is named, and the config's changes not covered.
    for n in &names {
        let p = format!("{dir}/{n}");
        if let Some(why) = unread_dropin(node, &p) {
            k.dropin_problems.push(format!(
                "{p} is {why} in the kubelet's --config-dir: the kubelet reads the *.conf files in it (it walks subdirectories), inplaced does not; move them directly into {dir}"
            ));
        }
    }
    let mut names: Vec<String> = names.into_iter().filter(|n| n.ends_with(".conf")).collect();
    names.sort();
    for n in names {
        let p = format!("{dir}/{n}");
        let text = match overlay::read_text(node, obs, &p) {
            Ok(Some(t)) => TextObs::Text(t, ENTRY),
            Ok(None) => TextObs::Absent,
            Err(e) => TextObs::Problem(format!("{p}: {e}")),
        };
        match text {
            TextObs::Absent => {}
            TextObs::Problem(e) => k.dropin_problems.push(e),
            TextObs::Text(t, _) => match inplace_formats::kubelet::config::parse(&t) {
                Ok(doc) => k.config_dropins.push((p, doc)),
                Err(e) => k
                    .dropin_problems
                    .push(format!("{p} (kubelet --config-dir drop-in): {e}")),
            },
        }
    }
    Ok(())
}

/// What the kubelet would read at `p` in its `--config-dir` that inplaced does not: a
/// subdirectory (any name: the kubelet descends into it); None for anything else. Paths
/// the spec's own items write are files.
fn unread_dropin(node: &NodeView<'_>, p: &str) -> Option<&'static str> {
    use inplace_node::sysroot::{Kind, Probe};
    if node.desired.files.iter().any(|f| f.path == p) {
        return None;
    }
    match node.root.probe(p, 0) {
        Ok(Probe::Present { entry, .. }) if entry.kind == Kind::Dir => Some("a subdirectory"),
        _ => None,
    }
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
